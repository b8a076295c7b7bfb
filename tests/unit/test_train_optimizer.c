// AdamW, weight-decay groups and global-norm clipping (src/train/optimizer.c).
// The PyTorch comparison runs when SPES_ADAMW_REF names the file written by
// tests/ref/adamw_ref.py (tests/integration/train_adamw_ref.sh does that); else it skips.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "io/safetensors.h"
#include "train/optimizer.h"
#include "flat_table.h"

static void test_decay_groups(void **state) {
    (void)state;
    AdamWConfig c = {.weight_decay = 0.1};
    // OLMo defaults: norms and embedding excluded, every Linear decays.
    assert_false(adamw_param_decays(&c, PARAM_EMBED));
    assert_false(adamw_param_decays(&c, PARAM_ATTN_NORM));
    assert_false(adamw_param_decays(&c, PARAM_Q_NORM));
    assert_false(adamw_param_decays(&c, PARAM_FINAL_NORM));
    assert_true(adamw_param_decays(&c, PARAM_Q));
    assert_true(adamw_param_decays(&c, PARAM_ROUTER));
    assert_true(adamw_param_decays(&c, PARAM_EXPERT_DOWN));
    assert_true(adamw_param_decays(&c, PARAM_LM_HEAD));
    c.decay_norm_and_bias = true;
    assert_true(adamw_param_decays(&c, PARAM_MLP_NORM));
    assert_false(adamw_param_decays(&c, PARAM_EMBED));
    c.decay_embeddings = true;
    assert_true(adamw_param_decays(&c, PARAM_EMBED));
}

static void test_global_norm(void **state) {
    (void)state;
    float g2[2] = {3, 4};
    assert_float_equal(grad_global_norm(backend_cpu(), g2, 2), 5.0, 1e-12);
    assert_float_equal(grad_global_norm(backend_cpu(), g2, 0), 0.0, 0.0);
    // Several rounds of blocks and a ragged tail: agrees with a plain double sum and is
    // bit-identical for 1 and 2 threads.
    size_t n = 2 * 16384 * 64 + 12345;
    float *g = malloc(n * sizeof(float));
    double ref = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)sin((double)i * 0.37) * (float)(1 + i % 7);
        ref += (double)g[i] * g[i];
    }
    ref = sqrt(ref);
    omp_set_num_threads(1);
    double a = grad_global_norm(backend_cpu(), g, n);
    omp_set_num_threads(2);
    double b = grad_global_norm(backend_cpu(), g, n);
    assert_float_equal(a, ref, ref * 1e-12);
    assert_memory_equal(&a, &b, sizeof a);
    free(g);
}

static void test_clip(void **state) {
    (void)state;
    assert_true(grad_clip_coef(5.0, 10.0) == 1.0f);   // below max: untouched
    assert_true(grad_clip_coef(5.0, 0.0) == 1.0f);    // 0: clipping off
    assert_true(grad_clip_coef(5.0, 1.0) == 1.0f / (5.0f + 1e-6f));
    assert_true(isnan(grad_clip_coef(NAN, 1.0)));
}

// AdamW's grad_scale is the clipping pass folded into the update: the same bits for p, m and
// v as multiplying the gradient buffer first (the trainer did that until the fold), and the
// gradient buffer left as it was.
static void test_grad_scale_is_a_prior_multiply(void **state) {
    (void)state;
    FlatTensor specs[] = {{NULL, PARAM_Q, 1000, true}, {NULL, PARAM_MLP_NORM, 37, true}, {NULL, PARAM_EMBED, 5, false}};
    ParamTable t = flat_table(specs, 3);
    AdamWConfig c = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    const float scales[] = {0.37f, 1.0f / (7.3f + 1e-6f), 3.0f};
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        AdamW folded, prior;
        assert_int_equal(adamw_create(&folded, &t, &c), SPES_OK);
        assert_int_equal(adamw_create(&prior, &t, &c), SPES_OK);
        float *p1 = malloc(t.total_numel * sizeof(float)), *p2 = malloc(t.total_numel * sizeof(float));
        float *g = malloc(t.trainable_numel * sizeof(float)), *gs = malloc(t.trainable_numel * sizeof(float));
        for (size_t i = 0; i < t.total_numel; i++) p1[i] = p2[i] = (float)sin(0.1 * (double)i);
        for (int s = 0; s < 3; s++) {
            for (size_t i = 0; i < t.trainable_numel; i++) {
                g[i] = (float)cos(0.37 * (double)(i + 1000 * s)) * (float)(1 + i % 5);
                gs[i] = g[i] * scales[k];
            }
            float kept = g[17];
            assert_int_equal(adamw_step(&folded, &t, p1, g, scales[k], (Buf){0}, 1e-2), SPES_OK);
            assert_int_equal(adamw_step(&prior, &t, p2, gs, 1.0f, (Buf){0}, 1e-2), SPES_OK);
            assert_true(g[17] == kept);
        }
        assert_memory_equal(p1, p2, t.total_numel * sizeof(float));
        assert_memory_equal(folded.m, prior.m, t.trainable_numel * sizeof(float));
        assert_memory_equal(folded.v, prior.v, t.trainable_numel * sizeof(float));
        adamw_free(&folded), adamw_free(&prior);
        free(p1), free(p2), free(g), free(gs);
    }
    free(t.entries);
}

// One step by the textbook formula in double, against adamw_step, plus frozen and
// no-decay tensors: frozen untouched, no-decay with zero gradient exactly unchanged.
static void test_step_by_formula(void **state) {
    (void)state;
    FlatTensor specs[] = {{"model.embed_tokens.weight", PARAM_EMBED, 3, true},
                    {"model.layers.0.self_attn.q_proj.weight", PARAM_Q, 4, true},
                    {"model.layers.0.mlp.experts.0.up_proj.weight", PARAM_EXPERT_UP, 2, false},
                    {"model.norm.weight", PARAM_FINAL_NORM, 2, true}};
    ParamTable t = flat_table(specs, 4);
    float params[11] = {0.5f, -1, 2, 0.3f, -0.7f, 1.5f, 0.01f, 9, 9, 1, 1};
    float orig[11];
    memcpy(orig, params, sizeof params);
    float grads[9] = {0.1f, 0.2f, -0.3f, 0.4f, -0.5f, 0.6f, 0.0f, 0, 0};
    AdamWConfig c = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    AdamW opt;
    assert_int_equal(adamw_create(&opt, &t, &c), SPES_OK);
    assert_int_equal(opt.numel, 9);
    double m[9] = {0}, v[9] = {0};
    double p[11];
    for (int i = 0; i < 11; i++) p[i] = orig[i];
    const double lrs[3] = {1e-2, 2e-2, 5e-3};
    for (int s = 1; s <= 3; s++) {
        adamw_step(&opt, &t, params, grads, 1.0f, (Buf){0}, lrs[s - 1]);
        double lr = lrs[s - 1];
        for (int e = 0; e < 4; e++) {
            const ParamInfo *pi = &t.entries[e];
            if (!pi->trainable) continue;
            bool decay = adamw_param_decays(&c, pi->kind);
            for (size_t k = 0; k < pi->numel; k++) {
                size_t gi = (size_t)pi->grad_offset + k, po = pi->offset + k;
                if (decay) p[po] *= 1 - lr * c.weight_decay;
                m[gi] = 0.9 * m[gi] + 0.1 * grads[gi];
                v[gi] = 0.95 * v[gi] + 0.05 * grads[gi] * grads[gi];
                double mh = m[gi] / (1 - pow(0.9, s)), vh = v[gi] / (1 - pow(0.95, s));
                p[po] -= lr * mh / (sqrt(vh) + 1e-8);
            }
        }
    }
    assert_int_equal(opt.step, 3);
    for (int i = 0; i < 11; i++) assert_float_equal(params[i], p[i], 1e-6 * (1 + fabs(p[i])));
    for (int i = 0; i < 9; i++) {
        assert_float_equal(opt.m[i], m[i], 1e-7);
        assert_float_equal(opt.v[i], v[i], 1e-8);
    }
    assert_true(params[7] == 9 && params[8] == 9);   // frozen expert untouched
    assert_true(params[9] == 1 && params[10] == 1);  // no-decay norm, zero grad: unchanged
    assert_true(params[0] != orig[0]);               // embedding moved by its gradient only
    adamw_free(&opt);
    free(t.entries);
}

// adamw_reset (spes_config.reset_moments_at_sync): after it the next step is exactly a fresh
// optimizer's first step from the same weights, and a step without it is not.
static void test_reset_is_a_fresh_start(void **state) {
    (void)state;
    FlatTensor specs[] = {{"model.layers.0.self_attn.q_proj.weight", PARAM_Q, 4, true}};
    ParamTable t = flat_table(specs, 1);
    AdamWConfig c = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    float g1[4] = {0.3f, -0.2f, 0.1f, 0.5f}, g2[4] = {-0.1f, 0.4f, 0.2f, -0.3f};
    float used[4] = {0.5f, -1, 2, 0.3f}, fresh[4], kept[4];
    AdamW a, b, k;
    assert_int_equal(adamw_create(&a, &t, &c), SPES_OK);
    assert_int_equal(adamw_create(&b, &t, &c), SPES_OK);
    assert_int_equal(adamw_create(&k, &t, &c), SPES_OK);
    adamw_step(&a, &t, used, g1, 1.0f, (Buf){0}, 1e-2);
    adamw_step(&k, &t, memcpy(kept, (float[4]){0.5f, -1, 2, 0.3f}, sizeof kept), g1, 1.0f, (Buf){0}, 1e-2);
    memcpy(fresh, used, sizeof fresh);
    assert_int_equal(adamw_reset(&a), SPES_OK);
    assert_int_equal(a.step, 0);
    for (int i = 0; i < 4; i++) assert_true(a.m[i] == 0.0f && a.v[i] == 0.0f);
    adamw_step(&a, &t, used, g2, 1.0f, (Buf){0}, 1e-2);
    adamw_step(&b, &t, fresh, g2, 1.0f, (Buf){0}, 1e-2);
    adamw_step(&k, &t, kept, g2, 1.0f, (Buf){0}, 1e-2);
    assert_memory_equal(used, fresh, sizeof used);
    assert_memory_equal(a.m, b.m, 4 * sizeof(float));
    assert_true(memcmp(kept, used, sizeof used) != 0);   // keeping the moments is a different step
    adamw_free(&a), adamw_free(&b), adamw_free(&k);
    free(t.entries);
}

static ParamKind kind_of(const char *k) {
    if (!strcmp(k, "embed")) return PARAM_EMBED;
    if (!strcmp(k, "norm")) return PARAM_FINAL_NORM;
    return PARAM_Q;
}

static const float *tensor_f32(const SafeTensors *st, const char *prefix, const char *name) {
    char key[160];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    const StTensor *t = safetensors_find(st, key);
    if (!t) fail_msg("reference lacks %s", key);
    assert_int_equal(t->dtype, DTYPE_F32);
    return (const float *)t->data;
}

// The reference file from tests/ref/adamw_ref.py: same table, same gradients, same lrs;
// parameters, moments and pre-clip norms must agree with torch to 1e-6 relative.
static void test_matches_torch(void **state) {
    (void)state;
    const char *path = getenv("SPES_ADAMW_REF");
    assert_non_null(path);
    SafeTensors st;
    if (safetensors_open(path, &st) != SPES_OK) fail_msg("%s", spes_last_error());
    json_t *hp = json_loads(safetensors_meta(&st, "hp"), 0, NULL);
    json_t *lrs = json_loads(safetensors_meta(&st, "lrs"), 0, NULL);
    json_t *norms = json_loads(safetensors_meta(&st, "norms"), 0, NULL);
    json_t *table = json_loads(safetensors_meta(&st, "table"), 0, NULL);
    assert_non_null(hp);
    assert_non_null(lrs);
    assert_non_null(norms);
    assert_non_null(table);
    int n = (int)json_array_size(table);
    FlatTensor *specs = calloc((size_t)n, sizeof(FlatTensor));
    for (int i = 0; i < n; i++) {
        json_t *row = json_array_get(table, (size_t)i);
        specs[i].name = json_string_value(json_array_get(row, 0));
        specs[i].kind = kind_of(json_string_value(json_array_get(row, 1)));
        specs[i].trainable = json_is_true(json_array_get(row, 2));
        char key[160];
        snprintf(key, sizeof key, "init.%s", specs[i].name);
        specs[i].numel = safetensors_find(&st, key)->numel;
    }
    ParamTable t = flat_table(specs, n);
    float *params = malloc(t.total_numel * sizeof(float));
    float *grads = malloc(t.trainable_numel * sizeof(float));
    for (int i = 0; i < n; i++)
        memcpy(params + t.entries[i].offset, tensor_f32(&st, "init.", specs[i].name), t.entries[i].numel * 4);
    AdamWConfig c = {.beta1 = json_real_value(json_object_get(hp, "beta1")),
                     .beta2 = json_real_value(json_object_get(hp, "beta2")),
                     .eps = json_real_value(json_object_get(hp, "eps")),
                     .weight_decay = json_real_value(json_object_get(hp, "weight_decay")),
                     .decay_norm_and_bias = json_is_true(json_object_get(hp, "decay_norm_and_bias")),
                     .decay_embeddings = json_is_true(json_object_get(hp, "decay_embeddings"))};
    double max_norm = json_real_value(json_object_get(hp, "max_grad_norm"));
    int steps = (int)json_integer_value(json_object_get(hp, "steps"));
    AdamW opt;
    assert_int_equal(adamw_create(&opt, &t, &c), SPES_OK);
    for (int s = 0; s < steps; s++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "grad.%d.", s);
        for (int i = 0; i < n; i++)
            if (specs[i].trainable)
                memcpy(grads + t.entries[i].grad_offset, tensor_f32(&st, prefix, specs[i].name),
                       t.entries[i].numel * 4);
        // The trainer's clipping: the norm, then its factor applied by AdamW as it reads g.
        double norm = grad_global_norm(backend_cpu(), grads, t.trainable_numel);
        double ref_norm = json_real_value(json_array_get(norms, (size_t)s));
        assert_float_equal(norm, ref_norm, 1e-6 * ref_norm);
        adamw_step(&opt, &t, params, grads, grad_clip_coef(norm, max_norm), (Buf){0},
                   json_real_value(json_array_get(lrs, (size_t)s)));
    }
    // Differences are measured relative to each tensor's largest magnitude: an element that
    // is a near-cancelling sum carries the tensor's rounding, not its own.
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const ParamInfo *pi = &t.entries[i];
        const float *mine[3] = {params + pi->offset, NULL, NULL};
        const float *ref[3] = {tensor_f32(&st, "final.", pi->name), NULL, NULL};
        int count = 1;
        if (pi->trainable) {
            mine[1] = opt.m + pi->grad_offset, ref[1] = tensor_f32(&st, "exp_avg.", pi->name);
            mine[2] = opt.v + pi->grad_offset, ref[2] = tensor_f32(&st, "exp_avg_sq.", pi->name);
            count = 3;
        }
        for (int j = 0; j < count; j++) {
            double scale = 0;
            for (size_t k = 0; k < pi->numel; k++) scale = fmax(scale, fabs(ref[j][k]));
            for (size_t k = 0; k < pi->numel; k++) {
                if (!pi->trainable) assert_true(mine[j][k] == ref[j][k]);   // frozen: bit-equal
                worst = fmax(worst, fabs(mine[j][k] - ref[j][k]) / scale);
            }
        }
    }
    printf("worst relative difference (params, exp_avg, exp_avg_sq) vs torch: %.3g\n", worst);
    assert_true(worst < 1e-6);
    adamw_free(&opt);
    free(params);
    free(grads);
    free(specs);
    free(t.entries);
    json_decref(hp);
    json_decref(lrs);
    json_decref(norms);
    json_decref(table);
    safetensors_close(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decay_groups),
        cmocka_unit_test(test_global_norm),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_grad_scale_is_a_prior_multiply),
        cmocka_unit_test(test_step_by_formula),
        cmocka_unit_test(test_reset_is_a_fresh_start),
    };
    // The reference comparison runs when its file is given (tests/integration/train_optimizer_ref.sh).
    if (getenv("SPES_ADAMW_REF")) {
        const struct CMUnitTest with_reference[] = {cmocka_unit_test(test_matches_torch)};
        return cmocka_run_group_tests(tests, NULL, NULL) | cmocka_run_group_tests(with_reference, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
