// Documents out of input files for `spes tokenize`: one iterator over every supported
// format, chosen by file name: .jsonl, .json (array of objects), .jsonl.gz, .jsonl.zst,
// .parquet (string column), .txt (the whole file is one document).
// Malformed records (bad JSON line, missing/non-string field) are counted and reported
// with file:line through the callback below, never fatal; an unreadable file is an error.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct DocReader DocReader;

// Called for each malformed record (may be NULL: then they are only counted).
typedef void (*DocMalformedFn)(void *user, const char *path, uint64_t line, const char *why);

int doc_reader_open(const char *path, const char *text_field, DocMalformedFn on_malformed, void *user,
                    DocReader **out);
// Next document: 1 with *text (UTF-8 bytes, not NUL-terminated, valid until the next call)
// and *len; 0 at end; SPES_ERR on an I/O or format error (message set).
int doc_reader_next(DocReader *r, const char **text, size_t *len);
uint64_t doc_reader_malformed(const DocReader *r);   // records skipped so far
uint64_t doc_reader_bytes_read(const DocReader *r);  // input bytes consumed (for MB/s)
void doc_reader_close(DocReader *r);
