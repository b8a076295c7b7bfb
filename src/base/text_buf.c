#include "base/text_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

void text_buf_init(TextBuf *b) { memset(b, 0, sizeof *b); }

void text_buf_free(TextBuf *b) {
    free(b->data);
    text_buf_init(b);
}

// Room for len more bytes and the NUL.
static bool reserve(TextBuf *b, size_t len) {
    if (b->failed)
        return false;
    if (len > ((size_t)-1) / 2 - b->len) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + len + 1;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void text_buf_append(TextBuf *b, const char *s, size_t len) {
    if (!reserve(b, len))
        return;
    memcpy(b->data + b->len, s, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void text_buf_puts(TextBuf *b, const char *s) { text_buf_append(b, s, strlen(s)); }

void text_buf_printf(TextBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n)) {
        b->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void text_buf_html(TextBuf *b, const char *s) {
    for (const char *run = s;; s++) {
        const char *ref = NULL;
        switch (*s) {
        case '&': ref = "&amp;"; break;
        case '<': ref = "&lt;"; break;
        case '>': ref = "&gt;"; break;
        case '"': ref = "&quot;"; break;
        case '\'': ref = "&#39;"; break;
        case '\0': text_buf_append(b, run, (size_t)(s - run)); return;
        default: continue;
        }
        text_buf_append(b, run, (size_t)(s - run));
        text_buf_puts(b, ref);
        run = s + 1;
    }
}

char *text_buf_take(TextBuf *b, size_t *len) {
    if (b->failed || !reserve(b, 0)) {
        text_buf_free(b);
        spes_fail("out of memory building a text document");
        return NULL;
    }
    char *out = b->data;
    if (len)
        *len = b->len;
    text_buf_init(b);
    return out;
}
