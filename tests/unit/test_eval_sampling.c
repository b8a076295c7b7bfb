// Sampling: greedy, temperature, top-k and top-p cut-offs, determinism.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

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
    assert_int_equal(sample_token(logits, 5, &greedy, &rng, probs, index), 1);
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
    for (int i = 0; i < n; i++) counts[sample_token(logits, 3, &p, &rng, probs, index)]++;
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
        seen_k[sample_token(logits, 4, &k2, &rng, probs, index)]++;
        seen_p[sample_token(logits, 4, &p07, &rng, probs, index)]++;
        assert_int_equal(sample_token(logits, 4, &p05, &rng, probs, index), 3);
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
    for (int i = 0; i < 50; i++) a[i] = sample_token(logits, 8, &p, &r1, probs, index);
    for (int i = 0; i < 50; i++) b[i] = sample_token(logits, 8, &p, &r2, probs, index);
    assert_memory_equal(a, b, sizeof a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k_and_top_p),
        cmocka_unit_test(test_deterministic_for_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
