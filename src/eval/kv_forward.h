// Incremental forward with a key/value cache: feed tokens in chunks, each chunk attends to
// everything fed before it, nothing is recomputed. Used by `spes generate` (prefill the
// prompt, then one token per step) and by multiple-choice scoring (prefill a shared
// context once, then score each choice from there after kv_cache_truncate).
//
// Same maths as model_forward, over the same ops (src/ops/ops.h) and the model's parameter
// table; only attention differs, reading keys/values from the cache (eval/kv_attention.h).
#pragma once
#include <stdint.h>

#include "model/model.h"

typedef struct KvScratch KvScratch;   // per-chunk activations, grown on demand

typedef struct {
    const Model *model;
    int capacity;           // positions the cache can hold (<= model max_seq_len)
    int len;                // positions filled so far
    float *k, *v;           // [L, capacity, n_kv_heads*head_dim] after QK-norm and RoPE
    float *rope_cos, *rope_sin;   // [capacity, head_dim/2]
    const float **layer_params;   // resolved tensor pointers (see kv_forward.c)
    KvScratch *scratch;
} KvCache;

// capacity <= 0: the model's max_seq_len. The model must outlive the cache.
int kv_cache_create(KvCache *cache, const Model *model, int capacity);
void kv_cache_free(KvCache *cache);
// Forget positions >= len (0 <= len <= cache->len): the next chunk continues from len.
void kv_cache_truncate(KvCache *cache, int len);

// Appends tokens[n] at positions cache->len .. cache->len+n-1. When logits != NULL it
// receives the logits of the LAST n_logits positions of the chunk (1 <= n_logits <= n),
// [n_logits, embedding_size]. Errors: the cache would overflow, or a token id is outside
// the embedding table (named with its position).
int kv_forward(KvCache *cache, const int32_t *tokens, int n, float *logits, int n_logits);
