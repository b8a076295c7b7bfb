// Validation of a peer's upload (safetensors bytes, already parsed) against the model spec
// agreed at the handshake: every name known, the exact set this peer must send (spes: shared
// tensors + its own experts; fedavg: everything), shapes as in the spec, dtype F32 or BF16,
// every value finite. Errors name the peer, the tensor and what is wrong.
#pragma once
#include <stddef.h>

#include "io/safetensors.h"
#include "sync/model_spec.h"

// On success row[t] points at the upload's tensor t of the spec, or NULL where this peer does
// not send t. row has spec->count entries.
int upload_check(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, const SafeTensors *upload,
                 const StTensor **row);

// upload_check without reading the values (no NaN/Inf scan): for an upload that passed
// upload_check before and is only being mapped again, so that its pages are touched once.
int upload_rows(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, const SafeTensors *upload,
                const StTensor **row);

// Index of the first non-finite value (NaN or Inf) of t, or t->numel if none.
size_t upload_first_non_finite(const StTensor *t);

// Size cap for peer's upload: its tensors in F32 plus room for the safetensors header.
size_t upload_max_bytes(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer);
