// int8 delta payloads as safetensors (docs/communication.md): for every tensor `name` sent,
//   `name`        I8, the tensor's shape: the codes q (int8_codec.h)
//   `name.scale`  F32, [int8_blocks(numel)]: one scale per block of INT8_BLOCK values
// and in __metadata__ "spes_encoding" = "int8-delta", "spes_base_step" = the step of the
// aggregate the change is against, "spes_block" = "256". Uploads (peer -> server) and the
// aggregate's way down (server -> peers) use the same layout.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

#define INT8_ENCODING "int8-delta"
#define INT8_SCALE_SUFFIX ".scale"

// One encoded tensor to write.
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    const int8_t *q;            // [numel]
    const float *scale;         // [int8_blocks(numel)]
} Int8Tensor;

int int8_payload_serialize(const Int8Tensor *tensors, int n, int base_step, uint8_t **bytes, size_t *len);

// Whether a parsed payload is an int8 delta (by its metadata), and against which step. A payload
// that says int8-delta with a missing or bad base step or block size is an error naming `what`.
int int8_payload_kind(const SafeTensors *st, const char *what, bool *is_int8, int *base_step);

// The encoded tensor `name` (ndim/shape from the model) checked and reconstructed:
// out[numel] = base + q * s (int8_reconstruct); every value of out must be finite. Errors name
// `what`, the tensor and what is wrong (missing, dtype, shape, block count, bad scale, -128,
// non-finite result). scratch: int8_blocks(numel) floats (the scales, copied aligned).
int int8_payload_decode(const SafeTensors *st, const char *what, const char *name, int ndim, const int64_t *shape,
                        size_t numel, const float *base, float *out, float *scratch);
