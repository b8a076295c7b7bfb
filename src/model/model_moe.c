// MoE block: x_out = x_mid + sum_j w_j * expert_j(h2), h2 = post_attention_layernorm(x_mid).
// Dropless: the N*k (token, slot) pairs are permuted into per-expert contiguous blocks and
// each expert runs as GEMMs on its block. gate_proj and up_proj of an expert are adjacent in
// the parameter buffer ([gate; up] = [2I, H]), so both run as one GEMM.
//
// Experts are independent (own rows, own weights, own gradients), so with enough of them
// (E >= 2 x threads) threads take whole experts, largest first, each running its GEMMs
// single-threaded: one fork/join per layer and direction instead of several per expert,
// and bits that do not depend on which thread ran what. With few experts the GEMMs run
// one after another, each multi-threaded inside OpenBLAS.
#include <omp.h>
#include <string.h>

#include "model/model_internal.h"
#include "ops/cpu/cpu_ops.h"

// Table entries of expert e in layer l: gate, up, down at consecutive indices.
static int expert_entry(Model *m, int l, int e) { return param_table_index(&m->table, PARAM_EXPERT_GATE, l, e); }

// order[E]: experts by descending row count (ties: lower index first), for dynamic
// scheduling that starts the long jobs first. Insertion sort: E is small.
static void experts_largest_first(const int32_t *offsets, int E, int *order) {
    for (int i = 0; i < E; i++) {
        int e = i, j = i;
        int32_t count = offsets[e + 1] - offsets[e];
        while (j > 0 && offsets[order[j - 1] + 1] - offsets[order[j - 1]] < count) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = e;
    }
}

static bool parallel_over_experts(int E) { return E >= 2 * omp_get_max_threads(); }

void moe_block_forward(Model *m, int l, const LossWeights *w) {
    const ModelConfig *c = &m->cfg;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const int N = a->B * a->T, H = c->d_model, E = c->num_experts, k = c->top_k, I = c->expert_hidden;
    float *x_out = layer_output(m, l);

    double t = phase_begin();
    op_rmsnorm_forward(la->h2, la->rstd2, la->x_mid, model_param_of(m, PARAM_MLP_NORM, l, -1), N, H, c->norm_eps);
    phase_end(m, MODEL_PHASE_NORMS, t);
    t = phase_begin();
    op_linear_forward(a->router_logits, la->h2, model_param_of(m, PARAM_ROUTER, l, -1), N, H, E, false);
    op_router_forward(la->probs, la->router_lse, la->topk_idx, la->topk_w, a->router_logits, N, E, k,
                      c->normalize_expert_weights);
    op_moe_plan(la->expert_offsets, la->row_token, la->row_of_slot, la->topk_idx, N, E, k);

    // Auxiliary-loss statistics of this layer (serial, double: fixed order).
    la->lb_sum = 0.0;
    for (int e = 0; e < E; e++) {
        int64_t count = la->expert_offsets[e + 1] - la->expert_offsets[e];
        m->expert_counts[(size_t)l * E + e] = count;
        double meanprob = 0.0;
        for (int n = 0; n < N; n++) meanprob += la->probs[(size_t)n * E + e];
        meanprob /= N;
        double factor = w && w->lb_count_factor ? w->lb_count_factor[(size_t)l * E + e] : 1.0;
        la->lb_sum += factor * (double)count * meanprob;
    }
    double z = 0.0;
    for (int n = 0; n < N; n++) z += (double)la->router_lse[n] * la->router_lse[n];
    la->router_z = z / N;
    phase_end(m, MODEL_PHASE_ROUTER, t);

    t = phase_begin();
    op_gather_rows(a->xe, la->h2, la->row_token, N * k, H);
    int order[E];
    experts_largest_first(la->expert_offsets, E, order);
#pragma omp parallel for schedule(dynamic, 1) if (parallel_over_experts(E))
    for (int i = 0; i < E; i++) {
        int e = order[i], r0 = la->expert_offsets[e], cnt = la->expert_offsets[e + 1] - r0;
        if (cnt == 0) continue;
        int gi = expert_entry(m, l, e);
        float *gu = la->gu + (size_t)r0 * 2 * I, *act = la->a + (size_t)r0 * I;
        op_linear_forward(gu, a->xe + (size_t)r0 * H, model_param(m, gi), cnt, H, 2 * I, false);
        op_swiglu_forward(act, gu, cnt, I);
        op_linear_forward(la->y + (size_t)r0 * H, act, model_param(m, gi + 2), cnt, I, H, false);
    }
    memcpy(x_out, la->x_mid, (size_t)N * H * sizeof(float));
    op_moe_combine(x_out, la->y, la->topk_w, la->row_of_slot, N, k, H);
    phase_end(m, MODEL_PHASE_EXPERTS_FWD, t);
}

// dW[gate; up] += dgu^T xe for whichever of the two is trainable (one GEMM when both are
// and their gradients are adjacent, as they are whenever both are trainable).
static void expert_gate_up_grad(Model *m, int gi, const float *dgu, const float *xe, int cnt, int H, int I) {
    float *dg = model_grad(m, gi), *du = model_grad(m, gi + 1);
    if (dg && du && du == dg + (size_t)I * H) {
        op_linear_backward_weight(dg, dgu, xe, cnt, H, 2 * I);
        return;
    }
    if (dg) op_gemm(true, false, I, H, cnt, 1.0f, dgu, 2 * I, xe, H, 1.0f, dg, H);
    if (du) op_gemm(true, false, I, H, cnt, 1.0f, dgu + I, 2 * I, xe, H, 1.0f, du, H);
}

void moe_block_backward(Model *m, int l, const LossWeights *w, float grad_scale) {
    const ModelConfig *c = &m->cfg;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const int N = a->B * a->T, H = c->d_model, E = c->num_experts, k = c->top_k, I = c->expert_hidden;

    // combine: dresid is dL/dx_out; dy (in dxe) = w * dout, dtopk_w = dout . y
    double t = phase_begin();
    op_moe_combine_backward(a->dxe, a->dtopk_w, a->dresid, la->y, la->topk_w, la->row_of_slot, N, k, H);
    phase_end(m, MODEL_PHASE_EXPERTS_BWD, t);
    t = phase_begin();

    // router: load balancing adds the same dL/dprob[e] to every token; z-loss through lse.
    float dprob[E];
    const double lb_scale = (double)grad_scale * (w ? w->lb_weight : 0.0f) * E / ((double)c->n_layers * N * k);
    for (int e = 0; e < E; e++) {
        double factor = w && w->lb_count_factor ? w->lb_count_factor[(size_t)l * E + e] : 1.0;
        dprob[e] = (float)(lb_scale * factor * (double)(la->expert_offsets[e + 1] - la->expert_offsets[e]) / N);
    }
    float z_coef = grad_scale * (w ? w->router_z_weight : 0.0f) / (float)N;
    op_router_backward(a->router_logits, a->dtopk_w, la->probs, la->router_lse, la->topk_idx, la->topk_w, dprob,
                       z_coef, N, E, k, c->normalize_expert_weights);
    float *drouter = model_grad_of(m, PARAM_ROUTER, l, -1);
    if (drouter) op_linear_backward_weight(drouter, a->router_logits, la->h2, N, H, E);
    op_linear_backward_input(a->dh, a->router_logits, model_param_of(m, PARAM_ROUTER, l, -1), N, H, E, false);
    phase_end(m, MODEL_PHASE_ROUTER, t);
    t = phase_begin();

    // experts, one block each; frozen experts still pass dX back, but skip their dW.
    op_gather_rows(a->xe, la->h2, la->row_token, N * k, H);
    int order[E];
    experts_largest_first(la->expert_offsets, E, order);
#pragma omp parallel for schedule(dynamic, 1) if (parallel_over_experts(E))
    for (int i = 0; i < E; i++) {
        int e = order[i], r0 = la->expert_offsets[e], cnt = la->expert_offsets[e + 1] - r0;
        if (cnt == 0) continue;
        int gi = expert_entry(m, l, e);
        float *dy = a->dxe + (size_t)r0 * H, *da = a->da + (size_t)r0 * I, *gu = la->gu + (size_t)r0 * 2 * I;
        const float *xe = a->xe + (size_t)r0 * H;
        op_linear_backward_input(da, dy, model_param(m, gi + 2), cnt, I, H, false);
        float *ddown = model_grad(m, gi + 2);
        if (ddown) op_linear_backward_weight(ddown, dy, la->a + (size_t)r0 * I, cnt, I, H);
        op_swiglu_backward(gu, da, gu, cnt, I);   // gu now holds dL/d(gate|up)
        expert_gate_up_grad(m, gi, gu, xe, cnt, H, I);
        op_linear_backward_input(dy, gu, model_param(m, gi), cnt, H, 2 * I, false);   // dy now holds dxe
    }
    op_moe_uncombine_add(a->dh, a->dxe, la->row_of_slot, N, k, H);
    phase_end(m, MODEL_PHASE_EXPERTS_BWD, t);
    t = phase_begin();
    // post_attention_layernorm + residual: dresid becomes dL/dx_mid
    op_rmsnorm_backward(a->dresid, model_grad_of(m, PARAM_MLP_NORM, l, -1), a->dh, la->x_mid,
                        model_param_of(m, PARAM_MLP_NORM, l, -1), la->rstd2, N, H, true);
    phase_end(m, MODEL_PHASE_NORMS, t);
}
