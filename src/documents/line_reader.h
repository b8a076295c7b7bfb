// Lines out of a ByteStream. The buffer grows to hold the longest line, up to a cap;
// a longer line is an error naming the file and line (not silently split).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "documents/byte_stream.h"

#define LINE_READER_MAX_LINE_BYTES ((size_t)256 << 20)   // 256 MiB

typedef struct {
    ByteStream *stream;      // owned
    const char *path;
    uint8_t *buf;
    size_t cap;
    size_t start, end;       // unread bytes are buf[start, end)
    size_t scanned;          // buf[start, scanned) is known to hold no '\n'
    size_t max_line;
    int eof;
    uint64_t line_no;        // 1-based number of the line last returned
} LineReader;

// Takes ownership of stream (closed by line_reader_close, also on failure).
int line_reader_init(LineReader *lr, ByteStream *stream, const char *path, size_t max_line);
// 1 with the line (without '\n' or a trailing '\r'), valid until the next call; 0 at the
// end; SPES_ERR on error.
int line_reader_next(LineReader *lr, const char **line, size_t *len);
void line_reader_close(LineReader *lr);
