// safetensors reader and writer (https://github.com/huggingface/safetensors format):
// 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets},
// "__metadata__": {str: str}}, then the data. The reader validates everything: header
// size, JSON, dtypes, shapes (overflow), offsets inside the data, no overlaps, no gaps.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/file.h"

typedef enum {
    DTYPE_F32 = 0,
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_F64,
    DTYPE_I64,
    DTYPE_I32,
    DTYPE_I16,
    DTYPE_I8,
    DTYPE_U8,
    DTYPE_U16,
    DTYPE_U32,
    DTYPE_U64,
    DTYPE_BOOL,
    DTYPE_COUNT
} DType;

#define ST_MAX_DIMS 8

const char *dtype_name(DType dt);               // "F32", "BF16", ...
int dtype_from_name(const char *name, DType *out);
size_t dtype_size(DType dt);

typedef struct {
    char *name;
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    const uint8_t *data;    // points into the file/buffer, little-endian, maybe unaligned
    size_t nbytes;
} StTensor;

typedef struct {
    StTensor *tensors;      // in file order
    int count;
    char **meta_keys;       // __metadata__ entries
    char **meta_values;
    int meta_count;
    MappedFile file;        // set by safetensors_open
} SafeTensors;

// Parses a safetensors image in memory. Tensors point into buf, which must outlive *out.
// `what` names the source in error messages (a path, "upload from peer 2", ...).
int safetensors_parse(const uint8_t *buf, size_t len, const char *what, SafeTensors *out);
// Maps a file and parses it.
int safetensors_open(const char *path, SafeTensors *out);
void safetensors_close(SafeTensors *st);
const StTensor *safetensors_find(const SafeTensors *st, const char *name);
const char *safetensors_meta(const SafeTensors *st, const char *key);   // NULL if absent
// Converts a F32/BF16/F16/F64 tensor to float32 into dst[numel]; other dtypes are an error.
int safetensors_to_f32(const StTensor *t, float *dst);

// Writer: a list of tensors to lay out in the given order.
typedef struct {
    const char *name;
    DType dtype;            // dtype of `data` as given
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;       // numel * dtype_size bytes
} StWriteTensor;

// Serialises into a malloc'd buffer. meta_keys/values may be NULL (n_meta 0).
int safetensors_serialize(const StWriteTensor *tensors, int n, const char *const *meta_keys,
                          const char *const *meta_values, int n_meta, uint8_t **out, size_t *out_len);
// The header alone (8-byte length + JSON padded to a multiple of 8) of what safetensors_serialize
// writes: the data follows it, tensors back to back in the given order (data is not read).
// *out (malloc'd) is header_len bytes; *data_len the bytes of data that follow.
int safetensors_build_header(const StWriteTensor *tensors, int n, const char *const *meta_keys,
                             const char *const *meta_values, int n_meta, char **out, size_t *out_len, size_t *data_len);
// The bytes safetensors_serialize would write (header and data), without building them: what a
// payload or file of these tensors takes (the sync plan, a checkpoint's size on disk).
int safetensors_serialized_size(const StWriteTensor *tensors, int n, const char *const *meta_keys,
                                const char *const *meta_values, int n_meta, size_t *len);
// Writes a file atomically (temp + fsync + rename), streaming tensor data (no full copy).
int safetensors_write_file(const char *path, const StWriteTensor *tensors, int n, const char *const *meta_keys,
                           const char *const *meta_values, int n_meta);

// bf16 <-> f32 (round to nearest even, NaN kept NaN), f16 -> f32.
float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t v);
