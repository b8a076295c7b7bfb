// A training step whose AdamW runs on the aux queue under the next forward
// (src/train/overlap_step.c) and the part-by-part update under it (adamw_step_parts), on the
// cpu backend: the same bits as the plain step; the parts in order, an error stopping the
// update; what the overlapped step refuses. tests/gpu/test_cuda_core.c runs the same check on
// a GPU, where the two queues really overlap.
#include "overlap_step_check.h"


typedef struct {
    int seen[64], count, fail_at;
} PartLog;

static int log_part(void *ctx, int part) {
    PartLog *l = ctx;
    l->seen[l->count++] = part;
    return part == l->fail_at ? spes_fail("stop at part %d", part) : SPES_OK;
}

static void test_parts_in_order_same_bits(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    Backend *be = backend_cpu();
    OverlapCheckRun a, b;
    overlap_check_open(&a, &cfg, be);
    overlap_check_open(&b, &cfg, be);
    const size_t ng = a.m.table.trainable_numel;
    for (size_t i = 0; i < ng; i++) a.m.grads[i] = b.m.grads[i] = (float)((int)(i % 13) - 6) * 0.01f;
    assert_int_equal(adamw_step(&a.opt, &a.m.table, a.m.dparams, a.m.grads, 0.75f, (Buf){NULL, NUM_F32}, 1e-2), SPES_OK);
    PartLog log = {.fail_at = -1};
    assert_int_equal(adamw_step_parts(&b.opt, &b.m.table, cfg.n_layers, b.m.dparams, b.m.grads, 0.75f,
                                      (Buf){NULL, NUM_F32}, 1e-2, log_part, &log),
                     SPES_OK);
    assert_int_equal(log.count, cfg.n_layers + 2);
    for (int p = 0; p < log.count; p++) assert_int_equal(log.seen[p], p);
    assert_memory_equal(a.m.params, b.m.params, a.m.table.total_numel * sizeof(float));
    assert_memory_equal(a.opt.m, b.opt.m, a.opt.numel * sizeof(float));
    assert_memory_equal(a.opt.v, b.opt.v, a.opt.numel * sizeof(float));
    assert_int_equal(a.opt.step, b.opt.step);

    // An error after part 1: parts 0 and 1 updated again, the rest not.
    float *before = malloc(b.m.table.total_numel * sizeof(float));
    memcpy(before, b.m.params, b.m.table.total_numel * sizeof(float));
    PartLog stop = {.fail_at = 1};
    assert_int_equal(adamw_step_parts(&b.opt, &b.m.table, cfg.n_layers, b.m.dparams, b.m.grads, 1.0f,
                                      (Buf){NULL, NUM_F32}, 1e-2, log_part, &stop),
                     SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "stop at part 1"));
    assert_int_equal(stop.count, 2);
    size_t off, numel;
    for (int p = 0; p < cfg.n_layers + 2; p++) {
        param_part_span(&b.m.table, p, cfg.n_layers, &off, &numel);
        bool same = memcmp(before + off, b.m.params + off, numel * sizeof(float)) == 0;
        assert_true(p <= 1 ? !same : same);
    }
    free(before);
    overlap_check_close(&a);
    overlap_check_close(&b);
}

static void test_overlapped_steps_same_bits(void **state) {
    (void)state;
    overlap_step_matches_plain(backend_cpu(), "tiny", 2, 16);
}

static int other_hook(void *ctx, ModelHookEvent e, int part) {
    (void)ctx, (void)e, (void)part;
    return SPES_OK;
}

static void test_refusals(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    OverlapCheckRun r;
    overlap_check_open(&r, &cfg, backend_cpu());
    OverlapStep o;
    const ModelHooks taken = {.fn = other_hook};
    r.m.hooks = &taken;
    assert_int_equal(overlap_step_begin(&o, &r.m, &r.opt), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "hooks are taken"));
    assert_ptr_equal(r.m.hooks, &taken);
    r.m.hooks = NULL;
    r.opt.offload = true;
    assert_int_equal(overlap_step_begin(&o, &r.m, &r.opt), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "offloaded"));
    assert_int_equal(adamw_step_parts(&r.opt, &r.m.table, cfg.n_layers, r.m.dparams, r.m.grads, 1.0f,
                                      (Buf){NULL, NUM_F32}, 1e-3, NULL, NULL),
                     SPES_ERR);
    r.opt.offload = false;
    overlap_check_close(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts_in_order_same_bits),
        cmocka_unit_test(test_overlapped_steps_same_bits),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
