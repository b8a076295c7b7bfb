// Line splitting over a ByteStream (see line_reader.h).
#include "documents/line_reader.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

#define LINE_READER_INITIAL_BYTES ((size_t)1 << 20)

int line_reader_init(LineReader *lr, ByteStream *stream, const char *path, size_t max_line) {
    memset(lr, 0, sizeof *lr);
    lr->stream = stream;
    lr->path = path;
    lr->max_line = max_line;
    lr->cap = LINE_READER_INITIAL_BYTES < max_line + 1 ? LINE_READER_INITIAL_BYTES : max_line + 1;
    lr->buf = spes_malloc(lr->cap);
    if (!lr->buf) {
        line_reader_close(lr);
        return SPES_ERR;
    }
    return SPES_OK;
}

// Makes room for more input: moves unread bytes to the front, grows when they fill the
// buffer. *full: the unread bytes are one line longer than max_line (the caller reads past it).
static int make_room(LineReader *lr, int *full) {
    *full = 0;
    if (lr->start > 0) {
        size_t n = lr->end - lr->start;
        memmove(lr->buf, lr->buf + lr->start, n);
        lr->scanned -= lr->start;
        lr->end = n;
        lr->start = 0;
    }
    if (lr->end < lr->cap && lr->end <= lr->max_line) return SPES_OK;
    if (lr->end > lr->max_line) return *full = 1, SPES_OK;
    size_t new_cap = lr->cap * 2 > lr->max_line + 1 ? lr->max_line + 1 : lr->cap * 2;
    uint8_t *nb = spes_realloc(lr->buf, new_cap);
    if (!nb) return spes_fail_context("%s: line %llu", lr->path, (unsigned long long)lr->line_no + 1);
    lr->buf = nb;
    lr->cap = new_cap;
    return SPES_OK;
}

// The end of the line being read past: 1 when found (the bytes after it stay buffered).
static int skip_to_newline(LineReader *lr) {
    uint8_t *nl = lr->end > lr->start ? memchr(lr->buf + lr->start, '\n', lr->end - lr->start) : NULL;
    size_t upto = nl ? (size_t)(nl - lr->buf) : lr->end;
    lr->skipped += upto - lr->start;
    lr->start = lr->scanned = nl ? upto + 1 : lr->end;
    return nl != NULL;
}

int line_reader_next(LineReader *lr, const char **line, size_t *len) {
    for (;;) {
        if (lr->skipping) {
            if (skip_to_newline(lr) || (lr->eof && lr->start == lr->end)) {
                lr->skipping = 0;
                lr->line_no++;
                *line = NULL;
                *len = (size_t)lr->skipped;
                return LINE_READER_SKIPPED;
            }
        } else {
            uint8_t *nl = lr->scanned < lr->end ? memchr(lr->buf + lr->scanned, '\n', lr->end - lr->scanned) : NULL;
            if (nl || (lr->eof && lr->start < lr->end)) {
                size_t line_end = nl ? (size_t)(nl - lr->buf) : lr->end;
                *line = (const char *)lr->buf + lr->start;
                *len = line_end - lr->start;
                if (*len > 0 && (*line)[*len - 1] == '\r') (*len)--;
                lr->start = lr->scanned = nl ? line_end + 1 : lr->end;
                lr->line_no++;
                if (*len <= lr->max_line) return 1;
                *line = NULL;   // whole in the buffer, yet over a max_line lowered since
                return LINE_READER_SKIPPED;
            }
            if (lr->eof) return 0;
            lr->scanned = lr->end;
        }
        int full = 0;
        SPES_TRY(make_room(lr, &full));
        if (full && !lr->skipping) {   // no newline within max_line + 1 bytes: read past the line
            lr->skipping = 1;
            lr->skipped = 0;
            continue;
        }
        if (lr->skipping) lr->start = lr->end = lr->scanned = 0;   // (skip_to_newline consumed it all)
        size_t got;
        SPES_TRY(byte_stream_read(lr->stream, lr->buf + lr->end, lr->cap - lr->end, &got));
        if (got == 0) lr->eof = 1;
        lr->end += got;
    }
}

void line_reader_close(LineReader *lr) {
    byte_stream_close(lr->stream);
    free(lr->buf);
    memset(lr, 0, sizeof *lr);
}
