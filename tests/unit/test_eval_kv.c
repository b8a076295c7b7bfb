// KV-cache forward against the full forward, generation with and without the cache, and
// multiple-choice scoring (shared-context reuse vs full forwards; a forced-answer task).
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "base/threads.h"
#include "tokenizer/tokenizer.h"
#include "eval/generate.h"
#include "eval/kv_forward.h"
#include "eval/mc_score.h"
#include "eval/mc_task.h"
#include "model/hf_import.h"

// The tiny preset with a byte-sized vocabulary (for the "bytes" tokenizer), in one of the
// three QK-norm modes, randomly initialised with norms away from 1.
static void make_model(Model *m, QkNormMode qk, bool normalize, uint64_t seed) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    cfg.vocab_size = 257;
    cfg.embedding_size = 264;
    cfg.qk_norm = qk;
    cfg.normalize_expert_weights = normalize;
    cfg.max_seq_len = 96;
    cfg.init_std = 0.2f;   // larger than OLMo's 0.02 so logits and routing are far from uniform
    assert_int_equal(model_create_frozen(m, &cfg), SPES_OK);
    model_init_weights(m, seed);
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *p = &m->table.entries[i];
        if (!param_kind_is_norm(p->kind)) continue;
        float *w = m->params + p->offset;
        for (size_t j = 0; j < p->numel; j++) w[j] = 1.0f + 0.3f * sinf((float)(j + 7 * i));
    }
}

static float max_abs(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

// Chunks of different sizes through the cache give the full forward's logits.
static void check_kv_matches_full(QkNormMode qk) {
    Model m;
    make_model(&m, qk, qk == QK_NORM_HEAD, 11 + (uint64_t)qk);
    threads_set(2);   // chunks below 16 tokens run on one thread, longer ones on two
    enum { T = 43 };
    const int V = m.cfg.embedding_size;
    int32_t tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (int32_t)((i * 37 + 11) % 257);
    float *full = malloc((size_t)T * V * sizeof(float)), *kv = malloc((size_t)T * V * sizeof(float));
    assert_int_equal(model_forward(&m, tokens, NULL, 1, T, NULL, NULL, full), SPES_OK);
    KvCache cache;
    assert_int_equal(kv_cache_create(&cache, &m, 0), SPES_OK);
    const int chunks[] = {5, 1, 1, 20, 3, 13};
    int at = 0;
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        assert_int_equal(kv_forward(&cache, tokens + at, chunks[c], kv + (size_t)at * V, chunks[c]), SPES_OK);
        at += chunks[c];
    }
    assert_int_equal(at, T);
    assert_int_equal(cache.len, T);
    float scale = max_abs(full, (size_t)T * V), worst = 0.0f;
    for (size_t i = 0; i < (size_t)T * V; i++) worst = fmaxf(worst, fabsf(full[i] - kv[i]));
    if (!(worst <= 1e-5f * scale)) fail_msg("qk_norm %d: KV logits differ by %g (scale %g)", (int)qk, worst, scale);
    // Rewinding and feeding the tail again reproduces it.
    kv_cache_truncate(&cache, 10);
    assert_int_equal(kv_forward(&cache, tokens + 10, T - 10, kv, 1), SPES_OK);
    for (int j = 0; j < V; j++) assert_true(fabsf(kv[j] - full[(size_t)(T - 1) * V + j]) <= 1e-5f * scale);
    kv_cache_free(&cache);
    free(full);
    free(kv);
    model_free(&m);
}

static void test_kv_full_qk_norm(void **state) { (void)state; check_kv_matches_full(QK_NORM_FULL); }
static void test_kv_head_qk_norm(void **state) { (void)state; check_kv_matches_full(QK_NORM_HEAD); }
static void test_kv_no_qk_norm(void **state) { (void)state; check_kv_matches_full(QK_NORM_NONE); }

static void test_kv_errors(void **state) {
    (void)state;
    Model m;
    make_model(&m, QK_NORM_FULL, false, 3);
    KvCache cache;
    assert_int_equal(kv_cache_create(&cache, &m, 8), SPES_OK);
    int32_t tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(kv_forward(&cache, tokens, 9, NULL, 0), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "KV cache full"));
    int32_t bad = 264;
    assert_int_equal(kv_forward(&cache, &bad, 1, NULL, 0), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "outside the embedding table"));
    kv_cache_free(&cache);
    model_free(&m);
}

// Greedy generation with the cache = greedy generation re-running the full forward
// (the argmax of repeated full forwards), token for token.
static void test_generate_greedy_cache_equals_full(void **state) {
    (void)state;
    Model m;
    make_model(&m, QK_NORM_HEAD, true, 5);
    int32_t prompt[6] = {72, 101, 108, 108, 111, 32};
    int32_t with[40], without[40];
    int n_with, n_without;
    GenerateOptions opt = {.max_new_tokens = 40, .sampling = {.temperature = 0.0f}, .seed = 1, .stop_at_eos = false,
                           .use_cache = true};
    assert_int_equal(generate_tokens(&m, prompt, 6, &opt, NULL, NULL, with, &n_with), SPES_OK);
    opt.use_cache = false;
    assert_int_equal(generate_tokens(&m, prompt, 6, &opt, NULL, NULL, without, &n_without), SPES_OK);
    assert_int_equal(n_with, 40);
    assert_int_equal(n_without, 40);
    assert_memory_equal(with, without, sizeof with);
    // Sampling is reproducible for a seed and stays within vocab_size.
    int32_t a[20], b[20];
    int na, nb;
    GenerateOptions s = {.max_new_tokens = 20, .sampling = {.temperature = 1.0f, .top_k = 40, .top_p = 0.9f},
                         .seed = 9, .stop_at_eos = false, .use_cache = true};
    assert_int_equal(generate_tokens(&m, prompt, 6, &s, NULL, NULL, a, &na), SPES_OK);
    assert_int_equal(generate_tokens(&m, prompt, 6, &s, NULL, NULL, b, &nb), SPES_OK);
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < na; i++) assert_true(a[i] >= 0 && a[i] < 257);
    // The context limit bounds generation.
    opt.use_cache = true;
    opt.max_new_tokens = 1000;
    int32_t *many = malloc(1000 * sizeof(int32_t));
    assert_int_equal(generate_tokens(&m, prompt, 6, &opt, NULL, NULL, many, &n_with), SPES_OK);
    assert_int_equal(n_with, 96 - 6);
    free(many);
    model_free(&m);
}

static char *write_task(const char *dir, const char *text) {
    char *path = path_join(dir, "task.jsonl");
    assert_int_equal(file_write_atomic(path, text, strlen(text)), SPES_OK);
    return path;
}

#define REQ(ctx, cont, doc, idx, gold)                                                                              \
    "{\"request\":{\"context\":\"" ctx "\",\"continuation\":\"" cont "\"},\"doc_id\":" #doc ",\"idx\":" #idx      \
    ",\"label\":" #gold "}\n"

// A model whose LM head is zero predicts every token with probability 1/V: a choice's
// log-likelihood is exactly -n_tokens * log(V), so the shortest continuation wins acc_raw.
// Doc 0's gold is its shortest choice, doc 1's is not: acc_raw must be exactly 1/2.
static void test_forced_answer_task(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_kv_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = write_task(dir, REQ("Question: 1+1?\\nAnswer:", " two", 0, 0, 1) REQ("Question: 1+1?\\nAnswer:", " 2", 0, 1, 1)
                                     REQ("Question: 1+1?\\nAnswer:", " three", 0, 2, 1)
                                         REQ("Sky colour: ", "blue", 1, 0, 1) REQ("Sky colour: ", "green!", 1, 1, 1));
    McTask task;
    assert_int_equal(mc_task_load(path, 0, &task), SPES_OK);
    Model m;
    make_model(&m, QK_NORM_FULL, false, 8);
    float *lm_head = m.params + m.table.entries[param_table_index(&m.table, PARAM_LM_HEAD, -1, -1)].offset;
    memset(lm_head, 0, (size_t)m.cfg.embedding_size * m.cfg.d_model * sizeof(float));
    Tokenizer *tok;
    assert_int_equal(tokenizer_load("bytes", &tok), SPES_OK);
    McScore scores[5];
    McScoreOptions opt = {.max_seq = 0, .show_progress = 0};
    assert_int_equal(mc_task_score(&m, tok, &task, &opt, scores), SPES_OK);
    const double logV = log((double)m.cfg.embedding_size);
    // bytes tokenizer: one token per byte; the trailing space of "Sky colour: " moves to the
    // continuation (" blue": 5 tokens).
    const int expect_tokens[5] = {4, 2, 6, 5, 7};
    for (int r = 0; r < 5; r++) {
        assert_int_equal(scores[r].num_tokens, expect_tokens[r]);
        assert_true(fabs(scores[r].sum_logprob + expect_tokens[r] * logV) < 1e-6 * expect_tokens[r] * logV);
    }
    McMetrics mm;
    assert_int_equal(mc_task_metrics(&task, scores, &mm), SPES_OK);
    assert_true(mm.acc_raw == 0.5);
    assert_int_equal(mm.predictions[0], 1);
    assert_int_equal(mm.predictions[1], 0);
    mc_metrics_free(&mm);
    tokenizer_free(tok);
    model_free(&m);
    mc_task_free(&task);
    free(path);
    remove_tree(dir);
}

// Scores with the shared-context KV path equal log-softmax sums over full forwards of
// context + continuation (random model, every QK mode exercised elsewhere).
static void check_scores_match_full_forward(int window) {
    char dir[] = "/tmp/spes_kv_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = write_task(dir, REQ("The cat sat on the", " mat", 0, 0, 0) REQ("The cat sat on the", " hat and more", 0, 1, 0)
                                     REQ("", "empty context, long continuation", 1, 0, 0) REQ("", "x", 1, 1, 0));
    McTask task;
    assert_int_equal(mc_task_load(path, 0, &task), SPES_OK);
    Model m;
    make_model(&m, QK_NORM_HEAD, false, 21);
    m.cfg.eos_token_id = 256;
    Tokenizer *tok;
    assert_int_equal(tokenizer_load("bytes", &tok), SPES_OK);
    McScore scores[4];
    McScoreOptions opt = {.max_seq = window};
    assert_int_equal(mc_task_score(&m, tok, &task, &opt, scores), SPES_OK);
    const int V = m.cfg.embedding_size;
    float *logits = malloc((size_t)96 * V * sizeof(float));
    for (int r = 0; r < 4; r++) {
        const McRequest *q = &task.requests[r];
        int32_t full_seq[96];
        int n = 0, ctx = 0;
        if (!q->context[0]) full_seq[n++] = 256;   // empty context -> EOS
        for (const char *p = q->context; *p; p++) full_seq[n++] = (unsigned char)*p;
        ctx = n;
        for (const char *p = q->continuation; *p; p++) full_seq[n++] = (unsigned char)*p;
        // The window keeps the last window+1 tokens (lm-eval's truncation); a continuation
        // longer than that loses its first tokens.
        const int32_t *seq = full_seq;
        if (n > window + 1) {
            seq = full_seq + (n - window - 1);
            ctx = ctx - (n - window - 1) > 1 ? ctx - (n - window - 1) : 1;
            n = window + 1;
        }
        assert_int_equal(model_forward(&m, seq, NULL, 1, n - 1, NULL, NULL, logits), SPES_OK);
        double sum = 0.0;
        for (int i = ctx; i < n; i++) {
            const float *row = logits + (size_t)(i - 1) * V;
            double mx = row[0], z = 0.0;
            for (int j = 1; j < V; j++) mx = fmax(mx, row[j]);
            for (int j = 0; j < V; j++) z += exp(row[j] - mx);
            sum += row[seq[i]] - mx - log(z);
        }
        assert_int_equal(scores[r].num_tokens, n - ctx);
        if (!(fabs(scores[r].sum_logprob - sum) <= 1e-4 * fmax(1.0, fabs(sum))))
            fail_msg("request %d: KV score %.8f vs full forward %.8f", r, scores[r].sum_logprob, sum);
    }
    free(logits);
    tokenizer_free(tok);
    model_free(&m);
    mc_task_free(&task);
    free(path);
    remove_tree(dir);
}

static void test_scores_match_full_forward(void **state) {
    (void)state;
    check_scores_match_full_forward(96);   // everything fits
    check_scores_match_full_forward(16);   // contexts cut, and the 32-byte continuation too
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_full_qk_norm),
        cmocka_unit_test(test_kv_head_qk_norm),
        cmocka_unit_test(test_kv_no_qk_norm),
        cmocka_unit_test(test_kv_errors),
        cmocka_unit_test(test_generate_greedy_cache_equals_full),
        cmocka_unit_test(test_forced_answer_task),
        cmocka_unit_test(test_scores_match_full_forward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
