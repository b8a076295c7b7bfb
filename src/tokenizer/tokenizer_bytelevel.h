// GPT-2's byte-level alphabet: every byte is one printable Unicode character, so byte-level BPE
// vocabularies can hold any byte string. Printable Latin-1 bytes keep their code point; the 68
// others (controls, space, 0x7F-0xA0, 0xAD) map to U+0100, U+0101, ... in byte order.
#pragma once
#include <stddef.h>
#include <stdint.h>

uint32_t bytelevel_codepoint(uint8_t byte);
// The byte a code point stands for, or -1 when it is not in the alphabet.
int bytelevel_byte(uint32_t codepoint);
// A vocab token (UTF-8, alphabet characters) -> raw bytes into out (room for len bytes).
// Returns 1, or 0 when some character is not in the alphabet.
int bytelevel_token_to_bytes(const char *token, size_t len, uint8_t *out, size_t *out_len);
