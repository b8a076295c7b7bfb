// Learning-rate schedules (src/train/schedule.c): OLMo's boundary values, validation, and
// (when SPES_SCHEDULE_REF names the output of tests/ref/schedule_ref.py, as
// tests/integration/train_schedule_ref.sh arranges) a grid of values computed in Python.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "config/config.h"
#include "train/schedule.h"

static void test_cosine_boundaries(void **state) {
    (void)state;
    ScheduleConfig s = {.kind = SCHEDULE_COSINE_WITH_WARMUP, .t_warmup = 10, .alpha_f = 0.1, .warmup_min_lr = -1};
    double lr = 1e-3;
    assert_float_equal(schedule_lr(&s, lr, 0, 110), 1e-4, 1e-15);                 // warm-up starts at 0.1*lr
    assert_float_equal(schedule_lr(&s, lr, 5, 110), 1e-4 + 0.9e-3 * 0.5, 1e-15);  // halfway
    assert_float_equal(schedule_lr(&s, lr, 10, 110), lr, 1e-15);                  // peak
    assert_float_equal(schedule_lr(&s, lr, 60, 110), 1e-4 + 0.9e-3 * 0.5, 1e-15); // cosine midpoint
    assert_float_equal(schedule_lr(&s, lr, 110, 110), 1e-4, 1e-15);               // alpha_f * lr
    assert_float_equal(schedule_lr(&s, lr, 500, 110), 1e-4, 1e-15);
    for (int t = 11; t < 110; t++) assert_true(schedule_lr(&s, lr, t, 110) < schedule_lr(&s, lr, t - 1, 110));
    s.t_max = 60;   // t_max overrides the run length
    assert_float_equal(schedule_lr(&s, lr, 60, 110), 1e-4, 1e-15);
}

static void test_linear_and_constant(void **state) {
    (void)state;
    ScheduleConfig s = {.kind = SCHEDULE_LINEAR_WITH_WARMUP, .t_warmup = 0, .alpha_f = 0.0, .warmup_min_lr = -1};
    assert_float_equal(schedule_lr(&s, 2.0, 0, 100), 2.0, 1e-15);
    assert_float_equal(schedule_lr(&s, 2.0, 25, 100), 1.5, 1e-15);
    assert_float_equal(schedule_lr(&s, 2.0, 100, 100), 0.0, 1e-15);
    s.t_warmup = 4;
    s.warmup_min_lr = 0.0;
    assert_float_equal(schedule_lr(&s, 2.0, 1, 100), 0.5, 1e-15);
    ScheduleConfig c = {.kind = SCHEDULE_CONSTANT, .t_warmup = 100};
    assert_float_equal(schedule_lr(&c, 3e-4, 0, 10), 3e-4, 0);   // OLMo's constant has no warm-up
    assert_float_equal(schedule_lr(&c, 3e-4, 1000, 10), 3e-4, 0);
}

static void test_names_and_validation(void **state) {
    (void)state;
    ScheduleKind k;
    assert_int_equal(schedule_kind_from_name("cosine_with_warmup", &k), SPES_OK);
    assert_int_equal(k, SCHEDULE_COSINE_WITH_WARMUP);
    assert_string_equal(schedule_kind_name(SCHEDULE_LINEAR_WITH_WARMUP), "linear_with_warmup");
    assert_int_equal(schedule_kind_from_name("inverse_sqrt_with_warmup", &k), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "inverse_sqrt_with_warmup"));
    ScheduleConfig s = {.kind = SCHEDULE_COSINE_WITH_WARMUP, .t_warmup = 10, .alpha_f = 0.1, .warmup_min_lr = -1};
    assert_int_equal(schedule_validate(&s, 1e-3, 100, NULL, NULL), SPES_OK);
    assert_int_equal(schedule_validate(&s, 1e-3, 10, NULL, NULL), SPES_ERR);   // decay would end inside the warm-up
    assert_non_null(strstr(spes_last_error(), "max_duration: the decay ends at step 10, not after the warm-up "
                                              "(scheduler.t_warmup 10)"));
    s.alpha_f = 1.5;
    assert_int_equal(schedule_validate(&s, 1e-3, 100, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "scheduler.alpha_f: must be in [0, 1], got 1.5"));
    s.alpha_f = 0.1;
    s.warmup_min_lr = 2e-3;
    assert_int_equal(schedule_validate(&s, 1e-3, 100, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "scheduler.warmup_min_lr: must be below optimizer.learning_rate"));
    // A rate of 0 with the default warmup_min_lr (0.1 x 0) is the rate's fault, not the key the
    // user never set.
    s.warmup_min_lr = -1;
    assert_int_equal(schedule_validate(&s, 0.0, 100, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "optimizer.learning_rate: must be above 0 for the warm-up"));
}

// Checked after the load (max_steps needs the data), a loaded config's schedule errors name the
// key at the line that set it, as the loader's own errors do; they used to carry no file:line
// ("scheduler: the decay ends at step 40 (t_max or max_duration), ...").
static void expect_located(const char *yaml, const char *override, int64_t max_steps, const char *want) {
    TrainConfig cfg;
    char *over[1] = {(char *)override};
    assert_int_equal(config_load_string(yaml, "run.yaml", override ? 1 : 0, over, &cfg), SPES_OK);
    int rc = config_schedule_validate(&cfg, max_steps);
    config_free(&cfg);
    if (rc != SPES_ERR || !strstr(spes_last_error(), want))
        fail_msg("rc %d, message \"%s\" (want \"%s\")", rc, rc == SPES_ERR ? spes_last_error() : "", want);
}
static void test_errors_name_the_line(void **state) {
    (void)state;
    expect_located("seed: 1\nmax_duration: 40\nscheduler:\n  name: linear_with_warmup\n  t_warmup: 50\n", NULL, 40,
                   "run.yaml:2: max_duration: the decay ends at step 40, not after the warm-up (scheduler.t_warmup 50): "
                   "raise max_duration or lower scheduler.t_warmup");
    expect_located("scheduler:\n  t_warmup: 10\n", "--optimizer.learning_rate=0", 100,
                   "command line --optimizer.learning_rate: must be above 0 for the warm-up (scheduler.t_warmup 10) to "
                   "rise to it, got 0");
    expect_located("optimizer:\n  learning_rate: 0.001\nscheduler:\n  t_warmup: 10\n  warmup_min_lr: 0.001\n", NULL,
                   100, "run.yaml:5: scheduler.warmup_min_lr: must be below optimizer.learning_rate (0.001), got 0.001");
    // (A negative t_warmup or alpha_f is refused by the loader itself, at its line.)
}

static void test_matches_python(void **state) {
    (void)state;
    const char *path = getenv("SPES_SCHEDULE_REF");
    assert_non_null(path);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char kind_name[64];
    long long t_warmup, t_max, step, max_steps;
    double alpha_f, wmin, lr, expected;
    int cases = 0;
    while (fscanf(f, "%63s %lld %lld %lf %lf %lf %lld %lld %lf", kind_name, &t_warmup, &t_max, &alpha_f, &wmin, &lr,
                  &step, &max_steps, &expected) == 9) {
        ScheduleConfig s = {.t_warmup = t_warmup, .t_max = t_max, .alpha_f = alpha_f, .warmup_min_lr = wmin};
        assert_int_equal(schedule_kind_from_name(kind_name, &s.kind), SPES_OK);
        double got = schedule_lr(&s, lr, step, max_steps);
        if (fabs(got - expected) > 1e-15 * fabs(expected) + 1e-20)
            fail_msg("%s t_warmup=%lld t_max=%lld step=%lld: %.17g, Python %.17g", kind_name, t_warmup, t_max, step,
                     got, expected);
        cases++;
    }
    fclose(f);
    printf("%d schedule cases agree with Python\n", cases);
    assert_true(cases > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cosine_boundaries),
        cmocka_unit_test(test_linear_and_constant),
        cmocka_unit_test(test_names_and_validation),
        cmocka_unit_test(test_errors_name_the_line),
    };
    // The reference comparison runs when its file is given (tests/integration/train_optimizer_ref.sh).
    if (getenv("SPES_SCHEDULE_REF")) {
        const struct CMUnitTest with_reference[] = {cmocka_unit_test(test_matches_python)};
        return cmocka_run_group_tests(tests, NULL, NULL) | cmocka_run_group_tests(with_reference, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
