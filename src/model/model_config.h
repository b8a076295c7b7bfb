// Model hyper-parameters (OLMoE architecture, see DESIGN.md) and loss weights.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    QK_NORM_NONE = 0,
    QK_NORM_FULL,   // HF OLMoE: q_norm over [n_heads*head_dim], k_norm over [n_kv_heads*head_dim], before the head split
    QK_NORM_HEAD,   // Qwen3 / attention_layer_norm_over_head: q_norm, k_norm over [head_dim], per head
} QkNormMode;

#define MODEL_MAX_EOS_IDS 16   // the longest eos_token_id list a config.json may give

typedef struct {
    int d_model;            // H
    int n_heads;            // attention heads
    int n_kv_heads;         // GQA groups (== n_heads for MHA)
    int head_dim;           // hd (d_model / n_heads unless set)
    int n_layers;           // L
    int vocab_size;         // tokens the tokenizer can emit
    int embedding_size;     // rows of embed_tokens and lm_head (>= vocab_size, padded)
    int num_experts;        // E
    int top_k;              // k
    int expert_hidden;      // I: rows of gate_proj/up_proj
    int max_seq_len;
    float rope_theta;
    float norm_eps;         // RMSNorm eps (inside the rsqrt)
    QkNormMode qk_norm;
    bool normalize_expert_weights;   // renormalise top-k probabilities (norm_topk_prob)
    float init_std;
    float init_cutoff_factor;        // truncation at +-cutoff*std; <= 0: no truncation
    int eos_token_id;   // end of sequence (of a list, the first); -1: none known
    int pad_token_id;   // -1: none known
    // Hugging Face config.json ids beyond those two, kept so an export writes back what it read.
    // Zero, as in a config built from YAML: no bos, and eos_token_id is one id, not a list.
    bool has_bos_token_id;
    int bos_token_id;
    int num_eos_token_ids;   // > 0: "eos_token_id" was this list; eos_token_ids[0] == eos_token_id
    int eos_token_ids[MODEL_MAX_EOS_IDS];
    // Keys config.json lacked (the ids above are none then). transformers' config class fills in
    // its default there (OlmoeConfig: eos 50279, pad 1), so a config.json we write leaves the key
    // out again rather than writing null, which it reads as None. False in a config from YAML.
    bool bos_key_absent, eos_key_absent, pad_key_absent;
} ModelConfig;

// Weights of the four loss terms (DESIGN.md "Losses"). Total =
// ce + lm_z_mult*lm_z + lb_weight*lb + router_z_weight*router_z, where each term below is the
// unweighted quantity:
//   lm_z      = mean over non-ignored targets of logsumexp(logits)^2
//   lb        = E/(L*N*k) * sum_{l,e} c_{l,e} * count_{l,e} * meanprob_{l,e}   (MegaBlocks form)
//   router_z  = sum_l mean_tok(logsumexp(router_logits_l)^2)
typedef struct {
    float lm_z_mult;         // softmax_auxiliary_loss ? auxiliary_loss_multiplier : 0
    float lb_weight;         // moe_loss_weight
    float router_z_weight;   // moe_zloss_weight
    const float *lb_count_factor;   // [L*E] c_{l,e} (decayed aux loss), NULL = all 1
    double ce_tokens;        // what the ce and lm_z sums are divided by instead of the micro-batch's
                             // target count (0: by that count, the means above). Training passes its
                             // share of the batch's tokens, as OLMo's trainer divides by the batch's
                             // token count, masked and last positions included (train/trainer.c).
} LossWeights;

typedef struct {
    double ce, lm_z, lb, router_z, total;   // unweighted terms + weighted total
    int64_t num_targets;                   // non-ignored targets counted in ce
} LossValues;

#define IGNORE_INDEX (-100)

// Largest dimensions model_config_validate accepts: beyond them the int64 shapes and int indices
// of the model code could overflow. (The config loader checks them too, to name file:line.)
#define MODEL_MAX_WIDTH (1LL << 24)   // d_model, embedding_size, expert_hidden, n_heads * head_dim
#define MODEL_MAX_EXPERTS 65536
#define MODEL_MAX_LAYERS 65536

// Fills derived fields (head_dim, embedding_size) and checks consistency. Error names the field.
int model_config_validate(ModelConfig *cfg);
// Whether `token` ends a sequence: eos_token_id, or any id of the eos_token_id list
// (transformers' generate stops at each of them).
bool model_config_is_eos(const ModelConfig *cfg, int token);
// Copies the special token id fields (bos, eos and its list, pad, the absent-key flags).
void model_config_copy_token_ids(ModelConfig *to, const ModelConfig *from);
// The eos ids as a reader should see them: "5", "[5, 6]" or "none".
void model_config_describe_eos(const ModelConfig *cfg, char *out, size_t cap);
// The tiny/bench presets used by tests and benchmarks ("tiny", "bench-small").
int model_config_preset(const char *name, ModelConfig *cfg);
