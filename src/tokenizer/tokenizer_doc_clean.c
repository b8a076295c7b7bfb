#include "tokenizer/tokenizer_doc_clean.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

// The characters Python's str.isspace() accepts, as UTF-8: \t\n\v\f\r, \x1c-\x1f, space, U+0085,
// U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
static size_t space_at_start(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
    if (n >= 2 && c == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n < 3) return 0;
    if (c == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3;
    if (c == 0xE2 && s[1] == 0x80 && (s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF) && s[2] >= 0x80)
        return 3;
    if (c == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3;
    if (c == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3;
    return 0;
}

static size_t space_at_end(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (space_at_start(s + n - k, k) == k) return k;
    return 0;
}

int doc_clean(DocCleanScratch *sc, const char *text, size_t len, const char **out, size_t *out_len) {
    const uint8_t *s = (const uint8_t *)text;
    size_t k;
    while ((k = space_at_start(s, len))) s += k, len -= k;
    while ((k = space_at_end(s, len))) len -= k;
    if (len == 0) return 0;
    static const char marker[] = "<extra_id_1>";
    const size_t mlen = sizeof marker - 1;
    const char *p = (const char *)s;
    if (!memmem(p, len, marker, mlen)) {
        *out = p;
        *out_len = len;
        return 1;
    }
    if (len > sc->cap) {
        char *grown = spes_realloc(sc->buf, len);
        if (!grown) return SPES_ERR;
        sc->buf = grown;
        sc->cap = len;
    }
    size_t n = 0, i = 0;
    const char *hit;
    while ((hit = memmem(p + i, len - i, marker, mlen))) {
        memcpy(sc->buf + n, p + i, (size_t)(hit - (p + i)));
        n += (size_t)(hit - (p + i));
        i = (size_t)(hit - p) + mlen;
    }
    memcpy(sc->buf + n, p + i, len - i);
    n += len - i;
    *out = sc->buf;
    *out_len = n;
    return 1;
}

void doc_clean_free(DocCleanScratch *s) {
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}
