// The parameter server's maths, as pure functions: uploads in, aggregate out, no sockets.
//
// For every tensor t of the spec:
//   shared tensor (and every tensor in fedavg mode): element-wise mean over the peers,
//     accumulated in fp32 in peer order 0..P-1, then divided by P;
//   expert e of a layer (spes mode): the upload of its owner peer e / m;
//   on merge steps (step % merge_interval == 0 and alpha > 0), every expert tensor becomes
//     theta_i + alpha * mean_{j in N_i}(theta_j - theta_i), where N_i are the top-k experts of
//     the same layer most similar to i by cosine of their flattened gate_proj weights (k =
//     min(merge_topk, E-1), ties to the lower index), all computed from pre-merge values,
//     tensors matched by name; alpha = merge_alpha_start * (1 - min(step / merge_decay_steps, 1));
//   on rotation steps (spes mode, step % rotation_steps == 0), after merging, each layer's experts
//     move one peer on, router rows with them (expert_rotation.h).
// Uploads may be F32 or BF16 (converted to fp32 as they are read); the output is F32 or BF16.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "sync/model_spec.h"
#include "server/outer_optimizer.h"

typedef struct {
    SyncMode mode;
    int num_peers;              // P
    int experts_per_node;       // m: peer p owns experts [p*m, (p+1)*m) of every layer
    int merge_interval;         // <= 0: never merge
    float merge_alpha_start;
    int merge_decay_steps;      // <= 0: alpha does not decay
    int merge_topk;             // k before clipping to E-1
    int rotation_steps;         // <= 0: experts never rotate (expert_rotation.h; spes mode only)
} AggregateConfig;

// Checks the config against the spec (P*m == E in spes mode, ranges). Names what is wrong.
int aggregate_config_check(const AggregateConfig *cfg, const ModelSpec *spec);

// The merge strength at `step`; 0 when this step does not merge.
float aggregate_merge_alpha(const AggregateConfig *cfg, int step);

// Cosine similarities of the pre-merge gate_proj weights of the E experts of MoE layer `slot`:
// cos[i*E + j]. Deterministic whatever the thread count.
int aggregate_expert_cosines(const ModelSpec *spec, const AggregateConfig *cfg, const StTensor *const *uploads, int slot,
                             double *cos);
// N_i for every expert: nbr[i*k + r], r-th most similar other expert (ties: lower index first).
void aggregate_expert_neighbours(const double *cos, int num_experts, int k, int *nbr);

// uploads[p * spec->count + t]: peer p's tensor t (F32/BF16, spec shape), NULL where p does
// not send t (spes: others' experts). Callers validate uploads first (upload_check.h).
// out[t]: where tensor t of the aggregate goes, numel values of out_dtype (F32 or BF16).
int aggregate_compute(const ModelSpec *spec, const AggregateConfig *cfg, int step, const StTensor *const *uploads,
                      uint8_t *const *out, DType out_dtype);

// A partial round (the round timeout expired with some peers missing): present[p] says who
// uploaded (rows of the others are ignored). Shared tensors (every tensor in fedavg mode) are
// the mean over the present peers, in peer order; an expert whose owner is missing keeps its
// value in the latest aggregate, previous[t] (may be NULL when every owner is present).
// Merging, when due, runs on these pre-merge values. With every peer present this is
// aggregate_compute, bit for bit.
int aggregate_compute_partial(const ModelSpec *spec, const AggregateConfig *cfg, int step,
                              const StTensor *const *uploads, const bool *present, const StTensor *const *previous,
                              uint8_t *const *out, DType out_dtype);

// The same aggregate, formed one peer at a time, so that a caller never holds more than one
// upload: begin, add every present peer's rows in increasing peer order, finish. Every value
// is computed with the same fp32 operations in the same order as aggregate_compute_partial
// (sums in peer order, then the division; merging on the same pre-merge values), so the
// output is bit-identical. With F32 output the accumulator is the output itself; with BF16
// an fp32 copy of the model is held until finish. Merging needs one MoE layer's experts as
// scratch. present: as in aggregate_compute_partial (NULL: every peer). out/spec/cfg must
// outlive the accumulator.
typedef struct AggregateAcc AggregateAcc;
int aggregate_acc_begin(const ModelSpec *spec, const AggregateConfig *cfg, int step, const bool *present,
                        uint8_t *const *out, DType out_dtype, AggregateAcc **acc);
// row[t]: peer's tensor t (NULL where it does not send t); may be freed after the call.
int aggregate_acc_add(AggregateAcc *acc, int peer, const StTensor *const *row);
// The same, tensor by tensor: begin_peer, add_tensor for every tensor the peer sends (any
// order; each may be freed after its call), end_peer.
int aggregate_acc_begin_peer(AggregateAcc *acc, int peer);
int aggregate_acc_add_tensor(AggregateAcc *acc, int peer, int t, const StTensor *u);
int aggregate_acc_end_peer(AggregateAcc *acc, int peer);
// Divides, fills missing owners' experts from previous (may be NULL when none is missing),
// merges when due, and writes out. Then free with aggregate_acc_free.
int aggregate_acc_finish(AggregateAcc *acc, const StTensor *const *previous);
// Optional, before finish: finish then runs one outer step (outer_optimizer.h) on every slot
// that state covers (numel > 0), on the fp32 mean after the division and before any rounding
// to the output dtype, with theta[t] (the previous aggregate, F32 or BF16, widened to fp32;
// theta NULL: the first round, the mean is kept and the velocity untouched). The caller marks
// the round with outer_opt_end_round. cfg, state and theta must outlive the accumulator.
void aggregate_acc_set_outer(AggregateAcc *acc, const OuterOptConfig *cfg, OuterOptState *state,
                             const StTensor *const *theta);
void aggregate_acc_free(AggregateAcc *acc);
