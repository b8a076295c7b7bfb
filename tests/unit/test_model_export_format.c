// Export format choice: each QK-norm mode maps to its HF class; impossible exports are refused.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "base/error.h"
#include "model/export.h"
#include "model/model_config.h"

static ModelConfig config(QkNormMode qk, int d_model, int n_heads, int head_dim) {
    ModelConfig c;
    assert_int_equal(model_config_preset("tiny", &c), SPES_OK);
    c.qk_norm = qk;
    c.d_model = d_model;
    c.n_heads = n_heads;
    c.n_kv_heads = n_heads;
    c.head_dim = head_dim;
    return c;
}

static void test_natural_formats(void **state) {
    (void)state;
    HfFormat f;
    ModelConfig full = config(QK_NORM_FULL, 64, 4, 16), head = config(QK_NORM_HEAD, 48, 4, 16);
    assert_int_equal(hf_format_for_model(&full, HF_FORMAT_AUTO, &f), SPES_OK);
    assert_int_equal(f, HF_FORMAT_OLMOE);
    assert_int_equal(hf_format_for_model(&head, HF_FORMAT_AUTO, &f), SPES_OK);
    assert_int_equal(f, HF_FORMAT_QWEN3_MOE);
    assert_int_equal(hf_format_for_model(&head, HF_FORMAT_OLMOE, &f), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "--format qwen3_moe"));
}

static void test_olmoe_needs_heads_times_head_dim_equal_d_model(void **state) {
    (void)state;
    HfFormat f;
    ModelConfig odd = config(QK_NORM_FULL, 48, 4, 16);   // 4 * 16 = 64 != 48
    assert_int_equal(hf_format_for_model(&odd, HF_FORMAT_AUTO, &f), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "n_heads * head_dim == d_model"));
    ModelConfig none = config(QK_NORM_NONE, 64, 4, 16);
    assert_int_equal(hf_format_for_model(&none, HF_FORMAT_AUTO, &f), SPES_ERR);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_natural_formats),
        cmocka_unit_test(test_olmoe_needs_heads_times_head_dim_equal_d_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
