// Thrift compact protocol decoder (see thrift_compact.h).
#include "documents/thrift_compact.h"

#include "base/error.h"

void thrift_reader_init(ThriftReader *r, const uint8_t *data, size_t len) {
    r->start = r->p = data;
    r->end = data + len;
    r->depth = 0;
}

size_t thrift_offset(const ThriftReader *r) { return (size_t)(r->p - r->start); }

static int need(ThriftReader *r, size_t n, const char *what) {
    if ((size_t)(r->end - r->p) < n)
        return spes_fail("thrift: %s needs %zu bytes at offset %zu but only %zu remain", what, n, thrift_offset(r),
                         (size_t)(r->end - r->p));
    return SPES_OK;
}

int thrift_read_varint(ThriftReader *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        SPES_TRY(need(r, 1, "a varint"));
        uint8_t b = *r->p++;
        if (shift == 63 && (b & 0x7e)) break;   // more than 64 bits
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return SPES_OK;
        }
    }
    return spes_fail("thrift: varint longer than 64 bits at offset %zu", thrift_offset(r));
}

static int64_t unzigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

int thrift_read_i64(ThriftReader *r, int64_t *out) {
    uint64_t v;
    SPES_TRY(thrift_read_varint(r, &v));
    *out = unzigzag(v);
    return SPES_OK;
}

int thrift_read_i32(ThriftReader *r, int32_t *out) {
    int64_t v;
    SPES_TRY(thrift_read_i64(r, &v));
    if (v < INT32_MIN || v > INT32_MAX)
        return spes_fail("thrift: i32 value %lld out of range at offset %zu", (long long)v, thrift_offset(r));
    *out = (int32_t)v;
    return SPES_OK;
}

int thrift_read_binary(ThriftReader *r, const uint8_t **data, size_t *len) {
    uint64_t n;
    SPES_TRY(thrift_read_varint(r, &n));
    if (n > (uint64_t)(r->end - r->p))
        return spes_fail("thrift: binary of %llu bytes at offset %zu runs past the end (%zu bytes left)",
                         (unsigned long long)n, thrift_offset(r), (size_t)(r->end - r->p));
    *data = r->p;
    *len = (size_t)n;
    r->p += n;
    return SPES_OK;
}

int thrift_read_field(ThriftReader *r, int16_t *last_id, ThriftField *f) {
    SPES_TRY(need(r, 1, "a field header"));
    uint8_t b = *r->p++;
    f->type = (ThriftType)(b & 0x0f);
    if (f->type == THRIFT_STOP) {
        f->id = 0;
        return SPES_OK;
    }
    if (f->type > THRIFT_STRUCT) return spes_fail("thrift: unknown field type %d at offset %zu", f->type, thrift_offset(r) - 1);
    int delta = b >> 4;
    if (delta) {
        int id = *last_id + delta;
        if (id > INT16_MAX) return spes_fail("thrift: field id overflow at offset %zu", thrift_offset(r) - 1);
        f->id = (int16_t)id;
    } else {
        int64_t id;
        SPES_TRY(thrift_read_i64(r, &id));
        if (id < INT16_MIN || id > INT16_MAX) return spes_fail("thrift: field id %lld out of range", (long long)id);
        f->id = (int16_t)id;
    }
    *last_id = f->id;
    return SPES_OK;
}

int thrift_read_list(ThriftReader *r, ThriftType *elem_type, uint32_t *count) {
    SPES_TRY(need(r, 1, "a list header"));
    uint8_t b = *r->p++;
    *elem_type = (ThriftType)(b & 0x0f);
    uint64_t n = b >> 4;
    if (n == 15) SPES_TRY(thrift_read_varint(r, &n));
    if (*elem_type == THRIFT_STOP || *elem_type > THRIFT_STRUCT)
        return spes_fail("thrift: unknown list element type %d at offset %zu", *elem_type, thrift_offset(r));
    // Every element takes at least one byte (bools too): a larger count is corrupt.
    if (n > (uint64_t)(r->end - r->p))
        return spes_fail("thrift: list of %llu elements at offset %zu cannot fit in the %zu bytes left",
                         (unsigned long long)n, thrift_offset(r), (size_t)(r->end - r->p));
    *count = (uint32_t)n;
    return SPES_OK;
}

int thrift_skip(ThriftReader *r, ThriftType type) {
    if (r->depth >= THRIFT_MAX_DEPTH)
        return spes_fail("thrift: nesting deeper than %d at offset %zu", THRIFT_MAX_DEPTH, thrift_offset(r));
    uint64_t u;
    const uint8_t *bytes;
    size_t len;
    int rc = SPES_OK;
    r->depth++;
    switch (type) {
    case THRIFT_BOOL_TRUE:
    case THRIFT_BOOL_FALSE:
        break;   // the value is in the field header
    case THRIFT_I8:
        rc = need(r, 1, "an i8");
        if (rc == SPES_OK) r->p++;
        break;
    case THRIFT_I16:
    case THRIFT_I32:
    case THRIFT_I64:
        rc = thrift_read_varint(r, &u);
        break;
    case THRIFT_DOUBLE:
        rc = need(r, 8, "a double");
        if (rc == SPES_OK) r->p += 8;
        break;
    case THRIFT_BINARY:
        rc = thrift_read_binary(r, &bytes, &len);
        break;
    case THRIFT_LIST:
    case THRIFT_SET: {
        ThriftType et;
        uint32_t n;
        rc = thrift_read_list(r, &et, &n);
        // Bool elements are one byte each (not carried in a header).
        if (et == THRIFT_BOOL_TRUE || et == THRIFT_BOOL_FALSE) et = THRIFT_I8;
        for (uint32_t i = 0; rc == SPES_OK && i < n; i++) rc = thrift_skip(r, et);
        break;
    }
    case THRIFT_MAP: {
        rc = thrift_read_varint(r, &u);
        if (rc != SPES_OK || u == 0) break;
        rc = need(r, 1, "a map header");
        if (rc != SPES_OK) break;
        uint8_t kv = *r->p++;
        ThriftType kt = (ThriftType)(kv >> 4), vt = (ThriftType)(kv & 0x0f);
        if (kt == THRIFT_BOOL_TRUE || kt == THRIFT_BOOL_FALSE) kt = THRIFT_I8;
        if (vt == THRIFT_BOOL_TRUE || vt == THRIFT_BOOL_FALSE) vt = THRIFT_I8;
        if (kt == THRIFT_STOP || kt > THRIFT_STRUCT || vt == THRIFT_STOP || vt > THRIFT_STRUCT || u > (uint64_t)(r->end - r->p)) {
            rc = spes_fail("thrift: corrupt map header at offset %zu", thrift_offset(r));
            break;
        }
        for (uint64_t i = 0; rc == SPES_OK && i < u; i++) {
            rc = thrift_skip(r, kt);
            if (rc == SPES_OK) rc = thrift_skip(r, vt);
        }
        break;
    }
    case THRIFT_STRUCT: {
        int16_t last = 0;
        for (;;) {
            ThriftField f;
            rc = thrift_read_field(r, &last, &f);
            if (rc != SPES_OK || f.type == THRIFT_STOP) break;
            rc = thrift_skip(r, f.type);
            if (rc != SPES_OK) break;
        }
        break;
    }
    default:
        rc = spes_fail("thrift: cannot skip unknown type %d at offset %zu", type, thrift_offset(r));
    }
    r->depth--;
    return rc;
}

int thrift_field_expect(const ThriftField *f, ThriftType type, const char *name) {
    if (f->type != type)
        return spes_fail("thrift: field %s (id %d) has wire type %d, expected %d", name, f->id, f->type, type);
    return SPES_OK;
}

int thrift_field_i32(ThriftReader *r, const ThriftField *f, const char *name, int32_t *out) {
    SPES_TRY(thrift_field_expect(f, THRIFT_I32, name));
    return thrift_read_i32(r, out);
}

int thrift_field_i64(ThriftReader *r, const ThriftField *f, const char *name, int64_t *out) {
    SPES_TRY(thrift_field_expect(f, THRIFT_I64, name));
    return thrift_read_i64(r, out);
}

int thrift_field_bool(const ThriftField *f, const char *name, int *out) {
    if (f->type != THRIFT_BOOL_TRUE && f->type != THRIFT_BOOL_FALSE)
        return spes_fail("thrift: field %s (id %d) has wire type %d, expected a bool", name, f->id, f->type);
    *out = f->type == THRIFT_BOOL_TRUE;
    return SPES_OK;
}

int thrift_field_binary(ThriftReader *r, const ThriftField *f, const char *name, const uint8_t **data, size_t *len) {
    SPES_TRY(thrift_field_expect(f, THRIFT_BINARY, name));
    return thrift_read_binary(r, data, len);
}
