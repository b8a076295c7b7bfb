// Token files: raw little-endian arrays and real .npy files (see npy.h).
// The .npy header is a Python dict literal, e.g.
//   {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }
// padded with spaces and ended by '\n'. We parse exactly that grammar, nothing more.
#include "io/npy.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/mapped_read.h"

static const uint8_t NPY_MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static const struct {
    TokenDtype dtype;
    const char *name;
    const char *descr;    // numpy's dtype string, little-endian
    size_t size;
} DTYPES[] = {
    {TOKEN_U16, "uint16", "<u2", 2}, {TOKEN_U32, "uint32", "<u4", 4}, {TOKEN_U8, "uint8", "|u1", 1},
    {TOKEN_I32, "int32", "<i4", 4},  {TOKEN_U64, "uint64", "<u8", 8}, {TOKEN_I64, "int64", "<i8", 8},
};
#define NUM_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

size_t token_dtype_size(TokenDtype dt) { return DTYPES[dt].size; }
const char *token_dtype_name(TokenDtype dt) { return DTYPES[dt].name; }

int token_dtype_parse_raw(const char *name, TokenDtype *out) {
    if (!strcmp(name, "uint16") || !strcmp(name, "u2") || !strcmp(name, "np.uint16")) *out = TOKEN_U16;
    else if (!strcmp(name, "uint32") || !strcmp(name, "u4") || !strcmp(name, "np.uint32")) *out = TOKEN_U32;
    else return spes_fail("unknown token dtype '%s' (expected uint16 or uint32)", name);
    return SPES_OK;
}

// --- header dict parser ------------------------------------------------------------------

typedef struct {
    const char *p, *end;
} HeaderCursor;

static void skip_space(HeaderCursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int expect_char(HeaderCursor *c, char ch) {
    skip_space(c);
    if (c->p >= c->end || *c->p != ch) return 0;
    c->p++;
    return 1;
}

// A quoted Python string ('...' or "...", no escapes: npy headers never need them).
static int parse_quoted(HeaderCursor *c, const char **s, size_t *len) {
    skip_space(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char quote = *c->p++;
    const char *start = c->p;
    while (c->p < c->end && *c->p != quote) c->p++;
    if (c->p >= c->end) return 0;
    *s = start;
    *len = (size_t)(c->p - start);
    c->p++;
    return 1;
}

static int parse_word(HeaderCursor *c, const char *word) {
    skip_space(c);
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

// (d0, d1, ...) -> product of the dims, overflow-checked. "()" is a scalar: rejected.
static int parse_shape(HeaderCursor *c, uint64_t *count, int *ndim) {
    if (!expect_char(c, '(')) return 0;
    uint64_t product = 1;
    *ndim = 0;
    for (;;) {
        skip_space(c);
        if (c->p < c->end && *c->p == ')') {
            c->p++;
            break;
        }
        if (c->p >= c->end || !isdigit((unsigned char)*c->p)) return 0;
        uint64_t dim = 0;
        while (c->p < c->end && isdigit((unsigned char)*c->p)) {
            unsigned digit = (unsigned)(*c->p++ - '0');
            if (dim > (UINT64_MAX - digit) / 10) return 0;
            dim = dim * 10 + digit;
        }
        if (c->p < c->end && *c->p == 'L') c->p++;   // Python 2 long suffix in old files
        if (dim && product > UINT64_MAX / dim) return 0;
        product *= dim;
        (*ndim)++;
        skip_space(c);
        if (c->p < c->end && *c->p == ',') c->p++;
    }
    *count = product;
    return *ndim > 0;
}

static int parse_header_dict(const char *text, size_t len, const char *what, TokenDtype *dtype, uint64_t *count) {
    HeaderCursor c = {text, text + len};
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!expect_char(&c, '{')) return spes_fail("%s: npy header is not a dict", what);
    for (;;) {
        if (expect_char(&c, '}')) break;
        const char *key;
        size_t key_len;
        if (!parse_quoted(&c, &key, &key_len) || !expect_char(&c, ':'))
            return spes_fail("%s: malformed npy header near offset %zu", what, (size_t)(c.p - text));
        if (key_len == 5 && !memcmp(key, "descr", 5)) {
            const char *d;
            size_t dl;
            if (!parse_quoted(&c, &d, &dl)) return spes_fail("%s: npy 'descr' is not a simple dtype string", what);
            size_t i = 0;
            for (; i < NUM_DTYPES; i++)
                if (strlen(DTYPES[i].descr) == dl && !memcmp(DTYPES[i].descr, d, dl)) break;
            if (i == NUM_DTYPES)
                return spes_fail("%s: npy dtype '%.*s' is not a token dtype (expected <u2, <u4, <i4, <u8, <i8 or |u1, "
                                 "little-endian)", what, (int)dl, d);
            *dtype = DTYPES[i].dtype;
            have_descr = 1;
        } else if (key_len == 13 && !memcmp(key, "fortran_order", 13)) {
            if (parse_word(&c, "False")) have_order = 1;
            else if (parse_word(&c, "True")) return spes_fail("%s: npy array is in Fortran order (expected C order)", what);
            else return spes_fail("%s: npy 'fortran_order' is neither True nor False", what);
        } else if (key_len == 5 && !memcmp(key, "shape", 5)) {
            int ndim;
            if (!parse_shape(&c, count, &ndim)) return spes_fail("%s: npy 'shape' is not a tuple of sizes", what);
            have_shape = 1;
        } else {
            return spes_fail("%s: unexpected key '%.*s' in npy header", what, (int)key_len, key);
        }
        if (expect_char(&c, ',')) continue;
        if (expect_char(&c, '}')) break;
        return spes_fail("%s: malformed npy header near offset %zu", what, (size_t)(c.p - text));
    }
    if (!have_descr || !have_order || !have_shape)
        return spes_fail("%s: npy header lacks %s", what, !have_descr ? "'descr'" : !have_order ? "'fortran_order'" : "'shape'");
    return SPES_OK;
}

// --- reading -----------------------------------------------------------------------------

int token_file_parse(const uint8_t *buf, size_t len, TokenDtype raw_dtype, const char *what, TokenFile *out) {
    memset(out, 0, sizeof *out);
    if (len >= sizeof NPY_MAGIC && !memcmp(buf, NPY_MAGIC, sizeof NPY_MAGIC)) {
        if (len < 10) return spes_fail("%s: truncated npy header (%zu bytes)", what, len);
        uint8_t major = buf[6];
        size_t header_len, prefix;
        if (major == 1) {
            header_len = (size_t)buf[8] | (size_t)buf[9] << 8;
            prefix = 10;
        } else if (major == 2 || major == 3) {
            if (len < 12) return spes_fail("%s: truncated npy header (%zu bytes)", what, len);
            header_len = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
            prefix = 12;
        } else {
            return spes_fail("%s: unsupported npy format version %u.%u", what, major, buf[7]);
        }
        if (header_len > len - prefix)
            return spes_fail("%s: npy header claims %zu bytes but the file has only %zu after the prefix", what,
                             header_len, len - prefix);
        TokenDtype dtype = TOKEN_U16;
        uint64_t count = 0;
        SPES_TRY(parse_header_dict((const char *)buf + prefix, header_len, what, &dtype, &count));
        size_t data_offset = prefix + header_len;
        size_t elem = token_dtype_size(dtype);
        uint64_t have = len - data_offset;
        if (count > UINT64_MAX / elem || count * elem != have)
            return spes_fail("%s: npy shape says %" PRIu64 " elements of %zu bytes, but %" PRIu64
                             " data bytes follow the header (truncated or corrupt file)", what, count, elem, have);
        out->data = buf + data_offset;
        out->count = count;
        out->dtype = dtype;
        out->elem_size = elem;
        out->has_npy_header = 1;
        return SPES_OK;
    }
    if (raw_dtype != TOKEN_U16 && raw_dtype != TOKEN_U32)
        return spes_fail("%s: raw token files are uint16 or uint32, not %s", what, token_dtype_name(raw_dtype));
    size_t elem = token_dtype_size(raw_dtype);
    if (len % elem != 0)
        return spes_fail("%s: %zu bytes is not a whole number of %s tokens (wrong data.memmap_dtype, or a truncated "
                         "file?)", what, len, token_dtype_name(raw_dtype));
    out->data = buf;
    out->count = len / elem;
    out->dtype = raw_dtype;
    out->elem_size = elem;
    return SPES_OK;
}

int token_file_open(const char *path, TokenDtype raw_dtype, TokenFile *out) {
    MappedFile mf;
    SPES_TRY(file_map(path, &mf));
    if (token_file_parse(mf.data, mf.size, raw_dtype, path, out) != SPES_OK) {
        file_unmap(&mf);
        return SPES_ERR;
    }
    out->file = mf;
    return SPES_OK;
}

void token_file_close(TokenFile *tf) {
    file_unmap(&tf->file);
    memset(tf, 0, sizeof *tf);
}

uint64_t token_file_get(const TokenFile *tf, uint64_t i) {
    const uint8_t *p = tf->data + i * tf->elem_size;
    uint64_t v = 0;
    for (size_t b = 0; b < tf->elem_size; b++) v |= (uint64_t)p[b] << (8 * b);
    return v;
}

typedef struct {
    const TokenFile *tf;
    uint64_t start;
    size_t n;
    uint32_t *dst;
} TokenRead;

static int read_tokens(void *ctx) {
    const TokenRead *r = ctx;
    const TokenFile *tf = r->tf;
    const uint8_t *p = tf->data + r->start * tf->elem_size;
    switch (tf->dtype) {
    case TOKEN_U16:
        for (size_t i = 0; i < r->n; i++) r->dst[i] = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
        return SPES_OK;
    case TOKEN_U32:
        memcpy(r->dst, p, r->n * 4);    // little-endian host (x86-64, aarch64)
        return SPES_OK;
    default:
        break;
    }
    int is_signed = tf->dtype == TOKEN_I32 || tf->dtype == TOKEN_I64;
    for (size_t i = 0; i < r->n; i++) {
        uint64_t v = token_file_get(tf, r->start + i);
        if (is_signed && tf->elem_size == 4 && (v & 0x80000000u))
            return spes_fail("negative token id %d at position %" PRIu64, (int32_t)(uint32_t)v, r->start + i);
        if (v > UINT32_MAX)
            return spes_fail("token id %" PRId64 " at position %" PRIu64 " does not fit in 32 bits", (int64_t)v,
                             r->start + i);
        r->dst[i] = (uint32_t)v;
    }
    return SPES_OK;
}

int token_file_read_u32(const TokenFile *tf, uint64_t start, size_t n, uint32_t *dst) {
    if (start > tf->count || n > tf->count - start)
        return spes_fail("token range [%" PRIu64 ", %" PRIu64 ") is outside a file of %" PRIu64 " tokens", start,
                         start + n, tf->count);
    bool truncated;
    int rc = mapped_read(read_tokens, &(TokenRead){tf, start, n, dst}, &truncated);
    if (truncated)
        return spes_fail("the file is shorter than the %zu bytes it had when it was opened (reading tokens [%" PRIu64
                         ", %" PRIu64 ")): it was cut or rewritten in place since; a new version of a data file "
                         "must get a new name, or be written beside and renamed over it",
                         tf->file.size, start, start + n);
    return rc;
}

// --- writing -----------------------------------------------------------------------------

int npy_write(const char *path, TokenDtype dtype, const void *data, uint64_t count) {
    size_t elem = token_dtype_size(dtype);
    if (count > SIZE_MAX / elem) return spes_fail("npy_write %s: %" PRIu64 " elements overflow", path, count);
    // Header: magic, version 1.0, u16 length, dict, spaces, '\n'; total a multiple of 64.
    char dict[128];
    int dict_len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRIu64 ",), }",
                            DTYPES[dtype].descr, count);
    size_t unpadded = 10 + (size_t)dict_len + 1;
    size_t total = (unpadded + 63) / 64 * 64;
    uint8_t header[192];
    memcpy(header, NPY_MAGIC, 6);
    header[6] = 1;
    header[7] = 0;
    header[8] = (uint8_t)((total - 10) & 0xff);
    header[9] = (uint8_t)((total - 10) >> 8);
    memcpy(header + 10, dict, (size_t)dict_len);
    memset(header + 10 + dict_len, ' ', total - 10 - (size_t)dict_len - 1);
    header[total - 1] = '\n';
    AtomicFile af;
    SPES_TRY(atomic_file_open(&af, path));
    if (atomic_file_write(&af, header, total) != SPES_OK || atomic_file_write(&af, data, (size_t)count * elem) != SPES_OK) {
        atomic_file_abort(&af);
        return SPES_ERR;
    }
    return atomic_file_commit(&af);
}
