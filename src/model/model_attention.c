// Attention block: x_mid = x_in + o_proj(attn(rope(qk_norm(q, k)), v)) on input_layernorm(x_in).
// q_proj, k_proj, v_proj are adjacent in the parameter buffer ([q; k; v] = [qd+2kd, H]), so
// the three projections run as one GEMM (and one for each gradient). q and k leave the
// joined output through their QK-norm + RoPE op (which reads it in place), v by a copy; the
// backward writes dq, dk (through the same op's backward) and dv into one joined gradient.
// With a KV cache (incremental decoding) the new keys/values land in the cache and the
// queries attend to everything cached; the same code otherwise.
#include "model/model_internal.h"

void attention_block_forward(Model *m, int l, const LayerKv *kv) {
    const ModelConfig *c = &m->cfg;
    Backend *be = m->be;
    const BackendOps *op = be->ops;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const LayerParams *p = &m->bind->layers[l];
    const int B = a->B, T = a->T, N = B * T, H = c->d_model, hd = c->head_dim;
    const int qd = c->n_heads * hd, kd = c->n_kv_heads * hd;
    const bool qk = c->qk_norm != QK_NORM_NONE, per_head = c->qk_norm == QK_NORM_HEAD;
    // Keys/values of this chunk: the layer's activations, or the cache at position `past`.
    const int past = kv ? kv->past : 0;
    Buf k_out = kv ? buf_at(kv->k, (size_t)past * kd) : la->k, v_out = kv ? buf_at(kv->v, (size_t)past * kd) : la->v;
    const float *cos_t = kv ? kv->rope_cos + (size_t)past * (hd / 2) : a->rope_cos;
    const float *sin_t = kv ? kv->rope_sin + (size_t)past * (hd / 2) : a->rope_sin;

    double t = phase_begin(m);
    op->rmsnorm_forward(be, la->h1, la->rstd1, buf_f32(la->x_in), p->attn_norm, N, H, c->norm_eps);
    phase_end(m, MODEL_PHASE_NORMS, t);
    t = phase_begin(m);
    // qkv [N, S] = h1 [q; k; v]^T, then q and k taken out of it with their QK-norm and RoPE
    // (the raw q/k kept for the backward), or copied out and rotated; v copied out.
    const int S = qd + 2 * kd;
    linear_forward(be, a->qkv, la->h1, p->qkv, N, H, S, false);
    if (qk) {
        op->qk_norm_rope_forward(be, la->q, la->q_raw, la->q_rstd, a->qkv, S, p->q_norm, cos_t, sin_t, B, T,
                                 c->n_heads, hd, per_head, c->norm_eps);
        op->qk_norm_rope_forward(be, k_out, la->k_raw, la->k_rstd, buf_at(a->qkv, qd), S, p->k_norm, cos_t, sin_t, B,
                                 T, c->n_kv_heads, hd, per_head, c->norm_eps);
    } else {
        op->copy_2d(be, la->q, qd, a->qkv, S, N, qd);
        op->copy_2d(be, k_out, kd, buf_at(a->qkv, qd), S, N, kd);
        op->rope_forward(be, la->q, cos_t, sin_t, B, T, c->n_heads, hd);
        op->rope_forward(be, k_out, cos_t, sin_t, B, T, c->n_kv_heads, hd);
    }
    op->copy_2d(be, v_out, kd, buf_at(a->qkv, qd + kd), S, N, kd);
    if (kv)
        op->attention_forward(be, la->att, la->att_lse, la->q, kv->k, kv->v, B, T, past + T, c->n_heads,
                              c->n_kv_heads, hd);
    else
        op->attention_forward(be, la->att, la->att_lse, la->q, la->k, la->v, B, T, T, c->n_heads, c->n_kv_heads, hd);
    linear_forward_residual(be, buf_f32(la->x_mid), buf_f32(la->x_in), la->att, p->o, N, qd, H);
    phase_end(m, MODEL_PHASE_ATTN_FWD, t);
}

// dW += dy^T x for a trainable weight; nothing for a frozen one (g NULL). dy has row stride ldy.
static void weight_grad(Backend *be, float *g, Buf dy, int ldy, Buf x, int N, int in, int out) {
    if (g) be->ops->gemm(be, true, false, out, in, N, 1.0f, dy, ldy, x, in, 1.0f, buf_f32(g), in);
}

void attention_block_backward(Model *m, int l) {
    const ModelConfig *c = &m->cfg;
    Backend *be = m->be;
    const BackendOps *op = be->ops;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const LayerParams *p = &m->bind->layers[l];
    const int B = a->B, T = a->T, N = B * T, H = c->d_model, hd = c->head_dim;
    const int qd = c->n_heads * hd, kd = c->n_kv_heads * hd;
    const Buf dresid = buf_f32(a->dresid);

    // o_proj: dresid is dL/dx_mid
    double t = phase_begin(m);
    linear_backward_input(be, a->datt, dresid, p->o, N, qd, H, false);
    weight_grad(be, p->d_o, dresid, H, la->att, N, qd, H);
    op->attention_backward(be, a->dq, a->dk, a->dv, a->datt, la->att, la->att_lse, la->q, la->k, la->v, B, T,
                           c->n_heads, c->n_kv_heads, hd);
    // into the joined gradient [N, S] (the forward's qkv buffer): dq and dk through RoPE and
    // QK-norm (or RoPE alone), dv as it is
    const int S = qd + 2 * kd;
    if (c->qk_norm != QK_NORM_NONE) {
        const bool per_head = c->qk_norm == QK_NORM_HEAD;
        op->qk_norm_rope_backward(be, a->qkv, S, p->d_q_norm, a->dq, la->q_raw, p->q_norm, la->q_rstd, a->rope_cos,
                                  a->rope_sin, B, T, c->n_heads, hd, per_head);
        op->qk_norm_rope_backward(be, buf_at(a->qkv, qd), S, p->d_k_norm, a->dk, la->k_raw, p->k_norm, la->k_rstd,
                                  a->rope_cos, a->rope_sin, B, T, c->n_kv_heads, hd, per_head);
    } else {
        op->rope_backward(be, a->dq, a->rope_cos, a->rope_sin, B, T, c->n_heads, hd);
        op->rope_backward(be, a->dk, a->rope_cos, a->rope_sin, B, T, c->n_kv_heads, hd);
        op->copy_2d(be, a->qkv, S, a->dq, qd, N, qd);
        op->copy_2d(be, buf_at(a->qkv, qd), S, a->dk, kd, N, kd);
    }
    op->copy_2d(be, buf_at(a->qkv, qd + kd), S, a->dv, kd, N, kd);
    // q/k/v projections: dh1 = [dq dk dv] [Wq; Wk; Wv], one GEMM on the joined gradient
    linear_backward_input(be, a->dh, a->qkv, p->qkv, N, H, S, false);
    if (p->d_q && p->d_k == p->d_q + (size_t)qd * H && p->d_v == p->d_k + (size_t)kd * H) {
        linear_backward_weight(be, p->d_q, a->qkv, S, la->h1, N, H, S);   // adjacent gradients: one GEMM
    } else {
        weight_grad(be, p->d_q, a->qkv, S, la->h1, N, H, qd);
        weight_grad(be, p->d_k, buf_at(a->qkv, qd), S, la->h1, N, H, kd);
        weight_grad(be, p->d_v, buf_at(a->qkv, qd + kd), S, la->h1, N, H, kd);
    }
    phase_end(m, MODEL_PHASE_ATTN_BWD, t);
    // input_layernorm, plus the residual already in dresid: dresid becomes dL/dx_in
    t = phase_begin(m);
    op->rmsnorm_backward(be, dresid, p->d_attn_norm, a->dh, buf_f32(la->x_in), p->attn_norm, la->rstd1, N, H, true);
    phase_end(m, MODEL_PHASE_NORMS, t);
}
