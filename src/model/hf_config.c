// Hugging Face config.json reading and writing (jansson), with type-checked keys.
#include "model/hf_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/file.h"

typedef struct {
    json_t *root;
    const char *path;
} JsonDoc;

// Integer key; absent (or null when allowed) leaves *out unchanged unless required.
static int get_int(const JsonDoc *d, const char *key, bool required, int *out) {
    json_t *v = json_object_get(d->root, key);
    if (!v || json_is_null(v)) {
        if (required) return spes_fail("%s: required key \"%s\" is missing", d->path, key);
        return SPES_OK;
    }
    if (!json_is_integer(v)) return spes_fail("%s: \"%s\" must be an integer", d->path, key);
    json_int_t x = json_integer_value(v);
    if (x < -2147483647LL || x > 2147483647LL) return spes_fail("%s: \"%s\" = %lld is out of range", d->path, key, (long long)x);
    *out = (int)x;
    return SPES_OK;
}

// A positive integer key (a dimension or count): 0 or less named here, by its HF key, rather
// than later by our field's name.
static int get_dim(const JsonDoc *d, const char *key, bool required, int *out) {
    int v = 0;
    bool present = json_object_get(d->root, key) && !json_is_null(json_object_get(d->root, key));
    SPES_TRY(get_int(d, key, required, &v));
    if (!present) return SPES_OK;
    if (v < 1) return spes_fail("%s: \"%s\" must be a positive integer, got %d", d->path, key, v);
    *out = v;
    return SPES_OK;
}

// A positive, finite number (rope_theta, rms_norm_eps, initializer_range: 0 would divide by
// zero or make RoPE's angles NaN, and the model would load and print garbage). `name` is the
// key as the message shows it (rope_parameters.rope_theta).
static int get_float(const JsonDoc *d, json_t *obj, const char *key, const char *name, float *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return SPES_OK;
    if (!json_is_number(v)) return spes_fail("%s: \"%s\" must be a number", d->path, name);
    double x = json_number_value(v);
    float f = (float)x;
    if (!(x > 0) || !isfinite(f) || f == 0.0f)
        return spes_fail("%s: \"%s\" must be a positive number (in float range), got %g", d->path, name, x);
    *out = f;
    return SPES_OK;
}

static int get_bool(const JsonDoc *d, const char *key, bool *out) {
    json_t *v = json_object_get(d->root, key);
    if (!v || json_is_null(v)) return SPES_OK;
    if (!json_is_boolean(v)) return spes_fail("%s: \"%s\" must be true or false", d->path, key);
    *out = json_is_true(v);
    return SPES_OK;
}

// A key whose value must be `expected` (or absent/null) because we implement nothing else.
static int require_false(const JsonDoc *d, const char *key) {
    json_t *v = json_object_get(d->root, key);
    if (v && !json_is_null(v) && !json_is_false(v))
        return spes_fail("%s: \"%s\" is not supported (must be false or absent)", d->path, key);
    return SPES_OK;
}

// One special token id: an integer row of the embedding (one outside it would index past it or
// never match). `name` is the key as messages show it ("eos_token_id", "eos_token_id[1]").
static int token_id_value(const JsonDoc *d, json_t *v, const char *name, int embedding_size, int *out) {
    if (!json_is_integer(v)) return spes_fail("%s: \"%s\" must be an integer", d->path, name);
    json_int_t x = json_integer_value(v);   // range-checked before the cast, which would wrap
    if (x < 0 || x >= embedding_size)
        return spes_fail("%s: \"%s\" %lld is outside the vocabulary [0, %d)", d->path, name, (long long)x,
                         embedding_size);
    *out = (int)x;
    return SPES_OK;
}

// bos_token_id / pad_token_id: an id, or absent / null for none (-1); transformers refuses a list.
// *absent: the key is missing. transformers' config class then fills in its own default
// (OlmoeConfig: pad 1, eos 50279), where its generate, without a generation_config.json, reads
// config.json's keys as they are (none); a config.json we write leaves the key out again so both
// read the source's ids.
static int get_token_id(const JsonDoc *d, const char *key, int embedding_size, int *out, bool *absent) {
    json_t *v = json_object_get(d->root, key);
    *absent = !v;
    *out = -1;
    if (!v || json_is_null(v)) return SPES_OK;
    if (json_is_array(v)) return spes_fail("%s: \"%s\" must be an integer or null, not a list", d->path, key);
    return token_id_value(d, v, key, embedding_size, out);
}

// eos_token_id: an id, or a list of them (transformers' generate stops at each), kept as read so
// an export writes the same; absent, null or [] is none (eos_token_id -1).
static int get_eos_ids(const JsonDoc *d, ModelConfig *cfg, bool *absent) {
    json_t *v = json_object_get(d->root, "eos_token_id");
    cfg->num_eos_token_ids = 0;   // a list read before (config.json's) is replaced, not kept
    if (!json_is_array(v)) return get_token_id(d, "eos_token_id", cfg->embedding_size, &cfg->eos_token_id, absent);
    *absent = false;
    size_t n = json_array_size(v);
    if (n > MODEL_MAX_EOS_IDS)
        return spes_fail("%s: \"eos_token_id\" lists %zu ids, more than the %d we keep", d->path, n, MODEL_MAX_EOS_IDS);
    cfg->eos_token_id = -1;
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "eos_token_id[%zu]", i);
        SPES_TRY(token_id_value(d, json_array_get(v, i), name, cfg->embedding_size, &cfg->eos_token_ids[i]));
    }
    cfg->num_eos_token_ids = (int)n;
    if (n > 0) cfg->eos_token_id = cfg->eos_token_ids[0];
    return SPES_OK;
}

static int get_special_token_ids(const JsonDoc *d, ModelConfig *cfg) {
    SPES_TRY(get_eos_ids(d, cfg, &cfg->eos_key_absent));
    SPES_TRY(get_token_id(d, "pad_token_id", cfg->embedding_size, &cfg->pad_token_id, &cfg->pad_key_absent));
    SPES_TRY(get_token_id(d, "bos_token_id", cfg->embedding_size, &cfg->bos_token_id, &cfg->bos_key_absent));
    cfg->has_bos_token_id = cfg->bos_token_id >= 0;
    return SPES_OK;
}

static int parse_config(const JsonDoc *d, ModelConfig *cfg) {
    if (!json_is_object(d->root)) return spes_fail("%s: expected a JSON object", d->path);
    json_t *type = json_object_get(d->root, "model_type");
    if (!json_is_string(type)) return spes_fail("%s: \"model_type\" (a string) is missing", d->path);
    const char *model_type = json_string_value(type);
    bool qwen = !strcmp(model_type, "qwen3_moe");
    if (!qwen && strcmp(model_type, "olmoe") != 0)
        return spes_fail("%s: model_type \"%s\" is not supported (olmoe or qwen3_moe)", d->path, model_type);

    memset(cfg, 0, sizeof *cfg);
    cfg->qk_norm = qwen ? QK_NORM_HEAD : QK_NORM_FULL;
    cfg->rope_theta = 10000.0f;
    cfg->norm_eps = qwen ? 1e-6f : 1e-5f;
    cfg->max_seq_len = 4096;
    cfg->init_std = 0.02f;
    cfg->init_cutoff_factor = 3.0f;
    SPES_TRY(get_dim(d, "hidden_size", true, &cfg->d_model));
    SPES_TRY(get_dim(d, "num_attention_heads", true, &cfg->n_heads));
    SPES_TRY(get_dim(d, "num_key_value_heads", false, &cfg->n_kv_heads));
    SPES_TRY(get_dim(d, "head_dim", false, &cfg->head_dim));
    SPES_TRY(get_dim(d, "num_hidden_layers", true, &cfg->n_layers));
    SPES_TRY(get_dim(d, "vocab_size", true, &cfg->embedding_size));
    cfg->vocab_size = cfg->embedding_size;
    SPES_TRY(get_dim(d, "spes_vocab_size", false, &cfg->vocab_size));
    // transformers 5 names it num_local_experts for qwen3_moe (num_experts is its alias)
    const char *experts_key = json_object_get(d->root, "num_experts") ? "num_experts" : "num_local_experts";
    SPES_TRY(get_dim(d, experts_key, true, &cfg->num_experts));
    SPES_TRY(get_dim(d, "num_experts_per_tok", true, &cfg->top_k));
    SPES_TRY(get_dim(d, qwen ? "moe_intermediate_size" : "intermediate_size", true, &cfg->expert_hidden));
    SPES_TRY(get_dim(d, "max_position_embeddings", false, &cfg->max_seq_len));
    SPES_TRY(get_float(d, d->root, "rope_theta", "rope_theta", &cfg->rope_theta));
    json_t *rope = json_object_get(d->root, "rope_parameters");
    if (json_is_object(rope)) {
        json_t *rt = json_object_get(rope, "rope_type");
        if (rt && !json_is_null(rt) && (!json_is_string(rt) || strcmp(json_string_value(rt), "default") != 0))
            return spes_fail("%s: rope_parameters.rope_type must be \"default\"", d->path);
        float outer = cfg->rope_theta, inner = 0;
        SPES_TRY(get_float(d, rope, "rope_theta", "rope_parameters.rope_theta", &inner));
        // Both written (our export, transformers 4.5x) must agree: one silently winning over
        // the other would run a model its config file does not describe.
        if (inner > 0 && json_object_get(d->root, "rope_theta") && !json_is_null(json_object_get(d->root, "rope_theta")) &&
            inner != outer)
            return spes_fail("%s: \"rope_theta\" (%g) and \"rope_parameters.rope_theta\" (%g) differ; which one "
                             "the model was trained with is unclear",
                             d->path, (double)outer, (double)inner);
        if (inner > 0) cfg->rope_theta = inner;
    }
    json_t *scaling = json_object_get(d->root, "rope_scaling");
    if (scaling && !json_is_null(scaling)) return spes_fail("%s: \"rope_scaling\" is not supported", d->path);
    SPES_TRY(get_float(d, d->root, "rms_norm_eps", "rms_norm_eps", &cfg->norm_eps));
    SPES_TRY(get_float(d, d->root, "initializer_range", "initializer_range", &cfg->init_std));
    SPES_TRY(get_bool(d, "norm_topk_prob", &cfg->normalize_expert_weights));
    SPES_TRY(get_special_token_ids(d, cfg));

    SPES_TRY(require_false(d, "attention_bias"));
    SPES_TRY(require_false(d, "tie_word_embeddings"));
    SPES_TRY(require_false(d, "use_sliding_window"));
    json_t *act = json_object_get(d->root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return spes_fail("%s: \"hidden_act\" must be \"silu\"", d->path);
    json_t *clip = json_object_get(d->root, "clip_qkv");
    if (clip && !json_is_null(clip)) return spes_fail("%s: \"clip_qkv\" is not supported (must be null)", d->path);
    if (qwen) {
        int step = 1;
        SPES_TRY(get_int(d, "decoder_sparse_step", false, &step));
        json_t *dense = json_object_get(d->root, "mlp_only_layers");
        if (step != 1 || (dense && !json_is_null(dense) && (!json_is_array(dense) || json_array_size(dense) > 0)))
            return spes_fail("%s: dense (non-MoE) layers are not supported: decoder_sparse_step must be 1 and "
                             "mlp_only_layers empty",
                             d->path);
    }
    if (model_config_validate(cfg) != SPES_OK) return spes_fail_context("%s", d->path);
    return SPES_OK;
}

int hf_config_from_json(json_t *root, const char *path, ModelConfig *cfg) {
    JsonDoc d = {root, path};
    return parse_config(&d, cfg);
}

int hf_config_read(const char *dir_or_file, ModelConfig *cfg) {
    struct stat st;
    char *path = NULL;
    if (stat(dir_or_file, &st) != 0)
        return spes_fail("%s does not exist (expected a model directory with config.json, or a config.json)",
                         dir_or_file);
    if (S_ISDIR(st.st_mode)) {
        path = path_join(dir_or_file, "config.json");
        if (!path) return SPES_ERR;
    }
    const char *p = path ? path : dir_or_file;
    json_error_t err;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &err);
    int rc;
    if (!root) {
        rc = spes_fail("%s: cannot read JSON (line %d: %s)", p, err.line, err.text);
    } else {
        rc = hf_config_from_json(root, p, cfg);
        json_decref(root);
    }
    free(path);
    return rc;
}

int hf_config_read_token_ids(const char *dir, ModelConfig *ids) {
    char *path = path_join(dir, "config.json");
    if (!path) return SPES_ERR;
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    JsonDoc d = {root, path};
    int rc = !root                   ? spes_fail("%s: cannot read JSON (line %d: %s)", path, err.line, err.text)
             : !json_is_object(root) ? spes_fail("%s: expected a JSON object", path)
                                     : get_special_token_ids(&d, ids);
    json_decref(root);
    free(path);
    return rc;
}

static bool has_value(const JsonDoc *d, const char *key) {
    json_t *v = json_object_get(d->root, key);
    return v && !json_is_null(v);
}

// A number key of generation_config.json, >= min and (when max is finite) <= max; absent or
// null leaves *out.
static int get_setting(const JsonDoc *d, const char *key, double min, double max, double *out) {
    if (!has_value(d, key)) return SPES_OK;
    json_t *v = json_object_get(d->root, key);
    if (!json_is_number(v)) return spes_fail("%s: \"%s\" must be a number", d->path, key);
    double x = json_number_value(v);
    if (isinf(max) && !(x >= min)) return spes_fail("%s: \"%s\" must be %g or more, got %g", d->path, key, min, x);
    if (!(x >= min && x <= max)) return spes_fail("%s: \"%s\" must be in [%g, %g], got %g", d->path, key, min, max, x);
    *out = x;
    return SPES_OK;
}

// Keys of generation_config.json that change what transformers' generate (5.23) decodes and that
// spes generate does not implement (_get_logits_processor, _get_stopping_criteria,
// GenerationConfig.get_generation_mode), each with the values at which it does nothing and what
// we do instead. Keys that change nothing in the chosen tokens (output_scores, use_cache,
// renormalize_logits, length_penalty without beams, ...) are not listed.
typedef enum {
    INERT_NULL,        // acts when not null
    INERT_AT_MOST_1,   // a number: acts above 1 (num_beams, num_return_sequences)
    INERT_AT_MOST_0,   // a number: acts above 0 (no_repeat_ngram_size, min_new_tokens, penalty_alpha)
    INERT_1,           // a number: acts unless 1 (guidance_scale, encoder_repetition_penalty)
    INERT_OUTSIDE_01,  // a number: acts strictly inside (0, 1) (typical_p 1 and the cutoffs 0 are off)
} InertWhen;

static const struct {
    const char *key;
    InertWhen inert;
    bool sampling_only;   // a warper: acts only when do_sample
    const char *instead;
} unfollowed_keys[] = {
    {"num_beams", INERT_AT_MOST_1, false, "one sequence, no beam search"},
    {"num_return_sequences", INERT_AT_MOST_1, false, "one sequence"},
    {"penalty_alpha", INERT_AT_MOST_0, false, "no contrastive search"},
    {"constraints", INERT_NULL, false, "unconstrained"},
    {"force_words_ids", INERT_NULL, false, "unconstrained"},
    {"no_repeat_ngram_size", INERT_AT_MOST_0, false, "n-grams may repeat"},
    {"encoder_no_repeat_ngram_size", INERT_AT_MOST_0, false, "prompt n-grams may repeat"},
    {"encoder_repetition_penalty", INERT_1, false, "not applied"},
    {"guidance_scale", INERT_1, false, "no classifier-free guidance"},
    {"sequence_bias", INERT_NULL, false, "not applied"},
    {"bad_words_ids", INERT_NULL, false, "not banned"},
    {"suppress_tokens", INERT_NULL, false, "not suppressed"},
    {"begin_suppress_tokens", INERT_NULL, false, "not suppressed"},
    {"forced_bos_token_id", INERT_NULL, false, "not forced"},
    {"forced_eos_token_id", INERT_NULL, false, "not forced"},
    {"min_length", INERT_AT_MOST_0, false, "eos allowed from the start"},
    {"min_new_tokens", INERT_AT_MOST_0, false, "eos allowed from the start"},
    {"exponential_decay_length_penalty", INERT_NULL, false, "not applied"},
    {"watermarking_config", INERT_NULL, false, "no watermark"},
    {"stop_strings", INERT_NULL, false, "stops at eos ids only"},
    {"max_time", INERT_NULL, false, "no time limit"},
    {"top_h", INERT_NULL, true, "not applied"},
    {"typical_p", INERT_OUTSIDE_01, true, "not applied"},
    {"epsilon_cutoff", INERT_OUTSIDE_01, true, "not applied"},
    {"eta_cutoff", INERT_OUTSIDE_01, true, "not applied"},
};

static bool key_acts(json_t *v, InertWhen inert) {
    if (!v || json_is_null(v)) return false;
    if (inert == INERT_NULL) return true;
    if (!json_is_number(v)) return true;   // not a number transformers reads as off: it acts or fails there
    double x = json_number_value(v);
    switch (inert) {
    case INERT_AT_MOST_1: return x > 1;
    case INERT_AT_MOST_0: return x > 0;
    case INERT_1: return x != 1;
    case INERT_OUTSIDE_01: return x > 0 && x < 1;
    default: return true;
    }
}

// Appends "key value (instead)" to a comma-separated list.
static void list_unfollowed(char *list, size_t cap, const char *key, json_t *v, const char *instead) {
    char *value = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    size_t n = strlen(list);
    snprintf(list + n, cap - n, "%s%s %.40s (%s)", n ? ", " : "", key, value ? value : "?", instead);
    free(value);
}

// The decoding settings, within transformers' own limits (TemperatureLogitsWarper,
// TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor and
// GenerationConfig.validate refuse values outside them).
static int get_generation_settings(const JsonDoc *d, HfGenerationSettings *s) {
    *s = (HfGenerationSettings){.found = true, .do_sample = -1, .temperature = -1, .top_k = -1, .top_p = -1,
                                .min_p = -1, .repetition_penalty = -1, .max_new_tokens = -1, .max_length = -1};
    for (size_t i = 0; i < sizeof unfollowed_keys / sizeof unfollowed_keys[0]; i++) {
        json_t *v = json_object_get(d->root, unfollowed_keys[i].key);
        if (!key_acts(v, unfollowed_keys[i].inert)) continue;
        if (unfollowed_keys[i].sampling_only)
            list_unfollowed(s->not_followed_sampling, sizeof s->not_followed_sampling, unfollowed_keys[i].key, v,
                            unfollowed_keys[i].instead);
        else
            list_unfollowed(s->not_followed, sizeof s->not_followed, unfollowed_keys[i].key, v,
                            unfollowed_keys[i].instead);
    }
    SPES_TRY(get_setting(d, "min_p", 0.0, 1.0, &s->min_p));
    SPES_TRY(get_setting(d, "repetition_penalty", 0.0, INFINITY, &s->repetition_penalty));
    if (s->repetition_penalty == 0)
        return spes_fail("%s: \"repetition_penalty\" must be above 0 (1: none), got 0", d->path);
    if (has_value(d, "do_sample")) {
        bool b = false;
        SPES_TRY(get_bool(d, "do_sample", &b));
        s->do_sample = b;
    }
    SPES_TRY(get_setting(d, "temperature", 0.0, INFINITY, &s->temperature));
    SPES_TRY(get_setting(d, "top_p", 0.0, 1.0, &s->top_p));
    if (has_value(d, "top_k")) {
        SPES_TRY(get_int(d, "top_k", true, &s->top_k));
        if (s->top_k < 0) return spes_fail("%s: \"top_k\" must be 0 (no cut) or more, got %d", d->path, s->top_k);
    }
    SPES_TRY(get_dim(d, "max_new_tokens", false, &s->max_new_tokens));
    return get_dim(d, "max_length", false, &s->max_length);
}

int hf_generation_config_read(const char *dir, ModelConfig *cfg, HfGenerationSettings *settings, char **text,
                              size_t *len) {
    if (text) *text = NULL;
    if (settings) *settings = (HfGenerationSettings){.found = false};
    char *path = path_join(dir, "generation_config.json");
    if (!path) return SPES_ERR;
    if (!file_exists(path)) {
        free(path);
        return SPES_OK;
    }
    uint8_t *data = NULL;
    size_t n = 0;
    int rc = file_read_all(path, &data, &n);
    json_error_t err;
    json_t *root = rc == SPES_OK ? json_loadb((const char *)data, n, JSON_REJECT_DUPLICATES, &err) : NULL;
    if (rc == SPES_OK && !json_is_object(root))
        rc = root ? spes_fail("%s: expected a JSON object", path)
                  : spes_fail("%s: cannot read JSON (line %d: %s)", path, err.line, err.text);
    JsonDoc d = {root, path};
    bool absent;   // of generation_config.json: not the config.json key's
    if (rc == SPES_OK) rc = get_eos_ids(&d, cfg, &absent);
    if (rc == SPES_OK && settings) rc = get_generation_settings(&d, settings);
    json_decref(root);
    free(path);
    if (rc == SPES_OK && text) {
        *text = (char *)data;
        *len = n;
    } else {
        free(data);
    }
    return rc;
}

static int set_new(json_t *obj, const char *key, json_t *value) {
    if (!value || json_object_set_new(obj, key, value) != 0)
        return spes_fail("cannot set the JSON key \"%s\" (out of memory)", key);
    return SPES_OK;
}

// An id, or null for none (what save_pretrained writes for None).
static json_t *token_id_or_null(int id) { return id >= 0 ? json_integer(id) : json_null(); }

int hf_config_put_token_ids(const ModelConfig *cfg, json_t *obj, HfIdsFile file) {
    bool config = file == HF_IDS_CONFIG_JSON;   // there an absent key stays absent
    if (!(config && cfg->bos_key_absent))
        SPES_TRY(set_new(obj, "bos_token_id", token_id_or_null(cfg->has_bos_token_id ? cfg->bos_token_id : -1)));
    if (!(config && cfg->eos_key_absent)) {
        json_t *eos = cfg->num_eos_token_ids > 0 ? json_array() : token_id_or_null(cfg->eos_token_id);
        for (int i = 0; eos && i < cfg->num_eos_token_ids; i++)
            if (json_array_append_new(eos, json_integer(cfg->eos_token_ids[i])) != 0) {
                json_decref(eos);
                eos = NULL;
            }
        SPES_TRY(set_new(obj, "eos_token_id", eos));
    }
    if (config && cfg->pad_key_absent) return SPES_OK;
    return set_new(obj, "pad_token_id", token_id_or_null(cfg->pad_token_id));
}

// The double a reader should see for a float field: the shortest decimal that rounds back to
// the same float (1e-5f is written as 1e-05, not 9.99999975e-06, so HF computes with 1e-5).
static json_t *json_float(float f) {
    char buf[32];
    for (int precision = 1; precision <= 9; precision++) {
        snprintf(buf, sizeof buf, "%.*g", precision, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}


static int build_config(const ModelConfig *cfg, bool qwen, const char *torch_dtype, json_t *o) {
    SPES_TRY(set_new(o, "architectures", json_pack("[s]", qwen ? "Qwen3MoeForCausalLM" : "OlmoeForCausalLM")));
    SPES_TRY(set_new(o, "model_type", json_string(qwen ? "qwen3_moe" : "olmoe")));
    SPES_TRY(set_new(o, "hidden_size", json_integer(cfg->d_model)));
    SPES_TRY(set_new(o, "num_attention_heads", json_integer(cfg->n_heads)));
    SPES_TRY(set_new(o, "num_key_value_heads", json_integer(cfg->n_kv_heads)));
    SPES_TRY(set_new(o, "head_dim", json_integer(cfg->head_dim)));
    SPES_TRY(set_new(o, "num_hidden_layers", json_integer(cfg->n_layers)));
    SPES_TRY(set_new(o, "vocab_size", json_integer(cfg->embedding_size)));
    if (cfg->vocab_size != cfg->embedding_size) SPES_TRY(set_new(o, "spes_vocab_size", json_integer(cfg->vocab_size)));
    SPES_TRY(set_new(o, "num_experts", json_integer(cfg->num_experts)));
    SPES_TRY(set_new(o, "num_experts_per_tok", json_integer(cfg->top_k)));
    SPES_TRY(set_new(o, qwen ? "moe_intermediate_size" : "intermediate_size", json_integer(cfg->expert_hidden)));
    if (qwen) {
        SPES_TRY(set_new(o, "num_local_experts", json_integer(cfg->num_experts)));   // transformers >= 5
        SPES_TRY(set_new(o, "intermediate_size", json_integer(cfg->expert_hidden)));   // unused: no dense layers
        SPES_TRY(set_new(o, "decoder_sparse_step", json_integer(1)));
        SPES_TRY(set_new(o, "mlp_only_layers", json_array()));
        SPES_TRY(set_new(o, "use_sliding_window", json_false()));
    } else {
        SPES_TRY(set_new(o, "clip_qkv", json_null()));
    }
    SPES_TRY(set_new(o, "max_position_embeddings", json_integer(cfg->max_seq_len)));
    SPES_TRY(set_new(o, "rope_theta", json_float(cfg->rope_theta)));
    SPES_TRY(set_new(o, "rope_parameters", json_pack("{s:s, s:o}", "rope_type", "default", "rope_theta",
                                                     json_float(cfg->rope_theta))));
    SPES_TRY(set_new(o, "rms_norm_eps", json_float(cfg->norm_eps)));
    SPES_TRY(set_new(o, "norm_topk_prob", json_boolean(cfg->normalize_expert_weights)));
    SPES_TRY(set_new(o, "initializer_range", json_float(cfg->init_std)));
    SPES_TRY(set_new(o, "hidden_act", json_string("silu")));
    SPES_TRY(set_new(o, "attention_bias", json_false()));
    SPES_TRY(set_new(o, "attention_dropout", json_real(0.0)));
    SPES_TRY(set_new(o, "tie_word_embeddings", json_false()));
    SPES_TRY(hf_config_put_token_ids(cfg, o, HF_IDS_CONFIG_JSON));
    SPES_TRY(set_new(o, "output_router_logits", json_false()));
    SPES_TRY(set_new(o, "use_cache", json_true()));
    SPES_TRY(set_new(o, "dtype", json_string(torch_dtype)));
    SPES_TRY(set_new(o, "torch_dtype", json_string(torch_dtype)));
    return SPES_OK;
}

int hf_config_write(const ModelConfig *cfg, const char *format, const char *torch_dtype, const char *path) {
    bool qwen = !strcmp(format, "qwen3_moe");
    if (!qwen && strcmp(format, "olmoe") != 0)
        return spes_fail("config.json format \"%s\" is not supported (olmoe or qwen3_moe)", format);
    QkNormMode needed = qwen ? QK_NORM_HEAD : QK_NORM_FULL;
    if (cfg->qk_norm != needed)
        return spes_fail("%s: format %s needs QK-norm %s, the model has %s", path, format, qwen ? "head" : "full",
                         cfg->qk_norm == QK_NORM_FULL ? "full" : cfg->qk_norm == QK_NORM_HEAD ? "head" : "none");
    json_t *o = json_object();
    if (!o) return spes_fail("%s: out of memory", path);
    int rc = build_config(cfg, qwen, torch_dtype, o);
    char *text = rc == SPES_OK ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    if (rc != SPES_OK) return spes_fail_context("%s", path);
    if (!text) return spes_fail("%s: cannot serialise config.json", path);
    size_t len = strlen(text);
    text[len] = '\0';
    rc = file_write_atomic(path, text, len);
    free(text);
    return rc;
}
