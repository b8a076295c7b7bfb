#include "model/hf_import.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "model/hf_config.h"

// Shard file names from the index's weight_map, each once, in order of first appearance; *root
// keeps the parsed index for index_matches_shards (the caller frees it).
static int shard_names_from_index(const char *index_path, char ***names, int *count, json_t **index_root) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return spes_fail("%s: not valid JSON (line %d: %s)", index_path, jerr.line, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return spes_fail("%s: not a safetensors index (needs a \"weight_map\" object)", index_path);
    }
    size_t n = json_object_size(map);
    char **out = spes_calloc(n + 1, sizeof(char *));
    int found = 0, status = out ? SPES_OK : SPES_ERR;
    const char *key;
    json_t *value;
    json_object_foreach(map, key, value) {
        if (status != SPES_OK) break;
        const char *file = json_string_value(value);
        if (!file || strchr(file, '/') || !strcmp(file, "..") || !*file) {
            status = spes_fail("%s: weight_map entry \"%s\" must name a file in the same directory", index_path, key);
            break;
        }
        bool seen = false;
        for (int i = 0; i < found && !seen; i++) seen = !strcmp(out[i], file);
        if (!seen && !(out[found++] = spes_strdup(file))) status = SPES_ERR;
    }
    if (status == SPES_OK && found == 0) status = spes_fail("%s: the weight_map is empty", index_path);
    if (status != SPES_OK) {
        json_decref(root);
        for (int i = 0; out && i < found; i++) free(out[i]);
        free(out);
        return SPES_ERR;
    }
    *names = out;
    *count = found;
    *index_root = root;
    return SPES_OK;
}

typedef struct {
    const char *name;
    int shard;
} NameInShard;

static int cmp_name_in_shard(const void *a, const void *b) {
    return strcmp(((const NameInShard *)a)->name, ((const NameInShard *)b)->name);
}

// The shards must hold what the index says: every weight_map entry in the shard it names, and no
// tensor in two shards (which copy a lookup finds would depend on the shards' order: a silently
// different model from the one the index describes).
static int index_matches_shards(const char *index_path, json_t *index_root, const HfTensorSet *set) {
    json_t *map = json_object_get(index_root, "weight_map");
    const char *key;
    json_t *value;
    json_object_foreach(map, key, value) {
        const char *file = json_string_value(value);
        int s = 0;
        for (; s < set->count; s++) {
            const char *slash = strrchr(set->shard_paths[s], '/');
            if (!strcmp(slash ? slash + 1 : set->shard_paths[s], file)) break;
        }
        if (s == set->count || !safetensors_find(&set->shards[s], key))
            return spes_fail("%s: weight_map puts tensor %s in %s, but %s does not hold it", index_path, key, file,
                             s < set->count ? set->shard_paths[s] : file);
    }
    size_t total = 0;
    for (int s = 0; s < set->count; s++) total += (size_t)set->shards[s].count;
    NameInShard *all = spes_calloc(total ? total : 1, sizeof *all);
    if (!all) return SPES_ERR;
    size_t n = 0;
    for (int s = 0; s < set->count; s++)
        for (int i = 0; i < set->shards[s].count; i++) all[n++] = (NameInShard){set->shards[s].tensors[i].name, s};
    qsort(all, n, sizeof *all, cmp_name_in_shard);
    int status = SPES_OK;
    for (size_t i = 1; i < n && status == SPES_OK; i++)
        if (!strcmp(all[i - 1].name, all[i].name))
            status = spes_fail("tensor %s is in both %s and %s (%s names one of them): which copy is the model's is "
                               "unclear", all[i].name, set->shard_paths[all[i - 1].shard],
                               set->shard_paths[all[i].shard], index_path);
    free(all);
    return status;
}

int hf_tensors_open(const char *dir, HfTensorSet *out) {
    memset(out, 0, sizeof *out);
    char *index = path_join(dir, "model.safetensors.index.json");
    char *single = path_join(dir, "model.safetensors");
    char **names = NULL;
    json_t *index_root = NULL;
    int count = 0, status = index && single ? SPES_OK : SPES_ERR;
    if (status == SPES_OK && file_exists(index)) {
        status = shard_names_from_index(index, &names, &count, &index_root);
    } else if (status == SPES_OK && file_exists(single)) {
        names = spes_calloc(1, sizeof(char *));
        if (names && (names[0] = spes_strdup("model.safetensors"))) count = 1;
        else status = SPES_ERR;
    } else if (status == SPES_OK) {
        status = spes_fail("%s holds neither model.safetensors nor model.safetensors.index.json: not a Hugging Face "
                           "model directory (or a checkpoint written without weights)", dir);
    }
    free(single);
    if (status == SPES_OK) {
        out->shards = spes_calloc((size_t)count, sizeof(SafeTensors));
        out->shard_paths = spes_calloc((size_t)count, sizeof(char *));
        if (!out->shards || !out->shard_paths) status = SPES_ERR;
    }
    for (int i = 0; i < count && status == SPES_OK; i++) {
        out->shard_paths[i] = path_join(dir, names[i]);
        if (!out->shard_paths[i]) status = SPES_ERR;
        else if ((status = safetensors_open(out->shard_paths[i], &out->shards[i])) == SPES_OK) out->count++;
    }
    if (status == SPES_OK && index_root) status = index_matches_shards(index, index_root, out);
    json_decref(index_root);
    free(index);
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
    if (status != SPES_OK) {
        // shard_paths beyond out->count may be set: free them all.
        for (int i = out->count; out->shard_paths && i < count; i++) free(out->shard_paths[i]);
        hf_tensors_close(out);
    }
    return status;
}

void hf_tensors_close(HfTensorSet *set) {
    for (int i = 0; i < set->count; i++) {
        safetensors_close(&set->shards[i]);
        free(set->shard_paths[i]);
    }
    free(set->shards);
    free(set->shard_paths);
    memset(set, 0, sizeof *set);
}

const StTensor *hf_tensors_find(const HfTensorSet *set, const char *name) {
    for (int i = 0; i < set->count; i++) {
        const StTensor *t = safetensors_find(&set->shards[i], name);
        if (t) return t;
    }
    return NULL;
}

static void format_shape(const StTensor *t, char *buf, size_t size) {
    int at = snprintf(buf, size, "[");
    for (int d = 0; d < t->ndim && at < (int)size; d++)
        at += snprintf(buf + at, size - (size_t)at, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (at < (int)size) snprintf(buf + at, size - (size_t)at, "]");
}

// NULL when the tensor fits [rows] / [rows, cols] and has a float dtype; else why not.
static const char *shape_problem(const StTensor *t, int64_t rows, int64_t cols, char *why, size_t size) {
    bool float_type = t->dtype == DTYPE_F32 || t->dtype == DTYPE_BF16 || t->dtype == DTYPE_F16 || t->dtype == DTYPE_F64;
    bool shape_ok = cols > 0 ? t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols
                             : t->ndim == 1 && t->shape[0] == rows;
    if (shape_ok && float_type) return NULL;
    char got[96];
    format_shape(t, got, sizeof got);
    if (!shape_ok) {
        if (cols > 0) snprintf(why, size, "%s is %s, expected [%lld, %lld]", t->name, got, (long long)rows, (long long)cols);
        else snprintf(why, size, "%s is %s, expected [%lld]", t->name, got, (long long)rows);
    } else {
        snprintf(why, size, "%s has dtype %s (needs F32, BF16, F16 or F64)", t->name, dtype_name(t->dtype));
    }
    return why;
}

int hf_tensor_read(const HfTensorSet *set, const char *name, int64_t rows, int64_t cols, float *dst) {
    const StTensor *t = hf_tensors_find(set, name);
    if (!t) return spes_fail("tensor %s is missing", name);
    char why[256];
    if (shape_problem(t, rows, cols, why, sizeof why)) return spes_fail("%s", why);
    return safetensors_to_f32(t, dst);
}

// Up to this many names per kind of problem go into the error message.
#define MAX_LISTED 12

typedef struct {
    char text[4096];
    int at, count;
} NameList;

static void list_add(NameList *l, const char *item) {
    if (l->count++ < MAX_LISTED && l->at < (int)sizeof l->text)
        l->at += snprintf(l->text + l->at, sizeof l->text - (size_t)l->at, "%s%s", l->count > 1 ? ", " : "", item);
}

size_t count_nonfinite(const float *x, size_t n) {
    size_t bad = 0;
#pragma omp parallel for reduction(+ : bad) if (n > ((size_t)1 << 20))
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}

// Whether a tensor name is of a layer (model.layers.N.) or an expert (mlp.experts.E.) that the
// config has not got.
static bool beyond_config(const char *name, const ModelConfig *c) {
    int layer = 0, expert = 0, n = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &n) != 1 || n == 0) return false;
    if (layer >= c->n_layers) return true;
    const char *e = strstr(name + n, "mlp.experts.");
    return e && sscanf(e, "mlp.experts.%d.", &expert) == 1 && expert >= c->num_experts;
}

int hf_tensors_load_model(const HfTensorSet *set, Model *m, bool tie_lm_head) {
    NameList missing = {0}, bad = {0}, nonfinite = {0};
    int embed = -1, lm_head = -1;
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *p = &m->table.entries[i];
        if (p->kind == PARAM_EMBED) embed = i;
        const StTensor *t = hf_tensors_find(set, p->name);
        if (!t) {
            if (p->kind == PARAM_LM_HEAD && tie_lm_head) lm_head = i;
            else list_add(&missing, p->name);
            continue;
        }
        char why[256];
        if (shape_problem(t, p->shape[0], p->ndim == 2 ? p->shape[1] : 0, why, sizeof why)) {
            list_add(&bad, why);
            continue;
        }
        SPES_TRY(safetensors_to_f32(t, m->params + p->offset));
        // A NaN or Inf weight makes every output NaN: generate would print token 0 forever and
        // eval report loss=nan, both exiting 0. No trained model holds one; refuse it by name.
        size_t n_bad = count_nonfinite(m->params + p->offset, (size_t)p->numel);
        if (n_bad) {
            char what[300];
            snprintf(what, sizeof what, "%s: %zu of %lld values", p->name, n_bad, (long long)p->numel);
            list_add(&nonfinite, what);
        }
    }
    if (missing.count || bad.count || nonfinite.count) {
        char msg[13000];
        int at = 0;
        if (missing.count)
            at += snprintf(msg, sizeof msg, "%d missing tensor%s (%s%s)", missing.count, missing.count == 1 ? "" : "s",
                           missing.text, missing.count > MAX_LISTED ? ", ..." : "");
        if (bad.count)
            at += snprintf(msg + at, sizeof msg - (size_t)at, "%s%d mis-shaped tensor%s (%s%s)", at ? "; " : "",
                           bad.count, bad.count == 1 ? "" : "s", bad.text, bad.count > MAX_LISTED ? ", ..." : "");
        if (nonfinite.count)
            snprintf(msg + at, sizeof msg - (size_t)at, "%s%d tensor%s holding NaN or Inf (%s%s): the file is damaged "
                     "or the run that wrote it diverged",
                     at ? "; " : "", nonfinite.count, nonfinite.count == 1 ? "" : "s", nonfinite.text,
                     nonfinite.count > MAX_LISTED ? ", ..." : "");
        return spes_fail("%s", msg);
    }
    if (lm_head >= 0 && embed >= 0)
        memcpy(m->params + m->table.entries[lm_head].offset, m->params + m->table.entries[embed].offset,
               m->table.entries[embed].numel * sizeof(float));
    // Tensors we do not know. A layer or an expert past the config's counts means the config
    // (config.json, or load_path's training config) describes a smaller model than the weights
    // (eval would score that smaller model and exit 0): refused. Anything else (a buffer such as
    // a rotary inv_freq, another architecture's extra) is named in a warning.
    NameList beyond = {0};
    int unknown = 0;
    for (int s = 0; s < set->count; s++)
        for (int i = 0; i < set->shards[s].count; i++) {
            const char *name = set->shards[s].tensors[i].name;
            if (param_table_find(&m->table, name) >= 0) continue;
            if (beyond_config(name, &m->cfg)) list_add(&beyond, name);
            else if (unknown++ < 3) log_warn("ignoring tensor %s (not part of this model)", name);
        }
    if (unknown > 3) log_warn("ignoring %d more unknown tensors", unknown - 3);
    if (beyond.count)
        return spes_fail("the config describes %d layers of %d experts, but the weights also hold %d tensor%s of "
                         "layers or experts past those (%s%s): the config does not match the weights",
                         m->cfg.n_layers, m->cfg.num_experts, beyond.count, beyond.count == 1 ? "" : "s", beyond.text,
                         beyond.count > MAX_LISTED ? ", ..." : "");
    return SPES_OK;
}

int model_create_frozen(Model *m, const ModelConfig *cfg) {
    SPES_TRY(model_create(m, cfg));
    bool *frozen = spes_calloc((size_t)m->table.count, sizeof(bool));
    int status = frozen ? model_set_trainable(m, frozen) : SPES_ERR;
    free(frozen);
    if (status != SPES_OK) model_free(m);
    return status;
}

int model_load_hf_dir(const char *dir, Model *m) {
    ModelConfig cfg;
    SPES_TRY(hf_config_read(dir, &cfg));
    SPES_TRY(model_create_frozen(m, &cfg));
    HfTensorSet set;
    int status = hf_tensors_open(dir, &set);
    if (status == SPES_OK) {
        status = hf_tensors_load_model(&set, m, false);
        hf_tensors_close(&set);
    }
    if (status != SPES_OK) {
        model_free(m);
        return spes_fail_context("loading the model in %s", dir);
    }
    return SPES_OK;
}
