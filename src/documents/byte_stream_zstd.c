// zstd decoding for ByteStream with libzstd's streaming API, which walks through any
// number of frames (and skippable frames) by itself. ZSTD_decompressStream returns 0
// exactly when a frame is complete; a file that ends when it is not is truncated.
#include <stdlib.h>
#include <zstd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/byte_stream.h"

typedef struct {
    ZSTD_DCtx *dctx;
    const char *path;
    size_t frame_hint;      // last return of ZSTD_decompressStream: 0 = between frames
    int started;
} ZstdState;

static int zstd_decode(void *state, RawInput *in, uint8_t *buf, size_t cap, size_t *got) {
    ZstdState *z = state;
    *got = 0;
    while (*got == 0) {
        SPES_TRY(raw_input_fill(in));
        size_t avail = in->len - in->pos;
        if (avail == 0) {
            // Output may still be buffered inside the context when the hint is non-zero;
            // flushing with no input tells us.
            if (z->frame_hint != 0 && z->started) {
                ZSTD_inBuffer ib = {NULL, 0, 0};
                ZSTD_outBuffer ob = {buf, cap, 0};
                size_t rc = ZSTD_decompressStream(z->dctx, &ob, &ib);
                if (ZSTD_isError(rc))
                    return spes_fail("%s: corrupt zstd data: %s", z->path, ZSTD_getErrorName(rc));
                z->frame_hint = rc;
                *got = ob.pos;
                if (ob.pos) return SPES_OK;
            }
            if (!z->started || z->frame_hint != 0)
                return spes_fail("%s: truncated zstd data (the file ends inside a frame after %llu bytes)", z->path,
                                 (unsigned long long)in->consumed);
            return SPES_OK;
        }
        z->started = 1;
        ZSTD_inBuffer ib = {in->buf + in->pos, avail, 0};
        ZSTD_outBuffer ob = {buf, cap, 0};
        size_t rc = ZSTD_decompressStream(z->dctx, &ob, &ib);
        if (ZSTD_isError(rc))
            return spes_fail("%s: corrupt zstd data near byte %llu: %s", z->path,
                             (unsigned long long)(in->consumed + ib.pos), ZSTD_getErrorName(rc));
        raw_input_advance(in, ib.pos);
        z->frame_hint = rc;
        *got = ob.pos;
    }
    return SPES_OK;
}

static void zstd_destroy(void *state) {
    ZstdState *z = state;
    ZSTD_freeDCtx(z->dctx);
    free(z);
}

int zstd_decoder_create(const char *path, ByteDecoder *dec, void **state) {
    ZstdState *z = spes_calloc(1, sizeof *z);
    if (!z) return SPES_ERR;
    z->path = path;
    z->dctx = ZSTD_createDCtx();
    if (!z->dctx) {
        free(z);
        return spes_fail("%s: cannot create a zstd decompression context", path);
    }
    dec->decode = zstd_decode;
    dec->destroy = zstd_destroy;
    *state = z;
    return SPES_OK;
}
