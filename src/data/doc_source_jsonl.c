// JSON lines (.jsonl, .jsonl.gz, .jsonl.zst): one object a line, decoded with jansson.
// Blank lines are skipped; a line that is not valid JSON, not an object, or whose text
// field is missing or not a string is reported (path:line) and skipped.
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "data/doc_source.h"
#include "data/line_reader.h"

typedef struct {
    DocSource base;
    LineReader lines;
    char *path;
    const char *text_field;
    DocReport *report;
    json_t *record;         // keeps the current document's text alive
} JsonlSource;

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

const char *doc_json_text(json_t *record, const char *text_field, size_t *len, char *why, size_t why_cap) {
    if (!json_is_object(record)) {
        snprintf(why, why_cap, "record is %s, not a JSON object", json_type_name(record));
        return NULL;
    }
    json_t *value = json_object_get(record, text_field);
    if (!value) {
        snprintf(why, why_cap, "no field '%s'", text_field);
        return NULL;
    }
    if (!json_is_string(value)) {
        snprintf(why, why_cap, "field '%s' is %s, not a string", text_field, json_type_name(value));
        return NULL;
    }
    *len = json_string_length(value);
    return json_string_value(value);
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return 0;
    return 1;
}

static int jsonl_next(DocSource *base, const char **text, size_t *len) {
    JsonlSource *s = (JsonlSource *)base;
    json_decref(s->record);
    s->record = NULL;
    for (;;) {
        const char *line;
        size_t n;
        int rc = line_reader_next(&s->lines, &line, &n);
        if (rc != 1) return rc;
        if (is_blank(line, n)) continue;
        json_error_t err;
        json_t *record = json_loadb(line, n, JSON_ALLOW_NUL, &err);
        if (!record) {
            doc_report_malformed(s->report, s->lines.line_no, "invalid JSON at column %d: %s", err.column, err.text);
            continue;
        }
        char why[256];
        const char *t = doc_json_text(record, s->text_field, len, why, sizeof why);
        if (!t) {
            doc_report_malformed(s->report, s->lines.line_no, "%s", why);
            json_decref(record);
            continue;
        }
        s->record = record;
        *text = t;
        return 1;
    }
}

static uint64_t jsonl_bytes_read(const DocSource *base) {
    return byte_stream_file_bytes(((const JsonlSource *)base)->lines.stream);
}

static void jsonl_close(DocSource *base) {
    JsonlSource *s = (JsonlSource *)base;
    json_decref(s->record);
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
