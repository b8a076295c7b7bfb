// Text -> token ids, byte-identical to Hugging Face `tokenizers` for byte-level BPE models.
//
// Loads a tokenizer.json (or a directory holding one, plus tokenizer_config.json and
// special_tokens_map.json when present, for the EOS and BOS tokens). The pipeline is HF's:
//   1. added tokens with normalized=false are matched on the raw text (leftmost-longest);
//   2. the pieces between them are normalized (NFC, Sequence);
//   3. added tokens with normalized=true are matched on the normalized pieces;
//   4. the remaining pieces are pre-tokenized (Split regex via PCRE2, ByteLevel, Digits, Sequence);
//   5. every pre-token goes through the byte-level BPE model (rank-ordered merges, word cache).
// Anything else a tokenizer.json may use gets an error naming the feature, never a silent
// difference. Text must be valid UTF-8 (HF works on Unicode strings and cannot encode bytes that
// are not): invalid UTF-8 is an error naming the byte offset.
//
// Built-in "bytes" tokenizer (no file): ids 0..255 are the bytes, 256 is EOS, vocab size 257.
//
// Threads: a Tokenizer is read-only after loading and may be shared; each thread encodes with
// its own TokenEncoder (regex match data, word cache and scratch buffers live there).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;
typedef struct TokenEncoder TokenEncoder;

// Growable array of token ids.
typedef struct {
    uint32_t *ids;
    size_t len;
    size_t cap;
} IdBuffer;

int id_buffer_push(IdBuffer *b, uint32_t id);
void id_buffer_free(IdBuffer *b);

// path: "bytes", a tokenizer.json file, or a directory with tokenizer.json in it.
int tokenizer_load(const char *path, Tokenizer **out);
// Same, from JSON text already in memory (tests build tokenizers this way). config_json (the
// content of a tokenizer_config.json, may be NULL) names the EOS and BOS tokens.
int tokenizer_load_json(const char *json, size_t len, const char *config_json, const char *origin, Tokenizer **out);
void tokenizer_free(Tokenizer *tok);

// Largest id + 1 (model vocab and added tokens together).
uint32_t tokenizer_vocab_size(const Tokenizer *tok);
// The EOS id as HF AutoTokenizer picks it: the eos_token of special_tokens_map.json when
// tokenizer_config.json has no "added_tokens_decoder" (a legacy one, or none) and that file has
// the key, else tokenizer_config.json's eos_token; when neither file names one (AutoTokenizer
// then has none), the first added special token among <|endoftext|>, </s>, <eos>,
// <|end_of_text|>, <|im_end|>. A special token those files name and tokenizer.json lacks is
// appended as a new special token with the next free id, as transformers does (so is any other
// special token they name: unk, sep, pad, cls, mask, additional / extra).
// Returns -1 when none is known (callers then need an explicit --eos_id).
int64_t tokenizer_eos_id(const Tokenizer *tok);
// The BOS id as AutoTokenizer picks it: the bos_token of the same files, in the same order;
// -1 when they name none (no convention: AutoTokenizer then has none; "bytes" has none).
int64_t tokenizer_bos_id(const Tokenizer *tok);
// A short description ("BPE vocab 100278, 100000 merges, 22 added tokens, NFC, ...") for logs.
const char *tokenizer_describe(const Tokenizer *tok);

int tokenizer_encoder_new(const Tokenizer *tok, TokenEncoder **out);
void tokenizer_encoder_free(TokenEncoder *enc);
// Appends the ids of text[0..len) to out (no BOS/EOS: like HF encode(add_special_tokens=False)).
int tokenizer_encode(TokenEncoder *enc, const char *text, size_t len, IdBuffer *out);

// ids -> bytes (HF's ByteLevel decoder before its lossy UTF-8 step), appended to a malloc'd
// buffer *text of *len bytes (*text may start NULL). An id out of range is an error.
int tokenizer_decode(const Tokenizer *tok, const uint32_t *ids, size_t n, char **text, size_t *len);
