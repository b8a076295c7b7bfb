// Private to src/model: activation memory and the per-block forward/backward functions.
#pragma once
#include "model/model.h"

// What one layer keeps from its forward for its backward. N = B*T tokens, qd = n_heads*hd,
// kd = n_kv_heads*hd, NK = N*top_k routed rows.
typedef struct {
    float *x_in;             // [N,H] residual entering the layer (the previous layer's output)
    float *h1, *rstd1;       // input_layernorm: [N,H], [N]
    float *q_raw, *k_raw;    // [N,qd], [N,kd] projections before QK-norm (NULL without QK-norm)
    float *q_rstd, *k_rstd;  // QK-norm rstd: [N] (full) or [N*n_heads], [N*n_kv] (head)
    float *q, *k, *v;        // [N,qd], [N,kd], [N,kd] attention inputs (normed, rotated)
    float *att;              // [N,qd] attention output before o_proj
    float *att_lse;          // [B,n_heads,T]
    float *x_mid;            // [N,H] residual after attention
    float *h2, *rstd2;       // post_attention_layernorm: [N,H], [N]
    float *probs, *router_lse;   // [N,E], [N]
    int32_t *topk_idx;       // [N,k]
    float *topk_w;           // [N,k]
    int32_t *expert_offsets; // [E+1]
    int32_t *row_token;      // [NK] token of each permuted row
    int32_t *row_of_slot;    // [NK] permuted row of (token, slot)
    float *gu;               // [NK,2I] gate|up projections (overwritten by their gradient in backward)
    float *a;                // [NK,I] silu(gate)*up
    float *y;                // [NK,H] expert outputs, unweighted
    double lb_sum;           // sum_e c_e * count_e * meanprob_e of this layer
    double router_z;         // mean over tokens of lse^2
} LayerActs;

struct ModelActivations {
    int B, T;
    void *arena;
    size_t arena_bytes;      // capacity: a smaller (B, T) later is carved from the same arena
    LayerActs *layers;       // [L]
    float *x_final;          // [N,H] residual after the last layer
    float *hf, *rstd_f;      // final norm: [N,H], [N]
    float *rope_cos, *rope_sin;   // [T, hd/2]
    // scratch, shared by all layers
    float *xe;               // [NK,H] rows gathered for the experts
    float *dxe;              // [NK,H] expert output grads, then expert input grads
    float *da;               // [NK,I]
    float *router_logits;    // [N,E] forward logits, then their gradient
    float *dtopk_w;          // [N,k]
    float *dresid;           // [N,H] gradient of the residual stream
    float *dh;               // [N,H] gradient of a norm output
    float *dq, *dk, *dv;     // [N,qd], [N,kd], [N,kd]
    float *datt;             // [N,qd]
    float *qkv;              // [N,qd+2kd] fused q|k|v projection output, then its gradient
    float *logits;           // [R,V] one row block of the LM head
    float *row_ce, *row_lse; // [N]
    int logit_rows;          // R
    double phase_seconds[MODEL_PHASE_COUNT];   // profile, see model_phase_seconds
};

// Profiling: t = phase_begin(); ...; phase_end(m, PHASE, t) adds the elapsed time.
double phase_begin(void);
void phase_end(Model *m, ModelPhase phase, double t0);

// Plans activation memory for (B, T), reusing the current plan when it fits.
int model_acts_plan(Model *m, int B, int T);
void model_acts_free(Model *m);

// Blocks, in forward order. Each backward reads dresid = dL/d(block output) and leaves
// dL/d(block input) in dresid (residual blocks), adding weight gradients into m->grads.
int attention_block_forward(Model *m, int l);
int attention_block_backward(Model *m, int l);
void moe_block_forward(Model *m, int l, const LossWeights *w);
void moe_block_backward(Model *m, int l, const LossWeights *w, float grad_scale);

// Parameter / gradient pointers by (kind, layer, expert); gradient NULL when frozen.
float *model_param_of(Model *m, ParamKind kind, int layer, int expert);
float *model_grad_of(Model *m, ParamKind kind, int layer, int expert);

// The residual after layer l: the next layer's input, or x_final after the last layer.
static inline float *layer_output(Model *m, int l) {
    return l + 1 < m->cfg.n_layers ? m->acts->layers[l + 1].x_in : m->acts->x_final;
}
