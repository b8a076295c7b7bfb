// The peer's side of a delta run (spes_config.payload_dtype: int8 or int4, docs/communication.md;
// the codec says which), on a flat float32 parameter buffer described by a tensor list (no model types here):
//   base      the aggregate of base_step, exactly as the server holds it (-1: none yet);
//   residual  error feedback over the uploaded tensors (what rounding lost, sent next round).
// A round: delta_peer_encode (or, without a base, a full F32 upload and delta_peer_sent_full),
// then after the download delta_peer_apply_delta (an int8 delta view) or delta_peer_set_base (a
// whole F32 aggregate), then delta_peer_commit when the server took the upload.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "sync/delta_codec.h"

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    size_t offset;              // into the parameter buffer (floats)
    bool sent;                  // uploaded by this peer (trainable)
    bool own;                   // one of this peer's own experts (downloads may leave it out)
} DeltaPeerTensor;

typedef struct {
    const DeltaCodec *codec;    // int8 or int4 codes (delta_codec.h)
    DeltaPeerTensor *tensors;    // copied
    int count;
    size_t total;               // floats in the parameter buffer
    float *base;                // [total]
    int base_step;              // -1: no base
    size_t sent_total;          // floats of the uploaded tensors
    size_t *sent_at;            // [count] offset of tensor t in residual/sent (uploaded ones)
    float *residual;            // [sent_total] error feedback carried into the next upload
    float *residual_next;       // [sent_total] the residual after the upload in flight
    float *sent;                // [sent_total] the upload as the server reconstructs it
} DeltaPeer;

int delta_peer_init(DeltaPeer *p, const DeltaCodec *codec, const DeltaPeerTensor *tensors, int count, size_t total);
void delta_peer_free(DeltaPeer *p);

// The upload of params as a delta (the peer's codec) against the base (base_step >= 0), with error
// feedback: safetensors bytes (malloc'd).
int delta_peer_encode(DeltaPeer *p, const float *params, uint8_t **bytes, size_t *len);
// The upload went as a full F32 payload (no base): the server holds params exactly.
void delta_peer_sent_full(DeltaPeer *p, const float *params);
// The upload was taken: its residual becomes the one carried forward.
void delta_peer_commit(DeltaPeer *p);

// The largest error-feedback value a healthy peer carries. By construction |e'| <= s / 2 with
// s = max|d| / qmax and d = (w - base) + e, where w and base are weights within +-SYNC_MAX_WEIGHT
// (the server refuses others): by induction from e = 0, |e| <= 2 SYNC_MAX_WEIGHT / (2 qmax - 1),
// plus 1% for int4's bf16 scale rounding. About 523 for int8, 10178 for int4.
float delta_peer_residual_bound(const DeltaCodec *c);
// Checks the residual restored from a checkpoint (p->residual): every value finite and within
// delta_peer_residual_bound. A damaged one would poison the next upload and, through the server's
// aggregate, every peer. Errors name `what`, the tensor and the flat index.
int delta_peer_check_residual(const DeltaPeer *p, const char *what);

// Applies a delta view (the peer's codec) of the aggregate of `step` (against base_step) to the base: every
// tensor decoded and checked (delta_payload_decode), own experts (when own_omitted) completed as
// the server computed them from our upload. On success the base is the new aggregate and is
// copied into params; on failure params are untouched and the base is dropped (base_step -1).
int delta_peer_apply_delta(DeltaPeer *p, const SafeTensors *st, bool own_omitted, int step, float *params,
                          const char *what);
// params hold a whole aggregate of step (loaded as F32): it becomes the base.
int delta_peer_set_base(DeltaPeer *p, const float *params, int step);
