// Shared by tests/unit/test_train_overlap_step.c (cpu) and tests/gpu/test_cuda_core.c (cuda):
// STEPS training steps of a model as src/train/overlap_step.h runs them (each AdamW on the aux
// queue, part by part, under the next forward) against the plain step (zero, forward+backward,
// norm, AdamW) from the same weights and tokens: the same losses, gradient norms, parameters
// and moments, bit for bit, and the gradients zeroed behind the last update. On a GPU a
// missing wait shows as other bits (the update racing the forward that reads its part); the
// GPU test holds the aux queue at each part (SPES_CUDA_AUX_DELAY_US) so that it shows for
// certain, and checks that it does by skipping one part's wait (skip_wait_part).
#pragma once
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "model/model.h"
#include "model/model_config.h"
#include "train/optimizer.h"
#include "train/overlap_step.h"

enum { OVERLAP_CHECK_STEPS = 3 };

typedef struct {
    Model m;
    AdamW opt;
} OverlapCheckRun;

static void overlap_check_open(OverlapCheckRun *r, const ModelConfig *cfg, Backend *be) {
    assert_int_equal(model_create_on(&r->m, cfg, be), SPES_OK);
    model_init_weights(&r->m, 5);
    assert_int_equal(model_params_to_device(&r->m), SPES_OK);
    AdamWConfig acfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .decay_norm_and_bias = true};
    assert_int_equal(adamw_create_on(&r->opt, &r->m.table, &acfg, be), SPES_OK);
    assert_int_equal(adamw_state_to_device(&r->opt), SPES_OK);
}

static void overlap_check_close(OverlapCheckRun *r) {
    adamw_free(&r->opt);
    model_free(&r->m);
}

// Everything the overlapped steps leave behind is the plain steps' (parameters on the host).
static void overlap_check_same(OverlapCheckRun *plain, OverlapCheckRun *over, const LossValues *lp,
                               const LossValues *lo, double np, double no, double max_norm) {
    Backend *be = over->m.be;
    // The last step's loss and norm (each step's feed the next one's weights, so the final
    // parameters check the others), then everything the steps leave behind.
    assert_memory_equal(&lp->total, &lo->total, sizeof lp->total);
    assert_memory_equal(&np, &no, sizeof np);
    assert_true(np > max_norm);
    assert_memory_equal(plain->m.params, over->m.params, plain->m.table.total_numel * sizeof(float));
    assert_int_equal(adamw_state_to_host(&plain->opt), SPES_OK);
    assert_int_equal(adamw_state_to_host(&over->opt), SPES_OK);
    assert_memory_equal(plain->opt.m, over->opt.m, plain->opt.numel * sizeof(float));
    assert_memory_equal(plain->opt.v, over->opt.v, plain->opt.numel * sizeof(float));
    const size_t ng = over->m.table.trainable_numel;
    float *g = calloc(ng, sizeof *g), *zeros = calloc(ng, sizeof *zeros);
    assert_int_equal(be->ops->download(be, g, over->m.grads, ng * sizeof(float)), SPES_OK);
    assert_memory_equal(g, zeros, ng * sizeof(float));
    free(g), free(zeros);
}

// The model's PRE_FORWARD hook as overlap_step installs it, but for one part whose wait it skips.
typedef struct {
    ModelHooks inner;
    int part;
} SkipOneWait;
static int skip_one_wait(void *ctx, ModelHookEvent event, int part) {
    const SkipOneWait *s = ctx;
    return event == MODEL_HOOK_PRE_FORWARD && part == s->part ? SPES_OK : s->inner.fn(s->inner.ctx, event, part);
}

// skip_wait_part < 0: the overlapped steps as overlap_step runs them, which must give the plain
// steps' bits; >= 0: without the wait for that part, which must not (where the queues overlap).
static void overlap_step_vs_plain(Backend *be, const char *preset, int B, int T, int skip_wait_part) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset(preset, &cfg), SPES_OK);
    const size_t n = (size_t)B * T;
    int32_t *in = malloc(n * OVERLAP_CHECK_STEPS * sizeof *in), *tg = malloc(n * OVERLAP_CHECK_STEPS * sizeof *tg);
    Rng rng;
    rng_seed(&rng, 3);
    for (size_t i = 0; i < n * OVERLAP_CHECK_STEPS; i++) {
        in[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
        tg[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
    }
    const LossWeights w = {.lm_z_mult = 1e-5f, .lb_weight = 0.01f, .router_z_weight = 0.001f};
    const double lr = 3e-3, max_norm = 0.5;   // small enough that the clip factor is not 1
    OverlapCheckRun plain, over;
    overlap_check_open(&plain, &cfg, be);
    overlap_check_open(&over, &cfg, be);
    LossValues lp, lo;
    double np, no;
    for (int s = 0; s < OVERLAP_CHECK_STEPS; s++) {
        Model *m = &plain.m;
        model_zero_grad(m);
        assert_int_equal(model_forward_backward(m, in + s * n, tg + s * n, B, T, &w, 1.0f, &lp, NULL), SPES_OK);
        np = grad_global_norm(be, m->grads, m->table.trainable_numel);
        assert_int_equal(adamw_step(&plain.opt, &m->table, m->dparams, m->grads, grad_clip_coef(np, max_norm),
                                    (Buf){m->cparams, be->compute}, lr),
                         SPES_OK);
    }
    assert_int_equal(backend_sync(be), SPES_OK);
    OverlapStep o;
    assert_int_equal(overlap_step_begin(&o, &over.m, &over.opt), SPES_OK);
    SkipOneWait skip = {.inner = o.hooks, .part = skip_wait_part};
    if (skip_wait_part >= 0) o.hooks = (ModelHooks){.fn = skip_one_wait, .ctx = &skip};   // the model holds &o.hooks
    for (int s = 0; s < OVERLAP_CHECK_STEPS; s++)
        assert_int_equal(overlap_step(&o, in + s * n, tg + s * n, B, T, &w, lr, max_norm, &lo, &no), SPES_OK);
    assert_int_equal(overlap_step_end(&o), SPES_OK);
    assert_null(over.m.hooks);
    assert_int_equal(model_params_to_host(&plain.m), SPES_OK);
    assert_int_equal(model_params_to_host(&over.m), SPES_OK);
    if (skip_wait_part >= 0)   // the forward read that part's weights before their update
        assert_true(memcmp(plain.m.params, over.m.params, plain.m.table.total_numel * sizeof(float)) != 0);
    else
        overlap_check_same(&plain, &over, &lp, &lo, np, no, max_norm);
    free(in), free(tg);
    overlap_check_close(&plain);
    overlap_check_close(&over);
}
