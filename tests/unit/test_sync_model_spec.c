// Model spec: expert classification, structure errors, fingerprint, difference messages,
// inference from a seeds client's first upload.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/timer.h"

#include "sync_test_model.h"

static void test_experts_are_classified_by_name(void **state) {
    (void)state;
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    assert_int_equal(spec.num_experts, 4);
    assert_int_equal(spec.num_moe_layers, 2);
    int t = model_spec_find(&spec, "model.layers.1.mlp.experts.3.down_proj.weight");
    assert_true(t >= 0);
    assert_int_equal(spec.tensors[t].layer, 1);
    assert_int_equal(spec.tensors[t].expert, 3);
    assert_int_equal(spec.tensors[t].proj, EXPERT_PROJ_DOWN);
    assert_int_equal(model_spec_expert_tensor(&spec, 1, 3, EXPERT_PROJ_DOWN), t);
    assert_int_equal(spec.tensors[model_spec_find(&spec, "model.layers.1.mlp.gate.weight")].expert, -1);
    assert_int_equal(model_spec_find(&spec, "nope"), -1);
    // Ownership: peer 1 of 2 (m = 2) sends shared tensors and experts 2, 3.
    assert_true(model_spec_peer_sends(&spec, SYNC_MODE_SPES, 2, 1, t));
    assert_false(model_spec_peer_sends(&spec, SYNC_MODE_SPES, 2, 0, t));
    assert_true(model_spec_peer_sends(&spec, SYNC_MODE_SPES, 2, 0, 0));
    assert_true(model_spec_peer_sends(&spec, SYNC_MODE_FEDAVG, 2, 0, t));
    model_spec_free(&spec);
}

static void test_structure_errors_name_the_tensor(void **state) {
    (void)state;
    ModelSpec spec;
    int64_t shape[2] = {3, 4}, other[2] = {5, 4};
    model_spec_init(&spec);
    model_spec_add(&spec, "model.layers.0.mlp.experts.0.gate_proj.weight", DTYPE_F32, 2, shape);
    model_spec_add(&spec, "model.layers.0.mlp.experts.0.up_proj.weight", DTYPE_F32, 2, shape);
    assert_int_equal(model_spec_finish(&spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "experts.0.down_proj"));
    model_spec_free(&spec);

    model_spec_init(&spec);
    static const char *proj[3] = {"gate", "up", "down"};
    for (int e = 0; e < 2; e++)
        for (int p = 0; p < 3; p++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.%s_proj.weight", e, proj[p]);
            model_spec_add(&spec, name, DTYPE_F32, 2, e == 1 && p == 1 ? other : shape);
        }
    assert_int_equal(model_spec_finish(&spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "differ in shape"));
    model_spec_free(&spec);

    model_spec_init(&spec);
    model_spec_add(&spec, "a", DTYPE_F32, 2, shape);
    model_spec_add(&spec, "a", DTYPE_F32, 2, shape);
    assert_int_equal(model_spec_finish(&spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "'a' is listed twice"));
    model_spec_free(&spec);

    model_spec_init(&spec);
    assert_int_equal(model_spec_add(&spec, "ids", DTYPE_I32, 2, shape), SPES_ERR);
    model_spec_free(&spec);
}

static void test_fingerprint_and_differences(void **state) {
    (void)state;
    ModelSpec a, b, c;
    assert_int_equal(sync_test_spec(&a, 4, 6), SPES_OK);
    assert_int_equal(sync_test_spec(&b, 4, 6), SPES_OK);
    assert_int_equal(sync_test_spec(&c, 4, 8), SPES_OK);
    assert_true(a.fingerprint == b.fingerprint);
    assert_true(a.fingerprint != c.fingerprint);
    char msg[512];
    model_spec_describe_difference(&a, &c, msg, sizeof msg);
    assert_string_equal(msg, "tensor 'lm_head.weight': shape [6,4] here, [8,4] from the peer");
    model_spec_free(&c);
    assert_int_equal(sync_test_spec(&c, 2, 6), SPES_OK);   // fewer experts
    model_spec_describe_difference(&a, &c, msg, sizeof msg);
    assert_non_null(strstr(msg, "shape [4,4] here, [2,4]"));   // the router row count differs first
    model_spec_free(&a);
    model_spec_free(&b);
    model_spec_free(&c);
}

// Peer `peer` (2 experts each) uploads; the server infers the model with at most max_experts a
// layer and must reconstruct `spec` exactly: same names, shapes, order.
static void check_inferred(const ModelSpec *spec, int peer, int max_experts) {
    uint8_t *bytes;
    size_t len;
    SafeTensors st;
    ModelSpec inferred;
    assert_int_equal(sync_test_upload(spec, SYNC_MODE_SPES, 2, peer, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
    assert_int_equal(safetensors_parse(bytes, len, "upload", &st), SPES_OK);
    assert_int_equal(model_spec_infer_from_upload(&st, SYNC_MODE_SPES, max_experts, &inferred), SPES_OK);
    assert_int_equal(inferred.count, spec->count);
    assert_int_equal(inferred.num_experts, spec->num_experts);
    assert_true(inferred.fingerprint == spec->fingerprint);
    model_spec_free(&inferred);
    safetensors_close(&st);
    free(bytes);
}

static void test_spec_inferred_from_a_first_upload(void **state) {
    (void)state;
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    // Peer 1 of 2 (experts 2, 3): the server reconstructs all 4 experts per layer.
    check_inferred(&spec, 1, 4);
    // Replicas: 4 peers x 2 of the same 4 experts (peer 3 owns experts 2, 3). The server's
    // topology allows 4 x 2 = 8 experts a layer; the routers' 4 rows say there are 4.
    check_inferred(&spec, 3, 8);
    model_spec_free(&spec);
}

// A few thousand names can claim layers x experts x 3 = 2000 x 100000 x 3 table entries
// (2.4 GB). The spec must be refused for what the names are, with the work bounded by their
// number: under an address-space limit of ~1 GiB above what the process holds, the old
// allocate-first code failed with "out of memory" instead.
static void test_expert_names_cannot_amplify(void **state) {
    (void)state;
    long pages = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    assert_non_null(statm);
    assert_int_equal(fscanf(statm, "%ld", &pages), 1);
    fclose(statm);
    struct rlimit old_limit, limit;
    assert_int_equal(getrlimit(RLIMIT_AS, &old_limit), 0);
    limit = old_limit;
    limit.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)1 << 30);
    assert_int_equal(setrlimit(RLIMIT_AS, &limit), 0);
    ModelSpec spec;
    model_spec_init(&spec);
    int64_t shape[2] = {1, 1};
    char name[96];
    for (int l = 0; l < 2000; l++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
        assert_int_equal(model_spec_add(&spec, name, DTYPE_F32, 2, shape), SPES_OK);
    }
    assert_int_equal(model_spec_add(&spec, "model.layers.0.mlp.experts.99999.gate_proj.weight", DTYPE_F32, 2, shape),
                     SPES_OK);
    double start = now_seconds();
    int rc = model_spec_finish(&spec);
    double took = now_seconds() - start;
    setrlimit(RLIMIT_AS, &old_limit);
    assert_int_equal(rc, SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "2000 MoE layers x 100000 experts"));
    assert_true(took < 0.5);
    model_spec_free(&spec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_are_classified_by_name),
        cmocka_unit_test(test_structure_errors_name_the_tensor),
        cmocka_unit_test(test_fingerprint_and_differences),
        cmocka_unit_test(test_spec_inferred_from_a_first_upload),
        cmocka_unit_test(test_expert_names_cannot_amplify),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
