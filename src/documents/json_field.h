// The string value of one field of one JSON object, for the .jsonl and .json readers.
//
// Why not jansson's json_loadb per line (our first version): it builds the whole object
// tree and lexes through a per-character callback, which measured ~30 MB/s of text on
// this box, slower than the tokenizer it feeds. This is a strict single-pass RFC 8259
// parser that validates the entire record (grammar, UTF-8, escapes, surrogate pairs,
// nesting up to JSON_FIELD_MAX_DEPTH) but materialises only the wanted string: zero-copy
// when it has no escapes. Like Python's json.loads: numbers of any size are accepted, a
// repeated key's last value wins, lone UTF-16 surrogate escapes (\ud800 alone) are legal
// JSON — but a text field holding one is malformed, since it cannot be encoded as UTF-8
// (SPES's script fails on it at tokenization). Unlike Python, NaN/Infinity are rejected.
#pragma once
#include <stddef.h>

#define JSON_FIELD_MAX_DEPTH 512

// Reusable buffer for strings that contain escapes.
typedef struct {
    char *data;
    size_t cap;
} JsonScratch;

typedef enum {
    JSON_FIELD_OK = 0,        // *text/*len set (into the input, or into scratch)
    JSON_FIELD_MALFORMED,     // why holds the reason (invalid JSON, not an object, field missing or not a string)
    JSON_FIELD_ERROR,         // out of memory (message set)
} JsonFieldResult;

JsonFieldResult json_field_string(const char *json, size_t len, const char *field, JsonScratch *scratch,
                                  const char **text, size_t *text_len, char *why, size_t why_cap);
void json_scratch_free(JsonScratch *s);
