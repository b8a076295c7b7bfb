#include "model/upcycle.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/rng.h"
#include "model/hf_config.h"
#include "model/hf_import.h"

int router_init_parse(const char *name, RouterInit *out) {
    static const char *names[] = {"zeros", "normal", "scaled_normal", "mlp_based"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) {
            *out = (RouterInit)i;
            return SPES_OK;
        }
    return spes_fail("unknown --router_init '%s' (zeros, normal, scaled_normal or mlp_based)", name);
}

// The dense config.json rewritten as the MoE config it becomes (model_type qwen3_moe,
// moe_intermediate_size = the dense intermediate_size, E experts, top-k, norm_topk_prob),
// then read by hf_config_from_json so every check of an MoE config applies to it as well.
// *tied: the dense model ties lm_head to the embedding. Llama has no QK-norm: the config
// is read as qwen3_moe and qk_norm set to none afterwards.
static int dense_config_read(const char *dir, const UpcycleOptions *opt, ModelConfig *cfg, bool *tied) {
    char *path = path_join(dir, "config.json");
    if (!path) return SPES_ERR;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        int rc = spes_fail("%s: cannot read the dense model's config (%s)", path, root ? "not an object" : jerr.text);
        json_decref(root);
        free(path);
        return rc;
    }
    const char *type = json_string_value(json_object_get(root, "model_type"));
    bool qwen3 = type && !strcmp(type, "qwen3"), llama = type && !strcmp(type, "llama");
    json_t *inter = json_object_get(root, "intermediate_size");
    json_t *mlp_bias = json_object_get(root, "mlp_bias"), *tie = json_object_get(root, "tie_word_embeddings");
    int status = SPES_OK;
    if (!qwen3 && !llama)
        status = spes_fail("%s: model_type \"%s\" is not a dense model we upcycle (qwen3 or llama)", path,
                           type ? type : "(missing)");
    else if (!json_is_integer(inter))
        status = spes_fail("%s: \"intermediate_size\" (an integer) is missing", path);
    else if (mlp_bias && json_is_true(mlp_bias))
        status = spes_fail("%s: \"mlp_bias\" true is not supported", path);
    else if (json_object_get(root, "num_experts") || json_object_get(root, "num_local_experts"))
        status = spes_fail("%s: the model already has experts; upcycling takes a dense model", path);
    else if (tie && !json_is_boolean(tie) && !json_is_null(tie))
        // transformers ties on any truthy value ("yes", 1); reading those as untied took lm_head.weight instead
        status = spes_fail("%s: \"tie_word_embeddings\" must be true or false", path);
    if (status == SPES_OK) {
        *tied = json_is_true(tie);
        json_object_del(root, "tie_word_embeddings");   // frees what tie points at
        json_object_set_new(root, "model_type", json_string("qwen3_moe"));
        json_object_set_new(root, "moe_intermediate_size", json_integer(json_integer_value(inter)));
        json_object_set_new(root, "num_experts", json_integer(opt->num_experts));
        json_object_set_new(root, "num_experts_per_tok", json_integer(opt->top_k));
        json_object_set_new(root, "norm_topk_prob", json_true());
        json_object_set_new(root, "decoder_sparse_step", json_integer(1));
        json_object_set_new(root, "mlp_only_layers", json_array());
        // Errors name the dense config.json (a temporary copy's name used to stand there).
        status = hf_config_from_json(root, path, cfg);
        if (status != SPES_OK) spes_fail_context("upcycle (moe_intermediate_size = the dense intermediate_size)");
    }
    if (status == SPES_OK && llama) cfg->qk_norm = QK_NORM_NONE;
    json_decref(root);
    free(path);
    return status;
}

// Independent random stream per (seed, purpose, layer, expert, tensor).
static void seed_stream(Rng *rng, uint64_t seed, uint64_t purpose, int layer, int expert, int kind) {
    uint64_t key = seed;
    key = key * 0x9E3779B97F4A7C15ull + purpose;
    key = key * 0x9E3779B97F4A7C15ull + (uint64_t)(layer + 1);
    key = key * 0x9E3779B97F4A7C15ull + (uint64_t)(expert + 1);
    key = key * 0x9E3779B97F4A7C15ull + (uint64_t)kind;
    rng_seed(rng, key);
}

static void add_noise(float *w, size_t n, const UpcycleOptions *opt, int layer, int expert, int kind) {
    if (opt->noise_std <= 0.0f || opt->noise_fraction <= 0.0f) return;
    Rng rng;
    seed_stream(&rng, opt->seed, 1, layer, expert, kind);
    for (size_t i = 0; i < n; i++)
        if (rng_uniform(&rng) < opt->noise_fraction) w[i] += (float)(opt->noise_std * rng_normal(&rng));
}

// router[E, H] for one layer; gate[I, H] is the dense gate_proj (for mlp_based).
static int init_router(float *router, const float *gate, const ModelConfig *cfg, const UpcycleOptions *opt, int layer) {
    const int E = cfg->num_experts, H = cfg->d_model, I = cfg->expert_hidden;
    Rng rng;
    seed_stream(&rng, opt->seed, 2, layer, -1, 0);
    switch (opt->router_init) {
    case ROUTER_INIT_ZEROS:
        memset(router, 0, (size_t)E * H * sizeof(float));
        return SPES_OK;
    case ROUTER_INIT_NORMAL:
    case ROUTER_INIT_SCALED_NORMAL: {
        double std = opt->router_init == ROUTER_INIT_NORMAL ? cfg->init_std : 1.0 / sqrt((double)H);
        for (size_t i = 0; i < (size_t)E * H; i++) router[i] = (float)(std * rng_normal(&rng));
        return SPES_OK;
    }
    case ROUTER_INIT_MLP_BASED: {
        if (I < E)
            return spes_fail("--router_init mlp_based needs intermediate_size (%d) >= num_experts (%d)", I, E);
        int *perm = spes_malloc((size_t)I * sizeof(int));
        if (!perm) return SPES_ERR;
        for (int i = 0; i < I; i++) perm[i] = i;
        for (int i = I - 1; i > 0; i--) {   // Fisher-Yates
            int j = (int)rng_below(&rng, (uint64_t)i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int e = 0; e < E; e++) {
            // Group e: permuted rows [e*I/E, (e+1)*I/E).
            int lo = (int)((int64_t)e * I / E), hi = (int)((int64_t)(e + 1) * I / E);
            float *row = router + (size_t)e * H;
            memset(row, 0, (size_t)H * sizeof(float));
            for (int r = lo; r < hi; r++)
                for (int h = 0; h < H; h++) row[h] += gate[(size_t)perm[r] * H + h];
            for (int h = 0; h < H; h++) row[h] /= (float)(hi - lo);
        }
        free(perm);
        return SPES_OK;
    }
    }
    return spes_fail("unknown router init %d", (int)opt->router_init);
}

static int fill_from_dense(const HfTensorSet *set, Model *m, bool tied, const UpcycleOptions *opt) {
    static const char *mlp_names[] = {"gate_proj", "up_proj", "down_proj"};
    const ParamTable *t = &m->table;
    char name[128];
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->entries[i];
        float *w = m->params + p->offset;
        int64_t cols = p->ndim == 2 ? p->shape[1] : 0;
        switch (p->kind) {
        case PARAM_ROUTER: {
            // The dense gate_proj of this layer (for mlp_based) is expert 0's, read first.
            const float *gate = m->params + t->entries[param_table_index(t, PARAM_EXPERT_GATE, p->layer, 0)].offset;
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", p->layer);
            SPES_TRY(hf_tensor_read(set, name, m->cfg.expert_hidden, m->cfg.d_model, (float *)gate));
            SPES_TRY(init_router(w, gate, &m->cfg, opt, p->layer));
            break;
        }
        case PARAM_EXPERT_GATE:
        case PARAM_EXPERT_UP:
        case PARAM_EXPERT_DOWN: {
            int which = p->kind - PARAM_EXPERT_GATE;
            snprintf(name, sizeof name, "model.layers.%d.mlp.%s.weight", p->layer, mlp_names[which]);
            SPES_TRY(hf_tensor_read(set, name, p->shape[0], cols, w));
            add_noise(w, p->numel, opt, p->layer, p->expert, which);
            break;
        }
        case PARAM_LM_HEAD:
            if (tied || !hf_tensors_find(set, p->name)) {
                if (!tied) log_warn("upcycle: the dense model has no lm_head.weight; using the embedding (tied)");
                SPES_TRY(hf_tensor_read(set, "model.embed_tokens.weight", p->shape[0], cols, w));
                break;
            }
            SPES_TRY(hf_tensor_read(set, p->name, p->shape[0], cols, w));
            break;
        default:
            SPES_TRY(hf_tensor_read(set, p->name, p->shape[0], cols, w));
        }
    }
    return SPES_OK;
}

int model_upcycle_dense(const char *dense_dir, const UpcycleOptions *opt, Model *out) {
    if (opt->num_experts < 1 || opt->top_k < 1 || opt->top_k > opt->num_experts)
        return spes_fail("upcycle: need 1 <= top_k (%d) <= num_experts (%d)", opt->top_k, opt->num_experts);
    if (!(opt->noise_std >= 0.0f) || !(opt->noise_fraction >= 0.0f && opt->noise_fraction <= 1.0f))
        return spes_fail("upcycle: noise_std must be >= 0 and noise_fraction in [0, 1] (got %g, %g)",
                         (double)opt->noise_std, (double)opt->noise_fraction);
    ModelConfig cfg;
    bool tied = false;
    SPES_TRY(dense_config_read(dense_dir, opt, &cfg, &tied));
    SPES_TRY(model_create_frozen(out, &cfg));
    HfTensorSet set;
    int status = hf_tensors_open(dense_dir, &set);
    if (status == SPES_OK) {
        status = fill_from_dense(&set, out, tied, opt);
        hf_tensors_close(&set);
    }
    if (status != SPES_OK) {
        model_free(out);
        return spes_fail_context("upcycling %s", dense_dir);
    }
    log_info("upcycle: %d layers, %d experts (top-%d) of hidden %d each, QK-norm %s, embeddings %s", cfg.n_layers,
             cfg.num_experts, cfg.top_k, cfg.expert_hidden, cfg.qk_norm == QK_NORM_HEAD ? "per head" : "none",
             tied ? "tied (lm_head copied from the embedding)" : "untied");
    return SPES_OK;
}
