// The demo's live view reader (src/demo/metrics_tail.c) on a metrics.jsonl that grows while
// it watches: only appended bytes are read, a half-written last line waits for its '\n',
// eval records are skipped, a rewritten (shorter) file is read again from the start.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "demo/metrics_tail.h"

static char dir[64], path[128];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/spes_metrics_tail_test_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    return 0;
}

static int remove_dir(void **state) {
    (void)state;
    remove_tree(dir);
    return 0;
}

static void append(const char *text) {
    FILE *fp = fopen(path, "a");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void rewrite(const char *text) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static long file_size(void) {
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fclose(fp);
    return n;
}

#define RECORD(step, ce, tok) "{\"step\": " #step ", \"ce\": " #ce ", \"perf\": {\"tokens_per_s\": " #tok "}}\n"
#define EVAL(step) "{\"step\": " #step ", \"eval\": {\"val\": {\"ce\": 9.5}}}\n"

static void assert_progress(const MetricsTail *t, int64_t step, double loss, double tok_s) {
    assert_int_equal(t->step, step);
    assert_float_equal(t->loss, loss, 0.0);
    assert_float_equal(t->tokens_per_s, tok_s, 0.0);
}

static void test_growing_file(void **state) {
    (void)state;
    remove(path);
    MetricsTail t;
    assert_int_equal(metrics_tail_init(&t, path), 0);

    metrics_tail_poll(&t);   // nothing written yet
    assert_int_equal(t.step, 0);
    assert_true(isnan(t.loss) && isnan(t.tokens_per_s));
    assert_int_equal(t.offset, 0);

    append(RECORD(10, 2.5, 100.5));
    metrics_tail_poll(&t);
    assert_progress(&t, 10, 2.5, 100.5);
    assert_int_equal(t.offset, file_size());

    metrics_tail_poll(&t);   // nothing new: unchanged
    assert_progress(&t, 10, 2.5, 100.5);

    append(EVAL(10));   // eval records do not move the view
    metrics_tail_poll(&t);
    assert_progress(&t, 10, 2.5, 100.5);
    assert_int_equal(t.offset, file_size());

    // Half a line: left for the next poll, the view keeps the last complete record.
    long before = file_size();
    append("{\"step\": 20, \"ce\": 2.");
    metrics_tail_poll(&t);
    assert_progress(&t, 10, 2.5, 100.5);
    assert_int_equal(t.offset, before);
    append("25, \"perf\": {\"tokens_per_s\": 200.25}}\n");
    metrics_tail_poll(&t);
    assert_progress(&t, 20, 2.25, 200.25);
    assert_int_equal(t.offset, file_size());

    // Several records in one poll: the newest training record wins, a trailing eval is skipped.
    append(RECORD(30, 2.125, 300.5) RECORD(40, 2.0625, 400.5) EVAL(40));
    metrics_tail_poll(&t);
    assert_progress(&t, 40, 2.0625, 400.5);
    metrics_tail_free(&t);
}

// Only what was appended is read: bytes before the offset are never looked at again.
static void test_reads_only_appended_bytes(void **state) {
    (void)state;
    rewrite(RECORD(1, 3.5, 10.5));
    MetricsTail t;
    assert_int_equal(metrics_tail_init(&t, path), 0);
    metrics_tail_poll(&t);
    assert_progress(&t, 1, 3.5, 10.5);
    // Overwrite the consumed line in place (same length) with an unparsable one; a reader that
    // went back to the start would now see garbage as the newest line after an eval.
    FILE *fp = fopen(path, "r+");
    assert_non_null(fp);
    char junk[64];
    memset(junk, 'x', sizeof junk);
    long n = file_size() - 1;
    assert_true(n <= (long)sizeof junk);
    fwrite(junk, 1, (size_t)n, fp);
    fclose(fp);
    append(EVAL(1));
    metrics_tail_poll(&t);
    assert_progress(&t, 1, 3.5, 10.5);
    append(RECORD(2, 3.25, 20.5));
    metrics_tail_poll(&t);
    assert_progress(&t, 2, 3.25, 20.5);
    metrics_tail_free(&t);
}

// A long line (over any fixed buffer) is read whole.
static void test_long_line(void **state) {
    (void)state;
    size_t pad = 100000;
    char *line = malloc(pad + 200);
    assert_non_null(line);
    int k = snprintf(line, 200, "{\"note\": \"");
    memset(line + k, 'a', pad);
    snprintf(line + k + pad, 200, "\", \"step\": 7, \"ce\": 1.5, \"perf\": {\"tokens_per_s\": 70.5}}\n");
    rewrite(line);
    free(line);
    MetricsTail t;
    assert_int_equal(metrics_tail_init(&t, path), 0);
    metrics_tail_poll(&t);
    assert_progress(&t, 7, 1.5, 70.5);
    metrics_tail_free(&t);
}

// A file shorter than what was read was rewritten: read it again from its start.
static void test_rewritten_file(void **state) {
    (void)state;
    rewrite(RECORD(100, 1.75, 50.5) RECORD(110, 1.625, 60.5));
    MetricsTail t;
    assert_int_equal(metrics_tail_init(&t, path), 0);
    metrics_tail_poll(&t);
    assert_progress(&t, 110, 1.625, 60.5);
    rewrite(RECORD(5, 4.5, 5.5));
    metrics_tail_poll(&t);
    assert_progress(&t, 5, 4.5, 5.5);
    assert_int_equal(t.offset, file_size());
    metrics_tail_free(&t);
}

// A file removed and started anew (a save_folder removed mid-run: train/metrics.h) is another
// file, read from its start even when it is already longer than what was read of the old one.
static void test_replaced_file(void **state) {
    (void)state;
    rewrite(RECORD(100, 1.75, 50.5));
    MetricsTail t;
    assert_int_equal(metrics_tail_init(&t, path), 0);
    metrics_tail_poll(&t);
    assert_progress(&t, 100, 1.75, 50.5);
    FILE *keep = fopen(path, "r");   // the old file's inode stays in use: the new one gets another
    assert_non_null(keep);
    assert_int_equal(remove(path), 0);
    rewrite(RECORD(200, 1.5, 70.5) RECORD(210, 1.25, 80.5));
    metrics_tail_poll(&t);
    assert_progress(&t, 210, 1.25, 80.5);
    assert_int_equal(t.offset, file_size());
    fclose(keep);
    metrics_tail_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_growing_file),
        cmocka_unit_test(test_reads_only_appended_bytes),
        cmocka_unit_test(test_long_line),
        cmocka_unit_test(test_rewritten_file),
        cmocka_unit_test(test_replaced_file),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
