// Reading one string column of a Parquet file, page by page (see parquet_reader.h).
#include "documents/parquet_reader.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "documents/parquet_codec.h"
#include "documents/parquet_encoding.h"
#include "documents/parquet_meta.h"

static const uint8_t PAR1[4] = {'P', 'A', 'R', '1'};

// A growable byte buffer for decompressed pages.
typedef struct {
    uint8_t *data;
    size_t cap;
} PageBuffer;

struct ParquetStringReader {
    char *what;                  // the path, for messages
    MappedFile file;             // empty when reading from memory
    const uint8_t *buf;
    size_t len;
    ParquetColumn col;
    uint64_t total_values, values_done, nulls;

    int chunk;                   // current row group (-1 before the first)
    size_t page_pos, chunk_end;  // next page header; end of the chunk's pages
    int64_t chunk_values_left;

    ByteSpan *dict;              // the chunk's dictionary (spans into dict_buf or the file)
    uint32_t dict_size;
    int have_dict;
    PageBuffer dict_buf, page_buf;
    uint8_t *arena;              // DELTA_BYTE_ARRAY values
    size_t arena_cap;

    ByteSpan *values;            // the current page's non-null values
    uint32_t values_cap, num_values, next_value;
};

static uint32_t read_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int page_buffer_reserve(PageBuffer *b, size_t n) {
    if (n <= b->cap) return SPES_OK;
    uint8_t *grown = spes_realloc(b->data, n);
    if (!grown) return SPES_ERR;
    b->data = grown;
    b->cap = n;
    return SPES_OK;
}

// The page body uncompressed: straight from the file when not compressed, else into buf.
static int page_body(ParquetStringReader *r, int32_t codec, const uint8_t *src, size_t src_len, size_t raw_len,
                     PageBuffer *buf, const uint8_t **out) {
    if (raw_len > PARQUET_MAX_PAGE_BYTES)
        return spes_fail("page of %zu bytes exceeds the %zu-byte limit", raw_len, PARQUET_MAX_PAGE_BYTES);
    if (raw_len == 0) {   // nothing to decode (e.g. an empty dictionary): any codec's bytes are moot
        *out = src;
        return SPES_OK;
    }
    if (codec == PQ_CODEC_UNCOMPRESSED) {
        if (src_len != raw_len)
            return spes_fail("uncompressed page has %zu bytes but declares %zu", src_len, raw_len);
        *out = src;
        return SPES_OK;
    }
    SPES_TRY(page_buffer_reserve(buf, raw_len));
    SPES_TRY(parquet_decompress(codec, src, src_len, buf->data, raw_len));
    *out = buf->data;
    return SPES_OK;
}

static int reserve_values(ParquetStringReader *r, uint32_t n) {
    if (n > PARQUET_MAX_PAGE_VALUES)
        return spes_fail("page holds %u values; more than %u per page is not supported", n, PARQUET_MAX_PAGE_VALUES);
    if (n <= r->values_cap) return SPES_OK;
    ByteSpan *grown = spes_realloc(r->values, (size_t)n * sizeof *grown);
    if (!grown) return SPES_ERR;
    r->values = grown;
    r->values_cap = n;
    return SPES_OK;
}

static int read_dictionary_page(ParquetStringReader *r, const ParquetPageHeader *h, const uint8_t *payload) {
    if (r->have_dict) return spes_fail("a second dictionary page in one column chunk");
    if (h->encoding != PQ_ENC_PLAIN && h->encoding != PQ_ENC_PLAIN_DICTIONARY)
        return spes_fail("dictionary page encoding %s is not supported", parquet_encoding_name(h->encoding));
    const uint8_t *body;
    SPES_TRY(page_body(r, r->col.chunks[r->chunk].codec, payload, (size_t)h->compressed_size, (size_t)h->uncompressed_size,
                       &r->dict_buf, &body));
    uint32_t n = (uint32_t)h->num_values;
    if (n > (size_t)h->uncompressed_size / 4) return spes_fail("dictionary of %u entries cannot fit in %d bytes", n, h->uncompressed_size);
    ByteSpan *dict = spes_realloc(r->dict, (size_t)(n ? n : 1) * sizeof *dict);
    if (!dict) return SPES_ERR;
    r->dict = dict;
    if (parquet_decode_plain(body, (size_t)h->uncompressed_size, n, r->dict) != SPES_OK)
        return spes_fail_context("dictionary page");
    r->dict_size = n;
    r->have_dict = 1;
    return SPES_OK;
}

// Decodes `defined` non-null values of the given encoding into r->values; they become
// the current page's values only when all decoded.
static int decode_values(ParquetStringReader *r, int32_t encoding, const uint8_t *data, size_t len, uint32_t defined) {
    SPES_TRY(reserve_values(r, defined));
    r->num_values = r->next_value = 0;
    int rc;
    switch (encoding) {
    case PQ_ENC_PLAIN: rc = parquet_decode_plain(data, len, defined, r->values); break;
    case PQ_ENC_PLAIN_DICTIONARY:
    case PQ_ENC_RLE_DICTIONARY:
        rc = r->have_dict ? parquet_decode_dictionary(data, len, defined, r->dict, r->dict_size, r->values)
                          : spes_fail("dictionary-encoded page without a dictionary page");
        break;
    case PQ_ENC_DELTA_LENGTH_BYTE_ARRAY: rc = parquet_decode_delta_length(data, len, defined, r->values); break;
    case PQ_ENC_DELTA_BYTE_ARRAY:
        rc = parquet_decode_delta_byte_array(data, len, defined, r->values, &r->arena, &r->arena_cap);
        break;
    default: rc = spes_fail("value encoding %s is not supported for string columns", parquet_encoding_name(encoding));
    }
    if (rc == SPES_OK) r->num_values = defined;
    return rc;
}

// Data page v1: [def levels: 4-byte length + RLE hybrid] [values], all compressed together.
static int read_data_page_v1(ParquetStringReader *r, const ParquetPageHeader *h, const uint8_t *payload) {
    const uint8_t *body;
    SPES_TRY(page_body(r, r->col.chunks[r->chunk].codec, payload, (size_t)h->compressed_size, (size_t)h->uncompressed_size,
                       &r->page_buf, &body));
    size_t len = (size_t)h->uncompressed_size;
    uint32_t n = (uint32_t)h->num_values, defined = n;
    if (r->col.max_def_level > 0) {
        if (h->def_level_encoding != PQ_ENC_RLE)
            return spes_fail("definition level encoding %s is not supported", parquet_encoding_name(h->def_level_encoding));
        if (len < 4) return spes_fail("data page too short for its definition levels");
        size_t levels_len = read_le32(body);
        if (levels_len > len - 4) return spes_fail("definition levels (%zu bytes) run past the end of the page", levels_len);
        SPES_TRY(parquet_count_defined(body + 4, levels_len, n, r->col.max_def_level, &defined));
        body += 4 + levels_len;
        len -= 4 + levels_len;
    }
    r->nulls += n - defined;
    return decode_values(r, h->encoding, body, len, defined);
}

// Data page v2: [rep levels][def levels] uncompressed and unprefixed, then the values,
// compressed only when is_compressed.
static int read_data_page_v2(ParquetStringReader *r, const ParquetPageHeader *h, const uint8_t *payload) {
    size_t levels = (size_t)h->rep_levels_bytes + (size_t)h->def_levels_bytes;
    uint32_t n = (uint32_t)h->num_values, defined = n;
    if (r->col.max_def_level > 0)
        SPES_TRY(parquet_count_defined(payload + h->rep_levels_bytes, (size_t)h->def_levels_bytes, n, r->col.max_def_level,
                                       &defined));
    if (n - defined != (uint32_t)h->num_nulls)
        return spes_fail("data page v2 declares %d nulls but its definition levels give %u", h->num_nulls, n - defined);
    int32_t codec = h->is_compressed ? r->col.chunks[r->chunk].codec : PQ_CODEC_UNCOMPRESSED;
    const uint8_t *body;
    size_t raw_len = (size_t)h->uncompressed_size - levels;
    SPES_TRY(page_body(r, codec, payload + levels, (size_t)h->compressed_size - levels, raw_len, &r->page_buf, &body));
    r->nulls += n - defined;
    return decode_values(r, h->encoding, body, raw_len, defined);
}

// Moves to the next chunk with values; 0 when there is none.
static int next_chunk(ParquetStringReader *r) {
    while (r->chunk_values_left == 0) {
        if (r->chunk + 1 >= r->col.num_chunks) return 0;
        r->chunk++;
        const ParquetChunk *c = &r->col.chunks[r->chunk];
        r->page_pos = (size_t)c->start;
        r->chunk_end = (size_t)(c->start + c->compressed_size);
        r->chunk_values_left = c->num_values;
        r->have_dict = 0;
        r->dict_size = 0;
    }
    return 1;
}

// Reads pages until one yields values (1), or the column ends (0).
static int next_page(ParquetStringReader *r) {
    for (;;) {
        if (!next_chunk(r)) return 0;
        if (r->page_pos >= r->chunk_end)
            return spes_fail("row group %d: the column chunk ends with %lld values still missing", r->chunk,
                             (long long)r->chunk_values_left);
        ParquetPageHeader h;
        size_t header_len;
        if (parquet_read_page_header(r->buf + r->page_pos, r->chunk_end - r->page_pos, &h, &header_len) != SPES_OK)
            return spes_fail_context("row group %d, page header at byte %zu", r->chunk, r->page_pos);
        const uint8_t *payload = r->buf + r->page_pos + header_len;
        size_t payload_at = r->page_pos + header_len;
        if ((size_t)h.compressed_size > r->chunk_end - payload_at)
            return spes_fail("row group %d: page at byte %zu (%d bytes) runs past its column chunk", r->chunk, r->page_pos,
                             h.compressed_size);
        size_t page_at = r->page_pos;
        r->page_pos = payload_at + (size_t)h.compressed_size;
        if (h.has_crc && (uint32_t)crc32(0, payload, (uInt)h.compressed_size) != h.crc)
            return spes_fail("row group %d: page at byte %zu fails its CRC-32 check (corrupt file)", r->chunk, page_at);
        int rc = SPES_OK;
        if (h.type == PQ_PAGE_DICTIONARY) {
            rc = read_dictionary_page(r, &h, payload);
        } else if (h.type == PQ_PAGE_DATA || h.type == PQ_PAGE_DATA_V2) {
            if (h.num_values > r->chunk_values_left)
                rc = spes_fail("page holds %d values but only %lld remain in the column chunk", h.num_values,
                               (long long)r->chunk_values_left);
            else
                rc = h.type == PQ_PAGE_DATA ? read_data_page_v1(r, &h, payload) : read_data_page_v2(r, &h, payload);
            if (rc == SPES_OK) {
                r->chunk_values_left -= h.num_values;
                r->values_done += (uint64_t)h.num_values;
            }
        }   // index pages and unknown page types are skipped
        if (rc != SPES_OK) return spes_fail_context("row group %d, page at byte %zu", r->chunk, page_at);
        if (r->next_value < r->num_values) return 1;
    }
}

int parquet_string_reader_next(ParquetStringReader *r, const uint8_t **data, size_t *len) {
    if (r->next_value >= r->num_values) {
        int rc = next_page(r);
        if (rc == SPES_ERR) return spes_fail_context("%s", r->what);
        if (rc == 0) return 0;
    }
    ByteSpan v = r->values[r->next_value++];
    *data = v.data;
    *len = v.len;
    return 1;
}

static int open_buffer(ParquetStringReader *r, const char *column) {
    // "PAR1" <pages...> <FileMetaData> <4-byte footer length> "PAR1"
    if (r->len >= 4 && memcmp(r->buf + r->len - 4, "PARE", 4) == 0)
        return spes_fail("%s: encrypted Parquet files are not supported", r->what);
    if (r->len < 12 || memcmp(r->buf, PAR1, 4) != 0 || memcmp(r->buf + r->len - 4, PAR1, 4) != 0)
        return spes_fail("%s: not a Parquet file (missing the PAR1 magic at its start or end; truncated?)", r->what);
    size_t footer_len = read_le32(r->buf + r->len - 8);
    if (footer_len > r->len - 12)
        return spes_fail("%s: footer length %zu is larger than the file allows (%zu bytes)", r->what, footer_len, r->len);
    size_t footer_at = r->len - 8 - footer_len;
    if (parquet_read_column_meta(r->buf + footer_at, footer_len, column, footer_at, &r->col) != SPES_OK)
        return spes_fail_context("%s: footer", r->what);
    for (int i = 0; i < r->col.num_chunks; i++) r->total_values += (uint64_t)r->col.chunks[i].num_values;
    r->chunk = -1;
    return SPES_OK;
}

int parquet_string_reader_open_memory(const uint8_t *buf, size_t len, const char *what, const char *column,
                                      ParquetStringReader **out) {
    *out = NULL;
    ParquetStringReader *r = spes_calloc(1, sizeof *r);
    if (!r) return SPES_ERR;
    r->what = spes_strdup(what);
    r->buf = buf;
    r->len = len;
    if (!r->what || open_buffer(r, column) != SPES_OK) {
        parquet_string_reader_close(r);
        return SPES_ERR;
    }
    *out = r;
    return SPES_OK;
}

int parquet_string_reader_open(const char *path, const char *column, ParquetStringReader **out) {
    *out = NULL;
    MappedFile mf;
    SPES_TRY(file_map(path, &mf));
    if (parquet_string_reader_open_memory(mf.data, mf.size, path, column, out) != SPES_OK) {
        file_unmap(&mf);
        return SPES_ERR;
    }
    (*out)->file = mf;
    return SPES_OK;
}

uint64_t parquet_string_reader_nulls(const ParquetStringReader *r) { return r->nulls; }

uint64_t parquet_string_reader_bytes_read(const ParquetStringReader *r) {
    if (r->total_values == 0) return r->len;
    return (uint64_t)((double)r->len * (double)r->values_done / (double)r->total_values);
}

void parquet_string_reader_close(ParquetStringReader *r) {
    if (!r) return;
    parquet_column_free(&r->col);
    free(r->dict);
    free(r->dict_buf.data);
    free(r->page_buf.data);
    free(r->arena);
    free(r->values);
    file_unmap(&r->file);
    free(r->what);
    free(r);
}
