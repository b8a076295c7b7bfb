// JSON lines against Python's json module: tests/ref/make_json_cases.py writes ~3000 random
// and corrupted lines (escapes, surrogates, invalid UTF-8, duplicate and escaped keys, deep
// nesting, truncations) and what json.loads makes of each; doc_reader must yield exactly
// the same texts and report exactly the other lines as malformed. Skipped without python3.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "documents/doc_reader.h"

typedef struct {
    uint64_t lines[8192];
    int count;
} Malformed;

static void on_malformed(void *user, const char *path, uint64_t line, const char *why) {
    (void)path, (void)why;
    Malformed *m = user;
    if (m->count < 8192) m->lines[m->count] = line;
    m->count++;
}

static void test_python_parity(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_jsonparity_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[512];
    const char *count = getenv("SPES_JSON_CASES") ? getenv("SPES_JSON_CASES") : "3000";   // more for a stress run
    snprintf(cmd, sizeof cmd, "python3 tests/ref/make_json_cases.py '%s' '%s'", dir, count);
    if (system(cmd) != 0) {
        remove_tree(dir);
        print_message("python3 tests/ref/make_json_cases.py failed: skipping\n");
        skip();
    }
    char *expected_path = path_join(dir, "expected.json");
    json_error_t jerr;
    json_t *expected = json_load_file(expected_path, JSON_ALLOW_NUL, &jerr);
    assert_non_null(expected);
    size_t n = json_array_size(expected);
    assert_true(n > 2000);

    char *cases = path_join(dir, "cases.jsonl");
    DocReader *r;
    static Malformed bad;
    bad.count = 0;
    assert_int_equal(doc_reader_open(cases, "text", on_malformed, &bad, &r), SPES_OK);
    const char *text;
    size_t len;
    size_t docs = 0, malformed_seen = 0, valid = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *want = json_array_get(expected, i);
        if (json_is_null(want)) continue;
        valid++;
        int rc = doc_reader_next(r, &text, &len);
        if (rc != 1) fail_msg("document %zu: reader ended (%d: %s)", docs, rc, spes_last_error());
        if (len != json_string_length(want) || memcmp(text, json_string_value(want), len) != 0)
            fail_msg("document %zu (expected entry %zu) differs: got '%.*s' want '%s'", docs, i, (int)len, text,
                     json_string_value(want));
        docs++;
    }
    assert_int_equal(doc_reader_next(r, &text, &len), 0);
    malformed_seen = (size_t)bad.count;
    assert_int_equal(malformed_seen, n - valid);
    assert_int_equal(doc_reader_malformed(r), n - valid);
    assert_true(valid > 1000 && n - valid > 500);   // both kinds well represented
    doc_reader_close(r);
    json_decref(expected);
    free(expected_path);
    free(cases);
    remove_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_parity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
