// The straggler policy (src/server/round_deadline.c) as the pure function it is: the adaptive
// deadline, and when an open round keeps waiting, waits for a quorum, or closes partial.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "server/round_deadline.h"

static void test_deadline_adapts_to_the_run(void **state) {
    (void)state;
    double recent[10] = {1, 9, 2, 3, 4, 4, 4, 4, 100, 100};
    assert_true(rounds_deadline(5, recent, 0) == 5);       // nothing known: the timeout
    assert_true(rounds_deadline(5, NULL, 0) == 5);         // (with no buffer at all)
    assert_true(rounds_deadline(5, recent, 3) == 6);       // 3 x median {1, 2, 9}
    assert_true(rounds_deadline(5, recent, 4) == 7.5);     // 3 x median {1, 2, 3, 9} = 2.5
    assert_true(rounds_deadline(10, recent, 4) == 10);     // never below the timeout
    assert_true(rounds_deadline(0, recent, 10) == 12);     // only the first ROUNDS_RECENT count: median 4
    assert_true(recent[1] == 9);                           // the caller's ring is not reordered
}

static RoundWait base_wait(void) {
    static const double recent[2] = {2, 2};   // deadline max(5, 3 x 2) = 6 s after opening
    return (RoundWait){.round_timeout_s = 5, .opened_at = 100, .now = 103, .recent = recent, .n_recent = 2,
                       .uploaded = 3, .min_peers = 2, .needs_earlier = true, .have_earlier = true};
}

static void test_no_timeout_waits_for_everyone(void **state) {
    (void)state;
    RoundWait w = base_wait();
    w.round_timeout_s = 0;
    w.now = 1e9;
    double due = -1;
    assert_int_equal(round_wait_decide(&w, &due), ROUND_KEEP_WAITING);
    assert_true(due == 0);
}

static void test_before_the_deadline(void **state) {
    (void)state;
    RoundWait w = base_wait();
    double due;
    assert_int_equal(round_wait_decide(&w, &due), ROUND_KEEP_WAITING);
    assert_true(due == 106);
    w.now = 105.999;
    assert_int_equal(round_wait_decide(&w, &due), ROUND_KEEP_WAITING);
}

static void test_past_the_deadline(void **state) {
    (void)state;
    RoundWait w = base_wait();
    w.now = 106;
    double due;
    assert_int_equal(round_wait_decide(&w, &due), ROUND_CLOSE_PARTIAL);
    w.uploaded = 1;   // below the quorum: look again in a second
    assert_int_equal(round_wait_decide(&w, &due), ROUND_PAST_DEADLINE_NO_QUORUM);
    assert_true(due == 107);
    w.uploaded = 2;   // exactly the quorum
    assert_int_equal(round_wait_decide(&w, &due), ROUND_CLOSE_PARTIAL);
}

static void test_first_spes_round_never_partial(void **state) {
    (void)state;
    RoundWait w = base_wait();
    w.now = 1000;
    w.have_earlier = false;   // the missing owners' experts have no earlier value
    double due;
    assert_int_equal(round_wait_decide(&w, &due), ROUND_PAST_DEADLINE_NO_QUORUM);
    w.needs_earlier = false;  // fedavg: every tensor is a mean, nothing needs an earlier value
    assert_int_equal(round_wait_decide(&w, &due), ROUND_CLOSE_PARTIAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline_adapts_to_the_run),  cmocka_unit_test(test_no_timeout_waits_for_everyone),
        cmocka_unit_test(test_before_the_deadline),         cmocka_unit_test(test_past_the_deadline),
        cmocka_unit_test(test_first_spes_round_never_partial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
