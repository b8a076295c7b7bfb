// Lines out of a ByteStream. The buffer grows to hold the longest line, up to max_line; a
// longer line is read past in buffer-sized pieces (never held whole, never split into
// lines) and reported as LINE_READER_SKIPPED, so its caller can name it and go on.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "documents/byte_stream.h"

#define LINE_READER_MAX_LINE_BYTES ((size_t)256 << 20)   // 256 MiB: the largest max_line
#define LINE_READER_SKIPPED 2                             // line_reader_next: a line over max_line

typedef struct {
    ByteStream *stream;      // owned
    const char *path;
    uint8_t *buf;
    size_t cap;
    size_t start, end;       // unread bytes are buf[start, end)
    size_t scanned;          // buf[start, scanned) is known to hold no '\n'
    size_t max_line;         // may be lowered between calls (the buffer never grows past it + 1)
    int eof;
    int skipping;            // inside a line longer than max_line: reading past it
    uint64_t skipped;        // its bytes so far
    uint64_t line_no;        // 1-based number of the line last returned
} LineReader;

// Takes ownership of stream (closed by line_reader_close, also on failure).
int line_reader_init(LineReader *lr, ByteStream *stream, const char *path, size_t max_line);   // max_line <= LINE_READER_MAX_LINE_BYTES
// 1 with the line (without '\n' or a trailing '\r'), valid until the next call; 0 at the
// end; LINE_READER_SKIPPED for a line longer than max_line (*len its length, *line NULL,
// line_no its number); SPES_ERR on error.
int line_reader_next(LineReader *lr, const char **line, size_t *len);
void line_reader_close(LineReader *lr);
