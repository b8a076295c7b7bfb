// Hugging Face config.json <-> ModelConfig, for "olmoe" (OlmoeForCausalLM, QK-norm over the
// whole projection) and "qwen3_moe" (Qwen3MoeForCausalLM, QK-norm per head).
//
// Keys: hidden_size, num_attention_heads, num_key_value_heads, head_dim (optional: else
// hidden_size / num_attention_heads), num_hidden_layers, vocab_size, num_experts (qwen3_moe
// in transformers 5: num_local_experts),
// num_experts_per_tok, intermediate_size (olmoe) / moe_intermediate_size (qwen3_moe),
// rope_theta (or rope_parameters.rope_theta), rms_norm_eps, norm_topk_prob,
// max_position_embeddings, initializer_range, bos_token_id, eos_token_id (an id or a list),
// pad_token_id (absent or null: none, as transformers' generate reads them without a
// generation_config.json; an absent key is written back absent, since transformers' config
// class then fills in its default: OlmoeConfig's eos 50279 and pad 1).
// HF's vocab_size is our embedding_size (the padded row count); our tokenizer vocab size,
// when smaller, travels in the extra key "spes_vocab_size".
#pragma once
#include <jansson.h>

#include "model/model_config.h"

// Reads <dir_or_file>/config.json (or the file itself) into *cfg (validated). Features we
// do not implement (biases, clip_qkv, tied embeddings, dense layers, sliding windows,
// another activation) are an error naming the key.
int hf_config_read(const char *dir_or_file, ModelConfig *cfg);
// The same checks on a config already parsed; errors name `path`.
int hf_config_from_json(json_t *root, const char *path, ModelConfig *cfg);

// Only the special token ids of <dir>/config.json (bos, eos or its list, pad, which keys are
// absent) into *ids, each checked against ids->embedding_size; its other fields are unchanged.
int hf_config_read_token_ids(const char *dir, ModelConfig *ids);

typedef enum {
    HF_IDS_CONFIG_JSON,             // a key the source config.json lacked is left out again
    HF_IDS_GENERATION_CONFIG_JSON,  // every key, null where none (the source's keys as they are)
} HfIdsFile;
// Puts bos_token_id, eos_token_id (an id, or the list it was read as) and pad_token_id into obj,
// null where none is known.
int hf_config_put_token_ids(const ModelConfig *cfg, json_t *obj, HfIdsFile file);
// Writes config.json atomically. format: "olmoe" | "qwen3_moe"; torch_dtype: "float32" |
// "bfloat16" (the dtype the weights are stored in).
int hf_config_write(const ModelConfig *cfg, const char *format, const char *torch_dtype, const char *path);

// The decoding settings of a generation_config.json that `spes generate` can follow. Each is
// -1 where the file lacks the key or has it null: transformers' generate then takes its own
// global default (do_sample false, temperature 1, top_k 50, top_p 1, repetition_penalty 1, no
// min_p).
typedef struct {
    bool found;                  // the directory has generation_config.json
    int do_sample;               // 0 / 1
    double temperature;          // >= 0
    int top_k;                   // >= 0 (0: no cut)
    double top_p;                // in [0, 1]
    double min_p;                // in [0, 1]
    double repetition_penalty;   // > 0
    int max_new_tokens;          // >= 1
    int max_length;              // >= 1: prompt and new tokens together
    // Keys with values that make transformers' generate decode otherwise and that we do not
    // implement ("num_beams 4 (beam search; we decode one sequence), ..."), "" when none; those
    // acting on sampling alone (typical_p, ...) apart, as they matter only when we sample.
    char not_followed[512];
    char not_followed_sampling[256];
} HfGenerationSettings;

// <dir>/generation_config.json, transformers' GenerationConfig file, when the directory has
// one (else nothing is changed and *text is NULL). It must be a JSON object; its eos_token_id
// (an id or a list, each inside cfg's vocabulary; absent or null: none) replaces cfg's eos ids,
// because transformers' generate then stops at the file's ids alone, not config.json's
// (transformers 5.23). settings (when not NULL): the file's decoding settings, type- and
// range-checked (an export, passing NULL, carries the file without judging them). *text (when
// text is not NULL): the file's bytes, malloc'd, to carry it unchanged.
int hf_generation_config_read(const char *dir, ModelConfig *cfg, HfGenerationSettings *settings, char **text,
                              size_t *len);
