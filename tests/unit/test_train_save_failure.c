// The failed-save policy (src/train/save_failure.c): an interval's save trains on, a requested or
// final one retries within its bounds, a stop ends the wait; when the retries end, a requested
// save trains on and a final one gives up. The trainer's side: tests/integration/train_save_full_disk.sh.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "train/save_failure.h"

static void test_interval_trains_on(void **state) {
    (void)state;
    const SaveRetry r = {.for_s = 600, .every_s = 30};
    // never waits: the model is still in memory and the next interval tries again
    assert_int_equal(save_after_failure(SAVE_ON_INTERVAL, &r, 0, false), SAVE_TRAIN_ON);
    assert_int_equal(save_after_failure(SAVE_ON_INTERVAL, &r, 1000, true), SAVE_TRAIN_ON);
}

static void test_final_retries_then_gives_up(void **state) {
    (void)state;
    const SaveRetry r = {.for_s = 600, .every_s = 30};
    assert_int_equal(save_after_failure(SAVE_FINAL, &r, 0, false), SAVE_RETRY);
    assert_int_equal(save_after_failure(SAVE_FINAL, &r, 569.9, false), SAVE_RETRY);
    // the last retry starts at 600 s at the latest
    assert_int_equal(save_after_failure(SAVE_FINAL, &r, 570, false), SAVE_RETRY);
    assert_int_equal(save_after_failure(SAVE_FINAL, &r, 570.1, false), SAVE_GIVE_UP);
    assert_int_equal(save_after_failure(SAVE_FINAL, &r, 5000, false), SAVE_GIVE_UP);
    // a stop signal since the save began ends the wait at once
    assert_int_equal(save_after_failure(SAVE_FINAL, &r, 0, true), SAVE_GIVE_UP);
}

static void test_request_retries_then_trains_on(void **state) {
    (void)state;
    const SaveRetry r = {.for_s = 600, .every_s = 30};
    assert_int_equal(save_after_failure(SAVE_ON_REQUEST, &r, 0, false), SAVE_RETRY);
    assert_int_equal(save_after_failure(SAVE_ON_REQUEST, &r, 571, false), SAVE_TRAIN_ON);
    // a stop: training on to the step boundary, where the stop's own (final) save comes
    assert_int_equal(save_after_failure(SAVE_ON_REQUEST, &r, 0, true), SAVE_TRAIN_ON);
}

static void test_no_retries(void **state) {
    (void)state;
    // --save_retry=0, or a trainer given no bounds: one attempt
    const SaveRetry none = {0}, zero = {.for_s = 0, .every_s = 30}, no_gap = {.for_s = 600, .every_s = 0};
    assert_int_equal(save_after_failure(SAVE_FINAL, &none, 0, false), SAVE_GIVE_UP);
    assert_int_equal(save_after_failure(SAVE_FINAL, &zero, 0, false), SAVE_GIVE_UP);
    assert_int_equal(save_after_failure(SAVE_FINAL, &no_gap, 0, false), SAVE_GIVE_UP);   // never a busy loop
    assert_int_equal(save_after_failure(SAVE_ON_REQUEST, &none, 0, false), SAVE_TRAIN_ON);
    // a bound shorter than the gap: no retry
    const SaveRetry short_bound = {.for_s = 10, .every_s = 30};
    assert_int_equal(save_after_failure(SAVE_FINAL, &short_bound, 0, false), SAVE_GIVE_UP);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interval_trains_on),
        cmocka_unit_test(test_final_retries_then_gives_up),
        cmocka_unit_test(test_request_retries_then_trains_on),
        cmocka_unit_test(test_no_retries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
