// The disk-space policy of a run's checkpoints (src/train/save_space.c): saves left and the
// save_folder's growth at its fullest. The warning itself: tests/integration/train_save_space.sh.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "train/save_space.h"

static void test_saves_left(void **state) {
    (void)state;
    // every 5 steps up to 40: 5, 10, ..., 40, the last one the final save too
    assert_int_equal(save_space_saves_left(0, 40, 5), 8);
    // 42 is off the grid: 8 on it, then the final save at 42
    assert_int_equal(save_space_saves_left(0, 42, 5), 9);
    // resumed at 10 (its checkpoint exists): 15, 20
    assert_int_equal(save_space_saves_left(10, 20, 5), 2);
    // resumed off the grid (a stop by signal at 12): 15, 20
    assert_int_equal(save_space_saves_left(12, 20, 5), 2);
    // only the final save
    assert_int_equal(save_space_saves_left(0, 40, 0), 1);
    assert_int_equal(save_space_saves_left(0, 40, -1), 1);
    // an interval longer than the run: the final save alone
    assert_int_equal(save_space_saves_left(0, 40, 100), 1);
    // nothing left to train
    assert_int_equal(save_space_saves_left(40, 40, 5), 0);
    assert_int_equal(save_space_saves_left(50, 40, 5), 0);
}

static void test_needed(void **state) {
    (void)state;
    const size_t each = 1000;
    // keep all: every save left stays
    assert_int_equal(save_space_needed(each, -1, 0, 8), 8000);
    assert_int_equal(save_space_needed(each, 0, 3, 8), 8000);
    // keep 2 of a fresh folder: 3 at once while the third save runs
    assert_int_equal(save_space_needed(each, 2, 0, 8), 3000);
    // ... but never more than the saves left
    assert_int_equal(save_space_needed(each, 2, 0, 1), 1000);
    assert_int_equal(save_space_needed(each, 5, 0, 2), 2000);
    // a resumed folder already holding 2 of keep 2: one more while saving
    assert_int_equal(save_space_needed(each, 2, 2, 8), 1000);
    // holding more than keep (keep lowered at a resume): still one at a time
    assert_int_equal(save_space_needed(each, 2, 6, 8), 1000);
    // holding 1 of keep 3: up to 4 at once, 3 of them new
    assert_int_equal(save_space_needed(each, 3, 1, 8), 3000);
    // nothing left to save
    assert_int_equal(save_space_needed(each, 2, 0, 0), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_saves_left),
        cmocka_unit_test(test_needed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
