// The outer optimizer (src/server/outer_optimizer.h): the Nesterov update against the textbook
// formula written out here in double, momentum carried across rounds (hand-computed values),
// lr 1 / momentum 0 giving the plain mean bit for bit, determinism, and a serialise/restore
// round trip that continues bit for bit; bad configs and bad state bytes refused by name.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "server/outer_optimizer.h"

// Two covered slots of different sizes and one uncovered (an expert in spes mode).
#define SLOTS 3
static const int64_t NUMEL[SLOTS] = {37, 0, 1000};

// A deterministic value in about [-scale, scale] (xorshift; no libc rand state).
static float noise(uint64_t *x, float scale) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return scale * (float)((double)(*x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill(float *dst, int64_t n, uint64_t seed, float scale) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) dst[i] = noise(&x, scale);
}

static void test_config_check(void **unused) {
    (void)unused;
    OuterOptConfig good = {.lr = 0.7f, .momentum = 0.9f};
    assert_int_equal(outer_opt_config_check(&good), SPES_OK);
    assert_int_equal(outer_opt_config_check(&OUTER_OPT_OFF), SPES_OK);
    assert_true(outer_opt_is_off(&OUTER_OPT_OFF));
    assert_false(outer_opt_is_off(&good));
    const OuterOptConfig bad_lr[] = {{0.0f, 0.5f}, {-1.0f, 0.5f}, {NAN, 0.5f}, {INFINITY, 0.5f}};
    for (size_t i = 0; i < sizeof bad_lr / sizeof *bad_lr; i++) {
        assert_int_equal(outer_opt_config_check(&bad_lr[i]), SPES_ERR);
        assert_non_null(strstr(spes_last_error(), "outer_lr"));
    }
    const OuterOptConfig bad_mu[] = {{0.7f, -0.1f}, {0.7f, 1.0f}, {0.7f, NAN}};
    for (size_t i = 0; i < sizeof bad_mu / sizeof *bad_mu; i++) {
        assert_int_equal(outer_opt_config_check(&bad_mu[i]), SPES_ERR);
        assert_non_null(strstr(spes_last_error(), "outer_momentum"));
    }
}

// The textbook DiLoCo outer step in double: g = theta - mean; v = mu v + g;
// theta -= lr (g + mu v). Five rounds on every covered slot; theta follows our own output
// (as the server's next round starts from its published aggregate), the peers' mean is the
// previous theta plus fresh noise.
static void test_matches_reference(void **unused) {
    (void)unused;
    const OuterOptConfig cfg = {.lr = 0.7f, .momentum = 0.9f};
    OuterOptState s;
    assert_int_equal(outer_opt_state_init(&s, SLOTS, NUMEL), SPES_OK);
    for (int t = 0; t < SLOTS; t++) {
        int64_t n = NUMEL[t];
        if (n == 0) continue;
        float *theta = malloc(n * sizeof *theta), *mean = malloc(n * sizeof *mean), *out = malloc(n * sizeof *out);
        double *ref_theta = malloc(n * sizeof *ref_theta), *ref_v = calloc(n, sizeof *ref_v);
        fill(theta, n, 100 + t, 1.0f);
        for (int64_t i = 0; i < n; i++) ref_theta[i] = theta[i];
        for (int round = 0; round < 5; round++) {
            fill(mean, n, 1000 * round + t, 0.01f);
            for (int64_t i = 0; i < n; i++) mean[i] += theta[i];
            assert_int_equal(outer_opt_step(&cfg, &s, t, theta, mean, out), SPES_OK);
            double worst = 0;
            for (int64_t i = 0; i < n; i++) {
                double g = (double)theta[i] - (double)mean[i];
                ref_v[i] = (double)cfg.momentum * ref_v[i] + g;
                ref_theta[i] = (double)theta[i] - (double)cfg.lr * (g + (double)cfg.momentum * ref_v[i]);
                worst = fmax(worst, fabs((double)out[i] - ref_theta[i]));
                // The velocity is the textbook one too.
                assert_true(fabs((double)s.velocity[t][i] - ref_v[i]) <= 1e-6 * (1 + fabs(ref_v[i])));
            }
            // fp32 against double on values of about 1: a few ulps.
            assert_true(worst < 1e-6);
            memcpy(theta, out, n * sizeof *theta);
        }
        free(theta), free(mean), free(out), free(ref_theta), free(ref_v);
    }
    outer_opt_end_round(&s, 25);
    assert_int_equal(s.rounds, 1);
    assert_int_equal(s.last_step, 25);
    outer_opt_state_free(&s);
}

// Values that are exact in binary, computed by hand: lr 0.5, mu 0.5, theta 1.
//   round 1: mean 0.5   g 0.5   v 0.5    step g + mu v = 0.75   theta 1 - 0.375    = 0.625
//   round 2: mean 0.375 g 0.25  v 0.5    step 0.5               theta 0.625 - 0.25 = 0.375
//   round 3: mean 0.375 g 0     v 0.25   step 0.125             theta 0.375 - 0.0625 = 0.3125
// Round 3's peers did not move at all, yet theta does: the momentum of the earlier rounds.
static void test_momentum_across_rounds(void **unused) {
    (void)unused;
    const OuterOptConfig cfg = {.lr = 0.5f, .momentum = 0.5f};
    const int64_t numel[1] = {1};
    OuterOptState s;
    assert_int_equal(outer_opt_state_init(&s, 1, numel), SPES_OK);
    const float means[3] = {0.5f, 0.375f, 0.375f}, want_v[3] = {0.5f, 0.5f, 0.25f},
                want_theta[3] = {0.625f, 0.375f, 0.3125f};
    float theta = 1.0f;
    for (int r = 0; r < 3; r++) {
        float out;
        assert_int_equal(outer_opt_step(&cfg, &s, 0, &theta, &means[r], &out), SPES_OK);
        outer_opt_end_round(&s, 10 * (r + 1));
        assert_true(out == want_theta[r]);
        assert_true(s.velocity[0][0] == want_v[r]);
        theta = out;
    }
    assert_int_equal(s.rounds, 3);
    assert_int_equal(s.last_step, 30);
    outer_opt_state_free(&s);
}

// lr 1, momentum 0: every output is the mean's bits, whatever theta, over several rounds;
// signed zeros, tiny and large values included.
static void test_off_is_exact_mean(void **unused) {
    (void)unused;
    OuterOptState s;
    assert_int_equal(outer_opt_state_init(&s, SLOTS, NUMEL), SPES_OK);
    int64_t n = NUMEL[2];
    float *theta = malloc(n * sizeof *theta), *mean = malloc(n * sizeof *mean), *out = malloc(n * sizeof *out);
    for (int round = 0; round < 4; round++) {
        fill(theta, n, 7 + round, 3.0f);
        fill(mean, n, 70 + round, 3.0f);
        mean[0] = -0.0f, theta[0] = 0.5f;
        mean[1] = 0.0f, theta[1] = -0.0f;
        mean[2] = 1e-30f, theta[2] = 1e8f;      // theta - (theta - mean) would give 0 here
        mean[3] = -1e8f, theta[3] = 3e-7f;
        mean[4] = -0.0f, theta[4] = -0.0f;
        assert_int_equal(outer_opt_step(&OUTER_OPT_OFF, &s, 2, theta, mean, out), SPES_OK);
        assert_memory_equal(out, mean, n * sizeof *out);
        outer_opt_end_round(&s, round);
    }
    free(theta), free(mean), free(out);
    outer_opt_state_free(&s);
}

// No previous aggregate (the run's first round): the mean as it is, the velocity untouched.
static void test_first_round_copies_mean(void **unused) {
    (void)unused;
    const OuterOptConfig cfg = {.lr = 0.7f, .momentum = 0.9f};
    OuterOptState s;
    assert_int_equal(outer_opt_state_init(&s, SLOTS, NUMEL), SPES_OK);
    float mean[37], out[37], zeros[37] = {0};
    fill(mean, 37, 3, 1.0f);
    assert_int_equal(outer_opt_step(&cfg, &s, 0, NULL, mean, out), SPES_OK);
    assert_memory_equal(out, mean, sizeof out);
    assert_memory_equal(s.velocity[0], zeros, sizeof zeros);
    // In place works the same.
    memcpy(out, mean, sizeof out);
    assert_int_equal(outer_opt_step(&cfg, &s, 0, NULL, out, out), SPES_OK);
    assert_memory_equal(out, mean, sizeof out);
    outer_opt_state_free(&s);
}

// Runs `rounds` rounds on every covered slot of s from fixed inputs; theta follows the output.
// in_place: the output overwrites the mean buffer. Writes the last output of slot 2 to last.
static void run_rounds(OuterOptState *s, int first_round, int rounds, bool in_place, float *last) {
    const OuterOptConfig cfg = {.lr = 0.8f, .momentum = 0.6f};
    for (int t = 0; t < SLOTS; t++) {
        int64_t n = NUMEL[t];
        if (n == 0) continue;
        float *theta = malloc(n * sizeof *theta), *mean = malloc(n * sizeof *mean), *out = malloc(n * sizeof *out);
        fill(theta, n, 5 + t + first_round, 1.0f);
        for (int r = first_round; r < first_round + rounds; r++) {
            fill(mean, n, 50 * r + t, 0.1f);
            for (int64_t i = 0; i < n; i++) mean[i] += theta[i];
            float *dst = in_place ? mean : out;
            assert_int_equal(outer_opt_step(&cfg, s, t, theta, mean, dst), SPES_OK);
            memcpy(theta, dst, n * sizeof *theta);
        }
        if (t == 2) memcpy(last, theta, n * sizeof *theta);
        free(theta), free(mean), free(out);
    }
    for (int r = first_round; r < first_round + rounds; r++) outer_opt_end_round(s, 10 * (r + 1));
}

static void assert_states_equal(const OuterOptState *a, const OuterOptState *b) {
    assert_int_equal(a->num_tensors, b->num_tensors);
    assert_int_equal(a->rounds, b->rounds);
    assert_int_equal(a->last_step, b->last_step);
    for (int t = 0; t < a->num_tensors; t++) {
        assert_int_equal(a->numel[t], b->numel[t]);
        if (a->numel[t]) assert_memory_equal(a->velocity[t], b->velocity[t], a->numel[t] * sizeof(float));
    }
}

static void test_deterministic(void **unused) {
    (void)unused;
    OuterOptState a, b;
    float last_a[1000], last_b[1000];
    assert_int_equal(outer_opt_state_init(&a, SLOTS, NUMEL), SPES_OK);
    assert_int_equal(outer_opt_state_init(&b, SLOTS, NUMEL), SPES_OK);
    run_rounds(&a, 0, 4, false, last_a);
    run_rounds(&b, 0, 4, true, last_b);
    assert_memory_equal(last_a, last_b, sizeof last_a);
    assert_states_equal(&a, &b);
    outer_opt_state_free(&a);
    outer_opt_state_free(&b);
}

// Serialise after 3 rounds, restore, run 2 more rounds on both: outputs and states identical;
// the restored state serialises to the same bytes.
static void test_serialise_round_trip(void **unused) {
    (void)unused;
    OuterOptState s, r;
    float last_s[1000], last_r[1000];
    assert_int_equal(outer_opt_state_init(&s, SLOTS, NUMEL), SPES_OK);
    run_rounds(&s, 0, 3, false, last_s);
    size_t len = outer_opt_state_size(&s);
    assert_int_equal(len, 8 + 4 + 4 + 8 + 8 + 8 * SLOTS + 4 * (37 + 1000) + 8);
    uint8_t *bytes = malloc(len), *again = malloc(len);
    outer_opt_state_serialise(&s, bytes);
    assert_int_equal(outer_opt_state_restore(&r, bytes, len, SLOTS, NUMEL, "state.bin"), SPES_OK);
    assert_states_equal(&s, &r);
    outer_opt_state_serialise(&r, again);
    assert_memory_equal(bytes, again, len);
    run_rounds(&s, 3, 2, false, last_s);
    run_rounds(&r, 3, 2, false, last_r);
    assert_memory_equal(last_s, last_r, sizeof last_s);
    assert_states_equal(&s, &r);
    assert_int_equal(r.rounds, 5);
    assert_int_equal(r.last_step, 50);
    // Without expected sizes (a tool reading the file) it restores too.
    OuterOptState any;
    assert_int_equal(outer_opt_state_restore(&any, bytes, len, 0, NULL, "state.bin"), SPES_OK);
    assert_int_equal(any.num_tensors, SLOTS);
    outer_opt_state_free(&any);
    free(bytes), free(again);
    outer_opt_state_free(&s);
    outer_opt_state_free(&r);
}

// Expects the restore to fail with a message holding the file name and `needle`.
static void expect_refused(const uint8_t *buf, size_t len, int num, const int64_t *numel, const char *needle) {
    OuterOptState s;
    assert_int_equal(outer_opt_state_restore(&s, buf, len, num, numel, "dir/outer_s25.bin"), SPES_ERR);
    const char *msg = spes_last_error();
    if (!strstr(msg, "dir/outer_s25.bin") || !strstr(msg, needle)) fail_msg("message '%s' lacks '%s'", msg, needle);
    outer_opt_state_free(&s);   // safe on a refused restore
}

// Rewrites the trailing checksum after a deliberate change, so a check behind it is reached.
static void reseal(uint8_t *buf, size_t len) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len - 8; i++) h = (h ^ buf[i]) * 1099511628211ull;
    for (int i = 0; i < 8; i++) buf[len - 8 + i] = (uint8_t)(h >> (8 * i));
}

static void test_restore_refuses_bad_bytes(void **unused) {
    (void)unused;
    OuterOptState s;
    float last[1000];
    assert_int_equal(outer_opt_state_init(&s, SLOTS, NUMEL), SPES_OK);
    run_rounds(&s, 0, 2, false, last);
    size_t len = outer_opt_state_size(&s);
    uint8_t *good = malloc(len), *buf = malloc(len);
    outer_opt_state_serialise(&s, good);

    expect_refused(good, 20, SLOTS, NUMEL, "truncated");
    expect_refused(good, len - 4, SLOTS, NUMEL, "checksum");
    memcpy(buf, good, len), buf[0] = 'X';
    expect_refused(buf, len, SLOTS, NUMEL, "magic");
    memcpy(buf, good, len), buf[8] = 2;
    expect_refused(buf, len, SLOTS, NUMEL, "version");
    memcpy(buf, good, len), buf[len - 100] ^= 1;   // a momentum value damaged on disk
    expect_refused(buf, len, SLOTS, NUMEL, "checksum");
    // Another model: a different tensor count or size.
    expect_refused(good, len, SLOTS + 1, NUMEL, "tensors");
    const int64_t other[SLOTS] = {37, 0, 999};
    expect_refused(good, len, SLOTS, other, "elements");
    // Sizes that do not fit the bytes, checksum made valid again.
    memcpy(buf, good, len), buf[12] = 0xff, buf[13] = 0xff, buf[14] = 0xff, reseal(buf, len);
    expect_refused(buf, len, 0, NULL, "tensors");
    memcpy(buf, good, len), buf[32 + 16 + 6] = 0x01, reseal(buf, len);   // slot 2 claims 2^48 more
    expect_refused(buf, len, 0, NULL, "elements");
    memcpy(buf, good, len), buf[32] = 36, reseal(buf, len);              // slot 0: 36, 4 bytes left over
    expect_refused(buf, len, 0, NULL, "bytes of momentum");
    memcpy(buf, good, len), buf[23] = 0x80, reseal(buf, len);            // negative round count
    expect_refused(buf, len, 0, NULL, "rounds");
    free(good), free(buf);
    outer_opt_state_free(&s);
}

static void test_step_refuses_uncovered_slot(void **unused) {
    (void)unused;
    const OuterOptConfig cfg = {.lr = 0.7f, .momentum = 0.9f};
    OuterOptState s;
    assert_int_equal(outer_opt_state_init(&s, SLOTS, NUMEL), SPES_OK);
    float x[4] = {0}, y[4] = {0};
    assert_int_equal(outer_opt_step(&cfg, &s, 1, x, x, y), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "tensor 1"));
    assert_int_equal(outer_opt_step(&cfg, &s, SLOTS, x, x, y), SPES_ERR);
    assert_int_equal(outer_opt_step(&cfg, &s, -1, x, x, y), SPES_ERR);
    const int64_t negative[1] = {-5};
    OuterOptState bad;
    assert_int_equal(outer_opt_state_init(&bad, 1, negative), SPES_ERR);
    outer_opt_state_free(&bad);
    outer_opt_state_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_check),
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_momentum_across_rounds),
        cmocka_unit_test(test_off_is_exact_mean),
        cmocka_unit_test(test_first_round_copies_mean),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_serialise_round_trip),
        cmocka_unit_test(test_restore_refuses_bad_bytes),
        cmocka_unit_test(test_step_refuses_uncovered_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
