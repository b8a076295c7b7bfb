// JSON lines (.jsonl, .jsonl.gz, .jsonl.zst): one object a line (json_field.h extracts the
// text field). Blank lines are skipped; a line that is not valid JSON, not an object, or
// whose text field is missing or not a string is reported (path:line) and skipped. A UTF-8
// byte order mark at the start of the file is ignored.
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/doc_source.h"
#include "documents/json_field.h"
#include "documents/line_reader.h"

typedef struct {
    DocSource base;
    LineReader lines;
    char *path;
    const char *text_field;
    DocReport *report;
    JsonScratch scratch;    // the current document when its JSON string has escapes
} JsonlSource;

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return 0;
    return 1;
}

static int jsonl_next(DocSource *base, const char **text, size_t *len) {
    JsonlSource *s = (JsonlSource *)base;
    for (;;) {
        const char *line;
        size_t n;
        s->lines.max_line = s->report->max_doc;   // set after open (doc_reader_set_max_doc_bytes)
        int rc = line_reader_next(&s->lines, &line, &n);
        if (rc == LINE_READER_SKIPPED) {   // read past, never held: n is its length
            doc_too_long(s->report, s->lines.line_no, "the line", n);
            continue;
        }
        if (rc != 1) return rc;
        if (s->lines.line_no == 1 && n >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3)) {   // UTF-8 byte order mark
            line += 3;
            n -= 3;
        }
        if (is_blank(line, n)) continue;
        char why[256];
        JsonFieldResult r = json_field_string(line, n, s->text_field, &s->scratch, text, len, why, sizeof why);
        if (r == JSON_FIELD_OK) return 1;
        if (r == JSON_FIELD_ERROR) return spes_fail_context("%s:%llu", s->path, (unsigned long long)s->lines.line_no);
        doc_report_malformed(s->report, s->lines.line_no, "%s", why);
    }
}

static uint64_t jsonl_bytes_read(const DocSource *base) {
    return byte_stream_file_bytes(((const JsonlSource *)base)->lines.stream);
}

static void jsonl_close(DocSource *base) {
    JsonlSource *s = (JsonlSource *)base;
    json_scratch_free(&s->scratch);
    line_reader_close(&s->lines);
    free(s->path);
    free(s);
}

int doc_source_jsonl_open(const char *path, ByteStreamKind kind, const char *text_field, DocReport *rep,
                          DocSource **out) {
    JsonlSource *s = spes_calloc(1, sizeof *s);
    if (!s) return SPES_ERR;
    s->base = (DocSource){jsonl_next, jsonl_bytes_read, jsonl_close};
    s->text_field = text_field;
    s->report = rep;
    s->path = spes_strdup(path);
    ByteStream *stream = NULL;
    if (!s->path || byte_stream_open(path, kind, &stream) != SPES_OK) {
        free(s->path);
        free(s);
        return SPES_ERR;
    }
    if (line_reader_init(&s->lines, stream, s->path, LINE_READER_MAX_LINE_BYTES) != SPES_OK) {
        free(s->path);
        free(s);
        return SPES_ERR;
    }
    *out = &s->base;
    return SPES_OK;
}
