// .parquet: the documents are the non-null values of the string column named by the text
// field (see parquet_reader.h). Nulls are skipped silently, not counted as malformed:
// SPES's tokenize_data.py skips them the same way.
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/doc_source.h"
#include "documents/parquet_reader.h"

typedef struct {
    DocSource base;
    ParquetStringReader *reader;
} ParquetSource;

static int parquet_next(DocSource *base, const char **text, size_t *len) {
    const uint8_t *data;
    int rc = parquet_string_reader_next(((ParquetSource *)base)->reader, &data, len);
    if (rc == 1) *text = (const char *)data;
    return rc;
}

static uint64_t parquet_bytes_read(const DocSource *base) {
    return parquet_string_reader_bytes_read(((const ParquetSource *)base)->reader);
}

static void parquet_close(DocSource *base) {
    ParquetSource *s = (ParquetSource *)base;
    parquet_string_reader_close(s->reader);
    free(s);
}

int doc_source_parquet_open(const char *path, const char *text_field, DocSource **out) {
    ParquetSource *s = spes_calloc(1, sizeof *s);
    if (!s) return SPES_ERR;
    s->base = (DocSource){parquet_next, parquet_bytes_read, parquet_close};
    if (parquet_string_reader_open(path, text_field, &s->reader) != SPES_OK) {
        free(s);
        return SPES_ERR;
    }
    *out = &s->base;
    return SPES_OK;
}
