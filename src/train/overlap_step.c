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

int overlap_step_init(OverlapStep *o, Model *m, AdamW *opt) {
    if (opt->offload) return spes_fail("overlap_step: the optimizer is offloaded to the host");
    // Each part's gradients are zeroed behind its update: the optimizer must update all of them.
    if (opt->be != m->be || opt->lo != 0 || opt->hi != m->table.trainable_numel)
        return spes_fail("overlap_step: the optimizer must hold the whole gradient on the model's backend "
                         "(it holds %zu..%zu of %zu)", opt->lo, opt->hi, m->table.trainable_numel);
    if (m->cfg.n_layers + 2 > BACKEND_AUX_POINTS)
        return spes_fail("overlap_step: %d layers; the backend's queue points serve at most %d", m->cfg.n_layers,
                         BACKEND_AUX_POINTS - 2);
    *o = (OverlapStep){.m = m, .opt = opt, .hooks = {.fn = wait_for_update, .ctx = o}};
    return SPES_OK;
}

int overlap_step_begin(OverlapStep *o, Model *m, AdamW *opt) {
    if (m->hooks) return spes_fail("overlap_step: the model's hooks are taken (data parallelism or sharding)");
    SPES_TRY(overlap_step_init(o, m, opt));
    model_zero_grad(m);
    m->hooks = &o->hooks;
    return SPES_OK;
}

int overlap_queue_update(OverlapStep *o, float grad_scale, double lr) {
    Model *m = o->m;
    Backend *be = m->be;
    const Buf compute = {m->cparams, be->compute};
    be->ops->aux_begin(be);
    int rc = adamw_step_parts(o->opt, &m->table, m->cfg.n_layers, m->dparams, m->grads, grad_scale, compute, lr,
                              after_update, o);
    be->ops->aux_end(be);
    return rc;
}

int overlap_step(OverlapStep *o, const int32_t *inputs, const int32_t *targets, int B, int T,
                 const LossWeights *weights, double lr, double max_norm, LossValues *loss, double *grad_norm) {
    Model *m = o->m;
    Backend *be = m->be;
    SPES_TRY(model_forward_backward(m, inputs, targets, B, T, weights, 1.0f, loss, NULL));
    double sumsq;   // read back: the backward is done (a failed backend says why here)
    SPES_TRY(grad_sum_of_squares(be, m->grads, m->table.trainable_numel, &sumsq));
    *grad_norm = sqrt(sumsq);
    // A non-finite norm would make every weight NaN (the clip factor is NaN): no update, as the trainer.
    if (!isfinite(*grad_norm))
        return spes_fail("overlap_step: the gradient norm is %g (loss %g): no update made", *grad_norm, loss->total);
    return overlap_queue_update(o, grad_clip_coef(*grad_norm, max_norm), lr);
}

int overlap_step_end(OverlapStep *o) {
    o->m->hooks = NULL;
    return backend_sync(o->m->be);
}
