// Model config validation and the presets used by tests and benchmarks.
#include "model/model_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static int require_positive(const char *field, long value) {
    if (value <= 0) return spes_fail("model config: %s must be > 0 (got %ld)", field, value);
    return SPES_OK;
}

int model_config_validate(ModelConfig *cfg) {
    SPES_TRY(require_positive("d_model", cfg->d_model));
    SPES_TRY(require_positive("n_heads", cfg->n_heads));
    if (cfg->n_kv_heads == 0) cfg->n_kv_heads = cfg->n_heads;
    SPES_TRY(require_positive("n_kv_heads", cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return spes_fail("model config: n_heads (%d) must be a multiple of n_kv_heads (%d)", cfg->n_heads,
                         cfg->n_kv_heads);
    if (cfg->head_dim == 0) {
        if (cfg->d_model % cfg->n_heads != 0)
            return spes_fail("model config: d_model (%d) is not divisible by n_heads (%d); set head_dim explicitly",
                             cfg->d_model, cfg->n_heads);
        cfg->head_dim = cfg->d_model / cfg->n_heads;
    }
    SPES_TRY(require_positive("head_dim", cfg->head_dim));
    if (cfg->head_dim % 2 != 0)
        return spes_fail("model config: head_dim (%d) must be even for rotary embeddings", cfg->head_dim);
    SPES_TRY(require_positive("n_layers", cfg->n_layers));
    SPES_TRY(require_positive("vocab_size", cfg->vocab_size));
    if (cfg->embedding_size == 0) cfg->embedding_size = cfg->vocab_size;
    if (cfg->embedding_size < cfg->vocab_size)
        return spes_fail("model config: embedding_size (%d) must be >= vocab_size (%d)", cfg->embedding_size,
                         cfg->vocab_size);
    SPES_TRY(require_positive("num_experts", cfg->num_experts));
    SPES_TRY(require_positive("top_k", cfg->top_k));
    if (cfg->top_k > cfg->num_experts)
        return spes_fail("model config: top_k (%d) must be <= num_experts (%d)", cfg->top_k, cfg->num_experts);
    SPES_TRY(require_positive("expert_hidden", cfg->expert_hidden));
    SPES_TRY(require_positive("max_seq_len", cfg->max_seq_len));
    if (!(cfg->rope_theta > 0.0f) || !isfinite(cfg->rope_theta))
        return spes_fail("model config: rope_theta must be a positive number (got %g)", (double)cfg->rope_theta);
    if (!(cfg->norm_eps > 0.0f) || !isfinite(cfg->norm_eps))
        return spes_fail("model config: norm_eps must be a positive number (got %g)", (double)cfg->norm_eps);
    if (cfg->qk_norm != QK_NORM_NONE && cfg->qk_norm != QK_NORM_FULL && cfg->qk_norm != QK_NORM_HEAD)
        return spes_fail("model config: qk_norm has an unknown value %d", (int)cfg->qk_norm);
    if (!(cfg->init_std > 0.0f) || !isfinite(cfg->init_std))
        return spes_fail("model config: init_std must be a positive number (got %g)", (double)cfg->init_std);
    if (!isfinite(cfg->init_cutoff_factor))
        return spes_fail("model config: init_cutoff_factor must be finite");
    // Very large dimensions would overflow the int64 shapes / int indices used below.
    const long long limit = MODEL_MAX_WIDTH;
    if (cfg->d_model > limit || cfg->embedding_size > limit || cfg->expert_hidden > limit ||
        (long long)cfg->n_heads * cfg->head_dim > limit || cfg->num_experts > MODEL_MAX_EXPERTS ||
        cfg->n_layers > MODEL_MAX_LAYERS)
        return spes_fail("model config: dimensions are implausibly large (d_model %d, embedding_size %d, "
                         "expert_hidden %d, heads*head_dim %lld, experts %d, layers %d)",
                         cfg->d_model, cfg->embedding_size, cfg->expert_hidden,
                         (long long)cfg->n_heads * cfg->head_dim, cfg->num_experts, cfg->n_layers);
    return SPES_OK;
}

bool model_config_is_eos(const ModelConfig *cfg, int token) {
    if (token < 0) return false;   // -1 is "no eos", never a token
    if (token == cfg->eos_token_id) return true;
    for (int i = 0; i < cfg->num_eos_token_ids; i++)
        if (token == cfg->eos_token_ids[i]) return true;
    return false;
}

void model_config_copy_token_ids(ModelConfig *to, const ModelConfig *from) {
    to->eos_token_id = from->eos_token_id;
    to->num_eos_token_ids = from->num_eos_token_ids;
    memcpy(to->eos_token_ids, from->eos_token_ids, sizeof to->eos_token_ids);
    to->pad_token_id = from->pad_token_id;
    to->has_bos_token_id = from->has_bos_token_id;
    to->bos_token_id = from->bos_token_id;
    to->bos_key_absent = from->bos_key_absent;
    to->eos_key_absent = from->eos_key_absent;
    to->pad_key_absent = from->pad_key_absent;
}

void model_config_describe_eos(const ModelConfig *cfg, char *out, size_t cap) {
    if (cfg->num_eos_token_ids == 0) {
        if (cfg->eos_token_id >= 0) snprintf(out, cap, "%d", cfg->eos_token_id);
        else snprintf(out, cap, "none");
        return;
    }
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < cfg->num_eos_token_ids && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? ", " : "", cfg->eos_token_ids[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

// Values every preset shares (OLMoE defaults).
static ModelConfig preset_defaults(void) {
    ModelConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.rope_theta = 10000.0f;
    cfg.norm_eps = 1e-5f;
    cfg.qk_norm = QK_NORM_FULL;
    cfg.normalize_expert_weights = false;
    cfg.init_std = 0.02f;
    cfg.init_cutoff_factor = 3.0f;
    cfg.eos_token_id = 0;
    cfg.pad_token_id = 1;
    return cfg;
}

int model_config_preset(const char *name, ModelConfig *cfg) {
    ModelConfig c = preset_defaults();
    if (!strcmp(name, "tiny")) {
        // Small enough for finite-difference checks; GQA (4 heads over 2 kv heads) and a
        // padded embedding so every code path is exercised.
        c.d_model = 32;
        c.n_heads = 4;
        c.n_kv_heads = 2;
        c.head_dim = 8;
        c.n_layers = 2;
        c.vocab_size = 64;
        c.embedding_size = 72;
        c.num_experts = 8;
        c.top_k = 2;
        c.expert_hidden = 16;
        c.max_seq_len = 64;
    } else if (!strcmp(name, "bench-small")) {
        // rope_theta / eps as the SPES configs (and bench/train_step_torch.py)
        c.rope_theta = 500000.0f;
        c.norm_eps = 1e-6f;
        c.d_model = 512;
        c.n_heads = 8;
        c.n_kv_heads = 8;
        c.head_dim = 64;
        c.n_layers = 4;
        c.vocab_size = 8192;
        c.embedding_size = 8192;
        c.num_experts = 8;
        c.top_k = 2;
        c.expert_hidden = 1024;
        c.max_seq_len = 256;
    } else {
        return spes_fail("unknown model preset '%s' (known: tiny, bench-small)", name);
    }
    SPES_TRY(model_config_validate(&c));
    *cfg = c;
    return SPES_OK;
}
