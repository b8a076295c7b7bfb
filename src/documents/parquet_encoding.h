// Parquet value and level encodings for BYTE_ARRAY columns, all bounds-checked:
//  - RLE / bit-packed hybrid (definition levels, dictionary indices);
//  - PLAIN byte arrays (4-byte little-endian length + bytes);
//  - dictionary indices (PLAIN_DICTIONARY / RLE_DICTIONARY: bit-width byte + hybrid);
//  - DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY (built on DELTA_BINARY_PACKED).
// Spec: https://github.com/apache/parquet-format/blob/master/Encodings.md
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const uint8_t *data;
    size_t len;
} ByteSpan;

typedef struct {
    const uint8_t *p, *end;     // run headers and RLE values still unread
    int width;                  // bits per value, 0..32
    uint64_t left;              // values left in the current run
    int literal;                // current run is bit-packed
    uint32_t value;             // current RLE run's value
    const uint8_t *bits;        // current bit-packed run and its available bytes
    size_t bits_len;
    uint64_t bit_pos;
} RleDecoder;

int rle_init(RleDecoder *d, const uint8_t *data, size_t len, int width);
int rle_next(RleDecoder *d, uint32_t *out);

// Of n definition levels (hybrid, bit width 1 for max level 1), how many equal max_def:
// the number of non-null values that follow.
int parquet_count_defined(const uint8_t *data, size_t len, uint32_t n, int max_def, uint32_t *defined);

// Each decoder fills out[0..n) with spans pointing into data (or into *arena for
// DELTA_BYTE_ARRAY, whose values are rebuilt from prefixes; the arena grows as needed).
int parquet_decode_plain(const uint8_t *data, size_t len, uint32_t n, ByteSpan *out);
int parquet_decode_dictionary(const uint8_t *data, size_t len, uint32_t n, const ByteSpan *dict, uint32_t dict_size,
                              ByteSpan *out);
int parquet_decode_delta_length(const uint8_t *data, size_t len, uint32_t n, ByteSpan *out);
int parquet_decode_delta_byte_array(const uint8_t *data, size_t len, uint32_t n, ByteSpan *out, uint8_t **arena,
                                    size_t *arena_cap);
