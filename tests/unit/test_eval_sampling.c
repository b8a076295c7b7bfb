// Sampling: greedy, temperature, top-k, top-p and min-p cut-offs, the repetition penalty, determinism.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "eval/sampling.h"

static void test_greedy_and_ties(void **state) {
    (void)state;
    float logits[5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
    assert_int_equal(sample_argmax(logits, 5), 1);   // first of the tie, like torch.argmax
    float probs[5];
    int index[5];
    Rng rng;
    rng_seed(&rng, 1);
    SamplingParams greedy = {.temperature = 0.0f};
    assert_int_equal(sample_token(logits, 5, &greedy, NULL, 0, &rng, probs, index), 1);
}

// Empirical frequencies match softmax(logits / T) within sampling noise.
static void test_temperature_distribution(void **state) {
    (void)state;
    float logits[3] = {0.0f, 1.0f, 2.0f};
    float probs[3];
    int index[3], counts[3] = {0, 0, 0};
    Rng rng;
    rng_seed(&rng, 42);
    SamplingParams p = {.temperature = 2.0f};
    const int n = 200000;
    for (int i = 0; i < n; i++) counts[sample_token(logits, 3, &p, NULL, 0, &rng, probs, index)]++;
    double z = 1.0 + exp(0.5) + exp(1.0);
    double expect[3] = {1.0 / z, exp(0.5) / z, exp(1.0) / z};
    for (int i = 0; i < 3; i++) assert_true(fabs(counts[i] / (double)n - expect[i]) < 0.005);
}

static void test_top_k_and_top_p(void **state) {
    (void)state;
    // probabilities (T=1): ~[0.032, 0.087, 0.237, 0.644]
    float logits[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    float probs[4];
    int index[4];
    Rng rng;
    rng_seed(&rng, 7);
    SamplingParams k2 = {.temperature = 1.0f, .top_k = 2};
    SamplingParams p07 = {.temperature = 1.0f, .top_p = 0.7f};   // 0.644 < 0.7: keeps 3 and 2
    SamplingParams p05 = {.temperature = 1.0f, .top_p = 0.5f};   // 0.644 >= 0.5: keeps 3 only
    int seen_k[4] = {0}, seen_p[4] = {0};
    for (int i = 0; i < 5000; i++) {
        seen_k[sample_token(logits, 4, &k2, NULL, 0, &rng, probs, index)]++;
        seen_p[sample_token(logits, 4, &p07, NULL, 0, &rng, probs, index)]++;
        assert_int_equal(sample_token(logits, 4, &p05, NULL, 0, &rng, probs, index), 3);
    }
    assert_int_equal(seen_k[0] + seen_k[1], 0);
    assert_true(seen_k[2] > 0 && seen_k[3] > 0);
    assert_int_equal(seen_p[0] + seen_p[1], 0);
    assert_true(seen_p[2] > 0 && seen_p[3] > 0);
}

static void test_deterministic_for_seed(void **state) {
    (void)state;
    float logits[8] = {0.3f, 0.1f, 0.9f, 0.2f, 0.5f, 0.4f, 0.8f, 0.7f};
    float probs[8];
    int index[8], a[50], b[50];
    SamplingParams p = {.temperature = 0.8f, .top_k = 6, .top_p = 0.9f};
    Rng r1, r2;
    rng_seed(&r1, 99);
    rng_seed(&r2, 99);
    for (int i = 0; i < 50; i++) a[i] = sample_token(logits, 8, &p, NULL, 0, &r1, probs, index);
    for (int i = 0; i < 50; i++) b[i] = sample_token(logits, 8, &p, NULL, 0, &r2, probs, index);
    assert_memory_equal(a, b, sizeof a);
}

// The logits and ids the expected values below were computed from with transformers 5.23:
//   logits = torch.tensor([[1.5, -0.5, 0.0, 2.25, -3.0, 0.75, 4.0, -1.25]])
//   RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([[3, 1, 3, 0, 6, 1]]), logits.clone())
//   warpers applied in turn, kept = the ids whose score is not -inf:
//   MinPLogitsWarper(0.1), [TopKLogitsWarper(3), TopPLogitsWarper(0.9)], ...
static const float hf_logits[8] = {1.5f, -0.5f, 0.0f, 2.25f, -3.0f, 0.75f, 4.0f, -1.25f};

static void test_repetition_penalty_as_transformers(void **state) {
    (void)state;
    const int32_t seen[6] = {3, 1, 3, 0, 6, 1};   // repeated ids are penalised once
    static const struct {
        float penalty, expected[8];
    } cases[] = {
        {1.3f, {1.15384614f, -0.649999976f, 0.0f, 1.73076928f, -3.0f, 0.75f, 3.07692313f, -1.25f}},
        {0.5f, {3.0f, -0.25f, 0.0f, 4.5f, -3.0f, 0.75f, 8.0f, -1.25f}},
    };
    int mark[8];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float logits[8];
        memcpy(logits, hf_logits, sizeof logits);
        sampling_repetition_penalty(logits, 8, seen, 6, cases[c].penalty, mark);
        for (int i = 0; i < 8; i++) assert_float_equal(logits[i], cases[c].expected[i], 1e-6);
    }
    // Greedy decoding takes it too (a logits processor in transformers): at 6, token 6's 4.0 falls to
    // 0.67, below the unseen 5's 0.75.
    float logits[8], probs[8];
    int index[8];
    Rng rng;
    rng_seed(&rng, 1);
    memcpy(logits, hf_logits, sizeof logits);
    SamplingParams greedy = {.temperature = 0.0f, .repetition_penalty = 6.0f};
    assert_int_equal(sample_token(logits, 8, &greedy, seen, 6, &rng, probs, index), 5);
    memcpy(logits, hf_logits, sizeof logits);
    greedy.repetition_penalty = 1.0f;   // none
    assert_int_equal(sample_token(logits, 8, &greedy, seen, 6, &rng, probs, index), 6);
}

// The ids sampling_candidates keeps, sorted, against those transformers' warpers leave finite.
static void expect_kept(SamplingParams p, const int *expected, int n_expected) {
    float probs[8];
    int index[8], kept[8] = {0};
    int n = sampling_candidates(hf_logits, 8, &p, probs, index);
    for (int r = 0; r < n; r++) kept[index[r]] = 1;
    int want[8] = {0};
    for (int i = 0; i < n_expected; i++) want[expected[i]] = 1;
    if (n != n_expected || memcmp(kept, want, sizeof kept) != 0)
        fail_msg("T %g top_k %d top_p %g min_p %g: kept %d ids, transformers %d", (double)p.temperature, p.top_k,
                 (double)p.top_p, (double)p.min_p, n, n_expected);
}

static void test_cutoffs_as_transformers(void **state) {
    (void)state;
    expect_kept((SamplingParams){.temperature = 1, .min_p = 0.1f}, (int[]){3, 6}, 2);
    expect_kept((SamplingParams){.temperature = 1, .min_p = 0.3f}, (int[]){6}, 1);
    expect_kept((SamplingParams){.temperature = 0.5f, .min_p = 0.1f}, (int[]){6}, 1);   // after the temperature
    expect_kept((SamplingParams){.temperature = 1, .top_p = 0.9f}, (int[]){0, 3, 6}, 3);
    // top_p over the top-k renormalised: 0.752 + 0.131 of the top 3's 0.944 reach 0.9 of it (of the whole
    // distribution they do not: the third token used to be kept).
    expect_kept((SamplingParams){.temperature = 1, .top_k = 3, .top_p = 0.9f}, (int[]){3, 6}, 2);
    expect_kept((SamplingParams){.temperature = 1, .top_k = 4, .top_p = 0.8f, .min_p = 0.2f}, (int[]){6}, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k_and_top_p),
        cmocka_unit_test(test_deterministic_for_seed),
        cmocka_unit_test(test_repetition_penalty_as_transformers),
        cmocka_unit_test(test_cutoffs_as_transformers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
