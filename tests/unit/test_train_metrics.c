// metrics.jsonl and the console line (src/train/metrics.c): line format, resume truncation,
// routing balance, JSON escaping and non-finite values.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "train/metrics.h"

static char dir[64];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/spes_metrics_test_XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int remove_dir(void **state) {
    (void)state;
    remove_tree(dir);
    return 0;
}

static StepMetrics sample(int64_t step, const int64_t *counts) {
    return (StepMetrics){.step = step,
                         .max_steps = 10,
                         .loss = {.ce = 2.5, .lm_z = 30.25, .lb = 1.0625, .router_z = 0.5, .total = 2.6},
                         .lr = 3e-4,
                         .grad_norm = 0.75,
                         .tokens_seen = step * 100,
                         .expert_counts = counts,
                         .n_layers = 2,
                         .n_experts = 2,
                         .step_seconds = 0.5,
                         .tokens_per_second = 200,
                         .mfu = 0.1,
                         .eta_seconds = 4,
                         .peak_rss_mb = 64};
}

static char *read_log(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    uint8_t *data;
    size_t len;
    assert_int_equal(file_read_all(path, &data, &len), SPES_OK);
    return (char *)data;
}

static void test_lines_and_resume_truncation(void **state) {
    (void)state;
    int64_t counts[4] = {30, 10, 20, 20};
    MetricsLog log;
    assert_int_equal(metrics_open(&log, dir, 0), SPES_OK);
    for (int s = 1; s <= 4; s++) {
        StepMetrics m = sample(s, counts);
        assert_int_equal(metrics_write_step(&log, &m, s == 2), SPES_OK);
        if (s == 2) assert_int_equal(metrics_write_eval(&log, 2, "val \"x\"", 2.0, 512), SPES_OK);
    }
    metrics_close(&log);

    // Every line is JSON; fields as documented.
    char *text = read_log();
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!o) fail_msg("not JSON: %s (%s)", line, err.text);
        assert_true(json_is_integer(json_object_get(o, "step")));
        if (json_object_get(o, "eval")) {
            assert_string_equal(json_string_value(json_object_get(o, "eval")), "val \"x\"");
            assert_float_equal(json_real_value(json_object_get(o, "perplexity")), exp(2.0), 1e-9);
        } else {
            assert_float_equal(json_real_value(json_object_get(o, "ce")), 2.5, 0);
            assert_float_equal(json_real_value(json_object_get(o, "route_min")), 0.5, 1e-12);   // 10 of 40 over 2
            assert_float_equal(json_real_value(json_object_get(o, "route_max")), 1.5, 1e-12);   // 30 of 40 over 2
            assert_true(json_is_object(json_object_get(o, "perf")));
            bool counts_logged = json_object_get(o, "expert_tokens") != NULL;
            assert_int_equal(counts_logged, json_integer_value(json_object_get(o, "step")) == 2);
        }
        json_decref(o);
    }
    assert_int_equal(lines, 5);
    free(text);

    // Resume from step 2: lines of steps 3 and 4 are forgotten, the eval line of step 2 kept.
    assert_int_equal(metrics_open(&log, dir, 2), SPES_OK);
    StepMetrics m = sample(3, counts);
    assert_int_equal(metrics_write_step(&log, &m, false), SPES_OK);
    metrics_close(&log);
    text = read_log();
    assert_non_null(strstr(text, "\"eval\""));
    assert_null(strstr(text, "{\"step\":4"));
    int n = 0;
    for (char *p = text; (p = strstr(p, "{\"step\":3")); p++) n++;
    assert_int_equal(n, 1);
    free(text);

    // A fresh run (keep through 0) starts an empty log.
    assert_int_equal(metrics_open(&log, dir, 0), SPES_OK);
    metrics_close(&log);
    text = read_log();
    assert_string_equal(text, "");
    free(text);
}

static void test_non_finite_and_console(void **state) {
    (void)state;
    MetricsLog log;
    assert_int_equal(metrics_open(&log, dir, 0), SPES_OK);
    StepMetrics m = sample(1, NULL);
    m.loss.lb = NAN;
    m.mfu = INFINITY;
    assert_int_equal(metrics_write_step(&log, &m, true), SPES_OK);
    metrics_close(&log);
    char *text = read_log();
    json_t *o = json_loads(text, 0, NULL);
    assert_non_null(o);
    assert_true(json_is_null(json_object_get(o, "lb")));
    assert_null(json_object_get(o, "route_min"));   // no counts given: no routing fields
    json_decref(o);
    free(text);

    int64_t counts[4] = {30, 10, 0, 40};   // layer 1 has a dead expert
    StepMetrics c = sample(7, counts);
    char line[512];
    metrics_format_console(&c, line, sizeof line);
    assert_non_null(strstr(line, "step 7/10"));
    assert_non_null(strstr(line, "ce 2.5000"));
    assert_non_null(strstr(line, "lr 3.00e-04"));
    assert_non_null(strstr(line, "route 0.00-2.00x"));
    assert_null(strstr(line, "UNSAVED"));
    // after a save that failed, until one works: the newest checkpoint
    c.failed_save_step = 15, c.newest_checkpoint = 10;
    metrics_format_console(&c, line, sizeof line);
    assert_non_null(strstr(line, " | UNSAVED since step 10 (save of 15 failed)"));
    c.newest_checkpoint = -1;
    metrics_format_console(&c, line, sizeof line);
    assert_non_null(strstr(line, " | UNSAVED: no checkpoint yet (save of 15 failed)"));
    double lo, hi;
    metrics_route_balance(counts, 2, 2, &lo, &hi);
    assert_float_equal(lo, 0.0, 0);
    assert_float_equal(hi, 2.0, 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_and_resume_truncation),
        cmocka_unit_test(test_non_finite_and_console),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
