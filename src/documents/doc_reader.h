// Documents out of input files for `spes tokenize`: one iterator over every supported
// format, chosen by file name (case-insensitive):
//   .jsonl                        one JSON object a line (blank lines skipped)
//   .jsonl.gz / .json.gz          the same, gzip-compressed (multi-member files too)
//   .jsonl.zst / .json.zst        the same, zstd-compressed (any number of frames)
//   .json                         a top-level array of objects, or one object, or
//                                 objects one after another (read as JSON lines)
//   .parquet                      the string column named text_field (nulls skipped)
//   .txt                          the whole file is one document
// (.json.gz is read as JSON lines, as SPES's tokenize_data.py does.)
// Malformed records (bad JSON line, not an object, missing/null/non-string field) are
// counted and reported with file:line through the callback below, never fatal; an
// unreadable, truncated or corrupt file is an error. Large files are streamed (or mapped),
// never read whole. Memory per document is bounded: a record (JSON line or array entry) or
// text longer than the reader's max_doc_bytes (DOC_READER_MAX_DOC_BYTES by default) is
// reported like a malformed record and skipped; an over-long JSON line is read past in
// pieces, never held whole (a 7 KB .jsonl.zst can hold a 200 MB line).
// Texts are passed on exactly as stored: not stripped, not UTF-8-validated for .txt and
// .parquet (JSON strings are valid UTF-8 by construction) — cleaning is the caller's job.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct DocReader DocReader;

// The default bound on one document (its JSON record, or its text): 32 MiB. Tokenizing holds
// about 5x a document's bytes (text, cleaned copy, pieces, ids), so this keeps a worker near
// 200 MB whatever its input; the largest documents of common corpora (books) are a few MB.
#define DOC_READER_MAX_DOC_BYTES ((size_t)32 << 20)
// The most doc_reader_set_max_doc_bytes accepts: the line reader's buffer limit.
#define DOC_READER_MAX_DOC_BYTES_LIMIT ((size_t)256 << 20)

// Called for each malformed record (may be NULL: then they are only counted). For .json
// files `line` is the line where the entry starts and `why` names the entry index.
typedef void (*DocMalformedFn)(void *user, const char *path, uint64_t line, const char *why);

// text_field NULL or "" means "text".
int doc_reader_open(const char *path, const char *text_field, DocMalformedFn on_malformed, void *user,
                    DocReader **out);
// Next document: 1 with *text (UTF-8 bytes, not NUL-terminated, valid until the next call)
// and *len; 0 at end; SPES_ERR on an I/O or format error (message set).
int doc_reader_next(DocReader *r, const char **text, size_t *len);
uint64_t doc_reader_malformed(const DocReader *r);   // records skipped so far
// Bound on one document in bytes, before the first doc_reader_next: 1 ..
// DOC_READER_MAX_DOC_BYTES_LIMIT, else an error naming the limit.
int doc_reader_set_max_doc_bytes(DocReader *r, size_t max_doc_bytes);
// Input bytes consumed (for MB/s and ETA against the file size): bytes of the FILE, so
// compressed bytes for .gz/.zst; for .parquet the file size times the fraction of the
// column's values read (only one column's pages are read).
uint64_t doc_reader_bytes_read(const DocReader *r);
void doc_reader_close(DocReader *r);
