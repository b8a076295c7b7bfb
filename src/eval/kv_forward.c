#include "eval/kv_forward.h"

#include <string.h>

#include "base/error.h"
#include "base/threads.h"

int kv_cache_create(KvCache *cache, Model *model, int capacity) {
    memset(cache, 0, sizeof *cache);
    const ModelConfig *c = &model->cfg;
    Backend *be = model->be;
    if (capacity <= 0 || capacity > c->max_seq_len) capacity = c->max_seq_len;
    cache->model = model;
    cache->capacity = capacity;
    const size_t kd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t kv_bytes = (size_t)c->n_layers * capacity * kd * num_type_size(be->compute);
    const size_t rope_bytes = (size_t)capacity * (size_t)(c->head_dim / 2) * sizeof(float);
    void *cos_t = NULL, *sin_t = NULL;
    if (backend_alloc(be, kv_bytes, &cache->k) != SPES_OK || backend_alloc(be, kv_bytes, &cache->v) != SPES_OK ||
        backend_alloc(be, rope_bytes, &cos_t) != SPES_OK || backend_alloc(be, rope_bytes, &sin_t) != SPES_OK) {
        cache->rope_cos = cos_t;
        cache->rope_sin = sin_t;
        kv_cache_free(cache);
        return spes_fail_context("KV cache for %d positions", capacity);
    }
    cache->rope_cos = cos_t;
    cache->rope_sin = sin_t;
    be->ops->rope_tables(be, cache->rope_cos, cache->rope_sin, capacity, c->head_dim, c->rope_theta);
    return SPES_OK;
}

void kv_cache_free(KvCache *cache) {
    if (cache->model) {
        Backend *be = cache->model->be;
        backend_free(be, cache->k);
        backend_free(be, cache->v);
        backend_free(be, cache->rope_cos);
        backend_free(be, cache->rope_sin);
    }
    memset(cache, 0, sizeof *cache);
}

void kv_cache_truncate(KvCache *cache, int len) {
    if (len >= 0 && len <= cache->len) cache->len = len;
}

static int forward_chunk(KvCache *cache, const int32_t *tokens, int n, float *logits, int n_logits) {
    const ModelConfig *c = &cache->model->cfg;
    const NumType ct = cache->model->be->compute;
    const ModelKvCache desc = {.k = buf_of(cache->k, ct),
                               .v = buf_of(cache->v, ct),
                               .layer_stride = (size_t)cache->capacity * c->n_kv_heads * c->head_dim,
                               .rope_cos = cache->rope_cos,
                               .rope_sin = cache->rope_sin,
                               .capacity = cache->capacity};
    SPES_TRY(model_forward_kv(cache->model, &desc, cache->len, tokens, n, logits, n_logits));
    cache->len += n;
    return SPES_OK;
}

// Chunks shorter than this (decode steps, short continuations) run on one cpu thread: each
// op is then microseconds of work, less than an OpenMP barrier, and on a busy machine a
// barrier waiting for a descheduled thread costs milliseconds (decoding measured 10x slower
// with 2 threads than with 1 on the loaded 2-core CI box). PyTorch's grain-size rule.
#define KV_MIN_TOKENS_FOR_THREADS 16

int kv_forward(KvCache *cache, const int32_t *tokens, int n, float *logits, int n_logits) {
    const int threads = threads_get();
    if (n >= KV_MIN_TOKENS_FOR_THREADS || threads == 1 || !cache->model->be->host_memory)
        return forward_chunk(cache, tokens, n, logits, n_logits);
    threads_set(1);
    int status = forward_chunk(cache, tokens, n, logits, n_logits);
    threads_set(threads);
    return status;
}
