#include "eval/mc_score.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/progress.h"
#include "eval/kv_forward.h"

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

// Context and continuation tokens of one request (lm-eval's _encode_pair).
typedef struct {
    IdBuffer context, whole;
    int32_t *cont;          // continuation ids
    int cont_len, cont_cap;
} PairEncoding;

static int encode_pair(TokenEncoder *enc, const McRequest *r, int eos_id, PairEncoding *pe) {
    size_t ctx_len = strlen(r->context), cont_len = strlen(r->continuation);
    size_t spaces = 0;
    while (spaces < ctx_len && strchr(" \t\n\r\f\v", r->context[ctx_len - 1 - spaces])) spaces++;
    size_t kept = ctx_len - spaces;
    char *joined = spes_malloc(ctx_len + cont_len + 1);
    if (!joined) return SPES_ERR;
    memcpy(joined, r->context, ctx_len);
    memcpy(joined + ctx_len, r->continuation, cont_len + 1);
    int status = encode(enc, r->context, kept, &pe->context);
    if (status == SPES_OK) status = encode(enc, joined, ctx_len + cont_len, &pe->whole);
    free(joined);
    SPES_TRY(status);
    if (pe->context.len == 0) {
        if (eos_id < 0)
            return spes_fail("doc_id %lld: empty context and the model has no eos_token_id to stand in for it",
                             (long long)r->doc_id);
        SPES_TRY(id_buffer_push(&pe->context, (uint32_t)eos_id));
        // whole = [eos] + encode(continuation): lm-eval encodes the continuation alone here.
    }
    size_t from = pe->context.len;
    if (kept == 0) from = 0;
    if (pe->whole.len <= from)
        return spes_fail("doc_id %lld idx %d: the continuation '%.40s' encodes to no tokens", (long long)r->doc_id,
                         r->idx, r->continuation);
    int n = (int)(pe->whole.len - from);
    if (n > pe->cont_cap) {
        int32_t *bigger = spes_realloc(pe->cont, (size_t)n * sizeof(int32_t));
        if (!bigger) return SPES_ERR;
        pe->cont = bigger;
        pe->cont_cap = n;
    }
    for (int i = 0; i < n; i++) pe->cont[i] = (int32_t)pe->whole.ids[from + i];
    pe->cont_len = n;
    return SPES_OK;
}

// Scores every choice of one document (all share the context string: the request files
// repeat it per choice; a document whose choices differ in context is an error).
// Logits rows for chunks of up to `rows` tokens, grown on demand (continuations are short;
// a window-sized buffer would be window * vocab floats).
typedef struct {
    float *ctx_last;        // [V] logits after the context: they predict continuation token 0
    float *rows;            // [cap, V]
    int cap;
} LogitsBuffers;

static int reserve_rows(LogitsBuffers *lb, int rows, int V) {
    if (rows <= lb->cap) return SPES_OK;
    float *bigger = spes_realloc(lb->rows, (size_t)rows * (size_t)V * sizeof(float));
    if (!bigger) return SPES_ERR;
    lb->rows = bigger;
    lb->cap = rows;
    return SPES_OK;
}

static int score_document(const Model *m, TokenEncoder *enc, KvCache *cache, const McTask *task, const McDoc *doc,
                          int window, LogitsBuffers *lb, PairEncoding *pe, McScore *scores) {
    const int V = m->cfg.embedding_size;
    const McRequest *first = &task->requests[doc->request_of_choice[0]];
    // Longest continuation of the document bounds how much context fits.
    int max_cont = 0;
    for (int c = 0; c < doc->num_choices; c++) {
        const McRequest *r = &task->requests[doc->request_of_choice[c]];
        if (strcmp(r->context, first->context) != 0)
            return spes_fail("doc_id %lld: choices have different contexts; each document needs one context",
                             (long long)doc->doc_id);
        SPES_TRY(encode_pair(enc, r, m->cfg.eos_token_id, pe));
        if (pe->cont_len > max_cont) max_cont = pe->cont_len;
    }
    if (max_cont >= window)
        return spes_fail("doc_id %lld: a continuation of %d tokens does not fit the %d-token window (--max_seq)",
                         (long long)doc->doc_id, max_cont, window);
    // Context (shared): the encoding from the last encode_pair call is the same for all.
    int ctx_len = (int)pe->context.len, ctx_keep = ctx_len;
    if (ctx_keep + max_cont - 1 > window) ctx_keep = window - (max_cont - 1);
    int32_t *ctx = spes_malloc((size_t)ctx_keep * sizeof(int32_t));
    if (!ctx) return SPES_ERR;
    for (int i = 0; i < ctx_keep; i++) ctx[i] = (int32_t)pe->context.ids[ctx_len - ctx_keep + i];
    kv_cache_truncate(cache, 0);
    int status = kv_forward(cache, ctx, ctx_keep, lb->ctx_last, 1);
    free(ctx);
    SPES_TRY(status);
    SPES_TRY(reserve_rows(lb, max_cont, V));
    for (int c = 0; c < doc->num_choices; c++) {
        int r = doc->request_of_choice[c];
        SPES_TRY(encode_pair(enc, &task->requests[r], m->cfg.eos_token_id, pe));
        double sum = log_prob(lb->ctx_last, V, pe->cont[0]);
        if (pe->cont_len > 1) {
            kv_cache_truncate(cache, ctx_keep);
            SPES_TRY(kv_forward(cache, pe->cont, pe->cont_len - 1, lb->rows, pe->cont_len - 1));
            for (int i = 1; i < pe->cont_len; i++) sum += log_prob(lb->rows + (size_t)(i - 1) * V, V, pe->cont[i]);
        }
        scores[r].sum_logprob = sum;
        scores[r].num_tokens = pe->cont_len;
    }
    return SPES_OK;
}

int mc_task_score(const Model *m, const Tokenizer *tok, const McTask *task, const McScoreOptions *opt,
                  McScore *scores) {
    memset(scores, 0, (size_t)task->num_requests * sizeof(McScore));
    int window = opt->max_seq > 0 && opt->max_seq < m->cfg.max_seq_len ? opt->max_seq : m->cfg.max_seq_len;
    TokenEncoder *enc = NULL;
    KvCache cache;
    PairEncoding pe;
    memset(&pe, 0, sizeof pe);
    SPES_TRY(tokenizer_encoder_new(tok, &enc));
    if (kv_cache_create(&cache, m, window) != SPES_OK) {
        tokenizer_encoder_free(enc);
        return SPES_ERR;
    }
    LogitsBuffers lb = {.ctx_last = spes_malloc((size_t)m->cfg.embedding_size * sizeof(float))};
    int status = lb.ctx_last ? SPES_OK : SPES_ERR;
    int total = task->num_docs;
    for (int d = 0; d < task->num_docs; d++) total += task->docs[d].uncond >= 0;
    Progress progress;
    if (opt->show_progress) progress_start(&progress, task->name, "docs", (uint64_t)total);
    int done = 0;
    for (int d = 0; d < task->num_docs && status == SPES_OK; d++) {
        const McDoc *doc = &task->docs[d];
        status = score_document(m, enc, &cache, task, doc, window, &lb, &pe, scores);
        if (status == SPES_OK && doc->uncond >= 0)
            status = score_document(m, enc, &cache, task, &task->uncond_docs[doc->uncond], window, &lb, &pe, scores);
        done += 1 + (doc->uncond >= 0);
        if (opt->show_progress) progress_update(&progress, (uint64_t)done, NULL);
    }
    if (opt->show_progress) progress_finish(&progress, NULL);
    if (status != SPES_OK) spes_fail_context("task %s", task->name);
    free(lb.ctx_last);
    free(lb.rows);
    free(pe.cont);
    id_buffer_free(&pe.context);
    id_buffer_free(&pe.whole);
    kv_cache_free(&cache);
    tokenizer_encoder_free(enc);
    return status;
}
