// Every kind of bad config is an error naming the key and where it was set (file:line, or
// "command line --key"), never a crash and never silently accepted.
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
#include "config/config.h"

typedef struct {
    const char *what;
    const char *yaml;
    const char *override;   // one command-line word, or NULL
    const char *expect1;    // substrings the message must contain
    const char *expect2;
} BadCase;

static const BadCase CASES[] = {
    {"not a number", "optimizer:\n  learning_rate: abc\n", NULL,
     "bad.yaml:2: optimizer.learning_rate: expected a number, got 'abc'", NULL},
    {"not an integer", "seed: 1\nglobal_train_batch_size: 1.5\n", NULL, "bad.yaml:2: global_train_batch_size",
     "expected an integer"},
    // YAML 1.1 (OmegaConf) reads 040 as octal 32; strtoll read 40: the run differed silently.
    {"leading zero integer", "seed: 040\n", NULL, "bad.yaml:1: seed", "'040' has a leading 0"},
    {"leading zero number", "", "--optimizer.learning_rate=-01", "command line --optimizer.learning_rate",
     "leading 0"},
    {"not a bool", "using_spes: maybe\n", NULL, "bad.yaml:1: using_spes", "expected true or false"},
    {"negative size", "model:\n  d_model: -4\n", NULL, "bad.yaml:2: model.d_model", "must be > 0"},
    {"zero experts", "model:\n  moe_num_experts: 0\n", NULL, "bad.yaml:2: model.moe_num_experts", "must be > 0"},
    {"list for a scalar", "seed: [1, 2]\n", NULL, "bad.yaml:1: seed", "got a list"},
    {"mapping for a list", "data:\n  paths:\n    a: b\n", NULL, "bad.yaml:3: data.paths", "got a mapping"},
    {"section not a mapping", "model: 5\n", NULL, "bad.yaml:1: model", "expected a mapping"},
    {"null for required", "model:\n  d_model: null\n", NULL, "bad.yaml:2: model.d_model", "must not be null"},
    {"bad dtype", "data:\n  memmap_dtype: float32\n", NULL, "bad.yaml:2: data.memmap_dtype", "uint16 or uint32"},
    {"bad payload dtype", "spes_config:\n  payload_dtype: fp8\n", NULL, "bad.yaml:2: spes_config.payload_dtype", "f32, bf16, int8 or int4"},
    {"bad scheduler", "scheduler:\n  name: inverse_sqrt\n", NULL, "bad.yaml:2: scheduler.name", "cosine_with_warmup"},
    {"scheduler units", "scheduler:\n  units: epochs\n", NULL, "bad.yaml:2: scheduler.units", "expected steps or tokens, got 'epochs'"},
    {"optimizer name", "optimizer:\n  name: lionw\n", NULL, "bad.yaml:2: optimizer.name", "only adamw"},
    {"unsupported activation", "model:\n  activation_type: gelu\n", NULL, "bad.yaml:2: model.activation_type", "only swiglu"},
    {"dropout", "model:\n  residual_dropout: 0.1\n", NULL, "bad.yaml:2: model.residual_dropout", "only 0"},
    {"weight tying", "model:\n  weight_tying: true\n", NULL, "bad.yaml:2: model.weight_tying", "only false"},
    {"betas length", "optimizer:\n  betas: [0.9]\n", NULL, "bad.yaml:2: optimizer.betas", "two numbers"},
    {"beta range", "optimizer:\n  betas: [0.9, 1.5]\n", NULL, "bad.yaml:2: optimizer.betas", "[0, 1)"},
    {"normalize p-norm", "model:\n  moe_normalize_expert_weights: 2.0\n", NULL,
     "bad.yaml:2: model.moe_normalize_expert_weights", "only true/1"},
    {"odd mlp hidden", "model:\n  mlp_hidden_size: 4097\n", NULL, "bad.yaml:2: model.mlp_hidden_size", "even"},
    {"bad max_duration", "max_duration: 12x\n", NULL, "bad.yaml:1: max_duration", "<N>ep"},
    {"batch divisibility", "global_train_batch_size: 10\ndevice_train_microbatch_size: 3\n", NULL,
     "bad.yaml:2: device_train_microbatch_size", "multiple of device_train_microbatch_size (3)"},
    {"embedding smaller than vocab", "model:\n  vocab_size: 300\n  embedding_size: 264\n", NULL,
     "bad.yaml:3: model.embedding_size", "must be >= vocab_size (300)"},
    {"heads do not divide", "model:\n  d_model: 100\n  n_heads: 3\n", NULL, "bad.yaml:3: model.n_heads", "divisible"},
    {"kv heads", "model:\n  n_heads: 12\n  n_kv_heads: 5\n", NULL, "bad.yaml:3: model.n_kv_heads", "multiple of n_kv_heads"},
    // Beyond model_config_validate's bounds: the trainer said "model config: dimensions are
    // implausibly large (...)", naming neither the key nor the line.
    {"d_model too large", "model:\n  d_model: 2147483640\n  mlp_hidden_size: 64\n", NULL, "bad.yaml:2: model.d_model", "larger than the 16777216"},
    {"vocab too large", "model:\n  vocab_size: 2147483647\n", NULL, "bad.yaml:2: model.vocab_size", "more than the 16777216"},
    {"layers too many", "", "--model.n_layers=2147483647", "command line --model.n_layers", "more than the 65536"},
    {"experts too many", "model:\n  moe_num_experts: 100000\n  moe_top_k: 2\n", NULL, "bad.yaml:2: model.moe_num_experts",
     "more than the 65536"},
    {"heads too wide", "model:\n  n_heads: 65536\n  head_dim: 65536\n", NULL, "bad.yaml:2: model.n_heads",
     "n_heads x head_dim = 4294967296"},
    {"top_k > experts", "model:\n  moe_num_experts: 4\n  moe_top_k: 5\n", NULL, "bad.yaml:3: model.moe_top_k", "<= moe_num_experts"},
    {"over_head without qk norm", "model:\n  attention_layer_norm_over_head: true\n", NULL,
     "bad.yaml:2: model.attention_layer_norm_over_head", "attention_layer_norm: true"},
    {"t_max before warmup", "scheduler:\n  t_warmup: 100\n  t_max: 50\n", NULL, "bad.yaml:3: scheduler.t_max", "> t_warmup"},
    {"alpha_f > 1", "scheduler:\n  alpha_f: 2\n", NULL, "bad.yaml:2: scheduler.alpha_f", "[0, 1]"},
    {"keep zero checkpoints", "save_num_unsharded_checkpoints_to_keep: 0\n", NULL,
     "bad.yaml:1: save_num_unsharded_checkpoints_to_keep", "-1 (keep all)"},
    {"peer_id out of range", "spes_config:\n  num_peers: 4\n  peer_id: 4\n", NULL, "bad.yaml:3: spes_config.peer_id",
     "[0, num_peers = 4)"},
    {"too many experts per node", "model:\n  moe_num_experts: 8\nspes_config:\n  num_train_experts_per_node: 9\n", NULL,
     "bad.yaml:4: spes_config.num_train_experts_per_node", "[1, moe_num_experts = 8]"},
    {"evaluator without paths", "evaluators:\n  - label: val\n    type: lm\n", NULL, "bad.yaml:2: evaluators[0]", "needs data.paths"},
    // two lines {"eval":"val",...} per evaluation in metrics.jsonl, which no reader can tell apart
    {"evaluator labels repeat", "evaluators:\n  - label: val\n    data: {paths: [a.npy]}\n  - label: val\n"
     "    data: {paths: [b.npy]}\n", NULL, "bad.yaml:4: evaluators[1]", "label 'val' is taken by an earlier evaluator"},
    {"evaluator bad type", "evaluators:\n  - label: val\n    type: weird\n", NULL, "bad.yaml:3: evaluators[0]", "lm or downstream"},
    {"unknown interpolation", "save_folder: out/${nope}\n", NULL, "bad.yaml:1: save_folder", "unknown interpolation ${nope}"},
    {"interpolation cycle", "run_name: ${save_folder}\nsave_folder: ${run_name}\n", NULL, "bad.yaml:", "cycle"},
    {"interpolation of a section", "run_name: ${model}\nmodel:\n  d_model: 64\n", NULL, "bad.yaml:1: run_name", "a mapping"},
    {"unterminated interpolation", "run_name: abc${seed\n", NULL, "bad.yaml:1: run_name", "unterminated"},
    {"YAML syntax", "model:\n  d_model: 4\n bad: [\n", NULL, "bad.yaml:", "YAML syntax error"},
    {"YAML tab indentation", "model:\n\td_model: 4\n", NULL, "bad.yaml:2:", "YAML syntax error"},
    {"duplicate key", "seed: 1\nseed: 2\n", NULL, "bad.yaml:2:", "'seed' appears twice"},
    {"alias", "a: &x 1\nseed: *x\n", NULL, "bad.yaml:2:", "aliases"},
    // OmegaConf merges {seed: 3} into the top level; read as a key, "<<" was warned about as
    // unknown and ignored, so the run trained with seed 6198.
    {"merge key", "model:\n  d_model: 64\n<<: {seed: 3}\n", NULL, "bad.yaml:3:", "merge keys (<<) are not supported"},
    {"two documents", "seed: 1\n---\nseed: 2\n", NULL, "bad.yaml:", "more than one YAML document"},
    {"top level list", "- a\n- b\n", NULL, "bad.yaml:1:", "mapping of keys"},
    {"override type error", "", "--optimizer.learning_rate=abc", "command line --optimizer.learning_rate",
     "expected a number, got 'abc'"},
    {"override unknown key", "", "--optimizer.learning_rat=1", "command line --optimizer.learning_rat", "unknown config key"},
    {"override without value", "", "--seed", "command line --seed", "needs a value"},
    {"override not a flag", "", "seed=3", "command line", "not a config override"},
    {"override bad key chars", "", "--se ed=3", "command line", "not a config override"},
    {"override bad YAML", "", "--data.paths=[a,", "command line --data.paths: '[a,' is not a valid YAML value", "YAML syntax error"},
    {"override into a scalar", "", "--seed.x=1", "command line --seed.x", "unknown config key"},
    {"override validation", "", "--spes_config.peer_id=7", "spes_config.peer_id", "[0, num_peers = 1)"},
    // Positive in the file, 0 as the float the kernels use: eps 0 made the first AdamW step NaN
    // (reported as "lower optimizer.learning_rate"); the model's float keys failed without a line.
    {"eps below float range", "optimizer:\n  eps: 1e-50\n", NULL, "bad.yaml:2: optimizer.eps", "too small for the 32-bit float"},
    {"norm eps below float range", "model:\n  layer_norm_eps: 1e-50\n", NULL, "bad.yaml:2: model.layer_norm_eps",
     "it would be 0"},
    {"init_std below float range", "", "--model.init_std=1e-46", "command line --model.init_std", "it would be 0"},
    {"outer_lr out of range", "spes_config:\n  outer_lr: 20\n", NULL, "bad.yaml:2: spes_config.outer_lr", "[1e-6, 10], got 20"},
    {"outer_lr zero", "spes_config:\n  outer_lr: 0\n", NULL, "bad.yaml:2: spes_config.outer_lr", "> 0"},
    {"sync_warmup_steps not on the grid", "spes_config:\n  sync_steps: 25\n  sync_warmup_steps: 110\n", NULL,
     "spes_config.sync_warmup_steps", "multiple of sync_steps (25)"},
    {"sync_warmup_steps not a multiple of its interval", "spes_config:\n  sync_steps: 25\n  sync_warmup_steps: 100\n"
     "  sync_warmup_every: 3\n", NULL, "spes_config.sync_warmup_steps", "sync_warmup_every (3)"},
    {"sync_warmup_every above sync_steps", "spes_config:\n  sync_steps: 25\n  sync_warmup_every: 50\n", NULL,
     "spes_config.sync_warmup_every", "[1, sync_steps = 25], got 50"},
    {"sync_warmup_every zero", "spes_config:\n  sync_warmup_every: 0\n", NULL, "bad.yaml:2: spes_config.sync_warmup_every",
     "> 0"},
    {"sync_warmup_steps negative", "spes_config:\n  sync_warmup_steps: -1\n", NULL,
     "bad.yaml:2: spes_config.sync_warmup_steps", ">= 0"},
    {"lr_scale zero", "spes_config:\n  lr_scale: 0\n", NULL, "bad.yaml:2: spes_config.lr_scale", "> 0"},
    {"lr_scale too large", "spes_config:\n  lr_scale: 1000\n", NULL, "spes_config.lr_scale", "(0, 100], got 1000"},
    {"outer_momentum 1", "spes_config:\n  outer_momentum: 1.0\n", NULL, "bad.yaml:2: spes_config.outer_momentum", "[0, 1)"},
    {"mlp_ratio beyond int", "model:\n  d_model: 64\n  mlp_ratio: 4444444444444444444444444444444444444444444444444\n", NULL,
     "model.mlp_ratio", "must be an even whole number"},
    {"downstream limit negative", "evaluators:\n  - label: arc\n    type: downstream\n    requests: r.jsonl\n    limit: -1\n",
     NULL, "bad.yaml:5: evaluators[0].limit", "document count >= 0"},
    {"downstream requests a list", "evaluators:\n  - label: arc\n    type: downstream\n    requests: [a, b]\n", NULL,
     "bad.yaml:4: evaluators[0].requests", "expected a request file or folder"},
    {"instance filter misspelt field", "data:\n  instance_filter:\n    repetition_max_cont: 8\n", NULL,
     "bad.yaml:3: data.instance_filter.repetition_max_cont", "unknown field"},
    {"instance filter periods reversed", "data:\n  instance_filter:\n    repetition_min_period: 5\n    repetition_max_period: 4\n",
     NULL, "bad.yaml:3: data.instance_filter", "repetition_max_period (4) must be >= repetition_min_period (5)"},
    {"instance filter zero count", "data:\n  instance_filter:\n    repetition_max_count: 0\n", NULL,
     "bad.yaml:3: data.instance_filter.repetition_max_count", ">= 1, got 0"},
    {"instance filter not a mapping", "data:\n  instance_filter: true\n", NULL, "bad.yaml:2: data.instance_filter",
     "expected a mapping (or null)"},
    {"instance filter override", "", "--data.instance_filter.repetition_min_period=-2",
     "command line --data.instance_filter.repetition_min_period", ">= 1, got -2"},
    {"instance filter from overrides only", "seed: 1\ndata:\n  drop_last: true\n", "--data.instance_filter.repetition_min_period=20",
     "command line --data.instance_filter: repetition_max_period (13)", ">= repetition_min_period (20)"},
};

static void test_bad_configs(void **state) {
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const BadCase *c = &CASES[i];
        TrainConfig cfg;
        char *over[1] = {(char *)c->override};
        int rc = config_load_string(c->yaml, "bad.yaml", c->override ? 1 : 0, over, &cfg);
        const char *msg = spes_last_error();
        bool ok = rc == SPES_ERR && strstr(msg, c->expect1) && (!c->expect2 || strstr(msg, c->expect2));
        if (!ok) {
            print_error("case '%s': rc %d, message \"%s\" (expected \"%s\"%s%s)\n", c->what, rc, msg, c->expect1,
                        c->expect2 ? " and " : "", c->expect2 ? c->expect2 : "");
            failures++;
        }
        if (rc == SPES_OK) config_free(&cfg);
    }
    assert_int_equal(failures, 0);
}

static void test_missing_file(void **state) {
    (void)state;
    TrainConfig cfg;
    assert_int_equal(config_load("/nonexistent/dir/run.yaml", 0, NULL, &cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "/nonexistent/dir/run.yaml"));
}

// A config is read whole: a file over 64 MiB (a token file given by mistake) is refused before
// it is read, not read into memory first (a 4 GB file took 4 GB of RSS to be told it has a NUL).
static void test_huge_file(void **state) {
    (void)state;
    char path[] = "/tmp/spes_test_huge_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)1 << 36), 0);   // 64 GiB, sparse
    close(fd);
    TrainConfig cfg;
    assert_int_equal(config_load(path, 0, NULL, &cfg), SPES_ERR);
    const char *msg = spes_last_error();
    bool ok = strstr(msg, path) && strstr(msg, "68719476736 bytes, more than a YAML config can be");
    unlink(path);
    if (!ok) fail_msg("message: %s", msg);
}

// Fixed keys accept their value and null; values are case-exact like OLMo's enums.
static void test_fixed_keys_accept_value_and_null(void **state) {
    (void)state;
    TrainConfig cfg;
    const char *yaml = "model:\n  activation_type: swiglu\n  attention_dropout: 0.0\n  clip_qkv: null\n"
                       "  weight_tying: False\nmax_grad_norm_ratio: ~\n";
    assert_int_equal(config_load_string(yaml, "ok.yaml", 0, NULL, &cfg), SPES_OK);
    config_free(&cfg);
}

// Nested ${} references double per level: a 16-line config could ask for gigabytes. A value over
// 1 MiB, or interpolated values adding up to over 16 MiB, is an error naming the key.
static char *doubling_chain(int levels, int base_len, int extra_refs) {
    size_t cap = (size_t)base_len + 64 * (size_t)(levels + extra_refs) + 64;
    char *yaml = malloc(cap);
    size_t n = (size_t)snprintf(yaml, cap, "x0: ");
    memset(yaml + n, 'A', (size_t)base_len);
    n += (size_t)base_len;
    n += (size_t)snprintf(yaml + n, cap - n, "\n");
    for (int i = 1; i <= levels; i++) n += (size_t)snprintf(yaml + n, cap - n, "x%d: ${x%d}${x%d}\n", i, i - 1, i - 1);
    for (int i = 0; i < extra_refs; i++) n += (size_t)snprintf(yaml + n, cap - n, "r%d: ${x%d}\n", i, levels);
    return yaml;
}

static void test_interpolation_blowup(void **state) {
    (void)state;
    TrainConfig cfg;
    // 1000 bytes doubled 12 times: x11 would be 2 MB (and x12 4 MB).
    char *yaml = doubling_chain(12, 1000, 0);
    assert_int_equal(config_load_string(yaml, "bad.yaml", 0, NULL, &cfg), SPES_ERR);
    if (!strstr(spes_last_error(), "bad.yaml:12: x11") || !strstr(spes_last_error(), "over 1 MiB"))
        fail_msg("message: %s", spes_last_error());
    free(yaml);
    // Each value under the cap (900 KB), 18 copies of it: over 16 MiB in all.
    yaml = doubling_chain(10, 900, 18);
    assert_int_equal(config_load_string(yaml, "bad.yaml", 0, NULL, &cfg), SPES_ERR);
    if (!strstr(spes_last_error(), ": r1") || !strstr(spes_last_error(), "add up to over 16 MiB"))
        fail_msg("message: %s", spes_last_error());
    free(yaml);
    // Below both caps it still works.
    yaml = doubling_chain(8, 900, 2);
    assert_int_equal(config_load_string(yaml, "ok.yaml", 0, NULL, &cfg), SPES_OK);
    config_free(&cfg);
    free(yaml);
}

// A mapping of 10001 keys is refused at the key past the limit. Every key is compared with the
// earlier ones (duplicates are errors) and listed in the unknown-key warning: a 1 MB file of
// 100000 keys took 31 s to load and a 10 MB one hours.
static void test_too_many_keys(void **state) {
    (void)state;
    enum { N = 10001 };
    char *yaml = malloc((size_t)N * 16 + 64);
    size_t n = (size_t)sprintf(yaml, "seed: 1\n");
    for (int i = 1; i < N; i++) n += (size_t)sprintf(yaml + n, "k%d: 1\n", i);
    TrainConfig cfg;
    assert_int_equal(config_load_string(yaml, "big.yaml", 0, NULL, &cfg), SPES_ERR);
    if (!strstr(spes_last_error(), "big.yaml:10001: the mapping opened at line 1 has more than 10000 keys"))
        fail_msg("message: %s", spes_last_error());
    // one key fewer loads (each unknown key listed)
    yaml[n - strlen("k10000: 1\n")] = '\0';
    assert_int_equal(config_load_string(yaml, "big.yaml", 0, NULL, &cfg), SPES_OK);
    assert_non_null(strstr(cfg.unknown_keys, "k9999 (big.yaml:10000)"));
    config_free(&cfg);
    free(yaml);
}

// What loading yaml with the n overrides writes to stderr (malloc'd), the load succeeding.
static char *load_warnings(const char *yaml, int n, char **over) {
    char path[] = "/tmp/spes_config_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    TrainConfig cfg;
    int rc = config_load_string(yaml, "run.yaml", n, over, &cfg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (rc != SPES_OK) fail_msg("load failed: %s", spes_last_error());
    config_free(&cfg);
    char *text = calloc(1, 8192);
    assert_non_null(text);
    assert_true(pread(fd, text, 8191, 0) >= 0);
    close(fd);
    unlink(path);
    return text;
}

// An instance filter that no instance of the run's length can trigger used to load silently.
// OLMo takes such a config (it masks nothing), so it is a warning naming the keys, where they
// were set, and the sequence length; the run loads.
static void test_inert_instance_filter_warns(void **state) {
    (void)state;
    const char *yaml = "model:\n  max_sequence_length: 64\ndata:\n  instance_filter:\n    repetition_min_period: 4\n"
                       "    repetition_max_count: 16\n";   // 16 x 4 = 64 tokens: can fire
    char *text = load_warnings(yaml, 0, NULL);
    if (strstr(text, "instance_filter")) fail_msg("a filter that can fire warned: %s", text);
    free(text);
    text = load_warnings(yaml, 1, (char *[]){"--model.max_sequence_length=63"});
    if (!strstr(text, "run.yaml:5: data.instance_filter: never masks an instance: a pattern of repetition_min_period 4 "
                      "tokens repeated repetition_max_count 16 times (3 at least) takes 64 tokens, and an instance has "
                      "63 (command line --model.max_sequence_length)") ||
        !strstr(text, "set data.instance_filter: null"))
        fail_msg("no warning naming the keys: %s", text);
    free(text);
    // Fewer than 3 repeats still need 3 (the fewest OLMo reports); the default length (1024).
    text = load_warnings("data:\n  instance_filter: {repetition_min_period: 400, repetition_max_count: 2, "
                         "repetition_max_period: 500}\n", 0, NULL);
    if (!strstr(text, "run.yaml:2: data.instance_filter: never masks") ||
        !strstr(text, "takes 1200 tokens, and an instance has 1024 (model.max_sequence_length)"))
        fail_msg("no warning for 3 x 400 > 1024: %s", text);
    free(text);
}

// A key given twice on the command line: the last value wins, as in OmegaConf, and it is said
// (it used to be silent); a key given once, or in the file and once on the line, says nothing.
static void test_override_given_twice_warns(void **state) {
    (void)state;
    char *text = load_warnings("seed: 1\n", 2, (char *[]){"--seed=2", "--optimizer.learning_rate=1e-3"});
    if (strstr(text, "more than once")) fail_msg("a key given once warned: %s", text);
    free(text);
    text = load_warnings("seed: 1\n", 3, (char *[]){"--seed=2", "--optimizer.learning_rate=1e-3", "--seed=3"});
    if (!strstr(text, "command line --seed: given more than once; the last value, '3', is used"))
        fail_msg("no warning for --seed given twice: %s", text);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_interpolation_blowup),
        cmocka_unit_test(test_fixed_keys_accept_value_and_null),
        cmocka_unit_test(test_too_many_keys),
        cmocka_unit_test(test_huge_file),
        cmocka_unit_test(test_inert_instance_filter_warns),
        cmocka_unit_test(test_override_given_twice_warns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
