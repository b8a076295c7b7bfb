// The trainer (src/train/trainer.c) on a tiny model and a token file written here:
// SPES trainable mask (frozen experts bit-identical after steps), gradient accumulation
// normalised like OLMo (2 micro-batches of 4 == 1 of 8; the ce sum over the batch's tokens,
// masked instances included), learning-rate schedule applied, and a clear error for a
// save_folder that already holds checkpoints; the peer-only optimizer keys (spes_config.beta1,
// lr_scale) change a peer's training exactly as the optimizer keys would, and a centralised run's not.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "config/config.h"
#include "data/loader.h"
#include "data/pcg64.h"
#include "train/trainer.h"

static char dir[64];

static int make_data(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/spes_trainer_test_XXXXXX");
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/tokens.npy", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint32_t x = 99;
    for (int i = 0; i < 40 * 32; i++) {   // 40 instances of 32 tokens, ids in [0, 64)
        x = x * 1103515245u + 12345u;
        uint16_t id = (uint16_t)((x >> 16) % 64);
        fwrite(&id, 2, 1, f);
    }
    fclose(f);
    return 0;
}

static int remove_data(void **state) {
    (void)state;
    remove_tree(dir);
    return 0;
}

// The tiny config; `extra` is appended YAML, `folder` names the save folder under dir.
static void load_config(TrainConfig *cfg, const char *folder, const char *extra) {
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "seed: 5\n"
             "model: {d_model: 32, n_heads: 4, n_layers: 2, mlp_hidden_size: 64, max_sequence_length: 32,\n"
             "        vocab_size: 64, embedding_size: 64, eos_token_id: 0, pad_token_id: 0,\n"
             "        attention_layer_norm: true, moe_num_experts: 4, moe_top_k: 2, init_std: 0.02}\n"
             "optimizer: {learning_rate: 1.0e-2, weight_decay: 0.1, eps: 1.0e-8}\n"
             "scheduler: {name: linear_with_warmup, t_warmup: 2, alpha_f: 0.0}\n"
             "data: {paths: [%s/tokens.npy], seed: 1}\n"
             "max_duration: 4\n"
             "global_train_batch_size: 8\n"
             "device_train_microbatch_size: 8\n"
             "save_folder: %s/%s\n"
             "%s",
             dir, dir, folder, extra);
    if (config_load_string(yaml, "test.yaml", 0, NULL, cfg) != SPES_OK) fail_msg("%s", spes_last_error());
}

static Trainer *create(const TrainConfig *cfg) {
    TrainerOptions opt = {.peak_flops = 1e9};
    Trainer *t;
    if (trainer_create(cfg, &opt, &t) != SPES_OK) fail_msg("%s", spes_last_error());
    return t;
}

static void test_spes_mask_freezes_other_experts(void **state) {
    (void)state;
    TrainConfig cfg;
    load_config(&cfg, "spes", "using_spes: true\nspes_config: {num_peers: 2, peer_id: 1}\n");
    Trainer *t = create(&cfg);
    Model *m = trainer_model(t);
    size_t n = m->table.total_numel;
    float *before = malloc(n * sizeof(float));
    memcpy(before, m->params, n * sizeof(float));
    StepMetrics sm;
    for (int s = 0; s < 2; s++) assert_int_equal(trainer_step(t, &sm), SPES_OK);
    assert_int_equal(trainer_step_count(t), 2);
    int frozen = 0, trained = 0;
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *p = &m->table.entries[i];
        bool same = memcmp(before + p->offset, m->params + p->offset, p->numel * sizeof(float)) == 0;
        bool owned = p->expert < 0 || p->expert >= 2;   // peer 1 of 2 owns experts 2 and 3
        assert_int_equal(p->trainable, owned);
        if (!owned) {
            if (!same) fail_msg("frozen %s changed", p->name);
            frozen++;
        } else {
            if (same) fail_msg("trainable %s did not change", p->name);
            trained++;
        }
    }
    assert_int_equal(frozen, 2 * 2 * 3);   // 2 layers x 2 experts x (gate, up, down)
    assert_true(trained > 0);
    free(before);
    trainer_free(t);
    config_free(&cfg);
}

// One step with the batch in one micro-batch and in two: OLMo divides each micro-batch's loss sum
// by the whole batch's tokens, so (CE only) the gradient, the loss and the update are the same
// up to float rounding.
static void test_grad_accumulation_matches_one_batch(void **state) {
    (void)state;
    TrainConfig one, two;
    load_config(&one, "one", "");
    load_config(&two, "two", "");
    one.moe_loss_weight = two.moe_loss_weight = 0;
    one.moe_zloss_weight = two.moe_zloss_weight = 0;
    one.softmax_auxiliary_loss = two.softmax_auxiliary_loss = false;
    two.device_train_microbatch_size = 4;
    Trainer *a = create(&one), *b = create(&two);
    StepMetrics ma, mb;
    assert_int_equal(trainer_step(a, &ma), SPES_OK);
    assert_int_equal(trainer_step(b, &mb), SPES_OK);
    assert_float_equal(ma.loss.ce, mb.loss.ce, 1e-6);
    assert_float_equal(ma.grad_norm, mb.grad_norm, 1e-6 * ma.grad_norm);
    // Step 1 of a linear warm-up over 2 steps from 0.1*lr: 0.1*lr + 0.9*lr/2.
    assert_float_equal(ma.lr, 1e-2 * (0.1 + 0.9 * 0.5), 1e-15);
    assert_int_equal(ma.tokens_seen, 8 * 32);
    const Model *pa = trainer_model(a), *pb = trainer_model(b);
    double worst = 0;
    for (size_t i = 0; i < pa->table.total_numel; i++) worst = fmax(worst, fabs(pa->params[i] - pb->params[i]));
    assert_true(worst < 1e-2 * 1e-3);   // << one Adam step (~lr)
    trainer_free(a);
    trainer_free(b);
    config_free(&one);
    config_free(&two);
}

// Three steps of two runs of the tiny config from the same init; true when the weights end
// bit-identical. `tweak_b` changes b's loaded config (NULL: none).
static bool same_weights_after_steps(const char *extra_a, const char *extra_b, void (*tweak_b)(TrainConfig *)) {
    static int runs;
    char fa[32], fb[32];
    snprintf(fa, sizeof fa, "same%da", runs);
    snprintf(fb, sizeof fb, "same%db", runs++);
    TrainConfig a_cfg, b_cfg;
    load_config(&a_cfg, fa, extra_a);
    load_config(&b_cfg, fb, extra_b);
    if (tweak_b) tweak_b(&b_cfg);
    Trainer *a = create(&a_cfg), *b = create(&b_cfg);
    StepMetrics sm;
    for (int s = 0; s < 3; s++) {
        assert_int_equal(trainer_step(a, &sm), SPES_OK);
        assert_int_equal(trainer_step(b, &sm), SPES_OK);
    }
    const Model *ma = trainer_model(a), *mb = trainer_model(b);
    bool same = memcmp(ma->params, mb->params, ma->table.total_numel * sizeof(float)) == 0;
    trainer_free(a);
    trainer_free(b);
    config_free(&a_cfg);
    config_free(&b_cfg);
    return same;
}

static void beta1_08(TrainConfig *cfg) { cfg->adamw.beta1 = 0.8; }
static void half_lr(TrainConfig *cfg) { cfg->learning_rate *= 0.5; }   // exact: the schedule's steps scale by 2^-1

// spes_config.beta1 is optimizer.betas' beta1 on a peer and nothing on a centralised run; the
// same for spes_config.lr_scale and the learning rate (so one config file trains both sides).
static void test_peer_optimizer_keys(void **state) {
    (void)state;
#define PEER "using_spes: true\nspes_config: {num_peers: 2, peer_id: 1"
    assert_true(same_weights_after_steps(PEER ", beta1: 0.8}\n", PEER "}\n", beta1_08));
    assert_false(same_weights_after_steps(PEER ", beta1: 0.8}\n", PEER "}\n", NULL));   // the key does something
    assert_true(same_weights_after_steps(PEER ", lr_scale: 0.5}\n", PEER "}\n", half_lr));
    assert_false(same_weights_after_steps(PEER ", lr_scale: 0.5}\n", PEER "}\n", NULL));
    assert_true(same_weights_after_steps("using_dilico: true\nspes_config: {beta1: 0.8}\n", "using_dilico: true\n",
                                         beta1_08));
#undef PEER
    assert_true(same_weights_after_steps("spes_config: {beta1: 0.8, lr_scale: 0.5}\n", "", NULL));   // centralised
}

// The decayed auxiliary loss scales each expert's count in the load-balancing term: with
// every factor 2 the same first batch has exactly twice the lb loss.
static void test_lb_count_factor(void **state) {
    (void)state;
    TrainConfig cfg1, cfg2;
    load_config(&cfg1, "lb1", "");
    load_config(&cfg2, "lb2", "");
    float factor[2 * 4];
    for (int i = 0; i < 8; i++) factor[i] = 2.0f;
    TrainerOptions with_factor = {.peak_flops = 1e9, .lb_count_factor = factor};
    Trainer *a = create(&cfg1), *b;
    if (trainer_create(&cfg2, &with_factor, &b) != SPES_OK) fail_msg("%s", spes_last_error());
    StepMetrics ma, mb;
    assert_int_equal(trainer_step(a, &ma), SPES_OK);
    assert_int_equal(trainer_step(b, &mb), SPES_OK);
    assert_true(ma.loss.lb > 0);
    assert_float_equal(mb.loss.lb, 2 * ma.loss.lb, 1e-6 * ma.loss.lb);
    assert_float_equal(mb.loss.ce, ma.loss.ce, 0);
    trainer_free(a);
    trainer_free(b);
    config_free(&cfg1);
    config_free(&cfg2);
}

// 8 instances of 32 ids with no run of 8 except a token x8 in instances masked[0..n) (the
// filter, repetition_max_count 8, masks those), written as dir/repeats_<folder>.npy; the config
// (save folder `folder`) trains on it with the filter on, 2 micro-batches of 4 and the LM z-loss.
static void load_repeats_config(TrainConfig *cfg, const char *folder, const int *masked, int n) {
    char path[160];
    snprintf(path, sizeof path, "%s/repeats_%s.npy", dir, folder);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 8 * 32; i++) {
        int inst = i / 32, t = i % 32;
        uint16_t id = (uint16_t)((i * 7 + i / 5) % 64);
        for (int k = 0; k < n; k++)
            if (inst == masked[k] && t >= 4 && t < 12) id = 9;
        fwrite(&id, 2, 1, f);
    }
    fclose(f);
    load_config(cfg, folder, "softmax_auxiliary_loss: true\n");
    cfg->device_train_microbatch_size = 4;
    free(cfg->data.paths[0]);
    cfg->data.paths[0] = strdup(path);
    cfg->data.instance_filter = (InstanceFilterConfig){.enabled = true, .max_period = 13, .min_period = 1, .max_count = 8};
}

// OLMo's normalisation: a step's ce (and LM z-loss) is the batch's cross-entropy SUM divided by
// the batch's token count, instances x seq_len, counting each row's last position (no target)
// and the instances the instance filter masks. Two of the 8 instances are masked: the step's
// figures equal a forward over the same batch, its mean scaled by targets / (8 x 32), with
// 6 x 31 targets.
static void test_ce_divided_by_batch_tokens(void **state) {
    (void)state;
    TrainConfig cfg;
    load_repeats_config(&cfg, "norm", (const int[]){2, 5}, 2);
    Trainer *t = create(&cfg);
    TokenDataset *ds;
    DataLoader *dl;
    assert_int_equal(loader_open_train(&cfg, &ds, &dl), SPES_OK);   // the batch the trainer will read
    const Batch *b;
    assert_int_equal(loader_next(dl, &b), SPES_OK);
    LossValues mean;
    assert_int_equal(model_forward(trainer_model(t), b->inputs, b->targets, 8, 32, NULL, &mean, NULL), SPES_OK);
    assert_int_equal(mean.num_targets, 6 * 31);
    StepMetrics sm;
    assert_int_equal(trainer_step(t, &sm), SPES_OK);
    assert_true(sm.instance_filter);
    assert_int_equal(sm.masked_instances, 2);
    double share = (double)mean.num_targets / (8 * 32);
    assert_float_equal(sm.loss.ce, mean.ce * share, 1e-6 * mean.ce);
    assert_float_equal(sm.loss.lm_z, mean.lm_z * share, 1e-6 * mean.lm_z);
    loader_free(dl);
    token_dataset_close(ds);
    trainer_free(t);
    config_free(&cfg);
}

// The gradient of that normalisation: with both masked instances in the first of 2 micro-
// batches, every kept token still weighs 1 / (8 x 32), so the step equals the same batch in one
// micro-batch (CE and LM z-loss only), where a mean per micro-batch would weigh the first
// micro-batch's 2 kept instances like the second's 4.
static void test_masked_micro_batch_weighs_tokens(void **state) {
    (void)state;
    uint32_t perm[8];
    pcg64_permutation(1, perm, 8);   // data.seed 1, epoch 0: the batch's order
    TrainConfig one, two;
    const int masked[2] = {(int)perm[0], (int)perm[1]};   // rows 0 and 1: the first micro-batch
    load_repeats_config(&one, "one_micro", masked, 2);
    load_repeats_config(&two, "two_micro", masked, 2);
    one.device_train_microbatch_size = 8;
    one.moe_loss_weight = two.moe_loss_weight = 0;
    one.moe_zloss_weight = two.moe_zloss_weight = 0;
    Trainer *a = create(&one), *b = create(&two);
    StepMetrics ma, mb;
    assert_int_equal(trainer_step(a, &ma), SPES_OK);
    assert_int_equal(trainer_step(b, &mb), SPES_OK);
    assert_int_equal(ma.masked_instances, 2);
    assert_int_equal(mb.masked_instances, 2);
    assert_float_equal(ma.loss.ce, mb.loss.ce, 1e-6 * ma.loss.ce);
    assert_float_equal(ma.grad_norm, mb.grad_norm, 1e-5 * ma.grad_norm);
    trainer_free(a);
    trainer_free(b);
    config_free(&one);
    config_free(&two);
}

static void test_refuses_used_save_folder(void **state) {
    (void)state;
    TrainConfig cfg;
    load_config(&cfg, "used", "");
    Trainer *t = create(&cfg);
    assert_int_equal(trainer_run(t), SPES_OK);   // 4 steps, final checkpoint step4
    assert_int_equal(trainer_step_count(t), 4);
    trainer_free(t);
    TrainerOptions opt = {.peak_flops = 1e9};
    assert_int_equal(trainer_create(&cfg, &opt, &t), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "already holds checkpoints"));
    // load_path that is not a model directory: an error naming it.
    TrainConfig bad;
    char extra[160];
    snprintf(extra, sizeof extra, "load_path: %s/no_such_model\n", dir);
    load_config(&bad, "bad", extra);
    assert_int_equal(trainer_create(&bad, &opt, &t), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "no_such_model"));
    config_free(&bad);
    opt.resume = true;   // resuming a finished run: nothing left to do, no error
    if (trainer_create(&cfg, &opt, &t) != SPES_OK) fail_msg("%s", spes_last_error());
    assert_int_equal(trainer_step_count(t), 4);
    assert_int_equal(trainer_run(t), SPES_OK);
    trainer_free(t);
    config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spes_mask_freezes_other_experts),
        cmocka_unit_test(test_grad_accumulation_matches_one_batch),
        cmocka_unit_test(test_peer_optimizer_keys),
        cmocka_unit_test(test_lb_count_factor),
        cmocka_unit_test(test_ce_divided_by_batch_tokens),
        cmocka_unit_test(test_masked_micro_batch_weighs_tokens),
        cmocka_unit_test(test_refuses_used_save_folder),
    };
    return cmocka_run_group_tests(tests, make_data, remove_data);
}
