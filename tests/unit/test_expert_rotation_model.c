// Expert rotation is a relabelling (server/expert_rotation.h): a model whose experts and router
// rows were rotated computes the same losses, and routes each token to the same experts at their
// new positions. Catches a per-expert tensor the rotation does not move (it would route or score
// differently).
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "model/model.h"
#include "server/expert_rotation.h"

enum { B = 2, T = 24 };

static void rotate_model(Model *m, int experts_per_node) {
    ModelSpec spec;
    model_spec_init(&spec);
    for (int i = 0; i < m->table.count; i++)
        assert_int_equal(model_spec_add(&spec, m->table.entries[i].name, DTYPE_F32, m->table.entries[i].ndim,
                                        m->table.entries[i].shape),
                         SPES_OK);
    assert_int_equal(model_spec_finish(&spec), SPES_OK);
    uint8_t **at = calloc((size_t)spec.count, sizeof *at);
    for (int t = 0; t < spec.count; t++) at[t] = (uint8_t *)model_param(m, t);   // spec order = table order
    assert_int_equal(expert_rotation_apply(&spec, experts_per_node, at, sizeof(float)), SPES_OK);
    free(at);
    model_spec_free(&spec);
}

static void check_relabelling(int experts_per_node) {
    ModelConfig c;
    assert_int_equal(model_config_preset("tiny", &c), SPES_OK);
    c.max_seq_len = T;
    c.init_std = 0.1f;
    Model m;
    assert_int_equal(model_create(&m, &c), SPES_OK);
    model_init_weights(&m, 11);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)((i * 29 + 3) % c.vocab_size);
        tg[i] = (int32_t)((i * 41 + 7) % c.vocab_size);
    }
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    LossValues before, after;
    int E = c.num_experts, L = c.n_layers;
    assert_int_equal(model_forward(&m, in, tg, B, T, &w, &before, NULL), SPES_OK);
    int64_t *counts = malloc((size_t)L * E * sizeof *counts);
    memcpy(counts, m.expert_counts, (size_t)L * E * sizeof *counts);
    float *orig = malloc(m.table.total_numel * sizeof(float));
    memcpy(orig, m.params, m.table.total_numel * sizeof(float));
    rotate_model(&m, experts_per_node);
    assert_memory_not_equal(orig, m.params, m.table.total_numel * sizeof(float));
    assert_int_equal(model_forward(&m, in, tg, B, T, &w, &after, NULL), SPES_OK);
    for (int l = 0; l < L; l++) {
        bool all_equal = true;
        for (int e = 0; e < E; e++) {
            assert_int_equal(m.expert_counts[(size_t)l * E + (e + experts_per_node) % E], counts[(size_t)l * E + e]);
            all_equal = all_equal && counts[(size_t)l * E + e] == counts[(size_t)l * E];
        }
        assert_false(all_equal);   // the check above could tell positions apart
    }
    // The experts' outputs are summed in another order: equal up to rounding.
    assert_true(fabs(after.ce - before.ce) <= 1e-5 * fabs(before.ce));
    assert_true(fabs(after.lb - before.lb) <= 1e-5 * fabs(before.lb));
    assert_true(fabs(after.total - before.total) <= 1e-5 * fabs(before.total));
    // E / m rotations by m bring every expert back where it started: the same bits.
    for (int i = 1; i < E / experts_per_node; i++) rotate_model(&m, experts_per_node);
    assert_memory_equal(orig, m.params, m.table.total_numel * sizeof(float));
    free(orig);
    free(counts);
    model_free(&m);
}

static void test_rotated_model_is_the_same_function(void **state) {
    (void)state;
    check_relabelling(1);
    check_relabelling(2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotated_model_is_the_same_function),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
