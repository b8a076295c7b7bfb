// Learning-rate schedules (src/train/schedule.c): OLMo's boundary values, a table of OLMo's values
// for the later schedulers, validation, config loading, and
// (when SPES_SCHEDULE_REF names the output of tests/ref/schedule_ref.py, as
// tests/integration/train_optimizer_ref.sh arranges) a grid of values computed in Python, and
// (SPES_SCHEDULE_LOOP_REF: schedule_ref.py loop) whole runs of OLMo's trainer in steps and tokens.
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
    assert_int_equal(schedule_kind_from_name("inverse_sqrt", &k), SPES_ERR);   // not OLMo's name
    assert_non_null(strstr(spes_last_error(), "'inverse_sqrt' is not supported (use cosine_with_warmup, "
                                              "linear_with_warmup, inverse_sqrt_with_warmup, max_scheduler, constant, "
                                              "cosine_linear_envelope or constant_with_warmup)"));
    for (int i = 0; i < SCHEDULE_KIND_COUNT; i++) {   // every name reads back as its kind
        assert_int_equal(schedule_kind_from_name(schedule_kind_name((ScheduleKind)i), &k), SPES_OK);
        assert_int_equal(k, i);
    }
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

// OLMo's values for the schedulers added after the first three, computed by tests/ref/schedule_ref.py
// (a line-by-line transcription of olmo/optim.py at allenai/OLMo 59a53e3f: InvSqrtWithWarmup,
// MaxScheduler as build_scheduler makes it, CosLinearEnvelope, ConstantWithWarmupScheduler) and
// printed with repr: the warm-up's edges (step 0 and 1, t_warmup 0), warmup_min_lr, alpha_f, a t_max
// before and one beyond the run's max steps, and steps past both.
typedef struct {
    const char *kind;
    int64_t t_warmup, t_max;   // t_max 0: null
    double alpha_f, warmup_min_lr, lr;   // warmup_min_lr -1: null
    int64_t step, max_steps;
    double want;
} LrCase;
static const LrCase OLMO_LR[] = {
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 0, 100, 5e-05},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 1, 100, 9.5e-05},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 9, 100, 0.000455},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 10, 100, 0.0005},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 11, 100, 0.0004767312946227962},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 33, 100, 0.00027524094128159016},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 99, 100, 0.00015891043154093204},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 100, 100, 0.00015811388300841897},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 105, 100, 0.00015430334996209192},
    {"inverse_sqrt_with_warmup", 10, 0, 0.1, -1, 0.0005, 400, 100, 7.905694150420948e-05},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 0, 5000, 1e-05},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 1, 5000, 0.0004371428571428572},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 6, 5000, 0.0025728571428571432},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 7, 5000, 0.003},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 8, 5000, 0.0028062430400804562},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 33, 5000, 0.0013816985594155148},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 49, 5000, 0.0011338934190276817},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 50, 5000, 0.0011224972160321825},
    {"inverse_sqrt_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 55, 5000, 0.0010702591020190135},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 4, 100, 0.00082},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 5, 100, 0.001},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 6, 100, 0.000912870929175277},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 100, 100, 0.00022360679774997898},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 150, 100, 0.00018257418583505537},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 199, 100, 0.00015851065623706035},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 200, 100, 0.00015811388300841897},
    {"inverse_sqrt_with_warmup", 5, 200, 0.1, -1, 0.001, 250, 100, 0.0001414213562373095},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 0, 100, 5e-05},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 1, 100, 9.5e-05},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 9, 100, 0.000455},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 10, 100, 0.0005},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 11, 100, 0.0004998629360792965},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 33, 100, 0.0004312981333532744},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 99, 100, 0.00015891043154093204},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 100, 100, 0.00015811388300841897},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 105, 100, 0.00015430334996209192},
    {"max_scheduler", 10, 0, 0.1, -1, 0.0005, 400, 100, 7.905694150420948e-05},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 0, 5000, 1e-05},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 1, 5000, 0.0004371428571428572},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 6, 5000, 0.0025728571428571432},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 7, 5000, 0.003},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 8, 5000, 0.002996998819121496},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 33, 5000, 0.001511759544632123},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 49, 5000, 0.0011338934190276817},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 50, 5000, 0.0011224972160321825},
    {"max_scheduler", 7, 50, 0.25, 1e-05, 0.003, 55, 5000, 0.0010702591020190135},
    {"max_scheduler", 0, 0, 0.0, -1, 0.002, 1, 100, 0.0019995065603657315},
    {"max_scheduler", 0, 0, 0.0, -1, 0.002, 2, 100, 0.0019980267284282717},
    {"max_scheduler", 0, 0, 0.0, -1, 0.002, 50, 100, 0.001},
    {"max_scheduler", 0, 0, 0.0, -1, 0.002, 99, 100, 4.934396342684e-07},
    {"max_scheduler", 0, 0, 0.0, -1, 0.002, 100, 100, 0.0},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 4, 100, 0.00082},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 5, 100, 0.001},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 6, 100, 0.0009999416012371185},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 100, 100, 0.0005681196730492369},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 150, 100, 0.00023827404092068027},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 199, 100, 0.00015851065623706035},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 200, 100, 0.00015811388300841897},
    {"max_scheduler", 5, 200, 0.1, -1, 0.001, 250, 100, 0.0001414213562373095},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 0, 100, 5e-05},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 1, 100, 9.5e-05},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 9, 100, 0.000455},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 10, 100, 0.0005},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 11, 100, 0.0004948644590117489},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 33, 100, 0.00033385527705188207},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 99, 100, 5.000152293245226e-05},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 100, 100, 5e-05},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 105, 100, 5e-05},
    {"cosine_linear_envelope", 10, 0, 0.1, -1, 0.0005, 400, 100, 5e-05},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 0, 5000, 1e-05},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 1, 5000, 0.0004371428571428572},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 6, 5000, 0.0025728571428571432},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 7, 5000, 0.003},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 8, 5000, 0.0029447430326302983},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 33, 5000, 0.0010511607502033974},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 49, 5000, 0.0007500697949041513},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 50, 5000, 0.00075},
    {"cosine_linear_envelope", 7, 50, 0.25, 1e-05, 0.003, 55, 5000, 0.00075},
    {"cosine_linear_envelope", 0, 0, 0.0, -1, 0.002, 1, 100, 0.0019795114947620744},
    {"cosine_linear_envelope", 0, 0, 0.0, -1, 0.002, 2, 100, 0.001958066193859706},
    {"cosine_linear_envelope", 0, 0, 0.0, -1, 0.002, 50, 100, 0.0005},
    {"cosine_linear_envelope", 0, 0, 0.0, -1, 0.002, 99, 100, 4.934396342684004e-09},
    {"cosine_linear_envelope", 0, 0, 0.0, -1, 0.002, 100, 100, 0.0},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 4, 100, 0.00082},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 5, 100, 0.001},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 6, 100, 0.0009953265161025693},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 100, 100, 0.0003400613707944804},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 150, 100, 0.00013545488228735393},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 199, 100, 0.00010000029948083529},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 200, 100, 0.0001},
    {"cosine_linear_envelope", 5, 200, 0.1, -1, 0.001, 250, 100, 0.0001},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 0, 100, 5e-05},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 1, 100, 9.5e-05},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 9, 100, 0.000455},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 10, 100, 0.0005},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 11, 100, 0.0005},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 33, 100, 0.0005},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 99, 100, 0.0005},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 100, 100, 0.0005},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 105, 100, 0.0005},
    {"constant_with_warmup", 10, 0, 0.1, -1, 0.0005, 400, 100, 0.0005},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 0, 5000, 1e-05},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 1, 5000, 0.0004371428571428572},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 6, 5000, 0.0025728571428571432},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 7, 5000, 0.003},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 8, 5000, 0.003},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 33, 5000, 0.003},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 49, 5000, 0.003},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 50, 5000, 0.003},
    {"constant_with_warmup", 7, 50, 0.25, 1e-05, 0.003, 55, 5000, 0.003},
    {"constant_with_warmup", 0, 0, 0.0, -1, 0.002, 1, 100, 0.002},
    {"constant_with_warmup", 0, 0, 0.0, -1, 0.002, 2, 100, 0.002},
    {"constant_with_warmup", 0, 0, 0.0, -1, 0.002, 50, 100, 0.002},
    {"constant_with_warmup", 0, 0, 0.0, -1, 0.002, 99, 100, 0.002},
    {"constant_with_warmup", 0, 0, 0.0, -1, 0.002, 100, 100, 0.002},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 4, 100, 0.00082},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 5, 100, 0.001},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 6, 100, 0.001},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 100, 100, 0.001},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 150, 100, 0.001},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 199, 100, 0.001},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 200, 100, 0.001},
    {"constant_with_warmup", 5, 200, 0.1, -1, 0.001, 250, 100, 0.001},
};

static void test_olmo_values(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof OLMO_LR / sizeof OLMO_LR[0]; i++) {
        const LrCase *c = &OLMO_LR[i];
        ScheduleConfig s = {.t_warmup = c->t_warmup, .t_max = c->t_max, .alpha_f = c->alpha_f,
                            .warmup_min_lr = c->warmup_min_lr};
        assert_int_equal(schedule_kind_from_name(c->kind, &s.kind), SPES_OK);
        assert_int_equal(schedule_validate(&s, c->lr, c->max_steps, NULL, NULL), SPES_OK);
        double got = schedule_lr(&s, c->lr, c->step, c->max_steps);
        if (!(fabs(got - c->want) <= 1e-15 * fabs(c->want)))
            fail_msg("%s t_warmup=%lld t_max=%lld step=%lld: %.17g, OLMo %.17g", c->kind, (long long)c->t_warmup,
                     (long long)c->t_max, (long long)c->step, got, c->want);
    }
}

// The shapes the table's numbers encode, readable: inverse sqrt halves the rate at 4 x t_warmup;
// max_scheduler is the cosine early and the inverse sqrt once the cosine falls below it; the
// envelope reaches alpha_f * lr at t_max from below the cosine; constant_with_warmup stays at lr.
static void test_new_kinds_shapes(void **state) {
    (void)state;
    double lr = 1e-3;
    ScheduleConfig s = {.kind = SCHEDULE_INVERSE_SQRT_WITH_WARMUP, .t_warmup = 100, .alpha_f = 0.1, .warmup_min_lr = 0};
    assert_float_equal(schedule_lr(&s, lr, 0, 1000), 0.0, 0);
    assert_float_equal(schedule_lr(&s, lr, 50, 1000), lr / 2, 1e-18);
    assert_float_equal(schedule_lr(&s, lr, 100, 1000), lr, 0);
    assert_float_equal(schedule_lr(&s, lr, 400, 1000), lr / 2, 1e-18);
    assert_float_equal(schedule_lr(&s, lr, 40000, 1000), lr / 20, 1e-18);   // no floor at alpha_f, no end at t_max
    s.kind = SCHEDULE_MAX;
    ScheduleConfig cos_s = s, inv_s = s;
    cos_s.kind = SCHEDULE_COSINE_WITH_WARMUP, inv_s.kind = SCHEDULE_INVERSE_SQRT_WITH_WARMUP;
    int cos_wins = 0, inv_wins = 0;
    for (int64_t t = 0; t < 1200; t++) {
        double c = schedule_lr(&cos_s, lr, t, 1000), v = schedule_lr(&inv_s, lr, t, 1000), m = schedule_lr(&s, lr, t, 1000);
        assert_true(m == (c > v ? c : v));
        cos_wins += c > v, inv_wins += v > c;
    }
    assert_true(cos_wins > 100 && inv_wins > 100);
    s.kind = SCHEDULE_COSINE_LINEAR_ENVELOPE;
    cos_s.alpha_f = s.alpha_f = 0.0;
    for (int64_t t = 101; t < 1000; t++) assert_true(schedule_lr(&s, lr, t, 1000) < schedule_lr(&cos_s, lr, t, 1000));
    assert_float_equal(schedule_lr(&s, lr, 550, 1000), lr * 0.5 * 0.5, 1e-18);   // half the envelope of half the cosine
    assert_float_equal(schedule_lr(&s, lr, 1000, 1000), 0.0, 0);
    s.kind = SCHEDULE_CONSTANT_WITH_WARMUP;
    assert_float_equal(schedule_lr(&s, lr, 25, 1000), lr / 4, 1e-18);
    assert_float_equal(schedule_lr(&s, lr, 100, 1000), lr, 0);
    assert_float_equal(schedule_lr(&s, lr, 5000, 1000), lr, 0);
}

// Which keys each kind's validation reads: inverse_sqrt_with_warmup needs a warm-up; the kinds
// without a decay ignore t_max (OLMo's do), the decaying ones need it after the warm-up.
static void test_new_kinds_validation(void **state) {
    (void)state;
    ScheduleConfig s = {.kind = SCHEDULE_INVERSE_SQRT_WITH_WARMUP, .t_warmup = 0, .alpha_f = 0.1, .warmup_min_lr = -1};
    assert_int_equal(schedule_validate(&s, 1e-3, 100, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "scheduler.t_warmup: must be > 0 for inverse_sqrt_with_warmup"));
    s.kind = SCHEDULE_MAX;   // its inverse sqrt part is 0 then: the cosine alone
    assert_int_equal(schedule_validate(&s, 1e-3, 100, NULL, NULL), SPES_OK);
    s.t_warmup = 200;   // past the run's end
    for (int k = 0; k < SCHEDULE_KIND_COUNT; k++) {
        s.kind = (ScheduleKind)k;
        assert_int_equal(schedule_validate(&s, 1e-3, 100, NULL, NULL), schedule_kind_decays(s.kind) ? SPES_ERR : SPES_OK);
    }
    s.kind = SCHEDULE_CONSTANT_WITH_WARMUP;
    s.warmup_min_lr = 1e-3;
    assert_int_equal(schedule_validate(&s, 1e-3, 100, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "scheduler.warmup_min_lr: must be below optimizer.learning_rate"));
}

// Each OLMo scheduler name loads from a YAML; a bad one is refused at its line with the names.
static void test_config_names(void **state) {
    (void)state;
    for (int k = 0; k < SCHEDULE_KIND_COUNT; k++) {
        char yaml[256];
        snprintf(yaml, sizeof yaml, "scheduler:\n  name: %s\n  t_warmup: 10\n  t_max: 50\n", schedule_kind_name((ScheduleKind)k));
        TrainConfig cfg;
        assert_int_equal(config_load_string(yaml, "run.yaml", 0, NULL, &cfg), SPES_OK);
        assert_int_equal(cfg.schedule.kind, k);
        assert_int_equal(config_schedule_validate(&cfg, 100), SPES_OK);
        config_free(&cfg);
    }
    TrainConfig cfg;
    assert_int_equal(config_load_string("seed: 1\nscheduler:\n  name: inverse_sqrt\n", "run.yaml", 0, NULL, &cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "run.yaml:3: scheduler.name: expected cosine_with_warmup, "
                                              "linear_with_warmup, inverse_sqrt_with_warmup, max_scheduler, constant, "
                                              "cosine_linear_envelope or constant_with_warmup, got 'inverse_sqrt'"));
    // t_max before the warm-up's end is refused where a scheduler reads it, taken where none does.
    const char *late = "scheduler:\n  name: %s\n  t_warmup: 100\n  t_max: 50\n";
    char yaml[256];
    snprintf(yaml, sizeof yaml, late, "cosine_linear_envelope");
    assert_int_equal(config_load_string(yaml, "run.yaml", 0, NULL, &cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "run.yaml:4: scheduler.t_max: must be > t_warmup (100), got 50"));
    snprintf(yaml, sizeof yaml, late, "constant_with_warmup");
    assert_int_equal(config_load_string(yaml, "run.yaml", 0, NULL, &cfg), SPES_OK);
    config_free(&cfg);
    expect_located("scheduler:\n  name: inverse_sqrt_with_warmup\n  t_warmup: 0\n", NULL, 100,
                   "run.yaml:3: scheduler.t_warmup: must be > 0 for inverse_sqrt_with_warmup");
}

// The clipping warm-up as OLMo's trainer applies it, from tests/ref/schedule_ref.py's
// clip_thresholds (Scheduler._get_max_grad_norm_coeff, and train_step clipping before it sets the
// groups' max_grad_norm for the step): the thresholds of steps 1..7. 0: null.
static void test_clip_warmup(void **state) {
    (void)state;
    static const struct {
        int64_t steps;
        double factor, max_norm, want[7];
    } cases[] = {
        {3, 0.5, 1.0, {1.0, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0}},   // step 1 at max_grad_norm, 2..4 at the product
        {1, 3.0, 0.5, {0.5, 1.5, 0.5, 0.5, 0.5, 0.5, 0.5}},   // a factor above 1 loosens
        {0, 0.25, 2.0, {2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0}},  // warm-up ends before any step clips with it
        {3, -1, 1.0, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},    // factor null
        {-1, 0.5, 1.0, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},  // steps null
        {2, 0.5, 0.0, {0, 0, 0, 0, 0, 0, 0}},                 // max_grad_norm null: no clipping
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ScheduleConfig s = {.kind = SCHEDULE_COSINE_WITH_WARMUP, .grad_clip_warmup_steps = cases[i].steps,
                            .grad_clip_warmup_factor = cases[i].factor};
        for (int64_t step = 1; step <= 7; step++) {
            double got = schedule_clip_max_norm(&s, cases[i].max_norm, step, 0);
            if (got != cases[i].want[step - 1])
                fail_msg("case %zu step %lld: %g, OLMo %g", i, (long long)step, got, cases[i].want[step - 1]);
        }
    }
    // get_max_grad_norm itself: the product up to and including grad_clip_warmup_steps.
    ScheduleConfig s = {.grad_clip_warmup_steps = 3, .grad_clip_warmup_factor = 0.5};
    assert_true(schedule_max_grad_norm(&s, 1.0, 0) == 0.5 && schedule_max_grad_norm(&s, 1.0, 3) == 0.5);
    assert_true(schedule_max_grad_norm(&s, 1.0, 4) == 1.0);
}

// The keys load, a bad value is refused at its line, and the config hash covers them when they
// clip differently (and is the old one when they are off, so existing checkpoints resume).
static uint64_t hash_of(const char *yaml) {
    TrainConfig cfg;
    assert_int_equal(config_load_string(yaml, "run.yaml", 0, NULL, &cfg), SPES_OK);
    uint64_t h = config_hash(&cfg);
    config_free(&cfg);
    return h;
}
static void test_clip_warmup_config(void **state) {
    (void)state;
    TrainConfig cfg;
    const char *on = "max_grad_norm: 1.0\nscheduler:\n  grad_clip_warmup_steps: 100\n  grad_clip_warmup_factor: 0.2\n";
    assert_int_equal(config_load_string(on, "run.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.schedule.grad_clip_warmup_steps, 100);
    assert_true(cfg.schedule.grad_clip_warmup_factor == 0.2);
    assert_true(schedule_clip_max_norm(&cfg.schedule, cfg.max_grad_norm, 50, 0) == 0.2);
    config_free(&cfg);
    assert_int_equal(config_load_string("scheduler:\n  grad_clip_warmup_steps: 10\n  grad_clip_warmup_factor: 0\n",
                                        "run.yaml", 0, NULL, &cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "run.yaml:3: scheduler.grad_clip_warmup_factor: must be > 0"));
    assert_int_equal(config_load_string("scheduler:\n  grad_clip_warmup_steps: -5\n", "run.yaml", 0, NULL, &cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "run.yaml:2: scheduler.grad_clip_warmup_steps: must be >= 0"));

    const char *base = "max_grad_norm: 1.0\n";
    uint64_t h_base = hash_of(base);
    assert_true(hash_of("max_grad_norm: 1.0\nscheduler:\n  grad_clip_warmup_steps: null\n  grad_clip_warmup_factor: null\n") == h_base);
    assert_true(hash_of("max_grad_norm: 1.0\nscheduler:\n  grad_clip_warmup_steps: 100\n") == h_base);   // inert alone
    uint64_t h_on = hash_of(on);
    assert_true(h_on != h_base);
    assert_true(hash_of("max_grad_norm: 1.0\nscheduler:\n  grad_clip_warmup_steps: 100\n  grad_clip_warmup_factor: 0.3\n") != h_on);
    assert_true(hash_of("max_grad_norm: 1.0\nscheduler:\n  grad_clip_warmup_steps: 101\n  grad_clip_warmup_factor: 0.2\n") != h_on);
}

// A config of the loop cases: scheduler.units, the scheduler and its clipping warm-up, and a run
// of `duration` in global batches of `batch` sequences of `seq` tokens. NULL where the load fails.
static TrainConfig *loop_config(TrainConfig *cfg, const char *units, const char *kind, const char *duration, int batch,
                                int seq, long long t_warmup, long long t_max, long long clip_steps, double clip_factor,
                                double max_grad_norm) {
    char yaml[1024], t_max_s[32] = "null", clip_s[32] = "null", factor_s[32] = "null";
    if (t_max > 0) snprintf(t_max_s, sizeof t_max_s, "%lld", t_max);
    if (clip_steps >= 0) snprintf(clip_s, sizeof clip_s, "%lld", clip_steps);
    if (clip_factor > 0) snprintf(factor_s, sizeof factor_s, "%.17g", clip_factor);
    snprintf(yaml, sizeof yaml,
             "model:\n  max_sequence_length: %d\nglobal_train_batch_size: %d\ndevice_train_microbatch_size: %d\n"
             "max_duration: %s\nmax_grad_norm: %.17g\noptimizer:\n  learning_rate: 1.0e-3\n"
             "scheduler:\n  name: %s\n  units: %s\n  t_warmup: %lld\n  t_max: %s\n  alpha_f: 0.1\n"
             "  grad_clip_warmup_steps: %s\n  grad_clip_warmup_factor: %s\n",
             seq, batch, batch, duration, max_grad_norm, kind, units, t_warmup, t_max_s, clip_s, factor_s);
    return config_load_string(yaml, "loop.yaml", 0, NULL, cfg) == SPES_OK ? cfg : NULL;
}

// One step of the trainer's schedule: its position (tokens_before: the tokens seen before the
// step; every batch full), learning rate and clipping threshold, as trainer_step takes them.
static void loop_step(const TrainConfig *cfg, int64_t max_steps, int64_t step, int64_t tokens_before, double *lr,
                      double *clip) {
    const ScheduleRun run = config_schedule_run(cfg, max_steps);
    int64_t batch_tokens = (int64_t)cfg->global_train_batch_size * cfg->model.max_seq_len;
    SchedulePos pos = schedule_position(&cfg->schedule, &run, step, tokens_before + batch_tokens);
    *lr = schedule_lr(&cfg->schedule, cfg->learning_rate, pos.now, pos.max);
    *clip = schedule_clip_max_norm(&cfg->schedule, cfg->max_grad_norm, step, tokens_before);
}

// scheduler.units tokens: the schedule reads tokens seen over the run's max tokens, and t_warmup,
// t_max and grad_clip_warmup_steps count tokens (OLMo's scheduler_current / scheduler_max). A run
// in tokens with its lengths in tokens is the run in steps; the same numbers read as tokens are not.
static void test_units_tokens(void **state) {
    (void)state;
    TrainConfig steps_cfg, tokens_cfg, literal_cfg;
    // 64 tokens a step (4 x 16), 12 steps: a warm-up of 3 steps is 192 tokens, a clipping warm-up
    // of 2 steps 128 tokens.
    assert_non_null(loop_config(&steps_cfg, "steps", "cosine_with_warmup", "12", 4, 16, 3, 0, 2, 0.5, 1.0));
    assert_non_null(loop_config(&tokens_cfg, "tokens", "cosine_with_warmup", "12", 4, 16, 192, 0, 128, 0.5, 1.0));
    assert_non_null(loop_config(&literal_cfg, "tokens", "cosine_with_warmup", "12", 4, 16, 3, 0, 2, 0.5, 1.0));
    assert_int_equal(tokens_cfg.schedule.units, SCHEDULE_UNITS_TOKENS);
    assert_int_equal(config_schedule_validate(&tokens_cfg, 12), SPES_OK);
    for (int64_t step = 1; step <= 12; step++) {
        double lr_s, clip_s, lr_t, clip_t, lr_l, clip_l;
        loop_step(&steps_cfg, 12, step, (step - 1) * 64, &lr_s, &clip_s);
        loop_step(&tokens_cfg, 12, step, (step - 1) * 64, &lr_t, &clip_t);
        loop_step(&literal_cfg, 12, step, (step - 1) * 64, &lr_l, &clip_l);
        if (lr_t != lr_s || clip_t != clip_s)
            fail_msg("step %lld: tokens lr %.17g clip %g, steps lr %.17g clip %g", (long long)step, lr_t, clip_t, lr_s,
                     clip_s);
        // 3 tokens of warm-up are over within step 1, the decay spans tokens 3 to 768: another
        // rate at every step but the last (alpha_f * lr in both).
        if (step < 12 ? lr_l == lr_s : lr_l != lr_s)
            fail_msg("step %lld: t_warmup 3 read as tokens gives lr %.17g, as steps %.17g", (long long)step, lr_l, lr_s);
        assert_true(clip_l == 1.0);   // 2 tokens of clipping warm-up: over at step 1 too
    }
    // max_tokens: a duration in tokens as given; for one in steps the tokens seen plus the steps left.
    ScheduleRun run = config_schedule_run(&tokens_cfg, 12);
    assert_true(run.tokens_per_step == 64 && run.max_tokens == -1);
    SchedulePos pos = schedule_position(&tokens_cfg.schedule, &run, 5, 1000);
    assert_true(pos.now == 1000 && pos.max == 1000 + 7 * 64);
    pos = schedule_position(&tokens_cfg.schedule, &run, 20, 2000);   // past the end: no steps left
    assert_true(pos.now == 2000 && pos.max == 2000);
    pos = schedule_position(&steps_cfg.schedule, &run, 5, 1000);
    assert_true(pos.now == 5 && pos.max == 12);
    config_free(&steps_cfg);
    config_free(&literal_cfg);
    config_free(&tokens_cfg);
    assert_non_null(loop_config(&tokens_cfg, "tokens", "linear_with_warmup", "700T", 4, 16, 100, 0, -1, -1, 1.0));
    run = config_schedule_run(&tokens_cfg, 11);
    assert_true(run.max_tokens == 700 && schedule_position(&tokens_cfg.schedule, &run, 3, 192).max == 700);
    // The decay's end is checked in tokens: 700 tokens are not after a warm-up of 800.
    tokens_cfg.schedule.t_warmup = 800;
    assert_int_equal(config_schedule_validate(&tokens_cfg, 11), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "max_duration: the decay ends at token 700, not after the warm-up"));
    config_free(&tokens_cfg);
    assert_non_null(loop_config(&tokens_cfg, "tokens", "cosine_with_warmup", "2ep", 4, 16, 10, 0, -1, -1, 1.0));
    run = config_schedule_run(&tokens_cfg, 20);   // 2 epochs of 10 batches
    assert_true(run.max_tokens == 20 * 64);
    config_free(&tokens_cfg);
}

// scheduler.units loads (steps or tokens), is refused otherwise at its line, and enters the config
// hash only when it is tokens (existing checkpoints keep their hash).
static void test_units_config(void **state) {
    (void)state;
    TrainConfig cfg;
    assert_int_equal(config_load_string("scheduler:\n  units: steps\n", "run.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.schedule.units, SCHEDULE_UNITS_STEPS);
    config_free(&cfg);
    assert_int_equal(config_load_string("seed: 1\nscheduler:\n  units: epochs\n", "run.yaml", 0, NULL, &cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "run.yaml:3: scheduler.units: expected steps or tokens, got 'epochs'"));
    uint64_t h = hash_of("seed: 1\n");
    assert_true(hash_of("seed: 1\nscheduler:\n  units: steps\n") == h);
    assert_true(hash_of("seed: 1\nscheduler:\n  units: tokens\n") != h);
}

// The trainer's schedule over whole runs against tests/ref/schedule_ref.py's train_loop (olmo/train.py's
// scheduler_current, scheduler_max, max_steps and max_tokens over fit()'s counters): lr and clipping
// threshold at every step.
static void test_loop_matches_python(void **state) {
    (void)state;
    FILE *f = fopen(getenv("SPES_SCHEDULE_LOOP_REF"), "r");
    assert_non_null(f);
    char units[16], kind[64], duration[64];
    long long instances, t_warmup, t_max, clip_steps, step, before;
    int batch, seq, cases = 0;
    double clip_factor, max_grad_norm, want_lr, want_clip;
    while (fscanf(f, "%15s %63s %63s %lld %d %d %lld %lld %lld %lf %lf %lld %lld %lf %lf", units, kind, duration,
                  &instances, &batch, &seq, &t_warmup, &t_max, &clip_steps, &clip_factor, &max_grad_norm, &step,
                  &before, &want_lr, &want_clip) == 15) {
        TrainConfig cfg;
        assert_non_null(loop_config(&cfg, units, kind, duration, batch, seq, t_warmup, t_max, clip_steps, clip_factor,
                                    max_grad_norm));
        int64_t max_steps;
        assert_int_equal(config_max_steps(&cfg, instances, &max_steps), SPES_OK);
        double lr, clip;
        loop_step(&cfg, max_steps, step, before, &lr, &clip);
        if (fabs(lr - want_lr) > 1e-15 * fabs(want_lr) || clip != want_clip)
            fail_msg("%s %s %s step %lld: lr %.17g clip %g, OLMo %.17g %g", units, kind, duration, step, lr, clip,
                     want_lr, want_clip);
        config_free(&cfg);
        cases++;
    }
    fclose(f);
    printf("%d scheduler.units steps agree with Python\n", cases);
    assert_true(cases > 50);
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
        cmocka_unit_test(test_olmo_values),
        cmocka_unit_test(test_new_kinds_shapes),
        cmocka_unit_test(test_new_kinds_validation),
        cmocka_unit_test(test_config_names),
        cmocka_unit_test(test_clip_warmup),
        cmocka_unit_test(test_clip_warmup_config),
        cmocka_unit_test(test_units_tokens),
        cmocka_unit_test(test_units_config),
    };
    // The reference comparison runs when its file is given (tests/integration/train_optimizer_ref.sh).
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (getenv("SPES_SCHEDULE_REF")) {
        const struct CMUnitTest with_reference[] = {cmocka_unit_test(test_matches_python)};
        rc |= cmocka_run_group_tests(with_reference, NULL, NULL);
    }
    if (getenv("SPES_SCHEDULE_LOOP_REF")) {
        const struct CMUnitTest with_loop[] = {cmocka_unit_test(test_loop_matches_python)};
        rc |= cmocka_run_group_tests(with_loop, NULL, NULL);
    }
    return rc;
}
