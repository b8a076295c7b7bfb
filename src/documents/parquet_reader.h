// A focused Parquet reader: the values of ONE top-level string (BYTE_ARRAY) column, in
// row order, nulls skipped. Debian packages no C Parquet library (Arrow's is C++ and not
// in the archive), so this reads the format directly:
//   footer ("PAR1" magic, 4-byte footer length, FileMetaData in Thrift compact protocol)
//   -> row groups -> the column's chunk -> pages: dictionary page, data page v1 (levels
//   length-prefixed, inside the compressed data), data page v2 (levels uncompressed,
//   outside it); PLAIN, PLAIN_DICTIONARY/RLE_DICTIONARY, DELTA_LENGTH_BYTE_ARRAY and
//   DELTA_BYTE_ARRAY values; UNCOMPRESSED, SNAPPY, GZIP and ZSTD pages; page CRC-32s are
//   checked when the writer stored them (pyarrow: write_page_checksum=True).
// Not supported (clear errors): nested/repeated columns, other codecs, encrypted files,
// column chunks in external files. The file is memory-mapped; every length, offset and
// count is checked against it, so a corrupt file gives an error naming the file and the
// problem, never a crash.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define PARQUET_MAX_PAGE_BYTES ((size_t)1 << 30)     // uncompressed page size limit
#define PARQUET_MAX_PAGE_VALUES ((uint32_t)1 << 24)  // values per data page limit

typedef struct ParquetStringReader ParquetStringReader;

int parquet_string_reader_open(const char *path, const char *column, ParquetStringReader **out);
// Reads from memory instead (buf must outlive the reader); `what` names it in errors.
int parquet_string_reader_open_memory(const uint8_t *buf, size_t len, const char *what, const char *column,
                                      ParquetStringReader **out);
// 1 with the next non-null value (valid until the next call); 0 at the end; SPES_ERR.
int parquet_string_reader_next(ParquetStringReader *r, const uint8_t **data, size_t *len);
uint64_t parquet_string_reader_nulls(const ParquetStringReader *r);     // nulls skipped so far
// The file's size scaled by the fraction of the column's values read (for progress).
uint64_t parquet_string_reader_bytes_read(const ParquetStringReader *r);
void parquet_string_reader_close(ParquetStringReader *r);
