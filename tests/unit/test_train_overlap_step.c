// A training step whose AdamW runs on the aux queue under the next forward
// (src/train/overlap_step.c) and the part-by-part update under it (adamw_step_parts), on the
// cpu backend: the same bits as the plain step; the parts in order, an error stopping the
// update; what the overlapped step refuses. tests/gpu/test_cuda_core.c runs the same check on
// a GPU, where the two queues really overlap.
#include "overlap_step_check.h"

#include <math.h>


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
    overlap_step_vs_plain(backend_cpu(), "tiny", 2, 16, -1);
}

static int other_hook(void *ctx, ModelHookEvent e, int part) {
    (void)ctx, (void)e, (void)part;
    return SPES_OK;
}

// The tiny preset's model and optimizer on the cpu backend.
static void open_tiny(OverlapCheckRun *r, ModelConfig *cfg) {
    assert_int_equal(model_config_preset("tiny", cfg), SPES_OK);
    overlap_check_open(r, cfg, backend_cpu());
}

static void test_refusals(void **state) {
    (void)state;
    ModelConfig cfg;
    OverlapCheckRun r;
    open_tiny(&r, &cfg);
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
    // A shard of the state (ZeRO): the zeroing behind each part would clear gradients no update read.
    r.opt.hi = r.opt.hi - 1;
    assert_int_equal(overlap_step_begin(&o, &r.m, &r.opt), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "whole gradient"));
    r.opt.hi = r.opt.hi + 1;
    overlap_check_close(&r);
}

// A gradient norm that is not finite stops the step before any update (it would make every
// weight NaN), as the trainer does.
static void test_nonfinite_norm_no_update(void **state) {
    (void)state;
    ModelConfig cfg;
    OverlapCheckRun r;
    open_tiny(&r, &cfg);
    const size_t total = r.m.table.total_numel;
    r.m.params[total - 1] = NAN;   // in lm_head (the last tensor): every logit row, the loss and the norm NaN
    assert_int_equal(model_params_to_device(&r.m), SPES_OK);
    float *before = malloc(total * sizeof(float));
    memcpy(before, r.m.params, total * sizeof(float));
    int32_t in[2 * 16], tg[2 * 16];
    for (int i = 0; i < 2 * 16; i++) in[i] = i % cfg.vocab_size, tg[i] = (i * 7) % cfg.vocab_size;
    const LossWeights w = {.lm_z_mult = 1e-5f};
    OverlapStep o;
    LossValues loss;
    double norm;
    assert_int_equal(overlap_step_begin(&o, &r.m, &r.opt), SPES_OK);
    assert_int_equal(overlap_step(&o, in, tg, 2, 16, &w, 1e-3, 1.0, &loss, &norm), SPES_ERR);
    assert_false(isfinite(norm));
    assert_non_null(strstr(spes_last_error(), "no update made"));
    assert_int_equal(overlap_step_end(&o), SPES_OK);
    assert_int_equal(model_params_to_host(&r.m), SPES_OK);
    assert_memory_equal(before, r.m.params, total * sizeof(float));
    assert_int_equal(r.opt.step, 0);
    free(before);
    overlap_check_close(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts_in_order_same_bits),
        cmocka_unit_test(test_overlapped_steps_same_bits),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_nonfinite_norm_no_update),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
