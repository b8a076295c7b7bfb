// One micro-batch through the model: embedding, layers, final norm, LM head + losses, and
// (for training) the backward in reverse order, adding gradients into m->grads.
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "model/model_internal.h"
#include "ops/cpu/cpu_ops.h"

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

// LM head in blocks of rows: logits for R tokens at a time, their loss, and when training
// their gradient straight away (dL/dhf into a->dh, dL/dlm_head added). Logits are copied
// out when asked for; otherwise at most R x V of them exist at once.
static void lm_head_and_loss(Model *m, const int32_t *targets, float ce_scale, float z_scale, bool grad,
                             float *logits_out) {
    const ModelConfig *c = &m->cfg;
    ModelActivations *a = m->acts;
    const int N = a->B * a->T, H = c->d_model, V = c->embedding_size;
    const float *W = model_param_of(m, PARAM_LM_HEAD, -1, -1);
    float *dW = grad ? model_grad_of(m, PARAM_LM_HEAD, -1, -1) : NULL;
    for (int r0 = 0; r0 < N; r0 += a->logit_rows) {
        int R = N - r0 < a->logit_rows ? N - r0 : a->logit_rows;
        const float *h = a->hf + (size_t)r0 * H;
        op_linear_forward(a->logits, h, W, R, H, V, false);
        if (logits_out) memcpy(logits_out + (size_t)r0 * V, a->logits, (size_t)R * V * sizeof(float));
        if (targets) {
            op_cross_entropy_rows(a->logits, a->row_ce + r0, a->row_lse + r0, targets + r0, R, V, ce_scale, z_scale,
                                  grad);
        }
        if (grad) {
            op_linear_backward_input(a->dh + (size_t)r0 * H, a->logits, W, R, H, V, false);
            if (dW) op_linear_backward_weight(dW, a->logits, h, R, H, V);
        }
    }
}

// The forward of everything; the backward too when `grad`.
static int run(Model *m, const int32_t *inputs, const int32_t *targets, int B, int T, const LossWeights *w,
               bool grad, float grad_scale, LossValues *out, float *logits_out) {
    SPES_TRY(check_batch(m, inputs, targets, B, T));
    if (grad && !targets) return spes_fail("model: a backward pass needs targets");
    SPES_TRY(model_acts_plan(m, B, T));
    const ModelConfig *c = &m->cfg;
    ModelActivations *a = m->acts;
    const int N = B * T, H = c->d_model, L = c->n_layers;
    const LossWeights zero_weights = {0};
    if (!w) w = &zero_weights;

    int64_t num_targets = 0;
    if (targets)
        for (int i = 0; i < N; i++) num_targets += targets[i] != IGNORE_INDEX;

    double t = phase_begin();
    op_rope_tables(a->rope_cos, a->rope_sin, T, c->head_dim, c->rope_theta);
    op_embedding_forward(a->layers[0].x_in, model_param_of(m, PARAM_EMBED, -1, -1), inputs, N, H);
    phase_end(m, MODEL_PHASE_EMBED, t);
    for (int l = 0; l < L; l++) {
        SPES_TRY(attention_block_forward(m, l));
        moe_block_forward(m, l, w);
    }
    t = phase_begin();
    op_rmsnorm_forward(a->hf, a->rstd_f, a->x_final, model_param_of(m, PARAM_FINAL_NORM, -1, -1), N, H, c->norm_eps);
    phase_end(m, MODEL_PHASE_NORMS, t);
    t = phase_begin();
    float ce_scale = num_targets ? grad_scale / (float)num_targets : 0.0f;
    lm_head_and_loss(m, targets, ce_scale, ce_scale * w->lm_z_mult, grad, logits_out);
    phase_end(m, MODEL_PHASE_LM_HEAD, t);

    if (out) {
        memset(out, 0, sizeof *out);
        out->num_targets = num_targets;
        if (targets && num_targets > 0) {
            for (int i = 0; i < N; i++) {
                out->ce += a->row_ce[i];
                out->lm_z += (double)a->row_lse[i] * a->row_lse[i];
            }
            out->ce /= (double)num_targets;
            out->lm_z /= (double)num_targets;
        }
        double lb = 0.0;
        for (int l = 0; l < L; l++) {
            lb += a->layers[l].lb_sum;
            out->router_z += a->layers[l].router_z;
        }
        out->lb = lb * c->num_experts / ((double)L * N * c->top_k);
        out->total = out->ce + w->lm_z_mult * out->lm_z + w->lb_weight * out->lb + w->router_z_weight * out->router_z;
    }
    if (!grad) return SPES_OK;

    // backward: a->dh holds dL/dhf
    t = phase_begin();
    op_rmsnorm_backward(a->dresid, model_grad_of(m, PARAM_FINAL_NORM, -1, -1), a->dh, a->x_final,
                        model_param_of(m, PARAM_FINAL_NORM, -1, -1), a->rstd_f, N, H, false);
    phase_end(m, MODEL_PHASE_NORMS, t);
    for (int l = L - 1; l >= 0; l--) {
        moe_block_backward(m, l, w, grad_scale);
        SPES_TRY(attention_block_backward(m, l));
    }
    t = phase_begin();
    float *demb = model_grad_of(m, PARAM_EMBED, -1, -1);
    if (demb) op_embedding_backward(demb, a->dresid, inputs, N, H);
    phase_end(m, MODEL_PHASE_EMBED, t);
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
