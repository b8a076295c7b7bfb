#include "eval/kv_forward.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/threads.h"
#include "ops/cpu/cpu_ops.h"

// Tensor pointers per layer, resolved once (the table lookup is linear in its size).
enum {
    LP_ATTN_NORM = 0,
    LP_Q,
    LP_K,
    LP_V,
    LP_O,
    LP_Q_NORM,
    LP_K_NORM,
    LP_MLP_NORM,
    LP_ROUTER,
    LP_FIXED_COUNT   // then per expert: gate (stacked with up right after it), down
};
#define LP_EXPERT_GATE(e) (LP_FIXED_COUNT + 2 * (e))
#define LP_EXPERT_DOWN(e) (LP_FIXED_COUNT + 2 * (e) + 1)

struct KvScratch {
    int rows;               // chunk length the buffers hold
    float *x, *xn, *rstd;   // [n, H], [n, H], [n * max(nh, 1)]
    float *q, *qn, *att;    // [n, nh*hd]
    float *kn;              // [n, nkv*hd] pre-norm keys (QK-norm needs a separate output)
    float *router_logits, *probs, *lse;   // [n, E], [n, E], [n]
    int32_t *topk_idx, *offsets, *row_token, *row_of_slot;
    float *topk_w;          // [n, k]
    float *xe, *gu, *act, *ye;   // [n*k, H], [n*k, 2I], [n*k, I], [n*k, H]
    float *attn_scratch;    // [n * nh] attention logsumexp
    int attn_threads;
};

static int layer_stride(const ModelConfig *c) { return LP_FIXED_COUNT + 2 * c->num_experts; }

static const float *param_or_null(const Model *m, ParamKind kind, int layer, int expert) {
    int i = param_table_index(&m->table, kind, layer, expert);
    return i < 0 ? NULL : m->params + m->table.entries[i].offset;
}

static void scratch_free(KvScratch *s) {
    if (!s) return;
    float *floats[] = {s->x, s->xn, s->rstd, s->q, s->qn, s->att, s->kn, s->router_logits, s->probs, s->lse,
                       s->topk_w, s->xe, s->gu, s->act, s->ye, s->attn_scratch};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) spes_free_aligned(floats[i]);
    int32_t *ints[] = {s->topk_idx, s->offsets, s->row_token, s->row_of_slot};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) spes_free_aligned(ints[i]);
    memset(s, 0, sizeof *s);
}

// Buffers for chunks of up to n tokens.
static int scratch_reserve(KvCache *cache, int n) {
    KvScratch *s = cache->scratch;
    if (s->rows >= n && s->attn_threads >= omp_get_max_threads()) return SPES_OK;
    if (s->rows > n) n = s->rows;
    const ModelConfig *c = &cache->model->cfg;
    const size_t H = (size_t)c->d_model, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t E = (size_t)c->num_experts, k = (size_t)c->top_k, I = (size_t)c->expert_hidden, N = (size_t)n;
    scratch_free(s);
    s->x = spes_alloc_aligned(N * H * sizeof(float));
    s->xn = spes_alloc_aligned(N * H * sizeof(float));
    s->rstd = spes_alloc_aligned(N * (size_t)(c->n_heads + c->n_kv_heads + 1) * sizeof(float));
    s->q = spes_alloc_aligned(N * qd * sizeof(float));
    s->qn = spes_alloc_aligned(N * qd * sizeof(float));
    s->att = spes_alloc_aligned(N * qd * sizeof(float));
    s->kn = spes_alloc_aligned(N * kd * sizeof(float));
    s->router_logits = spes_alloc_aligned(N * E * sizeof(float));
    s->probs = spes_alloc_aligned(N * E * sizeof(float));
    s->lse = spes_alloc_aligned(N * sizeof(float));
    s->topk_w = spes_alloc_aligned(N * k * sizeof(float));
    s->topk_idx = spes_alloc_aligned(N * k * sizeof(int32_t));
    s->offsets = spes_alloc_aligned((E + 1) * sizeof(int32_t));
    s->row_token = spes_alloc_aligned(N * k * sizeof(int32_t));
    s->row_of_slot = spes_alloc_aligned(N * k * sizeof(int32_t));
    s->xe = spes_alloc_aligned(N * k * H * sizeof(float));
    s->gu = spes_alloc_aligned(N * k * 2 * I * sizeof(float));
    s->act = spes_alloc_aligned(N * k * I * sizeof(float));
    s->ye = spes_alloc_aligned(N * k * H * sizeof(float));
    s->attn_scratch = spes_alloc_aligned(N * (size_t)c->n_heads * sizeof(float));
    if (!s->x || !s->xn || !s->rstd || !s->q || !s->qn || !s->att || !s->kn || !s->router_logits || !s->probs ||
        !s->lse || !s->topk_w || !s->topk_idx || !s->offsets || !s->row_token || !s->row_of_slot || !s->xe ||
        !s->gu || !s->act || !s->ye || !s->attn_scratch) {
        scratch_free(s);
        return spes_fail_context("KV-cache forward buffers for a chunk of %d tokens", n);
    }
    s->rows = n;
    s->attn_threads = omp_get_max_threads();
    return SPES_OK;
}

int kv_cache_create(KvCache *cache, const Model *model, int capacity) {
    memset(cache, 0, sizeof *cache);
    const ModelConfig *c = &model->cfg;
    if (capacity <= 0 || capacity > c->max_seq_len) capacity = c->max_seq_len;
    cache->model = model;
    cache->capacity = capacity;
    const size_t kd = (size_t)c->n_kv_heads * c->head_dim, per_layer = (size_t)capacity * kd;
    const int stride = layer_stride(c);
    cache->k = spes_alloc_aligned((size_t)c->n_layers * per_layer * sizeof(float));
    cache->v = spes_alloc_aligned((size_t)c->n_layers * per_layer * sizeof(float));
    cache->rope_cos = spes_alloc_aligned((size_t)capacity * (size_t)(c->head_dim / 2) * sizeof(float));
    cache->rope_sin = spes_alloc_aligned((size_t)capacity * (size_t)(c->head_dim / 2) * sizeof(float));
    cache->layer_params = spes_calloc((size_t)c->n_layers * (size_t)stride, sizeof(float *));
    cache->scratch = spes_calloc(1, sizeof(KvScratch));
    if (!cache->k || !cache->v || !cache->rope_cos || !cache->rope_sin || !cache->layer_params || !cache->scratch) {
        kv_cache_free(cache);
        return spes_fail_context("KV cache for %d positions", capacity);
    }
    op_rope_tables(cache->rope_cos, cache->rope_sin, capacity, c->head_dim, c->rope_theta);
    static const ParamKind fixed_kinds[LP_FIXED_COUNT] = {PARAM_ATTN_NORM, PARAM_Q,      PARAM_K,
                                                          PARAM_V,         PARAM_O,      PARAM_Q_NORM,
                                                          PARAM_K_NORM,    PARAM_MLP_NORM, PARAM_ROUTER};
    for (int l = 0; l < c->n_layers; l++) {
        const float **lp = cache->layer_params + (size_t)l * stride;
        for (int i = 0; i < LP_FIXED_COUNT; i++) lp[i] = param_or_null(model, fixed_kinds[i], l, -1);
        for (int e = 0; e < c->num_experts; e++) {
            lp[LP_EXPERT_GATE(e)] = param_or_null(model, PARAM_EXPERT_GATE, l, e);
            lp[LP_EXPERT_DOWN(e)] = param_or_null(model, PARAM_EXPERT_DOWN, l, e);
        }
    }
    return SPES_OK;
}

void kv_cache_free(KvCache *cache) {
    spes_free_aligned(cache->k);
    spes_free_aligned(cache->v);
    spes_free_aligned(cache->rope_cos);
    spes_free_aligned(cache->rope_sin);
    free(cache->layer_params);
    scratch_free(cache->scratch);
    free(cache->scratch);
    memset(cache, 0, sizeof *cache);
}

void kv_cache_truncate(KvCache *cache, int len) {
    if (len >= 0 && len <= cache->len) cache->len = len;
}

// x[n, H] += o_proj(attention(rope(qk_norm(q, k)), v)) of input_layernorm(x); the chunk's
// keys and values land in the cache at positions past .. past+n-1.
static void attention_block(KvCache *cache, int l, int n, int past) {
    const ModelConfig *c = &cache->model->cfg;
    KvScratch *s = cache->scratch;
    const float **lp = cache->layer_params + (size_t)l * layer_stride(c);
    const int H = c->d_model, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    const int qd = nh * hd, kd = nkv * hd;
    float *k_layer = cache->k + (size_t)l * cache->capacity * kd, *v_layer = cache->v + (size_t)l * cache->capacity * kd;
    float *k_new = k_layer + (size_t)past * kd, *v_new = v_layer + (size_t)past * kd;

    op_rmsnorm_forward(s->xn, s->rstd, s->x, lp[LP_ATTN_NORM], n, H, c->norm_eps);
    op_linear_forward(s->q, s->xn, lp[LP_Q], n, H, qd, false);
    op_linear_forward(c->qk_norm == QK_NORM_NONE ? k_new : s->kn, s->xn, lp[LP_K], n, H, kd, false);
    op_linear_forward(v_new, s->xn, lp[LP_V], n, H, kd, false);
    float *q = s->q;
    if (c->qk_norm != QK_NORM_NONE) {
        // full: one row per token over all heads; head: one row per (token, head).
        const bool per_head = c->qk_norm == QK_NORM_HEAD;
        op_rmsnorm_forward(s->qn, s->rstd, s->q, lp[LP_Q_NORM], per_head ? n * nh : n, per_head ? hd : qd, c->norm_eps);
        op_rmsnorm_forward(k_new, s->rstd, s->kn, lp[LP_K_NORM], per_head ? n * nkv : n, per_head ? hd : kd,
                           c->norm_eps);
        q = s->qn;
    }
    const size_t rope_off = (size_t)past * (hd / 2);
    op_rope_forward(q, cache->rope_cos + rope_off, cache->rope_sin + rope_off, 1, n, nh, hd);
    op_rope_forward(k_new, cache->rope_cos + rope_off, cache->rope_sin + rope_off, 1, n, nkv, hd);
    op_attention_forward_kv(s->att, s->attn_scratch, q, k_layer, v_layer, 1, n, past + n, nh, nkv, hd);
    op_linear_forward(s->x, s->att, lp[LP_O], n, qd, H, true);
}

// x[n, H] += sum over the top-k experts of w * down(silu(gate(h)) * up(h)), h = post_attention_layernorm(x).
static void moe_block(KvCache *cache, int l, int n) {
    const ModelConfig *c = &cache->model->cfg;
    KvScratch *s = cache->scratch;
    const float **lp = cache->layer_params + (size_t)l * layer_stride(c);
    const int H = c->d_model, E = c->num_experts, k = c->top_k, I = c->expert_hidden;

    op_rmsnorm_forward(s->xn, s->rstd, s->x, lp[LP_MLP_NORM], n, H, c->norm_eps);
    op_linear_forward(s->router_logits, s->xn, lp[LP_ROUTER], n, H, E, false);
    op_router_forward(s->probs, s->lse, s->topk_idx, s->topk_w, s->router_logits, n, E, k,
                      c->normalize_expert_weights);
    op_moe_plan(s->offsets, s->row_token, s->row_of_slot, s->topk_idx, n, E, k);
    op_gather_rows(s->xe, s->xn, s->row_token, n * k, H);
    for (int e = 0; e < E; e++) {
        const int first = s->offsets[e], rows = s->offsets[e + 1] - first;
        if (rows == 0) continue;
        // gate_proj and up_proj are adjacent in the parameter buffer: one [2I, H] GEMM.
        op_linear_forward(s->gu + (size_t)first * 2 * I, s->xe + (size_t)first * H, lp[LP_EXPERT_GATE(e)], rows, H,
                          2 * I, false);
        op_swiglu_forward(s->act + (size_t)first * I, s->gu + (size_t)first * 2 * I, rows, I);
        op_linear_forward(s->ye + (size_t)first * H, s->act + (size_t)first * I, lp[LP_EXPERT_DOWN(e)], rows, I, H,
                          false);
    }
    op_moe_combine(s->x, s->ye, s->topk_w, s->row_of_slot, n, k, H);
}

// Chunks shorter than this (decode steps, short continuations) run on one thread: each op
// is then microseconds of work, less than an OpenMP barrier, and on a busy machine a barrier
// waiting for a descheduled thread costs milliseconds (decoding measured 10x slower with 2
// threads than with 1 on the loaded 2-core CI box). PyTorch's grain-size rule, in one place.
#define KV_MIN_TOKENS_FOR_THREADS 16

static int kv_forward_chunk(KvCache *cache, const int32_t *tokens, int n, float *logits, int n_logits);

int kv_forward(KvCache *cache, const int32_t *tokens, int n, float *logits, int n_logits) {
    const int threads = threads_get();
    if (n >= KV_MIN_TOKENS_FOR_THREADS || threads == 1) return kv_forward_chunk(cache, tokens, n, logits, n_logits);
    threads_set(1);
    int status = kv_forward_chunk(cache, tokens, n, logits, n_logits);
    threads_set(threads);
    return status;
}

static int kv_forward_chunk(KvCache *cache, const int32_t *tokens, int n, float *logits, int n_logits) {
    const Model *m = cache->model;
    const ModelConfig *c = &m->cfg;
    if (n <= 0) return spes_fail("kv_forward: empty chunk");
    if (n > cache->capacity - cache->len)
        return spes_fail("KV cache full: %d positions held, %d more do not fit in %d (the model's max_seq_len "
                         "or --max_seq bounds the context)", cache->len, n, cache->capacity);
    if (logits && (n_logits < 1 || n_logits > n))
        return spes_fail("kv_forward: n_logits %d outside 1..%d", n_logits, n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->embedding_size)
            return spes_fail("token id %d at chunk position %d is outside the embedding table (0..%d)", tokens[i], i,
                             c->embedding_size - 1);
    SPES_TRY(scratch_reserve(cache, n));
    KvScratch *s = cache->scratch;
    const int H = c->d_model, past = cache->len;

    op_embedding_forward(s->x, param_or_null(m, PARAM_EMBED, -1, -1), tokens, n, H);
    for (int l = 0; l < c->n_layers; l++) {
        attention_block(cache, l, n, past);
        moe_block(cache, l, n);
    }
    cache->len = past + n;
    if (logits) {
        const float *x_last = s->x + (size_t)(n - n_logits) * H;
        op_rmsnorm_forward(s->xn, s->rstd, x_last, param_or_null(m, PARAM_FINAL_NORM, -1, -1), n_logits, H,
                           c->norm_eps);
        op_linear_forward(logits, s->xn, param_or_null(m, PARAM_LM_HEAD, -1, -1), n_logits, H, c->embedding_size,
                          false);
    }
    return SPES_OK;
}
