// Parquet page codecs (see parquet_codec.h).
#include "documents/parquet_codec.h"

#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include "base/error.h"
#include "documents/parquet_meta.h"

static int decompress_snappy(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len) {
    size_t n;
    if (snappy_uncompressed_length((const char *)src, src_len, &n) != SNAPPY_OK)
        return spes_fail("corrupt SNAPPY page (bad length header)");
    if (n != dst_len) return spes_fail("SNAPPY page decompresses to %zu bytes, the header says %zu", n, dst_len);
    if (snappy_uncompress((const char *)src, src_len, (char *)dst, &n) != SNAPPY_OK || n != dst_len)
        return spes_fail("corrupt SNAPPY page");
    return SPES_OK;
}

// Gzip (or zlib) members back to back until the input ends.
static int decompress_gzip(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len) {
    if (src_len > UINT32_MAX || dst_len > UINT32_MAX) return spes_fail("GZIP page too large");
    z_stream zs = {0};
    if (inflateInit2(&zs, 15 + 32) != Z_OK) return spes_fail("zlib inflateInit2 failed");
    zs.next_in = (Bytef *)src;
    zs.avail_in = (uInt)src_len;
    zs.next_out = dst;
    zs.avail_out = (uInt)dst_len;
    int rc = SPES_OK;
    for (;;) {
        int z = inflate(&zs, Z_FINISH);
        if (z == Z_STREAM_END) {
            if (zs.avail_in == 0) break;
            inflateReset(&zs);
            continue;
        }
        rc = spes_fail("corrupt GZIP page: %s", zs.msg ? zs.msg : z == Z_BUF_ERROR ? "truncated or larger than declared" : "inflate failed");
        break;
    }
    size_t produced = dst_len - zs.avail_out;
    inflateEnd(&zs);
    if (rc == SPES_OK && produced != dst_len)
        return spes_fail("GZIP page decompresses to %zu bytes, the header says %zu", produced, dst_len);
    return rc;
}

static int decompress_zstd(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len) {
    size_t n = ZSTD_decompress(dst, dst_len, src, src_len);
    if (ZSTD_isError(n)) return spes_fail("corrupt ZSTD page: %s", ZSTD_getErrorName(n));
    if (n != dst_len) return spes_fail("ZSTD page decompresses to %zu bytes, the header says %zu", n, dst_len);
    return SPES_OK;
}

int parquet_decompress(int32_t codec, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len) {
    switch (codec) {
    case PQ_CODEC_SNAPPY: return decompress_snappy(src, src_len, dst, dst_len);
    case PQ_CODEC_GZIP: return decompress_gzip(src, src_len, dst, dst_len);
    case PQ_CODEC_ZSTD: return decompress_zstd(src, src_len, dst, dst_len);
    default:
        return spes_fail("compression codec %s is not supported (supported: UNCOMPRESSED, SNAPPY, GZIP, ZSTD)",
                         parquet_codec_name(codec));
    }
}
