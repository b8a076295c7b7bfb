// The parameter table: names, shapes and buffer offsets of every tensor, in HF order.
#include "model/param_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static void add_entry(ParamTable *t, ParamKind kind, int layer, int expert, const char *name, int64_t rows,
                      int64_t cols) {
    ParamInfo *p = &t->entries[t->count++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->expert = expert;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    p->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    p->offset = t->total_numel;
    p->trainable = true;
    t->total_numel += p->numel;
}

int param_table_build(const ModelConfig *cfg, ParamTable *table) {
    memset(table, 0, sizeof *table);
    const int H = cfg->d_model, hd = cfg->head_dim, E = cfg->num_experts, I = cfg->expert_hidden;
    const int qd = cfg->n_heads * hd, kd = cfg->n_kv_heads * hd, V = cfg->embedding_size;
    const bool qk = cfg->qk_norm != QK_NORM_NONE, per_head = cfg->qk_norm == QK_NORM_HEAD;
    int per_layer = 5 + (qk ? 2 : 0) + 2 + 3 * E;
    int capacity = 3 + cfg->n_layers * per_layer;
    table->entries = spes_calloc((size_t)capacity, sizeof(ParamInfo));
    if (!table->entries) return spes_fail_context("parameter table");

    char name[96];
    add_entry(table, PARAM_EMBED, -1, -1, "model.embed_tokens.weight", V, H);
    for (int l = 0; l < cfg->n_layers; l++) {
#define LAYER_NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), name)
        add_entry(table, PARAM_ATTN_NORM, l, -1, LAYER_NAME("input_layernorm.weight"), H, 0);
        add_entry(table, PARAM_Q, l, -1, LAYER_NAME("self_attn.q_proj.weight"), qd, H);
        add_entry(table, PARAM_K, l, -1, LAYER_NAME("self_attn.k_proj.weight"), kd, H);
        add_entry(table, PARAM_V, l, -1, LAYER_NAME("self_attn.v_proj.weight"), kd, H);
        add_entry(table, PARAM_O, l, -1, LAYER_NAME("self_attn.o_proj.weight"), H, qd);
        if (qk) {
            add_entry(table, PARAM_Q_NORM, l, -1, LAYER_NAME("self_attn.q_norm.weight"), per_head ? hd : qd, 0);
            add_entry(table, PARAM_K_NORM, l, -1, LAYER_NAME("self_attn.k_norm.weight"), per_head ? hd : kd, 0);
        }
        add_entry(table, PARAM_MLP_NORM, l, -1, LAYER_NAME("post_attention_layernorm.weight"), H, 0);
        add_entry(table, PARAM_ROUTER, l, -1, LAYER_NAME("mlp.gate.weight"), E, H);
#undef LAYER_NAME
        for (int e = 0; e < E; e++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            add_entry(table, PARAM_EXPERT_GATE, l, e, name, I, H);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            add_entry(table, PARAM_EXPERT_UP, l, e, name, I, H);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            add_entry(table, PARAM_EXPERT_DOWN, l, e, name, H, I);
        }
    }
    add_entry(table, PARAM_FINAL_NORM, -1, -1, "model.norm.weight", H, 0);
    add_entry(table, PARAM_LM_HEAD, -1, -1, "lm_head.weight", V, H);
    param_table_set_trainable(table, NULL);
    return SPES_OK;
}

void param_table_free(ParamTable *table) {
    free(table->entries);
    memset(table, 0, sizeof *table);
}

int param_table_find(const ParamTable *table, const char *name) {
    for (int i = 0; i < table->count; i++)
        if (!strcmp(table->entries[i].name, name)) return i;
    return -1;
}

int param_part(const ParamInfo *pi, int n_layers) {
    if (pi->layer >= 0) return 1 + pi->layer;
    return pi->kind == PARAM_EMBED ? 0 : n_layers + 1;
}

// [lo, hi) over the part's tensors: parameter offsets, or gradient offsets of the trainable ones.
static void part_span(const ParamTable *table, int part, int n_layers, bool gradients, size_t *offset, size_t *numel) {
    size_t lo = 0, hi = 0;
    bool seen = false;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        if (param_part(pi, n_layers) != part || (gradients && !pi->trainable)) continue;
        size_t a = gradients ? (size_t)pi->grad_offset : pi->offset, b = a + pi->numel;
        if (!seen || a < lo) lo = a;
        if (!seen || b > hi) hi = b;
        seen = true;
    }
    *offset = lo;
    *numel = hi - lo;
}

void param_part_span(const ParamTable *table, int part, int n_layers, size_t *offset, size_t *numel) {
    part_span(table, part, n_layers, false, offset, numel);
}

void param_part_grad_span(const ParamTable *table, int part, int n_layers, size_t *offset, size_t *numel) {
    part_span(table, part, n_layers, true, offset, numel);
}

// Where param_table_build puts (kind, layer, expert): embed, then per layer the attention
// entries (q/k norms when present), the MLP norm, the router and 3 per expert, then the final
// norm and lm_head. -1 when the table does not have that shape.
static int64_t layout_index(const ParamTable *t, ParamKind kind, int layer, int expert) {
    if (layer < 0) return kind == PARAM_EMBED ? 0 : kind == PARAM_FINAL_NORM ? t->count - 2 : t->count - 1;
    if (t->count < 4 || t->entries[t->count - 3].layer < 0) return -1;
    int64_t per_layer = (t->count - 3) / (t->entries[t->count - 3].layer + 1), first = 1 + (int64_t)layer * per_layer;
    if (first + 5 >= t->count) return -1;
    int64_t router = first + (t->entries[first + 5].kind == PARAM_Q_NORM ? 8 : 6);
    switch (kind) {
    case PARAM_Q_NORM: return first + 5;
    case PARAM_K_NORM: return first + 6;
    case PARAM_MLP_NORM: return router - 1;
    case PARAM_ROUTER: return router;
    case PARAM_EXPERT_GATE:
    case PARAM_EXPERT_UP:
    case PARAM_EXPERT_DOWN: return router + 1 + 3 * (int64_t)expert + (kind - PARAM_EXPERT_GATE);
    default: return first + (kind - PARAM_ATTN_NORM);
    }
}

// The layout's index when it holds the entry (always, for a built table), else a scan: model
// binding looks up every expert, and a scan each made 65536 experts a quadratic hang.
int param_table_index(const ParamTable *table, ParamKind kind, int layer, int expert) {
    int64_t guess = layout_index(table, kind, layer, expert);
    if (guess >= 0 && guess < table->count) {
        const ParamInfo *p = &table->entries[guess];
        if (p->kind == kind && p->layer == layer && p->expert == expert) return (int)guess;
    }
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *p = &table->entries[i];
        if (p->kind == kind && p->layer == layer && p->expert == expert) return i;
    }
    return -1;
}

void param_table_set_trainable(ParamTable *table, const bool *mask) {
    size_t offset = 0;
    for (int i = 0; i < table->count; i++) {
        ParamInfo *p = &table->entries[i];
        p->trainable = mask ? mask[i] : true;
        p->grad_offset = p->trainable ? (ssize_t)offset : -1;
        if (p->trainable) offset += p->numel;
    }
    table->trainable_numel = offset;
}

void param_table_expert_mask(const ParamTable *table, int first, int last, bool *mask) {
    for (int i = 0; i < table->count; i++) {
        int e = table->entries[i].expert;
        mask[i] = e < 0 || (e >= first && e <= last);
    }
}

bool param_kind_is_norm(ParamKind kind) {
    return kind == PARAM_ATTN_NORM || kind == PARAM_Q_NORM || kind == PARAM_K_NORM || kind == PARAM_MLP_NORM ||
           kind == PARAM_FINAL_NORM;
}
