// Token files: raw uint16/uint32 arrays (what tokenize_data.py writes) and real .npy
// files: header parsing (v1 and v2, numpy's exact layout), the writer round trip, and
// rejection of bad magic/version/descr/order/shape, truncated data and odd raw sizes.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "io/npy.h"

// A .npy image: magic, version, header dict padded with spaces to `pad_to`, then data.
static size_t make_npy(uint8_t *out, int major, const char *dict, const void *data, size_t data_len) {
    size_t prefix = major == 1 ? 10 : 12;
    size_t dict_len = strlen(dict);
    size_t total = (prefix + dict_len + 1 + 63) / 64 * 64;
    size_t header_len = total - prefix;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major;
    out[7] = 0;
    out[8] = (uint8_t)(header_len & 0xff);
    out[9] = (uint8_t)(header_len >> 8);
    if (major != 1) out[10] = out[11] = 0;
    memcpy(out + prefix, dict, dict_len);
    memset(out + prefix + dict_len, ' ', header_len - dict_len - 1);
    out[total - 1] = '\n';
    memcpy(out + total, data, data_len);
    return total + data_len;
}

static void test_raw_files(void **state) {
    (void)state;
    const uint8_t bytes[8] = {1, 0, 0xff, 0xff, 0x34, 0x12, 0, 0x80};
    TokenFile tf;
    assert_int_equal(token_file_parse(bytes, 8, TOKEN_U16, "raw16", &tf), SPES_OK);
    assert_int_equal(tf.count, 4);
    assert_int_equal(tf.has_npy_header, 0);
    assert_int_equal(token_file_get(&tf, 1), 65535);
    assert_int_equal(token_file_get(&tf, 2), 0x1234);
    uint32_t out[4];
    assert_int_equal(token_file_read_u32(&tf, 0, 4, out), SPES_OK);
    assert_int_equal(out[3], 0x8000);
    assert_int_equal(token_file_read_u32(&tf, 2, 3, out), SPES_ERR);   // past the end

    assert_int_equal(token_file_parse(bytes, 8, TOKEN_U32, "raw32", &tf), SPES_OK);
    assert_int_equal(tf.count, 2);
    assert_int_equal(token_file_get(&tf, 0), 0xffff0001u);
    assert_int_equal(token_file_read_u32(&tf, 1, 1, out), SPES_OK);
    assert_int_equal(out[0], 0x80001234u);

    assert_int_equal(token_file_parse(bytes, 7, TOKEN_U16, "odd.npy", &tf), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "odd.npy"));
    assert_int_equal(token_file_parse(bytes, 6, TOKEN_U32, "odd.npy", &tf), SPES_ERR);
    assert_int_equal(token_file_parse(bytes, 0, TOKEN_U32, "empty.npy", &tf), SPES_OK);
    assert_int_equal(tf.count, 0);

    TokenDtype dt;
    assert_int_equal(token_dtype_parse_raw("uint32", &dt), SPES_OK);
    assert_int_equal(dt, TOKEN_U32);
    assert_int_equal(token_dtype_parse_raw("int8", &dt), SPES_ERR);
}

static void test_npy_headers(void **state) {
    (void)state;
    uint8_t buf[512];
    const uint16_t tokens[3] = {7, 50000, 3};
    TokenFile tf;
    // numpy's own layout (np.save of np.array([7, 50000, 3], dtype=np.uint16)).
    size_t n = make_npy(buf, 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", tokens, 6);
    assert_int_equal(token_file_parse(buf, n, TOKEN_U32, "a.npy", &tf), SPES_OK);   // the header wins
    assert_int_equal(tf.has_npy_header, 1);
    assert_int_equal(tf.dtype, TOKEN_U16);
    assert_int_equal(tf.count, 3);
    assert_int_equal(token_file_get(&tf, 1), 50000);
    // Version 2, keys in another order, double quotes, 2-D shape read flattened.
    const int32_t ids[4] = {1, 2, 3, 4};
    n = make_npy(buf, 2, "{\"shape\": (2, 2), \"fortran_order\": False, \"descr\": \"<i4\"}", ids, 16);
    assert_int_equal(token_file_parse(buf, n, TOKEN_U16, "b.npy", &tf), SPES_OK);
    assert_int_equal(tf.count, 4);
    assert_int_equal(tf.dtype, TOKEN_I32);
    uint32_t out[4];
    assert_int_equal(token_file_read_u32(&tf, 0, 4, out), SPES_OK);
    assert_int_equal(out[3], 4);
    const int32_t negative[1] = {-5};
    n = make_npy(buf, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", negative, 4);
    assert_int_equal(token_file_parse(buf, n, TOKEN_U16, "neg.npy", &tf), SPES_OK);
    assert_int_equal(token_file_read_u32(&tf, 0, 1, out), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "negative"));
    const uint64_t wide[1] = {UINT64_C(1) << 40};
    n = make_npy(buf, 1, "{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }", wide, 8);
    assert_int_equal(token_file_parse(buf, n, TOKEN_U16, "wide.npy", &tf), SPES_OK);
    assert_int_equal(token_file_read_u32(&tf, 0, 1, out), SPES_ERR);

    struct {
        const char *dict;
        size_t data_len;
        const char *error;
    } bad[] = {
        {"{'descr': '>u2', 'fortran_order': False, 'shape': (3,), }", 6, "not a token dtype"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 12, "not a token dtype"},
        {"{'descr': '<u2', 'fortran_order': True, 'shape': (3,), }", 6, "Fortran"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }", 6, "truncated"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", 6, "truncated"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (), }", 6, "shape"},
        {"{'descr': '<u2', 'shape': (3,), }", 6, "fortran_order"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999999999999,), }", 6, "shape"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (3,), 'extra': 1}", 6, "unexpected key"},
        {"['descr']", 6, "not a dict"},
        {"{'descr': '<u2' 'fortran_order': False, 'shape': (3,), }", 6, "malformed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const uint8_t zeros[16] = {0};
        n = make_npy(buf, 1, bad[i].dict, zeros, bad[i].data_len);
        if (token_file_parse(buf, n, TOKEN_U16, "bad.npy", &tf) != SPES_ERR) fail_msg("accepted: %s", bad[i].dict);
        if (!strstr(spes_last_error(), bad[i].error)) fail_msg("%s: got '%s'", bad[i].dict, spes_last_error());
        assert_non_null(strstr(spes_last_error(), "bad.npy"));
    }
    // Bad version, header length past the end, truncated prefix.
    n = make_npy(buf, 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", tokens, 6);
    buf[6] = 9;
    assert_int_equal(token_file_parse(buf, n, TOKEN_U16, "v.npy", &tf), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "version"));
    buf[6] = 1;
    buf[9] = 0x40;
    assert_int_equal(token_file_parse(buf, n, TOKEN_U16, "h.npy", &tf), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "header claims"));
    for (size_t cut = 6; cut < 70; cut++) {
        buf[9] = 0;
        assert_int_equal(token_file_parse(buf, cut, TOKEN_U16, "cut.npy", &tf), SPES_ERR);
    }
}

static void test_write_and_open(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_npy_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = path_join(dir, "t.npy");
    uint32_t tokens[1000];
    for (int i = 0; i < 1000; i++) tokens[i] = (uint32_t)i * 70001u;
    assert_int_equal(npy_write(path, TOKEN_U32, tokens, 1000), SPES_OK);
    TokenFile tf;
    assert_int_equal(token_file_open(path, TOKEN_U16, &tf), SPES_OK);
    assert_int_equal(tf.count, 1000);
    assert_int_equal(tf.dtype, TOKEN_U32);
    assert_int_equal((size_t)(tf.data - tf.file.data) % 64, 0);   // data aligned like numpy's
    uint32_t back[1000];
    assert_int_equal(token_file_read_u32(&tf, 0, 1000, back), SPES_OK);
    assert_memory_equal(back, tokens, sizeof tokens);
    token_file_close(&tf);

    // Raw file on disk; a missing file names its path.
    char *raw = path_join(dir, "raw.npy");
    assert_int_equal(file_write_atomic(raw, tokens, 10 * sizeof(uint32_t)), SPES_OK);
    assert_int_equal(token_file_open(raw, TOKEN_U16, &tf), SPES_OK);
    assert_int_equal(tf.count, 20);
    token_file_close(&tf);
    char *missing = path_join(dir, "missing.npy");
    assert_int_equal(token_file_open(missing, TOKEN_U16, &tf), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "missing.npy"));
    free(missing);
    free(raw);
    free(path);
    remove_tree(dir);
}

// A data file cut shorter while mapped (`cp` over it, a re-tokenize in place): reading past its
// new end was a SIGBUS that killed the run; now an error naming what happened, and the pages
// still there read as before, for both the memcpy (u32) and the converting (u16) paths.
static void test_file_cut_while_mapped(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_npy_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = path_join(dir, "cut.npy");
    enum { N = 16384 };   // 64 KiB of u32: many pages
    uint32_t *tokens = malloc(N * sizeof *tokens), back[64];
    uint16_t *tokens16 = malloc(N * sizeof *tokens16);
    for (int i = 0; i < N; i++) tokens[i] = tokens16[i] = (uint16_t)(i * 7);
    for (int dtype = 0; dtype < 2; dtype++) {
        assert_int_equal(dtype ? npy_write(path, TOKEN_U16, tokens16, N) : npy_write(path, TOKEN_U32, tokens, N), SPES_OK);
        TokenFile tf;
        assert_int_equal(token_file_open(path, TOKEN_U16, &tf), SPES_OK);
        assert_int_equal(truncate(path, 4096), 0);
        for (int twice = 0; twice < 2; twice++) {   // the signal is unblocked after the first
            assert_int_equal(token_file_read_u32(&tf, N - 64, 64, back), SPES_ERR);
            assert_non_null(strstr(spes_last_error(), "shorter than the"));
            assert_non_null(strstr(spes_last_error(), "rewritten in place"));
        }
        assert_int_equal(token_file_read_u32(&tf, 0, 64, back), SPES_OK);   // the first page is still there
        for (int i = 0; i < 64; i++) assert_int_equal(back[i], tokens[i]);
        token_file_close(&tf);
    }
    free(tokens);
    free(tokens16);
    free(path);
    remove_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raw_files),
        cmocka_unit_test(test_npy_headers),
        cmocka_unit_test(test_write_and_open),
        cmocka_unit_test(test_file_cut_while_mapped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
