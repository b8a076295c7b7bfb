// ZeRO-3's part gather (parallel/part_gather.h) on the tiny MoE with frozen experts (SPES: a peer
// trains experts 1..2 only), with the ranks' shards of ZeRO-2 (dp_create's boundaries):
//   - every part gathered from the shards and the frozen store equals its span of the full
//     parameters, bit for bit, also two at once in the two slots (ZeRO-3's prefetch);
//   - a training pass whose parts are gathered by the model's hooks into one working buffer
//     (model_bind_part) while the model's own parameters are NaN gives the plain pass's loss
//     and gradients, bit for bit.
// And ZeRO-2's sharded gradients (parallel/sharded_grads.h): the model's gradient buffer is
// released; a pass through sharded_grads_hooks (every rank the same micro-batch) leaves each
// rank's gradient shard equal to N times the plain pass's gradient over its range, bit for bit
// (N equal addends: the first sum is exact, so every order rounds the same); a replayed idle
// pass adds nothing; ZeRO-1 has no sharded gradients. With and without the overlap (two
// working buffers, the last reduction in flight until sharded_grads_finish). A NaN in one rank's
// gradient shard makes every rank's global norm NaN; a failure on one rank before a collective
// reaches every rank through comm_all_ok.
// Run directly it is a job of one rank; tests/integration/dist_part_gather.sh runs the same
// binary under mpirun with 2 and 3 ranks (the shards then cut through the parts' tensors).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/threads.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/part_gather.h"
#include "parallel/sharded_grads.h"
#include "model/model.h"

enum { B = 2, T = 8 };

static Comm *comm;

typedef struct {
    Model *m;
    PartGather *g;
    const float *shard, *frozen;
    float *work;
} Listener;

static int gather_part(void *ctx, ModelHookEvent event, int part) {
    Listener *l = ctx;
    if (event != MODEL_HOOK_PRE_FORWARD && event != MODEL_HOOK_PRE_BACKWARD) return SPES_OK;
    SPES_TRY(part_gather(l->g, part, l->shard, l->frozen, l->work));
    return model_bind_part(l->m, part, l->work, NULL, NULL);
}

static void test_part_gather(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    Model m;
    assert_int_equal(model_create(&m, &cfg), SPES_OK);
    model_init_weights(&m, 23);
    assert_int_equal(model_set_trainable_experts(&m, 1, 2), SPES_OK);
    const int L = m.cfg.n_layers;
    const size_t n = m.table.trainable_numel, total = m.table.total_numel;
    assert_true(n < total);   // some experts are frozen

    DataParallel dp;
    assert_int_equal(dp_create(&dp, comm, backend_cpu(), DP_ZERO2, &m.table, L, 1.0), SPES_OK);
    PartGather g;
    assert_int_equal(part_gather_create(&g, comm, backend_cpu(), &m.table, L, dp.lo, 2), SPES_OK);
    assert_int_equal(g.frozen_numel, total - n);

    // This rank's master shard of the gradient layout, and the packed frozen store.
    float *layout = malloc(n * sizeof(float)), *frozen = malloc((total - n) * sizeof(float));
    for (int i = 0; i < m.table.count; i++) {
        const ParamInfo *pi = &m.table.entries[i];
        if (pi->trainable) memcpy(layout + pi->grad_offset, m.params + pi->offset, pi->numel * sizeof(float));
    }
    part_pack_frozen(&g, m.params, frozen);
    const size_t lo = dp.lo[dp.rank], hi = dp.lo[dp.rank + 1];
    float *shard = malloc((hi - lo + 1) * sizeof(float));
    memcpy(shard, layout + lo, (hi - lo) * sizeof(float));

    size_t largest = 0;
    for (int p = 0; p <= L + 1; p++) {
        size_t offset, numel;
        param_part_span(&m.table, p, L, &offset, &numel);
        if (numel > largest) largest = numel;
    }
    float *work = malloc(largest * sizeof(float));
    for (int p = 0; p <= L + 1; p++) {
        size_t offset, numel;
        param_part_span(&m.table, p, L, &offset, &numel);
        for (size_t i = 0; i < largest; i++) work[i] = NAN;
        assert_int_equal(part_gather(&g, p, shard, frozen, work), SPES_OK);
        assert_memory_equal(work, m.params + offset, numel * sizeof(float));
    }
    assert_int_equal(part_gather(&g, L + 2, shard, frozen, work), SPES_ERR);
    // Two gathers in flight at once (ZeRO-3's prefetch): each slot has its own staging and
    // counts; both complete at one wait.
    float *work2 = malloc(largest * sizeof(float));
    for (int p = 0; p + 1 <= L + 1; p++) {
        size_t offset, numel, offset2, numel2;
        param_part_span(&m.table, p, L, &offset, &numel);
        param_part_span(&m.table, p + 1, L, &offset2, &numel2);
        for (size_t i = 0; i < largest; i++) work[i] = work2[i] = NAN;
        assert_int_equal(part_gather_start(&g, p % 2, p, shard, work), SPES_OK);
        assert_int_equal(part_gather_start(&g, (p + 1) % 2, p + 1, shard, work2), SPES_OK);
        assert_int_equal(comm_wait_all(comm), SPES_OK);
        part_gather_finish(&g, p % 2, p, frozen, work);
        part_gather_finish(&g, (p + 1) % 2, p + 1, frozen, work2);
        assert_memory_equal(work, m.params + offset, numel * sizeof(float));
        assert_memory_equal(work2, m.params + offset2, numel2 * sizeof(float));
    }
    assert_int_equal(part_gather_start(&g, 2, 0, shard, work), SPES_ERR);   // no third slot
    free(work2);

    // The reference pass, then the same pass on gathered parts with NaN in the model's buffer.
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % m.cfg.embedding_size;
        tg[i] = (i * 5 + 1) % m.cfg.embedding_size;
    }
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    LossValues ref, got;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &ref, NULL), SPES_OK);
    float *ref_grads = malloc(n * sizeof(float));
    memcpy(ref_grads, m.grads, n * sizeof(float));
    for (size_t i = 0; i < total; i++) m.params[i] = NAN;
    Listener l = {.m = &m, .g = &g, .shard = shard, .frozen = frozen, .work = work};
    ModelHooks hooks = {.fn = gather_part, .ctx = &l};
    m.hooks = &hooks;
    model_zero_grad(&m);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &got, NULL), SPES_OK);
    m.hooks = NULL;
    assert_memory_equal(&got, &ref, sizeof got);
    assert_memory_equal(m.grads, ref_grads, n * sizeof(float));

    free(ref_grads);
    free(work);
    free(shard);
    free(frozen);
    free(layout);
    part_gather_free(&g);
    dp_free(&dp);
    model_free(&m);
}

static void sample_batch(const Model *m, int32_t *in, int32_t *tg) {
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % m->cfg.embedding_size;
        tg[i] = (i * 5 + 1) % m->cfg.embedding_size;
    }
}

static void sharded_grads_pass(bool overlap) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    Model ref, m;
    assert_int_equal(model_create(&ref, &cfg), SPES_OK);
    assert_int_equal(model_create(&m, &cfg), SPES_OK);
    model_init_weights(&ref, 23);
    model_init_weights(&m, 23);
    assert_int_equal(model_set_trainable_experts(&ref, 1, 2), SPES_OK);
    assert_int_equal(model_set_trainable_experts(&m, 1, 2), SPES_OK);
    const int L = m.cfg.n_layers;
    const size_t n = m.table.trainable_numel;

    DataParallel dp;
    ShardedGrads sg;
    assert_int_equal(dp_create(&dp, comm, backend_cpu(), DP_ZERO1, &m.table, L, 1.0), SPES_OK);
    assert_int_equal(sharded_grads_create(&sg, &m, &dp, overlap), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "not zero2 or zero3"));
    dp_free(&dp);
    assert_int_equal(dp_create(&dp, comm, backend_cpu(), DP_ZERO2, &m.table, L, 1.0), SPES_OK);
    assert_int_equal(sharded_grads_create(&sg, &m, &dp, overlap), SPES_OK);
    assert_null(m.grads);
    for (int i = 0; i < m.table.count; i++) assert_null(model_grad(&m, i));
    const size_t lo = dp.lo[dp.rank], hi = dp.lo[dp.rank + 1];
    assert_int_equal(sg.shard_n, hi - lo);
    assert_true(sg.work_n < n);   // the largest part, not the model
    assert_int_equal(sg.n_work, overlap ? 2 : 1);
    assert_int_equal(sharded_grads_bytes(&sg), (sg.shard_n + (size_t)sg.n_work * sg.work_n) * sizeof(float));

    int32_t in[B * T], tg[B * T];
    sample_batch(&m, in, tg);
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    LossValues want, got;
    model_zero_grad(&ref);
    assert_int_equal(model_forward_backward(&ref, in, tg, B, T, &w, 1.0f, &want, NULL), SPES_OK);
    assert_int_equal(sharded_grads_zero(&sg), SPES_OK);
    m.hooks = sharded_grads_hooks(&sg);
    assert_int_equal(model_forward_backward(&m, in, tg, B, T, &w, 1.0f, &got, NULL), SPES_OK);
    m.hooks = NULL;
    if (overlap) assert_int_equal(sg.pending, 0);   // the embedding's reduction is still in flight
    assert_int_equal(sharded_grads_finish(&sg), SPES_OK);
    assert_int_equal(sg.pending, -1);
    assert_memory_equal(&got, &want, sizeof got);
    const float ranks = (float)dp.size;
    for (size_t i = lo; i < hi; i++)
        if (sg.shard[i - lo] != ranks * ref.grads[i]) fail_msg("gradient %zu: %g, expected %g", i, sg.shard[i - lo], ranks * ref.grads[i]);
    // An idle pass (a rank with fewer micro-batches) runs the same collectives and adds zeros.
    float *before = malloc((hi - lo + 1) * sizeof(float));
    memcpy(before, sg.shard, (hi - lo) * sizeof(float));
    assert_int_equal(sharded_grads_idle_pass(&sg, sharded_grads_hooks(&sg)), SPES_OK);
    assert_int_equal(sharded_grads_finish(&sg), SPES_OK);
    assert_memory_equal(sg.shard, before, (hi - lo) * sizeof(float));

    free(before);
    sharded_grads_free(&sg);
    dp_free(&dp);
    model_free(&m);
    model_free(&ref);
}

static void test_sharded_grads(void **state) {
    (void)state;
    sharded_grads_pass(false);
}

static void test_sharded_grads_overlapped(void **state) {
    (void)state;
    sharded_grads_pass(true);
}

// The global norm of sharded gradients (dp_shard_grad_norm) with a NaN in rank 0's shard only:
// every rank takes part in the all-reduce and gets NaN (so all skip the step together); one
// that returned early would pair its next collective with the others' norm all-reduce.
static void test_shard_norm_nan_on_one_rank(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    Model m;
    assert_int_equal(model_create(&m, &cfg), SPES_OK);
    DataParallel dp;
    assert_int_equal(dp_create(&dp, comm, backend_cpu(), DP_ZERO2, &m.table, m.cfg.n_layers, 1.0), SPES_OK);
    const size_t mine = dp.lo[dp.rank + 1] - dp.lo[dp.rank], n = m.table.trainable_numel;
    assert_true(mine > 0);
    float *shard = malloc(mine * sizeof(float));
    for (size_t i = 0; i < mine; i++) shard[i] = 1.0f;
    double norm = 0.0;
    assert_int_equal(dp_shard_grad_norm(&dp, shard, &norm), SPES_OK);
    assert_true(norm == sqrt((double)n));
    if (dp.rank == 0) shard[0] = NAN;
    assert_int_equal(dp_shard_grad_norm(&dp, shard, &norm), SPES_OK);
    assert_true(isnan(norm));
    int64_t ranks = 1;   // the collective after the norm pairs with every rank's
    assert_int_equal(comm_allreduce_sum(comm, NULL, &ranks, 1, COMM_I64), SPES_OK);
    assert_int_equal(ranks, dp.size);
    free(shard);
    dp_free(&dp);
    model_free(&m);
}

// comm_all_ok: the last rank fails alone; every rank learns it (the others name the count),
// and the collective after it pairs with every rank's.
static void test_all_ok(void **state) {
    (void)state;
    const int rank = comm_rank(comm), size = comm_size(comm);
    assert_int_equal(comm_all_ok(comm, SPES_OK, "test"), SPES_OK);
    int mine = rank == size - 1 ? spes_fail("rank %d's own failure", rank) : SPES_OK;
    assert_int_equal(comm_all_ok(comm, mine, "do the test"), SPES_ERR);
    if (rank == size - 1) assert_non_null(strstr(spes_last_error(), "own failure"));
    else assert_non_null(strstr(spes_last_error(), "1 of "));
    int64_t ranks = 1;
    assert_int_equal(comm_allreduce_sum(comm, NULL, &ranks, 1, COMM_I64), SPES_OK);
    assert_int_equal(ranks, size);
}

int main(void) {
    threads_set(1);
    if (comm_init(&comm) != SPES_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_part_gather),
        cmocka_unit_test(test_sharded_grads),
        cmocka_unit_test(test_sharded_grads_overlapped),
        cmocka_unit_test(test_shard_norm_nan_on_one_rank),
        cmocka_unit_test(test_all_ok),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_finalize(comm);
    return failed;
}
