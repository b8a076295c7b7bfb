#include "model/export.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "model/hf_config.h"

int hf_format_parse(const char *name, HfFormat *out) {
    if (!strcmp(name, "auto")) *out = HF_FORMAT_AUTO;
    else if (!strcmp(name, "olmoe")) *out = HF_FORMAT_OLMOE;
    else if (!strcmp(name, "qwen3_moe")) *out = HF_FORMAT_QWEN3_MOE;
    else return spes_fail("unknown export format '%s' (use olmoe, qwen3_moe or auto)", name);
    return SPES_OK;
}

const char *hf_format_name(HfFormat format) {
    return format == HF_FORMAT_OLMOE ? "olmoe" : format == HF_FORMAT_QWEN3_MOE ? "qwen3_moe" : "auto";
}

int hf_format_for_model(const ModelConfig *cfg, HfFormat requested, HfFormat *out) {
    HfFormat natural = cfg->qk_norm == QK_NORM_FULL ? HF_FORMAT_OLMOE
                       : cfg->qk_norm == QK_NORM_HEAD ? HF_FORMAT_QWEN3_MOE
                                                      : HF_FORMAT_AUTO;
    if (natural == HF_FORMAT_AUTO)
        return spes_fail("the model has no QK-norm (a Llama-style model), and both OlmoeForCausalLM and "
                         "Qwen3MoeForCausalLM always apply one: it has no Hugging Face MoE equivalent to write");
    if (requested != HF_FORMAT_AUTO && requested != natural)
        return spes_fail("format %s needs QK-norm '%s', but the model's QK-norm is '%s' (use --format %s)",
                         hf_format_name(requested), requested == HF_FORMAT_OLMOE ? "full" : "head",
                         natural == HF_FORMAT_OLMOE ? "full" : "head", hf_format_name(natural));
    // HF's OlmoeAttention sizes q_norm as [hidden_size] and k_norm from hidden_size/n_heads,
    // whatever head_dim says: such a checkpoint would not load there.
    if (natural == HF_FORMAT_OLMOE && cfg->n_heads * cfg->head_dim != cfg->d_model)
        return spes_fail("OlmoeForCausalLM needs n_heads * head_dim == d_model (its q_norm is [hidden_size]), "
                         "but this model has %d * %d != %d", cfg->n_heads, cfg->head_dim, cfg->d_model);
    *out = natural;
    return SPES_OK;
}

int hf_dtype_parse(const char *name, DType *out) {
    if (!strcmp(name, "f32") || !strcmp(name, "float32")) *out = DTYPE_F32;
    else if (!strcmp(name, "bf16") || !strcmp(name, "bfloat16")) *out = DTYPE_BF16;
    else return spes_fail("--dtype must be f32 or bf16 (got '%s')", name);
    return SPES_OK;
}

int parse_byte_size(const char *text, uint64_t *out) {
    char *end;
    double value = strtod(text, &end);
    while (*end == ' ') end++;
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
                 {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
    char upper[8] = {0};
    for (int i = 0; end[i] && i < 7; i++) upper[i] = (char)toupper((unsigned char)end[i]);
    if (end != text && strlen(end) < 7 && value > 0)
        for (size_t u = 0; u < sizeof units / sizeof units[0]; u++)
            if (!strcmp(upper, units[u].suffix) && value * units[u].scale < 1.8e19) {
                *out = (uint64_t)(value * units[u].scale);
                if (*out > 0) return SPES_OK;
            }
    return spes_fail("'%s' is not a size (examples: 5GB, 500MB, 20KB, 1048576)", text);
}

// Removes what an earlier export left: model.safetensors, the index, model-*-of-*.safetensors.
static int remove_old_weights(const char *out_dir) {
    DIR *d = opendir(out_dir);
    if (!d) return spes_fail("cannot list %s", out_dir);
    struct dirent *ent;
    int status = SPES_OK;
    while (status == SPES_OK && (ent = readdir(d))) {
        const char *n = ent->d_name;
        size_t len = strlen(n);
        bool shard = !strncmp(n, "model-", 6) && strstr(n, "-of-") && len > 12 && !strcmp(n + len - 12, ".safetensors");
        if (!shard && strcmp(n, "model.safetensors") != 0 && strcmp(n, "model.safetensors.index.json") != 0) continue;
        char *path = path_join(out_dir, n);
        if (!path || remove(path) != 0) status = spes_fail("cannot remove the old %s/%s", out_dir, n);
        free(path);
    }
    closedir(d);
    return status;
}

// One shard: table entries [first, last) converted to `dtype` and written atomically.
static int write_shard(const Model *m, int first, int last, DType dtype, const char *path) {
    int n = last - first;
    StWriteTensor *tensors = spes_calloc((size_t)n, sizeof(StWriteTensor));
    uint16_t **converted = spes_calloc((size_t)n, sizeof(uint16_t *));
    int status = tensors && converted ? SPES_OK : SPES_ERR;
    for (int i = 0; i < n && status == SPES_OK; i++) {
        const ParamInfo *p = &m->table.entries[first + i];
        const float *data = m->params + p->offset;
        tensors[i].name = p->name;
        tensors[i].dtype = dtype;
        tensors[i].ndim = p->ndim;
        tensors[i].shape[0] = p->shape[0];
        tensors[i].shape[1] = p->shape[1];
        tensors[i].data = data;
        if (dtype == DTYPE_BF16) {
            converted[i] = spes_malloc(p->numel * sizeof(uint16_t));
            if (!converted[i]) {
                status = SPES_ERR;
                break;
            }
            for (size_t j = 0; j < p->numel; j++) converted[i][j] = f32_to_bf16(data[j]);
            tensors[i].data = converted[i];
        }
    }
    const char *meta_keys[] = {"format"}, *meta_values[] = {"pt"};
    if (status == SPES_OK) status = safetensors_write_file(path, tensors, n, meta_keys, meta_values, 1);
    for (int i = 0; converted && i < n; i++) free(converted[i]);
    free(converted);
    free(tensors);
    return status;
}

int hf_write_tensors(const Model *m, const char *out_dir, DType dtype, uint64_t max_shard_bytes) {
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16)
        return spes_fail("export dtype must be f32 or bf16 (got %s)", dtype_name(dtype));
    if (max_shard_bytes == 0) max_shard_bytes = HF_DEFAULT_MAX_SHARD_BYTES;
    const ParamTable *t = &m->table;
    // Shard boundaries: greedy in table order, a new shard when the next tensor would push
    // the current one past the limit (a tensor larger than the limit gets a shard alone).
    int *shard_of = spes_calloc((size_t)t->count, sizeof(int));
    if (!shard_of) return SPES_ERR;
    int num_shards = 1;
    uint64_t in_shard = 0, total = 0;
    for (int i = 0; i < t->count; i++) {
        uint64_t bytes = (uint64_t)t->entries[i].numel * dtype_size(dtype);
        if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
            num_shards++;
            in_shard = 0;
        }
        in_shard += bytes;
        total += bytes;
        shard_of[i] = num_shards - 1;
    }
    int status = remove_old_weights(out_dir);
    json_t *weight_map = json_object();
    char file_name[64];
    for (int s = 0, first = 0; s < num_shards && status == SPES_OK; s++) {
        int last = first;
        while (last < t->count && shard_of[last] == s) last++;
        if (num_shards == 1) snprintf(file_name, sizeof file_name, "model.safetensors");
        else snprintf(file_name, sizeof file_name, "model-%05d-of-%05d.safetensors", s + 1, num_shards);
        char *path = path_join(out_dir, file_name);
        status = path ? write_shard(m, first, last, dtype, path) : SPES_ERR;
        free(path);
        for (int i = first; i < last && status == SPES_OK; i++)
            json_object_set_new(weight_map, t->entries[i].name, json_string(file_name));
        first = last;
    }
    if (status == SPES_OK && num_shards > 1) {
        json_t *index = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", weight_map);
        char *text = index ? json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        char *path = path_join(out_dir, "model.safetensors.index.json");
        status = text && path ? file_write_atomic(path, text, strlen(text)) : spes_fail("cannot build the shard index");
        free(path);
        free(text);
        json_decref(index);
    }
    json_decref(weight_map);
    free(shard_of);
    if (status == SPES_OK)
        log_info("export: %d tensors, %.1f MB in %d shard%s (%s)", t->count, total / 1e6, num_shards,
                 num_shards > 1 ? "s" : "", dtype_name(dtype));
    return status;
}

static int write_json_file(const char *dir, const char *name, json_t *obj) {
    char *text = obj ? json_dumps(obj, JSON_INDENT(2)) : NULL;
    char *path = path_join(dir, name);
    int status = text && path ? file_write_atomic(path, text, strlen(text)) : spes_fail("cannot write %s/%s", dir, name);
    free(text);
    free(path);
    return status;
}

// generation_config.json: the source's, byte for byte, when it has one (text: a dense model's
// eos list and sampling settings: nothing in it describes the MLP that upcycling replaced, and
// a checkpoint keeps the one its run started from); else config.json's special token ids as its
// keys give them (absent: null, not the config class's default), which is what transformers'
// generate reads from a directory without generation_config.json.
static int write_generation_config(const ModelConfig *cfg, const char *text, size_t len, const char *out_dir) {
    if (text) {
        char *path = path_join(out_dir, "generation_config.json");
        int status = path ? file_write_atomic(path, text, len) : SPES_ERR;
        free(path);
        return status;
    }
    json_t *gen = json_object();
    if (!gen) return spes_fail("cannot build %s/generation_config.json (out of memory)", out_dir);
    json_object_set_new(gen, "_from_model_config", json_true());
    int status = hf_config_put_token_ids(cfg, gen, HF_IDS_GENERATION_CONFIG_JSON);
    if (status == SPES_OK) status = write_json_file(out_dir, "generation_config.json", gen);
    json_decref(gen);
    return status;
}

static int copy_file(const char *from, const char *to) {
    uint8_t *data;
    size_t len;
    SPES_TRY(file_read_all(from, &data, &len));
    int status = file_write_atomic(to, data, len);
    free(data);
    return status;
}

// tokenizer.json (a file), or the tokenizer files of a directory; "bytes" has no file.
static int copy_tokenizer(const char *tokenizer, const char *out_dir) {
    if (!strcmp(tokenizer, "bytes")) {
        log_warn("export: the built-in 'bytes' tokenizer has no Hugging Face file; none copied");
        return SPES_OK;
    }
    static const char *files[] = {"tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json",
                                  "vocab.json",      "merges.txt",            "added_tokens.json"};
    int copied = 0, status = SPES_OK;
    if (!dir_exists(tokenizer)) {
        char *to = path_join(out_dir, "tokenizer.json");
        status = to ? copy_file(tokenizer, to) : SPES_ERR;
        free(to);
        return status;
    }
    for (size_t i = 0; i < sizeof files / sizeof files[0] && status == SPES_OK; i++) {
        char *from = path_join(tokenizer, files[i]), *to = path_join(out_dir, files[i]);
        if (!from || !to) status = SPES_ERR;
        else if (file_exists(from)) {
            status = copy_file(from, to);
            copied++;
        }
        free(from);
        free(to);
    }
    if (status == SPES_OK && copied == 0)
        status = spes_fail("tokenizer directory %s holds no tokenizer.json / tokenizer_config.json / vocab.json",
                           tokenizer);
    return status;
}

// Every file of the export, into dir.
static int write_export(const Model *m, HfFormat format, const char *gen_text, size_t gen_len, const char *dir,
                        const HfExportOptions *opt) {
    SPES_TRY(hf_write_tensors(m, dir, opt->dtype, opt->max_shard_bytes));
    char *config_path = path_join(dir, "config.json");
    int status = config_path ? hf_config_write(&m->cfg, format == HF_FORMAT_OLMOE ? "olmoe" : "qwen3_moe",
                                               opt->dtype == DTYPE_BF16 ? "bfloat16" : "float32", config_path)
                             : SPES_ERR;
    free(config_path);
    if (status == SPES_OK) status = write_generation_config(&m->cfg, gen_text, gen_len, dir);
    if (status == SPES_OK && opt->tokenizer) status = copy_tokenizer(opt->tokenizer, dir);
    return status;
}

// rename(2) of stage/name to out_dir/name.
static int move_in(const char *stage, const char *out_dir, const char *name) {
    char *from = path_join(stage, name), *to = path_join(out_dir, name);
    int status = from && to ? SPES_OK : SPES_ERR;
    if (status == SPES_OK && rename(from, to) != 0)
        status = spes_fail("cannot move %s to %s: %s", from, to, strerror(errno));
    free(from);
    free(to);
    return status;
}

// The staged export into out_dir: its old weights go first (a new export may have other shard
// names), and so does its old config.json, which comes back last: interrupted between two
// renames, out_dir holds no config.json and so does not pass for a model. Renames need no space.
static int move_export_in(const char *stage, const char *out_dir) {
    SPES_TRY(remove_old_weights(out_dir));
    char *old_config = path_join(out_dir, "config.json");
    if (!old_config) return SPES_ERR;
    int status = unlink(old_config) == 0 || errno == ENOENT
                     ? SPES_OK
                     : spes_fail("cannot remove the old %s: %s", old_config, strerror(errno));
    free(old_config);
    DIR *d = status == SPES_OK ? opendir(stage) : NULL;
    if (status == SPES_OK && !d) status = spes_fail("cannot list %s: %s", stage, strerror(errno));
    struct dirent *ent;
    while (status == SPES_OK && (ent = readdir(d)))
        if (ent->d_name[0] != '.' && strcmp(ent->d_name, "config.json") != 0)
            status = move_in(stage, out_dir, ent->d_name);
    if (d) closedir(d);
    if (status == SPES_OK) status = move_in(stage, out_dir, "config.json");
    if (status == SPES_OK) status = fsync_dir(out_dir);
    return status;
}

// The export is written into a staging folder inside out_dir (the same filesystem) and moved
// into place only once every file in it is whole: a failure (a full disk) leaves out_dir as it
// was, a new out_dir not at all, never weights and config.json without their tokenizer. An
// export over an older one so needs room for both until the moves.
int model_export_hf(const Model *m, const char *out_dir, const HfExportOptions *opt) {
    HfFormat format;
    SPES_TRY(hf_format_for_model(&m->cfg, opt->format, &format));
    // The source's generation_config.json is read and checked before anything is written.
    char *gen_text = NULL;
    size_t gen_len = 0;
    ModelConfig checked = m->cfg;   // its eos ids are checked against the vocabulary, then dropped
    if (opt->generation_config_dir &&
        hf_generation_config_read(opt->generation_config_dir, &checked, NULL, &gen_text, &gen_len) != SPES_OK)
        return spes_fail_context("export to %s", out_dir);
    bool created = !dir_exists(out_dir);
    char stage_name[64];
    snprintf(stage_name, sizeof stage_name, ".spes-export.tmp.%ld", (long)getpid());
    char *stage = path_join(out_dir, stage_name);
    int status = stage ? mkdir_p(out_dir) : SPES_ERR;
    if (status == SPES_OK) status = remove_tree(stage);   // a same-pid leftover (a container's pid 1)
    if (status == SPES_OK) status = mkdir_p(stage);
    if (status == SPES_OK) status = write_export(m, format, gen_text, gen_len, stage, opt);
    free(gen_text);
    bool moving = status == SPES_OK;
    if (moving) status = move_export_in(stage, out_dir);
    if (stage && remove_tree(stage) != SPES_OK && status == SPES_OK) status = SPES_ERR;
    if (stage && status != SPES_OK && created && !moving) rmdir(out_dir);   // nothing of it is left
    free(stage);
    if (status != SPES_OK)
        return spes_fail_context("export to %s (%s)", out_dir,
                                 moving    ? "cut short while moving the export into place: export again"
                                 : created ? "nothing was left there"
                                           : "the folder is as it was before the export");
    return SPES_OK;
}
