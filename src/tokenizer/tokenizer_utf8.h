// UTF-8 helpers for the tokenizer: strict validation (what HF's str input guarantees), encode
// and decode of one code point.
#pragma once
#include <stddef.h>
#include <stdint.h>

// 1 when text[0..len) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF); otherwise 0
// and *bad_offset is the offset of the first byte that does not start a valid sequence.
int utf8_valid(const uint8_t *text, size_t len, size_t *bad_offset);
// Writes cp (<= U+10FFFF) as 1-4 bytes, returns the count.
size_t utf8_encode(uint32_t cp, char *out);
// Decodes the code point at text[0..] of VALID UTF-8; *cp_len gets its byte length.
uint32_t utf8_decode(const uint8_t *text, size_t *cp_len);
