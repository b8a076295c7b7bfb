// OLMo's instance filter (src/data/instance_filter.c): hand-worked repetitions, the decision,
// and (when SPES_INSTANCE_FILTER_REF names the output of tests/ref/instance_filter_ref.py, as
// tests/integration/data_instance_filter_ref.sh arranges) every repetition OLMo's own
// find_periodic_sequences reports on 1500 random and planted inputs.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/instance_filter.h"

#define MAX_REPS 4096

typedef struct {
    Repetition r[MAX_REPS];
    int n;
} RepList;

static bool collect(void *ctx, const Repetition *r) {
    RepList *l = ctx;
    if (l->n < MAX_REPS) l->r[l->n] = *r;
    l->n++;
    return true;
}

static RepList *scan(const int32_t *ids, int n, int min_period, int max_period) {
    RepList *l = calloc(1, sizeof *l);
    assert_non_null(l);
    find_periodic_sequences(ids, n, min_period, max_period, collect, l);
    return l;
}

static void assert_rep(const Repetition *r, int start, int end, int period, int times) {
    assert_int_equal(r->start, start);
    assert_int_equal(r->end, end);
    assert_int_equal(r->period, period);
    assert_int_equal(r->times, times);
}

static void test_hand_worked(void **state) {
    (void)state;
    // 9 . a b a b a b a b . : "ab" x4 at [1, 9); partial periods count toward the span only
    int32_t ab[] = {9, 1, 2, 1, 2, 1, 2, 1, 2, 8};
    RepList *l = scan(ab, 10, 1, 3);
    assert_int_equal(l->n, 1);
    assert_rep(&l->r[0], 1, 9, 2, 4);
    free(l);
    // "ab" x2 and a half: a repetition must cover 3 periods to be reported
    int32_t short_run[] = {1, 2, 1, 2, 1, 9, 9, 8, 7};
    l = scan(short_run, 9, 2, 2);
    assert_int_equal(l->n, 0);
    free(l);
    // one token x7 then another x3: period 1 gives both, in position order; period 2 the first
    // (x7 = 3 whole periods and one token); period 3 needs 9 tokens and sees the 7 as 2 periods
    int32_t runs[] = {5, 5, 5, 5, 5, 5, 5, 6, 6, 6};
    l = scan(runs, 10, 1, 3);
    assert_int_equal(l->n, 3);
    assert_rep(&l->r[0], 0, 7, 1, 7);
    assert_rep(&l->r[1], 7, 10, 1, 3);
    assert_rep(&l->r[2], 0, 7, 2, 3);
    free(l);
    // periods above n / 3 are not looked at (OLMo caps max_period there)
    int32_t abc[] = {1, 2, 3, 1, 2, 3, 1, 2};
    l = scan(abc, 8, 3, 3);   // 8 / 3 = 2 < 3
    assert_int_equal(l->n, 0);
    free(l);
    l = scan(abc, 8, 1, 13);
    assert_int_equal(l->n, 0);
    free(l);
    // too short to hold anything
    l = scan(ab, 2, 1, 13);
    assert_int_equal(l->n, 0);
    free(l);
}

static void test_decision(void **state) {
    (void)state;
    enum { N = 64 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 1000 + i;   // no repeats
    InstanceFilterConfig f = {.enabled = true, .max_period = 13, .min_period = 1, .max_count = 32};
    assert_true(instance_filter_keeps(&f, ids, N));
    for (int i = 10; i < 41; i++) ids[i] = 7;        // one token x31: kept
    assert_true(instance_filter_keeps(&f, ids, N));
    ids[41] = 7;                                     // x32: masked
    assert_false(instance_filter_keeps(&f, ids, N));
    f.enabled = false;                               // off: everything trains
    assert_true(instance_filter_keeps(&f, ids, N));
    f = (InstanceFilterConfig){.enabled = true, .max_period = 13, .min_period = 2, .max_count = 32};
    assert_true(instance_filter_keeps(&f, ids, N));  // period 1 not looked at; period 2 sees 16
    for (int i = 0; i < N; i++) ids[i] = i % 13;     // a 13-token pattern x4 and a bit (64 tokens)
    f = (InstanceFilterConfig){.enabled = true, .max_period = 13, .min_period = 1, .max_count = 4};
    assert_false(instance_filter_keeps(&f, ids, N));
    f.max_period = 12;                               // the pattern is longer than any period looked at
    assert_true(instance_filter_keeps(&f, ids, N));
}

// instance_filter_min_tokens is exact: a pattern of min_period distinct tokens repeated over that
// many tokens is masked, one token fewer is not (and can hold no repetition that masks).
static void test_min_tokens(void **state) {
    (void)state;
    const int counts[] = {1, 2, 3, 4, 32}, periods[] = {1, 2, 5};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        for (size_t p = 0; p < sizeof periods / sizeof *periods; p++) {
            InstanceFilterConfig f = {.enabled = true, .max_period = 13, .min_period = periods[p], .max_count = counts[c]};
            int n = (int)instance_filter_min_tokens(&f);
            assert_int_equal(n, (counts[c] > 3 ? counts[c] : 3) * periods[p]);
            int32_t *ids = malloc((size_t)n * sizeof *ids);
            assert_non_null(ids);
            for (int i = 0; i < n; i++) ids[i] = i % periods[p];
            assert_false(instance_filter_keeps(&f, ids, n));
            assert_true(instance_filter_keeps(&f, ids, n - 1));
            free(ids);
        }
}

// Every case of tests/ref/instance_filter_ref.py: the same repetitions in the same order, and
// the same decision.
static void test_matches_olmo(void **state) {
    (void)state;
    const char *path = getenv("SPES_INSTANCE_FILTER_REF");
    assert_non_null(path);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    int cases = 0, masked = 0, reps_seen = 0;
    int min_p, max_p, max_count, n;
    while (fscanf(fp, " case %d %d %d %d", &min_p, &max_p, &max_count, &n) == 4) {
        int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
        assert_non_null(ids);
        for (int i = 0; i < n; i++) assert_int_equal(fscanf(fp, "%d", &ids[i]), 1);
        int k;
        assert_int_equal(fscanf(fp, " reps %d", &k), 1);
        RepList *l = scan(ids, n, min_p, max_p);
        if (l->n != k) fail_msg("case %d (n %d, periods %d..%d): %d repetitions, OLMo %d", cases, n, min_p, max_p, l->n, k);
        for (int j = 0; j < k; j++) {
            Repetition want;
            assert_int_equal(fscanf(fp, "%d %d %d %d", &want.start, &want.end, &want.period, &want.times), 4);
            const Repetition *got = &l->r[j];
            if (got->start != want.start || got->end != want.end || got->period != want.period || got->times != want.times)
                fail_msg("case %d repetition %d: [%d, %d) period %d x%d, OLMo [%d, %d) period %d x%d", cases, j,
                         got->start, got->end, got->period, got->times, want.start, want.end, want.period, want.times);
        }
        int keep;
        assert_int_equal(fscanf(fp, " keep %d", &keep), 1);
        InstanceFilterConfig f = {.enabled = true, .max_period = max_p, .min_period = min_p, .max_count = max_count};
        if (instance_filter_keeps(&f, ids, n) != (keep != 0))
            fail_msg("case %d: keeps %d, OLMo %d", cases, !keep, keep);
        masked += !keep;
        reps_seen += k;
        cases++;
        free(l);
        free(ids);
    }
    assert_true(feof(fp));   // a line this loop could not read is a format error, not the end
    fclose(fp);
    printf("%d instance filter cases agree with OLMo (%d repetitions, %d instances masked)\n", cases, reps_seen, masked);
    assert_true(cases >= 1000 && masked > 100 && reps_seen > 500);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_worked),
        cmocka_unit_test(test_decision),
        cmocka_unit_test(test_min_tokens),
    };
    // The reference comparison runs when its file is given (tests/integration/data_instance_filter_ref.sh).
    if (getenv("SPES_INSTANCE_FILTER_REF")) {
        const struct CMUnitTest with_reference[] = {cmocka_unit_test(test_matches_olmo)};
        return cmocka_run_group_tests(tests, NULL, NULL) | cmocka_run_group_tests(with_reference, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
