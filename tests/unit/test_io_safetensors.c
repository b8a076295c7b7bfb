// safetensors: round trip, metadata, dtype conversion, and rejection of every malformed header.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "io/safetensors.h"

static void test_round_trip_in_memory(void **state) {
    (void)state;
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.0f)};
    StWriteTensor ts[2] = {
        {.name = "model.a", .dtype = DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "model.b", .dtype = DTYPE_BF16, .ndim = 1, .shape = {3}, .data = b},
    };
    const char *keys[] = {"format"}, *vals[] = {"pt"};
    uint8_t *buf;
    size_t len;
    assert_int_equal(safetensors_serialize(ts, 2, keys, vals, 1, &buf, &len), SPES_OK);
    SafeTensors st;
    assert_int_equal(safetensors_parse(buf, len, "memory", &st), SPES_OK);
    assert_int_equal(st.count, 2);
    assert_string_equal(safetensors_meta(&st, "format"), "pt");
    const StTensor *ta = safetensors_find(&st, "model.a");
    assert_non_null(ta);
    assert_int_equal(ta->ndim, 2);
    assert_int_equal(ta->shape[1], 3);
    float back[6];
    assert_int_equal(safetensors_to_f32(ta, back), SPES_OK);
    assert_memory_equal(back, a, sizeof a);
    float bb[3];
    assert_int_equal(safetensors_to_f32(safetensors_find(&st, "model.b"), bb), SPES_OK);
    assert_true(bb[0] == 1.5f && bb[1] == -2.0f && bb[2] == 0.0f);
    // The header is padded so the data starts 8-byte aligned, as HF writes it.
    uint64_t header_len;
    memcpy(&header_len, buf, 8);
    assert_int_equal(header_len % 8, 0);
    safetensors_close(&st);
    free(buf);
}

static void test_file_round_trip(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = path_join(dir, "x.safetensors");
    double d[2] = {0.25, -8.0};
    StWriteTensor t = {.name = "w", .dtype = DTYPE_F64, .ndim = 1, .shape = {2}, .data = d};
    assert_int_equal(safetensors_write_file(path, &t, 1, NULL, NULL, 0), SPES_OK);
    SafeTensors st;
    assert_int_equal(safetensors_open(path, &st), SPES_OK);
    float f[2];
    assert_int_equal(safetensors_to_f32(safetensors_find(&st, "w"), f), SPES_OK);
    assert_true(f[0] == 0.25f && f[1] == -8.0f);
    safetensors_close(&st);
    remove_tree(dir);
    free(path);
}

static void test_bf16_rounding(void **state) {
    (void)state;
    // 1 + 2^-8 lies exactly between two bf16 values: ties go to even (1.0).
    assert_true(bf16_to_f32(f32_to_bf16(1.0f + 0x1.0p-8f)) == 1.0f);
    assert_true(bf16_to_f32(f32_to_bf16(1.0f + 0x1.8p-8f)) == 1.0f + 0x1.0p-7f);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    assert_true(f16_to_f32(0x3C00) == 1.0f);
    assert_true(f16_to_f32(0xC000) == -2.0f);
    assert_true(f16_to_f32(0x0001) == 0x1.0p-24f);
}

// Builds a file image: 8-byte length + header text + `data_len` zero bytes.
static uint8_t *image(const char *header, size_t data_len, size_t *len) {
    size_t h = strlen(header);
    uint8_t *buf = calloc(1, 8 + h + data_len);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    *len = 8 + h + data_len;
    return buf;
}

static void expect_rejected(const char *header, size_t data_len, const char *needle) {
    size_t len;
    uint8_t *buf = image(header, data_len, &len);
    SafeTensors st;
    assert_int_equal(safetensors_parse(buf, len, "bad.safetensors", &st), SPES_ERR);
    if (!strstr(spes_last_error(), needle)) fail_msg("error '%s' lacks '%s'", spes_last_error(), needle);
    assert_non_null(strstr(spes_last_error(), "bad.safetensors"));
    free(buf);
}

static void test_rejects_malformed(void **state) {
    (void)state;
    expect_rejected("{", 0, "not valid JSON");
    expect_rejected("[1]", 0, "not a JSON object");
    expect_rejected("{\"a\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "needs 8");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 2, "beyond");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                    4, "overlap");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, "trailing");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4,
                    "overflow");
    expect_rejected("{\"__metadata__\":{\"k\":1}}", 0, "not a string");
    // Header length larger than the file.
    uint8_t tiny[12] = {255, 255, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    SafeTensors st;
    assert_int_equal(safetensors_parse(tiny, sizeof tiny, "t", &st), SPES_ERR);
    assert_int_equal(safetensors_parse(tiny, 4, "t", &st), SPES_ERR);
}

static void test_writer_rejects_duplicates(void **state) {
    (void)state;
    float x = 1;
    StWriteTensor ts[2] = {{.name = "x", .dtype = DTYPE_F32, .ndim = 0, .data = &x},
                           {.name = "x", .dtype = DTYPE_F32, .ndim = 0, .data = &x}};
    uint8_t *buf;
    size_t len;
    assert_int_equal(safetensors_serialize(ts, 2, NULL, NULL, 0, &buf, &len), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "duplicate"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_in_memory), cmocka_unit_test(test_file_round_trip),
        cmocka_unit_test(test_bf16_rounding),        cmocka_unit_test(test_rejects_malformed),
        cmocka_unit_test(test_writer_rejects_duplicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
