// Config loading: the SPES reference configs and our committed copies load with the values
// they spell; overrides, interpolation, defaults, unknown keys, hash, YAML round trip.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "config/config_internal.h"   // config_write_values: what the hash reads
#include "config/config.h"
#include "sync/expert_owners.h"

// ../shared/reference/configs, found from $SPES_TEST_DATA (default ../shared/data).
static const char *reference_dir(void) {
    static char dir[4096];
    const char *data = getenv("SPES_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/../reference/configs", data && data[0] ? data : "../shared/data");
    return dir;
}

static int load_reference(const char *name, int n_over, char **over, TrainConfig *cfg) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", reference_dir(), name);
    if (access(path, R_OK) != 0) return 77;
    int rc = config_load(path, n_over, over, cfg);
    if (rc != SPES_OK) fail_msg("%s: %s", name, spes_last_error());
    return rc;
}

static void test_reference_spes_1b(void **state) {
    (void)state;
    TrainConfig cfg;
    int rc = load_reference("spes_moe_1b_4nodes_node_0.yaml", 0, NULL, &cfg);
    if (rc == 77) skip();
    const ModelConfig *m = &cfg.model;
    assert_int_equal(m->d_model, 768);
    assert_int_equal(m->n_heads, 12);
    assert_int_equal(m->n_kv_heads, 12);
    assert_int_equal(m->head_dim, 64);
    assert_int_equal(m->n_layers, 12);
    assert_int_equal(m->expert_hidden, 2048);   // mlp_hidden_size 4096 / 2
    assert_int_equal(m->vocab_size, 151665);
    assert_int_equal(m->embedding_size, 151665);
    assert_int_equal(m->max_seq_len, 2048);
    assert_int_equal(m->qk_norm, QK_NORM_FULL);
    assert_int_equal(m->num_experts, 16);
    assert_int_equal(m->top_k, 2);
    assert_false(m->normalize_expert_weights);
    assert_float_equal(m->rope_theta, 500000.0f, 0.0f);
    assert_float_equal(m->norm_eps, 1e-6f, 0.0f);
    assert_float_equal(m->init_cutoff_factor, 3.0f, 0.0f);
    assert_int_equal(m->eos_token_id, 151643);
    assert_float_equal(cfg.moe_loss_weight, 0.01f, 0.0f);
    assert_float_equal(cfg.moe_zloss_weight, 0.001f, 0.0f);
    assert_true(cfg.softmax_auxiliary_loss);
    assert_float_equal(cfg.auxiliary_loss_multiplier, 1e-5f, 0.0f);
    assert_float_equal(cfg.learning_rate, 5e-4, 0.0);
    assert_float_equal(cfg.adamw.beta1, 0.9, 0.0);
    assert_float_equal(cfg.adamw.beta2, 0.95, 0.0);
    assert_float_equal(cfg.adamw.eps, 1e-8, 0.0);
    assert_float_equal(cfg.adamw.weight_decay, 0.1, 0.0);
    assert_true(cfg.adamw.decay_norm_and_bias);
    assert_true(cfg.adamw.decay_embeddings);
    assert_int_equal(cfg.schedule.kind, SCHEDULE_COSINE_WITH_WARMUP);
    assert_int_equal(cfg.schedule.t_warmup, 2000);
    assert_int_equal(cfg.schedule.t_max, 50000);
    assert_float_equal(cfg.schedule.alpha_f, 0.1, 0.0);
    assert_int_equal(cfg.max_duration, 50000);
    assert_int_equal(cfg.max_duration_unit, DURATION_STEPS);
    assert_int_equal(cfg.stop_at, 50000);
    assert_int_equal(cfg.global_train_batch_size, 1024);
    assert_int_equal(cfg.device_train_microbatch_size, 8);
    assert_int_equal(config_grad_accum_steps(&cfg), 128);
    assert_float_equal(cfg.max_grad_norm, 1.0, 0.0);
    assert_string_equal(cfg.save_folder, "output/spes_moe_1b_slimpajama_100b_tokens_bsz256_4nodes/node0");
    assert_int_equal(cfg.save_interval_unsharded, 5000);
    assert_int_equal(cfg.save_num_unsharded_checkpoints_to_keep, 5);
    assert_null(cfg.load_path);
    assert_int_equal(cfg.eval_interval, 2500);
    assert_int_equal(cfg.n_evaluators, 0);   // all downstream
    assert_int_equal(cfg.data.memmap_dtype, MEMMAP_UINT32);
    assert_int_equal(cfg.data.seed, 6198);
    assert_true(cfg.data.drop_last);
    assert_true(cfg.data.n_paths > 1000);
    assert_string_equal(cfg.data.paths[0], "data/SlimPajama-627B/030_000012.npy");
    const InstanceFilterConfig *f = &cfg.data.instance_filter;
    assert_true(f->enabled);
    assert_int_equal(f->max_period, 13);
    assert_int_equal(f->min_period, 1);
    assert_int_equal(f->max_count, 32);
    assert_true(cfg.using_spes);
    assert_false(cfg.using_dilico);
    assert_int_equal(cfg.num_peers, 4);
    assert_int_equal(cfg.peer_id, 0);
    assert_int_equal(cfg.num_train_experts_per_node, 4);
    assert_int_equal(cfg.sync_steps, 100);
    assert_string_equal(cfg.server_addr, "127.0.0.1:50051");
    assert_null(cfg.unknown_keys);   // every key of the seeds' config is known
    config_free(&cfg);
}

static void test_reference_3b_norm_router(void **state) {
    (void)state;
    TrainConfig cfg;
    if (load_reference("spes_moe_3b_9b_4nodes_norm_router.yaml", 0, NULL, &cfg) == 77) skip();
    assert_int_equal(cfg.model.d_model, 2048);
    assert_int_equal(cfg.model.expert_hidden, 6 * 2048 / 2);   // mlp_ratio 6
    assert_int_equal(cfg.model.n_kv_heads, 8);
    assert_int_equal(cfg.model.head_dim, 128);
    assert_int_equal(cfg.model.qk_norm, QK_NORM_HEAD);
    assert_true(cfg.model.normalize_expert_weights);
    assert_int_equal(cfg.model.embedding_size, 151936);
    assert_int_equal(cfg.num_peers, 8);
    assert_int_equal(cfg.num_train_experts_per_node, 2);
    assert_false(cfg.using_decayed_aux_loss);
    assert_int_equal(cfg.device_train_microbatch_size, 1);
    assert_null(cfg.unknown_keys);
    // 8 peers x 2 of 8 experts: 4 groups, every expert owned by 2 peers (p and p + 4). Peer 5 loads
    // (before replicas it was refused: "would own experts [10, 12)") and trains experts 2 and 3.
    assert_int_equal(expert_replicas(cfg.num_peers, 2, cfg.model.num_experts), 2);
    for (int p = 0; p < 8; p++) {
        assert_int_equal(expert_first_owned(p, 2, 8), 2 * (p % 4));
        for (int e = 0; e < 8; e++) assert_int_equal(expert_owned_by(e, p, 2, 8), e / 2 == p % 4);
    }
    config_free(&cfg);
    char *peer5[] = {"--spes_config.peer_id=5"};
    if (load_reference("spes_moe_3b_9b_4nodes_norm_router.yaml", 1, peer5, &cfg) == 77) skip();
    assert_int_equal(cfg.peer_id, 5);
    assert_int_equal(expert_first_owned(cfg.peer_id, cfg.num_train_experts_per_node, cfg.model.num_experts), 2);
    config_free(&cfg);
}

// OLMo's sharded save_interval stands in for save_interval_unsharded when that is unset (the 3B
// config sets only save_interval: one save at the end otherwise), with its keep count.
static void test_save_interval_stands_in(void **state) {
    (void)state;
    TrainConfig cfg;
    if (load_reference("spes_moe_3b_9b_4nodes_norm_router.yaml", 0, NULL, &cfg) == 77) skip();
    assert_int_equal(cfg.save_interval_unsharded, 1000);
    assert_int_equal(cfg.save_num_unsharded_checkpoints_to_keep, 2);
    config_free(&cfg);
    // The 1B config sets both: its save_interval_unsharded (5000, keep 5) stays.
    if (load_reference("spes_moe_1b_4nodes_node_0.yaml", 0, NULL, &cfg) == 77) skip();
    assert_int_equal(cfg.save_interval_unsharded, 5000);
    assert_int_equal(cfg.save_num_unsharded_checkpoints_to_keep, 5);
    config_free(&cfg);
    // A keep count given for the unsharded checkpoints wins over the sharded one.
    assert_int_equal(config_load_string("save_interval: 20\nsave_num_checkpoints_to_keep: 3\n"
                                        "save_num_unsharded_checkpoints_to_keep: 7\n", "k.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.save_interval_unsharded, 20);
    assert_int_equal(cfg.save_num_unsharded_checkpoints_to_keep, 7);
    config_free(&cfg);
    // Neither: the final save alone, as before.
    assert_int_equal(config_load_string("", "none.yaml", 0, NULL, &cfg), SPES_OK);
    assert_true(cfg.save_interval_unsharded <= 0);
    config_free(&cfg);
    // The sharded keep count must be one the checkpoints can have when it is used.
    assert_int_equal(config_load_string("save_interval: 20\nsave_num_checkpoints_to_keep: 0\n", "zero.yaml", 0, NULL, &cfg),
                     SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "zero.yaml:2"));
    assert_non_null(strstr(spes_last_error(), "save_num_checkpoints_to_keep"));
}

// OLMo's default eos/pad (50256) with a smaller vocabulary: none, not an error; set, checked.
static void test_default_token_ids_small_vocab(void **state) {
    (void)state;
    TrainConfig cfg;
    const char *small = "model:\n  vocab_size: 64\n  embedding_size: 64\n";
    assert_int_equal(config_load_string(small, "small.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.model.eos_token_id, -1);
    assert_int_equal(cfg.model.pad_token_id, -1);
    config_free(&cfg);
    char *eos[] = {"--model.eos_token_id=63"};
    assert_int_equal(config_load_string(small, "small.yaml", 1, eos, &cfg), SPES_OK);
    assert_int_equal(cfg.model.eos_token_id, 63);
    config_free(&cfg);
    char *outside[] = {"--model.pad_token_id=64"};
    assert_int_equal(config_load_string(small, "small.yaml", 1, outside, &cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "model.pad_token_id"));
    // The defaults stay where the vocabulary holds them.
    assert_int_equal(config_load_string("", "big.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.model.eos_token_id, 50256);
    config_free(&cfg);
}

static void test_reference_dilico(void **state) {
    (void)state;
    TrainConfig cfg;
    if (load_reference("dilico_fedavg_moe_1b_node0.yaml", 0, NULL, &cfg) == 77) skip();
    assert_true(cfg.using_dilico);
    assert_true(cfg.using_spes);
    assert_int_equal(cfg.num_train_experts_per_node, 16);
    assert_int_equal(cfg.sync_steps, 50);
    assert_float_equal(cfg.model.rope_theta, 32000.0f, 0.0f);
    assert_null(cfg.unknown_keys);
    config_free(&cfg);
}

// The committed trimmed copy spells the same model/optimizer/schedule as the seeds' config.
static void test_trimmed_copy_matches_reference(void **state) {
    (void)state;
    TrainConfig trimmed, ref;
    assert_int_equal(config_load("configs/spes_moe_1b_trimmed.yaml", 0, NULL, &trimmed), SPES_OK);
    assert_int_equal(trimmed.data.n_paths, 4);
    assert_null(trimmed.unknown_keys);
    if (load_reference("spes_moe_1b_4nodes_node_0.yaml", 0, NULL, &ref) == 77) {
        config_free(&trimmed);
        skip();
    }
    assert_memory_equal(&trimmed.model, &ref.model, sizeof(ModelConfig));
    assert_memory_equal(&trimmed.adamw, &ref.adamw, sizeof(AdamWConfig));
    assert_memory_equal(&trimmed.schedule, &ref.schedule, sizeof(ScheduleConfig));
    assert_string_equal(trimmed.save_folder, ref.save_folder);
    config_free(&trimmed);
    config_free(&ref);
}

static void test_tiny_config(void **state) {
    (void)state;
    TrainConfig cfg;
    assert_int_equal(config_load("configs/tiny_shakespeare.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.model.vocab_size, 257);
    assert_int_equal(cfg.model.embedding_size, 264);
    assert_int_equal(cfg.model.expert_hidden, 128);
    assert_string_equal(cfg.save_folder, "output/tiny-shakespeare");
    assert_null(cfg.unknown_keys);
    config_free(&cfg);
}

// Overrides are applied before interpolation: peer_id reaches save_folder.
static void test_override_reaches_interpolation(void **state) {
    (void)state;
    TrainConfig cfg;
    char *over[] = {"--spes_config.peer_id=2", "--run_name", "myrun", "--optimizer.betas=[0.8, 0.99]",
                    "--load_path=ckpt/step10", "--max_duration=2e6T"};
    assert_int_equal(config_load("configs/spes_moe_1b_trimmed.yaml", 6, over, &cfg), SPES_OK);
    assert_int_equal(cfg.peer_id, 2);
    assert_string_equal(cfg.save_folder, "output/myrun/node2");
    assert_string_equal(cfg.run_name, "myrun");
    assert_float_equal(cfg.adamw.beta1, 0.8, 0.0);
    assert_float_equal(cfg.adamw.beta2, 0.99, 0.0);
    assert_string_equal(cfg.load_path, "ckpt/step10");
    assert_int_equal(cfg.max_duration, 2000000);
    assert_int_equal(cfg.max_duration_unit, DURATION_TOKENS);
    int64_t steps;
    assert_int_equal(config_max_steps(&cfg, -1, &steps), SPES_OK);
    assert_int_equal(steps, 1);   // ceil(2e6 / (1024 * 2048))
    config_free(&cfg);
}

// "null" on the command line unsets a key, as in the YAML file (it is not an empty config).
static void test_override_with_null(void **state) {
    (void)state;
    TrainConfig cfg;
    // (save_interval too: alone, it would stand in for save_interval_unsharded)
    char *over[] = {"--save_interval_unsharded=null", "--stop_at", "~", "--load_path=NULL", "--save_interval=null"};
    assert_int_equal(config_load("configs/spes_moe_1b_trimmed.yaml", 5, over, &cfg), SPES_OK);
    assert_true(cfg.save_interval_unsharded <= 0);
    assert_true(cfg.stop_at < 0);
    assert_null(cfg.load_path);
    config_free(&cfg);
}

static void test_defaults_are_olmo(void **state) {
    (void)state;
    TrainConfig cfg;
    assert_int_equal(config_load_string("", "empty.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.seed, 6198);
    assert_int_equal(cfg.data.seed, 6198);   // data.seed falls back to seed
    assert_float_equal(cfg.learning_rate, 1e-4, 0.0);
    assert_float_equal(cfg.adamw.eps, 1e-5, 0.0);
    assert_float_equal(cfg.adamw.weight_decay, 0.0, 0.0);
    assert_int_equal(cfg.schedule.kind, SCHEDULE_COSINE_WITH_WARMUP);
    assert_int_equal(cfg.schedule.t_warmup, 100);
    assert_int_equal(cfg.global_train_batch_size, 512);
    assert_int_equal(cfg.device_train_microbatch_size, 16);
    assert_int_equal(cfg.max_duration, 10000);
    assert_int_equal(cfg.model.max_seq_len, 1024);
    assert_int_equal(cfg.model.expert_hidden, 4 * 768 / 2);   // mlp_ratio 4
    assert_int_equal(cfg.model.qk_norm, QK_NORM_NONE);
    assert_float_equal(cfg.model.norm_eps, 1e-5f, 0.0f);
    assert_float_equal(cfg.moe_loss_weight, 0.1f, 0.0f);
    assert_int_equal(cfg.data.memmap_dtype, MEMMAP_UINT16);
    assert_false(cfg.data.drop_last);
    assert_int_equal(cfg.stop_at, -1);
    assert_string_equal(cfg.save_folder, "./");
    config_free(&cfg);
}

static void test_unknown_keys_collected(void **state) {
    (void)state;
    TrainConfig cfg;
    const char *yaml = "fooo: 1\nmodel:\n  d_model: 64\n  n_heads: 4\n  barr: 2\ncompile:\n  anything: [1, 2]\n";
    assert_int_equal(config_load_string(yaml, "u.yaml", 0, NULL, &cfg), SPES_OK);
    assert_non_null(cfg.unknown_keys);
    assert_non_null(strstr(cfg.unknown_keys, "fooo (u.yaml:1)"));
    assert_non_null(strstr(cfg.unknown_keys, "model.barr (u.yaml:5)"));
    assert_null(strstr(cfg.unknown_keys, "compile"));   // ignored section, not unknown
    config_free(&cfg);
}

static void test_evaluators(void **state) {
    (void)state;
    TrainConfig cfg;
    const char *yaml = "evaluators:\n"
                       "  - label: val\n"
                       "    data:\n"
                       "      paths: [a.npy, b.npy]\n"
                       "  - label: piqa\n"
                       "    type: downstream\n"
                       "  - label: arc\n"
                       "    type: downstream\n"
                       "    requests: eval/arc_easy_rc_0shot\n"
                       "    limit: 50\n"
                       "tokenizer:\n"
                       "  identifier: tok.json\n"
                       "  truncate_direction: right\n";
    assert_int_equal(config_load_string(yaml, "e.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(cfg.n_evaluators, 2);   // piqa (no requests: OLMo's built-in task) is skipped
    assert_string_equal(cfg.evaluators[0].label, "val");
    assert_int_equal(cfg.evaluators[0].n_paths, 2);
    assert_string_equal(cfg.evaluators[0].paths[1], "b.npy");
    assert_null(cfg.evaluators[0].requests);
    assert_string_equal(cfg.evaluators[1].label, "arc");
    assert_string_equal(cfg.evaluators[1].requests, "eval/arc_easy_rc_0shot");
    assert_int_equal(cfg.evaluators[1].limit, 50);
    assert_string_equal(cfg.tokenizer_identifier, "tok.json");
    // the resolved-YAML dump keeps them
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    config_write_yaml(&cfg, mem);
    fclose(mem);
    TrainConfig again;
    assert_int_equal(config_load_string(text, "dump.yaml", 0, NULL, &again), SPES_OK);
    assert_int_equal(again.n_evaluators, 2);
    assert_string_equal(again.evaluators[0].label, "val");
    assert_int_equal(again.evaluators[0].n_paths, 2);
    assert_string_equal(again.evaluators[1].requests, "eval/arc_easy_rc_0shot");
    assert_int_equal(again.evaluators[1].limit, 50);
    assert_string_equal(again.tokenizer_identifier, "tok.json");
    free(text);
    config_free(&again);
    config_free(&cfg);
}

static void test_max_duration_forms(void **state) {
    (void)state;
    TrainConfig cfg;
    const char *yaml = "max_duration: 3ep\nglobal_train_batch_size: 4\ndevice_train_microbatch_size: 2\n";
    assert_int_equal(config_load_string(yaml, "d.yaml", 0, NULL, &cfg), SPES_OK);
    int64_t steps;
    assert_int_equal(config_max_steps(&cfg, 10, &steps), SPES_OK);
    assert_int_equal(steps, 3 * (10 / 4));
    assert_int_equal(config_max_steps(&cfg, -1, &steps), SPES_ERR);
    config_free(&cfg);
    // Epochs x steps per epoch past int64: an error naming max_duration, not a wrapped count (this
    // one wrapped to 4 steps and trained them; a larger one showed as "the decay ends at step -8e18").
    yaml = "max_duration: 1844674407370955162ep\nglobal_train_batch_size: 4\ndevice_train_microbatch_size: 2\n";
    assert_int_equal(config_load_string(yaml, "d.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(config_max_steps(&cfg, 40, &steps), SPES_ERR);
    // ... at the line that set it, as the loader's errors read (it used to carry no file:line).
    if (!strstr(spes_last_error(), "d.yaml:1: max_duration: 1844674407370955162ep of 10 steps each is more steps"))
        fail_msg("message: %s", spes_last_error());
    config_free(&cfg);
    char *over[1] = {"--max_duration=2ep"};
    assert_int_equal(config_load_string(yaml, "d.yaml", 1, over, &cfg), SPES_OK);
    assert_int_equal(config_max_steps(&cfg, 3, &steps), SPES_ERR);
    if (!strstr(spes_last_error(), "command line --max_duration: 2ep: the dataset (3 instances) holds less than one "
                                   "global batch (4)"))
        fail_msg("message: %s", spes_last_error());
    config_free(&cfg);
    // Tokens near the top of int64: rounded up without overflowing.
    yaml = "max_duration: 9000000000000000000T\nglobal_train_batch_size: 2147483647\ndevice_train_microbatch_size: 1\n"
           "model:\n  max_sequence_length: 2147483647\n";
    assert_int_equal(config_load_string(yaml, "d.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(config_max_steps(&cfg, -1, &steps), SPES_OK);
    assert_int_equal(steps, 2);   // 9e18 / (2^31-1)^2 = 1.95...
    config_free(&cfg);
}

// The hash covers the semantics, not the run control; the YAML dump reloads to the same hash.
static void test_hash_and_round_trip(void **state) {
    (void)state;
    TrainConfig a, b, c;
    assert_int_equal(config_load("configs/spes_moe_1b_trimmed.yaml", 0, NULL, &a), SPES_OK);
    char *over_folder[] = {"--save_folder=/elsewhere", "--console_log_interval=7", "--stop_at=10"};
    assert_int_equal(config_load("configs/spes_moe_1b_trimmed.yaml", 3, over_folder, &b), SPES_OK);
    assert_true(config_hash(&a) == config_hash(&b));
    config_free(&b);
    char *over_lr[] = {"--optimizer.learning_rate=4e-4"};
    assert_int_equal(config_load("configs/spes_moe_1b_trimmed.yaml", 1, over_lr, &b), SPES_OK);
    assert_true(config_hash(&a) != config_hash(&b));
    config_free(&b);

    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    config_write_yaml(&a, mem);
    fclose(mem);
    assert_int_equal(config_load_string(text, "dump.yaml", 0, NULL, &c), SPES_OK);
    assert_true(config_hash(&a) == config_hash(&c));
    assert_memory_equal(&a.model, &c.model, sizeof(ModelConfig));
    assert_string_equal(a.save_folder, c.save_folder);
    assert_null(c.unknown_keys);
    free(text);
    config_free(&a);
    config_free(&c);
}

// data.instance_filter: off by default and then not in the hash (configs written before the key
// existed keep their hash: checkpoints resume); on, hashed; OLMo's defaults for fields left out;
// overrides reach single fields or turn it off; the YAML dump reads back the same.
static void test_instance_filter(void **state) {
    (void)state;
    TrainConfig plain, on, dump;
    assert_int_equal(config_load_string("", "plain.yaml", 0, NULL, &plain), SPES_OK);
    assert_false(plain.data.instance_filter.enabled);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    config_write_values(&plain, mem, CONFIG_LINES_HASHED);
    fclose(mem);
    assert_null(strstr(text, "instance_filter"));
    free(text);

    assert_int_equal(config_load_string("data:\n  instance_filter:\n    repetition_max_count: 8\n", "on.yaml", 0, NULL, &on),
                     SPES_OK);
    assert_true(on.data.instance_filter.enabled);
    assert_int_equal(on.data.instance_filter.max_period, 13);
    assert_int_equal(on.data.instance_filter.min_period, 1);
    assert_int_equal(on.data.instance_filter.max_count, 8);
    assert_true(config_hash(&on) != config_hash(&plain));
    text = NULL;
    mem = open_memstream(&text, &len);
    config_write_yaml(&on, mem);
    fclose(mem);
    assert_int_equal(config_load_string(text, "dump.yaml", 0, NULL, &dump), SPES_OK);
    assert_memory_equal(&dump.data.instance_filter, &on.data.instance_filter, sizeof(InstanceFilterConfig));
    assert_true(config_hash(&dump) == config_hash(&on));
    free(text);
    config_free(&dump);

    char *one_field[] = {"--data.instance_filter.repetition_max_period=5"};
    assert_int_equal(config_load_string("", "o.yaml", 1, one_field, &dump), SPES_OK);
    assert_true(dump.data.instance_filter.enabled && dump.data.instance_filter.max_period == 5 &&
                dump.data.instance_filter.max_count == 32);
    config_free(&dump);
    char *merge[] = {"--data.instance_filter={repetition_max_count: 5}", "--model={d_model: 48}"};
    assert_int_equal(config_load_string("model:\n  n_layers: 3\n  d_model: 64\n"
                                        "data:\n  instance_filter:\n    repetition_max_period: 10\n",
                                        "m.yaml", 2, merge, &dump),
                     SPES_OK);   // a mapping override merges into the file's (OmegaConf)
    assert_true(dump.data.instance_filter.max_period == 10 && dump.data.instance_filter.max_count == 5);
    assert_true(dump.model.n_layers == 3 && dump.model.d_model == 48);
    config_free(&dump);
    char *off[] = {"--data.instance_filter=null"};
    assert_int_equal(config_load_string("data:\n  instance_filter: {repetition_max_count: 8}\n", "o.yaml", 1, off, &dump),
                     SPES_OK);
    assert_false(dump.data.instance_filter.enabled);
    assert_true(config_hash(&dump) == config_hash(&plain));
    config_free(&dump);
    config_free(&on);
    config_free(&plain);
}

// A resume whose hash differs names what changed: the saved config.yaml against the current one.
static void test_changes_since_saved(void **state) {
    (void)state;
    TrainConfig saved, now;
    assert_int_equal(config_load_string("optimizer:\n  learning_rate: 1.0e-4\n", "a.yaml", 0, NULL, &saved), SPES_OK);
    char path[] = "/tmp/spes_config_saved_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    config_write_yaml(&saved, f);
    fclose(f);
    char *same = config_changes_since(path, &saved);
    assert_null(same);
    char *over[] = {"--optimizer.learning_rate=4e-4", "--data.instance_filter.repetition_max_count=8", "--seed=9"};
    assert_int_equal(config_load_string("optimizer:\n  learning_rate: 1.0e-4\n", "a.yaml", 3, over, &now), SPES_OK);
    char *changes = config_changes_since(path, &now);
    assert_non_null(changes);
    assert_non_null(strstr(changes, "optimizer.learning_rate: 0.0001 -> 0.0004"));
    assert_non_null(strstr(changes, "data.instance_filter: (unset) -> {repetition_max_period: 13"));
    assert_non_null(strstr(changes, "seed: 6198 -> 9"));
    assert_null(strstr(changes, "save_folder"));   // not hashed
    free(changes);
    assert_null(config_changes_since("/nonexistent/config.yaml", &now));
    unlink(path);
    config_free(&now);
    config_free(&saved);
}

// The ranks of one job compare every key but threads and device (dist_check_config), with the
// same diff the resume uses: run-control keys the hash leaves out (strategy, micro-batch,
// save_folder) count here.
static void test_job_lines(void **state) {
    (void)state;
    TrainConfig a, b;
    char *over_a[] = {"--threads=1", "--device=cpu", "--distributed_strategy=ddp"};
    char *over_b[] = {"--threads=2", "--device=cuda:1", "--distributed_strategy=fsdp", "--save_folder=/elsewhere",
                      "--device_train_microbatch_size=1"};
    assert_int_equal(config_load_string("", "a.yaml", 3, over_a, &a), SPES_OK);
    char *same[] = {"--threads=2", "--device=cuda:1", "--distributed_strategy=ddp"};
    assert_int_equal(config_load_string("", "b.yaml", 3, same, &b), SPES_OK);
    char *la = config_job_lines(&a), *lb = config_job_lines(&b);
    assert_non_null(la);
    assert_non_null(lb);
    assert_null(strstr(la, "threads="));
    assert_null(strstr(la, "device="));
    assert_null(config_diff_lines(la, lb));   // only per-rank keys differ
    free(lb);
    config_free(&b);
    assert_int_equal(config_load_string("", "b.yaml", 5, over_b, &b), SPES_OK);
    lb = config_job_lines(&b);
    char *diff = config_diff_lines(la, lb);
    assert_non_null(diff);
    assert_non_null(strstr(diff, "distributed_strategy: \"ddp\" -> \"fsdp\""));
    assert_non_null(strstr(diff, "device_train_microbatch_size: "));
    assert_non_null(strstr(diff, "save_folder: "));
    assert_null(strstr(diff, "threads"));
    assert_true(config_hash(&a) == config_hash(&b));   // none of them is in the resume hash
    free(diff), free(la), free(lb);
    config_free(&a);
    config_free(&b);
}

// spes_config.payload_dtype int4 and the outer optimizer keys: read, defaults, and in the hash
// only what changes a peer's own training (the payload) - the outer step runs on the server.
static void test_int4_payload_and_outer_keys(void **state) {
    (void)state;
    TrainConfig plain, keys;
    assert_int_equal(config_load_string("", "plain.yaml", 0, NULL, &plain), SPES_OK);
    assert_true(plain.outer_lr == 1.0f && plain.outer_momentum == 0.0f);
    assert_int_equal(plain.payload_dtype, PAYLOAD_F32);
    assert_int_equal(config_load_string("spes_config:\n  outer_lr: 0.7\n  outer_momentum: 0.9\n", "outer.yaml", 0,
                                        NULL, &keys),
                     SPES_OK);
    assert_true(keys.outer_lr == 0.7f && keys.outer_momentum == 0.9f);
    assert_true(config_hash(&keys) == config_hash(&plain));   // not hashed
    config_free(&keys);
    assert_int_equal(config_load_string("spes_config:\n  payload_dtype: int4\n", "int4.yaml", 0, NULL, &keys), SPES_OK);
    assert_int_equal(keys.payload_dtype, PAYLOAD_INT4);
    assert_true(config_hash(&keys) != config_hash(&plain));   // hashed, as int8
    config_free(&keys);
    config_free(&plain);
}

// The quality keys (sync warm-up, peer learning-rate scale): off by default and then out of the
// hash (every config written before them keeps its hash and its checkpoints resume); set, read,
// hashed, and the YAML dump reloads them to the same hash.
static void test_quality_keys(void **state) {
    (void)state;
    TrainConfig plain, keys, dump;
    assert_int_equal(config_load_string("", "plain.yaml", 0, NULL, &plain), SPES_OK);
    assert_true(plain.sync_warmup_steps == 0 && plain.sync_warmup_every == 1 && plain.lr_scale == 1.0);
    assert_false(plain.reset_moments_at_sync);
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    config_write_values(&plain, fp, true);
    fclose(fp);
    assert_null(strstr(text, "sync_warmup"));   // off: not in what the hash reads
    assert_null(strstr(text, "lr_scale"));
    assert_null(strstr(text, "reset_moments"));
    free(text);
    // Setting a key to its default is the same config.
    assert_int_equal(config_load_string("spes_config:\n  sync_warmup_steps: 0\n  sync_warmup_every: 1\n  lr_scale: 1\n",
                                        "same.yaml", 0, NULL, &keys),
                     SPES_OK);
    assert_true(config_hash(&keys) == config_hash(&plain));
    config_free(&keys);
    const char *yaml = "spes_config:\n  sync_steps: 25\n  sync_warmup_steps: 100\n  sync_warmup_every: 5\n  lr_scale: 2.0\n";
    assert_int_equal(config_load_string(yaml, "warm.yaml", 0, NULL, &keys), SPES_OK);
    assert_true(keys.sync_warmup_steps == 100 && keys.sync_warmup_every == 5 && keys.lr_scale == 2.0);
    assert_true(config_hash(&keys) != config_hash(&plain));
    text = NULL;
    fp = open_memstream(&text, &len);
    config_write_yaml(&keys, fp);
    fclose(fp);
    assert_int_equal(config_load_string(text, "dump.yaml", 0, NULL, &dump), SPES_OK);
    free(text);
    assert_true(dump.sync_warmup_steps == 100 && dump.sync_warmup_every == 5 && dump.lr_scale == 2.0);
    assert_true(config_hash(&dump) == config_hash(&keys));
    config_free(&dump);
    config_free(&keys);
    // Each key alone changes the hash.
    assert_int_equal(config_load_string("spes_config:\n  lr_scale: 1.5\n", "s.yaml", 0, NULL, &keys), SPES_OK);
    assert_true(config_hash(&keys) != config_hash(&plain));
    config_free(&keys);
    assert_int_equal(config_load_string("spes_config:\n  reset_moments_at_sync: true\n", "r.yaml", 0, NULL, &keys),
                     SPES_OK);
    assert_true(keys.reset_moments_at_sync);
    assert_true(config_hash(&keys) != config_hash(&plain));
    config_free(&keys);
    config_free(&plain);
}

// Loading never opens data files: the seeds' paths do not exist here.
static void test_loading_does_not_touch_data(void **state) {
    (void)state;
    TrainConfig cfg;
    assert_int_equal(config_load_string("data:\n  paths: [/nonexistent/x.npy, /nonexistent/list.txt]\n", "p.yaml", 0,
                                        NULL, &cfg),
                     SPES_OK);
    assert_int_equal(cfg.data.n_paths, 2);
    config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_spes_1b),
        cmocka_unit_test(test_reference_3b_norm_router),
        cmocka_unit_test(test_save_interval_stands_in),
        cmocka_unit_test(test_default_token_ids_small_vocab),
        cmocka_unit_test(test_reference_dilico),
        cmocka_unit_test(test_trimmed_copy_matches_reference),
        cmocka_unit_test(test_tiny_config),
        cmocka_unit_test(test_override_reaches_interpolation),
        cmocka_unit_test(test_override_with_null),
        cmocka_unit_test(test_defaults_are_olmo),
        cmocka_unit_test(test_unknown_keys_collected),
        cmocka_unit_test(test_evaluators),
        cmocka_unit_test(test_max_duration_forms),
        cmocka_unit_test(test_hash_and_round_trip),
        cmocka_unit_test(test_quality_keys),
        cmocka_unit_test(test_instance_filter),
        cmocka_unit_test(test_changes_since_saved),
        cmocka_unit_test(test_job_lines),
        cmocka_unit_test(test_loading_does_not_touch_data),
        cmocka_unit_test(test_int4_payload_and_outer_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
