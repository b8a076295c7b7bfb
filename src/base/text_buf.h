// A growable text buffer for documents built piece by piece (the status page's HTML and SVG).
// Appends never fail loudly: the first allocation failure marks the buffer failed, later
// appends do nothing, and text_buf_take reports it once.
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *data;                 // NUL-terminated while not failed
    size_t len, cap;
    bool failed;                // out of memory at some append
} TextBuf;

void text_buf_init(TextBuf *b);
void text_buf_free(TextBuf *b);
void text_buf_append(TextBuf *b, const char *s, size_t len);
void text_buf_puts(TextBuf *b, const char *s);
void text_buf_printf(TextBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// s with & < > " ' written as character references: safe inside HTML text and quoted attributes.
void text_buf_html(TextBuf *b, const char *s);
// The text (caller frees) and its length; NULL (spes_fail: out of memory) when an append failed.
// The buffer is empty afterwards.
char *text_buf_take(TextBuf *b, size_t *len);
