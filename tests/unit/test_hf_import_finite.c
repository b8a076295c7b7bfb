// A model file with NaN or Inf weights is refused at load, naming the tensor (issue 29: an
// all-NaN model made `spes generate` print token 0 forever and `spes eval` report loss=nan,
// both exiting 0).
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/file.h"
#include "model/export.h"
#include "model/hf_import.h"
#include "model/param_table.h"

static char dir[] = "/tmp/spes_hf_finite_XXXXXX";

// Exports the tiny model with `value` written into element `at` of tensor `name` (NULL: none),
// then loads the directory back; returns model_load_hf_dir's status.
static int export_and_load(const char *name, int64_t at, float value) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    Model m;
    assert_int_equal(model_create_frozen(&m, &cfg), SPES_OK);
    model_init_weights(&m, 7);
    if (name) {
        int i = param_table_find(&m.table, name);
        assert_true(i >= 0);
        const ParamInfo *p = &m.table.entries[i];
        if (at < 0)
            for (size_t k = 0; k < (size_t)p->numel; k++) m.params[p->offset + k] = value;
        else
            m.params[p->offset + (size_t)at] = value;
    }
    HfExportOptions opt = {.format = HF_FORMAT_AUTO, .dtype = DTYPE_F32};
    assert_int_equal(model_export_hf(&m, dir, &opt), SPES_OK);
    model_free(&m);
    Model back;
    int rc = model_load_hf_dir(dir, &back);
    if (rc == SPES_OK) model_free(&back);
    return rc;
}

static void expect_refused(const char *name, int64_t at, float value, const char *needle) {
    assert_int_equal(export_and_load(name, at, value), SPES_ERR);
    if (!strstr(spes_last_error(), needle)) fail_msg("error '%s' does not mention '%s'", spes_last_error(), needle);
}

static void test_finite_model_loads(void **state) {
    (void)state;
    assert_int_equal(export_and_load(NULL, 0, 0), SPES_OK);
}

static void test_nonfinite_weights_refused(void **state) {
    (void)state;
    expect_refused("model.layers.1.mlp.experts.2.up_proj.weight", 5, NAN,
                   "1 tensor holding NaN or Inf (model.layers.1.mlp.experts.2.up_proj.weight: 1 of ");
    expect_refused("lm_head.weight", 0, INFINITY, "lm_head.weight: 1 of ");
    expect_refused("model.norm.weight", -1, -INFINITY, "model.norm.weight: 32 of 32 values");
    expect_refused("model.embed_tokens.weight", -1, NAN, "model.embed_tokens.weight");
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return remove_tree(dir) == SPES_OK ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finite_model_loads),
        cmocka_unit_test(test_nonfinite_weights_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
