// Training checkpoints: layout, atomic save, load, newest-complete lookup, pruning.
// See checkpoint.h for the directory layout.
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "io/safetensors.h"
#include "model/export.h"
#include "model/hf_config.h"
#include "model/hf_import.h"

// ---------------------------------------------------------------------------------------
// Tensors of a parameter table <-> safetensors

// Offset of entry p in a buffer of the chosen layout; *present false when the layout skips it.
static size_t table_slice(const ParamInfo *p, bool grad_layout, bool *present) {
    *present = !grad_layout || (p->trainable && p->grad_offset >= 0);
    return grad_layout ? (size_t)(p->grad_offset < 0 ? 0 : p->grad_offset) : p->offset;
}

// The tensors of one checkpoint file: bufs[b]'s slice of each entry the layout holds, named
// prefixes[b] + the entry's name (bufs NULL: the names and shapes alone, for sizing). *ts and
// *names are malloc'd, *n entries used; free with free_table_tensors.
static int table_tensors(const ParamTable *table, bool grad_layout, int n_bufs, const float *const *bufs,
                         const char *const *prefixes, StWriteTensor **ts, char ***names, int *n) {
    size_t cap = (size_t)table->count * (size_t)n_bufs;
    *ts = spes_calloc(cap ? cap : 1, sizeof **ts);
    *names = spes_calloc(cap ? cap : 1, sizeof **names);
    *n = 0;
    if (!*ts || !*names) return SPES_ERR;
    for (int b = 0; b < n_bufs; b++)
        for (int i = 0; i < table->count; i++) {
            const ParamInfo *p = &table->entries[i];
            bool present;
            size_t off = table_slice(p, grad_layout, &present);
            if (!present) continue;
            size_t len = strlen(prefixes[b]) + strlen(p->name) + 1;
            char *name = spes_malloc(len);
            if (!name) return SPES_ERR;
            snprintf(name, len, "%s%s", prefixes[b], p->name);
            (*names)[*n] = name;
            StWriteTensor *t = &(*ts)[(*n)++];
            *t = (StWriteTensor){.name = name, .dtype = DTYPE_F32, .ndim = p->ndim, .data = bufs ? bufs[b] + off : NULL};
            for (int d = 0; d < p->ndim; d++) t->shape[d] = p->shape[d];
        }
    return SPES_OK;
}

static void free_table_tensors(StWriteTensor *ts, char **names, int n) {
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(ts);
}

int checkpoint_write_table(const char *path, const ParamTable *table, bool grad_layout, int n_bufs,
                           const float *const *bufs, const char *const *prefixes) {
    StWriteTensor *ts;
    char **names;
    int n;
    int rc = table_tensors(table, grad_layout, n_bufs, bufs, prefixes, &ts, &names, &n);
    if (rc == SPES_OK) rc = safetensors_write_file(path, ts, n, NULL, NULL, 0);
    free_table_tensors(ts, names, n);
    return rc;
}

// Bytes of the file checkpoint_write_table writes for these arguments (header and data).
static int table_file_bytes(const ParamTable *table, bool grad_layout, int n_bufs, const char *const *prefixes,
                            size_t *bytes) {
    StWriteTensor *ts;
    char **names;
    int n;
    *bytes = 0;
    int rc = table_tensors(table, grad_layout, n_bufs, NULL, prefixes, &ts, &names, &n);
    if (rc == SPES_OK) rc = safetensors_serialized_size(ts, n, NULL, NULL, 0, bytes);
    free_table_tensors(ts, names, n);
    return rc;
}

static void format_shape(int ndim, const int64_t *shape, char *buf, size_t size) {
    int at = snprintf(buf, size, "[");
    for (int d = 0; d < ndim && at < (int)size; d++)
        at += snprintf(buf + at, size - (size_t)at, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    if (at < (int)size) snprintf(buf + at, size - (size_t)at, "]");
}

int checkpoint_read_table(const char *path, const ParamTable *table, bool grad_layout, int n_bufs,
                          float *const *bufs, const char *const *prefixes) {
    SafeTensors st;
    SPES_TRY(safetensors_open(path, &st));
    int rc = SPES_OK;
    for (int b = 0; b < n_bufs && rc == SPES_OK; b++)
        for (int i = 0; i < table->count && rc == SPES_OK; i++) {
            const ParamInfo *p = &table->entries[i];
            bool present;
            size_t off = table_slice(p, grad_layout, &present);
            if (!present) continue;
            char name[160];
            snprintf(name, sizeof name, "%s%s", prefixes[b], p->name);
            const StTensor *t = safetensors_find(&st, name);
            if (!t) {
                rc = spes_fail("tensor %s is missing (written for a different model or trainable set?)", name);
                break;
            }
            bool same = t->ndim == p->ndim;
            for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
            if (!same) {
                char got[96], want[96];
                format_shape(t->ndim, t->shape, got, sizeof got);
                format_shape(p->ndim, p->shape, want, sizeof want);
                rc = spes_fail("tensor %s is %s, the model expects %s", name, got, want);
                break;
            }
            rc = safetensors_to_f32(t, bufs[b] + off);
            // A NaN or Inf here would only show steps later as a NaN loss blamed on the
            // learning rate; the trainer never saves one.
            size_t n_bad = rc == SPES_OK ? count_nonfinite(bufs[b] + off, p->numel) : 0;
            if (n_bad)
                rc = spes_fail("tensor %s holds %zu NaN or Inf values of %zu: the file is damaged", name, n_bad,
                               (size_t)p->numel);
        }
    if (rc != SPES_OK) spes_fail_context("loading %s", path);
    safetensors_close(&st);
    return rc;
}

// ---------------------------------------------------------------------------------------
// train_state.json

// FNV-1a over the names of the trainable tensors, in table order: the trainable set's identity.
static uint64_t trainable_names_hash(const ParamTable *table, int *count) {
    uint64_t h = 1469598103934665603ull;
    *count = 0;
    for (int i = 0; i < table->count; i++) {
        if (!table->entries[i].trainable) continue;
        (*count)++;
        for (const char *c = table->entries[i].name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;   // separator, so ("ab","c") != ("a","bc")
    }
    return h;
}

static int write_state_json(const char *path, const TrainState *s, const ParamTable *table, int64_t opt_step) {
    int n_trainable;
    uint64_t names_hash = trainable_names_hash(table, &n_trainable);
    char hash_hex[17], names_hex[17];
    snprintf(hash_hex, sizeof hash_hex, "%016" PRIx64, s->config_hash);
    snprintf(names_hex, sizeof names_hex, "%016" PRIx64, names_hash);
    json_t *root = json_pack("{s:i, s:I, s:I, s:I, s:{s:I, s:I, s:I}, s:s, s:{s:i, s:I, s:s}, s:s}",
                             "schema_version", CHECKPOINT_SCHEMA_VERSION, "step", (json_int_t)s->step, "tokens_seen",
                             (json_int_t)s->tokens_seen, "optimizer_step", (json_int_t)opt_step, "data", "epoch",
                             (json_int_t)s->data.epoch, "index", (json_int_t)s->data.index, "seed",
                             (json_int_t)s->data_seed, "config_hash", hash_hex, "trainable", "tensors", n_trainable,
                             "values", (json_int_t)table->trainable_numel, "names_hash", names_hex, "rng",
                             "none consumed: no dropout; data order is a function of (data.seed, epoch, index)");
    if (!root) return spes_fail("cannot build train_state.json");
    // Only written when false, so the files of every ordinary checkpoint stay as they were.
    if (s->unsynced && json_object_set_new(root, "synced", json_false()) != 0)
        return json_decref(root), spes_fail("cannot build train_state.json");
    if (s->loss_scale > 0 && (json_object_set_new(root, "loss_scale", json_real(s->loss_scale)) != 0 ||
                              json_object_set_new(root, "loss_scale_good_steps",
                                                  json_integer((json_int_t)s->loss_scale_good_steps)) != 0))
        return json_decref(root), spes_fail("cannot build train_state.json");
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return spes_fail("cannot serialise train_state.json");
    int rc = file_write_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

static int json_get_int(json_t *obj, const char *key, const char *path, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) return spes_fail("%s: \"%s\" is missing or not an integer", path, key);
    *out = json_integer_value(v);
    return SPES_OK;
}

static int json_get_hex(json_t *obj, const char *key, const char *path, uint64_t *out) {
    const char *s = json_string_value(json_object_get(obj, key));
    char *end = NULL;
    if (s) *out = strtoull(s, &end, 16);
    if (!s || !*s || *end) return spes_fail("%s: \"%s\" is missing or not a hex string", path, key);
    return SPES_OK;
}

// Step number of a directory entry named exactly "step<digits>" (+ suffix); -1 otherwise.
static int64_t parse_step_name(const char *name, const char *suffix) {
    if (strncmp(name, "step", 4) != 0) return -1;
    const char *p = name + 4;
    int64_t step = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 18; p++, digits++) step = step * 10 + (*p - '0');
    return digits > 0 && !strcmp(p, suffix) ? step : -1;
}

// The step a directory's name gives ("<...>/step12" or "step12/"); -1 for any other name.
static int64_t step_of_dir_name(const char *dir) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    char name[64];
    if (len - start >= sizeof name) return -1;
    memcpy(name, dir + start, len - start);
    name[len - start] = '\0';
    return parse_step_name(name, "");
}

// Parses dir/train_state.json; also returns the optimizer step and the trainable summary.
static int read_state_json(const char *dir, TrainState *s, int64_t *opt_step, int64_t *n_trainable,
                           int64_t *trainable_values, uint64_t *names_hash) {
    char *path = path_join(dir, "train_state.json");
    if (!path) return SPES_ERR;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) {
        spes_fail("%s:%d: not valid JSON: %s", path, err.line, err.text);
        free(path);
        return SPES_ERR;
    }
    int64_t version = 0, seed = 0;
    json_t *data = json_object_get(root, "data"), *tr = json_object_get(root, "trainable");
    int rc = SPES_ERR;
    if (json_get_int(root, "schema_version", path, &version) != SPES_OK) goto done;
    if (version != CHECKPOINT_SCHEMA_VERSION) {
        spes_fail("%s: schema_version %lld, this build reads %d", path, (long long)version, CHECKPOINT_SCHEMA_VERSION);
        goto done;
    }
    if (!json_is_object(data) || !json_is_object(tr)) {
        spes_fail("%s: \"data\" and \"trainable\" must be objects", path);
        goto done;
    }
    if (json_get_int(root, "step", path, &s->step) || json_get_int(root, "tokens_seen", path, &s->tokens_seen) ||
        json_get_int(root, "optimizer_step", path, opt_step) || json_get_int(data, "epoch", path, &s->data.epoch) ||
        json_get_int(data, "index", path, &s->data.index) || json_get_int(data, "seed", path, &seed) ||
        json_get_hex(root, "config_hash", path, &s->config_hash) || json_get_int(tr, "tensors", path, n_trainable) ||
        json_get_int(tr, "values", path, trainable_values) || json_get_hex(tr, "names_hash", path, names_hash))
        goto done;
    if (s->step < 0 || s->tokens_seen < 0 || *opt_step < 0 || s->data.epoch < 0 || s->data.index < 0) {
        spes_fail("%s: negative step, token count or data position", path);
        goto done;
    }
    // A stepN directory holds step N: resuming another step from it would carry on with N's
    // weights under the wrong step (and re-save, replacing, the checkpoint it came from).
    int64_t named = step_of_dir_name(dir);
    if (named >= 0 && s->step != named) {
        spes_fail("%s: \"step\" is %" PRId64 " but the directory is step%" PRId64
                  " (the file was edited or copied from another checkpoint)",
                  path, s->step, named);
        goto done;
    }
    // Every optimizer update is a step (an amp_fp16 overflow skips the update, not the step).
    if (*opt_step > s->step) {
        spes_fail("%s: \"optimizer_step\" %" PRId64 " exceeds \"step\" %" PRId64
                  ": AdamW's bias correction would be wrong",
                  path, *opt_step, s->step);
        goto done;
    }
    s->data_seed = (uint64_t)seed;
    json_t *synced = json_object_get(root, "synced");
    if (synced && !json_is_boolean(synced)) {
        spes_fail("%s: \"synced\" must be true or false", path);
        goto done;
    }
    s->unsynced = synced && json_is_false(synced);
    json_t *scale = json_object_get(root, "loss_scale"), *good = json_object_get(root, "loss_scale_good_steps");
    s->loss_scale = 0;
    s->loss_scale_good_steps = 0;
    if (scale) {
        if (!json_is_number(scale) || !(json_number_value(scale) > 0) || !isfinite(json_number_value(scale)) ||
            (good && (!json_is_integer(good) || json_integer_value(good) < 0))) {
            spes_fail("%s: \"loss_scale\" must be a positive number (and loss_scale_good_steps a count)", path);
            goto done;
        }
        s->loss_scale = json_number_value(scale);
        s->loss_scale_good_steps = good ? (int64_t)json_integer_value(good) : 0;
    }
    rc = SPES_OK;
done:
    json_decref(root);
    free(path);
    return rc;
}

int checkpoint_read_state(const char *dir, TrainState *state) {
    int64_t opt_step, n_trainable, values;
    uint64_t names_hash;
    return read_state_json(dir, state, &opt_step, &n_trainable, &values, &names_hash);
}

// ---------------------------------------------------------------------------------------
// Save / load

static int write_config_yaml(const char *path, const TrainConfig *cfg) {
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return spes_fail("cannot serialise config.yaml: %s", strerror(errno));
    config_write_yaml(cfg, mem);
    fclose(mem);
    int rc = file_write_atomic(path, text, len);
    free(text);
    return rc;
}

// config.json for transformers. A model without QK-norm has no HF MoE class: the checkpoint
// then lacks config.json (resume does not need it) and says why once.
static int write_hf_config(const char *path, const ModelConfig *cfg) {
    static bool warned = false;
    HfFormat format;
    if (hf_format_for_model(cfg, HF_FORMAT_AUTO, &format) != SPES_OK) {
        if (!warned) log_warn("checkpoints get no config.json: %s", spes_last_error());
        warned = true;
        spes_clear_error();
        return SPES_OK;
    }
    return hf_config_write(cfg, hf_format_name(format), "float32", path);
}

// The source model's generation_config.json, its bytes unchanged (`spes export` writes it on).
static int write_generation_config(const char *dir, const TrainState *state) {
    char *to = path_join(dir, "generation_config.json");
    int rc = to ? file_write_atomic(to, state->generation_config, state->generation_config_len) : SPES_ERR;
    free(to);
    return rc;
}

static const char *const moment_prefixes[2] = {"exp_avg.", "exp_avg_sq."};
// Adaptive clipping's running norm average of a tensor (AdamW.norm_avg), shape [1], present only
// for the tensors that have one (none when max_grad_norm_ratio is off: the file is then as before).
#define NORM_AVG_PREFIX "grad_norm_exp_avg."

// train_state.safetensors' tensors: the moments (opt NULL: names and shapes alone, for sizing),
// then a norm average for each trainable tensor that has one (has[i]; NULL: none). As
// table_tensors; free with free_table_tensors.
static int state_tensors(const ParamTable *table, const AdamW *opt, const bool *has, StWriteTensor **ts,
                         char ***names, int *n) {
    const float *moments[2] = {opt ? opt->m : NULL, opt ? opt->v : NULL};
    SPES_TRY(table_tensors(table, true, 2, opt ? moments : NULL, moment_prefixes, ts, names, n));
    const int cap = *n + table->count + 1;
    StWriteTensor *more = realloc(*ts, (size_t)cap * sizeof **ts);
    if (more) *ts = more;
    char **more_names = more ? realloc(*names, (size_t)cap * sizeof **names) : NULL;
    if (more_names) *names = more_names;
    if (!more || !more_names) return spes_fail("out of memory listing the optimizer state");
    for (int i = 0; has && i < table->count; i++) {
        const ParamInfo *p = &table->entries[i];
        if (!p->trainable || p->grad_offset < 0 || !has[i]) continue;
        size_t len = strlen(NORM_AVG_PREFIX) + strlen(p->name) + 1;
        char *name = spes_malloc(len);
        if (!name) return SPES_ERR;
        snprintf(name, len, "%s%s", NORM_AVG_PREFIX, p->name);
        (*names)[*n] = name;
        (*ts)[(*n)++] = (StWriteTensor){
            .name = name, .dtype = DTYPE_F32, .ndim = 1, .shape = {1}, .data = opt ? &opt->norm_avg[i] : NULL};
    }
    return SPES_OK;
}

static int write_train_state(const char *path, const ParamTable *table, const AdamW *opt) {
    StWriteTensor *ts;
    char **names;
    int n;
    int rc = state_tensors(table, opt, opt->norm_avg_set, &ts, &names, &n);
    if (rc == SPES_OK) rc = safetensors_write_file(path, ts, n, NULL, NULL, 0);
    free_table_tensors(ts, names, n);
    return rc;
}

// Bytes of train_state.safetensors with (or without) a norm average for every trainable tensor.
static int state_file_bytes(const ParamTable *table, bool norm_avgs, size_t *bytes) {
    StWriteTensor *ts;
    char **names;
    int n;
    *bytes = 0;
    bool *all = spes_malloc(((size_t)table->count + 1) * sizeof *all);
    if (!all) return SPES_ERR;
    for (int i = 0; i < table->count; i++) all[i] = true;
    int rc = state_tensors(table, NULL, norm_avgs ? all : NULL, &ts, &names, &n);
    if (rc == SPES_OK) rc = safetensors_serialized_size(ts, n, NULL, NULL, 0, bytes);
    free_table_tensors(ts, names, n);
    free(all);
    return rc;
}

int checkpoint_norm_avg_bytes(const ParamTable *table, size_t *bytes) {
    size_t with, without;
    *bytes = 0;
    SPES_TRY(state_file_bytes(table, true, &with));
    SPES_TRY(state_file_bytes(table, false, &without));
    *bytes = with - without;
    return SPES_OK;
}

// The norm averages train_state.safetensors holds into opt (a tensor without one has none: a
// checkpoint of a run without adaptive clipping, or saved at step 1, starts them as OLMo does).
static int read_norm_avgs(const char *path, const ParamTable *table, AdamW *opt) {
    SafeTensors st;
    SPES_TRY(safetensors_open(path, &st));
    int rc = SPES_OK;
    for (int i = 0; rc == SPES_OK && i < table->count; i++) {
        const ParamInfo *p = &table->entries[i];
        opt->norm_avg_set[i] = false;
        if (!p->trainable || p->grad_offset < 0) continue;
        char name[200];
        snprintf(name, sizeof name, "%s%s", NORM_AVG_PREFIX, p->name);
        const StTensor *t = safetensors_find(&st, name);
        if (!t) continue;
        if (t->numel != 1) {
            rc = spes_fail("tensor %s holds %zu values, a norm average is one", name, t->numel);
            break;
        }
        float v;
        rc = safetensors_to_f32(t, &v);
        if (rc == SPES_OK && !(isfinite(v) && v >= 0))
            rc = spes_fail("tensor %s is %g, a norm average is finite and >= 0: the file is damaged", name, (double)v);
        if (rc == SPES_OK) {
            opt->norm_avg[i] = v;
            opt->norm_avg_set[i] = true;
        }
    }
    if (rc != SPES_OK) spes_fail_context("loading %s", path);
    safetensors_close(&st);
    return rc;
}

static char *step_dir_name(const char *save_folder, int64_t step, const char *suffix) {
    char name[64];
    snprintf(name, sizeof name, "step%lld%s", (long long)step, suffix);
    return path_join(save_folder, name);
}

// Puts the complete directory `fresh` in place of `old` (same step). The two are swapped
// atomically and the old one (now under `fresh`'s name) removed, so no crash leaves the folder
// without this step; without RENAME_EXCHANGE (some filesystems) the old one goes first.
static int replace_dir(const char *fresh, const char *old, const char *parent) {
    if (renameat2(AT_FDCWD, fresh, AT_FDCWD, old, RENAME_EXCHANGE) == 0) {
        SPES_TRY(fsync_dir(parent));
        return remove_tree(fresh);
    }
    if (errno != EINVAL && errno != ENOSYS)
        return spes_fail("cannot swap %s and %s: %s", fresh, old, strerror(errno));
    SPES_TRY(remove_tree(old));
    return rename_durable(fresh, old);
}

int checkpoint_save(const char *save_folder, const Model *m, const AdamW *opt, const TrainState *state,
                    const TrainConfig *cfg) {
    char *tmp = step_dir_name(save_folder, state->step, ".tmp");
    char *final = step_dir_name(save_folder, state->step, "");
    char *files[5] = {0};
    int rc = SPES_ERR;
    if (!tmp || !final) goto done;
    // A leftover .tmp from an interrupted save is garbage by construction.
    if (remove_tree(tmp) != SPES_OK || mkdir_p(tmp) != SPES_OK) goto done;
    const char *names[5] = {"model.safetensors", "config.json", "config.yaml", "train_state.safetensors",
                            "train_state.json"};
    for (int i = 0; i < 5; i++)
        if (!(files[i] = path_join(tmp, names[i]))) goto done;
    const float *weights[1] = {m->params};
    const char *no_prefix[1] = {""};
    if (checkpoint_write_table(files[0], &m->table, false, 1, weights, no_prefix) != SPES_OK) goto done;
    if (write_hf_config(files[1], &m->cfg) != SPES_OK) goto done;
    if (write_config_yaml(files[2], cfg) != SPES_OK) goto done;
    if (state->generation_config && write_generation_config(tmp, state) != SPES_OK) goto done;
    if (write_train_state(files[3], &m->table, opt) != SPES_OK) goto done;
    if (write_state_json(files[4], state, &m->table, opt->step) != SPES_OK) goto done;
    if (state->save_extra && state->save_extra(state->save_extra_ctx, tmp) != SPES_OK) goto done;
    if (fsync_dir(tmp) != SPES_OK) goto done;
    if (dir_exists(final)) rc = replace_dir(tmp, final, save_folder);   // re-save of the same step
    else rc = rename_durable(tmp, final);
done:
    if (rc != SPES_OK) {
        spes_fail_context("saving checkpoint step %lld in %s", (long long)state->step, save_folder);
        // The partial directory is as large as the model and never used (resume and prune
        // skip .tmp): on a full disk, keeping it would hold the space the next save needs.
        // (After a failed swap it may hold the step's previous copy, equally unused.)
        char why[2048];
        snprintf(why, sizeof why, "%s", spes_last_error());
        if (tmp && remove_tree(tmp) != SPES_OK) {
            log_warn("could not remove the partial checkpoint %s after the failed save: %s", tmp, spes_last_error());
            spes_fail("%s", why);   // the save's own error is the one to report
        }
    }
    for (int i = 0; i < 5; i++) free(files[i]);
    free(tmp);
    free(final);
    return rc;
}

int checkpoint_disk_bytes(const ParamTable *table, size_t extra, size_t *bytes) {
    static const char *const no_prefix[1] = {""};
    size_t model_bytes, state_bytes;
    *bytes = 0;
    SPES_TRY(table_file_bytes(table, false, 1, no_prefix, &model_bytes));
    SPES_TRY(table_file_bytes(table, true, 2, moment_prefixes, &state_bytes));
    *bytes = model_bytes + state_bytes + extra + CHECKPOINT_SMALL_FILES_BYTES;
    return SPES_OK;
}

int checkpoint_load(const char *dir, Model *m, AdamW *opt, TrainState *state) {
    char *weights = path_join(dir, "model.safetensors"), *moments = path_join(dir, "train_state.safetensors");
    char *json = path_join(dir, "train_state.json");
    int rc = SPES_ERR;
    if (!weights || !moments || !json) goto done;
    int64_t opt_step, n_trainable, values;
    uint64_t names_hash;
    if (read_state_json(dir, state, &opt_step, &n_trainable, &values, &names_hash) != SPES_OK) goto done;
    int mine;
    uint64_t my_hash = trainable_names_hash(&m->table, &mine);
    if (n_trainable == mine && names_hash == my_hash && (size_t)values != m->table.trainable_numel) {
        spes_fail("%s was written with the same trainable tensors holding %lld values, this run's hold %zu: the "
                  "model's dimensions (the model: keys) differ from the checkpoint's",
                  json, (long long)values, m->table.trainable_numel);
        goto done;
    }
    if (n_trainable != mine || (size_t)values != m->table.trainable_numel || names_hash != my_hash) {
        spes_fail("%s was written with %lld trainable tensors (%lld values), this run trains %d (%zu values) or "
                  "different ones; resume with the same trainable experts (spes_config.peer_id, "
                  "num_train_experts_per_node)",
                  json, (long long)n_trainable, (long long)values, mine, m->table.trainable_numel);
        goto done;
    }
    float *wbuf[1] = {m->params};
    const char *no_prefix[1] = {""};
    if (checkpoint_read_table(weights, &m->table, false, 1, wbuf, no_prefix) != SPES_OK) goto done;
    float *mbuf[2] = {opt->m, opt->v};
    if (checkpoint_read_table(moments, &m->table, true, 2, mbuf, moment_prefixes) != SPES_OK) goto done;
    // Second moments are means of squares: a negative one makes AdamW's sqrt NaN at the next step.
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *p = &m->table.entries[i];
        if (!p->trainable || p->grad_offset < 0) continue;
        for (size_t j = 0; j < p->numel; j++)
            if (opt->v[(size_t)p->grad_offset + j] < 0) {
                spes_fail("%s: tensor %s%s holds a negative value (%g at %zu): the file is damaged", moments,
                          moment_prefixes[1], p->name, (double)opt->v[(size_t)p->grad_offset + j], j);
                goto done;
            }
    }
    if (opt->norm_avg_set && read_norm_avgs(moments, &m->table, opt) != SPES_OK) goto done;
    opt->step = opt_step;
    rc = SPES_OK;
done:
    if (rc != SPES_OK) spes_fail_context("resuming from %s", dir);
    free(weights);
    free(moments);
    free(json);
    return rc;
}

// Whether the entry save_folder/stepN is a complete checkpoint (it holds train_state.json):
// 1 yes, 0 no (an interrupted or foreign directory), -1 with an error naming it when that cannot
// be told: an entry that is not a directory (a file, a dangling symlink) or cannot be read.
// Skipping those would resume from an older step, and the next save of stepN would fail after
// training (or replace what is there).
static int step_dir_complete(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        int err = errno;
        bool link = lstat(dir, &st) == 0 && S_ISLNK(st.st_mode);
        spes_fail("%s is not a checkpoint directory (%s: %s); move it out of the save_folder", dir,
                  link ? "a symbolic link to nothing" : "it cannot be read", strerror(err));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        spes_fail("%s is not a checkpoint directory but a file; move it out of the save_folder", dir);
        return -1;
    }
    char *json = path_join(dir, "train_state.json");
    if (!json) return -1;
    int rc = stat(json, &st) == 0 ? 1 : errno == ENOENT ? 0 : -1;
    if (rc < 0) {
        int err = errno;
        spes_fail("cannot tell whether %s is a complete checkpoint: %s: %s", dir, json, strerror(err));
    }
    free(json);
    return rc;
}

// Steps of the complete checkpoints in save_folder, ascending. A missing folder has none.
static int list_steps(const char *save_folder, int64_t **steps, int *count) {
    *steps = NULL;
    *count = 0;
    DIR *d = opendir(save_folder);
    if (!d) return errno == ENOENT ? SPES_OK : spes_fail("cannot list %s: %s", save_folder, strerror(errno));
    int cap = 0, rc = SPES_OK;
    struct dirent *e;
    while ((e = readdir(d)) && rc == SPES_OK) {
        int64_t step = parse_step_name(e->d_name, "");
        if (step < 0) continue;
        char *dir = path_join(save_folder, e->d_name);
        int complete = dir ? step_dir_complete(dir) : -1;
        free(dir);
        if (complete < 0) {
            rc = SPES_ERR;
            break;
        }
        if (!complete) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *grown = spes_realloc(*steps, (size_t)cap * sizeof **steps);
            if (!grown) {
                rc = SPES_ERR;
                break;
            }
            *steps = grown;
        }
        (*steps)[(*count)++] = step;
    }
    closedir(d);
    for (int i = 1; i < *count; i++)   // insertion sort: a handful of entries
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return rc;
}

int checkpoint_find_latest(const char *save_folder, char **dir, int64_t *step) {
    *dir = NULL;
    *step = -1;
    int64_t *steps;
    int count;
    SPES_TRY(list_steps(save_folder, &steps, &count));
    if (count > 0) {
        *step = steps[count - 1];
        *dir = step_dir_name(save_folder, *step, "");
    }
    free(steps);
    return count > 0 && !*dir ? SPES_ERR : SPES_OK;
}

int checkpoint_count(const char *save_folder, int *count) {
    int64_t *steps;
    SPES_TRY(list_steps(save_folder, &steps, count));
    free(steps);
    return SPES_OK;
}

int checkpoint_prune(const char *save_folder, int keep) {
    // Interrupted saves first: stepN.tmp directories are never complete.
    DIR *d = opendir(save_folder);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (parse_step_name(e->d_name, ".tmp") < 0) continue;
            char *dir = path_join(save_folder, e->d_name);
            int rc = dir ? remove_tree(dir) : SPES_ERR;
            free(dir);
            if (rc != SPES_OK) {
                closedir(d);
                return SPES_ERR;
            }
        }
        closedir(d);
    }
    if (keep <= 0) return SPES_OK;
    int64_t *steps;
    int count;
    SPES_TRY(list_steps(save_folder, &steps, &count));
    int rc = SPES_OK;
    for (int i = 0; i < count - keep && rc == SPES_OK; i++) {
        char *dir = step_dir_name(save_folder, steps[i], "");
        rc = dir ? remove_tree(dir) : SPES_ERR;
        if (rc == SPES_OK) log_info("removed old checkpoint %s (keeping %d)", dir, keep);
        free(dir);
    }
    free(steps);
    return rc;
}

int checkpoint_remove_all(const char *save_folder) {
    SPES_TRY(checkpoint_prune(save_folder, 0));   // leftover .tmp directories
    int64_t *steps;
    int count;
    SPES_TRY(list_steps(save_folder, &steps, &count));
    int rc = SPES_OK;
    for (int i = 0; i < count && rc == SPES_OK; i++) {
        char *dir = step_dir_name(save_folder, steps[i], "");
        rc = dir ? remove_tree(dir) : SPES_ERR;
        free(dir);
    }
    free(steps);
    return rc;
}
