// The config `spes demo` writes (src/demo/demo_config.c): loaded back with config_load, every
// value it spells is the one the demo asked for. The shape's numbers are all different, so
// a value written under the wrong key shows.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/file.h"
#include "cli/cli_parse.h"
#include "config/config.h"
#include "demo/demo_config.h"

static char root[64];

static int make_dir(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/spes_demo_config_test_XXXXXX");
    assert_non_null(mkdtemp(root));
    return 0;
}

static int remove_dir(void **state) {
    (void)state;
    remove_tree(root);
    return 0;
}

static void load(const char *path, const char *peer_override, TrainConfig *cfg) {
    char *over[] = {(char *)peer_override};
    if (config_load(path, peer_override ? 1 : 0, over, cfg) != SPES_OK) fail_msg("%s", spes_last_error());
}

static void assert_path(const char *got, const char *dir, const char *name) {
    char want[4200];
    snprintf(want, sizeof want, "%s/%s", dir, name);
    assert_string_equal(got, want);
}

// Every key demo.yaml spells, as config_load reads it back, for the run in `dir`.
static void check_config(const TrainConfig *cfg, const DemoRunShape *s, const char *dir, int peer_id) {
    assert_null(cfg->unknown_keys);
    assert_string_equal(cfg->run_name, "spes-demo");
    assert_int_equal(cfg->seed, 6198);

    const ModelConfig *m = &cfg->model;
    assert_int_equal(m->d_model, 128);
    assert_int_equal(m->n_heads, 4);
    assert_int_equal(m->n_kv_heads, 4);
    assert_int_equal(m->head_dim, 32);
    assert_int_equal(m->n_layers, 2);
    assert_int_equal(m->expert_hidden, 128);   // mlp_hidden_size 256 / 2
    assert_int_equal(m->max_seq_len, 128);
    assert_int_equal(m->vocab_size, 257);
    assert_int_equal(m->embedding_size, 264);
    assert_int_equal(m->eos_token_id, 256);
    assert_int_equal(m->pad_token_id, 256);
    assert_float_equal(m->rope_theta, 10000.0f, 0.0f);
    assert_float_equal(m->norm_eps, 1e-6f, 0.0f);
    assert_int_equal(m->qk_norm, QK_NORM_FULL);
    assert_int_equal(m->num_experts, s->experts ? s->experts : s->peers * s->experts_per_peer);
    assert_int_equal(m->top_k, 2);
    assert_float_equal(cfg->moe_loss_weight, 0.01f, 0.0f);
    assert_float_equal(cfg->moe_zloss_weight, 0.001f, 0.0f);
    assert_float_equal(m->init_std, 0.02f, 0.0f);
    assert_float_equal(m->init_cutoff_factor, 3.0f, 0.0f);
    assert_true(cfg->softmax_auxiliary_loss);
    assert_float_equal(cfg->auxiliary_loss_multiplier, 1e-4f, 0.0f);

    assert_float_equal(cfg->learning_rate, 3e-3, 0.0);
    assert_float_equal(cfg->adamw.beta1, 0.9, 0.0);
    assert_float_equal(cfg->adamw.beta2, 0.95, 0.0);
    assert_float_equal(cfg->adamw.eps, 1e-8, 0.0);
    assert_float_equal(cfg->adamw.weight_decay, 0.1, 0.0);
    assert_int_equal(cfg->schedule.kind, SCHEDULE_COSINE_WITH_WARMUP);
    assert_int_equal(cfg->schedule.t_warmup, s->steps / 10 > 1 ? s->steps / 10 : 1);
    assert_float_equal(cfg->schedule.alpha_f, 0.1, 0.0);

    assert_int_equal(cfg->data.n_paths, 1);
    assert_path(cfg->data.paths[0], dir, "train.bin");
    assert_int_equal(cfg->data.memmap_dtype, MEMMAP_UINT16);
    assert_int_equal(cfg->data.seed, 6198);
    assert_true(cfg->data.drop_last);
    assert_int_equal(cfg->n_evaluators, 1);
    assert_string_equal(cfg->evaluators[0].label, "val");
    assert_int_equal(cfg->evaluators[0].n_paths, 1);
    assert_path(cfg->evaluators[0].paths[0], dir, "val.bin");

    assert_int_equal(cfg->max_duration, s->steps);
    assert_int_equal(cfg->max_duration_unit, DURATION_STEPS);
    assert_int_equal(cfg->global_train_batch_size, s->batch);
    assert_int_equal(cfg->device_train_microbatch_size, s->batch);
    assert_float_equal(cfg->max_grad_norm, 1.0, 0.0);
    char peer_dir[32];
    snprintf(peer_dir, sizeof peer_dir, "peer%d", peer_id);
    assert_path(cfg->save_folder, dir, peer_dir);
    assert_int_equal(cfg->save_interval_unsharded, s->steps);
    assert_int_equal(cfg->save_num_unsharded_checkpoints_to_keep, 1);
    assert_false(cfg->try_load_latest_save);
    assert_int_equal(cfg->console_log_interval, 10);
    assert_int_equal(cfg->eval_interval, s->steps);
    assert_int_equal(cfg->threads, s->threads_per_peer);

    assert_true(cfg->using_spes);
    assert_false(cfg->using_dilico);
    assert_int_equal(cfg->num_peers, s->peers);
    assert_int_equal(cfg->peer_id, peer_id);
    assert_int_equal(cfg->num_train_experts_per_node, s->experts_per_peer);
    assert_int_equal(cfg->sync_steps, s->sync_steps);
    assert_string_equal(cfg->server_addr, "127.0.0.1:50051");
    assert_true(cfg->using_decayed_aux_loss);
    assert_float_equal(cfg->outer_lr, s->outer_lr > 0 ? s->outer_lr : 1.0f, 0.0f);
    assert_float_equal(cfg->outer_momentum, s->outer_momentum, 0.0f);
    assert_int_equal(cfg->sync_warmup_steps, s->sync_warmup_steps);
    assert_int_equal(cfg->sync_warmup_every, s->sync_warmup_every > 0 ? s->sync_warmup_every : 1);
    assert_float_equal(cfg->lr_scale, s->lr_scale > 0 ? s->lr_scale : 1.0, 0.0);
    assert_true(cfg->peer_beta1 == (s->peer_beta1 > 0 ? s->peer_beta1 : -1));   // -1: null, optimizer.betas'
    const char *payload = s->payload ? s->payload : "f32";
    assert_int_equal(cfg->payload_dtype, !strcmp(payload, "int8")   ? PAYLOAD_INT8
                                         : !strcmp(payload, "int4") ? PAYLOAD_INT4
                                         : !strcmp(payload, "bf16") ? PAYLOAD_BF16
                                                                    : PAYLOAD_F32);
}

static void write_and_check(const DemoRunShape *s, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/demo.yaml", dir);
    if (demo_config_write(s, dir, path) != SPES_OK) fail_msg("%s", spes_last_error());
    TrainConfig cfg;
    load(path, NULL, &cfg);
    check_config(&cfg, s, dir, 0);
    config_free(&cfg);
    // What the demo runs: every peer is the same file with its peer_id on the command line.
    for (int p = 0; p < s->peers; p++) {
        char over[64];
        snprintf(over, sizeof over, "--spes_config.peer_id=%d", p);
        load(path, over, &cfg);
        check_config(&cfg, s, dir, p);
        config_free(&cfg);
    }
}

static void test_every_value_loads_back(void **state) {
    (void)state;
    DemoRunShape s = {.peers = 3, .experts_per_peer = 5, .steps = 70, .sync_steps = 9, .batch = 6,
                      .threads_per_peer = 2, .outer_lr = 1.25f, .outer_momentum = 0.5f, .sync_warmup_steps = 18,
                      .sync_warmup_every = 3, .lr_scale = 1.7, .peer_beta1 = 0.85, .payload = "int8"};
    write_and_check(&s, root);
}

// The defaults of `spes demo` (4 peers x 2 experts, 2000 steps, sync every 10) and a run so short
// that the warm-up is held at one step.
static void test_demo_defaults_and_short_run(void **state) {
    (void)state;
    DemoRunShape d = {.peers = 4, .experts_per_peer = 2, .steps = 2000, .sync_steps = 10, .batch = 8,
                      .threads_per_peer = 1};
    write_and_check(&d, root);
    DemoRunShape tiny = {.peers = 2, .experts_per_peer = 3, .steps = 4, .sync_steps = 2, .batch = 1,
                         .threads_per_peer = 5};
    write_and_check(&tiny, root);
    DemoRunShape replicas = {.peers = 4, .experts_per_peer = 4, .experts = 8, .steps = 1000, .sync_steps = 5,
                             .batch = 8, .threads_per_peer = 1};   // 2 owners per expert
    write_and_check(&replicas, root);
}

// The demo's numbers are written as the shortest text that reads back exactly: lr_scale 0.7 is the
// double 0.7 (what `--spes_config.lr_scale=0.7` or `--lr_scale 0.7` gives), not the float 0.7f
// widened (0.69999998807907104), which made `spes demo` and bench-quality rows that pass
// --spes_config.lr_scale=0.7 two different runs; the outer pair reads back as the same floats.
static void test_numbers_read_back_exactly(void **state) {
    (void)state;
    double lr_scale = 0;
    assert_int_equal(cli_double("--lr_scale", "0.7", 1e-3, 100, &lr_scale), SPES_OK);
    assert_true(lr_scale == 0.7);
    assert_int_equal(cli_double("--lr_scale", "0.7x", 1e-3, 100, &lr_scale), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "--lr_scale: '0.7x' is not a number"));
    assert_int_equal(cli_double("--lr_scale", "1000", 1e-3, 100, &lr_scale), SPES_ERR);
    DemoRunShape s = {.peers = 4, .experts_per_peer = 2, .steps = 1000, .sync_steps = 5, .batch = 8,
                      .threads_per_peer = 1, .outer_lr = 0.7f, .outer_momentum = 0.9f, .lr_scale = 0.7,
                      .payload = "int8"};
    write_and_check(&s, root);
    char path[4200];
    snprintf(path, sizeof path, "%s/demo.yaml", root);
    uint8_t *text = NULL;
    size_t len = 0;
    assert_int_equal(file_read_all(path, &text, &len), SPES_OK);
    text = realloc(text, len + 1);
    text[len] = 0;
    assert_non_null(strstr((char *)text, "  lr_scale: 0.7\n"));
    assert_non_null(strstr((char *)text, "  outer_lr: 0.7\n"));
    assert_non_null(strstr((char *)text, "  outer_momentum: 0.9\n"));
    free(text);
    TrainConfig from_file, overridden;
    load(path, NULL, &from_file);
    load(path, "--spes_config.lr_scale=0.7", &overridden);
    assert_true(from_file.lr_scale == 0.7);
    assert_true(from_file.lr_scale == overridden.lr_scale);
    assert_true(from_file.outer_lr == 0.7f && from_file.outer_momentum == 0.9f);
    config_free(&from_file);
    config_free(&overridden);
}

// An output folder whose name YAML would misread unquoted (space, ': ', '#', quotes, '[').
static void test_awkward_folder_name(void **state) {
    (void)state;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/out: #1 \"q\" 'x' [y] \\z", root);
    assert_int_equal(mkdir_p(dir), SPES_OK);
    DemoRunShape s = {.peers = 2, .experts_per_peer = 4, .steps = 30, .sync_steps = 7, .batch = 3,
                      .threads_per_peer = 1};
    write_and_check(&s, dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_value_loads_back),
        cmocka_unit_test(test_demo_defaults_and_short_run),
        cmocka_unit_test(test_awkward_folder_name),
        cmocka_unit_test(test_numbers_read_back_exactly),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
