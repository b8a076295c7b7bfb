// Attention block: x_mid = x_in + o_proj(attn(rope(qk_norm(q, k)), v)) on input_layernorm(x_in).
#include <string.h>

#include "base/error.h"
#include "model/model_internal.h"
#include "ops/ops.h"

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
    // q/k are projected into q_raw/k_raw when QK-norm follows, straight into q/k otherwise.
    op_linear_forward(qk ? la->q_raw : la->q, la->h1, model_param_of(m, PARAM_Q, l, -1), N, H, qd, false);
    op_linear_forward(qk ? la->k_raw : la->k, la->h1, model_param_of(m, PARAM_K, l, -1), N, H, kd, false);
    op_linear_forward(la->v, la->h1, model_param_of(m, PARAM_V, l, -1), N, H, kd, false);
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

// dW += dy^T x for a trainable weight; nothing for a frozen one.
static void weight_grad(Model *m, ParamKind kind, int l, const float *dy, const float *x, int N, int in, int out) {
    float *g = model_grad_of(m, kind, l, -1);
    if (g) op_linear_backward_weight(g, dy, x, N, in, out);
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
    weight_grad(m, PARAM_O, l, a->dresid, la->att, N, qd, H);
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
    // q/k/v projections: dh1 = dq Wq + dk Wk + dv Wv
    t = phase_begin();
    op_linear_backward_input(a->dh, a->dq, model_param_of(m, PARAM_Q, l, -1), N, H, qd, false);
    op_linear_backward_input(a->dh, a->dk, model_param_of(m, PARAM_K, l, -1), N, H, kd, true);
    op_linear_backward_input(a->dh, a->dv, model_param_of(m, PARAM_V, l, -1), N, H, kd, true);
    weight_grad(m, PARAM_Q, l, a->dq, la->h1, N, H, qd);
    weight_grad(m, PARAM_K, l, a->dk, la->h1, N, H, kd);
    weight_grad(m, PARAM_V, l, a->dv, la->h1, N, H, kd);
    phase_end(m, MODEL_PHASE_ATTN_BWD, t);
    // input_layernorm, plus the residual already in dresid: dresid becomes dL/dx_in
    t = phase_begin();
    op_rmsnorm_backward(a->dresid, model_grad_of(m, PARAM_ATTN_NORM, l, -1), a->dh, la->x_in,
                        model_param_of(m, PARAM_ATTN_NORM, l, -1), la->rstd1, N, H, true);
    phase_end(m, MODEL_PHASE_NORMS, t);
    return SPES_OK;
}
