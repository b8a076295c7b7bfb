// .json: a top-level array of objects, e.g. [{"text": "..."}, {"text": "..."}]; a lone
// top-level object is one record (as in SPES's tokenize_data.py); objects one after
// another (JSON lines named .json) are read as JSON lines. The file is memory-
// mapped and walked one entry at a time: a small scanner finds where each entry ends
// (strings, escapes, nesting) and json_field.h parses just that entry, so a bad entry is
// reported by index and line and skipped. A file that ends inside the array is an error.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "documents/doc_source.h"
#include "documents/json_field.h"

typedef struct {
    DocSource base;
    MappedFile file;
    char *path;
    const char *text_field;
    DocReport *report;
    size_t pos;             // next unread byte
    uint64_t line;          // 1-based line of pos
    uint64_t index;         // index of the next entry
    int in_array;           // 0: a single top-level object
    int done;
    JsonScratch scratch;    // the current document when its JSON string has escapes
} JsonSource;

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void skip_space(JsonSource *s) {
    const char *b = (const char *)s->file.data;
    while (s->pos < s->file.size && is_space(b[s->pos])) {
        if (b[s->pos] == '\n') s->line++;
        s->pos++;
    }
}

// Walks JSON text from b[pos], honouring strings and escapes, and returns where it stops:
// at the first ',' or ']' at nesting depth 0 (stop_after_value == 0: the end of an array
// entry), or just after the object/array that starts at pos closes (stop_after_value ==
// 1). Returns size when the text ends first. Counts the newlines passed and the end of
// the last non-space byte.
static size_t scan_json(const char *b, size_t size, size_t pos, int stop_after_value, uint64_t *newlines,
                        size_t *last_nonspace) {
    uint64_t depth = 0;
    int in_string = 0;
    size_t i = pos;
    *last_nonspace = pos;
    for (; i < size; i++) {
        char c = b[i];
        if (c == '\n') (*newlines)++;
        if (in_string) {
            if (c == '\\') i++;    // the escaped character cannot end the string
            else if (c == '"') in_string = 0;
            *last_nonspace = i + 1;
            continue;
        }
        if (depth == 0 && (c == ',' || c == ']')) break;
        if (!is_space(c)) *last_nonspace = i + 1;
        if (c == '"') in_string = 1;
        else if (c == '[' || c == '{') depth++;
        else if ((c == ']' || c == '}') && depth > 0 && --depth == 0 && stop_after_value) return i + 1;
    }
    return i < size ? i : size;
}

// Advances s->pos to the ',' or ']' that ends the entry starting at s->pos. Returns the
// entry's length without trailing spaces; SPES_ERR when the file ends first.
static int scan_entry(JsonSource *s, size_t *entry_len) {
    size_t last_nonspace, start = s->pos;
    size_t end = scan_json((const char *)s->file.data, s->file.size, s->pos, 0, &s->line, &last_nonspace);
    if (end >= s->file.size)
        return spes_fail("%s: the JSON array is not closed (the file ends inside entry %llu, line %llu; truncated?)",
                         s->path, (unsigned long long)s->index, (unsigned long long)s->line);
    s->pos = end;
    *entry_len = last_nonspace - start;
    return SPES_OK;
}

// A file that starts with an object and has more after it is JSON lines under a .json
// name (what Hugging Face datasets' to_json writes by default).
static int is_json_lines(const JsonSource *s) {
    const char *b = (const char *)s->file.data;
    uint64_t newlines = 0;
    size_t last_nonspace;
    size_t end = scan_json(b, s->file.size, s->pos, 1, &newlines, &last_nonspace);
    while (end < s->file.size && is_space(b[end])) end++;
    return end < s->file.size;
}

// Decodes one entry; 1 with the text, 0 when it was malformed (reported), SPES_ERR.
static int decode_entry(JsonSource *s, const char *entry, size_t n, uint64_t line, const char **text, size_t *len) {
    uint64_t index = s->index++;
    if (n == 0) {
        doc_report_malformed(s->report, line, "entry %llu: empty entry", (unsigned long long)index);
        return 0;
    }
    char what[48];
    snprintf(what, sizeof what, "entry %llu", (unsigned long long)index);
    if (doc_too_long(s->report, line, what, n)) return 0;   // before decoding: its text is no longer
    char why[256];
    JsonFieldResult r = json_field_string(entry, n, s->text_field, &s->scratch, text, len, why, sizeof why);
    if (r == JSON_FIELD_OK) return 1;
    if (r == JSON_FIELD_ERROR) return spes_fail_context("%s: entry %llu", s->path, (unsigned long long)index);
    doc_report_malformed(s->report, line, "entry %llu: %s", (unsigned long long)index, why);
    return 0;
}

static int json_next(DocSource *base, const char **text, size_t *len) {
    JsonSource *s = (JsonSource *)base;
    const char *b = (const char *)s->file.data;
    while (!s->done) {
        skip_space(s);
        if (!s->in_array) {   // a single object: the rest of the file is the entry
            s->done = 1;
            uint64_t line = s->line;
            size_t start = s->pos;
            s->pos = s->file.size;
            return decode_entry(s, b + start, s->file.size - start, line, text, len);
        }
        if (s->pos >= s->file.size)
            return spes_fail("%s: the JSON array is not closed (truncated?)", s->path);
        if (b[s->pos] == ']') {   // end of the array: only whitespace may follow
            s->pos++;
            s->done = 1;
            skip_space(s);
            if (s->pos < s->file.size)
                return spes_fail("%s: unexpected data after the JSON array at line %llu", s->path,
                                 (unsigned long long)s->line);
            return 0;
        }
        uint64_t line = s->line;
        size_t start = s->pos, n = 0;
        SPES_TRY(scan_entry(s, &n));
        if (b[s->pos] == ',') s->pos++;
        int rc = decode_entry(s, b + start, n, line, text, len);
        if (rc != 0) return rc;
    }
    return 0;
}

static uint64_t json_bytes_read(const DocSource *base) { return ((const JsonSource *)base)->pos; }

static void json_close(DocSource *base) {
    JsonSource *s = (JsonSource *)base;
    json_scratch_free(&s->scratch);
    file_unmap(&s->file);
    free(s->path);
    free(s);
}

int doc_source_json_open(const char *path, const char *text_field, DocReport *rep, DocSource **out) {
    JsonSource *s = spes_calloc(1, sizeof *s);
    if (!s) return SPES_ERR;
    s->base = (DocSource){json_next, json_bytes_read, json_close};
    s->text_field = text_field;
    s->report = rep;
    s->line = 1;
    s->path = spes_strdup(path);
    if (!s->path || file_map(path, &s->file) != SPES_OK) {
        json_close(&s->base);
        return SPES_ERR;
    }
    const char *b = (const char *)s->file.data;
    if (s->file.size >= 3 && !memcmp(b, "\xEF\xBB\xBF", 3)) s->pos = 3;   // UTF-8 byte order mark
    skip_space(s);
    if (s->pos >= s->file.size) {
        s->done = 1;   // empty file: no documents
    } else if (b[s->pos] == '[') {
        s->in_array = 1;
        s->pos++;
    } else if (b[s->pos] != '{') {
        spes_fail("%s: expected a JSON array of objects (or one object), found '%c' at line %llu", path, b[s->pos],
                  (unsigned long long)s->line);
        json_close(&s->base);
        return SPES_ERR;
    } else if (is_json_lines(s)) {
        json_close(&s->base);
        return doc_source_jsonl_open(path, BYTE_STREAM_PLAIN, text_field, rep, out);
    }
    *out = &s->base;
    return SPES_OK;
}
