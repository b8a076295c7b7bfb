#include "base/printable.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

// Length of the valid, printable UTF-8 sequence at s (1..4), or 0: an ASCII control, DEL, a C1
// control (U+0080..U+009F), an overlong form, a surrogate or a truncated sequence.
static size_t printable_char(const unsigned char *s, size_t avail) {
    unsigned c = s[0];
    if (c < 0x80) return c >= 0x20 && c != 0x7f ? 1 : 0;
    size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (n == 0 || n > avail) return 0;
    uint32_t cp = c & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return cp >= 0x80 && cp <= 0x9F ? 0 : n;
}

bool is_printable(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t n = printable_char(p + i, len - i);
        if (n == 0 || p[i] == '\\') return false;
        i += n;
    }
    return true;
}

char *escape_printable(const char *s, size_t len, char *out, size_t cap) {
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, limit = cap - 4;   // room for "..." and the NUL
    for (size_t i = 0; i < len;) {
        char piece[8];
        size_t n = printable_char(p + i, len - i), plen;
        if (p[i] == '\\') plen = (size_t)snprintf(piece, sizeof piece, "\\\\"), n = 1;
        else if (p[i] == '\n') plen = (size_t)snprintf(piece, sizeof piece, "\\n"), n = 1;
        else if (p[i] == '\t') plen = (size_t)snprintf(piece, sizeof piece, "\\t"), n = 1;
        else if (p[i] == '\r') plen = (size_t)snprintf(piece, sizeof piece, "\\r"), n = 1;
        else if (n == 0) plen = (size_t)snprintf(piece, sizeof piece, "\\x%02x", p[i]), n = 1;
        else memcpy(piece, p + i, n), plen = n;
        if (o + plen > limit) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(out + o, piece, plen);
        o += plen;
        i += n;
    }
    out[o] = '\0';
    return out;
}
