// delta_payload_bytes (the plan's size of a delta payload, nothing encoded) against what
// delta_payload_serialize writes for real codes: equal for int8, never less for int4 (zstd frames
// at their worst case); and its view without some tensors against aggregate_view_build's.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "server/aggregate_view.h"
#include "sync/delta_payload.h"

enum { N_TENSORS = 3 };
static const char *const names[N_TENSORS] = {"model.embed_tokens.weight", "model.layers.0.mlp.experts.1.up_proj.weight",
                                             "model.norm.weight"};
static const int64_t shapes[N_TENSORS][2] = {{37, 29}, {300, 7}, {513, 0}};

static void check_codec(const DeltaCodec *c, int base_step) {
    DeltaTensor t[N_TENSORS];
    int8_t *q[N_TENSORS];
    float *s[N_TENSORS];
    uint32_t x = 1;
    for (int i = 0; i < N_TENSORS; i++) {
        size_t numel = (size_t)shapes[i][0] * (size_t)(shapes[i][1] ? shapes[i][1] : 1);
        q[i] = malloc(numel);
        s[i] = malloc(delta_blocks(numel) * sizeof(float));
        for (size_t k = 0; k < numel; k++) {
            x = x * 1103515245u + 12345u;
            q[i][k] = (int8_t)((int)((x >> 16) % (2u * (unsigned)c->qmax + 1)) - c->qmax);
        }
        for (size_t b = 0; b < delta_blocks(numel); b++) s[i][b] = 0.25f;   // exact in bf16 too
        t[i] = (DeltaTensor){.name = names[i], .ndim = shapes[i][1] ? 2 : 1, .numel = numel, .q = q[i], .scale = s[i]};
        t[i].shape[0] = shapes[i][0];
        t[i].shape[1] = shapes[i][1];
    }
    uint8_t *bytes = NULL;
    size_t len = 0, planned = 0;
    assert_int_equal(delta_payload_serialize(c, t, N_TENSORS, base_step, &bytes, &len), SPES_OK);
    assert_int_equal(delta_payload_bytes(c, t, N_TENSORS, base_step, NULL, NULL, &planned), SPES_OK);
    if (c->zstd) assert_true(planned >= len);
    else assert_int_equal(planned, len);
    // The view without tensor 1 (and its scale), as the server builds it from the payload.
    SafeTensors st;
    assert_int_equal(safetensors_parse(bytes, len, "payload", &st), SPES_OK);
    bool keep_st[2 * N_TENSORS], keep[N_TENSORS] = {true, false, true};
    for (int i = 0; i < st.count; i++) keep_st[i] = strncmp(st.tensors[i].name, names[1], strlen(names[1])) != 0;
    AggregateView v;
    assert_int_equal(aggregate_view_build(&st, keep_st, c->view_omit_own, &v), SPES_OK);
    size_t planned_view = 0;
    assert_int_equal(delta_payload_bytes(c, t, N_TENSORS, base_step, keep, c->view_omit_own, &planned_view), SPES_OK);
    if (c->zstd) assert_true(planned_view >= v.len);
    else assert_int_equal(planned_view, v.len);
    aggregate_view_free(&v);
    safetensors_close(&st);
    free(bytes);
    for (int i = 0; i < N_TENSORS; i++) free(q[i]), free(s[i]);
}

static void test_int8_exact(void **state) {
    (void)state;
    check_codec(&DELTA_INT8, 2);
    check_codec(&DELTA_INT8, 123456);
}

static void test_int4_bound(void **state) {
    (void)state;
    check_codec(&DELTA_INT4, 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_int8_exact), cmocka_unit_test(test_int4_bound)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
