// ZeRO-3's gather of one part (the model hooks' unit: embedding, layer l, head) from the
// ranks' shards, into a working buffer laid out as the part's span of the parameter buffer
// (param_part_span), ready for model_bind_part.
//
// Each rank keeps the fp32 master values of its shard [lo[r], lo[r+1]) of the gradient layout
// (trainable tensors, table order, as ZeRO-2 shards gradients and moments). A part's
// trainable tensors are consecutive in that layout, so the part's trainable values are one
// range [glo, ghi) of it: one all-gather whose block r is that range's overlap with rank r's
// shard. Frozen tensors (SPES: the experts this peer does not own) are in no shard: every rank
// holds them packed in table order (part_pack_frozen), and the gather copies them from there.
//
// Every buffer is the backend's memory (host on cpu: MPI; device on cuda: NCCL), moved with the
// backend's copy op; the code is the same for both.
#pragma once
#include <stddef.h>

#include "parallel/comm.h"
#include "model/param_table.h"
#include "ops/backend.h"

typedef struct {
    Comm *comm;
    Backend *be;
    const ParamTable *table;
    int n_layers, rank, size;
    const size_t *lo;        // [size + 1] shard boundaries of the gradient layout (not owned)
    size_t frozen_numel;     // floats of the packed frozen store
    size_t *frozen_at;       // [table->count] each frozen tensor's offset in the store
    int slots;               // gathers that may be in flight at once (1 or 2: prefetch)
    float *gathered[2];      // [slots][gathered_n] backend memory: staging of the all-gathered range
                             // of a part with frozen tensors
    size_t gathered_n;       // the largest such part's trainable values (0: every part gathers in place)
    int *counts[2];          // [slots][size] each slot's blocks (read until its gather completes)
} PartGather;

// Values of one slot's staging (gathered_n): the largest trainable range of a part that also
// holds frozen tensors; 0 when every part gathers in place.
size_t part_gather_staging_values(const ParamTable *table, int n_layers);
// lo: the shard boundaries (DataParallel.lo); table (of a model of n_layers layers) and lo must
// outlive g. `slots`: 2 to keep a second gather in flight (its own staging and counts), else 1.
int part_gather_create(PartGather *g, Comm *comm, Backend *be, const ParamTable *table, int n_layers,
                       const size_t *lo, int slots);
void part_gather_free(PartGather *g);
// Copies the frozen tensors of the full parameter buffer params[total_numel] into
// store[g->frozen_numel], packed in table order (both backend memory).
void part_pack_frozen(const PartGather *g, const float *params, float *store);
// Every rank calls it for the same part (a collective): assembles part `part` into
// work[span of the part] from this rank's shard (shard[0..lo[rank+1]-lo[rank])), the other
// ranks' shards and the frozen store (all backend memory). Uses slot 0.
int part_gather(PartGather *g, int part, const float *shard, const float *frozen, float *work);
// The same in two halves, so that the all-gather runs while other work goes on: _start begins
// it in slot `slot` (a non-blocking collective: work, the slot's staging and counts stay
// untouched until comm_wait_all), _finish, after comm_wait_all, copies the staged values and
// the frozen tensors into work.
int part_gather_start(PartGather *g, int slot, int part, const float *shard, float *work);
void part_gather_finish(PartGather *g, int slot, int part, const float *frozen, float *work);
