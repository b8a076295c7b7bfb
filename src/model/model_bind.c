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

// Where one part's parameters are read from: its span of the parameter buffer (offset) laid
// out at `master` (fp32) and `compute` (the compute copy) - the model's own buffers, or a
// working buffer that holds only this part (model_bind_part); and where its gradients go: the
// gradient layout from value grad_lo on, laid out at `grads` (NULL: no gradients).
typedef struct {
    const float *master;
    Buf compute;
    size_t offset;   // the part's first float in the parameter buffer
    float *grads;
    size_t grad_lo;
} PartBase;

static PartBase own_base(const Model *m, int part) {
    size_t offset, numel;
    param_part_span(&m->table, part, m->cfg.n_layers, &offset, &numel);
    return (PartBase){m->dparams + offset, buf_at(compute_params(m), offset), offset, m->grads, 0};
}

static int entry(const Model *m, ParamKind kind, int layer, int expert) {
    return param_table_index(&m->table, kind, layer, expert);
}

static const float *master(const Model *m, const PartBase *pb, int i) {
    return i < 0 ? NULL : pb->master + (m->table.entries[i].offset - pb->offset);
}
static Buf compute(const Model *m, const PartBase *pb, int i) {
    return i < 0 ? (Buf){NULL, m->be->compute} : buf_at(pb->compute, m->table.entries[i].offset - pb->offset);
}
// NULL for a frozen tensor (the backward skips its weight gradient) and when the gradients are
// released (model_release_grads: no pass trains without a gradient binding from the hooks).
static float *grad(const Model *m, const PartBase *pb, int i) {
    if (i < 0 || !m->table.entries[i].trainable || !pb->grads) return NULL;
    return pb->grads + ((size_t)m->table.entries[i].grad_offset - pb->grad_lo);
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

// Per-expert arrays of one layer in one block (allocated on the first bind, reused by every
// rebind): gate_up, down (Buf), then d_gate_up, d_gate, d_up, d_down (float *).
static int bind_experts(Model *m, const PartBase *pb, int l, LayerParams *lp) {
    const int E = m->cfg.num_experts;
    if (!lp->gate_up) {
        size_t bytes = (size_t)E * (2 * sizeof(Buf) + 4 * sizeof(float *));
        char *block = spes_calloc(1, bytes);
        if (!block) return SPES_ERR;
        lp->gate_up = (Buf *)block;
    }
    lp->down = lp->gate_up + E;
    float **ptrs = (float **)(lp->down + E);
    lp->d_gate_up = ptrs;
    lp->d_gate = ptrs + E;
    lp->d_up = ptrs + 2 * E;
    lp->d_down = ptrs + 3 * E;
    const size_t I = (size_t)m->cfg.expert_hidden, H = (size_t)m->cfg.d_model;
    for (int e = 0; e < E; e++) {
        int gi = entry(m, PARAM_EXPERT_GATE, l, e);   // gate, up, down at consecutive indices
        lp->gate_up[e] = compute(m, pb, gi);
        lp->down[e] = compute(m, pb, gi + 2);
        lp->d_gate[e] = grad(m, pb, gi);
        lp->d_up[e] = grad(m, pb, gi + 1);
        lp->d_down[e] = grad(m, pb, gi + 2);
        // One [2I, H] gradient GEMM when both halves train and sit next to each other.
        bool adjacent = lp->d_gate[e] && lp->d_up[e] && lp->d_up[e] == lp->d_gate[e] + I * H;
        lp->d_gate_up[e] = adjacent ? lp->d_gate[e] : NULL;
    }
    return SPES_OK;
}

static void bind_embed(Model *m, const PartBase *pb) {
    ModelBinding *b = m->bind;
    int embed = entry(m, PARAM_EMBED, -1, -1);
    b->embed = master(m, pb, embed);
    b->d_embed = grad(m, pb, embed);
}

static void bind_head(Model *m, const PartBase *pb) {
    ModelBinding *b = m->bind;
    int fnorm = entry(m, PARAM_FINAL_NORM, -1, -1), head = entry(m, PARAM_LM_HEAD, -1, -1);
    b->final_norm = master(m, pb, fnorm);
    b->lm_head = compute(m, pb, head);
    b->d_final_norm = grad(m, pb, fnorm);
    b->d_lm_head = grad(m, pb, head);
}

static int bind_layer(Model *m, const PartBase *pb, int l) {
    LayerParams *lp = &m->bind->layers[l];
    int an = entry(m, PARAM_ATTN_NORM, l, -1), qn = entry(m, PARAM_Q_NORM, l, -1);
    int kn = entry(m, PARAM_K_NORM, l, -1), mn = entry(m, PARAM_MLP_NORM, l, -1);
    int q = entry(m, PARAM_Q, l, -1), k = entry(m, PARAM_K, l, -1), v = entry(m, PARAM_V, l, -1);
    int o = entry(m, PARAM_O, l, -1), r = entry(m, PARAM_ROUTER, l, -1);
    lp->attn_norm = master(m, pb, an);
    lp->q_norm = master(m, pb, qn);
    lp->k_norm = master(m, pb, kn);
    lp->mlp_norm = master(m, pb, mn);
    lp->qkv = compute(m, pb, q);   // q_proj, k_proj, v_proj are adjacent in the parameter buffer
    lp->o = compute(m, pb, o);
    lp->router = compute(m, pb, r);
    lp->d_attn_norm = grad(m, pb, an);
    lp->d_q_norm = grad(m, pb, qn);
    lp->d_k_norm = grad(m, pb, kn);
    lp->d_mlp_norm = grad(m, pb, mn);
    lp->d_q = grad(m, pb, q);
    lp->d_k = grad(m, pb, k);
    lp->d_v = grad(m, pb, v);
    lp->d_o = grad(m, pb, o);
    lp->d_router = grad(m, pb, r);
    return bind_experts(m, pb, l, lp);
}

// Binds one part (hooks' numbering) from base pb.
static int bind_part(Model *m, const PartBase *pb, int part) {
    const int L = m->cfg.n_layers;
    if (part == 0) bind_embed(m, pb);
    else if (part == L + 1) bind_head(m, pb);
    else return bind_layer(m, pb, part - 1);
    return SPES_OK;
}

int model_bind(Model *m) {
    model_unbind(m);
    const int L = m->cfg.n_layers;
    ModelBinding *b = spes_calloc(1, sizeof *b);
    if (!b) return SPES_ERR;
    m->bind = b;
    if (!(b->layers = spes_calloc((size_t)L, sizeof *b->layers))) return SPES_ERR;
    for (int part = 0; part <= L + 1; part++) {
        PartBase pb = own_base(m, part);
        SPES_TRY(bind_part(m, &pb, part));
    }
    return SPES_OK;
}

int model_bind_part(Model *m, int part, const float *master_base, void *compute_base, float *grad_base) {
    const int L = m->cfg.n_layers;
    if (!m->bind) return spes_fail("model_bind_part: the model has no binding");
    if (part < 0 || part > L + 1) return spes_fail("model_bind_part: part %d out of range [0, %d]", part, L + 1);
    PartBase pb;
    if (!master_base) {
        if (!m->dparams) return spes_fail("model_bind_part: part %d: the model's parameters are released", part);
        pb = own_base(m, part);
    } else {
        // A compute copy exists exactly when compute is not fp32 (model_create_on); released
        // parameters leave cparams NULL, so ask the backend.
        bool low_precision = m->be->compute != NUM_F32;
        if (low_precision && !compute_base)
            return spes_fail("model_bind_part: part %d needs a compute copy (compute is not fp32)", part);
        size_t offset, numel;
        param_part_span(&m->table, part, L, &offset, &numel);
        // fp32 compute reads the GEMM weights from the master itself, as model_bind does.
        pb = (PartBase){master_base,
                        low_precision ? buf_of(compute_base, m->be->compute) : buf_f32((float *)master_base), offset,
                        m->grads, 0};
    }
    if (grad_base) {
        size_t numel;
        param_part_grad_span(&m->table, part, L, &pb.grad_lo, &numel);
        pb.grads = grad_base;
    }
    return bind_part(m, &pb, part);
}
