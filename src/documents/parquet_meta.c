// Parquet footer and page headers (see parquet_meta.h). Field ids are those of
// parquet.thrift; unknown fields are skipped, so newer writers' additions are harmless.
#include "documents/parquet_meta.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "documents/thrift_compact.h"

static const char *name_of(int32_t v, const char *const *names, int count) {
    return v >= 0 && v < count && names[v] ? names[v] : "unknown";
}

const char *parquet_type_name(int32_t type) {
    static const char *const names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
    return name_of(type, names, 8);
}

const char *parquet_codec_name(int32_t codec) {
    static const char *const names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return name_of(codec, names, 8);
}

const char *parquet_encoding_name(int32_t encoding) {
    static const char *const names[] = {"PLAIN", NULL, "PLAIN_DICTIONARY", "RLE", "BIT_PACKED", "DELTA_BINARY_PACKED",
                                        "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY", "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
    return name_of(encoding, names, 10);
}

// --- schema ------------------------------------------------------------------------------

typedef struct {
    const uint8_t *name;
    size_t name_len;
    int32_t type;            // -1 for groups
    int32_t repetition;      // -1 when absent (the root)
    int32_t num_children;
} SchemaElement;

static int read_schema_element(ThriftReader *r, SchemaElement *e) {
    *e = (SchemaElement){.type = -1, .repetition = -1};
    int16_t last = 0;
    int have_name = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        switch (f.id) {
        case 1: SPES_TRY(thrift_field_i32(r, &f, "SchemaElement.type", &e->type)); break;
        case 3: SPES_TRY(thrift_field_i32(r, &f, "SchemaElement.repetition_type", &e->repetition)); break;
        case 4:
            SPES_TRY(thrift_field_binary(r, &f, "SchemaElement.name", &e->name, &e->name_len));
            have_name = 1;
            break;
        case 5: SPES_TRY(thrift_field_i32(r, &f, "SchemaElement.num_children", &e->num_children)); break;
        default: SPES_TRY(thrift_skip(r, f.type));
        }
    }
    if (!have_name) return spes_fail("schema element without a name");
    if (e->num_children < 0) return spes_fail("schema element '%.*s' has %d children", (int)e->name_len, e->name, e->num_children);
    return SPES_OK;
}

// Finds top-level column `name` in the flattened (depth-first) schema: its leaf index
// among all leaf columns and its max definition level.
static int find_column(const SchemaElement *el, uint32_t count, const char *name, int *leaf_index, int *max_def) {
    if (count == 0) return spes_fail("empty schema");
    uint32_t idx = 1;
    int leaves = 0;
    for (int32_t child = 0; child < el[0].num_children; child++) {
        if (idx >= count) return spes_fail("schema lists fewer elements than its root's %d children", el[0].num_children);
        const SchemaElement *e = &el[idx];
        if (e->name_len == strlen(name) && !memcmp(e->name, name, e->name_len)) {
            if (e->num_children > 0)
                return spes_fail("column '%s' is nested (a group); only flat string columns are supported", name);
            if (e->type != PQ_TYPE_BYTE_ARRAY)
                return spes_fail("column '%s' has type %s, expected a string column (BYTE_ARRAY)", name, parquet_type_name(e->type));
            if (e->repetition == PQ_REPEATED)
                return spes_fail("column '%s' is repeated (a list); expected a plain string column", name);
            *leaf_index = leaves;
            *max_def = e->repetition == PQ_OPTIONAL ? 1 : 0;
            return SPES_OK;
        }
        // Skip this child's subtree, counting its leaves (iteratively: no deep recursion).
        uint64_t pending = 1;
        while (pending > 0) {
            if (idx >= count) return spes_fail("schema ends inside the subtree of '%.*s'", (int)e->name_len, e->name);
            pending += (uint64_t)el[idx].num_children - 1;
            if (el[idx].num_children == 0) leaves++;
            idx++;
        }
    }
    return spes_fail("no column named '%s' (choose the text column with --text_field)", name);
}

// --- row groups --------------------------------------------------------------------------

static int read_column_meta_data(ThriftReader *r, const char *name, ParquetChunk *c) {
    int16_t last = 0;
    int32_t type = -1;
    int64_t data_offset = -1, dict_offset = -1;
    int have_codec = 0, have_values = 0, have_size = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        switch (f.id) {
        case 1: SPES_TRY(thrift_field_i32(r, &f, "ColumnMetaData.type", &type)); break;
        case 3: {   // path_in_schema: must be just [name]
            SPES_TRY(thrift_field_expect(&f, THRIFT_LIST, "ColumnMetaData.path_in_schema"));
            ThriftType et;
            uint32_t n;
            SPES_TRY(thrift_read_list(r, &et, &n));
            for (uint32_t i = 0; i < n; i++) {
                const uint8_t *s;
                size_t len;
                if (et != THRIFT_BINARY) return spes_fail("ColumnMetaData.path_in_schema is not a list of strings");
                SPES_TRY(thrift_read_binary(r, &s, &len));
                if (n != 1 || len != strlen(name) || memcmp(s, name, len) != 0)
                    return spes_fail("column chunk path does not match column '%s' (schema and row groups disagree)", name);
            }
            break;
        }
        case 4:
            SPES_TRY(thrift_field_i32(r, &f, "ColumnMetaData.codec", &c->codec));
            have_codec = 1;
            break;
        case 5:
            SPES_TRY(thrift_field_i64(r, &f, "ColumnMetaData.num_values", &c->num_values));
            have_values = 1;
            break;
        case 7:
            SPES_TRY(thrift_field_i64(r, &f, "ColumnMetaData.total_compressed_size", &c->compressed_size));
            have_size = 1;
            break;
        case 9: SPES_TRY(thrift_field_i64(r, &f, "ColumnMetaData.data_page_offset", &data_offset)); break;
        case 11: SPES_TRY(thrift_field_i64(r, &f, "ColumnMetaData.dictionary_page_offset", &dict_offset)); break;
        default: SPES_TRY(thrift_skip(r, f.type));
        }
    }
    if (!have_codec || !have_values || !have_size || data_offset < 0)
        return spes_fail("column chunk metadata lacks codec, num_values, total_compressed_size or data_page_offset");
    if (type != PQ_TYPE_BYTE_ARRAY)
        return spes_fail("column chunk has type %s, expected BYTE_ARRAY", parquet_type_name(type));
    if (c->num_values < 0 || c->compressed_size < 0) return spes_fail("column chunk has negative sizes");
    c->start = dict_offset > 0 && dict_offset < data_offset ? dict_offset : data_offset;
    return SPES_OK;
}

static int read_column_chunk(ThriftReader *r, const char *name, ParquetChunk *c) {
    int16_t last = 0;
    int have_meta = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        if (f.id == 1) {
            const uint8_t *p;
            size_t len;
            SPES_TRY(thrift_field_binary(r, &f, "ColumnChunk.file_path", &p, &len));
            return spes_fail("column '%s' is stored in another file (%.*s); external column chunks are not supported",
                             name, (int)(len > 200 ? 200 : len), p);
        } else if (f.id == 3) {
            SPES_TRY(thrift_field_expect(&f, THRIFT_STRUCT, "ColumnChunk.meta_data"));
            SPES_TRY(read_column_meta_data(r, name, c));
            have_meta = 1;
        } else {
            SPES_TRY(thrift_skip(r, f.type));
        }
    }
    if (!have_meta) return spes_fail("column '%s' has no metadata (encrypted file?)", name);
    return SPES_OK;
}

static int read_row_group(ThriftReader *r, const char *name, int leaf_index, ParquetChunk *c) {
    int16_t last = 0;
    int found = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        if (f.id != 1) {
            SPES_TRY(thrift_skip(r, f.type));
            continue;
        }
        SPES_TRY(thrift_field_expect(&f, THRIFT_LIST, "RowGroup.columns"));
        ThriftType et;
        uint32_t n;
        SPES_TRY(thrift_read_list(r, &et, &n));
        if (et != THRIFT_STRUCT) return spes_fail("RowGroup.columns is not a list of structs");
        for (uint32_t i = 0; i < n; i++) {
            if ((int)i == leaf_index) {
                SPES_TRY(read_column_chunk(r, name, c));
                found = 1;
            } else {
                SPES_TRY(thrift_skip(r, THRIFT_STRUCT));
            }
        }
    }
    if (!found) return spes_fail("a row group has no chunk for column '%s'", name);
    return SPES_OK;
}

// --- FileMetaData ------------------------------------------------------------------------

static int check_chunk_range(const ParquetChunk *c, uint64_t data_end) {
    if (c->start < 0 || (uint64_t)c->start > data_end || (uint64_t)c->compressed_size > data_end - (uint64_t)c->start)
        return spes_fail("column chunk [%lld, +%lld) lies outside the file's data (%llu bytes)", (long long)c->start,
                         (long long)c->compressed_size, (unsigned long long)data_end);
    return SPES_OK;
}

int parquet_read_column_meta(const uint8_t *footer, size_t len, const char *name, uint64_t data_end, ParquetColumn *out) {
    memset(out, 0, sizeof *out);
    ThriftReader r;
    thrift_reader_init(&r, footer, len);
    // Schema and row groups may come in any order: remember where each list starts.
    ThriftReader schema_at = {0}, groups_at = {0};
    int have_schema = 0, have_groups = 0;
    int16_t last = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(&r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        if (f.id == 2) {
            SPES_TRY(thrift_field_expect(&f, THRIFT_LIST, "FileMetaData.schema"));
            schema_at = r;
            have_schema = 1;
        } else if (f.id == 4) {
            SPES_TRY(thrift_field_expect(&f, THRIFT_LIST, "FileMetaData.row_groups"));
            groups_at = r;
            have_groups = 1;
        } else if (f.id == 3) {
            SPES_TRY(thrift_field_i64(&r, &f, "FileMetaData.num_rows", &out->num_rows));
            continue;
        }
        SPES_TRY(thrift_skip(&r, f.type));
    }
    if (!have_schema || !have_groups) return spes_fail("footer lacks the schema or the row groups");

    ThriftType et;
    uint32_t count;
    SPES_TRY(thrift_read_list(&schema_at, &et, &count));
    if (et != THRIFT_STRUCT) return spes_fail("FileMetaData.schema is not a list of structs");
    SchemaElement *elements = spes_calloc(count ? count : 1, sizeof *elements);
    if (!elements) return SPES_ERR;
    int rc = SPES_OK, leaf_index = 0;
    for (uint32_t i = 0; rc == SPES_OK && i < count; i++) rc = read_schema_element(&schema_at, &elements[i]);
    if (rc == SPES_OK) rc = find_column(elements, count, name, &leaf_index, &out->max_def_level);
    free(elements);
    SPES_TRY(rc);

    SPES_TRY(thrift_read_list(&groups_at, &et, &count));
    if (et != THRIFT_STRUCT) return spes_fail("FileMetaData.row_groups is not a list of structs");
    out->chunks = spes_calloc(count ? count : 1, sizeof *out->chunks);
    if (!out->chunks) return SPES_ERR;
    out->num_chunks = (int)count;
    for (uint32_t i = 0; i < count; i++) {
        if (read_row_group(&groups_at, name, leaf_index, &out->chunks[i]) != SPES_OK ||
            check_chunk_range(&out->chunks[i], data_end) != SPES_OK) {
            spes_fail_context("row group %u", i);
            parquet_column_free(out);
            return SPES_ERR;
        }
    }
    return SPES_OK;
}

void parquet_column_free(ParquetColumn *col) {
    free(col->chunks);
    memset(col, 0, sizeof *col);
}

// --- page headers ------------------------------------------------------------------------

static int read_data_page_header(ThriftReader *r, ParquetPageHeader *h) {
    int16_t last = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        switch (f.id) {
        case 1: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeader.num_values", &h->num_values)); break;
        case 2: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeader.encoding", &h->encoding)); break;
        case 3: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeader.definition_level_encoding", &h->def_level_encoding)); break;
        default: SPES_TRY(thrift_skip(r, f.type));
        }
    }
    return SPES_OK;
}

static int read_dictionary_page_header(ThriftReader *r, ParquetPageHeader *h) {
    int16_t last = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        switch (f.id) {
        case 1: SPES_TRY(thrift_field_i32(r, &f, "DictionaryPageHeader.num_values", &h->num_values)); break;
        case 2: SPES_TRY(thrift_field_i32(r, &f, "DictionaryPageHeader.encoding", &h->encoding)); break;
        default: SPES_TRY(thrift_skip(r, f.type));
        }
    }
    return SPES_OK;
}

static int read_data_page_header_v2(ThriftReader *r, ParquetPageHeader *h) {
    int16_t last = 0;
    int32_t num_rows;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        switch (f.id) {
        case 1: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeaderV2.num_values", &h->num_values)); break;
        case 2: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeaderV2.num_nulls", &h->num_nulls)); break;
        case 3: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeaderV2.num_rows", &num_rows)); break;
        case 4: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeaderV2.encoding", &h->encoding)); break;
        case 5: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeaderV2.definition_levels_byte_length", &h->def_levels_bytes)); break;
        case 6: SPES_TRY(thrift_field_i32(r, &f, "DataPageHeaderV2.repetition_levels_byte_length", &h->rep_levels_bytes)); break;
        case 7: SPES_TRY(thrift_field_bool(&f, "DataPageHeaderV2.is_compressed", &h->is_compressed)); break;
        default: SPES_TRY(thrift_skip(r, f.type));
        }
    }
    return SPES_OK;
}

int parquet_read_page_header(const uint8_t *data, size_t len, ParquetPageHeader *h, size_t *header_len) {
    *h = (ParquetPageHeader){.type = -1, .uncompressed_size = -1, .compressed_size = -1, .num_values = -1,
                             .encoding = -1, .def_level_encoding = PQ_ENC_RLE, .is_compressed = 1};
    ThriftReader r;
    thrift_reader_init(&r, data, len);
    int16_t last = 0;
    int have_sub = 0;
    for (;;) {
        ThriftField f;
        SPES_TRY(thrift_read_field(&r, &last, &f));
        if (f.type == THRIFT_STOP) break;
        switch (f.id) {
        case 1: SPES_TRY(thrift_field_i32(&r, &f, "PageHeader.type", &h->type)); break;
        case 2: SPES_TRY(thrift_field_i32(&r, &f, "PageHeader.uncompressed_page_size", &h->uncompressed_size)); break;
        case 3: SPES_TRY(thrift_field_i32(&r, &f, "PageHeader.compressed_page_size", &h->compressed_size)); break;
        case 4: {
            int32_t crc;
            SPES_TRY(thrift_field_i32(&r, &f, "PageHeader.crc", &crc));
            h->crc = (uint32_t)crc;
            h->has_crc = 1;
            break;
        }
        case 5:
            SPES_TRY(thrift_field_expect(&f, THRIFT_STRUCT, "PageHeader.data_page_header"));
            SPES_TRY(read_data_page_header(&r, h));
            have_sub |= 1 << PQ_PAGE_DATA;
            break;
        case 7:
            SPES_TRY(thrift_field_expect(&f, THRIFT_STRUCT, "PageHeader.dictionary_page_header"));
            SPES_TRY(read_dictionary_page_header(&r, h));
            have_sub |= 1 << PQ_PAGE_DICTIONARY;
            break;
        case 8:
            SPES_TRY(thrift_field_expect(&f, THRIFT_STRUCT, "PageHeader.data_page_header_v2"));
            SPES_TRY(read_data_page_header_v2(&r, h));
            have_sub |= 1 << PQ_PAGE_DATA_V2;
            break;
        default: SPES_TRY(thrift_skip(&r, f.type));
        }
    }
    if (h->uncompressed_size < 0 || h->compressed_size < 0)
        return spes_fail("page header lacks (or has negative) page sizes");
    int needs_sub = h->type == PQ_PAGE_DATA || h->type == PQ_PAGE_DICTIONARY || h->type == PQ_PAGE_DATA_V2;
    if (needs_sub && !(have_sub & (1 << h->type)))
        return spes_fail("page header of type %d lacks its type-specific header", h->type);
    if (needs_sub && h->num_values < 0) return spes_fail("page header has a negative value count");
    if (h->type == PQ_PAGE_DATA_V2 &&
        (h->def_levels_bytes < 0 || h->rep_levels_bytes < 0 ||
         (int64_t)h->def_levels_bytes + h->rep_levels_bytes > h->compressed_size ||
         (int64_t)h->def_levels_bytes + h->rep_levels_bytes > h->uncompressed_size))
        return spes_fail("data page v2 level lengths do not fit in the page");
    *header_len = thrift_offset(&r);
    return SPES_OK;
}
