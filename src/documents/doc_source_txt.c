// .txt: the whole file is one document, served straight from a read-only mapping (no copy;
// the text is not validated here). A file larger than the limit per document is skipped.
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "documents/doc_source.h"

typedef struct {
    DocSource base;
    MappedFile file;
    DocReport *report;
    int served;
} TxtSource;

static int txt_next(DocSource *base, const char **text, size_t *len) {
    TxtSource *s = (TxtSource *)base;
    if (s->served) return 0;
    s->served = 1;
    if (doc_too_long(s->report, 0, "the file (one document)", s->file.size)) return 0;
    *text = s->file.data ? (const char *)s->file.data : "";
    *len = s->file.size;
    return 1;
}

static uint64_t txt_bytes_read(const DocSource *base) {
    const TxtSource *s = (const TxtSource *)base;
    return s->served ? s->file.size : 0;
}

static void txt_close(DocSource *base) {
    TxtSource *s = (TxtSource *)base;
    file_unmap(&s->file);
    free(s);
}

int doc_source_txt_open(const char *path, DocReport *rep, DocSource **out) {
    TxtSource *s = spes_calloc(1, sizeof *s);
    if (!s) return SPES_ERR;
    s->base = (DocSource){txt_next, txt_bytes_read, txt_close};
    s->report = rep;
    if (file_map(path, &s->file) != SPES_OK) {
        free(s);
        return SPES_ERR;
    }
    *out = &s->base;
    return SPES_OK;
}
