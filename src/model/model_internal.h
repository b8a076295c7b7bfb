// Private to src/model: resolved parameters, activation memory and the per-block
// forward/backward functions. Everything here is backend memory.
#pragma once
#include "model/model.h"

// One layer's tensors, resolved once per model (no lookup by name in the hot path).
// Norm weights are read from the fp32 master; GEMM weights from the compute copy.
// Gradients are fp32, NULL for frozen tensors.
typedef struct {
    const float *attn_norm, *q_norm, *k_norm, *mlp_norm;
    Buf qkv;                 // [q; k; v] stacked: [qd+2kd, H]
    Buf o, router;           // [H, qd], [E, H]
    Buf *gate_up, *down;     // [E]: [2I, H] (gate then up), [H, I]
    float *d_attn_norm, *d_q_norm, *d_k_norm, *d_mlp_norm;
    float *d_q, *d_k, *d_v;  // adjacent ([q; k; v]) whenever all three are trainable
    float *d_o, *d_router;
    float **d_gate_up;       // [E] when gate and up are both trainable (adjacent), else NULL
    float **d_gate, **d_up, **d_down;   // [E]
} LayerParams;

struct ModelBinding {
    LayerParams *layers;     // [L]
    const float *embed, *final_norm;
    Buf lm_head;
    float *d_embed, *d_final_norm, *d_lm_head;
};

// (Re)builds m->bind from the table, the parameter buffers and the trainable mask.
int model_bind(Model *m);
void model_unbind(Model *m);

// What each layer's buffers hold on to between its forward and its backward.
typedef enum {
    ACT_KEEP_ALL = 0,        // training, no checkpointing: every layer has its own buffers
    ACT_KEEP_NO_EXPERTS,     // fine_grained: the experts' intermediates (gu, a, y) are shared
                             // and recomputed from h2 in the MoE backward
    ACT_KEEP_INPUTS,         // whole_layer, and forward-only calls: layers share everything but
                             // their input x_in and routing (probs, topk_idx); the backward recomputes
                             // each layer's forward
} ActKeep;

// What one layer keeps from its forward for its backward. N = B*T tokens, qd = n_heads*hd,
// kd = n_kv_heads*hd, NK = N*top_k routed rows. Buf: the compute type; float *: fp32.
typedef struct {
    float *x_in;             // [N,H] residual entering the layer (the previous layer's output)
    Buf h1;                  // [N,H] input_layernorm output
    float *rstd1;            // [N]
    Buf q_raw, k_raw;        // [N,qd], [N,kd] projections before QK-norm (NULL without QK-norm)
    float *q_rstd, *k_rstd;  // QK-norm rstd: [N] (full) or [N*n_heads], [N*n_kv] (head)
    Buf q, k, v;             // [N,qd], [N,kd], [N,kd] attention inputs (normed, rotated)
    Buf att;                 // [N,qd] attention output before o_proj
    float *att_lse;          // [B,n_heads,T]
    float *x_mid;            // [N,H] residual after attention
    Buf h2;                  // [N,H] post_attention_layernorm output
    float *rstd2;            // [N]
    float *probs, *router_lse;   // [N,E], [N]
    int32_t *topk_idx;       // [N,k]
    float *topk_w;           // [N,k]
    int32_t *expert_offsets; // [E+1]
    int32_t *row_token;      // [NK] token of each permuted row
    int32_t *row_of_slot;    // [NK] permuted row of (token, slot)
    Buf gu;                  // [NK,2I] gate|up projections (overwritten by their gradient in backward)
    Buf a;                   // [NK,I] silu(gate)*up
    Buf y;                   // [NK,H] expert outputs, unweighted
    int32_t *offsets_host;   // [E+1] host copy of expert_offsets (read back once per forward)
} LayerActs;

// Read back once per forward (backend doubles, then one download): per layer the mean
// router probability of each expert and mean lse^2; then the sums of ce and lse^2.
#define STATS_PER_LAYER(E) ((size_t)(E) + 1)

struct ModelActivations {
    int B, T;
    ActKeep keep;            // what each layer keeps for the backward (see ActKeep)
    void *arena;
    size_t arena_bytes;      // capacity: a smaller (B, T) later is carved from the same arena
    LayerActs *layers;       // [L]
    int32_t *offsets_host;   // [L*(E+1)] host, carved into the layers
    int32_t *tokens, *targets;   // [N] backend copies of the batch
    float *x_final;          // [N,H] residual after the last layer
    Buf hf;                  // [N,H] final norm output
    float *rstd_f;           // [N]
    float *rope_cos, *rope_sin;   // [T, hd/2]
    // scratch, shared by all layers
    Buf xe;                  // [NK,H] rows gathered for the experts
    Buf dxe;                 // [NK,H] expert output grads, then expert input grads
    Buf da;                  // [NK,I]
    float *router_logits;    // [N,E] forward logits, then their gradient
    float *dtopk_w;          // [N,k]
    float *dresid;           // [N,H] gradient of the residual stream
    Buf dh;                  // [N,H] gradient of a norm output
    Buf dq, dk, dv;          // [N,qd], [N,kd], [N,kd]
    Buf datt;                // [N,qd]
    Buf qkv;                 // [N,qd+2kd] fused q|k|v projection output, then its gradient
    Buf logits;              // [R,V] one row block of the LM head, rows logit_ld apart
    float *logits_f32;       // [S,V] dense fp32 staging for the host when logits are low precision or padded, else NULL
    float *row_ce, *row_lse; // [N]
    int logit_rows;          // R
    int logit_ld;            // >= V: V rounded up to the backend's logits_align
    int logit_stage_rows;    // S <= R
    size_t logits_bytes;     // the arena bytes of the LM head's buffers (logits, staging, padded head)
    // When logit_ld > V: lm_head [logit_ld, H] with zero rows past V (copied in per pass) and
    // an fp32 dW of that shape, so every dimension of the head's GEMMs is logit_ld, never V.
    Buf lm_head_padded;
    float *d_lm_head_padded;
    double *stats;           // backend [L*(E+1) + 2], see STATS_PER_LAYER
    double *stats_host;      // host copy
    double phase_seconds[MODEL_PHASE_COUNT];   // profile, see model_phase_seconds
};

// Profiling: t = phase_begin(m); ...; phase_end(m, PHASE, t) adds the elapsed time.
double phase_begin(const Model *m);
void phase_end(Model *m, ModelPhase phase, double t0);

// The LM head's logits block (see Backend.logits_align / logits_block_bytes): the row stride
// for vocabulary V, and the rows of a block for N tokens.
int logits_row_stride(int V, int align);
int logits_block_rows(size_t N, int ld, NumType ct, size_t block_bytes);

// Plans activation memory for (B, T) and what layers keep, reusing the current plan when it fits.
int model_acts_plan(Model *m, int B, int T, ActKeep keep);
void model_acts_free(Model *m);
// The bytes model_acts_plan's arena takes for (B, T, keep) on a backend like `traits` (its
// compute type and logits layout: backend_plan_traits, or an open backend), measured with the
// same layout and nothing allocated; 0 when they overflow size_t or the host is out of memory.
// *logits_bytes (when not NULL): the LM head's share (logits block, host staging, padded head).
size_t model_acts_bytes(const ModelConfig *cfg, const Backend *traits, int B, int T, ActKeep keep,
                        size_t *logits_bytes);

// Where attention reads and writes keys and values: NULL in training (this layer's k/v
// activations), a KV cache in incremental decoding.
typedef struct {
    Buf k, v;                // the layer's cache [capacity, kd]
    int past;                // positions already in it
    const float *rope_cos, *rope_sin;   // tables from position 0
} LayerKv;

// Blocks, in forward order. Each backward reads dresid = dL/d(block output) and leaves
// dL/d(block input) in dresid (residual blocks), adding weight gradients into m->grads.
void attention_block_forward(Model *m, int l, const LayerKv *kv);
void attention_block_backward(Model *m, int l);
int moe_block_forward(Model *m, int l);   // SPES_ERR: a backend failure (cuda)
void moe_block_backward(Model *m, int l, const LossWeights *w, float grad_scale);

// The residual after layer l: the next layer's input, or x_final after the last layer.
static inline float *layer_output(Model *m, int l) {
    return l + 1 < m->cfg.n_layers ? m->acts->layers[l + 1].x_in : m->acts->x_final;
}
