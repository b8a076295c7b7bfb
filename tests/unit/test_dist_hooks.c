// The model's hooks (model.h), which data parallelism uses to start gradient buckets during
// the backward: the events come in the documented order for every activation-checkpointing
// mode, a part's gradients are final at its POST_BACKWARD (nothing is added to them later)
// and the parts below it have not been touched yet, gradients are the same bits with and
// without a listener, and an error from the listener ends the pass with that error.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threads.h"
#include "model/model.h"

enum { B = 2, T = 8, MAX_EVENTS = 256 };

typedef struct {
    Model *m;
    int n;
    ModelHookEvent event[MAX_EVENTS];
    int part[MAX_EVENTS];
    float *snapshot;    // [trainable] the gradient buffer when each part's POST_BACKWARD came
    bool below_untouched;   // at POST_BACKWARD(p), every gradient of parts < p was still zero
    int fail_at;        // return an error at this event index (-1: never)
} Recorder;

// Gradient range [lo, hi) of one part (its tensors are consecutive in table order).
static void part_range(const Model *m, int part, size_t *lo, size_t *hi) {
    size_t numel;
    param_part_grad_span(&m->table, part, m->cfg.n_layers, lo, &numel);
    *hi = *lo + numel;
}

static int record(void *ctx, ModelHookEvent event, int part) {
    Recorder *r = ctx;
    if (r->n == r->fail_at) return spes_fail("listener failed at event %d", r->n);
    assert_true(r->n < MAX_EVENTS);
    r->event[r->n] = event;
    r->part[r->n] = part;
    r->n++;
    if (event != MODEL_HOOK_POST_BACKWARD) return SPES_OK;
    size_t lo, hi;
    part_range(r->m, part, &lo, &hi);
    memcpy(r->snapshot + lo, r->m->grads + lo, (hi - lo) * sizeof(float));
    for (int p = 0; p < part; p++) {
        size_t a, b;
        part_range(r->m, p, &a, &b);
        for (size_t i = a; i < b; i++) r->below_untouched &= r->m->grads[i] == 0.0f;
    }
    return SPES_OK;
}

static void setup(Model *m, const char *checkpointing) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    assert_int_equal(model_create(m, &cfg), SPES_OK);
    model_init_weights(m, 5);
    assert_int_equal(model_set_activation_checkpointing(m, checkpointing), SPES_OK);
}

static void batch(const Model *m, int32_t *in, int32_t *tg) {
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % m->cfg.embedding_size;
        tg[i] = (i * 5 + 1) % m->cfg.embedding_size;
    }
}

// The expected sequence: forward 0..L+1 (PRE, POST each), then the backward L+1..0.
static void check_sequence(const Recorder *r, int L, bool backward) {
    int k = 0;
    for (int p = 0; p <= L + 1; p++) {
        assert_int_equal(r->event[k], MODEL_HOOK_PRE_FORWARD), assert_int_equal(r->part[k++], p);
        assert_int_equal(r->event[k], MODEL_HOOK_POST_FORWARD), assert_int_equal(r->part[k++], p);
    }
    for (int p = L + 1; backward && p >= 0; p--) {
        assert_int_equal(r->event[k], MODEL_HOOK_PRE_BACKWARD), assert_int_equal(r->part[k++], p);
        assert_int_equal(r->event[k], MODEL_HOOK_POST_BACKWARD), assert_int_equal(r->part[k++], p);
    }
    assert_int_equal(r->n, k);
}

static void run_mode(const char *checkpointing) {
    Model m;
    setup(&m, checkpointing);
    const int L = m.cfg.n_layers;
    const size_t n = m.table.trainable_numel;
    int32_t in[B * T], tg[B * T];
    batch(&m, in, tg);
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};

    // Without a listener: the reference gradient.
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, NULL, NULL), SPES_OK);
    float *plain = malloc(n * sizeof(float));
    memcpy(plain, m.grads, n * sizeof(float));

    Recorder r = {.m = &m, .snapshot = calloc(n, sizeof(float)), .below_untouched = true, .fail_at = -1};
    ModelHooks hooks = {.fn = record, .ctx = &r};
    m.hooks = &hooks;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, NULL, NULL), SPES_OK);
    check_sequence(&r, L, true);
    assert_memory_equal(plain, m.grads, n * sizeof(float));        // the listener changes no bit
    assert_memory_equal(r.snapshot, m.grads, n * sizeof(float));   // final at each POST_BACKWARD
    assert_true(r.below_untouched);

    // A forward-only pass sends the forward events only.
    r.n = 0;
    assert_int_equal(model_forward(&m, in, tg, B, T, &w, NULL, NULL), SPES_OK);
    check_sequence(&r, L, false);

    // The listener's error ends the pass with its message (here in the backward of layer L-1).
    r.n = 0;
    r.fail_at = 2 * (L + 2) + 2;
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "listener failed at event"));
    m.hooks = NULL;
    free(plain);
    free(r.snapshot);
    model_free(&m);
}

static void test_hooks_no_checkpointing(void **state) {
    (void)state;
    run_mode("none");
}

static void test_hooks_fine_grained(void **state) {
    (void)state;
    run_mode("fine_grained");
}

static void test_hooks_whole_layer(void **state) {
    (void)state;
    run_mode("whole_layer");
}

// param_part: embedding 0, layer l at 1 + l, final norm and lm_head at n_layers + 1.
static void test_param_part(void **state) {
    (void)state;
    Model m;
    setup(&m, "none");
    const int L = m.cfg.n_layers;
    for (int i = 0; i < m.table.count; i++) {
        const ParamInfo *pi = &m.table.entries[i];
        int want = pi->kind == PARAM_EMBED ? 0 : pi->layer >= 0 ? 1 + pi->layer : L + 1;
        assert_int_equal(param_part(pi, L), want);
    }
    assert_int_equal(param_part(&m.table.entries[param_table_index(&m.table, PARAM_LM_HEAD, -1, -1)], L), L + 1);
    assert_int_equal(param_part(&m.table.entries[param_table_index(&m.table, PARAM_ROUTER, L - 1, -1)], L), L);
    model_free(&m);
}

int main(void) {
    threads_set(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks_no_checkpointing),
        cmocka_unit_test(test_hooks_fine_grained),
        cmocka_unit_test(test_hooks_whole_layer),
        cmocka_unit_test(test_param_part),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
