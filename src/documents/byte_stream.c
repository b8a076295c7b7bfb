// ByteStream: a file plus an optional decoder (see byte_stream.h).
#include "documents/byte_stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

#define RAW_INPUT_BYTES (1u << 20)

struct ByteStream {
    ByteStreamKind kind;
    RawInput in;
    ByteDecoder decoder;     // unused for plain files
    void *decoder_state;
    char *path;
};

int raw_input_fill(RawInput *in) {
    if (in->pos < in->len || in->eof) return SPES_OK;
    in->pos = in->len = 0;
    size_t n = fread(in->buf, 1, in->cap, in->fp);
    if (n < in->cap) {
        if (ferror(in->fp)) return spes_fail("read error on %s: %s", in->path, strerror(errno));
        if (n == 0) in->eof = 1;
    }
    in->len = n;
    return SPES_OK;
}

void raw_input_advance(RawInput *in, size_t n) {
    in->pos += n;
    in->consumed += n;
}

int byte_stream_open(const char *path, ByteStreamKind kind, ByteStream **out) {
    *out = NULL;
    ByteStream *s = spes_calloc(1, sizeof *s);
    if (!s) return SPES_ERR;
    s->kind = kind;
    s->path = spes_strdup(path);
    if (!s->path) goto fail;
    s->in.path = s->path;
    s->in.fp = fopen(path, "rb");
    if (!s->in.fp) {
        spes_fail("cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (kind != BYTE_STREAM_PLAIN) {
        s->in.cap = RAW_INPUT_BYTES;
        s->in.buf = spes_malloc(s->in.cap);
        if (!s->in.buf) goto fail;
        int rc = kind == BYTE_STREAM_GZIP ? gzip_decoder_create(path, &s->decoder, &s->decoder_state)
                                          : zstd_decoder_create(path, &s->decoder, &s->decoder_state);
        if (rc != SPES_OK) goto fail;
    }
    *out = s;
    return SPES_OK;
fail:
    byte_stream_close(s);
    return SPES_ERR;
}

int byte_stream_read(ByteStream *s, uint8_t *buf, size_t cap, size_t *got) {
    *got = 0;
    if (s->kind != BYTE_STREAM_PLAIN) return s->decoder.decode(s->decoder_state, &s->in, buf, cap, got);
    size_t n = fread(buf, 1, cap, s->in.fp);
    if (n < cap && ferror(s->in.fp)) return spes_fail("read error on %s: %s", s->path, strerror(errno));
    s->in.consumed += n;
    *got = n;
    return SPES_OK;
}

uint64_t byte_stream_file_bytes(const ByteStream *s) { return s->in.consumed; }

void byte_stream_close(ByteStream *s) {
    if (!s) return;
    if (s->decoder_state) s->decoder.destroy(s->decoder_state);
    if (s->in.fp) fclose(s->in.fp);
    free(s->in.buf);
    free(s->path);
    free(s);
}
