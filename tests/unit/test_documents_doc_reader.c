// doc_reader over every text format: .jsonl (malformed lines reported with line numbers,
// blank lines, CRLF, long lines), .json arrays (malformed entries by index), .jsonl.gz
// (multi-member), .jsonl.zst (multi-frame), .txt, unknown extensions, and truncated or
// corrupt inputs giving errors, never crashes.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zlib.h>
#include <zstd.h>

#include "base/error.h"
#include "base/file.h"
#include "documents/byte_stream.h"
#include "documents/doc_reader.h"
#include "documents/line_reader.h"

static char tmpdir[64];

static int setup(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/spes_docreader_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return remove_tree(tmpdir) == SPES_OK ? 0 : -1;
}

static char *write_file(const char *name, const void *data, size_t len) {
    char *path = path_join(tmpdir, name);
    assert_int_equal(file_write_atomic(path, data, len), SPES_OK);
    return path;
}

// Everything a reader yields, and the malformed reports it made.
typedef struct {
    char docs[64][256];
    size_t lens[64];
    int n_docs;
    uint64_t bad_lines[64];
    char bad_why[64][256];
    int n_bad;
    int rc;             // last doc_reader_next result (0 = clean end)
    char error[512];
} Collected;

static void on_malformed(void *user, const char *path, uint64_t line, const char *why) {
    Collected *c = user;
    assert_non_null(strstr(path, tmpdir));
    if (c->n_bad < 64) {
        c->bad_lines[c->n_bad] = line;
        snprintf(c->bad_why[c->n_bad], sizeof c->bad_why[0], "%s", why);
    }
    c->n_bad++;
}

// Opens path (must succeed) and reads to the end or the first error.
static void collect(const char *path, const char *field, Collected *c) {
    memset(c, 0, sizeof *c);
    DocReader *r;
    if (doc_reader_open(path, field, on_malformed, c, &r) != SPES_OK) fail_msg("open %s: %s", path, spes_last_error());
    const char *text;
    size_t len;
    while ((c->rc = doc_reader_next(r, &text, &len)) == 1) {
        if (c->n_docs < 64) {
            size_t n = len < 255 ? len : 255;
            memcpy(c->docs[c->n_docs], text, n);
            c->lens[c->n_docs] = len;
        }
        c->n_docs++;
    }
    if (c->rc != 0) snprintf(c->error, sizeof c->error, "%s", spes_last_error());
    assert_int_equal(doc_reader_malformed(r), (uint64_t)c->n_bad);
    doc_reader_close(r);
}

static const char JSONL[] =
    "{\"text\": \"first\"}\n"
    "\n"
    "   \n"
    "{\"text\": \"sec\\u00f6nd\", \"id\": 2}\r\n"
    "{\"text\": oops}\n"
    "{\"id\": 4}\n"
    "{\"text\": 5}\n"
    "{\"text\": null}\n"
    "[\"text\"]\n"
    "{\"text\": \"\"}\n"
    "{\"text\": \"nul\\u0000inside\"}\n"
    "{\"text\": \"\\ud800\"}\n"
    "{\"text\": \"no newline at end\"}";

static void test_jsonl_documents_and_malformed_lines(void **state) {
    (void)state;
    char *path = write_file("a.jsonl", JSONL, strlen(JSONL));
    Collected c;
    collect(path, "text", &c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.n_docs, 5);
    assert_string_equal(c.docs[0], "first");
    assert_string_equal(c.docs[1], "sec\xc3\xb6nd");
    assert_int_equal(c.lens[2], 0);
    assert_int_equal(c.lens[3], 10);
    assert_memory_equal(c.docs[3], "nul\0inside", 10);
    assert_string_equal(c.docs[4], "no newline at end");
    // bad JSON, missing field, number, null, array, lone surrogate: lines 5-9 and 12.
    assert_int_equal(c.n_bad, 6);
    const uint64_t lines[6] = {5, 6, 7, 8, 9, 12};
    for (int i = 0; i < 6; i++) assert_int_equal(c.bad_lines[i], lines[i]);
    assert_non_null(strstr(c.bad_why[0], "invalid JSON"));
    assert_non_null(strstr(c.bad_why[1], "no field 'text'"));
    assert_non_null(strstr(c.bad_why[2], "a number"));
    assert_non_null(strstr(c.bad_why[3], "null"));
    assert_non_null(strstr(c.bad_why[4], "not a JSON object"));
    free(path);
}

static void test_jsonl_custom_field(void **state) {
    (void)state;
    const char data[] = "\xEF\xBB\xBF{\"content\": \"x\", \"text\": \"y\"}\n{\"text\": \"z\"}\n";
    char *path = write_file("b.jsonl", data, strlen(data));
    Collected c;
    collect(path, "content", &c);
    assert_int_equal(c.n_docs, 1);
    assert_string_equal(c.docs[0], "x");
    assert_int_equal(c.n_bad, 1);
    assert_int_equal(c.bad_lines[0], 2);
    assert_non_null(strstr(c.bad_why[0], "no field 'content'"));
    free(path);
}

// A 3 MB line (beyond the initial buffer) reads whole; a line over the reader's cap is read
// past and reported by number and length (it used to be an error ending the whole file), the
// lines around it read as usual; through doc_reader, a record over max_doc_bytes is reported
// as malformed with its line, and the next document served.
static void test_long_lines(void **state) {
    (void)state;
    size_t n = 3u << 20;
    char *data = malloc(n + 64);
    strcpy(data, "{\"text\": \"");
    size_t at = strlen(data);
    memset(data + at, 'a', n);
    at += n;
    strcpy(data + at, "\"}\n{\"text\": \"short\"}\n");
    char *path = write_file("long.jsonl", data, strlen(data));
    DocReader *r;
    assert_int_equal(doc_reader_open(path, "text", NULL, NULL, &r), SPES_OK);
    const char *text;
    size_t len;
    assert_int_equal(doc_reader_next(r, &text, &len), 1);
    assert_int_equal(len, n);
    assert_int_equal(text[n - 1], 'a');
    assert_int_equal(doc_reader_next(r, &text, &len), 1);
    assert_int_equal(len, 5);
    assert_int_equal(doc_reader_next(r, &text, &len), 0);
    assert_int_equal(doc_reader_bytes_read(r), strlen(data));
    doc_reader_close(r);

    ByteStream *s;
    assert_int_equal(byte_stream_open(path, BYTE_STREAM_PLAIN, &s), SPES_OK);
    LineReader lr;
    assert_int_equal(line_reader_init(&lr, s, path, 1000), SPES_OK);
    const char *line;
    assert_int_equal(line_reader_next(&lr, &line, &len), LINE_READER_SKIPPED);
    assert_int_equal(len, n + 12);   // {"text": "...."}
    assert_int_equal(lr.line_no, 1);
    assert_int_equal(line_reader_next(&lr, &line, &len), 1);
    assert_int_equal(len, strlen("{\"text\": \"short\"}"));
    assert_int_equal(lr.line_no, 2);
    assert_int_equal(line_reader_next(&lr, &line, &len), 0);
    line_reader_close(&lr);

    // A short line, the long one, a line at the limit exactly; a long last line without '\n'.
    char *mixed = malloc(2 * n + 64);
    size_t m = 0;
    m += (size_t)sprintf(mixed + m, "ab\n");
    memset(mixed + m, 'z', n), m += n, mixed[m++] = '\n';
    memset(mixed + m, 'k', 1000), m += 1000, mixed[m++] = '\n';
    memset(mixed + m, 'q', 5000), m += 5000;
    char *mixed_path = write_file("mixed.jsonl", mixed, m);
    assert_int_equal(byte_stream_open(mixed_path, BYTE_STREAM_PLAIN, &s), SPES_OK);
    assert_int_equal(line_reader_init(&lr, s, mixed_path, 1000), SPES_OK);
    assert_int_equal(line_reader_next(&lr, &line, &len), 1);
    assert_int_equal(len, 2);
    assert_int_equal(line_reader_next(&lr, &line, &len), LINE_READER_SKIPPED);
    assert_int_equal(len, n);
    assert_int_equal(lr.line_no, 2);
    assert_true(lr.cap <= 1001);   // never held
    assert_int_equal(line_reader_next(&lr, &line, &len), 1);
    assert_int_equal(len, 1000);
    assert_int_equal(line[999], 'k');
    assert_int_equal(line_reader_next(&lr, &line, &len), LINE_READER_SKIPPED);
    assert_int_equal(len, 5000);
    assert_int_equal(lr.line_no, 4);
    assert_int_equal(line_reader_next(&lr, &line, &len), 0);
    line_reader_close(&lr);

    Collected c = {0};
    r = NULL;
    assert_int_equal(doc_reader_open(path, "text", on_malformed, &c, &r), SPES_OK);
    assert_int_equal(doc_reader_set_max_doc_bytes(r, 1u << 20), SPES_OK);
    assert_int_equal(doc_reader_next(r, &text, &len), 1);
    assert_int_equal(len, 5);   // "short": the 3 MB record was skipped
    assert_int_equal(doc_reader_next(r, &text, &len), 0);
    assert_int_equal(doc_reader_malformed(r), 1);
    assert_int_equal(c.n_bad, 1);
    assert_int_equal(c.bad_lines[0], 1);
    assert_non_null(strstr(c.bad_why[0], "longer than the limit of 1048576 bytes per document"));
    assert_int_equal(doc_reader_set_max_doc_bytes(r, 0), SPES_ERR);
    doc_reader_close(r);
    free(mixed);
    free(mixed_path);
    free(data);
    free(path);
}

static void test_json_array(void **state) {
    (void)state;
    const char data[] =
        "\xEF\xBB\xBF[\n"
        "  {\"text\": \"one, with ] and } and \\\" inside\", \"meta\": {\"a\": [1, 2]}},\n"
        "  {\"text\": 3},\n"
        "  \"a string\",\n"
        "  {\"text\": tru},\n"
        "  {\"other\": \"x\"},\n"
        "  {\"text\": \"two\"}\n"
        "]\n";
    char *path = write_file("c.json", data, strlen(data));
    Collected c;
    collect(path, "text", &c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.n_docs, 2);
    assert_string_equal(c.docs[0], "one, with ] and } and \" inside");
    assert_string_equal(c.docs[1], "two");
    assert_int_equal(c.n_bad, 4);
    const uint64_t lines[4] = {3, 4, 5, 6};
    for (int i = 0; i < 4; i++) assert_int_equal(c.bad_lines[i], lines[i]);
    assert_non_null(strstr(c.bad_why[0], "entry 1"));
    assert_non_null(strstr(c.bad_why[1], "entry 2"));
    assert_non_null(strstr(c.bad_why[2], "entry 3: invalid JSON"));
    assert_non_null(strstr(c.bad_why[3], "entry 4: no field 'text'"));
    free(path);
}

static void test_json_other_shapes(void **state) {
    (void)state;
    Collected c;
    char *path = write_file("one.json", "{\"text\": \"solo\"}", 16);
    collect(path, "text", &c);
    assert_int_equal(c.n_docs, 1);
    assert_string_equal(c.docs[0], "solo");
    free(path);

    // JSON lines under a .json name (HF datasets' to_json default) read as JSON lines;
    // a pretty-printed single object stays one record.
    const char lines[] = "{\"text\": \"l1\"}\n{\"text\": 2}\n{\"text\": \"l3\"}\n";
    path = write_file("lines.json", lines, strlen(lines));
    collect(path, "text", &c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.n_docs, 2);
    assert_string_equal(c.docs[1], "l3");
    assert_int_equal(c.n_bad, 1);
    assert_int_equal(c.bad_lines[0], 2);
    free(path);
    const char pretty[] = "{\n  \"text\": \"p\",\n  \"n\": {\"a\": \"}\"}\n}\n\n";
    path = write_file("pretty.json", pretty, strlen(pretty));
    collect(path, "text", &c);
    assert_int_equal(c.n_docs, 1);
    assert_string_equal(c.docs[0], "p");
    free(path);

    path = write_file("empty_array.json", " [ ] ", 5);
    collect(path, "text", &c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.n_docs, 0);
    free(path);

    path = write_file("empty.json", "", 0);
    collect(path, "text", &c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.n_docs, 0);
    free(path);

    // Truncated in the middle of an entry (and of a string): an error after the good ones.
    const char trunc[] = "[{\"text\": \"ok\"}, {\"text\": \"cut";
    path = write_file("trunc.json", trunc, strlen(trunc));
    collect(path, "text", &c);
    assert_int_equal(c.n_docs, 1);
    assert_int_equal(c.rc, SPES_ERR);
    assert_non_null(strstr(c.error, "not closed"));
    free(path);

    const char garbage[] = "[{\"text\": \"ok\"}] extra";
    path = write_file("garbage.json", garbage, strlen(garbage));
    collect(path, "text", &c);
    assert_int_equal(c.rc, SPES_ERR);
    assert_non_null(strstr(c.error, "after the JSON array"));
    free(path);

    path = write_file("scalar.json", "42", 2);
    DocReader *r;
    assert_int_equal(doc_reader_open(path, "text", NULL, NULL, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "expected a JSON array"));
    free(path);
}

// One gzip member of data.
static size_t gzip_member(const char *data, uint8_t *out, size_t cap) {
    z_stream zs = {0};
    assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    zs.next_in = (Bytef *)data;
    zs.avail_in = (uInt)strlen(data);
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    size_t n = cap - zs.avail_out;
    deflateEnd(&zs);
    return n;
}

static void test_gzip_multi_member_and_truncation(void **state) {
    (void)state;
    uint8_t buf[4096];
    size_t n = gzip_member("{\"text\": \"a\"}\n{\"text\": \"b\"}\n", buf, sizeof buf);
    n += gzip_member("{\"text\": \"c\"}\nnot json\n", buf + n, sizeof buf - n);
    n += gzip_member("{\"text\": \"d\"}", buf + n, sizeof buf - n);
    char *path = write_file("m.jsonl.gz", buf, n);
    Collected c;
    collect(path, "text", &c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.n_docs, 4);
    assert_string_equal(c.docs[3], "d");
    assert_int_equal(c.n_bad, 1);
    assert_int_equal(c.bad_lines[0], 4);
    free(path);

    // Cut anywhere inside the last member: an error (after the earlier documents).
    for (size_t cut = n - 1; cut > n - 20; cut--) {
        path = write_file("t.jsonl.gz", buf, cut);
        collect(path, "text", &c);
        assert_int_equal(c.rc, SPES_ERR);
        assert_non_null(strstr(c.error, "gzip"));
        free(path);
    }
    // Corrupt bytes inside the deflate data.
    buf[20] ^= 0xff;
    buf[21] ^= 0x55;
    path = write_file("bad.jsonl.gz", buf, n);
    collect(path, "text", &c);
    assert_int_equal(c.rc, SPES_ERR);
    free(path);
    path = write_file("empty.jsonl.gz", "", 0);
    collect(path, "text", &c);
    assert_int_equal(c.rc, SPES_ERR);
    assert_non_null(strstr(c.error, "truncated gzip"));
    free(path);
}

static void test_zstd_multi_frame_and_truncation(void **state) {
    (void)state;
    const char *parts[3] = {"{\"text\": \"x\"}\n", "{\"text\": \"y\"}\n{\"text\":", " \"z\"}\n"};
    uint8_t buf[4096];
    size_t n = 0;
    for (int i = 0; i < 3; i++) {   // the middle frame ends inside a line
        size_t k = ZSTD_compress(buf + n, sizeof buf - n, parts[i], strlen(parts[i]), 3);
        assert_false(ZSTD_isError(k));
        n += k;
    }
    char *path = write_file("f.jsonl.zst", buf, n);
    Collected c;
    collect(path, "text", &c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.n_docs, 3);
    assert_string_equal(c.docs[2], "z");
    free(path);

    for (size_t cut = n - 1; cut > n - 8; cut--) {
        path = write_file("t.jsonl.zst", buf, cut);
        collect(path, "text", &c);
        assert_int_equal(c.rc, SPES_ERR);
        assert_non_null(strstr(c.error, "zstd"));
        free(path);
    }
    path = write_file("g.jsonl.zst", "garbage bytes here", 18);
    collect(path, "text", &c);
    assert_int_equal(c.rc, SPES_ERR);
    assert_non_null(strstr(c.error, "zstd"));
    free(path);
}

static void test_txt_and_unknown(void **state) {
    (void)state;
    const char text[] = "Line one.\nLine two, {not json}.\n";
    char *path = write_file("doc.txt", text, strlen(text));
    Collected c;
    collect(path, "text", &c);
    assert_int_equal(c.n_docs, 1);
    assert_int_equal(c.lens[0], strlen(text));
    assert_string_equal(c.docs[0], text);
    free(path);
    path = write_file("empty.txt", "", 0);
    collect(path, "text", &c);
    assert_int_equal(c.n_docs, 1);
    assert_int_equal(c.lens[0], 0);
    free(path);

    DocReader *r;
    path = write_file("data.csv", "a,b\n", 4);
    assert_int_equal(doc_reader_open(path, "text", NULL, NULL, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "unknown input format"));
    assert_non_null(strstr(spes_last_error(), "data.csv"));
    free(path);
    char *missing = path_join(tmpdir, "missing.jsonl");
    assert_int_equal(doc_reader_open(missing, "text", NULL, NULL, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "missing.jsonl"));
    free(missing);
}

// Real data from $SPES_TEST_DATA: an oe-eval requests.jsonl.gz (every line has a string
// "request_type") and Tiny Shakespeare as one .txt document. Lines are counted with
// zlib's gzread, independently of our reader.
static void test_shared_data(void **state) {
    (void)state;
    const char *root = getenv("SPES_TEST_DATA") ? getenv("SPES_TEST_DATA") : "../shared/data";
    char *gz = path_join(root, "eval/arc_easy_rc_0shot/requests.jsonl.gz");
    char *txt = path_join(root, "tinyshakespeare.txt");
    if (!file_exists(gz) || !file_exists(txt)) {
        free(gz);
        free(txt);
        print_message("test data not found under %s\n", root);
        skip();
    }
    gzFile g = gzopen(gz, "rb");
    assert_non_null(g);
    uint64_t lines = 0;
    char buf[65536];
    int n;
    while ((n = gzread(g, buf, sizeof buf)) > 0)
        for (int i = 0; i < n; i++) lines += buf[i] == '\n';
    gzclose(g);
    assert_true(lines > 100);

    DocReader *r;
    assert_int_equal(doc_reader_open(gz, "request_type", NULL, NULL, &r), SPES_OK);
    const char *text;
    size_t len;
    uint64_t docs = 0;
    while (doc_reader_next(r, &text, &len) == 1) {
        assert_int_equal(len, 13);
        assert_memory_equal(text, "loglikelihood", 13);
        docs++;
    }
    assert_int_equal(docs, lines);
    assert_int_equal(doc_reader_malformed(r), 0);
    doc_reader_close(r);

    uint8_t *whole;
    size_t whole_len;
    assert_int_equal(file_read_all(txt, &whole, &whole_len), SPES_OK);
    assert_int_equal(doc_reader_open(txt, "text", NULL, NULL, &r), SPES_OK);
    assert_int_equal(doc_reader_next(r, &text, &len), 1);
    assert_int_equal(len, whole_len);
    assert_memory_equal(text, whole, len);
    assert_int_equal(doc_reader_next(r, &text, &len), 0);
    doc_reader_close(r);
    free(whole);
    free(gz);
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_documents_and_malformed_lines),
        cmocka_unit_test(test_jsonl_custom_field),
        cmocka_unit_test(test_long_lines),
        cmocka_unit_test(test_json_array),
        cmocka_unit_test(test_json_other_shapes),
        cmocka_unit_test(test_gzip_multi_member_and_truncation),
        cmocka_unit_test(test_zstd_multi_frame_and_truncation),
        cmocka_unit_test(test_txt_and_unknown),
        cmocka_unit_test(test_shared_data),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
