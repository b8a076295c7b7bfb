// Token files, memory-mapped and validated. Two kinds are read:
//  - what SPES's tokenize_data.py (and `spes tokenize`) writes: a raw little-endian uint16
//    or uint32 array, named *.npy but WITHOUT an npy header; the caller declares the dtype
//    (config `data.memmap_dtype`);
//  - real NumPy .npy files (magic "\x93NUMPY", versions 1-3): the header dict gives the
//    dtype ('<u2', '<u4', '<i4', '<u8', '<i8', also '|u1'), C order, and the shape, which
//    is read flattened. The header wins over the declared dtype.
// A file is a real .npy exactly when it starts with the magic; anything else is raw.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/file.h"

typedef enum {
    TOKEN_U16 = 0,      // the two dtypes of raw files
    TOKEN_U32,
    TOKEN_U8,           // the rest only come from real .npy headers
    TOKEN_I32,
    TOKEN_U64,
    TOKEN_I64,
} TokenDtype;

size_t token_dtype_size(TokenDtype dt);
const char *token_dtype_name(TokenDtype dt);     // "uint16", "uint32", ...
// "uint16"/"u2"/"uint32"/"u4" -> the raw dtypes (what data.memmap_dtype holds).
int token_dtype_parse_raw(const char *name, TokenDtype *out);

typedef struct {
    const uint8_t *data;    // first token inside the mapping (little-endian, maybe unaligned)
    uint64_t count;         // number of tokens
    TokenDtype dtype;
    size_t elem_size;       // bytes per token
    int has_npy_header;     // 1 for a real .npy file
    MappedFile file;
} TokenFile;

// Maps `path`; raw_dtype (TOKEN_U16 or TOKEN_U32) applies only to headerless files.
int token_file_open(const char *path, TokenDtype raw_dtype, TokenFile *out);
void token_file_close(TokenFile *tf);

// Token i (i < count), widened. Signed dtypes come back as their two's-complement bits.
uint64_t token_file_get(const TokenFile *tf, uint64_t i);
// Copies tokens [start, start+n) into dst as uint32. Fails (naming the file position) when
// the range is outside the file or a value is negative or does not fit in 32 bits.
int token_file_read_u32(const TokenFile *tf, uint64_t start, size_t n, uint32_t *dst);

// Parses an in-memory image (header + data); `what` names it in errors. out->file is
// left empty. Used by token_file_open and by tests.
int token_file_parse(const uint8_t *buf, size_t len, TokenDtype raw_dtype, const char *what, TokenFile *out);

// Writes a real 1-D .npy file (version 1.0, header padded to 64 bytes), atomically.
// data holds count little-endian elements of dtype.
int npy_write(const char *path, TokenDtype dtype, const void *data, uint64_t count);
