// Dynamic loss scaling: halve and skip on overflow, grow after a run of good steps, floor.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "train/loss_scale.h"

static void test_disabled_never_scales(void **state) {
    LossScaler s;
    loss_scale_init(&s, false);
    assert_true(s.scale == 1.0);
    assert_true(loss_scale_update(&s, true));
    assert_false(loss_scale_update(&s, false));   // a non-finite step is never applied
    assert_true(s.scale == 1.0);
}

static void test_overflow_halves_and_skips(void **state) {
    LossScaler s;
    loss_scale_init(&s, true);
    assert_true(s.scale == LOSS_SCALE_INIT);
    assert_false(loss_scale_update(&s, false));
    assert_true(s.scale == LOSS_SCALE_INIT / 2);
    assert_int_equal(s.skipped, 1);
    assert_true(loss_scale_update(&s, true));
    assert_true(s.scale == LOSS_SCALE_INIT / 2);
}

static void test_growth_after_interval(void **state) {
    LossScaler s;
    loss_scale_init(&s, true);
    s.growth_interval = 3;
    for (int i = 0; i < 2; i++) assert_true(loss_scale_update(&s, true));
    assert_true(s.scale == LOSS_SCALE_INIT);
    assert_true(loss_scale_update(&s, true));   // the third good step in a row doubles
    assert_true(s.scale == 2 * LOSS_SCALE_INIT);
    assert_true(loss_scale_update(&s, true));
    assert_false(loss_scale_update(&s, false));   // an overflow resets the run
    assert_true(loss_scale_update(&s, true));
    assert_true(loss_scale_update(&s, true));
    assert_true(s.scale == LOSS_SCALE_INIT);
}

static void test_floor(void **state) {
    LossScaler s;
    loss_scale_init(&s, true);
    for (int i = 0; i < 100; i++) loss_scale_update(&s, false);
    assert_true(s.scale == LOSS_SCALE_MIN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disabled_never_scales),
        cmocka_unit_test(test_overflow_halves_and_skips),
        cmocka_unit_test(test_growth_after_interval),
        cmocka_unit_test(test_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
