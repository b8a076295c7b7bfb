// The single-process parts of data parallelism (src/parallel/): sharded AdamW (also offloaded to
// the host) equals the whole update bit for bit, the contiguity test of the gradient layout,
// the shard boundaries, and a job of one rank whose collectives are identities. The
// multi-rank behaviour is tested by tests/integration/dist_*.sh under mpirun.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "train/optimizer.h"
#include "flat_table.h"

static const FlatTensor SPECS[] = {{NULL, PARAM_EMBED, 37, true},     {NULL, PARAM_ATTN_NORM, 5, true}, {NULL, PARAM_EXPERT_UP, 64, false},
                             {NULL, PARAM_Q, 101, true},        {NULL, PARAM_EXPERT_UP, 64, true}, {NULL, PARAM_FINAL_NORM, 3, true},
                             {NULL, PARAM_LM_HEAD, 29, true}};
#define N_SPECS ((int)(sizeof SPECS / sizeof SPECS[0]))

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_uniform(&r) * 2.0 - 1.0) * scale;
}

// Three shards with boundaries inside tensors, updated separately for 3 steps, against the
// whole update: parameters and moments must be the same bits; so must ZeRO-3's update of the
// shard's values packed apart (adamw_step_packed). Offloaded, the shards update through the
// host staging (optimizer.cpu_offload; on the cpu backend its copies are memcpy).
static void shards_vs_whole(bool offload) {
    ParamTable t = flat_table(SPECS, N_SPECS);
    AdamWConfig c = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}, cs = c;
    cs.cpu_offload = offload;
    float *p_whole = malloc(t.total_numel * sizeof(float)), *p_shard = malloc(t.total_numel * sizeof(float));
    float *g = malloc(t.trainable_numel * sizeof(float));
    fill(p_whole, t.total_numel, 1, 0.1f);
    memcpy(p_shard, p_whole, t.total_numel * sizeof(float));
    AdamW whole, shard[3], packed_opt[3];
    assert_int_equal(adamw_create(&whole, &t, &c), SPES_OK);
    size_t cut[4] = {0, 50, 150, t.trainable_numel};   // 50: inside t3 (grad 42..143); 150: inside t4
    float *packed[3];   // ZeRO-3: shard s's values of the gradient layout, packed
    for (int s = 0; s < 3; s++) {
        assert_int_equal(adamw_create_shard(&shard[s], &t, &cs, backend_cpu(), cut[s], cut[s + 1]), SPES_OK);
        assert_int_equal(adamw_create_shard(&packed_opt[s], &t, &cs, backend_cpu(), cut[s], cut[s + 1]), SPES_OK);
        packed[s] = malloc((cut[s + 1] - cut[s]) * sizeof(float));
    }
    // value i of the gradient layout sits at param_of[i] in the parameter buffer
    size_t *param_of = malloc(t.trainable_numel * sizeof(size_t));
    for (int i = 0; i < t.count; i++)
        for (size_t j = 0; t.entries[i].trainable && j < t.entries[i].numel; j++)
            param_of[(size_t)t.entries[i].grad_offset + j] = t.entries[i].offset + j;
    for (int s = 0; s < 3; s++)
        for (size_t i = cut[s]; i < cut[s + 1]; i++) packed[s][i - cut[s]] = p_whole[param_of[i]];
    assert_true(shard[1].offload == offload && (shard[1].hp != NULL) == offload);
    for (int step = 1; step <= 3; step++) {
        fill(g, t.trainable_numel, 100 + (uint64_t)step, 1.0f);
        assert_int_equal(adamw_step(&whole, &t, p_whole, g, 1.0f, (Buf){0}, 1e-2), SPES_OK);
        for (int s = 0; s < 3; s++) {
            assert_int_equal(adamw_step(&shard[s], &t, p_shard, g + cut[s], 1.0f, (Buf){0}, 1e-2), SPES_OK);
            assert_int_equal(adamw_step_packed(&packed_opt[s], &t, packed[s], g + cut[s], 1.0f, 1e-2), SPES_OK);
        }
    }
    assert_memory_equal(p_whole, p_shard, t.total_numel * sizeof(float));
    for (int s = 0; s < 3; s++)
        for (size_t i = cut[s]; i < cut[s + 1]; i++) assert_true(packed[s][i - cut[s]] == p_whole[param_of[i]]);
    for (int s = 0; s < 3; s++) {
        assert_memory_equal(whole.m + cut[s], shard[s].m, (cut[s + 1] - cut[s]) * sizeof(float));
        assert_memory_equal(whole.v + cut[s], shard[s].v, (cut[s + 1] - cut[s]) * sizeof(float));
        assert_int_equal(shard[s].step, 3);
    }
    // a frozen tensor is never touched
    float frozen0 = p_whole[t.entries[2].offset];
    assert_true(p_shard[t.entries[2].offset] == frozen0);
    AdamW bad;
    assert_int_equal(adamw_create_shard(&bad, &t, &c, backend_cpu(), 10, t.trainable_numel + 1), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "outside"));
    for (int s = 0; s < 3; s++) {
        adamw_free(&shard[s]);
        adamw_free(&packed_opt[s]);
        free(packed[s]);
    }
    free(param_of);
    adamw_free(&whole);
    free(p_whole), free(p_shard), free(g), free(t.entries);
}

static void test_sharded_adamw_is_bitwise_whole(void **state) {
    (void)state;
    shards_vs_whole(false);
}

static void test_offloaded_adamw_is_bitwise_whole(void **state) {
    (void)state;
    shards_vs_whole(true);
}

static void test_layout_contiguity(void **state) {
    (void)state;
    ParamTable t = flat_table(SPECS, N_SPECS);   // a frozen tensor before trainable ones
    assert_false(dp_layout_is_contiguous(&t));
    free(t.entries);
    FlatTensor all[N_SPECS];
    memcpy(all, SPECS, sizeof all);
    for (int i = 0; i < N_SPECS; i++) all[i].trainable = true;
    t = flat_table(all, N_SPECS);
    assert_true(dp_layout_is_contiguous(&t));
    free(t.entries);
    all[N_SPECS - 1].trainable = false;   // frozen only at the end: still a prefix
    t = flat_table(all, N_SPECS);
    assert_true(dp_layout_is_contiguous(&t));
    free(t.entries);
}

// Without a launcher the job is one rank: no MPI, collectives are identities, a ZeRO-1
// "shard" is everything and a step through the bucketed reduction changes nothing; ZeRO-2's
// gradients are not reduced in buckets (sharded_grads.h does it per part).
static void test_single_rank_job(void **state) {
    (void)state;
    unsetenv("OMPI_COMM_WORLD_SIZE");
    Comm *c = NULL;
    assert_int_equal(comm_init(&c), SPES_OK);
    assert_int_equal(comm_size(c), 1);
    assert_int_equal(comm_rank(c), 0);
    assert_false(comm_is_multi(c));
    double x[3] = {1.5, -2, 3};
    assert_int_equal(comm_allreduce_sum(c, NULL, x, 3, COMM_F64), SPES_OK);
    assert_true(x[0] == 1.5 && x[1] == -2 && x[2] == 3);
    assert_int_equal(comm_barrier(c), SPES_OK);

    ParamTable t = flat_table(SPECS, N_SPECS);
    DataParallel dp;
    assert_int_equal(dp_create(&dp, c, backend_cpu(), DP_ZERO1, &t, 1, 1e-3), SPES_OK);   // 1024-value buckets
    size_t lo, hi;
    dp_state_range(&dp, &lo, &hi);
    assert_true(lo == 0 && hi == t.trainable_numel);
    float *g = malloc(t.trainable_numel * sizeof(float)), *g0 = malloc(t.trainable_numel * sizeof(float));
    fill(g, t.trainable_numel, 7, 1.0f);
    memcpy(g0, g, t.trainable_numel * sizeof(float));
    dp_reduce_begin(&dp, g);
    assert_int_equal(dp_reduce_grads(&dp, g), SPES_OK);
    assert_memory_equal(g, g0, t.trainable_numel * sizeof(float));
    assert_ptr_equal(dp_step_grads(&dp, g), g);
    dp_free(&dp);
    assert_int_equal(dp_create(&dp, c, backend_cpu(), DP_ZERO2, &t, 1, 1e-3), SPES_OK);
    dp_reduce_begin(&dp, g);
    assert_int_equal(dp_reduce_grads(&dp, g), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "per part"));
    dp_free(&dp);
    free(g), free(g0), free(t.entries);
    comm_finalize(c);
}

static void test_stage_from_config(void **state) {
    (void)state;
    TrainConfig cfg = {.distributed_strategy = "fsdp", .fsdp_sharding_strategy = "SHARD_OPTIM"};
    DpStage s;
    assert_int_equal(dp_stage_from_config(&cfg, 2, &s), SPES_OK);
    assert_int_equal(s, DP_ZERO1);
    cfg.fsdp_sharding_strategy = "NO_SHARD";
    assert_int_equal(dp_stage_from_config(&cfg, 2, &s), SPES_OK);
    assert_int_equal(s, DP_DDP);
    cfg.fsdp_sharding_strategy = "SHARD_GRAD_OP";
    assert_int_equal(dp_stage_from_config(&cfg, 2, &s), SPES_OK);
    assert_int_equal(s, DP_ZERO2);
    // FULL_SHARD: ZeRO-3 on every backend
    cfg.fsdp_sharding_strategy = "FULL_SHARD";
    assert_int_equal(dp_stage_from_config(&cfg, 2, &s), SPES_OK);
    assert_int_equal(s, DP_ZERO3);
    assert_true(dp_shards_grads(s));
    assert_string_equal(dp_stage_name(s), "zero3");
    assert_false(dp_shards_grads(DP_ZERO1));
    cfg.distributed_strategy = "ddp";
    assert_int_equal(dp_stage_from_config(&cfg, 2, &s), SPES_OK);
    assert_int_equal(s, DP_DDP);
    cfg.distributed_strategy = "single";
    assert_int_equal(dp_stage_from_config(&cfg, 1, &s), SPES_OK);
    assert_int_equal(dp_stage_from_config(&cfg, 2, &s), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "distributed_strategy is single"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_adamw_is_bitwise_whole),
        cmocka_unit_test(test_offloaded_adamw_is_bitwise_whole),
        cmocka_unit_test(test_layout_contiguity),
        cmocka_unit_test(test_single_rank_job),
        cmocka_unit_test(test_stage_from_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
