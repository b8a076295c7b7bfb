// Document iterator: picks the source for a file by its name (see doc_reader.h) and
// counts malformed records.
#include "documents/doc_reader.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/doc_source.h"

struct DocReader {
    DocSource *source;
    DocReport report;
    char *path;
    char *text_field;
};

void doc_report_malformed(DocReport *rep, uint64_t line, const char *fmt, ...) {
    rep->count++;
    if (!rep->fn) return;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    rep->fn(rep->user, rep->path, line, why);
}

bool doc_too_long(DocReport *rep, uint64_t line, const char *what, size_t len) {
    if (len <= rep->max_doc) return false;
    doc_report_malformed(rep, line, "%s is %zu bytes, longer than the limit of %zu bytes per document "
                         "(--max_doc_bytes)", what, len, rep->max_doc);
    return true;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

int doc_reader_open(const char *path, const char *text_field, DocMalformedFn on_malformed, void *user,
                    DocReader **out) {
    *out = NULL;
    if (!text_field || !*text_field) text_field = "text";
    DocReader *r = spes_calloc(1, sizeof *r);
    if (!r) return SPES_ERR;
    r->path = spes_strdup(path);
    r->text_field = spes_strdup(text_field);
    if (!r->path || !r->text_field) {
        doc_reader_close(r);
        return SPES_ERR;
    }
    text_field = r->text_field;
    r->report = (DocReport){.path = r->path, .fn = on_malformed, .user = user, .max_doc = DOC_READER_MAX_DOC_BYTES};
    int rc;
    // .json.gz is read as gzip'd JSON lines, as SPES's tokenize_data.py does.
    if (ends_with(path, ".jsonl")) rc = doc_source_jsonl_open(path, BYTE_STREAM_PLAIN, text_field, &r->report, &r->source);
    else if (ends_with(path, ".jsonl.gz") || ends_with(path, ".json.gz"))
        rc = doc_source_jsonl_open(path, BYTE_STREAM_GZIP, text_field, &r->report, &r->source);
    else if (ends_with(path, ".jsonl.zst") || ends_with(path, ".json.zst"))
        rc = doc_source_jsonl_open(path, BYTE_STREAM_ZSTD, text_field, &r->report, &r->source);
    else if (ends_with(path, ".json")) rc = doc_source_json_open(path, text_field, &r->report, &r->source);
    else if (ends_with(path, ".parquet")) rc = doc_source_parquet_open(path, text_field, &r->report, &r->source);
    else if (ends_with(path, ".txt")) rc = doc_source_txt_open(path, &r->report, &r->source);
    else
        rc = spes_fail("%s: unknown input format (expected .jsonl, .json, .jsonl.gz, .jsonl.zst, .parquet or .txt)",
                       path);
    if (rc != SPES_OK) {
        doc_reader_close(r);
        return SPES_ERR;
    }
    *out = r;
    return SPES_OK;
}

int doc_reader_next(DocReader *r, const char **text, size_t *len) { return r->source->next(r->source, text, len); }

uint64_t doc_reader_malformed(const DocReader *r) { return r->report.count; }

int doc_reader_set_max_doc_bytes(DocReader *r, size_t max_doc_bytes) {
    if (max_doc_bytes < 1 || max_doc_bytes > DOC_READER_MAX_DOC_BYTES_LIMIT)
        return spes_fail("the limit per document must be between 1 and %zu bytes, not %zu",
                         DOC_READER_MAX_DOC_BYTES_LIMIT, max_doc_bytes);
    r->report.max_doc = max_doc_bytes;
    return SPES_OK;
}

uint64_t doc_reader_bytes_read(const DocReader *r) { return r->source->bytes_read(r->source); }

void doc_reader_close(DocReader *r) {
    if (!r) return;
    if (r->source) r->source->close(r->source);
    free(r->path);
    free(r->text_field);
    free(r);
}
