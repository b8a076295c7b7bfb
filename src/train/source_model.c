// The model a run started from, as its checkpoints carry it on. See source_model.h.
#include "train/source_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "config/yaml_tree.h"
#include "model/hf_config.h"
#include "train/checkpoint.h"

// The node of a model key the YAML or the command line sets (not null), else NULL.
static const YNode *yaml_sets(const TrainConfig *cfg, const char *key) {
    const YNode *n = cfg->tree ? ytree_get_path(cfg->tree, key) : NULL;
    return n && !ytree_is_null(n) ? n : NULL;
}

// "run.yaml:12" or "command line", where a key was set.
static void yaml_where(const YNode *n, char *out, size_t cap) {
    if (n->line > 0) snprintf(out, cap, "%s:%d", n->origin, n->line);
    else snprintf(out, cap, "%s", n->origin);
}

// Whether dir/name exists (a missing dir or an allocation failure: no).
static bool has_file(const char *dir, const char *name) {
    char *path = dir ? path_join(dir, name) : NULL;
    bool yes = path && file_exists(path);
    free(path);
    return yes;
}

// The folder holding the source's file `name`: load_path, else the newest checkpoint (*dir NULL:
// neither has it, or there is no load_path). *dir is malloc'd.
static int source_dir(const TrainConfig *cfg, const char *name, char **dir) {
    *dir = NULL;
    if (!cfg->load_path) return SPES_OK;
    if (has_file(cfg->load_path, name)) return (*dir = spes_strdup(cfg->load_path)) ? SPES_OK : SPES_ERR;
    int64_t step;
    SPES_TRY(checkpoint_find_latest(cfg->save_folder, dir, &step));
    if (!has_file(*dir, name)) {
        free(*dir);
        *dir = NULL;
    }
    return SPES_OK;
}

// The ids of the source's config.json into *src. *found false when there is none.
static int read_source(const TrainConfig *cfg, ModelConfig *src, bool *found) {
    *found = false;
    char *dir;
    SPES_TRY(source_dir(cfg, "config.json", &dir));
    if (!dir) return SPES_OK;
    int rc = hf_config_read_token_ids(dir, src);
    *found = rc == SPES_OK;
    free(dir);
    return rc;
}

// The YAML's model.eos_token_id / model.pad_token_id against the source's: set and different, the
// YAML's wins (it is what the user said) and *conflict names both; an eos among a source's list
// keeps the list, which holds it. Not set: the source's.
static void merge(const TrainConfig *cfg, const ModelConfig *src, ModelConfig *model, char *conflict, size_t cap) {
    const ModelConfig yaml = *model;
    model_config_copy_token_ids(model, src);
    const YNode *eos = yaml_sets(cfg, "model.eos_token_id"), *pad = yaml_sets(cfg, "model.pad_token_id");
    char where[256];
    if (eos && !model_config_is_eos(src, yaml.eos_token_id)) {
        model->eos_token_id = yaml.eos_token_id;
        model->num_eos_token_ids = 0;
        model->eos_key_absent = false;
        if (src->eos_token_id >= 0) {
            char ids[16 * MODEL_MAX_EOS_IDS];
            model_config_describe_eos(src, ids, sizeof ids);
            yaml_where(eos, where, sizeof where);
            snprintf(conflict, cap, "%s: model.eos_token_id %d, where load_path's config.json has %s", where,
                     yaml.eos_token_id, ids);
        }
    }
    if (pad && yaml.pad_token_id != src->pad_token_id) {
        model->pad_token_id = yaml.pad_token_id;
        model->pad_key_absent = false;
        if (src->pad_token_id >= 0) {
            size_t n = strlen(conflict);
            yaml_where(pad, where, sizeof where);
            snprintf(conflict + n, cap - n, "%s%s: model.pad_token_id %d, where load_path's config.json has %d",
                     n ? "; " : "", where, yaml.pad_token_id, src->pad_token_id);
        }
    }
}

void source_model_token_ids(const TrainConfig *cfg, ModelConfig *model, bool speak) {
    ModelConfig src = *model;
    bool found = false;
    if (read_source(cfg, &src, &found) != SPES_OK) {
        if (speak) log_warn("checkpoints' config.json get the YAML's special token ids: %s", spes_last_error());
        spes_clear_error();
        return;
    }
    if (!found) return;
    char conflict[1024] = "";
    merge(cfg, &src, model, conflict, sizeof conflict);
    if (conflict[0] && speak)
        log_warn("checkpoints' config.json take the YAML's special token ids over load_path's: %s", conflict);
}

void source_model_generation_config(const TrainConfig *cfg, uint8_t **text, size_t *len, bool speak) {
    *text = NULL;
    *len = 0;
    char *dir = NULL, *from = NULL;
    int rc = source_dir(cfg, "generation_config.json", &dir);
    if (rc == SPES_OK && dir) {
        from = path_join(dir, "generation_config.json");
        rc = from ? file_read_all(from, text, len) : SPES_ERR;
    }
    if (rc != SPES_OK) {
        if (speak) log_warn("checkpoints get no generation_config.json: %s", spes_last_error());
        spes_clear_error();
        free(*text);
        *text = NULL;
        *len = 0;
    }
    free(dir);
    free(from);
}
