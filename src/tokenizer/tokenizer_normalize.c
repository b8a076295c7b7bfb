#include "tokenizer/tokenizer_normalize.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/alloc.h"
#include "base/error.h"

int normalizer_parse(const json_t *j, Normalizer *out) {
    if (!j || json_is_null(j)) return SPES_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return spes_fail("tokenizer.json: normalizer without a \"type\"");
    if (!strcmp(type, "NFC")) {
        out->nfc = 1;   // NFC is idempotent: a Sequence of several is one
        return SPES_OK;
    }
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(j, "normalizers");
        if (!json_is_array(list)) return spes_fail("tokenizer.json: Sequence normalizer without a \"normalizers\" list");
        size_t i;
        const json_t *item;
        json_array_foreach(list, i, item) SPES_TRY(normalizer_parse(item, out));
        return SPES_OK;
    }
    return spes_fail("tokenizer.json: normalizer type \"%s\" is not supported (supported: NFC, Sequence)", type);
}

static int reserve(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return SPES_OK;
    size_t cap2 = *cap ? *cap : 256;
    while (cap2 < need) cap2 *= 2;
    void *grown = spes_realloc(*buf, cap2 * elem);
    if (!grown) return SPES_ERR;
    *buf = grown;
    *cap = cap2;
    return SPES_OK;
}

// NFC of one region, appended to s->out at *pos.
static int nfc_region(NormalizeScratch *s, const uint8_t *text, size_t len, size_t *pos) {
    const utf8proc_option_t opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    utf8proc_ssize_t n;
    for (;;) {
        n = utf8proc_decompose(text, (utf8proc_ssize_t)len, s->codepoints, (utf8proc_ssize_t)s->codepoints_cap, opts);
        if (n < 0) return spes_fail("NFC normalization failed: %s", utf8proc_errmsg(n));
        if ((size_t)n <= s->codepoints_cap) break;
        SPES_TRY(reserve((void **)&s->codepoints, &s->codepoints_cap, (size_t)n, sizeof(int32_t)));
    }
    // Composes in place and writes UTF-8 over the code point buffer (never longer).
    utf8proc_ssize_t bytes = utf8proc_reencode(s->codepoints, n, opts);
    if (bytes < 0) return spes_fail("NFC normalization failed: %s", utf8proc_errmsg(bytes));
    SPES_TRY(reserve((void **)&s->out, &s->out_cap, *pos + (size_t)bytes, 1));
    memcpy(s->out + *pos, s->codepoints, (size_t)bytes);
    *pos += (size_t)bytes;
    return SPES_OK;
}

// NFC only changes text around non-ASCII characters. An ASCII character is a starter that no
// composition takes as its second part, so a region [ASCII char before a non-ASCII run, end of
// the run) normalizes independently of the rest: pure-ASCII text costs one scan.
static int nfc(NormalizeScratch *s, const char *text, size_t len, const char **result, size_t *result_len) {
    const uint8_t *t = (const uint8_t *)text;
    size_t i = 0;
    while (i < len && t[i] < 0x80) i++;
    if (i == len) {
        *result = text;
        *result_len = len;
        return SPES_OK;
    }
    size_t pos = 0, copied = 0;   // text[0..copied) is already in s->out[0..pos)
    SPES_TRY(reserve((void **)&s->out, &s->out_cap, len + 16, 1));
    while (i < len) {
        size_t start = i > copied ? i - 1 : i;   // include the ASCII character before the run
        size_t end = i;
        while (end < len && t[end] >= 0x80) end++;
        SPES_TRY(reserve((void **)&s->out, &s->out_cap, pos + (start - copied), 1));
        memcpy(s->out + pos, text + copied, start - copied);
        pos += start - copied;
        SPES_TRY(nfc_region(s, t + start, end - start, &pos));
        copied = end;
        i = end;
        while (i < len && t[i] < 0x80) i++;
    }
    SPES_TRY(reserve((void **)&s->out, &s->out_cap, pos + (len - copied), 1));
    memcpy(s->out + pos, text + copied, len - copied);
    pos += len - copied;
    if (pos == len && !memcmp(s->out, text, len)) *result = text;   // already NFC
    else *result = s->out;
    *result_len = pos;
    return SPES_OK;
}

int normalizer_apply(const Normalizer *n, NormalizeScratch *s, const char *text, size_t len, const char **result,
                     size_t *result_len) {
    if (!n->nfc) {
        *result = text;
        *result_len = len;
        return SPES_OK;
    }
    return nfc(s, text, len, result, result_len);
}

void normalize_scratch_free(NormalizeScratch *s) {
    free(s->codepoints);
    free(s->out);
    memset(s, 0, sizeof *s);
}
