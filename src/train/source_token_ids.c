// The special token ids of a run's checkpoints. See source_token_ids.h.
#include "train/source_token_ids.h"

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

// The ids of the model the run started from into *src: load_path's config.json, else the newest
// checkpoint's. *found false when neither has one (or there is no load_path).
static int read_source(const TrainConfig *cfg, ModelConfig *src, bool *found) {
    *found = false;
    if (!cfg->load_path) return SPES_OK;
    char *config = path_join(cfg->load_path, "config.json");
    if (!config) return SPES_ERR;
    char *dir = NULL;
    int rc = SPES_OK;
    if (file_exists(config)) {
        dir = spes_strdup(cfg->load_path);
        if (!dir) rc = SPES_ERR;
    } else {
        int64_t step;
        rc = checkpoint_find_latest(cfg->save_folder, &dir, &step);
        free(config);
        config = dir ? path_join(dir, "config.json") : NULL;
    }
    if (rc == SPES_OK && config && file_exists(config)) {
        rc = hf_config_read_token_ids(dir, src);
        *found = rc == SPES_OK;
    }
    free(dir);
    free(config);
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

void source_token_ids_apply(const TrainConfig *cfg, ModelConfig *model, bool speak) {
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
