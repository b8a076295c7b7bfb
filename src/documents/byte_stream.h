// Sequential bytes out of a file, decompressed on the fly: plain, gzip (multi-member, as
// `cat a.gz b.gz` produces) or zstd (any number of frames). Used by the line reader so
// that a 10 GB .jsonl.zst is streamed, never loaded whole.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct ByteStream ByteStream;

typedef enum { BYTE_STREAM_PLAIN = 0, BYTE_STREAM_GZIP, BYTE_STREAM_ZSTD } ByteStreamKind;

int byte_stream_open(const char *path, ByteStreamKind kind, ByteStream **out);
// Reads up to cap bytes: *got > 0, or *got == 0 at the end of the data. SPES_ERR on an I/O
// error or corrupt/truncated compressed data (message names the file and offset).
int byte_stream_read(ByteStream *s, uint8_t *buf, size_t cap, size_t *got);
// Bytes of the FILE consumed so far (compressed bytes for gzip/zstd): progress against
// the file size.
uint64_t byte_stream_file_bytes(const ByteStream *s);
void byte_stream_close(ByteStream *s);

// --- for the decoder implementations (byte_stream_gzip.c, byte_stream_zstd.c) ---------

// Buffered raw input from the file that a decoder pulls from.
typedef struct {
    FILE *fp;
    const char *path;
    uint8_t *buf;
    size_t cap, pos, len;    // unread bytes are buf[pos, len)
    uint64_t consumed;       // file bytes handed to the decoder so far
    int eof;
} RawInput;

// Refills when everything buffered was consumed; afterwards pos == len only at EOF.
int raw_input_fill(RawInput *in);
// Marks n buffered bytes consumed.
void raw_input_advance(RawInput *in, size_t n);

// A decoder: turns raw input into bytes. decode writes up to cap bytes and returns how
// many in *got (0 only at the end of the data).
typedef struct {
    int (*decode)(void *state, RawInput *in, uint8_t *buf, size_t cap, size_t *got);
    void (*destroy)(void *state);
} ByteDecoder;

int gzip_decoder_create(const char *path, ByteDecoder *dec, void **state);
int zstd_decoder_create(const char *path, ByteDecoder *dec, void **state);
