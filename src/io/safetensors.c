#include "io/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

// A header larger than this is refused: real models stay far below (names + shapes).
#define MAX_HEADER_BYTES (100u * 1024u * 1024u)

static const struct {
    const char *name;
    size_t size;
} dtype_info[DTYPE_COUNT] = {
    [DTYPE_F32] = {"F32", 4}, [DTYPE_BF16] = {"BF16", 2}, [DTYPE_F16] = {"F16", 2}, [DTYPE_F64] = {"F64", 8},
    [DTYPE_I64] = {"I64", 8}, [DTYPE_I32] = {"I32", 4},   [DTYPE_I16] = {"I16", 2}, [DTYPE_I8] = {"I8", 1},
    [DTYPE_U8] = {"U8", 1},   [DTYPE_U16] = {"U16", 2},   [DTYPE_U32] = {"U32", 4}, [DTYPE_U64] = {"U64", 8},
    [DTYPE_BOOL] = {"BOOL", 1},
};

const char *dtype_name(DType dt) { return (unsigned)dt < DTYPE_COUNT ? dtype_info[dt].name : "?"; }
size_t dtype_size(DType dt) { return (unsigned)dt < DTYPE_COUNT ? dtype_info[dt].size : 0; }

int dtype_from_name(const char *name, DType *out) {
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (!strcmp(name, dtype_info[i].name)) {
            *out = (DType)i;
            return SPES_OK;
        }
    return spes_fail("unknown dtype '%s'", name);
}

// ---------------------------------------------------------------------------------------
// bf16 / f16 conversion

float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (isnan(f)) return (uint16_t)((bits >> 16) | 0x40);   // stay a (quiet) NaN
    bits += 0x7FFF + ((bits >> 16) & 1);                      // round to nearest even
    return (uint16_t)(bits >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) bits = sign;
        else {   // subnormal: renormalise
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7F800000u | (mant << 13);
    else bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// ---------------------------------------------------------------------------------------
// Reader

static int cmp_by_data(const void *a, const void *b) {
    const StTensor *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static int parse_metadata(json_t *meta, const char *what, SafeTensors *out) {
    if (!json_is_object(meta)) return spes_fail("%s: __metadata__ is not an object", what);
    size_t n = json_object_size(meta);
    out->meta_keys = spes_calloc(n ? n : 1, sizeof(char *));
    out->meta_values = spes_calloc(n ? n : 1, sizeof(char *));
    if (!out->meta_keys || !out->meta_values) return SPES_ERR;
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val)) return spes_fail("%s: __metadata__ value of '%s' is not a string", what, key);
        out->meta_keys[out->meta_count] = spes_strdup(key);
        out->meta_values[out->meta_count] = spes_strdup(json_string_value(val));
        if (!out->meta_keys[out->meta_count] || !out->meta_values[out->meta_count]) return SPES_ERR;
        out->meta_count++;
    }
    return SPES_OK;
}

static int parse_tensor_entry(const char *name, json_t *entry, const uint8_t *data, size_t data_len,
                              const char *what, StTensor *t) {
    if (!json_is_object(entry)) return spes_fail("%s: tensor '%s' is not an object", what, name);
    json_t *jdtype = json_object_get(entry, "dtype");
    json_t *jshape = json_object_get(entry, "shape");
    json_t *joffs = json_object_get(entry, "data_offsets");
    if (!json_is_string(jdtype) || !json_is_array(jshape) || !json_is_array(joffs) || json_array_size(joffs) != 2)
        return spes_fail("%s: tensor '%s' needs string dtype, array shape, 2-element data_offsets", what, name);
    if (dtype_from_name(json_string_value(jdtype), &t->dtype) != SPES_OK)
        return spes_fail_context("%s: tensor '%s'", what, name);
    size_t ndim = json_array_size(jshape);
    if (ndim > ST_MAX_DIMS) return spes_fail("%s: tensor '%s' has %zu dims (max %d)", what, name, ndim, ST_MAX_DIMS);
    t->ndim = (int)ndim;
    size_t numel = 1;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(jshape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return spes_fail("%s: tensor '%s' shape[%zu] is not a non-negative integer", what, name, i);
        t->shape[i] = json_integer_value(d);
        if (!spes_mul_size(numel, (size_t)t->shape[i], &numel))
            return spes_fail("%s: tensor '%s' shape overflows", what, name);
    }
    t->numel = numel;
    json_t *jb = json_array_get(joffs, 0), *je = json_array_get(joffs, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < json_integer_value(jb))
        return spes_fail("%s: tensor '%s' has invalid data_offsets", what, name);
    size_t begin = (size_t)json_integer_value(jb), end = (size_t)json_integer_value(je);
    size_t nbytes;
    if (!spes_mul_size(numel, dtype_size(t->dtype), &nbytes) || nbytes != end - begin)
        return spes_fail("%s: tensor '%s': data_offsets span %zu bytes but %s%s needs %zu", what, name, end - begin,
                         dtype_name(t->dtype), ndim ? " shape" : "", nbytes);
    if (end > data_len)
        return spes_fail("%s: tensor '%s' data [%zu, %zu) lies beyond the %zu data bytes (truncated file?)", what,
                         name, begin, end, data_len);
    t->data = data + begin;
    t->nbytes = nbytes;
    t->name = spes_strdup(name);
    return t->name ? SPES_OK : SPES_ERR;
}

static int parse_header(const uint8_t *buf, size_t len, const char *what, SafeTensors *out) {
    if (len < 8) return spes_fail("%s: too short for a safetensors file (%zu bytes)", what, len);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | buf[i];
    if (header_len > MAX_HEADER_BYTES || header_len > len - 8)
        return spes_fail("%s: header length %llu does not fit the %zu-byte file (not safetensors, or truncated)", what,
                         (unsigned long long)header_len, len);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)header_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return spes_fail("%s: header is not valid JSON (%s at byte %d)", what, jerr.text, jerr.position);
    int rc = SPES_OK;
    if (!json_is_object(root)) {
        rc = spes_fail("%s: header is not a JSON object", what);
        goto done;
    }
    const uint8_t *data = buf + 8 + header_len;
    size_t data_len = len - 8 - (size_t)header_len;
    size_t n = json_object_size(root);
    out->tensors = spes_calloc(n ? n : 1, sizeof(StTensor));
    if (!out->tensors) {
        rc = SPES_ERR;
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) rc = parse_metadata(val, what, out);
        else rc = parse_tensor_entry(key, val, data, data_len, what, &out->tensors[out->count++]);
        if (rc != SPES_OK) goto done;
    }
    // File order, and the data must be covered exactly: no overlaps, no holes.
    qsort(out->tensors, (size_t)out->count, sizeof(StTensor), cmp_by_data);
    size_t expect = 0;
    for (int i = 0; i < out->count; i++) {
        size_t begin = (size_t)(out->tensors[i].data - data);
        if (begin != expect) {
            rc = spes_fail("%s: tensor '%s' starts at data byte %zu, expected %zu (overlap or gap)", what,
                           out->tensors[i].name, begin, expect);
            goto done;
        }
        expect = begin + out->tensors[i].nbytes;
    }
    if (expect != data_len) rc = spes_fail("%s: %zu trailing bytes after the last tensor", what, data_len - expect);
done:
    json_decref(root);
    return rc;
}

int safetensors_parse(const uint8_t *buf, size_t len, const char *what, SafeTensors *out) {
    memset(out, 0, sizeof *out);
    if (parse_header(buf, len, what, out) != SPES_OK) {
        safetensors_close(out);
        return SPES_ERR;
    }
    return SPES_OK;
}

int safetensors_open(const char *path, SafeTensors *out) {
    MappedFile mf;
    memset(out, 0, sizeof *out);
    SPES_TRY(file_map(path, &mf));
    if (safetensors_parse(mf.data, mf.size, path, out) != SPES_OK) {
        file_unmap(&mf);
        return SPES_ERR;
    }
    out->file = mf;
    return SPES_OK;
}

void safetensors_close(SafeTensors *st) {
    for (int i = 0; i < st->count; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->meta_count; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    file_unmap(&st->file);
    memset(st, 0, sizeof *st);
}

const StTensor *safetensors_find(const SafeTensors *st, const char *name) {
    for (int i = 0; i < st->count; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

const char *safetensors_meta(const SafeTensors *st, const char *key) {
    for (int i = 0; i < st->meta_count; i++)
        if (!strcmp(st->meta_keys[i], key)) return st->meta_values[i];
    return NULL;
}

int safetensors_to_f32(const StTensor *t, float *dst) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case DTYPE_F32:
        memcpy(dst, p, t->numel * 4);
        return SPES_OK;
    case DTYPE_BF16:
        for (size_t i = 0; i < t->numel; i++) dst[i] = bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return SPES_OK;
    case DTYPE_F16:
        for (size_t i = 0; i < t->numel; i++) dst[i] = f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return SPES_OK;
    case DTYPE_F64:
        for (size_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return SPES_OK;
    default:
        return spes_fail("tensor '%s' has dtype %s, expected a float type", t->name, dtype_name(t->dtype));
    }
}

// ---------------------------------------------------------------------------------------
// Writer

static size_t tensor_nbytes(const StWriteTensor *t) {
    size_t n = dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

// The header bytes (length prefix + JSON padded with spaces to a multiple of 8).
int safetensors_build_header(const StWriteTensor *tensors, int n, const char *const *meta_keys,
                        const char *const *meta_values, int n_meta, char **out, size_t *out_len, size_t *data_len) {
    json_t *root = json_object();
    if (!root) return spes_fail("out of memory building safetensors header");
    if (n_meta > 0) {
        json_t *meta = json_object();
        for (int i = 0; i < n_meta; i++) json_object_set_new(meta, meta_keys[i], json_string(meta_values[i]));
        json_object_set_new(root, "__metadata__", meta);
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        const StWriteTensor *t = &tensors[i];
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || (unsigned)t->dtype >= DTYPE_COUNT) {
            json_decref(root);
            return spes_fail("safetensors writer: tensor '%s' has invalid dtype or ndim", t->name);
        }
        if (json_object_get(root, t->name)) {
            json_decref(root);
            return spes_fail("safetensors writer: duplicate tensor name '%s'", t->name);
        }
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        size_t nbytes = tensor_nbytes(t);
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtype_name(t->dtype), "shape", shape,
                                  "data_offsets", (json_int_t)offset, (json_int_t)(offset + nbytes));
        json_object_set_new(root, t->name, entry);
        offset += nbytes;
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return spes_fail("out of memory serialising safetensors header");
    size_t text_len = strlen(text);
    size_t padded = (text_len + 7) & ~(size_t)7;
    char *buf = spes_malloc(8 + padded);
    if (!buf) {
        free(text);
        return SPES_ERR;
    }
    for (int i = 0; i < 8; i++) buf[i] = (char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, text_len);
    memset(buf + 8 + text_len, ' ', padded - text_len);
    free(text);
    *out = buf;
    *out_len = 8 + padded;
    *data_len = offset;
    return SPES_OK;
}

int safetensors_serialized_size(const StWriteTensor *tensors, int n, const char *const *meta_keys,
                                const char *const *meta_values, int n_meta, size_t *len) {
    char *header = NULL;
    size_t header_len = 0, data_len = 0;
    int rc = safetensors_build_header(tensors, n, meta_keys, meta_values, n_meta, &header, &header_len, &data_len);
    free(header);
    *len = rc == SPES_OK ? header_len + data_len : 0;
    return rc;
}

int safetensors_serialize(const StWriteTensor *tensors, int n, const char *const *meta_keys,
                          const char *const *meta_values, int n_meta, uint8_t **out, size_t *out_len) {
    char *header;
    size_t header_len, data_len;
    SPES_TRY(safetensors_build_header(tensors, n, meta_keys, meta_values, n_meta, &header, &header_len, &data_len));
    uint8_t *buf = spes_malloc(header_len + data_len);
    if (!buf) {
        free(header);
        return SPES_ERR;
    }
    memcpy(buf, header, header_len);
    free(header);
    size_t at = header_len;
    for (int i = 0; i < n; i++) {
        size_t nbytes = tensor_nbytes(&tensors[i]);
        if (nbytes) memcpy(buf + at, tensors[i].data, nbytes);
        at += nbytes;
    }
    *out = buf;
    *out_len = at;
    return SPES_OK;
}

int safetensors_write_file(const char *path, const StWriteTensor *tensors, int n, const char *const *meta_keys,
                           const char *const *meta_values, int n_meta) {
    char *header;
    size_t header_len, data_len;
    SPES_TRY(safetensors_build_header(tensors, n, meta_keys, meta_values, n_meta, &header, &header_len, &data_len));
    AtomicFile af;
    if (atomic_file_open(&af, path) != SPES_OK) {
        free(header);
        return SPES_ERR;
    }
    int rc = atomic_file_write(&af, header, header_len);
    free(header);
    for (int i = 0; i < n && rc == SPES_OK; i++) rc = atomic_file_write(&af, tensors[i].data, tensor_nbytes(&tensors[i]));
    if (rc != SPES_OK) {
        atomic_file_abort(&af);
        return SPES_ERR;
    }
    return atomic_file_commit(&af);
}
