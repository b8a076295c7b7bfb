// Delta payloads as safetensors (docs/communication.md), int8 or int4 codes (delta_codec.h). For
// every tensor `name` sent:
//   int8:  `name`        I8, the tensor's shape: the codes q, one byte each
//          `name.scale`  F32, [delta_blocks(numel)]: one scale per block of DELTA_BLOCK values
//   int4:  `name`        U8, [frame bytes]: one zstd frame (level 1, its content size declared)
//                        of the codes packed two per byte: value 2k in the low nibble of byte k,
//                        value 2k+1 in the high one, 4-bit two's complement (-7..7; -8 is
//                        refused); an odd count leaves the last high nibble 0. The frame must
//                        declare exactly ceil(numel / 2) bytes and be all of the tensor.
//          `name.scale`  BF16, [delta_blocks(numel)]
// and in __metadata__ "spes_encoding" = "int8-delta" | "int4-delta", "spes_base_step" = the step
// of the aggregate the change is against, "spes_block" = "256". Uploads (peer -> server) and the
// aggregate's way down (server -> peers) use the same layout.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "sync/delta_codec.h"

#define DELTA_SCALE_SUFFIX ".scale"

// One encoded tensor to write.
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    const int8_t *q;            // [numel] codes (unpacked, whatever the width)
    const float *scale;         // [delta_blocks(numel)], exactly representable in the codec's scale dtype
} DeltaTensor;

int delta_payload_serialize(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, uint8_t **bytes,
                           size_t *len);
// The same as the server's delta of the aggregate of `step` (against base_step): its metadata
// also states the step (spes_step, aggregate_step.h), which the peer checks.
int delta_payload_serialize_aggregate(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, int step,
                                      uint8_t **bytes, size_t *len);

// The bytes delta_payload_serialize writes for `tensors` (their codes and scales are not read:
// nothing is encoded), or, with keep, of the aggregate view of such a payload holding only the
// tensors keep[i] (with their scales) and "spes_view" = view in its metadata (aggregate_view.h).
// int8 sizes are exact; int4's are upper bounds: each zstd frame at ZSTD_compressBound of its
// packed codes (real codes compress: docs/communication.md measured 0.76x).
int delta_payload_bytes(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, const bool *keep,
                        const char *view, size_t *len);
// The same for the server's delta of the aggregate of `step` (delta_payload_serialize_aggregate).
int delta_payload_aggregate_bytes(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, int step,
                                  const bool *keep, const char *view, size_t *len);

// Whether a parsed payload is a delta (by its metadata: *codec, NULL when it is not one), and
// against which step. A payload that names an unknown encoding, or a delta with a missing or bad
// base step or block size, is an error naming `what`.
int delta_payload_kind(const SafeTensors *st, const char *what, const DeltaCodec **codec, int *base_step);

// The encoded tensor `name` (ndim/shape from the model) checked and reconstructed:
// out[numel] = base + q * s (delta_reconstruct); every value of out must be finite
// and within +-SYNC_MAX_WEIGHT (model_spec.h). Errors name
// `what`, the tensor and what is wrong (missing, dtype, shape, int4's zstd frame (not one, or of
// another size), block count, bad scale, -128 / -8, a non-zero padding nibble, non-finite result). Scratch: scales
// delta_blocks(numel) floats, codes numel bytes (int4's unpacked codes; unused for int8).
int delta_payload_decode(const DeltaCodec *c, const SafeTensors *st, const char *what, const char *name, int ndim,
                        const int64_t *shape, size_t numel, const float *base, float *out, float *scales,
                        int8_t *codes);
