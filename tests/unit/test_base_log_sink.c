// Log-like outputs a failing disk cannot stop: the lost-line bookkeeping (src/base/log_sink.c) and
// the appended file (src/base/append_log.c) under a file size limit (RLIMIT_FSIZE: a write past it
// fails with EFBIG, as one past a full disk with ENOSPC), a removed file and a removed directory.
// The trainer's side: tests/integration/train_log_io.sh, train_log_full_disk.sh.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/append_log.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log_sink.h"

static void test_sink_says_once_and_counts(void **state) {
    (void)state;
    LogSink s;
    char msg[512];
    log_sink_init(&s, "/x/metrics.jsonl", "line");
    assert_int_equal(log_sink_note(&s, true, NULL, 1, msg, sizeof msg), SINK_QUIET);
    assert_string_equal(msg, "");
    // the first failure names the path, the step and the cause
    assert_int_equal(log_sink_note(&s, false, "No space left on device", 5, msg, sizeof msg), SINK_FAILING);
    assert_non_null(strstr(msg, "cannot write /x/metrics.jsonl at step 5: No space left on device. Training goes on"));
    // later ones, even of another cause, are counted quietly
    assert_int_equal(log_sink_note(&s, false, "No space left on device", 6, msg, sizeof msg), SINK_QUIET);
    assert_int_equal(log_sink_note(&s, false, "Input/output error", 7, msg, sizeof msg), SINK_QUIET);
    assert_int_equal(s.lost, 3);
    // the first write that works says what was lost, with the first cause
    assert_int_equal(log_sink_note(&s, true, NULL, 8, msg, sizeof msg), SINK_RECOVERED);
    assert_string_equal(msg, "/x/metrics.jsonl is written again; lost while it could not be (No space left on device): "
                             "3 lines (steps 5-7)");
    assert_int_equal(log_sink_note(&s, true, NULL, 9, msg, sizeof msg), SINK_QUIET);
    // a second streak is said again; one unit of one step
    assert_int_equal(log_sink_note(&s, false, "Read-only file system", 10, msg, sizeof msg), SINK_FAILING);
    assert_int_equal(log_sink_note(&s, true, NULL, 11, msg, sizeof msg), SINK_RECOVERED);
    assert_non_null(strstr(msg, "(Read-only file system): 1 line (step 10)"));
    assert_int_equal(s.lost_total, 4);
    assert_false(log_sink_final(&s, msg, sizeof msg));   // nothing unsaid
}

static void test_sink_final_without_steps(void **state) {
    (void)state;
    LogSink s;
    char msg[512];
    log_sink_init(&s, "stderr", "log line");
    assert_int_equal(log_sink_note(&s, false, "Broken pipe", -1, msg, sizeof msg), SINK_FAILING);
    assert_non_null(strstr(msg, "cannot write stderr: Broken pipe."));
    log_sink_note(&s, false, "Broken pipe", -1, msg, sizeof msg);
    assert_true(log_sink_final(&s, msg, sizeof msg));
    assert_string_equal(msg, "stderr could not be written up to the end of the run (Broken pipe); lost: 2 log lines");
    assert_false(log_sink_final(&s, msg, sizeof msg));   // said once
    // a tiny buffer is cut, never overrun
    char tiny[8];
    log_sink_note(&s, false, "Broken pipe", -1, tiny, sizeof tiny);
    assert_int_equal(strlen(tiny), 7);
}

static char dir[64];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/spes_log_sink_test_XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int remove_dir(void **state) {
    (void)state;
    remove_tree(dir);
    return 0;
}

static char *read_text(const char *path) {
    uint8_t *data;
    size_t len;
    assert_int_equal(file_read_all(path, &data, &len), SPES_OK);
    char *text = realloc(data, len + 1);
    assert_non_null(text);
    text[len] = '\0';
    return text;
}

// A file size limit stands in for a full disk: a record that does not fit whole is cut off
// again (no torn record), later ones are tried again and land once there is room.
static void test_append_keeps_whole_records(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/log.txt", dir);
    AppendLog a;
    assert_int_equal(append_log_open(&a, path, "line", false, "H\n", 2), SPES_OK);
    assert_true(append_log_write(&a, "one\n", 4, 1));
    signal(SIGXFSZ, SIG_IGN);   // a write past the limit fails with EFBIG instead of killing
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 10;   // "H\none\n" is 6 bytes: "two\n" fits, "three\n" would end at 16
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    assert_true(append_log_write(&a, "two\n", 4, 2));
    assert_false(append_log_write(&a, "three\n", 6, 3));   // 0 of it fits
    assert_false(append_log_write(&a, "fourteen\n", 9, 4));
    assert_int_equal(a.sink.lost, 2);
    setrlimit(RLIMIT_FSIZE, &old);
    assert_true(append_log_write(&a, "five\n", 5, 5));
    assert_int_equal(a.sink.lost, 0);
    assert_int_equal(a.sink.lost_total, 2);
    append_log_close(&a);
    char *text = read_text(path);
    assert_string_equal(text, "H\none\ntwo\nfive\n");
    free(text);

    // A partial write (the limit inside a record) is truncated off.
    assert_int_equal(append_log_open(&a, path, "line", false, "H\n", 2), SPES_OK);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &(struct rlimit){.rlim_cur = 18, .rlim_max = old.rlim_max}), 0);
    assert_false(append_log_write(&a, "sixty\n", 6, 6));   // 15 + 6 > 18: 3 bytes would land
    setrlimit(RLIMIT_FSIZE, &old);
    append_log_close(&a);   // says the streak never recovered
    text = read_text(path);
    assert_string_equal(text, "H\none\ntwo\nfive\n");
    free(text);
    signal(SIGXFSZ, SIG_DFL);
}

// A file removed under the writer is started anew, header first; a directory removed loses
// records until it is back.
static void test_append_follows_removal(void **state) {
    (void)state;
    char sub[128], path[160];
    snprintf(sub, sizeof sub, "%s/run", dir);
    snprintf(path, sizeof path, "%s/events", sub);
    assert_int_equal(mkdir_p(sub), SPES_OK);
    AppendLog a;
    assert_int_equal(append_log_open(&a, path, "record", true, "HDR|", 4), SPES_OK);
    assert_int_equal(append_log_open(&(AppendLog){0}, path, "record", true, NULL, 0), SPES_ERR);   // exclusive
    assert_true(append_log_write(&a, "a|", 2, 1));
    assert_int_equal(unlink(path), 0);
    assert_true(append_log_write(&a, "b|", 2, 2));   // a new file, with its header
    char *text = read_text(path);
    assert_string_equal(text, "HDR|b|");
    free(text);
    assert_int_equal(remove_tree(sub), SPES_OK);
    assert_false(append_log_write(&a, "c|", 2, 3));
    assert_false(append_log_write(&a, "d|", 2, 4));
    assert_string_equal(a.sink.cause, "No such file or directory");
    assert_int_equal(mkdir_p(sub), SPES_OK);   // as the next checkpoint save does
    assert_true(append_log_write(&a, "e|", 2, 5));
    assert_int_equal(a.sink.lost_total, 2);
    append_log_close(&a);
    text = read_text(path);
    assert_string_equal(text, "HDR|e|");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sink_says_once_and_counts),
        cmocka_unit_test(test_sink_final_without_steps),
        cmocka_unit_test(test_append_keeps_whole_records),
        cmocka_unit_test(test_append_follows_removal),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
