// libFuzzer harness for the tokenizer. First byte even: the rest is a tokenizer.json (outside
// bytes, must load or fail cleanly; when it loads, a fixed text is encoded and decoded). First
// byte odd: the rest is text for a small fixed tokenizer with NFC, a Split regex, Digits,
// ByteLevel, merges and normal + normalized added tokens (must encode or refuse invalid UTF-8).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char FIXED[] =
    "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "  {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+(?!\\\\S)|\\\\p{L}+|[^\\\\s\\\\p{L}]+\"}, \"behavior\": \"MergedWithNext\", \"invert\": false},"
    "  {\"type\": \"Digits\", \"individual_digits\": true},"
    "  {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}]},"
    " \"added_tokens\": [{\"id\": 258, \"content\": \"<|x|>\", \"normalized\": false, \"special\": true},"
    "                  {\"id\": 259, \"content\": \"  \", \"normalized\": true, \"special\": false}],"
    " \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"model\": {\"type\": \"BPE\", \"merges\": [\"a b\", \"ab c\"], \"vocab\": {VOCAB}}}";

static Tokenizer *fixed;

// The fixed tokenizer's vocab: the 256 byte-level symbols (as \u escapes), "ab", "abc".
static Tokenizer *load_fixed(void) {
    char *json = malloc(sizeof FIXED + 256 * 16 + 64);
    const char *hole = strstr(FIXED, "{VOCAB}");
    size_t k = (size_t)(hole - FIXED);
    memcpy(json, FIXED, k);
    json[k++] = '{';
    for (int b = 0; b < 256; b++) {
        unsigned cp = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? (unsigned)b
                      : b <= 0x20                                                   ? 256u + (unsigned)b
                      : b <= 0xA0                                                   ? 256u + 33u + (unsigned)(b - 0x7F)
                                                                                    : 256u + 67u;
        k += (size_t)sprintf(json + k, "\"\\u%04x\": %d, ", cp, b);
    }
    k += (size_t)sprintf(json + k, "\"ab\": 256, \"abc\": 257}");
    strcpy(json + k, hole + 7);
    Tokenizer *t = NULL;
    tokenizer_load_json(json, strlen(json), NULL, "fuzz-fixed", &t);
    free(json);
    return t;
}

static void round_trip(Tokenizer *t, const char *text, size_t len) {
    TokenEncoder *enc;
    if (tokenizer_encoder_new(t, &enc) != 0) return;
    IdBuffer ids = {0};
    if (tokenizer_encode(enc, text, len, &ids) == 0) {
        char *out = NULL;
        size_t out_len = 0;
        if (tokenizer_decode(t, ids.ids, ids.len, &out, &out_len) != 0) abort();   // our own ids must decode
        free(out);
    }
    id_buffer_free(&ids);
    tokenizer_encoder_free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] & 1) {
        if (!fixed && !(fixed = load_fixed())) abort();
        round_trip(fixed, (const char *)data + 1, size - 1);
        return 0;
    }
    Tokenizer *t;
    if (tokenizer_load_json((const char *)data + 1, size - 1, NULL, "fuzz", &t) != 0) return 0;
    static const char sample[] = "Hello <|endoftext|> w\xc3\xb6rld 12345  \n\t caf\x65\xcc\x81";
    round_trip(t, sample, sizeof sample - 1);
    tokenizer_free(t);
    return 0;
}
