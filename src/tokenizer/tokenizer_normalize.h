// Normalizers of a HF tokenizer.json: NFC (via utf8proc) and Sequence of supported ones.
// Anything else is refused with its name at load time.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct {
    int nfc;    // 1: Unicode NFC
} Normalizer;

// Scratch memory reused across calls (one per encoder).
typedef struct {
    int32_t *codepoints;
    size_t codepoints_cap;
    char *out;
    size_t out_cap;
} NormalizeScratch;

// j: the "normalizer" value (null = none).
int normalizer_parse(const json_t *j, Normalizer *out);
// Normalizes text[0..len) (valid UTF-8). *result points either at text itself (unchanged) or
// into scratch (valid until the next call).
int normalizer_apply(const Normalizer *n, NormalizeScratch *scratch, const char *text, size_t len,
                     const char **result, size_t *result_len);
void normalize_scratch_free(NormalizeScratch *s);
