// model_bind_part, the piece ZeRO-3 builds on: a listener on the model's hooks copies each
// part's parameters into one working buffer the size of the largest part right before the
// part runs (PRE_FORWARD / PRE_BACKWARD) and binds the part there, while the model's own
// parameter buffer holds NaN. Losses, logits and gradients must be the same bits as a plain
// pass, in every activation-checkpointing mode, for a training and a forward-only pass; a
// part read outside its window would read NaN and show. The same with the model's parameter
// buffers released (model_release_params, as ZeRO-3 runs), and after model_restore_params the
// plain pass again. model_hook_replay sends exactly the events of a real pass, in order.
// Gradients bound elsewhere (model_bind_part's grads, as ZeRO-3's working gradient buffer):
// each part's range of another buffer receives the plain pass's gradients, the model's own
// buffer nothing.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threads.h"
#include "model/model.h"

enum { B = 2, T = 8 };

enum { MAX_EVENTS = 512 };

typedef struct {
    int n;
    int events[MAX_EVENTS];   // event * 1000 + part, in the order received
} EventLog;

static void log_event(EventLog *log, ModelHookEvent event, int part) {
    assert_true(log->n < MAX_EVENTS);
    log->events[log->n++] = (int)event * 1000 + part;
}

static int record(void *ctx, ModelHookEvent event, int part) {
    log_event(ctx, event, part);
    return SPES_OK;
}

typedef struct {
    Model *m;
    const float *store;   // [total_numel] the real parameters (what a gather would assemble)
    float *work;          // [largest part] the working buffer
    float *grads;         // NULL, or [trainable_numel]: each part's gradients bound to its range here
    int gathers;
    EventLog log;
} Gatherer;

static int gather(void *ctx, ModelHookEvent event, int part) {
    Gatherer *g = ctx;
    log_event(&g->log, event, part);
    if (event != MODEL_HOOK_PRE_FORWARD && event != MODEL_HOOK_PRE_BACKWARD) return SPES_OK;
    size_t offset, numel;
    param_part_span(&g->m->table, part, g->m->cfg.n_layers, &offset, &numel);
    memcpy(g->work, g->store + offset, numel * sizeof(float));
    g->gathers++;
    size_t glo = 0, gn;
    param_part_grad_span(&g->m->table, part, g->m->cfg.n_layers, &glo, &gn);
    return model_bind_part(g->m, part, g->work, NULL, g->grads ? g->grads + glo : NULL);
}

static void batch(const Model *m, int32_t *in, int32_t *tg) {
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % m->cfg.embedding_size;
        tg[i] = (i * 5 + 1) % m->cfg.embedding_size;
    }
}

static void run_mode(const char *checkpointing) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    Model m;
    assert_int_equal(model_create(&m, &cfg), SPES_OK);
    model_init_weights(&m, 11);
    assert_int_equal(model_set_activation_checkpointing(&m, checkpointing), SPES_OK);
    const int L = m.cfg.n_layers;
    const size_t n = m.table.trainable_numel, total = m.table.total_numel;
    const size_t n_logits = (size_t)B * T * m.cfg.embedding_size;
    int32_t in[B * T], tg[B * T];
    batch(&m, in, tg);
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};

    // The reference: plain passes on the model's own buffers.
    LossValues ref_train, ref_eval;
    float *ref_grads = malloc(n * sizeof(float)), *ref_logits = malloc(n_logits * sizeof(float));
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &ref_train, NULL), SPES_OK);
    memcpy(ref_grads, m.grads, n * sizeof(float));
    assert_int_equal(model_forward(&m, in, tg, B, T, &w, &ref_eval, ref_logits), SPES_OK);

    // The parts are consecutive and cover the buffer; the working buffer fits the largest.
    size_t largest = 0, next = 0;
    for (int p = 0; p <= L + 1; p++) {
        size_t offset, numel;
        param_part_span(&m.table, p, L, &offset, &numel);
        assert_int_equal(offset, next);
        next = offset + numel;
        if (numel > largest) largest = numel;
    }
    assert_int_equal(next, total);
    assert_true(largest < total);

    float *store = malloc(total * sizeof(float));
    memcpy(store, m.params, total * sizeof(float));
    for (size_t i = 0; i < total; i++) m.params[i] = NAN;
    Gatherer g = {.m = &m, .store = store, .work = calloc(largest, sizeof(float))};
    ModelHooks hooks = {.fn = gather, .ctx = &g};
    m.hooks = &hooks;

    LossValues got;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &got, NULL), SPES_OK);
    assert_memory_equal(&got, &ref_train, sizeof got);
    assert_memory_equal(m.grads, ref_grads, n * sizeof(float));
    assert_int_equal(g.gathers, 2 * (L + 2));   // every part, forward and backward
    EventLog replay = {0};
    ModelHooks recorder = {.fn = record, .ctx = &replay};
    assert_int_equal(model_hook_replay(&m, true, &recorder), SPES_OK);
    assert_int_equal(replay.n, g.log.n);
    assert_memory_equal(replay.events, g.log.events, (size_t)g.log.n * sizeof(int));

    // Gradients bound to another buffer, part by part.
    g.grads = calloc(n, sizeof(float));
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &got, NULL), SPES_OK);
    assert_memory_equal(&got, &ref_train, sizeof got);
    assert_memory_equal(g.grads, ref_grads, n * sizeof(float));
    for (size_t i = 0; i < n; i++) assert_true(m.grads[i] == 0.0f);
    free(g.grads);
    g.grads = NULL;
    g.log.n = 0;

    float *logits = malloc(n_logits * sizeof(float));
    g.log.n = 0;
    assert_int_equal(model_forward(&m, in, tg, B, T, &w, &got, logits), SPES_OK);
    assert_memory_equal(&got, &ref_eval, sizeof got);
    assert_memory_equal(logits, ref_logits, n_logits * sizeof(float));
    replay.n = 0;
    assert_int_equal(model_hook_replay(&m, false, &recorder), SPES_OK);
    assert_int_equal(replay.n, g.log.n);
    assert_memory_equal(replay.events, g.log.events, (size_t)g.log.n * sizeof(int));

    // Released parameter buffers: the parts come from the working buffer only.
    assert_int_equal(model_release_params(&m), SPES_OK);
    assert_null(m.params);
    assert_int_equal(model_release_params(&m), SPES_ERR);
    assert_int_equal(model_bind_part(&m, 0, NULL, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "released"));
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &got, NULL), SPES_OK);
    assert_memory_equal(&got, &ref_train, sizeof got);
    assert_memory_equal(m.grads, ref_grads, n * sizeof(float));
    assert_int_equal(model_restore_params(&m), SPES_OK);
    assert_int_equal(model_restore_params(&m), SPES_ERR);
    for (size_t i = 0; i < total; i++) assert_true(m.params[i] == 0.0f);   // zeroed, bound to the model
    memcpy(m.params, store, total * sizeof(float));
    m.hooks = NULL;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &got, NULL), SPES_OK);
    assert_memory_equal(&got, &ref_train, sizeof got);
    assert_memory_equal(m.grads, ref_grads, n * sizeof(float));
    m.hooks = &hooks;

    // Bound back to the model's own (restored) buffers, with no listener: the plain pass again.
    m.hooks = NULL;
    memcpy(m.params, store, total * sizeof(float));
    for (int p = 0; p <= L + 1; p++) assert_int_equal(model_bind_part(&m, p, NULL, NULL, NULL), SPES_OK);
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &got, NULL), SPES_OK);
    assert_memory_equal(&got, &ref_train, sizeof got);
    assert_memory_equal(m.grads, ref_grads, n * sizeof(float));

    // A part outside [0, L+1] is an error that names it.
    assert_int_equal(model_bind_part(&m, L + 2, g.work, NULL, NULL), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "out of range"));

    free(logits);
    free(g.work);
    free(store);
    free(ref_logits);
    free(ref_grads);
    model_free(&m);
}

static void test_bind_part_no_checkpointing(void **state) {
    (void)state;
    run_mode("none");
}

static void test_bind_part_fine_grained(void **state) {
    (void)state;
    run_mode("fine_grained");
}

static void test_bind_part_whole_layer(void **state) {
    (void)state;
    run_mode("whole_layer");
}

int main(void) {
    threads_set(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bind_part_no_checkpointing),
        cmocka_unit_test(test_bind_part_fine_grained),
        cmocka_unit_test(test_bind_part_whole_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
