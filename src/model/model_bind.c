// Parameter and gradient views per layer, resolved from the table once per model (and again
// when the trainable set changes), so the forward and backward never look tensors up by name.
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "model/model_internal.h"

// The compute copy of every parameter: the fp32 master itself when compute is fp32.
static Buf compute_params(const Model *m) {
    return m->cparams ? buf_of(m->cparams, m->be->compute) : buf_f32(m->dparams);
}

static int entry(const Model *m, ParamKind kind, int layer, int expert) {
    return param_table_index(&m->table, kind, layer, expert);
}

static const float *master(const Model *m, int i) { return i < 0 ? NULL : m->dparams + m->table.entries[i].offset; }
static Buf compute(const Model *m, int i) {
    return i < 0 ? (Buf){NULL, m->be->compute} : buf_at(compute_params(m), m->table.entries[i].offset);
}
static float *grad(const Model *m, int i) {
    if (i < 0 || !m->table.entries[i].trainable) return NULL;
    return m->grads + m->table.entries[i].grad_offset;
}

void model_unbind(Model *m) {
    ModelBinding *b = m->bind;
    if (!b) return;
    if (b->layers) {
        // Each layer's per-expert arrays are one allocation, starting at gate_up.
        for (int l = 0; l < m->cfg.n_layers; l++) free(b->layers[l].gate_up);
        free(b->layers);
    }
    free(b);
    m->bind = NULL;
}

// Per-expert arrays of one layer in one block: gate_up, down (Buf), then d_gate_up, d_gate,
// d_up, d_down (float *).
static int bind_experts(Model *m, int l, LayerParams *lp) {
    const int E = m->cfg.num_experts;
    size_t bytes = (size_t)E * (2 * sizeof(Buf) + 4 * sizeof(float *));
    char *block = spes_calloc(1, bytes);
    if (!block) return SPES_ERR;
    lp->gate_up = (Buf *)block;
    lp->down = lp->gate_up + E;
    float **ptrs = (float **)(lp->down + E);
    lp->d_gate_up = ptrs;
    lp->d_gate = ptrs + E;
    lp->d_up = ptrs + 2 * E;
    lp->d_down = ptrs + 3 * E;
    const size_t I = (size_t)m->cfg.expert_hidden, H = (size_t)m->cfg.d_model;
    for (int e = 0; e < E; e++) {
        int gi = entry(m, PARAM_EXPERT_GATE, l, e);   // gate, up, down at consecutive indices
        lp->gate_up[e] = compute(m, gi);
        lp->down[e] = compute(m, gi + 2);
        lp->d_gate[e] = grad(m, gi);
        lp->d_up[e] = grad(m, gi + 1);
        lp->d_down[e] = grad(m, gi + 2);
        // One [2I, H] gradient GEMM when both halves train and sit next to each other.
        bool adjacent = lp->d_gate[e] && lp->d_up[e] && lp->d_up[e] == lp->d_gate[e] + I * H;
        lp->d_gate_up[e] = adjacent ? lp->d_gate[e] : NULL;
    }
    return SPES_OK;
}

int model_bind(Model *m) {
    model_unbind(m);
    const int L = m->cfg.n_layers;
    ModelBinding *b = spes_calloc(1, sizeof *b);
    if (!b) return SPES_ERR;
    m->bind = b;
    if (!(b->layers = spes_calloc((size_t)L, sizeof *b->layers))) return SPES_ERR;
    int embed = entry(m, PARAM_EMBED, -1, -1), fnorm = entry(m, PARAM_FINAL_NORM, -1, -1);
    int head = entry(m, PARAM_LM_HEAD, -1, -1);
    b->embed = master(m, embed);
    b->final_norm = master(m, fnorm);
    b->lm_head = compute(m, head);
    b->d_embed = grad(m, embed);
    b->d_final_norm = grad(m, fnorm);
    b->d_lm_head = grad(m, head);
    for (int l = 0; l < L; l++) {
        LayerParams *lp = &b->layers[l];
        int an = entry(m, PARAM_ATTN_NORM, l, -1), qn = entry(m, PARAM_Q_NORM, l, -1);
        int kn = entry(m, PARAM_K_NORM, l, -1), mn = entry(m, PARAM_MLP_NORM, l, -1);
        int q = entry(m, PARAM_Q, l, -1), k = entry(m, PARAM_K, l, -1), v = entry(m, PARAM_V, l, -1);
        int o = entry(m, PARAM_O, l, -1), r = entry(m, PARAM_ROUTER, l, -1);
        lp->attn_norm = master(m, an);
        lp->q_norm = master(m, qn);
        lp->k_norm = master(m, kn);
        lp->mlp_norm = master(m, mn);
        lp->qkv = compute(m, q);   // q_proj, k_proj, v_proj are adjacent in the parameter buffer
        lp->o = compute(m, o);
        lp->router = compute(m, r);
        lp->d_attn_norm = grad(m, an);
        lp->d_q_norm = grad(m, qn);
        lp->d_k_norm = grad(m, kn);
        lp->d_mlp_norm = grad(m, mn);
        lp->d_q = grad(m, q);
        lp->d_k = grad(m, k);
        lp->d_v = grad(m, v);
        lp->d_o = grad(m, o);
        lp->d_router = grad(m, r);
        SPES_TRY(bind_experts(m, l, lp));
    }
    return SPES_OK;
}
