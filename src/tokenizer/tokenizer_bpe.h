// Byte-level BPE model (the `model` part of a HF tokenizer.json with type "BPE").
//
// A word (one pre-token, raw bytes) starts as one symbol per byte (the byte's GPT-2 alphabet
// character looked up in the vocab), then the adjacent pair with the lowest merge rank is merged
// (leftmost first on ties) until no pair has a merge: exactly the order HF's priority queue
// produces. Short words scan an array of pair ranks; long words use a heap, as HF does, so a
// megabyte-long word stays O(n log n). Results are cached per encoder (BpeCache).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "tokenizer/tokenizer.h"

// Largest model id accepted (ids index dense tables; real vocabularies stay far below it).
#define BPE_MAX_ID ((1u << 24) - 1)

typedef struct BpeModel BpeModel;
typedef struct BpeCache BpeCache;

// model: the "model" object of tokenizer.json. Errors name the unsupported option or the bad
// vocab/merge entry.
int bpe_model_load(const json_t *model, BpeModel **out);
void bpe_model_free(BpeModel *m);
uint32_t bpe_model_vocab_size(const BpeModel *m);     // largest model id + 1
size_t bpe_model_num_merges(const BpeModel *m);
// Model token string (as in vocab, GPT-2 alphabet) for an id, or NULL for a gap.
const char *bpe_model_token(const BpeModel *m, uint32_t id, size_t *len);

int bpe_cache_new(BpeCache **out);
void bpe_cache_free(BpeCache *c);

// Appends the ids of one word (raw bytes, len >= 1) to out.
int bpe_encode_word(const BpeModel *m, BpeCache *cache, const uint8_t *word, size_t len, IdBuffer *out);

// The two merge loops, exposed so tests can check they agree. symbols[0..n) in, merged in
// place; returns the new count.
size_t bpe_merge_linear(const BpeModel *m, uint32_t *symbols, size_t n);
int bpe_merge_heap(const BpeModel *m, uint32_t *symbols, size_t n, size_t *out_n);
