// Demo corpus: deterministic, ranges independent, held-out sums never trained on, and the
// question files are well-formed oe-eval requests with the gold answer among 4 choices.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "demo/demo_corpus.h"

typedef struct {
    char *text;
    size_t len;
    int docs;
} Collected;

static int collect(void *user, const char *text, size_t len) {
    Collected *c = user;
    c->text = realloc(c->text, c->len + len + 2);
    memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len++] = '\n';
    c->text[c->len] = '\0';
    c->docs++;
    return SPES_OK;
}

static void test_deterministic_and_range_independent(void **state) {
    (void)state;
    Collected all = {0}, again = {0}, tail = {0};
    assert_int_equal(demo_corpus_generate(7, 0, 20, collect, &all), SPES_OK);
    assert_int_equal(demo_corpus_generate(7, 0, 20, collect, &again), SPES_OK);
    assert_int_equal(all.docs, 20);
    assert_string_equal(all.text, again.text);
    // Documents 10..19 generated alone equal the second half of 0..19.
    assert_int_equal(demo_corpus_generate(7, 10, 10, collect, &tail), SPES_OK);
    assert_non_null(strstr(all.text, tail.text));
    Collected other = {0};
    assert_int_equal(demo_corpus_generate(8, 0, 20, collect, &other), SPES_OK);
    assert_string_not_equal(all.text, other.text);
    free(all.text), free(again.text), free(tail.text), free(other.text);
}

static void test_held_out_sums_absent_from_training(void **state) {
    (void)state;
    Collected c = {0};
    assert_int_equal(demo_corpus_generate(3, 0, 3000, collect, &c), SPES_OK);
    char dir[] = "/tmp/spes_demo_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = path_join(dir, "arith.jsonl");
    assert_int_equal(demo_questions_write(3, DEMO_TASK_ARITHMETIC, 30, path), SPES_OK);
    FILE *fp = fopen(path, "r");
    char line[4096];
    int lines = 0;
    while (fgets(line, sizeof line, fp)) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        assert_non_null(j);
        const char *context = json_string_value(json_object_get(json_object_get(j, "request"), "context"));
        assert_non_null(context);
        // "a plus b is " never trained, as a whole sentence (after a space or a line start).
        char after_space[128], after_newline[128];
        snprintf(after_space, sizeof after_space, " %s ", context);
        snprintf(after_newline, sizeof after_newline, "\n%s ", context);
        if (strstr(c.text, after_space) || strstr(c.text, after_newline) || !strncmp(c.text, context, strlen(context)))
            fail_msg("held-out question '%s' occurs in training text", context);
        json_t *doc = json_object_get(j, "doc");
        int gold = (int)json_integer_value(json_object_get(doc, "gold"));
        assert_true(gold >= 0 && gold < 4);
        assert_int_equal(json_array_size(json_object_get(doc, "choices")), 4);
        json_decref(j);
        lines++;
    }
    fclose(fp);
    assert_int_equal(lines, 30 * 4);
    remove_tree(dir);
    free(path);
    free(c.text);
}

static void test_recall_answers_are_trained_facts(void **state) {
    (void)state;
    Collected c = {0};
    assert_int_equal(demo_corpus_generate(5, 0, 2000, collect, &c), SPES_OK);
    char dir[] = "/tmp/spes_demo_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = path_join(dir, "recall.jsonl");
    assert_int_equal(demo_questions_write(5, DEMO_TASK_RECALL, 10, path), SPES_OK);
    FILE *fp = fopen(path, "r");
    char line[4096];
    while (fgets(line, sizeof line, fp)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *doc = json_object_get(j, "doc");
        const char *context = json_string_value(json_object_get(doc, "query"));
        int gold = (int)json_integer_value(json_object_get(doc, "gold"));
        const char *answer = json_string_value(json_array_get(json_object_get(doc, "choices"), (size_t)gold));
        char fact[128];
        snprintf(fact, sizeof fact, "%s %s.", context, answer);
        if (!strstr(c.text, fact)) fail_msg("gold fact '%s' never stated in training", fact);
        json_decref(j);
    }
    fclose(fp);
    remove_tree(dir);
    free(path);
    free(c.text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic_and_range_independent),
        cmocka_unit_test(test_held_out_sums_absent_from_training),
        cmocka_unit_test(test_recall_answers_are_trained_facts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
