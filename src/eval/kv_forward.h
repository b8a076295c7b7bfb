// Incremental forward with a key/value cache: feed tokens in chunks, each chunk attends to
// everything fed before it, nothing is recomputed. Used by `spes generate` (prefill the
// prompt, then one token per step) and by multiple-choice scoring (prefill a shared
// context once, then score each choice from there after kv_cache_truncate).
//
// The cache is backend memory of the model's backend; the forward is the model's own
// per-layer code (model_forward_kv), so eval and training never diverge.
#pragma once
#include <stdint.h>

#include "model/model.h"

typedef struct {
    Model *model;
    int capacity;           // positions the cache can hold (<= model max_seq_len)
    int len;                // positions filled so far
    void *k, *v;            // backend [L, capacity, n_kv_heads*head_dim] in the compute type, after QK-norm and RoPE
    float *rope_cos, *rope_sin;   // backend [capacity, head_dim/2]
} KvCache;

// capacity <= 0: the model's max_seq_len. The model must outlive the cache.
int kv_cache_create(KvCache *cache, Model *model, int capacity);
void kv_cache_free(KvCache *cache);
// Forget positions >= len (0 <= len <= cache->len): the next chunk continues from len.
void kv_cache_truncate(KvCache *cache, int len);

// Appends tokens[n] at positions cache->len .. cache->len+n-1. When logits != NULL it
// receives the logits of the LAST n_logits positions of the chunk (1 <= n_logits <= n),
// [n_logits, embedding_size]. Errors: the cache would overflow, or a token id is outside
// the embedding table (named with its position).
int kv_forward(KvCache *cache, const int32_t *tokens, int n, float *logits, int n_logits);
