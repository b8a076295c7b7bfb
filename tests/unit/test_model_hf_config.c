// config.json <-> ModelConfig: round trip in both formats, and clear errors for bad input.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "model/hf_config.h"

static char dir[] = "/tmp/spes_hf_config_XXXXXX";

static void round_trip(QkNormMode qk, const char *format) {
    ModelConfig c, back;
    assert_int_equal(model_config_preset("tiny", &c), SPES_OK);
    c.qk_norm = qk;
    c.normalize_expert_weights = true;
    c.rope_theta = 500000.0f;
    c.norm_eps = 1e-6f;
    char *path = path_join(dir, "config.json");
    assert_int_equal(hf_config_write(&c, format, "float32", path), SPES_OK);
    assert_int_equal(hf_config_read(dir, &back), SPES_OK);   // the directory form
    assert_int_equal(back.d_model, c.d_model);
    assert_int_equal(back.n_heads, c.n_heads);
    assert_int_equal(back.n_kv_heads, c.n_kv_heads);
    assert_int_equal(back.head_dim, c.head_dim);
    assert_int_equal(back.n_layers, c.n_layers);
    assert_int_equal(back.vocab_size, c.vocab_size);
    assert_int_equal(back.embedding_size, c.embedding_size);
    assert_int_equal(back.num_experts, c.num_experts);
    assert_int_equal(back.top_k, c.top_k);
    assert_int_equal(back.expert_hidden, c.expert_hidden);
    assert_int_equal(back.max_seq_len, c.max_seq_len);
    assert_true(back.rope_theta == c.rope_theta);
    assert_true(back.norm_eps == c.norm_eps);
    assert_int_equal(back.qk_norm, qk);
    assert_true(back.normalize_expert_weights);
    free(path);
}

static void test_round_trip(void **state) {
    (void)state;
    round_trip(QK_NORM_FULL, "olmoe");
    round_trip(QK_NORM_HEAD, "qwen3_moe");
    ModelConfig c;
    assert_int_equal(model_config_preset("tiny", &c), SPES_OK);
    char *path = path_join(dir, "config.json");
    assert_int_equal(hf_config_write(&c, "qwen3_moe", "float32", path), SPES_ERR);   // tiny is QK-norm full
    assert_non_null(strstr(spes_last_error(), "QK-norm"));
    free(path);
}

static void expect_error(const char *json, const char *needle) {
    char *path = path_join(dir, "bad.json");
    assert_int_equal(file_write_atomic(path, json, strlen(json)), SPES_OK);
    ModelConfig c;
    assert_int_equal(hf_config_read(path, &c), SPES_ERR);
    if (!strstr(spes_last_error(), needle)) fail_msg("error '%s' does not mention '%s'", spes_last_error(), needle);
    free(path);
}

#define BASE "\"hidden_size\": 32, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 64, " \
             "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"intermediate_size\": 16"

static void test_errors(void **state) {
    (void)state;
    expect_error("{" BASE "}", "model_type");
    expect_error("{\"model_type\": \"llama\", " BASE "}", "llama");
    expect_error("{\"model_type\": \"olmoe\", \"hidden_size\": 32}", "num_attention_heads");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"rope_theta\": \"big\"}", "rope_theta");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"tie_word_embeddings\": true}", "tie_word_embeddings");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"clip_qkv\": 8}", "clip_qkv");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"num_key_value_heads\": 3}", "n_kv_heads");
    expect_error("{\"model_type\": \"olmoe\", \"hidden_size\": 32, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
                 "\"vocab_size\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 9, \"intermediate_size\": 16}",
                 "top_k");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"hidden_size\": 32}", "duplicate");
    expect_error("{\"model_type\": \"olmoe\", " BASE, "JSON");
    ModelConfig c;
    assert_int_equal(hf_config_read("/nonexistent/model", &c), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "does not exist"));
}

// Values no model can run with are refused at load, naming the HF key (issue 29: a config.json
// with "rope_theta": 0 beside rope_parameters' 10000 loaded, and the model ran with either).
static void test_impossible_values(void **state) {
    (void)state;
    // Accepted before: the first three ran a model its config does not describe, the last
    // wrapped 2^32 + 1 to pad id 1.
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"rope_theta\": 0, \"rope_parameters\": {\"rope_type\": "
                 "\"default\", \"rope_theta\": 10000}}",
                 "\"rope_theta\" must be a positive number");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"rope_theta\": 500000, \"rope_parameters\": {\"rope_type\": "
                 "\"default\", \"rope_theta\": 10000}}",
                 "differ");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"eos_token_id\": 64}", "\"eos_token_id\" 64 is outside");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"pad_token_id\": 4294967297}", "pad_token_id");
    // Refused before too, but named by our field (norm_eps, d_model, ...), not the file's key:
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"rope_theta\": 0}", "\"rope_theta\" must be a positive number");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"rope_parameters\": {\"rope_theta\": -1}}",
                 "\"rope_parameters.rope_theta\" must be a positive number");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"rms_norm_eps\": 0}", "\"rms_norm_eps\" must be a positive");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"rms_norm_eps\": 1e-60}", "\"rms_norm_eps\" must be a positive");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"initializer_range\": 1e39}", "\"initializer_range\"");
    expect_error("{\"model_type\": \"olmoe\", \"hidden_size\": 0, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
                 "\"vocab_size\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"intermediate_size\": 16}",
                 "\"hidden_size\" must be a positive integer");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"max_position_embeddings\": -5}",
                 "\"max_position_embeddings\" must be a positive integer");
    // The forms real models write still load: equal values in both places, a list of eos ids.
    char *path = path_join(dir, "ok.json");
    const char *ok = "{\"model_type\": \"olmoe\", " BASE ", \"rope_theta\": 500000.0, \"rope_parameters\": "
                     "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}, \"eos_token_id\": [63, 1], "
                     "\"pad_token_id\": null}";
    assert_int_equal(file_write_atomic(path, ok, strlen(ok)), SPES_OK);
    ModelConfig c;
    assert_int_equal(hf_config_read(path, &c), SPES_OK);
    assert_true(c.rope_theta == 500000.0f);
    assert_int_equal(c.eos_token_id, 63);
    free(path);
}

// Reads `json` (olmoe, BASE sizes), writes it back, and returns the written config.json parsed.
static json_t *read_and_write(const char *json, ModelConfig *c) {
    char *in = path_join(dir, "ids.json"), *out = path_join(dir, "config.json");
    assert_int_equal(file_write_atomic(in, json, strlen(json)), SPES_OK);
    assert_int_equal(hf_config_read(in, c), SPES_OK);
    assert_int_equal(hf_config_write(c, "olmoe", "float32", out), SPES_OK);
    json_t *written = json_load_file(out, 0, NULL);
    assert_non_null(written);
    free(in);
    free(out);
    return written;
}

// bos / eos / pad are carried as the file gives them (issue: absent ids were written back as eos
// 0 and pad 1, an eos list as its first id, bos dropped). Absent and null both read as none (as
// transformers' generate reads config.json without a generation_config.json), but are written
// back as they were: transformers' OlmoeConfig fills an absent eos with 50279 and pad with 1 and
// reads null as None (an absent id used to be written null: the export then read as None there).
static void test_special_token_ids(void **state) {
    (void)state;
    ModelConfig c;
    json_t *w = read_and_write("{\"model_type\": \"olmoe\", " BASE "}", &c);
    assert_int_equal(c.eos_token_id, -1);
    assert_int_equal(c.pad_token_id, -1);
    assert_false(c.has_bos_token_id);
    assert_true(c.eos_key_absent && c.pad_key_absent && c.bos_key_absent);
    assert_null(json_object_get(w, "eos_token_id"));
    assert_null(json_object_get(w, "pad_token_id"));
    assert_null(json_object_get(w, "bos_token_id"));
    assert_false(model_config_is_eos(&c, 0));
    assert_false(model_config_is_eos(&c, -1));
    json_decref(w);

    w = read_and_write("{\"model_type\": \"olmoe\", " BASE ", \"bos_token_id\": null, \"eos_token_id\": null, "
                       "\"pad_token_id\": null}",
                       &c);
    assert_true(c.eos_token_id == -1 && c.pad_token_id == -1 && !c.has_bos_token_id);
    assert_false(c.eos_key_absent || c.pad_key_absent || c.bos_key_absent);
    assert_true(json_is_null(json_object_get(w, "eos_token_id")));
    assert_true(json_is_null(json_object_get(w, "pad_token_id")));
    assert_true(json_is_null(json_object_get(w, "bos_token_id")));
    json_decref(w);

    w = read_and_write("{\"model_type\": \"olmoe\", " BASE ", \"bos_token_id\": 2, \"eos_token_id\": [63, 1], "
                       "\"pad_token_id\": 5}",
                       &c);
    assert_int_equal(c.eos_token_id, 63);
    assert_int_equal(c.num_eos_token_ids, 2);
    assert_true(model_config_is_eos(&c, 63) && model_config_is_eos(&c, 1) && !model_config_is_eos(&c, 2));
    assert_int_equal(c.bos_token_id, 2);
    char *ids = json_dumps(w, JSON_COMPACT);
    assert_non_null(strstr(ids, "\"bos_token_id\":2,\"eos_token_id\":[63,1],\"pad_token_id\":5"));
    free(ids);
    json_decref(w);

    w = read_and_write("{\"model_type\": \"olmoe\", " BASE ", \"eos_token_id\": 7, \"pad_token_id\": null}", &c);
    assert_int_equal(c.num_eos_token_ids, 0);   // an id stays an id, not a list of one
    assert_int_equal(json_integer_value(json_object_get(w, "eos_token_id")), 7);
    assert_true(json_is_null(json_object_get(w, "pad_token_id")));
    json_decref(w);

    // transformers refuses a pad or bos list too; each id of a list is checked.
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"pad_token_id\": [1, 2]}",
                 "\"pad_token_id\" must be an integer or null");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"bos_token_id\": 64}", "\"bos_token_id\" 64 is outside");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"eos_token_id\": [1, 64]}",
                 "\"eos_token_id[1]\" 64 is outside the vocabulary [0, 64)");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"eos_token_id\": [1, \"x\"]}",
                 "\"eos_token_id[1]\" must be an integer");
    expect_error("{\"model_type\": \"olmoe\", " BASE ", \"eos_token_id\": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}",
                 "lists 17 ids");
}

// The decoding settings of the last read_generation_config.
static HfGenerationSettings settings;

// dir/generation_config.json holding `json` (NULL: no such file) read over a config whose
// eos_token_id is the list [3, 4]: *c has the eos ids transformers' generate stops at.
static int read_generation_config(const char *json, ModelConfig *c, char **text) {
    char *sub = path_join(dir, "gen"), *path = path_join(sub, "generation_config.json");
    assert_int_equal(mkdir_p(sub), SPES_OK);
    remove(path);
    if (json) assert_int_equal(file_write_atomic(path, json, strlen(json)), SPES_OK);
    json_t *root = json_loads("{\"model_type\": \"olmoe\", " BASE ", \"eos_token_id\": [3, 4]}", 0, NULL);
    assert_int_equal(hf_config_from_json(root, "config.json", c), SPES_OK);
    json_decref(root);
    size_t len = 0;
    int rc = hf_generation_config_read(sub, c, &settings, text, text ? &len : NULL);
    if (rc == SPES_OK && text && *text) assert_int_equal(len, strlen(json));
    free(sub);
    free(path);
    return rc;
}

static void test_generation_config(void **state) {
    (void)state;
    ModelConfig c;
    char *text = NULL;
    // No file: config.json's ids stay, nothing to carry.
    assert_int_equal(read_generation_config(NULL, &c, &text), SPES_OK);
    assert_null(text);
    assert_true(model_config_is_eos(&c, 3) && model_config_is_eos(&c, 4));
    // A list: its ids; the text comes back byte for byte (0.6 stays "0.6").
    const char *qwen = "{\"eos_token_id\": [5, 6], \"temperature\": 0.6}";
    assert_int_equal(read_generation_config(qwen, &c, &text), SPES_OK);
    assert_string_equal(text, qwen);
    free(text);
    assert_true(model_config_is_eos(&c, 5) && model_config_is_eos(&c, 6));
    assert_false(model_config_is_eos(&c, 3) || model_config_is_eos(&c, 4));
    // One id replaces the whole list (config.json's second id no longer stops).
    assert_int_equal(read_generation_config("{\"eos_token_id\": 3}", &c, NULL), SPES_OK);
    assert_true(model_config_is_eos(&c, 3));
    assert_false(model_config_is_eos(&c, 4));
    // Absent or null: none, as transformers' generate has none then.
    assert_int_equal(read_generation_config("{\"do_sample\": false}", &c, NULL), SPES_OK);
    assert_false(model_config_is_eos(&c, 3) || model_config_is_eos(&c, 4));
    assert_int_equal(c.eos_token_id, -1);
    assert_int_equal(read_generation_config("{\"eos_token_id\": null}", &c, NULL), SPES_OK);
    assert_int_equal(c.eos_token_id, -1);
    // Refused, naming the file: not an object, broken JSON, an id outside the vocabulary.
    static const struct {
        const char *json, *needle;
    } bad[] = {{"[1, 2]", "generation_config.json: expected a JSON object"},
               {"{\"eos_token_id\": ", "generation_config.json: cannot read JSON"},
               {"{\"eos_token_id\": [1, 64]}", "generation_config.json: \"eos_token_id[1]\" 64 is outside"},
               {"{\"eos_token_id\": \"</s>\"}", "generation_config.json: \"eos_token_id\" must be an integer"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        text = NULL;
        assert_int_equal(read_generation_config(bad[i].json, &c, &text), SPES_ERR);
        assert_null(text);
        if (!strstr(spes_last_error(), bad[i].needle))
            fail_msg("error '%s' does not mention '%s'", spes_last_error(), bad[i].needle);
    }
}

// Decoding settings for `spes generate`: read where given, -1 where absent or null (transformers'
// defaults then), and refused outside transformers' own limits, naming the file and the key.
static void test_generation_settings(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(read_generation_config(NULL, &c, NULL), SPES_OK);
    assert_false(settings.found);
    assert_int_equal(read_generation_config("{\"eos_token_id\": 3}", &c, NULL), SPES_OK);
    assert_true(settings.found);
    assert_int_equal(settings.do_sample, -1);
    assert_true(settings.temperature < 0 && settings.top_p < 0);
    assert_int_equal(settings.top_k, -1);
    assert_int_equal(settings.max_new_tokens, -1);
    assert_int_equal(settings.max_length, -1);
    const char *qwen = "{\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, "
                       "\"max_new_tokens\": 7, \"max_length\": 9}";
    assert_int_equal(read_generation_config(qwen, &c, NULL), SPES_OK);
    assert_int_equal(settings.do_sample, 1);
    assert_float_equal(settings.temperature, 0.6, 1e-12);
    assert_int_equal(settings.top_k, 20);
    assert_float_equal(settings.top_p, 0.95, 1e-12);
    assert_int_equal(settings.max_new_tokens, 7);
    assert_int_equal(settings.max_length, 9);
    assert_int_equal(read_generation_config("{\"do_sample\": false, \"temperature\": null, \"top_k\": 0, "
                                            "\"top_p\": 0}", &c, NULL),
                     SPES_OK);
    assert_int_equal(settings.do_sample, 0);
    assert_true(settings.temperature < 0);
    assert_int_equal(settings.top_k, 0);
    assert_float_equal(settings.top_p, 0.0, 0.0);
    static const struct {
        const char *json, *needle;
    } bad[] = {{"{\"do_sample\": \"yes\"}", "generation_config.json: \"do_sample\" must be true or false"},
               {"{\"temperature\": -0.5}", "generation_config.json: \"temperature\" must be 0 or more, got -0.5"},
               {"{\"temperature\": \"hot\"}", "generation_config.json: \"temperature\" must be a number"},
               {"{\"top_p\": 1.5}", "generation_config.json: \"top_p\" must be in [0, 1], got 1.5"},
               {"{\"top_k\": -1}", "generation_config.json: \"top_k\" must be 0 (no cut) or more, got -1"},
               {"{\"top_k\": 2.5}", "generation_config.json: \"top_k\" must be an integer"},
               {"{\"max_new_tokens\": 0}", "generation_config.json: \"max_new_tokens\" must be a positive integer"},
               {"{\"max_length\": -3}", "generation_config.json: \"max_length\" must be a positive integer"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(read_generation_config(bad[i].json, &c, NULL), SPES_ERR);
        if (!strstr(spes_last_error(), bad[i].needle))
            fail_msg("error '%s' does not mention '%s'", spes_last_error(), bad[i].needle);
    }
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return remove_tree(dir) == SPES_OK ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_impossible_values),
        cmocka_unit_test(test_special_token_ids),
        cmocka_unit_test(test_generation_config),
        cmocka_unit_test(test_generation_settings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
