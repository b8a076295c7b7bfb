#include "eval/mc_score.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/printable.h"
#include "base/progress.h"
#include "eval/kv_forward.h"
#include "tokenizer/tokenizer_utf8.h"

// log softmax(logits[V])[target], in double for the sum.
static double log_prob(const float *logits, int V, int target) {
    float max = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - max);
    return (double)logits[target] - max - log(sum);
}

static int encode(TokenEncoder *enc, const char *text, size_t len, IdBuffer *out) {
    out->len = 0;
    return tokenizer_encode(enc, text, len, out);
}

// Python's str.isspace() (3.11), what lm-eval's context.rstrip() removes: ASCII whitespace and
// also U+001C..U+001F, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000 (a context ending in a no-break space has it moved to the continuation there).
static bool python_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

// The bytes of text[0..len) (valid UTF-8: a JSON string) that Python's rstrip() keeps.
static size_t rstrip_len(const char *text, size_t len) {
    while (len > 0) {
        size_t start = len - 1, cp_len = 0;
        while (start > 0 && ((unsigned char)text[start] & 0xC0) == 0x80) start--;
        if (!python_space(utf8_decode((const uint8_t *)text + start, &cp_len))) break;
        len = start;
    }
    return len;
}

// One request as model input: seq = context ids followed by continuation ids (lm-eval's
// _encode_pair).
typedef struct {
    IdBuffer context, whole;
    int32_t *seq;           // [ctx_len + cont_len]
    int ctx_len, cont_len, cap;
} PairEncoding;

static int encode_pair(TokenEncoder *enc, const McRequest *r, int64_t prefix_id, PairEncoding *pe) {
    size_t ctx_len = strlen(r->context), cont_len = strlen(r->continuation);
    size_t kept = rstrip_len(r->context, ctx_len);
    char *joined = spes_malloc(ctx_len + cont_len + 1);
    if (!joined) return SPES_ERR;
    memcpy(joined, r->context, ctx_len);
    memcpy(joined + ctx_len, r->continuation, cont_len + 1);
    int status = encode(enc, r->context, kept, &pe->context);
    if (status == SPES_OK) status = encode(enc, joined, ctx_len + cont_len, &pe->whole);
    free(joined);
    SPES_TRY(status);
    // Only a context that is exactly "" becomes lm-eval's prefix token; the continuation is then
    // the whole encoding, less its first token when that is the prefix token (lm-eval: it is the
    // context). A whitespace-only one has moved to the continuation and left no context token
    // (as one that encodes to nothing would): lm-eval 0.4.13 stops on it
    // (HFLM._loglikelihood_tokens: assert len(context_enc) > 0).
    size_t from = pe->context.len;
    if (ctx_len > 0 && pe->context.len == 0) {
        char shown[64];
        return spes_fail("doc_id %lld idx %d: the context \"%s\" leaves no context token (%s), and lm-eval 0.4.13 "
                         "fails on such a request (assert len(context_enc) > 0); only an empty context is "
                         "conditioned on the prefix token",
                         (long long)r->doc_id, r->idx, escape_printable(r->context, ctx_len, shown, sizeof shown),
                         kept == 0 ? "whitespace only: lm-eval's _encode_pair moves it to the continuation"
                                   : "it encodes to no tokens");
    }
    if (ctx_len == 0) {
        if (prefix_id < 0)
            return spes_fail("doc_id %lld: empty context, and the tokenizer names no BOS or EOS token to stand in for "
                             "it (lm-eval's prefix token: give a tokenizer directory whose tokenizer_config.json or "
                             "special_tokens_map.json names one)",
                             (long long)r->doc_id);
        SPES_TRY(id_buffer_push(&pe->context, (uint32_t)prefix_id));
        if (pe->whole.len > 0 && pe->whole.ids[0] == (uint32_t)prefix_id) from = 1;
    }
    if (pe->whole.len <= from)
        return spes_fail("doc_id %lld idx %d: the continuation '%.40s' encodes to no tokens", (long long)r->doc_id,
                         r->idx, r->continuation);
    int n_ctx = (int)pe->context.len, n_cont = (int)(pe->whole.len - from);
    if (n_ctx + n_cont > pe->cap) {
        int32_t *bigger = spes_realloc(pe->seq, (size_t)(n_ctx + n_cont) * sizeof(int32_t));
        if (!bigger) return SPES_ERR;
        pe->seq = bigger;
        pe->cap = n_ctx + n_cont;
    }
    for (int i = 0; i < n_ctx; i++) pe->seq[i] = (int32_t)pe->context.ids[i];
    for (int i = 0; i < n_cont; i++) pe->seq[n_ctx + i] = (int32_t)pe->whole.ids[from + i];
    pe->ctx_len = n_ctx;
    pe->cont_len = n_cont;
    return SPES_OK;
}

// Logits rows for chunks of continuation tokens, grown on demand (a window-sized buffer
// would be window * vocab floats), and the prefix whose run is in the KV cache.
typedef struct {
    float *prefix_last;     // [V] logits after the cached prefix: they predict the first scored token
    float *rows;            // [cap, V]
    int cap;
    int32_t *prefix;        // [window] tokens of the prefix in the cache
    int prefix_len;         // 0: nothing cached
} ScoreState;

static int reserve_rows(ScoreState *st, int rows, int V) {
    if (rows <= st->cap) return SPES_OK;
    float *bigger = spes_realloc(st->rows, (size_t)rows * (size_t)V * sizeof(float));
    if (!bigger) return SPES_ERR;
    st->rows = bigger;
    st->cap = rows;
    return SPES_OK;
}

// log P(continuation | context) of one encoded request. Like lm-eval, the model sees at
// most `window` tokens: seq = (context + continuation)[-(window + 1):], the continuation
// tokens inside it are scored (all of them unless the continuation alone exceeds the
// window). The prefix before the scored tokens (usually the context, shared by all choices
// of a document) runs once and stays in the cache while the next request has the same one.
static int score_request(KvCache *cache, const PairEncoding *pe, int window, int V, ScoreState *st, McScore *out) {
    int total = pe->ctx_len + pe->cont_len;
    int keep = total < window + 1 ? total : window + 1;
    int n_scored = pe->cont_len < keep - 1 ? pe->cont_len : keep - 1;
    const int32_t *prefix = pe->seq + (total - keep);
    const int32_t *scored = pe->seq + (total - n_scored);
    int prefix_len = keep - n_scored;
    bool cached = prefix_len == st->prefix_len && !memcmp(prefix, st->prefix, (size_t)prefix_len * sizeof(int32_t));
    if (!cached) {
        kv_cache_truncate(cache, 0);
        st->prefix_len = 0;
        SPES_TRY(kv_forward(cache, prefix, prefix_len, st->prefix_last, 1));
        memcpy(st->prefix, prefix, (size_t)prefix_len * sizeof(int32_t));
        st->prefix_len = prefix_len;
    }
    double sum = log_prob(st->prefix_last, V, scored[0]);
    if (n_scored > 1) {
        SPES_TRY(reserve_rows(st, n_scored - 1, V));
        kv_cache_truncate(cache, prefix_len);
        SPES_TRY(kv_forward(cache, scored, n_scored - 1, st->rows, n_scored - 1));
        for (int i = 1; i < n_scored; i++) sum += log_prob(st->rows + (size_t)(i - 1) * V, V, scored[i]);
    }
    out->sum_logprob = sum;
    out->num_tokens = n_scored;
    return SPES_OK;
}

// Scores every choice of one document; returns how many continuations were cut to fit.
static int score_document(Model *m, TokenEncoder *enc, int64_t prefix_id, KvCache *cache, const McTask *task,
                          const McDoc *doc, int window, ScoreState *st, PairEncoding *pe, McScore *scores, int *cut) {
    for (int c = 0; c < doc->num_choices; c++) {
        int r = doc->request_of_choice[c];
        SPES_TRY(encode_pair(enc, &task->requests[r], prefix_id, pe));
        SPES_TRY(score_request(cache, pe, window, m->cfg.embedding_size, st, &scores[r]));
        *cut += scores[r].num_tokens < pe->cont_len;
    }
    return SPES_OK;
}

int mc_task_score(Model *m, const Tokenizer *tok, const McTask *task, const McScoreOptions *opt,
                  McScore *scores) {
    memset(scores, 0, (size_t)task->num_requests * sizeof(McScore));
    int window = opt->max_seq > 0 && opt->max_seq < m->cfg.max_seq_len ? opt->max_seq : m->cfg.max_seq_len;
    TokenEncoder *enc = NULL;
    KvCache cache;
    PairEncoding pe;
    memset(&pe, 0, sizeof pe);
    // lm-eval's prefix token (HFLM.prefix_token_id): the tokenizer's BOS, else its EOS.
    int64_t prefix_id = tokenizer_bos_id(tok) >= 0 ? tokenizer_bos_id(tok) : tokenizer_eos_id(tok);
    SPES_TRY(tokenizer_encoder_new(tok, &enc));
    if (kv_cache_create(&cache, m, window) != SPES_OK) {
        tokenizer_encoder_free(enc);
        return SPES_ERR;
    }
    ScoreState st = {.prefix_last = spes_malloc((size_t)m->cfg.embedding_size * sizeof(float)),
                     .prefix = spes_malloc((size_t)(window + 1) * sizeof(int32_t))};
    int status = st.prefix_last && st.prefix ? SPES_OK : SPES_ERR;
    int total = task->num_docs;
    for (int d = 0; d < task->num_docs; d++) total += task->docs[d].uncond >= 0;
    Progress progress;
    if (opt->show_progress) progress_start(&progress, task->name, "docs", (uint64_t)total);
    int done = 0, cut = 0;
    for (int d = 0; d < task->num_docs && status == SPES_OK; d++) {
        const McDoc *doc = &task->docs[d];
        status = score_document(m, enc, prefix_id, &cache, task, doc, window, &st, &pe, scores, &cut);
        if (status == SPES_OK && doc->uncond >= 0)
            status = score_document(m, enc, prefix_id, &cache, task, &task->uncond_docs[doc->uncond], window, &st, &pe,
                                    scores, &cut);
        done += 1 + (doc->uncond >= 0);
        if (opt->show_progress) progress_update(&progress, (uint64_t)done, NULL);
    }
    if (opt->show_progress) progress_finish(&progress, NULL);
    if (status != SPES_OK) spes_fail_context("task %s", task->name);
    if (status == SPES_OK && cut > 0)
        log_warn("task %s: %d continuation%s longer than the %d-token window: only their last tokens were scored",
                 task->name, cut, cut == 1 ? "" : "s", window);
    free(st.prefix_last);
    free(st.rows);
    free(st.prefix);
    free(pe.seq);
    id_buffer_free(&pe.context);
    id_buffer_free(&pe.whole);
    kv_cache_free(&cache);
    tokenizer_encoder_free(enc);
    return status;
}
