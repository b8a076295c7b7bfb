// One micro-batch through the model: embedding, layers, final norm, LM head + losses, and
// (for training) the backward in reverse order, adding gradients into m->grads.
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "model/model_internal.h"

static int check_batch(const Model *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    if (B <= 0 || T <= 0) return spes_fail("model: batch %d x seq %d must be positive", B, T);
    if (T > m->cfg.max_seq_len)
        return spes_fail("model: sequence length %d exceeds max_seq_len %d", T, m->cfg.max_seq_len);
    if ((int64_t)B * T * m->cfg.top_k > INT32_MAX)
        return spes_fail("model: batch %d x seq %d is too large for one micro-batch", B, T);
    const int V = m->cfg.embedding_size;
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return spes_fail("model: input token %d at position %lld is outside [0, %d)", inputs[i], (long long)i, V);
        if (targets && targets[i] != IGNORE_INDEX && (targets[i] < 0 || targets[i] >= V))
            return spes_fail("model: target %d at position %lld is outside [0, %d) and not %d (ignore)", targets[i],
                             (long long)i, V, IGNORE_INDEX);
    }
    return SPES_OK;
}

// R rows of the logits block to the host as dense fp32 [R, V], through the fp32 staging when
// the block is low precision or its rows are padded.
static int download_logits(Model *m, float *out, int R) {
    Backend *be = m->be;
    const ModelActivations *a = m->acts;
    const int V = m->cfg.embedding_size, ld = a->logit_ld;
    if (!a->logits_f32) return be->ops->download(be, out, a->logits.p, (size_t)R * V * sizeof(float));
    for (int r0 = 0; r0 < R; r0 += a->logit_stage_rows) {
        int S = R - r0 < a->logit_stage_rows ? R - r0 : a->logit_stage_rows;
        be->ops->copy_2d(be, buf_f32(a->logits_f32), V, buf_at(a->logits, (size_t)r0 * ld), ld, S, V);
        SPES_TRY(be->ops->download(be, out + (size_t)r0 * V, a->logits_f32, (size_t)S * V * sizeof(float)));
    }
    return SPES_OK;
}

// LM head in blocks of rows: logits for R tokens at a time, their loss, and when training
// their gradient straight away (dL/dhf into a->dh, dL/dlm_head added). Logits are copied
// out (to the host) when asked for; otherwise at most R x V of them exist at once.
// Padded rows (logit_ld > V, a GPU backend's logits_align): every GEMM runs over logit_ld
// columns, against lm_head with zero rows past V, so no GEMM dimension is the odd V (cuBLASLt
// has no fast kernel for a contiguous dimension of 151665). The padding columns of the logits
// come out as exact zeros, the loss never reads them, and as dlogits they meet the zero rows:
// dh is the same; lm_head's dW gathers in a padded fp32 copy, added into the gradient once.
// Rows [first, N) of hf only (the KV forward wants the last few).
static int lm_head_and_loss(Model *m, int first, bool with_targets, float ce_scale, float z_scale, bool grad,
                            float *logits_out) {
    const ModelConfig *c = &m->cfg;
    Backend *be = m->be;
    ModelActivations *a = m->acts;
    const ModelBinding *b = m->bind;
    const int N = a->B * a->T, H = c->d_model, V = c->embedding_size, ld = a->logit_ld;
    const bool padded = ld != V;
    const Buf W = padded ? a->lm_head_padded : b->lm_head;   // [ld, H]
    if (padded) {
        be->ops->copy_2d(be, a->lm_head_padded, H, b->lm_head, H, V, H);
        be->ops->zero(be, buf_at(a->lm_head_padded, (size_t)V * H).p,
                      (size_t)(ld - V) * H * num_type_size(a->lm_head_padded.t));
    }
    for (int r0 = first; r0 < N; r0 += a->logit_rows) {
        int R = N - r0 < a->logit_rows ? N - r0 : a->logit_rows;
        const Buf h = buf_at(a->hf, (size_t)r0 * H);
        // logits[R, ld] = h[R, H] @ W[ld, H]^T
        be->ops->gemm(be, false, true, R, ld, H, 1.0f, h, H, W, H, 0.0f, a->logits, ld);
        if (logits_out) SPES_TRY(download_logits(m, logits_out + (size_t)(r0 - first) * V, R));
        if (with_targets)
            be->ops->cross_entropy_rows(be, a->logits, ld, a->row_ce + r0, a->row_lse + r0, a->targets + r0, R, V,
                                        ce_scale, z_scale, grad);
        if (grad) {
            // dh[R, H] = dlogits[R, ld] @ W[ld, H];  dW[ld, H] (+)= dlogits^T @ h
            be->ops->gemm(be, false, false, R, H, ld, 1.0f, a->logits, ld, W, H, 0.0f,
                          buf_at(a->dh, (size_t)r0 * H), H);
            if (b->d_lm_head && padded)   // the first block writes the padded copy, later ones add
                be->ops->gemm(be, true, false, ld, H, R, 1.0f, a->logits, ld, h, H, r0 == first ? 0.0f : 1.0f,
                              buf_f32(a->d_lm_head_padded), H);
            else if (b->d_lm_head)
                linear_backward_weight(be, b->d_lm_head, a->logits, ld, h, R, H, V);
        }
    }
    if (grad && b->d_lm_head && padded)
        be->ops->add_inplace(be, buf_f32(b->d_lm_head), buf_f32(a->d_lm_head_padded), (size_t)V * H);
    return SPES_OK;
}

// What the ce and lm_z sums are divided by: the caller's share of the batch's tokens
// (training, OLMo's normalisation), else the micro-batch's targets (a mean).
static double ce_divisor(const LossWeights *w, int64_t num_targets) {
    return w->ce_tokens > 0 ? w->ce_tokens : (double)num_targets;
}

// The step's losses from the read-back statistics (host arithmetic in double, fixed order).
static void loss_values(const Model *m, const LossWeights *w, int64_t num_targets, LossValues *out) {
    const ModelConfig *c = &m->cfg;
    const ModelActivations *a = m->acts;
    const int N = a->B * a->T, L = c->n_layers, E = c->num_experts;
    const double *st = a->stats_host;
    memset(out, 0, sizeof *out);
    out->num_targets = num_targets;
    if (num_targets > 0) {
        const double *sums = st + (size_t)L * STATS_PER_LAYER(E);
        out->ce = sums[0] / ce_divisor(w, num_targets);
        out->lm_z = sums[1] / ce_divisor(w, num_targets);
    }
    double lb = 0.0;
    for (int l = 0; l < L; l++) {
        const double *ls = st + (size_t)l * STATS_PER_LAYER(E);
        double lb_sum = 0.0;   // sum_e c_e * count_e * meanprob_e of this layer
        for (int e = 0; e < E; e++) {
            double factor = w->lb_count_factor ? w->lb_count_factor[(size_t)l * E + e] : 1.0;
            lb_sum += factor * (double)m->expert_counts[(size_t)l * E + e] * ls[e];
        }
        lb += lb_sum;
        out->router_z += ls[E] / N;
    }
    out->lb = lb * E / ((double)L * N * c->top_k);
    out->total = out->ce + w->lm_z_mult * out->lm_z + w->lb_weight * out->lb + w->router_z_weight * out->router_z;
}

// Embedding of the batch (tokens uploaded to the backend first).
static int embed(Model *m, const int32_t *inputs, const int32_t *targets, int N) {
    Backend *be = m->be;
    ModelActivations *a = m->acts;
    SPES_TRY(be->ops->upload(be, a->tokens, inputs, (size_t)N * sizeof(int32_t)));
    if (targets) SPES_TRY(be->ops->upload(be, a->targets, targets, (size_t)N * sizeof(int32_t)));
    be->ops->embedding_forward(be, buf_f32(a->layers[0].x_in), m->bind->embed, a->tokens, N, m->cfg.d_model);
    return SPES_OK;
}

// Tells the listener, if any, where the pass is (model.h).
static int hook(Model *m, ModelHookEvent event, int part) {
    return m->hooks ? m->hooks->fn(m->hooks->ctx, event, part) : SPES_OK;
}

// The forward of everything; the backward too when `grad`.
static int run(Model *m, const int32_t *inputs, const int32_t *targets, int B, int T, const LossWeights *w,
               bool grad, float grad_scale, LossValues *out, float *logits_out) {
    SPES_TRY(check_batch(m, inputs, targets, B, T));
    if (grad && !targets) return spes_fail("model: a backward pass needs targets");
    SPES_TRY(model_acts_plan(m, B, T, grad ? (ActKeep)m->checkpointing : ACT_KEEP_INPUTS));
    const ModelConfig *c = &m->cfg;
    Backend *be = m->be;
    const BackendOps *op = be->ops;
    ModelActivations *a = m->acts;
    const ModelBinding *b = m->bind;
    const int N = B * T, H = c->d_model, L = c->n_layers, E = c->num_experts;
    const int HEAD = L + 1;   // the hooks' parts: 0 embedding, 1 + l layer l, L + 1 head
    const LossWeights zero_weights = {0};
    if (!w) w = &zero_weights;

    int64_t num_targets = 0;
    if (targets)
        for (int i = 0; i < N; i++) num_targets += targets[i] != IGNORE_INDEX;

    SPES_TRY(hook(m, MODEL_HOOK_PRE_FORWARD, 0));
    double t = phase_begin(m);
    op->rope_tables(be, a->rope_cos, a->rope_sin, T, c->head_dim, c->rope_theta);
    SPES_TRY(embed(m, inputs, targets, N));
    phase_end(m, MODEL_PHASE_EMBED, t);
    SPES_TRY(hook(m, MODEL_HOOK_POST_FORWARD, 0));
    for (int l = 0; l < L; l++) {
        SPES_TRY(hook(m, MODEL_HOOK_PRE_FORWARD, 1 + l));
        attention_block_forward(m, l, NULL);
        SPES_TRY(moe_block_forward(m, l));
        SPES_TRY(hook(m, MODEL_HOOK_POST_FORWARD, 1 + l));
    }
    SPES_TRY(hook(m, MODEL_HOOK_PRE_FORWARD, HEAD));
    t = phase_begin(m);
    op->rmsnorm_forward(be, a->hf, a->rstd_f, buf_f32(a->x_final), b->final_norm, N, H, c->norm_eps);
    phase_end(m, MODEL_PHASE_NORMS, t);
    t = phase_begin(m);
    // in double, then rounded once: the same float as grad_scale / (float)num_targets while the
    // count is exact in float (< 2^24), and not rounded twice beyond
    float ce_scale = num_targets ? (float)((double)grad_scale / ce_divisor(w, num_targets)) : 0.0f;
    SPES_TRY(lm_head_and_loss(m, 0, targets != NULL, ce_scale, ce_scale * w->lm_z_mult, grad, logits_out));
    phase_end(m, MODEL_PHASE_LM_HEAD, t);
    SPES_TRY(hook(m, MODEL_HOOK_POST_FORWARD, HEAD));

    if (out) {
        double *sums = a->stats + (size_t)L * STATS_PER_LAYER(E);
        if (targets) {
            op->sum(be, sums, a->row_ce, (size_t)N, false);
            op->sum(be, sums + 1, a->row_lse, (size_t)N, true);
        }
        const size_t n_stats = (size_t)L * STATS_PER_LAYER(E) + 2;
        SPES_TRY(op->download(be, a->stats_host, a->stats, n_stats * sizeof(double)));
        loss_values(m, w, targets ? num_targets : 0, out);
    }
    if (!grad) return backend_sync(be);

    // backward: a->dh holds dL/dhf (and lm_head's gradient is in, from lm_head_and_loss)
    SPES_TRY(hook(m, MODEL_HOOK_PRE_BACKWARD, HEAD));
    t = phase_begin(m);
    op->rmsnorm_backward(be, buf_f32(a->dresid), b->d_final_norm, a->dh, buf_f32(a->x_final), b->final_norm,
                         a->rstd_f, N, H, false);
    phase_end(m, MODEL_PHASE_NORMS, t);
    SPES_TRY(hook(m, MODEL_HOOK_POST_BACKWARD, HEAD));
    for (int l = L - 1; l >= 0; l--) {
        SPES_TRY(hook(m, MODEL_HOOK_PRE_BACKWARD, 1 + l));
        if (a->keep == ACT_KEEP_INPUTS && l < L - 1) {   // the shared buffers hold layer L-1's
            attention_block_forward(m, l, NULL);
            SPES_TRY(moe_block_forward(m, l));
        }
        moe_block_backward(m, l, w, grad_scale);
        attention_block_backward(m, l);
        SPES_TRY(hook(m, MODEL_HOOK_POST_BACKWARD, 1 + l));
    }
    SPES_TRY(hook(m, MODEL_HOOK_PRE_BACKWARD, 0));
    t = phase_begin(m);
    if (b->d_embed) op->embedding_backward(be, b->d_embed, buf_f32(a->dresid), a->tokens, N, H);
    phase_end(m, MODEL_PHASE_EMBED, t);
    SPES_TRY(hook(m, MODEL_HOOK_POST_BACKWARD, 0));
    return backend_sync(be);
}

// The events of run() in its order, without the work: forward parts 0..L+1, each PRE then
// POST, then the backward from the head down. test_model_hook_replay compares it with a pass.
int model_hook_replay(const Model *m, bool backward, const ModelHooks *hooks) {
    const int HEAD = m->cfg.n_layers + 1;
    for (int part = 0; part <= HEAD; part++) {
        SPES_TRY(hooks->fn(hooks->ctx, MODEL_HOOK_PRE_FORWARD, part));
        SPES_TRY(hooks->fn(hooks->ctx, MODEL_HOOK_POST_FORWARD, part));
    }
    for (int part = HEAD; backward && part >= 0; part--) {
        SPES_TRY(hooks->fn(hooks->ctx, MODEL_HOOK_PRE_BACKWARD, part));
        SPES_TRY(hooks->fn(hooks->ctx, MODEL_HOOK_POST_BACKWARD, part));
    }
    return SPES_OK;
}

int model_forward_backward(Model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                           const LossWeights *weights, float grad_scale, LossValues *out, float *logits_out) {
    return run(m, inputs, targets, B, T, weights, true, grad_scale, out, logits_out);
}

int model_forward(Model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                  const LossWeights *weights, LossValues *out, float *logits_out) {
    return run(m, inputs, targets, B, T, weights, false, 0.0f, out, logits_out);
}

int model_forward_kv(Model *m, const ModelKvCache *cache, int past, const int32_t *tokens, int n, float *logits,
                     int n_logits) {
    const ModelConfig *c = &m->cfg;
    if (n <= 0) return spes_fail("kv forward: empty chunk");
    if (past < 0 || n > cache->capacity - past)
        return spes_fail("KV cache full: %d positions held, %d more do not fit in %d (the model's max_seq_len "
                         "or --max_seq bounds the context)", past, n, cache->capacity);
    if (logits && (n_logits < 1 || n_logits > n)) return spes_fail("kv forward: n_logits %d outside 1..%d", n_logits, n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->embedding_size)
            return spes_fail("token id %d at chunk position %d is outside the embedding table (0..%d)", tokens[i], i,
                             c->embedding_size - 1);
    SPES_TRY(model_acts_plan(m, 1, n, ACT_KEEP_INPUTS));
    Backend *be = m->be;
    ModelActivations *a = m->acts;
    SPES_TRY(embed(m, tokens, NULL, n));
    for (int l = 0; l < c->n_layers; l++) {
        const LayerKv kv = {.k = buf_at(cache->k, (size_t)l * cache->layer_stride),
                            .v = buf_at(cache->v, (size_t)l * cache->layer_stride),
                            .past = past,
                            .rope_cos = cache->rope_cos,
                            .rope_sin = cache->rope_sin};
        attention_block_forward(m, l, &kv);
        SPES_TRY(moe_block_forward(m, l));
    }
    if (logits) {
        const int H = c->d_model, first = n - n_logits;
        be->ops->rmsnorm_forward(be, buf_at(a->hf, (size_t)first * H), a->rstd_f,
                                 buf_f32(a->x_final + (size_t)first * H), m->bind->final_norm, n_logits, H,
                                 c->norm_eps);
        SPES_TRY(lm_head_and_loss(m, first, false, 0.0f, 0.0f, false, logits));
    }
    return backend_sync(be);
}
