// .parquet: the documents are the non-null values of the string column named by the text
// field (see parquet_reader.h). Nulls are skipped silently, not counted as malformed:
// SPES's tokenize_data.py skips them the same way.
#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/doc_source.h"
#include "documents/parquet_reader.h"

typedef struct {
    DocSource base;
    ParquetStringReader *reader;
    DocReport *report;
    uint64_t index;   // values served or skipped, for the message of one that is too long
} ParquetSource;

static int parquet_next(DocSource *base, const char **text, size_t *len) {
    ParquetSource *s = (ParquetSource *)base;
    for (;;) {
        const uint8_t *data;
        int rc = parquet_string_reader_next(s->reader, &data, len);
        if (rc != 1) return rc;
        char what[48];
        snprintf(what, sizeof what, "document %llu", (unsigned long long)++s->index);
        if (doc_too_long(s->report, 0, what, *len)) continue;   // a row has no line
        *text = (const char *)data;
        return 1;
    }
}

static uint64_t parquet_bytes_read(const DocSource *base) {
    return parquet_string_reader_bytes_read(((const ParquetSource *)base)->reader);
}

static void parquet_close(DocSource *base) {
    ParquetSource *s = (ParquetSource *)base;
    parquet_string_reader_close(s->reader);
    free(s);
}

int doc_source_parquet_open(const char *path, const char *text_field, DocReport *rep, DocSource **out) {
    ParquetSource *s = spes_calloc(1, sizeof *s);
    if (!s) return SPES_ERR;
    s->base = (DocSource){parquet_next, parquet_bytes_read, parquet_close};
    s->report = rep;
    if (parquet_string_reader_open(path, text_field, &s->reader) != SPES_OK) {
        free(s);
        return SPES_ERR;
    }
    *out = &s->base;
    return SPES_OK;
}
