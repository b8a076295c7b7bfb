// A training step whose AdamW runs under the next step's forward: overlap_step.h says how.
#include "train/overlap_step.h"

#include <math.h>

#include "base/error.h"

// The forward is about to read part `part`: its update (and the zeroing of its gradients) first.
static int wait_for_update(void *ctx, ModelHookEvent event, int part) {
    OverlapStep *o = ctx;
    if (event == MODEL_HOOK_PRE_FORWARD) o->m->be->ops->aux_wait(o->m->be, part);
    return SPES_OK;
}

// On the aux queue, behind part `part`'s update: zero its gradients, mark the point.
static int after_update(void *ctx, int part) {
    OverlapStep *o = ctx;
    Model *m = o->m;
    size_t offset, numel;
    param_part_grad_span(&m->table, part, m->cfg.n_layers, &offset, &numel);
    if (numel) m->be->ops->zero(m->be, m->grads + offset, numel * sizeof(float));
    m->be->ops->aux_mark(m->be, part);
    return SPES_OK;
}

int overlap_step_begin(OverlapStep *o, Model *m, AdamW *opt) {
    if (m->hooks) return spes_fail("overlap_step: the model's hooks are taken (data parallelism or sharding)");
    if (opt->offload) return spes_fail("overlap_step: the optimizer is offloaded to the host");
    if (m->cfg.n_layers + 2 > BACKEND_AUX_POINTS)
        return spes_fail("overlap_step: %d layers; the backend's queue points serve at most %d", m->cfg.n_layers,
                         BACKEND_AUX_POINTS - 2);
    *o = (OverlapStep){.m = m, .opt = opt, .hooks = {.fn = wait_for_update, .ctx = o}};
    model_zero_grad(m);
    m->hooks = &o->hooks;
    return SPES_OK;
}

int overlap_step(OverlapStep *o, const int32_t *inputs, const int32_t *targets, int B, int T,
                 const LossWeights *weights, double lr, double max_norm, LossValues *loss, double *grad_norm) {
    Model *m = o->m;
    Backend *be = m->be;
    SPES_TRY(model_forward_backward(m, inputs, targets, B, T, weights, 1.0f, loss, NULL));
    *grad_norm = grad_global_norm(be, m->grads, m->table.trainable_numel);   // reads back: the backward is done
    if (isnan(*grad_norm)) SPES_TRY(backend_sync(be));                       // a failed backend says why
    const Buf compute = {m->cparams, be->compute};
    be->ops->aux_begin(be);
    int rc = adamw_step_parts(o->opt, &m->table, m->cfg.n_layers, m->dparams, m->grads,
                              grad_clip_coef(*grad_norm, max_norm), compute, lr, after_update, o);
    be->ops->aux_end(be);
    return rc;
}

int overlap_step_end(OverlapStep *o) {
    o->m->hooks = NULL;
    return backend_sync(o->m->be);
}
