// ZeRO-2's sharded gradients and ZeRO-3's sharded parameters (src/parallel/sharded_grads.h,
// sharded_params.h) on the cuda backend, one rank (two ranks on one GPU need NCCL >= 2.30:
// tests/gpu/dist_ranks_gpu.sh). For fp32 and amp_bf16, with the optimizer state on the device
// and offloaded, on the tiny MoE with frozen experts (SPES: a peer trains experts 1..2),
// against a second copy of the same model trained unsharded:
//   - sharded gradients release the model's gradient buffer; a ZeRO-2 pass (the model's own
//     parameters, each part's gradients reduced into the gradient shard; overlapped on the
//     device-state runs, waited for at once on the offloaded ones) gives the plain pass's loss
//     and gradients, bit for bit;
//   - ZeRO-3 with the next part prefetched into a second buffer on the device-state runs,
//     without on the offloaded ones;
//   - sharding the parameters releases the model's device buffers;
//   - a training pass whose parts are gathered from the shard and the frozen store into the
//     working buffers (and converted into the compute working copy), with each part's
//     gradients reduced into the gradient shard after its backward, gives the plain pass's
//     loss and gradients, bit for bit (one rank: the gradient shard is the whole gradient);
//   - AdamW on the packed shard from the gradient shard, then unshard (master gathered,
//     compute copy converted), gives the plain step's master and compute copy, bit for bit;
//   - a second pass after the update is again the plain one's.
// Skipped (cmocka skip) without a GPU. The cpu backend runs the same code in
// tests/unit/test_dist_part_gather.c and tests/integration/dist_train_parity.sh.
#include "gpu_test.h"

#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/sharded_grads.h"
#include "parallel/sharded_params.h"
#include "model/model.h"
#include "train/optimizer.h"

enum { B = 2, T = 8 };

static Comm *comm;

// Backend bytes -> a fresh host copy.
static void *download_bytes(Backend *be, const void *p, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    assert_non_null(h);
    gt_sync_ok(be);
    if (be->ops->download(be, h, p, bytes) != SPES_OK) fail_msg("download: %s", spes_last_error());
    return h;
}

static void assert_same_backend_bytes(Backend *be, const void *a, const void *b, size_t bytes, const char *what) {
    void *ha = download_bytes(be, a, bytes), *hb = download_bytes(be, b, bytes);
    if (memcmp(ha, hb, bytes) != 0) fail_msg("%s differ", what);
    free(ha);
    free(hb);
}

static void make_model(Model *m, Backend *be) {
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    if (model_create_on(m, &cfg, be) != SPES_OK) fail_msg("model_create_on: %s", spes_last_error());
    model_init_weights(m, 23);
    assert_int_equal(model_set_trainable_experts(m, 1, 2), SPES_OK);
    assert_int_equal(model_params_to_device(m), SPES_OK);
}

// A training pass; with g, its gradients sharded (the gradient shard zeroed first, as a step
// does) through `hooks` (ZeRO-2's or ZeRO-3's).
static void pass(Model *m, ShardedGrads *g, const ModelHooks *hooks, LossValues *out) {
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 7 + 3) % m->cfg.embedding_size;
        tg[i] = (i * 5 + 1) % m->cfg.embedding_size;
    }
    LossWeights w = {.lm_z_mult = 1e-2f, .lb_weight = 0.1f, .router_z_weight = 1e-3f};
    if (g) assert_int_equal(sharded_grads_zero(g), SPES_OK);
    m->hooks = hooks;
    model_zero_grad(m);
    if (model_forward_backward(m, in, tg, B, T, &w, 1.0f, out, NULL) != SPES_OK)
        fail_msg("model_forward_backward: %s", spes_last_error());
    m->hooks = NULL;
    if (g) assert_int_equal(sharded_grads_finish(g), SPES_OK);
    gt_sync_ok(m->be);
}

static void run(Precision precision, bool offload) {
    Backend *be = cuda_test_backend(precision);
    printf("-- %s, optimizer state %s, gradient reductions and part gathers %s\n", precision_name(precision),
           offload ? "offloaded" : "on the device", offload ? "waited for at once" : "overlapped (prefetch)");
    Model ref, z;
    make_model(&ref, be);
    make_model(&z, be);
    const int L = z.cfg.n_layers;
    const size_t n = z.table.trainable_numel, total = z.table.total_numel;
    assert_true(n < total);   // some experts are frozen

    DataParallel dp;
    assert_int_equal(dp_create(&dp, comm, be, DP_ZERO3, &z.table, L, 1.0), SPES_OK);
    ShardedGrads sg;
    ShardedParams sp;
    if (sharded_grads_create(&sg, &z, &dp, !offload) != SPES_OK) fail_msg("sharded_grads_create: %s", spes_last_error());
    assert_null(z.grads);
    // ZeRO-2: the model's own parameters, gradients per part into the shard.
    LossValues lr_, lz;
    pass(&ref, NULL, NULL, &lr_);
    pass(&z, &sg, sharded_grads_hooks(&sg), &lz);
    assert_memory_equal(&lz, &lr_, sizeof lz);
    assert_same_backend_bytes(be, sg.shard, ref.grads, n * sizeof(float), "gradients of the zero2 pass");
    // ZeRO-3
    if (sharded_params_create(&sp, &z, &dp, &sg, !offload) != SPES_OK) fail_msg("sharded_params_create: %s", spes_last_error());
    assert_int_equal(sp.shard_n, n);   // one rank: the whole gradient layout
    assert_int_equal(sharded_params_shard(&sp), SPES_OK);
    assert_null(z.dparams);
    assert_null(z.cparams);
    assert_null(z.grads);
    if (!be->host_memory) assert_non_null(z.params);   // the host copy stays on a device backend

    pass(&ref, NULL, NULL, &lr_);
    pass(&z, &sg, sharded_params_hooks(&sp), &lz);
    assert_memory_equal(&lz, &lr_, sizeof lz);
    assert_same_backend_bytes(be, sg.shard, ref.grads, n * sizeof(float), "gradients of the sharded pass");

    AdamWConfig ac = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .cpu_offload = offload};
    AdamW oref, oz;
    assert_int_equal(adamw_create_on(&oref, &ref.table, &ac, be), SPES_OK);
    assert_int_equal(adamw_create_shard(&oz, &z.table, &ac, be, dp.lo[0], dp.lo[1]), SPES_OK);
    const Buf compute = {ref.cparams, be->compute};
    assert_int_equal(adamw_step(&oref, &ref.table, ref.dparams, ref.grads, 1.0f, compute, 1e-3), SPES_OK);
    assert_int_equal(adamw_step_packed(&oz, &z.table, sp.shard, sg.shard, 1.0f, 1e-3), SPES_OK);
    assert_int_equal(sharded_params_updated(&sp), SPES_OK);

    // A pass on the updated shard, then the full model back.
    pass(&ref, NULL, NULL, &lr_);
    pass(&z, &sg, sharded_params_hooks(&sp), &lz);
    assert_memory_equal(&lz, &lr_, sizeof lz);
    assert_same_backend_bytes(be, sg.shard, ref.grads, n * sizeof(float), "gradients after the update");
    assert_int_equal(sharded_params_unshard(&sp), SPES_OK);
    assert_same_backend_bytes(be, z.dparams, ref.dparams, total * sizeof(float), "fp32 masters after unshard");
    if (ref.cparams) {
        assert_non_null(z.cparams);
        assert_same_backend_bytes(be, z.cparams, ref.cparams, total * num_type_size(be->compute),
                                  "compute copies after unshard");
    }
    // Shard again from the restored model: the same pass once more.
    assert_int_equal(sharded_params_shard(&sp), SPES_OK);
    pass(&z, &sg, sharded_params_hooks(&sp), &lz);
    assert_memory_equal(&lz, &lr_, sizeof lz);

    adamw_free(&oref);
    adamw_free(&oz);
    sharded_params_free(&sp);
    sharded_grads_free(&sg);
    dp_free(&dp);
    model_free(&z);
    model_free(&ref);
}

static void test_fp32(void **state) {
    (void)state;
    run(PRECISION_FP32, false);
    run(PRECISION_FP32, true);
}

static void test_bf16(void **state) {
    (void)state;
    run(PRECISION_AMP_BF16, false);
    run(PRECISION_AMP_BF16, true);
}

int main(void) {
    if (comm_init(&comm) != SPES_OK) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fp32), cmocka_unit_test(test_bf16)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_finalize(comm);
    return failed;
}
