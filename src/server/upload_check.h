// Validation of a peer's upload (safetensors bytes, already parsed) against the model spec
// agreed at the handshake: every name known, the exact set this peer must send (spes: shared
// tensors + its own experts; fedavg: everything), shapes as in the spec, dtype F32 or BF16,
// every value finite and within +-SYNC_MAX_WEIGHT. Errors name the peer, the tensor and what is wrong.
#pragma once
#include <stddef.h>

#include "io/safetensors.h"
#include "sync/model_spec.h"

// On success row[t] points at the upload's tensor t of the spec, or NULL where this peer does
// not send t. row has spec->count entries.
int upload_check(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, const SafeTensors *upload,
                 const StTensor **row);

// upload_check without reading the values (no value scan): for an upload that passed
// upload_check before and is only being mapped again, so that its pages are touched once.
int upload_rows(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, const SafeTensors *upload,
                const StTensor **row);

// Checks the values of t (F32 or BF16), a window of tensor `name` starting at flat index
// `first`: every one finite and within +-SYNC_MAX_WEIGHT; the error names peer, tensor, index.
int upload_check_values(const StTensor *t, size_t first, int peer, const char *name);

// Size cap for peer's upload: its tensors in F32 plus room for the safetensors header.
size_t upload_max_bytes(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer);
