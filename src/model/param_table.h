// The parameter table: every tensor of the model, by its Hugging Face name, as a slice of
// one big float buffer. Gradients and AdamW moments exist only for trainable tensors, in
// their own compact buffers indexed by grad_offset.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "model/model_config.h"

typedef enum {
    PARAM_EMBED = 0,        // model.embed_tokens.weight             [V, H]
    PARAM_ATTN_NORM,        // model.layers.l.input_layernorm.weight [H]
    PARAM_Q,                // .self_attn.q_proj.weight              [n_heads*hd, H]
    PARAM_K,                // .self_attn.k_proj.weight              [n_kv*hd, H]
    PARAM_V,                // .self_attn.v_proj.weight              [n_kv*hd, H]
    PARAM_O,                // .self_attn.o_proj.weight              [H, n_heads*hd]
    PARAM_Q_NORM,           // .self_attn.q_norm.weight              [n_heads*hd] (full) or [hd] (head)
    PARAM_K_NORM,           // .self_attn.k_norm.weight              [n_kv*hd] (full) or [hd] (head)
    PARAM_MLP_NORM,         // .post_attention_layernorm.weight      [H]
    PARAM_ROUTER,           // .mlp.gate.weight                      [E, H]
    PARAM_EXPERT_GATE,      // .mlp.experts.e.gate_proj.weight       [I, H]
    PARAM_EXPERT_UP,        // .mlp.experts.e.up_proj.weight         [I, H]
    PARAM_EXPERT_DOWN,      // .mlp.experts.e.down_proj.weight       [H, I]
    PARAM_FINAL_NORM,       // model.norm.weight                     [H]
    PARAM_LM_HEAD,          // lm_head.weight                        [V, H]
    PARAM_KIND_COUNT
} ParamKind;

typedef struct {
    char name[96];
    ParamKind kind;
    int layer;              // -1 for embed / final norm / lm_head
    int expert;             // owner expert index, -1 for shared tensors
    int ndim;               // 1 or 2
    int64_t shape[2];
    size_t numel;
    size_t offset;          // into the parameter buffer (floats)
    bool trainable;
    ssize_t grad_offset;    // into the gradient buffer (floats), -1 when frozen
} ParamInfo;

typedef struct {
    ParamInfo *entries;
    int count;
    size_t total_numel;     // floats in the parameter buffer
    size_t trainable_numel; // floats in the gradient buffer
} ParamTable;

// Builds the table for cfg (all tensors trainable). Order: embed, per layer
// (input_layernorm, q, k, v, o, q_norm, k_norm, post_attention_layernorm, router, experts
// 0..E-1 each gate, up, down), final norm, lm_head.
int param_table_build(const ModelConfig *cfg, ParamTable *table);
void param_table_free(ParamTable *table);
// Index of a tensor by name, -1 if absent.
int param_table_find(const ParamTable *table, const char *name);
// The part of the model a tensor belongs to, the unit the model's hooks report (model.h):
// 0 the embedding, 1 + l layer l, n_layers + 1 the head (final norm, lm_head).
int param_part(const ParamInfo *pi, int n_layers);
// The span of the parameter buffer (floats) that part `part` occupies: its tensors are
// consecutive in table order, so [offset, offset + numel) holds exactly them. 0, 0 when empty.
void param_part_span(const ParamTable *table, int part, int n_layers, size_t *offset, size_t *numel);
// The same for the gradient layout: the part's trainable tensors are consecutive there too.
void param_part_grad_span(const ParamTable *table, int part, int n_layers, size_t *offset, size_t *numel);
// Index of (kind, layer, expert); -1 if absent.
int param_table_index(const ParamTable *table, ParamKind kind, int layer, int expert);
// Marks tensors trainable from a per-entry mask and recomputes grad offsets.
void param_table_set_trainable(ParamTable *table, const bool *mask);
// mask[table->count]: shared tensors (no expert) true, experts true only in [first, last]
// (inclusive): the trainable set of a SPES peer (model_set_trainable_experts, src/train/plan.c).
void param_table_expert_mask(const ParamTable *table, int first, int last, bool *mask);
// True for norm weights (RMSNorm/QK-norm gains): OLMo's "norm and bias" decay group.
bool param_kind_is_norm(ParamKind kind);
