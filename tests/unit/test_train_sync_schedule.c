// spes_sync_due: the steps a peer syncs at, without and with the synchronous warm-up
// (spes_config.sync_warmup_steps / sync_warmup_every), and that every schedule it yields is one
// the parameter server takes (no round more than ROUNDS_AHEAD gaps ahead of the one before).
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/rounds.h"
#include "train/spes_peer.h"

// Without a warm-up: exactly the multiples of sync_steps (step 0 included, as the resume check
// always took it), as before the key existed.
static void test_plain_schedule(void **state) {
    (void)state;
    for (int64_t s = 0; s <= 1000; s++) assert_int_equal(spes_sync_due(s, 25, 0, 1), s % 25 == 0);
    for (int64_t s = 0; s <= 300; s++) assert_true(spes_sync_due(s, 1, 0, 1));
    assert_false(spes_sync_due(25, 0, 0, 1));   // sync_steps 0: never (validation refuses it)
}

// Warm-up 100 steps every step, sync_steps 25: every step to 100, the ramp 101, 103, 106, 112,
// then 125, 150, ...
static void test_warmup_every_step(void **state) {
    (void)state;
    for (int64_t s = 1; s <= 100; s++) assert_true(spes_sync_due(s, 25, 100, 1));
    const int64_t ramp[] = {101, 103, 106, 112, 125};
    int r = 0;
    for (int64_t s = 101; s <= 125; s++) {
        bool want = r < 5 && s == ramp[r];
        assert_int_equal(spes_sync_due(s, 25, 100, 1), want);
        if (want) r++;
    }
    assert_int_equal(r, 5);
    for (int64_t s = 126; s <= 1000; s++) assert_int_equal(spes_sync_due(s, 25, 100, 1), s % 25 == 0);
}

// Warm-up every 5 steps: multiples of 5 to 100, ramp points only as far down as the interval.
static void test_warmup_every_five(void **state) {
    (void)state;
    for (int64_t s = 1; s <= 100; s++) assert_int_equal(spes_sync_due(s, 25, 100, 5), s % 5 == 0);
    for (int64_t s = 101; s <= 125; s++) assert_int_equal(spes_sync_due(s, 25, 100, 5), s == 106 || s == 112 || s == 125);
}

// Every schedule: the gap to each round is at most ROUNDS_AHEAD times the gap before it (the
// server refuses uploads further ahead; server/rounds.h), from W + K on it is the plain schedule,
// and the last step of a run whose length is a multiple of K is a sync.
static void test_schedules_fit_the_server(void **state) {
    (void)state;
    const int64_t Ks[] = {1, 2, 3, 7, 10, 25, 32, 100};
    for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++) {
        int64_t K = Ks[i];
        for (int64_t e = 1; e <= K; e++) {
            if (K % e && e != K) continue;   // a few intervals per K: its divisors
            for (int64_t W = 0; W <= 4 * K; W += K) {
                if (W % e) continue;
                int64_t T = 20 * K, prev = 0, gap = 0, rounds = 0;
                for (int64_t s = 1; s <= T; s++) {
                    if (!spes_sync_due(s, K, W, e)) continue;
                    int64_t g = s - prev;
                    if (gap > 0) assert_true(g <= (int64_t)ROUNDS_AHEAD * gap);
                    gap = g, prev = s, rounds++;
                    if (s > W + K) assert_int_equal(s % K, 0);
                }
                assert_int_equal(prev, T);
                assert_true(rounds >= T / K);
            }
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_schedule),
        cmocka_unit_test(test_warmup_every_step),
        cmocka_unit_test(test_warmup_every_five),
        cmocka_unit_test(test_schedules_fit_the_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
