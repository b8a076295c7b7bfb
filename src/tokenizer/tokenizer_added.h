// Added tokens of a HF tokenizer.json ("added_tokens"): strings that become one id wherever
// they occur, matched before pre-tokenization, leftmost-longest like HF's Aho-Corasick trie.
// HF keeps two sets: tokens with normalized=false are matched on the raw text, tokens with
// normalized=true on the normalized pieces between those. single_word / lstrip / rstrip are
// refused (no byte-level LM tokenizer we target uses them).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "tokenizer/tokenizer_normalize.h"

typedef struct {
    char *content;       // normalized already for normalized=true tokens
    size_t len;
    uint32_t id;
    int special;
} AddedToken;

// One matcher per set: candidates bucketed by first byte, longest first, with a second-byte
// filter so common bytes (spaces) rarely reach a memcmp.
typedef struct {
    AddedToken *tokens;
    int num_tokens;
    int32_t *order;          // token indices grouped by first byte, longest first
    int32_t begin[256], end[256];   // per first byte: its range in order[] (empty when equal)
    uint8_t second[256][32]; // bit set of second bytes per first byte
    uint8_t single[256];     // some candidate with this first byte is one byte long
} AddedMatcher;

typedef struct {
    AddedMatcher raw;         // normalized=false
    AddedMatcher normalized;  // normalized=true
    AddedToken *all;          // every added token, for decoding and EOS lookup
    int num_all;
} AddedVocab;

// j: the "added_tokens" list (may be NULL). model_vocab: the BPE "vocab" object; each token's
// "id" must be the one HF gives it (see check_hf_id). normalizer: applied to normalized=true contents.
int added_vocab_parse(const json_t *j, const json_t *model_vocab, const Normalizer *normalizer, AddedVocab *out);
void added_vocab_free(AddedVocab *v);
// Leftmost-longest match in text[from..len): 1 with *start/*len/*id, or 0.
int added_match(const AddedMatcher *m, const char *text, size_t len, size_t from, size_t *start, size_t *mlen,
                uint32_t *id);
// Id of an added token by content, or -1.
int64_t added_vocab_find(const AddedVocab *v, const char *content);
