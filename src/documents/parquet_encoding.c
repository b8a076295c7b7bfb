// Parquet encodings for byte-array columns (see parquet_encoding.h).
#include "documents/parquet_encoding.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/thrift_compact.h"   // ULEB128 varints, the same as Thrift's

#define DELTA_BYTE_ARRAY_MAX_PAGE_BYTES ((size_t)1 << 30)

// `width` bits starting at bit `bit` of p, least-significant bit first. The caller has
// checked that bytes [bit/8, (bit+width+7)/8) exist.
static uint64_t read_bits(const uint8_t *p, uint64_t bit, int width) {
    uint64_t v = 0;
    int got = 0, shift = (int)(bit & 7);
    size_t byte = (size_t)(bit >> 3);
    while (got < width) {
        v |= (uint64_t)(p[byte++] >> shift) << got;
        got += 8 - shift;
        shift = 0;
    }
    return width == 64 ? v : v & ((UINT64_C(1) << width) - 1);
}

// --- RLE / bit-packed hybrid ------------------------------------------------------------

int rle_init(RleDecoder *d, const uint8_t *data, size_t len, int width) {
    memset(d, 0, sizeof *d);
    if (width < 0 || width > 32) return spes_fail("RLE/bit-packed bit width %d is out of range (0..32)", width);
    d->p = data;
    d->end = data + len;
    d->width = width;
    return SPES_OK;
}

static int rle_next_run(RleDecoder *d) {
    while (d->left == 0) {
        if (d->p >= d->end) return spes_fail("RLE/bit-packed data ends before all values were read");
        ThriftReader r;
        thrift_reader_init(&r, d->p, (size_t)(d->end - d->p));
        uint64_t header;
        SPES_TRY(thrift_read_varint(&r, &header));
        d->p = r.p;
        size_t avail = (size_t)(d->end - d->p);
        if (header & 1) {   // bit-packed: (header >> 1) groups of 8 values
            uint64_t groups = header >> 1;
            if (groups > ((uint64_t)1 << 40)) return spes_fail("bit-packed run of %llu groups is absurd", (unsigned long long)groups);
            uint64_t declared = groups * (uint64_t)d->width;   // bytes: 8 values * width bits / 8
            // A writer may cut the padding of the last run short: read what is there,
            // checking each value against it.
            d->bits = d->p;
            d->bits_len = declared < avail ? (size_t)declared : avail;
            d->bit_pos = 0;
            d->p += d->bits_len;
            d->left = groups * 8;
            d->literal = 1;
        } else {            // RLE: (header >> 1) repeats of one value in ceil(width/8) bytes
            size_t nbytes = (size_t)(d->width + 7) / 8;
            if (nbytes > avail) return spes_fail("RLE run value runs past the end of the data");
            uint32_t v = 0;
            for (size_t i = 0; i < nbytes; i++) v |= (uint32_t)d->p[i] << (8 * i);
            d->p += nbytes;
            d->value = v;
            d->left = header >> 1;
            d->literal = 0;
        }
    }
    return SPES_OK;
}

int rle_next(RleDecoder *d, uint32_t *out) {
    if (d->left == 0) SPES_TRY(rle_next_run(d));
    d->left--;
    if (!d->literal) {
        *out = d->value;
        return SPES_OK;
    }
    if (d->bit_pos + (uint64_t)d->width > (uint64_t)d->bits_len * 8)
        return spes_fail("bit-packed run is truncated (value needs bits past the end of the data)");
    *out = (uint32_t)read_bits(d->bits, d->bit_pos, d->width);
    d->bit_pos += (uint64_t)d->width;
    return SPES_OK;
}

int parquet_count_defined(const uint8_t *data, size_t len, uint32_t n, int max_def, uint32_t *defined) {
    int width = 0;
    while ((1 << width) <= max_def) width++;
    RleDecoder d;
    SPES_TRY(rle_init(&d, data, len, width));
    uint32_t count = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t level;
        if (rle_next(&d, &level) != SPES_OK) return spes_fail_context("definition levels");
        if (level > (uint32_t)max_def) return spes_fail("definition level %u exceeds the column's maximum %d", level, max_def);
        count += level == (uint32_t)max_def;
    }
    *defined = count;
    return SPES_OK;
}

// --- PLAIN and dictionary ----------------------------------------------------------------

int parquet_decode_plain(const uint8_t *data, size_t len, uint32_t n, ByteSpan *out) {
    size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (len - pos < 4) return spes_fail("PLAIN value %u of %u: its length runs past the end of the page", i, n);
        uint32_t vlen = (uint32_t)data[pos] | (uint32_t)data[pos + 1] << 8 | (uint32_t)data[pos + 2] << 16 |
                        (uint32_t)data[pos + 3] << 24;
        pos += 4;
        if (vlen > len - pos)
            return spes_fail("PLAIN value %u of %u: %u bytes run past the end of the page (%zu left)", i, n, vlen, len - pos);
        out[i] = (ByteSpan){data + pos, vlen};
        pos += vlen;
    }
    return SPES_OK;
}

int parquet_decode_dictionary(const uint8_t *data, size_t len, uint32_t n, const ByteSpan *dict, uint32_t dict_size,
                              ByteSpan *out) {
    if (n == 0) return SPES_OK;
    if (len < 1) return spes_fail("dictionary-encoded page has no bit-width byte");
    RleDecoder d;
    SPES_TRY(rle_init(&d, data + 1, len - 1, data[0]));
    for (uint32_t i = 0; i < n; i++) {
        uint32_t index;
        if (rle_next(&d, &index) != SPES_OK) return spes_fail_context("dictionary indices");
        if (index >= dict_size)
            return spes_fail("dictionary index %u is out of range (the dictionary has %u entries)", index, dict_size);
        out[i] = dict[index];
    }
    return SPES_OK;
}

// --- DELTA_BINARY_PACKED and the byte-array encodings built on it ------------------------

// Decodes exactly n values starting at r->p; r->p ends just past the encoded data.
static int delta_binary_decode(ThriftReader *r, uint32_t n, int64_t *out) {
    uint64_t block_size, miniblocks, total;
    int64_t first;
    SPES_TRY(thrift_read_varint(r, &block_size));
    SPES_TRY(thrift_read_varint(r, &miniblocks));
    SPES_TRY(thrift_read_varint(r, &total));
    SPES_TRY(thrift_read_i64(r, &first));
    if (block_size == 0 || block_size % 128 != 0 || block_size > (1u << 20) || miniblocks == 0 ||
        block_size % miniblocks != 0 || (block_size / miniblocks) % 32 != 0)
        return spes_fail("DELTA_BINARY_PACKED header is invalid (block size %llu, %llu miniblocks)",
                         (unsigned long long)block_size, (unsigned long long)miniblocks);
    if (total != n) return spes_fail("DELTA_BINARY_PACKED holds %llu values, expected %u", (unsigned long long)total, n);
    if (n == 0) return SPES_OK;
    uint64_t per_mini = block_size / miniblocks;
    uint64_t value = (uint64_t)first;   // unsigned: wrap-around is defined behaviour
    out[0] = first;
    uint32_t done = 1;
    while (done < n) {
        int64_t min_delta;
        SPES_TRY(thrift_read_i64(r, &min_delta));
        if ((uint64_t)(r->end - r->p) < miniblocks) return spes_fail("DELTA_BINARY_PACKED bit widths run past the end");
        const uint8_t *widths = r->p;
        r->p += miniblocks;
        for (uint64_t m = 0; m < miniblocks && done < n; m++) {
            int width = widths[m];
            if (width > 64) return spes_fail("DELTA_BINARY_PACKED bit width %d is out of range", width);
            uint64_t nbytes = per_mini * (uint64_t)width / 8;
            if (nbytes > (uint64_t)(r->end - r->p)) return spes_fail("DELTA_BINARY_PACKED miniblock runs past the end");
            for (uint64_t i = 0; i < per_mini && done < n; i++) {
                value += (uint64_t)min_delta + read_bits(r->p, i * (uint64_t)width, width);
                out[done++] = (int64_t)value;
            }
            r->p += nbytes;
        }
    }
    return SPES_OK;
}

// n lengths (DELTA_BINARY_PACKED) at the front of data; *used gets their encoded size.
static int decode_lengths(const uint8_t *data, size_t len, uint32_t n, const char *what, int64_t **lengths, size_t *used) {
    *lengths = spes_calloc(n ? n : 1, sizeof **lengths);
    if (!*lengths) return SPES_ERR;
    ThriftReader r;
    thrift_reader_init(&r, data, len);
    if (delta_binary_decode(&r, n, *lengths) != SPES_OK) {
        free(*lengths);
        *lengths = NULL;
        return spes_fail_context("%s", what);
    }
    *used = thrift_offset(&r);
    return SPES_OK;
}

int parquet_decode_delta_length(const uint8_t *data, size_t len, uint32_t n, ByteSpan *out) {
    int64_t *lengths;
    size_t pos;
    SPES_TRY(decode_lengths(data, len, n, "DELTA_LENGTH_BYTE_ARRAY lengths", &lengths, &pos));
    int rc = SPES_OK;
    for (uint32_t i = 0; i < n && rc == SPES_OK; i++) {
        if (lengths[i] < 0 || (uint64_t)lengths[i] > len - pos)
            rc = spes_fail("DELTA_LENGTH_BYTE_ARRAY value %u: length %lld does not fit in the page", i, (long long)lengths[i]);
        else {
            out[i] = (ByteSpan){data + pos, (size_t)lengths[i]};
            pos += (size_t)lengths[i];
        }
    }
    free(lengths);
    return rc;
}

int parquet_decode_delta_byte_array(const uint8_t *data, size_t len, uint32_t n, ByteSpan *out, uint8_t **arena,
                                    size_t *arena_cap) {
    // Prefix lengths, then the suffixes as DELTA_LENGTH_BYTE_ARRAY; value i is the first
    // prefix[i] bytes of value i-1 followed by suffix i.
    int64_t *prefix;
    size_t used;
    SPES_TRY(decode_lengths(data, len, n, "DELTA_BYTE_ARRAY prefix lengths", &prefix, &used));
    int rc = parquet_decode_delta_length(data + used, len - used, n, out);
    // Total size first (so the arena is allocated once and spans stay valid).
    size_t total = 0;
    for (uint32_t i = 0; i < n && rc == SPES_OK; i++) {
        size_t prev_len = i ? (size_t)prefix[i - 1] + out[i - 1].len : 0;   // rebuilt length of value i-1
        if (prefix[i] < 0 || (uint64_t)prefix[i] > prev_len)
            rc = spes_fail("DELTA_BYTE_ARRAY value %u: prefix %lld is longer than the previous value", i, (long long)prefix[i]);
        else if ((total += (size_t)prefix[i] + out[i].len) > DELTA_BYTE_ARRAY_MAX_PAGE_BYTES)
            rc = spes_fail("DELTA_BYTE_ARRAY page expands beyond %zu bytes", DELTA_BYTE_ARRAY_MAX_PAGE_BYTES);
    }
    if (rc == SPES_OK && total > *arena_cap) {
        uint8_t *grown = spes_realloc(*arena, total);
        if (!grown) rc = SPES_ERR;
        else {
            *arena = grown;
            *arena_cap = total;
        }
    }
    size_t pos = 0;
    for (uint32_t i = 0; i < n && rc == SPES_OK; i++) {
        uint8_t *dst = *arena + pos;
        if (prefix[i]) memcpy(dst, out[i - 1].data, (size_t)prefix[i]);
        if (out[i].len) memcpy(dst + prefix[i], out[i].data, out[i].len);
        out[i] = (ByteSpan){dst, (size_t)prefix[i] + out[i].len};
        pos += out[i].len;
    }
    free(prefix);
    return rc;
}
