// Attention block: x_mid = x_in + o_proj(attn(rope(qk_norm(q, k)), v)) on input_layernorm(x_in).
// q_proj, k_proj, v_proj are adjacent in the parameter buffer ([q; k; v] = [qd+2kd, H]), so
// the three projections run as one GEMM (and one for each gradient), split by cheap copies.
#include <string.h>

#include "base/error.h"
#include "model/model_internal.h"
#include "ops/cpu/cpu_ops.h"

// QK-norm geometry: full = one row of n*hd per token; head = one row of hd per head.
static void qk_norm_shape(const ModelConfig *c, int N, int n_heads, int *rows, int *width) {
    bool per_head = c->qk_norm == QK_NORM_HEAD;
    *rows = per_head ? N * n_heads : N;
    *width = per_head ? c->head_dim : n_heads * c->head_dim;
}

int attention_block_forward(Model *m, int l) {
    const ModelConfig *c = &m->cfg;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const int B = a->B, T = a->T, N = B * T, H = c->d_model, hd = c->head_dim;
    const int qd = c->n_heads * hd, kd = c->n_kv_heads * hd;
    const bool qk = c->qk_norm != QK_NORM_NONE;

    double t = phase_begin();
    op_rmsnorm_forward(la->h1, la->rstd1, la->x_in, model_param_of(m, PARAM_ATTN_NORM, l, -1), N, H, c->norm_eps);
    phase_end(m, MODEL_PHASE_NORMS, t);
    t = phase_begin();
    // q/k go to q_raw/k_raw when QK-norm follows, straight into q/k otherwise.
    const int S = qd + 2 * kd;
    op_linear_forward(a->qkv, la->h1, model_param_of(m, PARAM_Q, l, -1), N, H, S, false);
    op_copy_2d(qk ? la->q_raw : la->q, qd, a->qkv, S, N, qd);
    op_copy_2d(qk ? la->k_raw : la->k, kd, a->qkv + qd, S, N, kd);
    op_copy_2d(la->v, kd, a->qkv + qd + kd, S, N, kd);
    phase_end(m, MODEL_PHASE_ATTN_FWD, t);
    if (qk) {
        t = phase_begin();
        int rows, width;
        qk_norm_shape(c, N, c->n_heads, &rows, &width);
        op_rmsnorm_forward(la->q, la->q_rstd, la->q_raw, model_param_of(m, PARAM_Q_NORM, l, -1), rows, width,
                           c->norm_eps);
        qk_norm_shape(c, N, c->n_kv_heads, &rows, &width);
        op_rmsnorm_forward(la->k, la->k_rstd, la->k_raw, model_param_of(m, PARAM_K_NORM, l, -1), rows, width,
                           c->norm_eps);
        phase_end(m, MODEL_PHASE_NORMS, t);
    }
    t = phase_begin();
    op_rope_forward(la->q, a->rope_cos, a->rope_sin, B, T, c->n_heads, hd);
    op_rope_forward(la->k, a->rope_cos, a->rope_sin, B, T, c->n_kv_heads, hd);
    SPES_TRY(op_attention_forward(la->att, la->att_lse, la->q, la->k, la->v, B, T, c->n_heads, c->n_kv_heads, hd));
    memcpy(la->x_mid, la->x_in, (size_t)N * H * sizeof(float));
    op_linear_forward(la->x_mid, la->att, model_param_of(m, PARAM_O, l, -1), N, qd, H, true);
    phase_end(m, MODEL_PHASE_ATTN_FWD, t);
    return SPES_OK;
}

// dW += dy^T x for a trainable weight; nothing for a frozen one. dy has row stride ldy.
static void weight_grad(Model *m, ParamKind kind, int l, const float *dy, int ldy, const float *x, int N, int in,
                        int out) {
    float *g = model_grad_of(m, kind, l, -1);
    if (g) op_gemm(true, false, out, in, N, 1.0f, dy, ldy, x, in, 1.0f, g, in);
}

int attention_block_backward(Model *m, int l) {
    const ModelConfig *c = &m->cfg;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const int B = a->B, T = a->T, N = B * T, H = c->d_model, hd = c->head_dim;
    const int qd = c->n_heads * hd, kd = c->n_kv_heads * hd;

    // o_proj: dresid is dL/dx_mid
    double t = phase_begin();
    op_linear_backward_input(a->datt, a->dresid, model_param_of(m, PARAM_O, l, -1), N, qd, H, false);
    weight_grad(m, PARAM_O, l, a->dresid, H, la->att, N, qd, H);
    SPES_TRY(op_attention_backward(a->dq, a->dk, a->dv, a->datt, la->att, la->att_lse, la->q, la->k, la->v, B, T,
                                   c->n_heads, c->n_kv_heads, hd));
    op_rope_backward(a->dq, a->rope_cos, a->rope_sin, B, T, c->n_heads, hd);
    op_rope_backward(a->dk, a->rope_cos, a->rope_sin, B, T, c->n_kv_heads, hd);
    phase_end(m, MODEL_PHASE_ATTN_BWD, t);
    if (c->qk_norm != QK_NORM_NONE) {
        t = phase_begin();
        int rows, width;
        qk_norm_shape(c, N, c->n_heads, &rows, &width);
        op_rmsnorm_backward(a->dq, model_grad_of(m, PARAM_Q_NORM, l, -1), a->dq, la->q_raw,
                            model_param_of(m, PARAM_Q_NORM, l, -1), la->q_rstd, rows, width, false);
        qk_norm_shape(c, N, c->n_kv_heads, &rows, &width);
        op_rmsnorm_backward(a->dk, model_grad_of(m, PARAM_K_NORM, l, -1), a->dk, la->k_raw,
                            model_param_of(m, PARAM_K_NORM, l, -1), la->k_rstd, rows, width, false);
        phase_end(m, MODEL_PHASE_NORMS, t);
    }
    // q/k/v projections: dh1 = [dq dk dv] [Wq; Wk; Wv], one GEMM on the joined gradient
    t = phase_begin();
    const int S = qd + 2 * kd;
    op_copy_2d(a->qkv, S, a->dq, qd, N, qd);
    op_copy_2d(a->qkv + qd, S, a->dk, kd, N, kd);
    op_copy_2d(a->qkv + qd + kd, S, a->dv, kd, N, kd);
    op_linear_backward_input(a->dh, a->qkv, model_param_of(m, PARAM_Q, l, -1), N, H, S, false);
    float *gq = model_grad_of(m, PARAM_Q, l, -1), *gk = model_grad_of(m, PARAM_K, l, -1);
    float *gv = model_grad_of(m, PARAM_V, l, -1);
    if (gq && gk == gq + (size_t)qd * H && gv == gk + (size_t)kd * H) {
        op_linear_backward_weight(gq, a->qkv, la->h1, N, H, S);   // adjacent gradients: one GEMM
    } else {
        weight_grad(m, PARAM_Q, l, a->qkv, S, la->h1, N, H, qd);
        weight_grad(m, PARAM_K, l, a->qkv + qd, S, la->h1, N, H, kd);
        weight_grad(m, PARAM_V, l, a->qkv + qd + kd, S, la->h1, N, H, kd);
    }
    phase_end(m, MODEL_PHASE_ATTN_BWD, t);
    // input_layernorm, plus the residual already in dresid: dresid becomes dL/dx_in
    t = phase_begin();
    op_rmsnorm_backward(a->dresid, model_grad_of(m, PARAM_ATTN_NORM, l, -1), a->dh, la->x_in,
                        model_param_of(m, PARAM_ATTN_NORM, l, -1), la->rstd1, N, H, true);
    phase_end(m, MODEL_PHASE_NORMS, t);
    return SPES_OK;
}
