// Model config validation, presets, parameter table, init statistics and reproducibility,
// frozen experts (bitwise-identical trainable gradients; a model created frozen), determinism,
// accumulation, the phase profile.
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/threads.h"
#include "model/model.h"
#include "model/model_internal.h"   // the logits block's layout

static ModelConfig tiny(void) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    return cfg;
}

static void test_config_validation(void **state) {
    (void)state;
    ModelConfig c = tiny();
    c.head_dim = 0;
    assert_int_equal(model_config_validate(&c), SPES_OK);
    assert_int_equal(c.head_dim, c.d_model / c.n_heads);

    c = tiny();
    c.embedding_size = c.vocab_size - 1;
    assert_int_equal(model_config_validate(&c), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "embedding_size"));

    c = tiny();
    c.n_kv_heads = 3;
    assert_int_equal(model_config_validate(&c), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "n_kv_heads"));

    c = tiny();
    c.top_k = c.num_experts + 1;
    assert_int_equal(model_config_validate(&c), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "top_k"));

    c = tiny();
    c.d_model = 0;
    assert_int_equal(model_config_validate(&c), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "d_model"));

    assert_int_equal(model_config_preset("bench-small", &c), SPES_OK);
    assert_int_equal(c.d_model, 512);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.expert_hidden, 1024);
    assert_int_equal(model_config_preset("nope", &c), SPES_ERR);
}

static void test_param_table(void **state) {
    (void)state;
    ModelConfig c = tiny();
    ParamTable t;
    assert_int_equal(param_table_build(&c, &t), SPES_OK);
    // embed + per layer (2 norms + 4 proj + 2 qk norms + router + 3E) + final norm + lm_head
    assert_int_equal(t.count, 3 + c.n_layers * (9 + 3 * c.num_experts));
    assert_string_equal(t.entries[0].name, "model.embed_tokens.weight");
    assert_int_equal(t.entries[0].shape[0], c.embedding_size);
    assert_string_equal(t.entries[t.count - 1].name, "lm_head.weight");
    int i = param_table_find(&t, "model.layers.1.self_attn.k_norm.weight");
    assert_true(i >= 0);
    assert_int_equal(t.entries[i].ndim, 1);
    assert_int_equal(t.entries[i].shape[0], c.n_kv_heads * c.head_dim);   // full QK-norm
    i = param_table_find(&t, "model.layers.0.mlp.experts.5.down_proj.weight");
    assert_int_equal(i, param_table_index(&t, PARAM_EXPERT_DOWN, 0, 5));
    assert_int_equal(t.entries[i].shape[0], c.d_model);
    assert_int_equal(t.entries[i].shape[1], c.expert_hidden);
    assert_int_equal(t.entries[i].expert, 5);
    assert_int_equal(param_table_find(&t, "model.layers.2.mlp.gate.weight"), -1);
    size_t sum = 0;
    for (int j = 0; j < t.count; j++) {
        assert_int_equal(t.entries[j].offset, sum);
        sum += t.entries[j].numel;
    }
    assert_int_equal(sum, t.total_numel);
    assert_int_equal(t.trainable_numel, t.total_numel);

    bool *mask = calloc((size_t)t.count, sizeof(bool));
    mask[1] = mask[5] = true;
    param_table_set_trainable(&t, mask);
    assert_int_equal(t.entries[0].grad_offset, -1);
    assert_int_equal(t.entries[1].grad_offset, 0);
    assert_int_equal(t.entries[5].grad_offset, (ssize_t)t.entries[1].numel);
    assert_int_equal(t.trainable_numel, t.entries[1].numel + t.entries[5].numel);
    free(mask);
    param_table_free(&t);

    c.qk_norm = QK_NORM_HEAD;
    assert_int_equal(param_table_build(&c, &t), SPES_OK);
    i = param_table_find(&t, "model.layers.0.self_attn.q_norm.weight");
    assert_int_equal(t.entries[i].shape[0], c.head_dim);
    param_table_free(&t);
}

// param_table_index finds every entry, with and without QK-norm, and stays fast with the most
// experts the model code accepts: model binding looks up each expert, and a linear scan per
// lookup made `spes upcycle --num_experts 65536` (and any such model) hang for hours.
static void test_param_table_index_many_experts(void **state) {
    (void)state;
    const QkNormMode modes[] = {QK_NORM_NONE, QK_NORM_FULL, QK_NORM_HEAD};
    for (int m = 0; m < 3; m++) {
        ModelConfig c = tiny();
        c.qk_norm = modes[m];
        ParamTable t;
        assert_int_equal(param_table_build(&c, &t), SPES_OK);
        for (int i = 0; i < t.count; i++)
            assert_int_equal(param_table_index(&t, t.entries[i].kind, t.entries[i].layer, t.entries[i].expert), i);
        assert_int_equal(param_table_index(&t, PARAM_EXPERT_UP, 0, c.num_experts), -1);
        assert_int_equal(param_table_index(&t, PARAM_Q, c.n_layers, -1), -1);
        if (modes[m] == QK_NORM_NONE) assert_int_equal(param_table_index(&t, PARAM_Q_NORM, 0, -1), -1);
        param_table_free(&t);
    }
    ModelConfig c = tiny();
    c.num_experts = MODEL_MAX_EXPERTS;
    c.n_layers = 2;
    ParamTable t;
    assert_int_equal(param_table_build(&c, &t), SPES_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < t.count; i++)
        assert_int_equal(param_table_index(&t, t.entries[i].kind, t.entries[i].layer, t.entries[i].expert), i);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (seconds > 2.0) fprintf(stderr, "%d lookups took %.1f s\n", t.count, seconds);
    assert_true(seconds < 2.0);
    param_table_free(&t);
}

static void test_init_statistics_and_reproducibility(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(model_config_preset("tiny", &c), SPES_OK);
    c.d_model = 64;
    c.head_dim = 16;
    c.init_std = 0.05f;
    c.init_cutoff_factor = 2.0f;
    Model a, b;
    assert_int_equal(model_create(&a, &c), SPES_OK);
    assert_int_equal(model_create(&b, &c), SPES_OK);
    int saved = threads_get();
    threads_set(1);
    model_init_weights(&a, 42);
    threads_set(2);
    model_init_weights(&b, 42);
    threads_set(saved);
    assert_memory_equal(a.params, b.params, a.table.total_numel * sizeof(float));
    model_init_weights(&b, 43);
    assert_true(memcmp(a.params, b.params, a.table.total_numel * sizeof(float)) != 0);

    double sum = 0, sum2 = 0, maxabs = 0;
    size_t n = 0;
    for (int i = 0; i < a.table.count; i++) {
        const ParamInfo *p = &a.table.entries[i];
        const float *w = model_param(&a, i);
        for (size_t j = 0; j < p->numel; j++) {
            if (param_kind_is_norm(p->kind)) {
                assert_true(w[j] == 1.0f);
                continue;
            }
            sum += w[j];
            sum2 += (double)w[j] * w[j];
            if (fabs(w[j]) > maxabs) maxabs = fabs(w[j]);
            n++;
        }
    }
    double mean = sum / n, std = sqrt(sum2 / n - mean * mean);
    // Normal(0, 0.05) truncated at 2 std has std 0.05 * sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)) = 0.05 * 0.8796.
    printf("init: n=%zu mean=%.5f std=%.5f (expect %.5f) max|w|=%.4f (cutoff %.4f)\n", n, mean, std, 0.05 * 0.8796,
           maxabs, 0.1);
    assert_true(fabs(mean) < 1e-3);
    assert_true(fabs(std - 0.05 * 0.8796) < 1e-3);
    assert_true(maxabs <= 0.1 + 1e-7);
    assert_true(maxabs > 0.099);
    model_free(&a);
    model_free(&b);
}

enum { B = 2, T = 70 };   // T > one attention block (64) to cover the tiling

static void tokens(int32_t *in, int32_t *tg, int V) {
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)((i * 37 + 11) % V);
        tg[i] = (int32_t)((i * 53 + 5) % V);
    }
    tg[7] = IGNORE_INDEX;
}

static void setup_model(Model *m, QkNormMode qk) {
    ModelConfig c = tiny();
    c.qk_norm = qk;
    c.max_seq_len = T;
    c.init_std = 0.1f;
    assert_int_equal(model_create(m, &c), SPES_OK);
    model_init_weights(m, 5);
}

static void test_frozen_experts_bitwise(void **state) {
    (void)state;
    Model full, frozen;
    setup_model(&full, QK_NORM_FULL);
    setup_model(&frozen, QK_NORM_FULL);
    assert_int_equal(model_set_trainable_experts(&frozen, 2, 3), SPES_OK);
    assert_true(frozen.table.trainable_numel < full.table.trainable_numel);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, full.cfg.embedding_size);
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    LossValues la, lb;
    assert_int_equal(model_forward_backward(&full, in, tg, B, T, &w, 1.0f, &la, NULL), SPES_OK);
    assert_int_equal(model_forward_backward(&frozen, in, tg, B, T, &w, 1.0f, &lb, NULL), SPES_OK);
    assert_true(la.total == lb.total);
    int compared = 0;
    for (int i = 0; i < full.table.count; i++) {
        const ParamInfo *p = &frozen.table.entries[i];
        if (!p->trainable) {
            assert_null(model_grad(&frozen, i));
            assert_true(p->expert >= 0 && (p->expert < 2 || p->expert > 3));
            continue;
        }
        assert_memory_equal(model_grad(&full, i), model_grad(&frozen, i), p->numel * sizeof(float));
        compared++;
    }
    assert_int_equal(compared, 3 + full.cfg.n_layers * (9 + 3 * 2));

    // Created frozen (no gradient buffer at all), then the same experts set trainable: the
    // same table and the same gradients, bit for bit.
    Model late;
    ModelConfig c = frozen.cfg;
    assert_int_equal(model_create_frozen_on(&late, &c, backend_cpu()), SPES_OK);
    assert_null(late.grads);
    assert_int_equal(late.table.trainable_numel, 0);
    for (int i = 0; i < late.table.count; i++) assert_null(model_grad(&late, i));
    model_init_weights(&late, 5);
    assert_int_equal(model_set_trainable_experts(&late, 2, 3), SPES_OK);
    assert_int_equal(late.table.trainable_numel, frozen.table.trainable_numel);
    LossValues lc;
    assert_int_equal(model_forward_backward(&late, in, tg, B, T, &w, 1.0f, &lc, NULL), SPES_OK);
    assert_memory_equal(&lc, &lb, sizeof lc);
    assert_memory_equal(late.grads, frozen.grads, frozen.table.trainable_numel * sizeof(float));
    model_free(&late);
    model_free(&full);
    model_free(&frozen);
}

// A frozen k_proj splits the fused q|k|v weight gradient into per-tensor GEMMs: the other
// gradients must not change (up to GEMM rounding) and dX still flows through k.
static void test_frozen_shared_tensor(void **state) {
    (void)state;
    Model full, part;
    setup_model(&full, QK_NORM_FULL);
    setup_model(&part, QK_NORM_FULL);
    bool *mask = calloc((size_t)part.table.count, sizeof(bool));
    for (int i = 0; i < part.table.count; i++) mask[i] = true;
    int frozen = param_table_index(&part.table, PARAM_K, 0, -1);
    mask[frozen] = false;
    assert_int_equal(model_set_trainable(&part, mask), SPES_OK);
    free(mask);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, full.cfg.embedding_size);
    assert_int_equal(model_forward_backward(&full, in, tg, B, T, NULL, 1.0f, NULL, NULL), SPES_OK);
    assert_int_equal(model_forward_backward(&part, in, tg, B, T, NULL, 1.0f, NULL, NULL), SPES_OK);
    assert_null(model_grad(&part, frozen));
    for (int i = 0; i < full.table.count; i++) {
        if (i == frozen) continue;
        const float *a = model_grad(&full, i), *b = model_grad(&part, i);
        float scale = 0.0f;
        for (size_t j = 0; j < full.table.entries[i].numel; j++) scale = fmaxf(scale, fabsf(a[j]));
        for (size_t j = 0; j < full.table.entries[i].numel; j++) assert_true(fabsf(a[j] - b[j]) <= 1e-6f * scale);
    }
    model_free(&full);
    model_free(&part);
}

static void test_determinism_accumulation_and_forward(void **state) {
    (void)state;
    Model m;
    setup_model(&m, QK_NORM_HEAD);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, m.cfg.embedding_size);
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    size_t n = m.table.trainable_numel;
    float *g1 = malloc(n * sizeof(float));
    LossValues v1, v2, v3;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &v1, NULL), SPES_OK);
    memcpy(g1, m.grads, n * sizeof(float));
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &v2, NULL), SPES_OK);
    assert_memory_equal(g1, m.grads, n * sizeof(float));   // same inputs, same bits
    assert_true(v1.total == v2.total);
    assert_int_equal(v1.num_targets, B * T - 1);
    // The profile synced at every phase boundary (the GPU bench's) changes no bit, and every
    // phase of a forward+backward is timed.
    model_phase_reset(&m);
    m.phase_sync = true;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &v2, NULL), SPES_OK);
    m.phase_sync = false;
    assert_memory_equal(g1, m.grads, n * sizeof(float));
    assert_true(v1.total == v2.total);
    double phase[MODEL_PHASE_COUNT];
    model_phase_seconds(&m, phase);
    for (int i = 0; i < MODEL_PHASE_COUNT; i++) {
        if (!(phase[i] > 0.0)) fail_msg("phase %s was not timed", model_phase_name((ModelPhase)i));
    }
    // Accumulation: a second call with grad_scale 0.5 adds half the gradient.
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 0.5f, NULL, NULL), SPES_OK);
    for (size_t i = 0; i < n; i++) assert_true(fabsf(m.grads[i] - 1.5f * g1[i]) <= 1e-6f + 1e-5f * fabsf(g1[i]));
    // A smaller batch in between re-carves the same activation arena; then the original
    // shape again: same losses. Forward only gives the same losses as forward+backward.
    LossValues small;
    assert_int_equal(model_forward(&m, in, tg, 1, 30, &w, &small, NULL), SPES_OK);
    assert_true(small.num_targets == 30 || small.num_targets == 29);
    assert_int_equal(model_forward(&m, in, tg, B, T, &w, &v3, NULL), SPES_OK);
    assert_true(v3.total == v1.total && v3.ce == v1.ce && v3.lb == v1.lb);
    int64_t routed = 0;
    for (int i = 0; i < m.cfg.n_layers * m.cfg.num_experts; i++) routed += m.expert_counts[i];
    assert_int_equal(routed, (int64_t)m.cfg.n_layers * B * T * m.cfg.top_k);
    free(g1);
    model_free(&m);
}

// Activation checkpointing (fine_grained, whole_layer) recomputes with the same ops: the
// gradients and losses are the same bits as without, also with frozen experts and GQA.
static void test_activation_checkpointing_is_exact(void **state) {
    (void)state;
    Model m;
    setup_model(&m, QK_NORM_HEAD);
    assert_int_equal(model_set_trainable_experts(&m, 1, 2), SPES_OK);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, m.cfg.embedding_size);
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    size_t n = m.table.trainable_numel;
    float *g0 = malloc(n * sizeof(float));
    LossValues v0, v;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &v0, NULL), SPES_OK);
    memcpy(g0, m.grads, n * sizeof(float));
    const char *modes[] = {"fine_grained", "whole_layer", "none"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(model_set_activation_checkpointing(&m, modes[i]), SPES_OK);
        model_zero_grad(&m);
        assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &v, NULL), SPES_OK);
        assert_memory_equal(g0, m.grads, n * sizeof(float));
        assert_true(v.total == v0.total && v.lb == v0.lb && v.router_z == v0.router_z);
    }
    assert_int_equal(model_set_activation_checkpointing(&m, "one_in_two"), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "activation_checkpointing"));
    free(g0);
    model_free(&m);
}

// The LM head's logits block as a GPU backend lays it out (backend.h: logits_align,
// logits_block_bytes), run on the cpu. Rows padded from V = 73 to 128 columns (the head's
// GEMMs then run over 128 columns against zero rows of lm_head), and blocks of 64 rows
// instead of one: the same logits, losses and gradients up to rounding (OpenBLAS blocks a GEMM
// by its sizes, so N = 128 and K = 128 with 55 exact zero terms round otherwise than 73; one
// dW GEMM per block). A padding column read into a row's loss (a logit of 0 in the softmax),
// or a gradient written into lm_head's zero rows, would be far outside that.
static void test_logits_block_layout(void **state) {
    (void)state;
    ModelConfig c = tiny();
    c.embedding_size = 73;   // odd, as the reference 1B vocabulary (151665)
    c.max_seq_len = T;
    c.init_std = 0.1f;
    Backend padded = *backend_cpu(), blocked = *backend_cpu();
    padded.logits_align = 128;
    blocked.logits_align = 128;
    blocked.logits_block_bytes = 64 * 128 * sizeof(float);   // 64 rows: blocks of 64, 64, 12
    Backend *bes[3] = {backend_cpu(), &padded, &blocked};
    Model m[3];
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, c.embedding_size);
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    LossValues v[3];
    float *logits[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(model_create_on(&m[i], &c, bes[i]), SPES_OK);
        model_init_weights(&m[i], 5);
        model_zero_grad(&m[i]);
        assert_int_equal(model_forward_backward(&m[i], in, tg, B, T, &w, 1.0f, &v[i], NULL), SPES_OK);
        logits[i] = malloc((size_t)B * T * c.embedding_size * sizeof(float));
        LossValues fv;
        assert_int_equal(model_forward(&m[i], in, tg, B, T, &w, &fv, logits[i]), SPES_OK);
        assert_true(fv.total == v[i].total);
    }
    assert_int_equal(m[0].acts->logit_ld, 73);
    assert_int_equal(m[1].acts->logit_ld, 128);
    assert_int_equal(m[2].acts->logit_rows, 64);
    const size_t n = m[0].table.trainable_numel, nl = (size_t)B * T * c.embedding_size;
    float lscale = 0.0f, scale = 0.0f;
    for (size_t j = 0; j < nl; j++) lscale = fmaxf(lscale, fabsf(logits[0][j]));
    for (int i = 1; i < 3; i++) {
        for (size_t j = 0; j < nl; j++) assert_true(fabsf(logits[i][j] - logits[0][j]) <= 1e-6f * lscale);
        assert_true(fabs(v[i].total - v[0].total) <= 1e-6 * fabs(v[0].total));
        assert_true(fabs(v[i].lm_z - v[0].lm_z) <= 1e-6 * fabs(v[0].lm_z));
    }
    for (size_t j = 0; j < n; j++) scale = fmaxf(scale, fabsf(m[0].grads[j]));
    for (int i = 1; i < 3; i++)
        for (size_t j = 0; j < n; j++)
            if (!(fabsf(m[i].grads[j] - m[0].grads[j]) <= 1e-5f * scale))
                fail_msg("gradient %zu: %g %s against %g", j, m[i].grads[j], i == 1 ? "padded" : "in 64-row blocks",
                         m[0].grads[j]);
    for (int i = 0; i < 3; i++) {
        free(logits[i]);
        model_free(&m[i]);
    }
}

static void test_bad_inputs(void **state) {
    (void)state;
    Model m;
    setup_model(&m, QK_NORM_FULL);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, m.cfg.embedding_size);
    in[3] = m.cfg.embedding_size;
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, NULL, 1.0f, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "input token"));
    tokens(in, tg, m.cfg.embedding_size);
    tg[4] = -2;
    assert_int_equal(model_forward(&m, in, tg, B, T, NULL, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "target"));
    assert_int_equal(model_forward(&m, in, NULL, 1, T + 1, NULL, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "max_seq_len"));
    // All targets ignored: losses 0, gradient of the CE part 0, no NaN.
    for (int i = 0; i < B * T; i++) tg[i] = IGNORE_INDEX;
    tokens(in, tg + 0, m.cfg.embedding_size);
    for (int i = 0; i < B * T; i++) tg[i] = IGNORE_INDEX;
    LossValues v;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, NULL, 1.0f, &v, NULL), SPES_OK);
    assert_true(v.ce == 0.0 && v.num_targets == 0);
    for (size_t i = 0; i < m.table.trainable_numel; i++) assert_true(m.grads[i] == 0.0f);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_param_table),
        cmocka_unit_test(test_param_table_index_many_experts),
        cmocka_unit_test(test_init_statistics_and_reproducibility),
        cmocka_unit_test(test_frozen_experts_bitwise),
        cmocka_unit_test(test_frozen_shared_tensor),
        cmocka_unit_test(test_determinism_accumulation_and_forward),
        cmocka_unit_test(test_activation_checkpointing_is_exact),
        cmocka_unit_test(test_logits_block_layout),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
