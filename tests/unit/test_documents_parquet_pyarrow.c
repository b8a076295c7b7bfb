// Parquet files written by pyarrow (tests/ref/make_parquet.py: every codec x data page
// v1/v2 x dictionary on/off, DELTA encodings, nested columns, nulls, unicode, empty
// strings, several row groups) read through doc_reader must yield exactly pyarrow's
// non-null values in order. Skipped when the test virtualenv ($SPES_VENV_PY) is absent.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "documents/doc_reader.h"
#include "documents/parquet_reader.h"

static void count_malformed(void *user, const char *path, uint64_t line, const char *why) {
    (void)path, (void)line, (void)why;
    (*(int *)user)++;
}

// Random single-byte corruptions of a real file: errors or values, never a crash.
static void corrupt_and_read(const char *path, unsigned seed) {
    uint8_t *orig;
    size_t len;
    assert_int_equal(file_read_all(path, &orig, &len), SPES_OK);
    uint8_t *copy = malloc(len);
    srand(seed);
    for (int trial = 0; trial < 150; trial++) {
        memcpy(copy, orig, len);
        size_t at = (size_t)rand() % len;
        copy[at] ^= (uint8_t)(1 + rand() % 255);
        ParquetStringReader *r;
        if (parquet_string_reader_open_memory(copy, len, path, "text", &r) != SPES_OK) continue;
        const uint8_t *data;
        size_t n;
        while (parquet_string_reader_next(r, &data, &n) == 1) {
        }
        parquet_string_reader_close(r);
    }
    free(copy);
    free(orig);
}

// With page CRCs stored, no flipped byte in the pages may change the text silently:
// every flip before the footer gives an error or exactly the expected texts.
static void crc_catches_flips(const char *path, json_t *texts) {
    uint8_t *orig;
    size_t len;
    assert_int_equal(file_read_all(path, &orig, &len), SPES_OK);
    size_t footer_len = (size_t)orig[len - 8] | (size_t)orig[len - 7] << 8 | (size_t)orig[len - 6] << 16;
    size_t pages_end = len - 8 - footer_len;
    uint8_t *copy = malloc(len);
    int detected = 0;
    for (size_t at = 4; at < pages_end; at++) {
        memcpy(copy, orig, len);
        copy[at] ^= 0x20;
        ParquetStringReader *r;
        if (parquet_string_reader_open_memory(copy, len, path, "text", &r) != SPES_OK) {
            detected++;
            continue;
        }
        const uint8_t *data;
        size_t n, i = 0;
        int rc, same = 1;
        while ((rc = parquet_string_reader_next(r, &data, &n)) == 1) {
            json_t *want = json_array_get(texts, i++);
            same &= want && n == json_string_length(want) && !memcmp(data, json_string_value(want), n);
        }
        parquet_string_reader_close(r);
        if (rc != 0) detected++;
        else if (!same || i != json_array_size(texts)) fail_msg("%s: flipping byte %zu changed the text silently", path, at);
    }
    assert_true(detected > 100);
    free(copy);
    free(orig);
}

static void test_pyarrow_files(void **state) {
    (void)state;
    const char *py = getenv("SPES_VENV_PY");
    if (!py || access(py, X_OK) != 0) {
        print_message("SPES_VENV_PY not set or not executable: run tests/setup_venv.sh\n");
        skip();
    }
    char dir[] = "/tmp/spes_parquet_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' tests/ref/make_parquet.py '%s'", py, dir);
    if (system(cmd) != 0) {
        remove_tree(dir);
        print_message("make_parquet.py failed (is pyarrow installed in the venv?)\n");
        skip();
    }
    char *expected_path = path_join(dir, "expected.json");
    json_error_t jerr;
    json_t *root = json_load_file(expected_path, JSON_ALLOW_NUL, &jerr);
    free(expected_path);
    assert_non_null(root);
    json_t *expected = json_object_get(root, "files"), *errors = json_object_get(root, "errors");
    assert_true(json_object_size(expected) >= 30);

    const char *name;
    json_t *texts;
    size_t total = 0;
    json_object_foreach(expected, name, texts) {
        char *path = path_join(dir, name);
        DocReader *r;
        int malformed = 0;
        if (doc_reader_open(path, "text", count_malformed, &malformed, &r) != SPES_OK)
            fail_msg("%s: %s", name, spes_last_error());
        size_t i = 0;
        const char *text;
        size_t len;
        int rc;
        while ((rc = doc_reader_next(r, &text, &len)) == 1) {
            if (i >= json_array_size(texts)) fail_msg("%s: more documents than the %zu expected", name, json_array_size(texts));
            json_t *want = json_array_get(texts, i);
            if (len != json_string_length(want) || memcmp(text, json_string_value(want), len) != 0)
                fail_msg("%s: document %zu differs: got '%.*s', want '%s'", name, i, (int)(len > 80 ? 80 : len), text,
                         json_string_value(want));
            i++;
        }
        if (rc != 0) fail_msg("%s: %s", name, spes_last_error());
        assert_int_equal(i, json_array_size(texts));
        assert_int_equal(malformed, 0);
        assert_int_equal(doc_reader_malformed(r), 0);
        doc_reader_close(r);
        total += i;
        corrupt_and_read(path, (unsigned)total);
        free(path);
    }

    assert_true(total > 10000);
    char *crc_path = path_join(dir, "page_index_crc_bloom.parquet");
    crc_catches_flips(crc_path, json_object_get(expected, "page_index_crc_bloom.parquet"));
    free(crc_path);

    // Other columns by name: a non-string column is a clear error, a missing one too.
    char *path = path_join(dir, "zstd_v2_dict.parquet");
    DocReader *r;
    assert_int_equal(doc_reader_open(path, "id", NULL, NULL, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "INT64"));
    assert_int_equal(doc_reader_open(path, "body", NULL, NULL, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "no column named 'body'"));
    // The "source" string column reads too.
    assert_int_equal(doc_reader_open(path, "source", NULL, NULL, &r), SPES_OK);
    const char *text;
    size_t len;
    assert_int_equal(doc_reader_next(r, &text, &len), 1);
    assert_int_equal(len, 4);
    assert_memory_equal(text, "src0", 4);
    doc_reader_close(r);
    free(path);
    path = path_join(dir, "nested_before.parquet");
    assert_int_equal(doc_reader_open(path, "meta", NULL, NULL, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "nested"));
    free(path);

    // Unsupported codecs: a clear error naming the file and the codec, at open or first read.
    json_t *message;
    json_object_foreach(errors, name, message) {
        path = path_join(dir, name);
        int rc = doc_reader_open(path, "text", NULL, NULL, &r);
        if (rc == SPES_OK) {
            while ((rc = doc_reader_next(r, &text, &len)) == 1) {
            }
            doc_reader_close(r);
        }
        if (rc != SPES_ERR) fail_msg("%s: read without error", name);
        if (!strstr(spes_last_error(), json_string_value(message)) || !strstr(spes_last_error(), name))
            fail_msg("%s: unexpected error '%s'", name, spes_last_error());
        free(path);
    }

    json_decref(root);
    remove_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pyarrow_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
