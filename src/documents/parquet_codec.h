// Page decompression for Parquet: SNAPPY (raw snappy blocks, libsnappy's C API), GZIP
// (zlib), ZSTD (libzstd). UNCOMPRESSED pages need no call. Other codecs (LZO, BROTLI,
// LZ4, LZ4_RAW) are reported as unsupported.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Decompresses src into exactly dst_len bytes; any other size is an error.
int parquet_decompress(int32_t codec, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len);
