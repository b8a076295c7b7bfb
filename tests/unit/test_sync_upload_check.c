// Upload validation: the exact tensor set per peer, shapes, dtypes, finite values, size cap.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "server/upload_check.h"
#include "sync_test_model.h"

// Checks peer 1's (of 2, m = 2) upload after `tweak`; returns upload_check's result.
static int check_tweaked(SyncMode mode, DType dtype, SyncTestTweak tweak, const StTensor **row_out_first) {
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, mode, 2, 1, dtype, tweak, &bytes, &len), SPES_OK);
    SafeTensors st;
    assert_int_equal(safetensors_parse(bytes, len, "upload", &st), SPES_OK);
    const StTensor **row = calloc((size_t)spec.count, sizeof *row);
    int rc = upload_check(&spec, mode, 2, 1, &st, row);
    if (row_out_first) *row_out_first = row[0];
    free(row);
    safetensors_close(&st);
    free(bytes);
    model_spec_free(&spec);
    return rc;
}

static void test_valid_uploads_pass(void **state) {
    (void)state;
    const StTensor *first = NULL;
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_F32, NULL, &first), SPES_OK);
    assert_non_null(first);
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_BF16, NULL, NULL), SPES_OK);
    assert_int_equal(check_tweaked(SYNC_MODE_FEDAVG, DTYPE_F32, NULL, NULL), SPES_OK);
}

static void rename_first(StWriteTensor *w, float *d, int t) { if (t == 0) w->name = "model.embed.weight"; }
static void transpose_lm_head(StWriteTensor *w, float *d, int t) {
    if (!strcmp(w->name, "lm_head.weight")) { w->shape[0] = 4; w->shape[1] = 6; }
}
static void as_int32(StWriteTensor *w, float *d, int t) { if (t == 0) w->dtype = DTYPE_I32; }
static void nan_in_router(StWriteTensor *w, float *d, int t) { if (strstr(w->name, "mlp.gate.")) d[5] = NAN; }
static void inf_in_expert(StWriteTensor *w, float *d, int t) { if (strstr(w->name, "experts.3.up")) d[0] = -INFINITY; }

// Finite values no healthy peer sends (a damaged error feedback made one send 1e30, issue 29).
static void huge_in_router(StWriteTensor *w, float *d, int t) { if (strstr(w->name, "mlp.gate.")) d[2] = 1e30f; }
static void negative_huge_in_lm_head(StWriteTensor *w, float *d, int t) {
    if (!strcmp(w->name, "lm_head.weight")) d[1] = -7e4f;
}
static void largest_weight(StWriteTensor *w, float *d, int t) { if (t == 0) d[0] = -SYNC_MAX_WEIGHT; }

static void test_values_beyond_any_weight_refused(void **state) {
    (void)state;
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_F32, huge_in_router, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "mlp.gate.weight' has the value 1e+30 at flat index 2, beyond +-65504"));
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_BF16, negative_huge_in_lm_head, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "'lm_head.weight' has the value -7"));
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_F32, largest_weight, NULL), SPES_OK);
    assert_int_equal(check_tweaked(SYNC_MODE_FEDAVG, DTYPE_F32, huge_in_router, NULL), SPES_ERR);
}

static void test_bad_uploads_name_what_is_wrong(void **state) {
    (void)state;
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_F32, rename_first, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "'model.embed.weight' is not part of the model"));
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_F32, transpose_lm_head, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "'lm_head.weight' has shape [ 4 6 ] but the model's is [ 6 4 ]"));
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_F32, as_int32, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "dtype I32"));
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_F32, nan_in_router, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "mlp.gate.weight' has a non-finite value (NaN or Inf) at flat index 5"));
    assert_int_equal(check_tweaked(SYNC_MODE_SPES, DTYPE_BF16, inf_in_expert, NULL), SPES_ERR);   // bf16 too
    assert_non_null(strstr(spes_last_error(), "experts.3.up_proj.weight' has a non-finite value"));
}

static void test_wrong_tensor_set_is_refused(void **state) {
    (void)state;
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    const StTensor **row = calloc((size_t)spec.count, sizeof *row);
    uint8_t *bytes;
    size_t len;
    SafeTensors st;
    // Peer 0's upload presented as peer 1's: it holds experts 0 and 1, owned by peer 0.
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 0, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
    assert_int_equal(safetensors_parse(bytes, len, "upload", &st), SPES_OK);
    assert_int_equal(upload_check(&spec, SYNC_MODE_SPES, 2, 1, &st, row), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "owned by peer 0"));
    safetensors_close(&st);
    free(bytes);
    // A spes upload checked as fedavg: other peers' experts are missing.
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 1, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
    assert_int_equal(safetensors_parse(bytes, len, "upload", &st), SPES_OK);
    assert_int_equal(upload_check(&spec, SYNC_MODE_FEDAVG, 2, 1, &st, row), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "experts.0.gate_proj.weight' is missing (12 of the tensors"));
    safetensors_close(&st);
    free(bytes);
    free(row);
    // The cap: peer's F32 bytes + header room, smaller for a spes peer than for fedavg.
    size_t spes_cap = upload_max_bytes(&spec, SYNC_MODE_SPES, 2, 1),
           fedavg_cap = upload_max_bytes(&spec, SYNC_MODE_FEDAVG, 2, 1);
    assert_true(spes_cap < fedavg_cap);
    assert_int_equal(fedavg_cap - spes_cap, 12 * (12 * 4 + 256));   // 2 layers x 2 experts x 3 tensors of 12 values
    model_spec_free(&spec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_uploads_pass),
        cmocka_unit_test(test_bad_uploads_name_what_is_wrong),
        cmocka_unit_test(test_values_beyond_any_weight_refused),
        cmocka_unit_test(test_wrong_tensor_set_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
