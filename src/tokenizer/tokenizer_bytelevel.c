#include "tokenizer/tokenizer_bytelevel.h"

#include "tokenizer/tokenizer_utf8.h"

// The non-printable bytes are 0x00-0x20 (33), 0x7F-0xA0 (34) and 0xAD (1): 68 in all.
uint32_t bytelevel_codepoint(uint8_t b) {
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (uint32_t)(b - 0x7F);
    if (b == 0xAD) return 256 + 67;
    return b;
}

int bytelevel_byte(uint32_t cp) {
    if (cp < 256) return bytelevel_codepoint((uint8_t)cp) == cp ? (int)cp : -1;
    uint32_t n = cp - 256;
    if (n < 33) return (int)n;
    if (n < 67) return (int)(0x7F + n - 33);
    if (n == 67) return 0xAD;
    return -1;
}

int bytelevel_token_to_bytes(const char *token, size_t len, uint8_t *out, size_t *out_len) {
    const uint8_t *s = (const uint8_t *)token;
    size_t i = 0, k = 0;
    while (i < len) {
        size_t n;
        int b = bytelevel_byte(utf8_decode(s + i, &n));
        if (b < 0) return 0;
        out[k++] = (uint8_t)b;
        i += n;
    }
    *out_len = k;
    return 1;
}
