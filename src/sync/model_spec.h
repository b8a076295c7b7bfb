// The model as the parameter server sees it: an ordered list of named tensors (HF names,
// shapes, dtypes), which of them are experts (parsed from the name
// `model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight`), who owns each expert, and a
// fingerprint so a peer training a different model is refused at the handshake; and the run
// settings both sides state at the handshake (sync mode, download views, outer optimizer).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

// The largest weight magnitude a sync payload may carry (uploads, aggregates, deltas decoded):
// fp16's largest finite value. A model must still run with fp16 compute copies (device: cuda,
// fp16 with loss scaling) and healthy training stays orders of magnitude below it, so a value
// beyond it comes from a damaged or hostile peer; taking it would poison every peer's weights.
#define SYNC_MAX_WEIGHT 65504.0f

typedef enum { SYNC_MODE_SPES = 0, SYNC_MODE_FEDAVG } SyncMode;
const char *sync_mode_name(SyncMode mode);            // "spes" | "fedavg"
int sync_mode_parse(const char *name, SyncMode *out);

// The download views besides the whole aggregate: a peer lists those it reads in its Hello
// (proto HelloRequest.encodings), the server those it serves, and a view served is named so in
// its __metadata__ "spes_view" (server/rounds.h: rounds_view). A peer's own experts left out
// where the round took them unchanged, and the int8 / int4 deltas (DeltaCodec.encoding).
#define SYNC_VIEW_OMIT_OWN "omit-own-experts"
#define SYNC_VIEW_INT8 "int8-delta"
#define SYNC_VIEW_INT4 "int4-delta"

// The server's outer optimizer (server/outer_optimizer.h), which a peer states as it expects it in
// its Hello (proto HelloRequest.outer_lr / outer_momentum) and the server checks.
typedef struct {
    float lr;         // outer_lr, > 0 (DiLoCo: 0.7); 1 with momentum 0 is the plain mean
    float momentum;   // outer_momentum mu in [0, 1) (DiLoCo: 0.9)
} OuterOptConfig;

// The reference behaviour: lr 1, momentum 0.
#define OUTER_OPT_OFF ((OuterOptConfig){.lr = 1.0f, .momentum = 0.0f})
// lr == 1 and momentum == 0: the step returns the mean, so a caller may skip it altogether.
bool outer_opt_is_off(const OuterOptConfig *cfg);

typedef enum { EXPERT_PROJ_GATE = 0, EXPERT_PROJ_UP, EXPERT_PROJ_DOWN, EXPERT_PROJ_COUNT } ExpertProj;

typedef struct {
    char *name;
    DType dtype;                    // the model's dtype of this tensor (F32 or BF16)
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    int layer;                      // expert tensors: layer number; -1 for shared tensors
    int expert;                     // expert index e, -1 for shared tensors
    int proj;                       // ExpertProj for expert tensors, -1 otherwise
} SpecTensor;

typedef struct {
    SpecTensor *tensors;            // in the order peers declared them (parameter-table order)
    int count;
    int capacity;
    int num_experts;                // E, 0 for a model without experts
    int num_moe_layers;             // layers that have experts
    int *moe_layers;                // [num_moe_layers] their layer numbers, ascending
    int *expert_tensor;             // [num_moe_layers][E][3] tensor index of (layer, expert, proj)
    int *hash_slots;                // open-addressing name index: tensor index + 1, 0 = empty
    int hash_capacity;
    size_t total_numel;
    uint64_t fingerprint;           // FNV-1a 64 over "name dtype shape" lines, in order
} ModelSpec;

// Building: init, add every tensor, finish (classifies experts, checks that every MoE layer
// has experts 0..E-1 with gate/up/down of equal shapes, computes the fingerprint).
void model_spec_init(ModelSpec *spec);
int model_spec_add(ModelSpec *spec, const char *name, DType dtype, int ndim, const int64_t *shape);
int model_spec_finish(ModelSpec *spec);
void model_spec_free(ModelSpec *spec);

int model_spec_find(const ModelSpec *spec, const char *name);     // tensor index, -1 if absent
// Tensor index of (MoE layer slot, expert, proj); slot indexes spec->moe_layers.
static inline int model_spec_expert_tensor(const ModelSpec *spec, int slot, int expert, int proj) {
    return spec->expert_tensor[((size_t)slot * spec->num_experts + expert) * EXPERT_PROJ_COUNT + proj];
}

// Whether peer `peer` uploads tensor t: fedavg every tensor; spes the shared tensors and the
// experts it owns (sync/expert_owners.h: group peer mod E / experts_per_node).
bool model_spec_peer_sends(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, int t);

// Writes into msg a sentence naming the first difference between a (the server's) and b (a
// peer's), e.g. "tensor 'lm_head.weight': shape [64,32] here, [72,32] from the peer".
void model_spec_describe_difference(const ModelSpec *a, const ModelSpec *b, char *msg, size_t cap);

// Infers the whole model from one peer's upload when that peer never said Hello (the seeds'
// clients): in spes mode the upload holds the shared tensors and the peer's own experts, and
// every other expert of a layer gets the shape of the uploaded one of the same projection.
// A layer has as many experts as its router (mlp.gate.weight) has rows, at most num_experts
// (peers x experts per peer: the count without replicas, and the count when the upload has no
// router). Tensor order: the upload's, with each MoE layer's experts 0..E-1 placed where the
// layer's first uploaded expert tensor was. Every tensor's model dtype is F32.
int model_spec_infer_from_upload(const SafeTensors *upload, SyncMode mode, int num_experts, ModelSpec *out);
