// Adaptive clipping (src/train/clip_adaptive.c): the per-tensor policy (OLMo's
// _do_adaptive_clipping), per-tensor sums over shard pieces, and AdamW's per-tensor factors
// (opt->tensor_scale) against scaling the gradient first. The trainer end to end:
// tests/integration/train_clip_adaptive.sh.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "base/error.h"
#include "flat_table.h"
#include "train/clip_adaptive.h"

// Step 1 clips against the tensor's own norm and keeps nothing; step 2 starts the average from
// its norm and keeps it; later steps clip against it and move it towards the clipped norm.
static void test_policy(void **state) {
    (void)state;
    float avg = 0, w = (float)(1.0 - 0.95);
    bool has = false;
    float c = clip_adaptive_coef(2.0f, 1.5f, w, 1, &avg, &has);
    assert_true(c == 1.0f);
    assert_false(has);   // OLMo adds grad_norm_exp_avg to the state from global step 2 on
    c = clip_adaptive_coef(4.0f, 1.5f, w, 2, &avg, &has);
    assert_true(c == 1.0f && has);
    assert_true(avg == 4.0f);   // lerp(4, 4 * 1, w)
    // 1.5 * 4 = 6 allowed, norm 12: clipped to 6 / (12 + 1e-6), the average moves towards 6
    c = clip_adaptive_coef(12.0f, 1.5f, w, 3, &avg, &has);
    assert_true(c == 6.0f / (12.0f + 1e-6f));
    assert_true(avg == 4.0f + w * (12.0f * c - 4.0f));
    // a ratio below 1 clips even a tensor's first norm (step 1: against itself)
    bool none = false;
    float a1 = 0;
    c = clip_adaptive_coef(3.0f, 0.5f, w, 1, &a1, &none);
    assert_true(c == 1.5f / (3.0f + 1e-6f) && !none);
    // a NaN norm gives a NaN factor (torch.clamp keeps it)
    c = clip_adaptive_coef(NAN, 1.5f, w, 4, &avg, &has);
    assert_true(isnan(c));
}

// A tensor's sum of squares is the sum of its pieces' over any cut of the gradient layout.
static void test_sums_over_pieces(void **state) {
    (void)state;
    FlatTensor specs[] = {{NULL, PARAM_Q, 5, true}, {NULL, PARAM_Q, 3, false}, {NULL, PARAM_Q, 4, true}};
    ParamTable t = flat_table(specs, 3);   // gradient layout: t0 [0, 5), t2 [5, 9)
    float g[9] = {1, 2, 3, 4, 5, -1, -2, 0.5f, 3};
    ClipAdaptive whole, lo, hi;
    assert_int_equal(clip_adaptive_create(&whole, backend_cpu(), &t), SPES_OK);
    assert_int_equal(clip_adaptive_create(&lo, backend_cpu(), &t), SPES_OK);
    assert_int_equal(clip_adaptive_create(&hi, backend_cpu(), &t), SPES_OK);
    assert_int_equal(clip_adaptive_sums(&whole, &t, g, 0, 9), SPES_OK);
    assert_true(whole.sums[0] == 55 && whole.sums[1] == 0 && whole.sums[2] == 1 + 4 + 0.25 + 9);
    assert_int_equal(clip_adaptive_sums(&lo, &t, g, 0, 3), SPES_OK);   // a shard cutting t0
    assert_int_equal(clip_adaptive_sums(&hi, &t, g + 3, 3, 9), SPES_OK);
    for (int i = 0; i < 3; i++) assert_true(lo.sums[i] + hi.sums[i] == whole.sums[i]);
    assert_true(clip_adaptive_total(&whole) == 55 + 14.25);
    clip_adaptive_free(&whole), clip_adaptive_free(&lo), clip_adaptive_free(&hi);
    free(t.entries);
}

// AdamW with per-tensor factors = AdamW on the gradient scaled tensor by tensor first (bit for
// bit), and the factors reach only their tensors; frozen tensors have no average.
static void test_adamw_tensor_scale(void **state) {
    (void)state;
    FlatTensor specs[] = {{NULL, PARAM_Q, 4, true}, {NULL, PARAM_Q, 2, false}, {NULL, PARAM_ATTN_NORM, 3, true},
                          {NULL, PARAM_Q, 2, true}};
    ParamTable t = flat_table(specs, 4);   // gradient layout: [0,4) [4,7) [7,9)
    AdamWConfig c = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    float g[9] = {0.3f, -0.2f, 0.1f, 0.5f, 2, -3, 1, 0.7f, -0.4f};
    const float scale[4] = {0.37f, 1.0f, 1.0f, 0.81f};
    float gs[9];
    for (int i = 0; i < 4; i++) gs[i] = g[i] * 0.5f * scale[0];
    for (int i = 4; i < 7; i++) gs[i] = g[i] * 0.5f;
    for (int i = 7; i < 9; i++) gs[i] = g[i] * 0.5f * scale[3];
    float p1[11], p2[11];
    for (int i = 0; i < 11; i++) p1[i] = p2[i] = 0.1f * (float)(i + 1);
    AdamW a, b;
    assert_int_equal(adamw_create(&a, &t, &c), SPES_OK);
    assert_int_equal(adamw_create(&b, &t, &c), SPES_OK);
    a.tensor_scale = scale;
    for (int s = 0; s < 3; s++) {
        assert_int_equal(adamw_step(&a, &t, p1, g, 0.5f, (Buf){0}, 1e-2), SPES_OK);
        assert_int_equal(adamw_step(&b, &t, p2, gs, 1.0f, (Buf){0}, 1e-2), SPES_OK);
    }
    assert_memory_equal(p1, p2, sizeof p1);
    assert_memory_equal(a.m, b.m, 9 * sizeof(float));
    // the averages: every trainable tensor after step 2, the frozen one never
    ClipAdaptive ca;
    assert_int_equal(clip_adaptive_create(&ca, backend_cpu(), &t), SPES_OK);
    assert_int_equal(clip_adaptive_sums(&ca, &t, g, 0, 9), SPES_OK);
    clip_adaptive_apply(&ca, &a, &t, 1.05, 1.0, 2);
    assert_int_equal(ca.eligible, 3);
    assert_true(a.norm_avg_set[0] && !a.norm_avg_set[1] && a.norm_avg_set[2] && a.norm_avg_set[3]);
    assert_true(ca.scale[1] == 1.0f);
    assert_int_equal(adamw_reset(&a), SPES_OK);   // a fresh optimizer has none
    assert_false(a.norm_avg_set[0] || a.norm_avg_set[2]);
    clip_adaptive_free(&ca);
    adamw_free(&a), adamw_free(&b);
    free(t.entries);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy),
        cmocka_unit_test(test_sums_over_pieces),
        cmocka_unit_test(test_adamw_tensor_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
