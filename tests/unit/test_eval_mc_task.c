// Multiple-choice request files: parsing, grouping, validation errors and every metric.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "base/error.h"
#include "base/file.h"
#include "eval/mc_task.h"

static char tmpdir[64];

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/spes_mc_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    remove_tree(tmpdir);
    return 0;
}

static char *write_text(const char *name, const char *text, int gzip) {
    char *path = path_join(tmpdir, name);
    if (gzip) {
        gzFile gz = gzopen(path, "wb");
        gzwrite(gz, text, (unsigned)strlen(text));
        gzclose(gz);
    } else {
        assert_int_equal(file_write_atomic(path, text, strlen(text)), SPES_OK);
    }
    return path;
}

// Two documents with 2 and 3 choices, plus the unconditional requests of the first.
static const char *REQUESTS =
    "{\"request_type\":\"loglikelihood\",\"doc\":{\"gold\":1},\"request\":{\"context\":\"Q1\",\"continuation\":\" a\"},\"idx\":0,\"doc_id\":0,\"label\":1}\n"
    "{\"request_type\":\"loglikelihood\",\"doc\":{\"gold\":1},\"request\":{\"context\":\"Q1\",\"continuation\":\" bbbb\"},\"idx\":1,\"doc_id\":0,\"label\":1}\n"
    "\n"
    "{\"doc\":{\"gold\":2},\"request\":{\"context\":\"Q2\",\"continuation\":\" x\"},\"idx\":0,\"doc_id\":7}\n"
    "{\"doc\":{\"gold\":2},\"request\":{\"context\":\"Q2\",\"continuation\":\" \\u00e9\\u00e9\"},\"idx\":1,\"doc_id\":7}\n"
    "{\"doc\":{\"gold\":2},\"request\":{\"context\":\"Q2\",\"continuation\":\" zzzzzz\"},\"idx\":2,\"doc_id\":7}\n"
    "{\"doc\":{\"gold\":1},\"request\":{\"context\":\"Answer:\",\"continuation\":\" a\"},\"idx\":0,\"doc_id\":1000000,\"label\":1}\n"
    "{\"doc\":{\"gold\":1},\"request\":{\"context\":\"Answer:\",\"continuation\":\" bbbb\"},\"idx\":1,\"doc_id\":1000000,\"label\":1}\n";

static void test_parse_and_group(void **state) {
    (void)state;
    char *path = write_text("requests.jsonl.gz", REQUESTS, 1);
    McTask task;
    assert_int_equal(mc_task_load(tmpdir, 0, &task), SPES_OK);
    assert_int_equal(task.num_requests, 7);
    assert_int_equal(task.num_docs, 2);
    assert_int_equal(task.num_uncond_docs, 1);
    assert_int_equal(task.docs[0].num_choices, 2);
    assert_int_equal(task.docs[0].gold, 1);
    assert_int_equal(task.docs[0].uncond, 0);
    assert_int_equal(task.docs[1].num_choices, 3);
    assert_int_equal(task.docs[1].gold, 2);
    assert_int_equal(task.docs[1].uncond, -1);
    assert_string_equal(task.requests[task.docs[1].request_of_choice[2]].continuation, " zzzzzz");
    mc_task_free(&task);
    // The same file given directly, plain text, with a limit of one document.
    char *plain = write_text("plain.jsonl", REQUESTS, 0);
    assert_int_equal(mc_task_load(plain, 1, &task), SPES_OK);
    assert_int_equal(task.num_docs, 1);
    mc_task_free(&task);
    free(plain);
    free(path);
}

static void test_metrics(void **state) {
    (void)state;
    char *path = write_text("m.jsonl", REQUESTS, 0);
    McTask task;
    assert_int_equal(mc_task_load(path, 0, &task), SPES_OK);
    // Doc 0: " a" (2 chars, 1 token) -2.0 vs " bbbb" (5 chars, 2 tokens) -4.0:
    //   raw -> 0 (wrong), per char -1.0 vs -0.8 -> 1 (right), per token -2 vs -2 -> tie -> 0,
    //   per byte same as per char, uncond: -2-(-1) = -1 vs -4-(-5) = 1 -> 1 (right).
    // Doc 7: " x" -1.0 (2 chars), " éé" -1.5 (3 chars, 5 bytes), " zzzzzz" -3.0 (7 chars):
    //   raw -> 0 (wrong), per char -0.5, -0.5, -0.43 -> 2 (right), per byte -0.5,-0.3,-0.43 -> 1.
    McScore scores[7] = {{-2.0, 1}, {-4.0, 2}, {-1.0, 1}, {-1.5, 3}, {-3.0, 2}, {-1.0, 1}, {-5.0, 1}};
    McMetrics mm;
    assert_int_equal(mc_task_metrics(&task, scores, &mm), SPES_OK);
    assert_int_equal(mm.num_docs, 2);
    assert_true(mm.acc_raw == 0.0);
    assert_true(mm.acc_per_char == 1.0);
    assert_true(mm.acc_per_byte == 0.5);
    // per token: doc 0 ties -> first index (wrong); doc 7: -1, -0.5, -1.5 -> 1 (wrong)
    assert_true(mm.acc_per_token == 0.0);
    assert_true(isnan(mm.acc_uncond));   // doc 7 has no unconditional requests
    assert_int_equal(mm.predictions[0], 0);
    assert_int_equal(mm.predictions[1], 0);
    mc_metrics_free(&mm);
    mc_task_free(&task);
    free(path);
    assert_int_equal(utf8_char_count("\xc3\xa9t\xc3\xa9"), 3);
}

static void expect_load_error(const char *text, const char *needle) {
    char *path = write_text("bad.jsonl", text, 0);
    McTask task;
    assert_int_equal(mc_task_load(path, 0, &task), SPES_ERR);
    if (!strstr(spes_last_error(), needle)) fail_msg("error '%s' lacks '%s'", spes_last_error(), needle);
    free(path);
}

static void test_bad_files(void **state) {
    (void)state;
    expect_load_error("{\"request\":{\"context\":\"c\"},\"idx\":0,\"doc_id\":0,\"label\":0}\n", "bad.jsonl:1: missing or malformed field request.continuation");
    expect_load_error("not json\n", "bad.jsonl:1: not a JSON object");
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0}\n", "gold label -1");
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0,\"label\":0}\n"
                      "{\"request\":{\"context\":\"c\",\"continuation\":\"y\"},\"idx\":0,\"doc_id\":0,\"label\":0}\n",
                      "choice idx 0 is repeated");
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":5,\"doc_id\":0,\"label\":0}\n",
                      "out of range");
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0,\"label\":0}\n"
                      "{\"request\":{\"context\":\"c\",\"continuation\":\"y\"},\"idx\":1,\"doc_id\":0,\"label\":1}\n",
                      "disagree on the gold label");
    expect_load_error("{\"request_type\":\"generate_until\",\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0,\"label\":0}\n",
                      "request_type");
    expect_load_error("\n\n", "no requests");
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0,\"label\":4294967296}\n",
                      "gold label 4294967296 out of range");   // was silently read as label 0
    // A label of the wrong type is named (it read as "no label": gold label -1).
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0,\"label\":true}\n",
                      "bad.jsonl:1: label must be an integer");
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0,\"doc\":{\"gold\":1.0}}\n",
                      "bad.jsonl:1: doc.gold must be an integer");
    // Doc ids at or above the unconditional offset with no document of their own were dropped
    // silently: this file scored 0 documents, and a stray one vanished.
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":2000000,\"label\":0}\n",
                      "doc_id 2000000 is at or above the unconditional doc_id offset 1000000, but its document "
                      "(doc_id 1000000) is not in the file");
    expect_load_error("{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":0,\"label\":0}\n"
                      "{\"request\":{\"context\":\"\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":1000001,\"label\":0}\n",
                      "doc_id 1000001 is at or above");
    // A negative uncond_docid_offset made doc_id - offset overflow (found by fuzz_mc_task).
    char *sub = path_join(tmpdir, "negative_offset");
    assert_int_equal(mkdir_p(sub), SPES_OK);
    char *requests = path_join(sub, "requests.jsonl"), *config = path_join(sub, "config.json");
    const char *lines = "{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":-9223372036854775807,\"label\":0}\n"
                        "{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":9223372036854775000,\"label\":0}\n";
    const char *cfg = "{\"task_config\": {\"metric_kwargs\": {\"uncond_docid_offset\": -9223372036854775000}}}";
    assert_int_equal(file_write_atomic(requests, lines, strlen(lines)), SPES_OK);
    assert_int_equal(file_write_atomic(config, cfg, strlen(cfg)), SPES_OK);
    McTask task;
    assert_int_equal(mc_task_load(sub, 0, &task), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "uncond_docid_offset must be positive"));
    // config.json keys of the wrong type were ignored (an offset "2000000" left 1000000).
    const char *typed[][2] = {
        {"{\"task_config\": {\"metric_kwargs\": {\"uncond_docid_offset\": \"2000000\"}}}", "uncond_docid_offset must be an integer"},
        {"{\"task_name\": 5}", "task_name must be a string"},
        {"{\"task_config\": {\"primary_metric\": [\"acc_raw\"]}}", "primary_metric must be a string"},
        {"{\"task_config\": []}", "task_config must be an object"},
    };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(file_write_atomic(config, typed[i][0], strlen(typed[i][0])), SPES_OK);
        assert_int_equal(mc_task_load(sub, 0, &task), SPES_ERR);
        if (!strstr(spes_last_error(), typed[i][1])) fprintf(stderr, "'%s' lacks '%s'\n", spes_last_error(), typed[i][1]);
        assert_non_null(strstr(spes_last_error(), typed[i][1]));
        assert_non_null(strstr(spes_last_error(), "config.json"));
    }
    free(requests);
    free(config);
    free(sub);
    assert_int_equal(mc_task_load("/nonexistent/requests.jsonl.gz", 0, &task), SPES_ERR);
}

// Many documents: grouping scanned every earlier document for each new doc_id (and each
// document's unconditional partner among all of them): these 600000 took over 200 s, a
// million more hours. A hash makes it linear (1 s); every partner is still found.
static void test_many_documents(void **state) {
    (void)state;
    const int n = 300000;
    size_t cap = (size_t)n * 2 * 112 + 1, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (int d = 0; d < n; d++)   // documents in reverse, each followed later by its partner
        len += (size_t)snprintf(text + len, cap - len,
                                "{\"request\":{\"context\":\"c\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":%d,\"label\":0}\n", n - 1 - d);
    for (int d = 0; d < n; d++)
        len += (size_t)snprintf(text + len, cap - len,
                                "{\"request\":{\"context\":\"\",\"continuation\":\"x\"},\"idx\":0,\"doc_id\":%d,\"label\":0}\n", 1000000 + d);
    char *path = write_text("many.jsonl", text, 0);
    free(text);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    McTask task;
    assert_int_equal(mc_task_load(path, 0, &task), SPES_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    assert_int_equal(task.num_docs, n);
    assert_int_equal(task.num_uncond_docs, n);
    for (int d = 0; d < n; d++)
        assert_int_equal(task.uncond_docs[task.docs[d].uncond].doc_id, task.docs[d].doc_id + 1000000);
    mc_task_free(&task);
    free(path);
    if (seconds > 8.0) fprintf(stderr, "loading %d documents took %.1f s\n", 2 * n, seconds);
    assert_true(seconds < 8.0);
}

// The real request files, when the test data is there: every document parses and has a gold.
static void test_shared_request_files(void **state) {
    (void)state;
    const char *data = getenv("SPES_TEST_DATA") ? getenv("SPES_TEST_DATA") : "../shared/data";
    char *dir = path_join(data, "eval/arc_easy_rc_0shot");
    if (!dir_exists(dir)) {
        free(dir);
        skip();
    }
    McTask task;
    assert_int_equal(mc_task_load(dir, 0, &task), SPES_OK);
    assert_string_equal(task.name, "arc_easy");
    assert_string_equal(task.primary_metric, "acc_raw");
    assert_int_equal(task.num_docs, 570);
    assert_int_equal(task.num_uncond_docs, 570);
    for (int d = 0; d < task.num_docs; d++) assert_true(task.docs[d].uncond >= 0);
    mc_task_free(&task);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_group),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_many_documents),
        cmocka_unit_test(test_shared_request_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
