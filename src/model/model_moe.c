// MoE block: x_out = x_mid + sum_j w_j * expert_j(h2), h2 = post_attention_layernorm(x_mid).
// Dropless: the N*k (token, slot) pairs are permuted into per-expert contiguous blocks and
// each expert runs as GEMMs on its block (the backend's experts_forward/backward). The
// per-expert row counts are read back to the host once per forward and reused by the
// backward; the router's statistics for the auxiliary losses stay on the backend until the
// end of the step (model_step.c).
#include "model/model_internal.h"

#include "base/error.h"

static ExpertsArgs experts_args(Model *m, int l) {
    const ModelConfig *c = &m->cfg;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const LayerParams *p = &m->bind->layers[l];
    return (ExpertsArgs){.E = c->num_experts,
                         .H = c->d_model,
                         .hidden = c->expert_hidden,
                         .offsets = la->offsets_host,
                         .gate_up = p->gate_up,
                         .down = p->down,
                         .xe = a->xe,
                         .gu = la->gu,
                         .act = la->a,
                         .y = la->y,
                         .dy = a->dxe,
                         .da = a->da,
                         .dgate_up = p->d_gate_up,
                         .dgate = p->d_gate,
                         .dup = p->d_up,
                         .ddown = p->d_down};
}

int moe_block_forward(Model *m, int l) {
    const ModelConfig *c = &m->cfg;
    Backend *be = m->be;
    const BackendOps *op = be->ops;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const LayerParams *p = &m->bind->layers[l];
    const int N = a->B * a->T, H = c->d_model, E = c->num_experts, k = c->top_k;
    float *x_out = layer_output(m, l);

    double t = phase_begin(m);
    op->rmsnorm_forward(be, la->h2, la->rstd2, buf_f32(la->x_mid), p->mlp_norm, N, H, c->norm_eps);
    phase_end(m, MODEL_PHASE_NORMS, t);
    t = phase_begin(m);
    linear_forward(be, buf_f32(a->router_logits), la->h2, p->router, N, H, E, false);
    op->router_forward(be, la->probs, la->router_lse, la->topk_idx, la->topk_w, a->router_logits, N, E, k,
                       c->normalize_expert_weights);
    op->moe_plan(be, la->expert_offsets, la->row_token, la->row_of_slot, la->topk_idx, N, E, k);
    // The one read-back of this layer: the experts' row counts (the GEMM shapes). On cuda it
    // also reports any failure of the ops queued before it: the layer stops there.
    SPES_TRY(be->ops->download(be, la->offsets_host, la->expert_offsets, (size_t)(E + 1) * sizeof(int32_t)));
    if (la->offsets_host[0] != 0 || la->offsets_host[E] != N * k)
        return spes_fail("layer %d: the router's plan covers rows %d..%d of %d (an expert id outside 0..%d)", l,
                         la->offsets_host[0], la->offsets_host[E], N * k, E - 1);
    for (int e = 0; e < E; e++)
        m->expert_counts[(size_t)l * E + e] = la->offsets_host[e + 1] - la->offsets_host[e];
    // Auxiliary-loss statistics, read back with the step's losses.
    double *stats = a->stats + (size_t)l * STATS_PER_LAYER(E);
    op->column_means(be, stats, la->probs, N, E);
    op->sum(be, stats + E, la->router_lse, (size_t)N, true);
    phase_end(m, MODEL_PHASE_ROUTER, t);

    t = phase_begin(m);
    op->gather_rows(be, a->xe, la->h2, la->row_token, N * k, H);
    phase_end(m, MODEL_PHASE_MOE_DISPATCH, t);
    t = phase_begin(m);
    ExpertsArgs ea = experts_args(m, l);
    op->experts_forward(be, &ea);
    phase_end(m, MODEL_PHASE_EXPERTS_FWD, t);
    t = phase_begin(m);
    op->moe_combine(be, buf_f32(x_out), buf_f32(la->x_mid), la->y, la->topk_w, la->row_of_slot, N, k, H);
    phase_end(m, MODEL_PHASE_MOE_DISPATCH, t);
    return SPES_OK;
}

void moe_block_backward(Model *m, int l, const LossWeights *w, float grad_scale) {
    const ModelConfig *c = &m->cfg;
    Backend *be = m->be;
    const BackendOps *op = be->ops;
    ModelActivations *a = m->acts;
    LayerActs *la = &a->layers[l];
    const LayerParams *p = &m->bind->layers[l];
    const int N = a->B * a->T, H = c->d_model, E = c->num_experts, k = c->top_k;
    const Buf dresid = buf_f32(a->dresid);

    ExpertsArgs ea = experts_args(m, l);
    double t = phase_begin(m);
    // fine_grained checkpointing: the experts' intermediates are shared between layers;
    // recompute this layer's (same ops, same bits) from h2.
    const bool recompute = a->keep == ACT_KEEP_NO_EXPERTS && l < c->n_layers - 1;
    if (recompute) op->gather_rows(be, a->xe, la->h2, la->row_token, N * k, H);
    phase_end(m, MODEL_PHASE_MOE_DISPATCH, t);
    t = phase_begin(m);
    if (recompute) op->experts_forward(be, &ea);
    phase_end(m, MODEL_PHASE_EXPERTS_FWD, t);
    // combine: dresid is dL/dx_out; dy (in dxe) = w * dout, dtopk_w = dout . y
    t = phase_begin(m);
    op->moe_combine_backward(be, a->dxe, a->dtopk_w, dresid, la->y, la->topk_w, la->row_of_slot, N, k, H);
    phase_end(m, MODEL_PHASE_MOE_DISPATCH, t);
    t = phase_begin(m);

    // router: load balancing adds the same dL/dprob[e] to every token; z-loss through lse.
    float dprob[E];
    const double lb_scale = (double)grad_scale * (w ? w->lb_weight : 0.0f) * E / ((double)c->n_layers * N * k);
    for (int e = 0; e < E; e++) {
        double factor = w && w->lb_count_factor ? w->lb_count_factor[(size_t)l * E + e] : 1.0;
        dprob[e] = (float)(lb_scale * factor * (double)(la->offsets_host[e + 1] - la->offsets_host[e]) / N);
    }
    float z_coef = grad_scale * (w ? w->router_z_weight : 0.0f) / (float)N;
    op->router_backward(be, a->router_logits, a->dtopk_w, la->probs, la->router_lse, la->topk_idx, la->topk_w, dprob,
                        z_coef, N, E, k, c->normalize_expert_weights);
    if (p->d_router) linear_backward_weight(be, p->d_router, buf_f32(a->router_logits), E, la->h2, N, H, E);
    linear_backward_input(be, a->dh, buf_f32(a->router_logits), p->router, N, H, E, false);
    phase_end(m, MODEL_PHASE_ROUTER, t);
    t = phase_begin(m);

    if (!recompute) op->gather_rows(be, a->xe, la->h2, la->row_token, N * k, H);
    phase_end(m, MODEL_PHASE_MOE_DISPATCH, t);
    t = phase_begin(m);
    // experts, one block each; frozen experts still pass dX back, but skip their dW.
    op->experts_backward(be, &ea);
    phase_end(m, MODEL_PHASE_EXPERTS_BWD, t);
    t = phase_begin(m);
    op->moe_uncombine_add(be, a->dh, a->dxe, la->row_of_slot, N, k, H);
    phase_end(m, MODEL_PHASE_MOE_DISPATCH, t);
    t = phase_begin(m);
    // post_attention_layernorm + residual: dresid becomes dL/dx_mid
    op->rmsnorm_backward(be, dresid, p->d_mlp_norm, a->dh, buf_f32(la->x_mid), p->mlp_norm, la->rstd2, N, H, true);
    phase_end(m, MODEL_PHASE_NORMS, t);
}
