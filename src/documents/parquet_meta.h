// Parquet metadata: the file footer (FileMetaData) and page headers, decoded from the
// Thrift compact protocol. Only what reading one flat string column needs is kept.
// Format: https://github.com/apache/parquet-format (parquet.thrift).
#pragma once
#include <stddef.h>
#include <stdint.h>

// parquet.thrift enum values (only those we name).
enum { PQ_TYPE_BYTE_ARRAY = 6 };
enum { PQ_REQUIRED = 0, PQ_OPTIONAL = 1, PQ_REPEATED = 2 };
enum { PQ_CONVERTED_UTF8 = 0 };
enum { PQ_CODEC_UNCOMPRESSED = 0, PQ_CODEC_SNAPPY = 1, PQ_CODEC_GZIP = 2, PQ_CODEC_ZSTD = 6 };
enum { PQ_PAGE_DATA = 0, PQ_PAGE_INDEX = 1, PQ_PAGE_DICTIONARY = 2, PQ_PAGE_DATA_V2 = 3 };
enum {
    PQ_ENC_PLAIN = 0,
    PQ_ENC_PLAIN_DICTIONARY = 2,
    PQ_ENC_RLE = 3,
    PQ_ENC_BIT_PACKED = 4,
    PQ_ENC_DELTA_BINARY_PACKED = 5,
    PQ_ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
    PQ_ENC_DELTA_BYTE_ARRAY = 7,
    PQ_ENC_RLE_DICTIONARY = 8,
};

const char *parquet_type_name(int32_t type);
const char *parquet_codec_name(int32_t codec);
const char *parquet_encoding_name(int32_t encoding);

// One row group's chunk of the column we read.
typedef struct {
    int32_t codec;
    int64_t num_values;              // including nulls
    int64_t start;                   // file offset of its first page (dictionary or data)
    int64_t compressed_size;         // bytes of pages from start
} ParquetChunk;

typedef struct {
    int max_def_level;               // 1 for an optional column, 0 for a required one
    int64_t num_rows;
    ParquetChunk *chunks;            // one per row group, malloc'd
    int num_chunks;
} ParquetColumn;

// Decodes FileMetaData (footer bytes, without length and magic) and locates the top-level
// BYTE_ARRAY column `name`. Chunk ranges are checked to lie in [0, data_end). Errors
// say what is wrong (the caller adds the file name).
int parquet_read_column_meta(const uint8_t *footer, size_t len, const char *name, uint64_t data_end,
                             ParquetColumn *out);
void parquet_column_free(ParquetColumn *col);

typedef struct {
    int32_t type;                    // PQ_PAGE_*
    int32_t uncompressed_size;
    int32_t compressed_size;
    int32_t num_values;              // data pages: values incl. nulls; dictionary: entries
    int32_t encoding;
    int32_t def_level_encoding;      // v1 only
    int32_t num_nulls;               // v2 only
    int32_t def_levels_bytes;        // v2 only: level bytes lead the page, uncompressed
    int32_t rep_levels_bytes;        // v2 only
    int is_compressed;               // v2 only (default true)
    int has_crc;                     // optional CRC-32 (as gzip's) of the page bytes as stored
    uint32_t crc;
} ParquetPageHeader;

// Decodes the page header at data[0..len); *header_len gets its encoded size.
int parquet_read_page_header(const uint8_t *data, size_t len, ParquetPageHeader *out, size_t *header_len);
