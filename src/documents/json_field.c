// Single-pass strict JSON parser that keeps one string field (see json_field.h).
#include "documents/json_field.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "base/alloc.h"
#include "base/error.h"

typedef enum { V_STRING, V_NUMBER, V_OBJECT, V_ARRAY, V_BOOL, V_NULL } ValueType;

static const char *type_name(ValueType t) {
    static const char *const names[] = {"a string", "a number", "an object", "an array", "a boolean", "null"};
    return names[t];
}

typedef struct {
    const unsigned char *start, *end;   // bytes between the quotes
    int escaped;                        // contains backslash escapes
    int lone_surrogate;                 // an escape decodes to a lone surrogate (not UTF-8-encodable)
} RawString;

typedef struct {
    const unsigned char *base, *p, *end;
    int depth;
    const char *error;                  // first problem (static text)
    size_t error_at;
    const char *field;
    size_t field_len;
    JsonScratch *scratch;
    int found, alloc_failed;            // top-level field seen (last one wins)
    ValueType found_type;
    RawString found_string;
} Parser;

static int fail(Parser *ps, const unsigned char *at, const char *what) {
    if (!ps->error) {
        ps->error = what;
        ps->error_at = (size_t)(at - ps->base);
    }
    return 0;
}

static void skip_space(Parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

// Length of the valid UTF-8 sequence at p (RFC 3629: no overlongs, no surrogates,
// at most U+10FFFF), or 0.
static int utf8_length(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    int n;
    unsigned lo = 0x80, hi = 0xBF;   // allowed range of the second byte
    if (c < 0xC2) return 0;
    else if (c < 0xE0) n = 2;
    else if (c < 0xF0) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c < 0xF5) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (end - p < n || p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    return n;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        v = v << 4 | d;
    }
    *out = v;
    return 1;
}

// A \uXXXX escape at p (p[0] == 'u'), joined with the low surrogate that follows a high
// one. Returns the bytes consumed (5 or 11) and the code point, or 0 for bad hex digits.
// A lone surrogate comes back as itself (0xD800..0xDFFF), as Python's json allows.
static int unicode_escape(const unsigned char *p, const unsigned char *end, unsigned *cp) {
    unsigned hi, lo;
    if (end - p < 5 || !hex4(p + 1, &hi)) return 0;
    *cp = hi;
    if (hi < 0xD800 || hi > 0xDBFF) return 5;
    if (end - p < 11 || p[5] != '\\' || p[6] != 'u' || !hex4(p + 7, &lo) || lo < 0xDC00 || lo > 0xDFFF) return 5;
    *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    return 11;
}

static int is_surrogate(unsigned cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

// Skips bytes that need no attention inside a string: ASCII from 0x20, except '"' and '\'.
static const unsigned char *skip_plain(const unsigned char *p, const unsigned char *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        // Signed compare: bytes >= 0x80 are negative, so "< 0x20" also catches them.
        __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                       _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(special);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
    return p;
}

// ps->p at the opening quote; leaves it after the closing one.
static int scan_string(Parser *ps, RawString *out) {
    const unsigned char *p = ps->p + 1, *end = ps->end;
    int escaped = 0, lone = 0;
    for (;;) {
        p = skip_plain(p, end);
        if (p >= end) return fail(ps, ps->p, "unterminated string");
        unsigned c = *p;
        if (c == '"') break;
        if (c == '\\') {
            escaped = 1;
            if (p + 1 >= end) return fail(ps, p, "unterminated string");
            unsigned cp;
            int n;
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't': p += 2; break;
            case 'u':
                n = unicode_escape(p + 1, end, &cp);
                if (!n) return fail(ps, p, "invalid \\u escape");
                lone |= is_surrogate(cp);
                p += 1 + n;
                break;
            default: return fail(ps, p, "invalid escape in string");
            }
        } else if (c < 0x20) {
            return fail(ps, p, "control character inside a string");
        } else {
            int n = utf8_length(p, end);
            if (!n) return fail(ps, p, "invalid UTF-8 in string");
            p += n;
        }
    }
    out->start = ps->p + 1;
    out->end = p;
    out->escaped = escaped;
    out->lone_surrogate = lone;
    ps->p = p + 1;
    return 1;
}

// Unescapes s (without lone surrogates) into scratch; the result is never longer than
// the escaped text.
static int unescape(Parser *ps, const RawString *s, const char **text, size_t *len) {
    size_t need = (size_t)(s->end - s->start) + 1;
    if (need > ps->scratch->cap) {
        char *grown = spes_realloc(ps->scratch->data, need);
        if (!grown) {
            ps->alloc_failed = 1;
            return 0;
        }
        ps->scratch->data = grown;
        ps->scratch->cap = need;
    }
    char *out = ps->scratch->data;
    size_t n = 0;
    for (const unsigned char *p = s->start; p < s->end;) {
        if (*p != '\\') {
            out[n++] = (char)*p++;
            continue;
        }
        unsigned cp = 0;
        switch (p[1]) {
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': break;
        default: cp = p[1]; break;   // " \ /
        }
        if (p[1] != 'u') {
            out[n++] = (char)cp;
            p += 2;
            continue;
        }
        p += 1 + unicode_escape(p + 1, s->end, &cp);   // validated by scan_string
        if (cp < 0x80) out[n++] = (char)cp;
        else if (cp < 0x800) {
            out[n++] = (char)(0xC0 | cp >> 6);
            out[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[n++] = (char)(0xE0 | cp >> 12);
            out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[n++] = (char)(0xF0 | cp >> 18);
            out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    *text = out;
    *len = n;
    return 1;
}

static int is_digit(const unsigned char *p, const unsigned char *end) { return p < end && *p >= '0' && *p <= '9'; }

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
static int scan_number(Parser *ps) {
    const unsigned char *p = ps->p, *end = ps->end, *start = ps->p;
    if (p < end && *p == '-') p++;
    if (p < end && *p == '0') p++;
    else if (is_digit(p, end)) while (is_digit(p, end)) p++;
    else return fail(ps, start, "invalid value");
    if (p < end && *p == '.') {
        p++;
        if (!is_digit(p, end)) return fail(ps, p, "digits expected after '.'");
        while (is_digit(p, end)) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (!is_digit(p, end)) return fail(ps, p, "digits expected in exponent");
        while (is_digit(p, end)) p++;
    }
    ps->p = p;
    return 1;
}

static int scan_word(Parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return fail(ps, ps->p, "invalid value");
    ps->p += n;
    return 1;
}

static int key_matches(Parser *ps, const RawString *key) {
    if (key->lone_surrogate) return 0;   // cannot equal a UTF-8 field name
    if (!key->escaped) return (size_t)(key->end - key->start) == ps->field_len && !memcmp(key->start, ps->field, ps->field_len);
    const char *text;
    size_t len;
    if (!unescape(ps, key, &text, &len)) return 0;
    return len == ps->field_len && !memcmp(text, ps->field, len);
}

static int scan_value(Parser *ps, ValueType *type, RawString *str);

// Objects and arrays: `is_object` selects the grammar. Records the wanted field when
// this is the top-level object.
static int scan_container(Parser *ps, int is_object) {
    if (++ps->depth > JSON_FIELD_MAX_DEPTH) return fail(ps, ps->p, "nesting too deep");
    int top = ps->depth == 1;
    char close = is_object ? '}' : ']';
    ps->p++;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return 1;
    }
    for (;;) {
        int wanted = 0;
        if (is_object) {
            RawString key;
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, ps->p, "object key expected");
            if (!scan_string(ps, &key)) return 0;
            wanted = top && key_matches(ps, &key);
            if (ps->alloc_failed) return 0;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, ps->p, "':' expected after an object key");
            ps->p++;
            skip_space(ps);
        }
        ValueType type;
        RawString str;
        if (!scan_value(ps, &type, &str)) return 0;
        if (wanted) {
            ps->found = 1;
            ps->found_type = type;
            ps->found_string = str;
        }
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            skip_space(ps);
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            ps->depth--;
            return 1;
        }
        return fail(ps, ps->p, is_object ? "',' or '}' expected" : "',' or ']' expected");
    }
}

static int scan_value(Parser *ps, ValueType *type, RawString *str) {
    if (ps->p >= ps->end) return fail(ps, ps->p, "value expected");
    switch (*ps->p) {
    case '"': *type = V_STRING; return scan_string(ps, str);
    case '{': *type = V_OBJECT; return scan_container(ps, 1);
    case '[': *type = V_ARRAY; return scan_container(ps, 0);
    case 't': *type = V_BOOL; return scan_word(ps, "true");
    case 'f': *type = V_BOOL; return scan_word(ps, "false");
    case 'n': *type = V_NULL; return scan_word(ps, "null");
    default: *type = V_NUMBER; return scan_number(ps);
    }
}

JsonFieldResult json_field_string(const char *json, size_t len, const char *field, JsonScratch *scratch,
                                  const char **text, size_t *text_len, char *why, size_t why_cap) {
    Parser ps = {.base = (const unsigned char *)json, .p = (const unsigned char *)json,
                 .end = (const unsigned char *)json + len, .field = field, .field_len = strlen(field),
                 .scratch = scratch};
    ValueType type;
    RawString str;
    skip_space(&ps);
    int ok = scan_value(&ps, &type, &str);
    if (ok) {
        skip_space(&ps);
        if (ps.p < ps.end) ok = fail(&ps, ps.p, "unexpected data after the value");
    }
    if (ps.alloc_failed) return JSON_FIELD_ERROR;
    if (!ok) {
        snprintf(why, why_cap, "invalid JSON at byte %zu: %s", ps.error_at + 1, ps.error);
        return JSON_FIELD_MALFORMED;
    }
    if (type != V_OBJECT) {
        snprintf(why, why_cap, "record is %s, not a JSON object", type_name(type));
        return JSON_FIELD_MALFORMED;
    }
    if (!ps.found) {
        snprintf(why, why_cap, "no field '%s'", field);
        return JSON_FIELD_MALFORMED;
    }
    if (ps.found_type != V_STRING) {
        snprintf(why, why_cap, "field '%s' is %s, not a string", field, type_name(ps.found_type));
        return JSON_FIELD_MALFORMED;
    }
    if (ps.found_string.lone_surrogate) {
        snprintf(why, why_cap, "field '%s' contains a lone UTF-16 surrogate escape (not encodable as UTF-8)", field);
        return JSON_FIELD_MALFORMED;
    }
    if (!ps.found_string.escaped) {
        *text = (const char *)ps.found_string.start;
        *text_len = (size_t)(ps.found_string.end - ps.found_string.start);
        return JSON_FIELD_OK;
    }
    return unescape(&ps, &ps.found_string, text, text_len) ? JSON_FIELD_OK : JSON_FIELD_ERROR;
}

void json_scratch_free(JsonScratch *s) {
    free(s->data);
    s->data = NULL;
    s->cap = 0;
}
