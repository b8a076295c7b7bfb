// Internal interface between doc_reader.c (which picks the format from the file name)
// and the one-file-per-format document sources: doc_source_jsonl.c, doc_source_json.c,
// doc_source_txt.c, doc_source_parquet.c.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "documents/byte_stream.h"
#include "documents/doc_reader.h"

// Where malformed records go: counted, and passed to the user's callback.
typedef struct {
    const char *path;
    DocMalformedFn fn;
    void *user;
    uint64_t count;
    size_t max_doc;   // longest record (JSON line or entry) or text served, in bytes
} DocReport;

void doc_report_malformed(DocReport *rep, uint64_t line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// A record or text of `len` bytes longer than rep->max_doc is reported as `what` ("the line",
// "entry 3", "document 7"; at `line`, or 0 when the format has none) and to be skipped: true
// then. One check for every format, so the bound and its message are the same everywhere.
bool doc_too_long(DocReport *rep, uint64_t line, const char *what, size_t len);

typedef struct DocSource DocSource;
struct DocSource {
    // Same contract as doc_reader_next: 1 = a document, 0 = end, SPES_ERR = error.
    int (*next)(DocSource *s, const char **text, size_t *len);
    uint64_t (*bytes_read)(const DocSource *s);
    void (*close)(DocSource *s);
};

// `.jsonl`, `.jsonl.gz`, `.jsonl.zst`: one JSON object a line.
int doc_source_jsonl_open(const char *path, ByteStreamKind kind, const char *text_field, DocReport *rep,
                          DocSource **out);
// `.json`: a top-level array of objects (a single top-level object is one record).
int doc_source_json_open(const char *path, const char *text_field, DocReport *rep, DocSource **out);
// `.txt`: the whole file is one document.
int doc_source_txt_open(const char *path, DocReport *rep, DocSource **out);
// `.parquet`: the string column named text_field; nulls are skipped (not malformed).
int doc_source_parquet_open(const char *path, const char *text_field, DocReport *rep, DocSource **out);
