// gzip decoding for ByteStream with zlib's streaming inflate. A .gz file may hold several
// members back to back (`cat a.gz b.gz > c.gz`, pigz, bgzip): after each member's end we
// start the next one until the file ends. A file that ends inside a member is truncated.
#include <stdlib.h>
#include <zlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/byte_stream.h"

typedef struct {
    z_stream zs;
    const char *path;
    int in_member;       // inside a member (its end not yet seen)
    int started;         // at least one member began
} GzipState;

static int gzip_decode(void *state, RawInput *in, uint8_t *buf, size_t cap, size_t *got) {
    GzipState *g = state;
    *got = 0;
    while (*got == 0) {
        SPES_TRY(raw_input_fill(in));
        size_t avail = in->len - in->pos;
        if (avail == 0) {   // end of file
            if (g->in_member || !g->started)
                return spes_fail("%s: truncated gzip data (the file ends inside a gzip member after %llu bytes)",
                                 g->path, (unsigned long long)in->consumed);
            return SPES_OK;
        }
        if (!g->in_member) {
            if (inflateReset(&g->zs) != Z_OK) return spes_fail("%s: zlib inflateReset failed", g->path);
            g->in_member = g->started = 1;
        }
        uInt in_chunk = avail > UINT32_MAX ? UINT32_MAX : (uInt)avail;
        uInt out_chunk = cap > UINT32_MAX ? UINT32_MAX : (uInt)cap;
        g->zs.next_in = in->buf + in->pos;
        g->zs.avail_in = in_chunk;
        g->zs.next_out = buf;
        g->zs.avail_out = out_chunk;
        int rc = inflate(&g->zs, Z_NO_FLUSH);
        raw_input_advance(in, in_chunk - g->zs.avail_in);
        *got = out_chunk - g->zs.avail_out;
        if (rc == Z_STREAM_END) {
            g->in_member = 0;
        } else if (rc == Z_BUF_ERROR) {
            // no progress possible with this input: more is needed (handled next loop)
        } else if (rc != Z_OK) {
            return spes_fail("%s: corrupt gzip data near byte %llu: %s", g->path, (unsigned long long)in->consumed,
                             g->zs.msg ? g->zs.msg : "inflate failed");
        }
    }
    return SPES_OK;
}

static void gzip_destroy(void *state) {
    GzipState *g = state;
    inflateEnd(&g->zs);
    free(g);
}

int gzip_decoder_create(const char *path, ByteDecoder *dec, void **state) {
    GzipState *g = spes_calloc(1, sizeof *g);
    if (!g) return SPES_ERR;
    g->path = path;
    if (inflateInit2(&g->zs, 15 + 16) != Z_OK) {   // 15-bit window, gzip wrapper only
        free(g);
        return spes_fail("%s: zlib inflateInit2 failed", path);
    }
    dec->decode = gzip_decode;
    dec->destroy = gzip_destroy;
    *state = g;
    return SPES_OK;
}
