// Config loading pipeline: YAML file -> tree -> command-line overrides -> ${...}
// interpolation -> TrainConfig (key table in config_keys.c) -> cross-field validation.
#include "config/config.h"
#include "ops/backend.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/text_buf.h"
#include "config/config_internal.h"
#include "sync/expert_owners.h"

static const char COMMAND_LINE[] = "command line";

// ---------------------------------------------------------------------------------------
// Overrides: "--a.b=value" or "--a.b" "value"; the value is YAML ("3", "1e-4", "[a, b]", "null").

static void mark_command_line(YNode *n) {
    n->origin = COMMAND_LINE;
    n->line = 0;
    for (int i = 0; i < n->n; i++) mark_command_line(n->items[i]);
}

static bool valid_key_name(const char *s, size_t len) {
    if (len == 0 || s[0] == '.' || s[len - 1] == '.') return false;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                  (ch == '.' && s[i + 1] != '.');
        if (!ok) return false;
    }
    return true;
}

static int apply_overrides(YNode *root, int n, char **args) {
    for (int i = 0; i < n; i++) {
        const char *arg = args[i];
        if (strncmp(arg, "--", 2) != 0)
            return spes_fail("command line: '%s' is not a config override (expected --key=value, e.g. "
                             "--spes_config.peer_id=1)", arg);
        arg += 2;
        const char *eq = strchr(arg, '=');
        size_t key_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (!valid_key_name(arg, key_len))
            return spes_fail("command line: '--%s' is not a config override (keys are dotted names like "
                             "optimizer.learning_rate)", arg);
        char key[256];
        if (key_len >= sizeof key) return spes_fail("command line: override key too long: '--%.40s...'", arg);
        memcpy(key, arg, key_len);
        key[key_len] = '\0';
        const char *value;
        if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= n) return spes_fail("command line --%s: needs a value (--%s=VALUE or --%s VALUE)", key, key, key);
            value = args[++i];
        }
        if (!config_key_known(key))
            return spes_fail("command line --%s: unknown config key (docs/config-keys.md lists them)", key);
        YNode *node = NULL;
        // "--load_path=" and "--stop_at=null": null. (A whole YAML document that is just null
        // reads as an empty config, so the literal is recognised here.)
        bool is_null = value[0] == '\0' || !strcmp(value, "null") || !strcmp(value, "Null") ||
                       !strcmp(value, "NULL") || !strcmp(value, "~");
        if (is_null) {
            node = spes_calloc(1, sizeof(YNode));
            if (!node || !(node->value = spes_strdup(""))) {
                free(node);
                return SPES_ERR;
            }
            node->kind = YNODE_SCALAR;
            node->plain = true;
        } else if (ytree_parse(value, strlen(value), COMMAND_LINE, 0, &node) != SPES_OK) {
            char why[512];   // the parser's message names "command line:<line>"; keep only the why
            const char *syntax = strstr(spes_last_error(), "YAML");
            snprintf(why, sizeof why, "%s", syntax ? syntax : spes_last_error());
            return spes_fail("command line --%s: '%s' is not a valid YAML value (%s)", key, value, why);
        }
        // OmegaConf keeps the last of a key given twice; so do we, but not without a word (a
        // launch script's override and a user's one for the same key look alike on the line).
        const YNode *earlier = ytree_get_path(root, key);
        if (earlier && earlier->origin == COMMAND_LINE)
            log_warn("command line --%s: given more than once; the last value, '%s', is used", key, value);
        mark_command_line(node);
        SPES_TRY(ytree_set_path(root, key, node));
    }
    return SPES_OK;
}

// ---------------------------------------------------------------------------------------
// ${a.b} interpolation (OmegaConf style), after overrides so --spes_config.peer_id=2 reaches
// save_folder: output/${run_name}/node${spes_config.peer_id}.

// Nested references multiply: a: ${b}${b}, b: ${c}${c}, ... doubles per level, so a 120 KB
// config could ask for gigabytes. Every value is capped, and so is the sum of all of them.
#define INTERP_MAX_VALUE (1u << 20)
#define INTERP_MAX_TOTAL (16u << 20)

typedef struct {
    YNode *root;
    size_t total;       // bytes of every interpolated value so far
} Interp;

typedef struct {
    char *p;
    size_t len, cap;
} Text;

// Appends s[0..n) to t; SPES_ERR (naming key) past the per-value cap or out of memory.
static int text_add(Text *t, const char *s, size_t n, const YNode *node, const char *key) {
    if (n > INTERP_MAX_VALUE - t->len)
        return key_fail(node, key, "interpolating its ${...} references would make a value over %u MiB "
                        "(references nested too often?)", INTERP_MAX_VALUE >> 20);
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->len + n + 1) cap *= 2;
        char *grown = spes_realloc(t->p, cap);
        if (!grown) return spes_fail_context("interpolating %s", key);
        t->p = grown;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
    return SPES_OK;
}

static int interpolate_scalar(Interp *in, YNode *n, const char *key, int depth) {
    if (!strstr(n->value, "${")) return SPES_OK;
    if (depth > 16) return key_fail(n, key, "interpolation nests deeper than 16 levels (a cycle?)");
    Text out = {0};
    const char *p = n->value;
    bool whole = false;   // the value is exactly one ${...}: it takes the target's type
    bool target_plain = true;
    int rc = SPES_OK;
    while (*p && rc == SPES_OK) {
        const char *start = strstr(p, "${");
        if (!start) {
            rc = text_add(&out, p, strlen(p), n, key);
            break;
        }
        if ((rc = text_add(&out, p, (size_t)(start - p), n, key)) != SPES_OK) break;
        const char *end = strchr(start + 2, '}');
        if (!end) {
            rc = key_fail(n, key, "unterminated ${ in '%.200s'", n->value);
            break;
        }
        char name[256];
        size_t len = (size_t)(end - start - 2);
        if (len == 0 || len >= sizeof name) {
            rc = key_fail(n, key, "bad interpolation '%.*s'", (int)(end - start + 1 < 200 ? end - start + 1 : 200), start);
            break;
        }
        memcpy(name, start + 2, len);
        name[len] = '\0';
        YNode *target = ytree_get_path(in->root, name);
        if (!target) {
            rc = key_fail(n, key, "unknown interpolation ${%s}: no such key in the config", name);
            break;
        }
        if (target->kind != YNODE_SCALAR) {
            rc = key_fail(n, key, "${%s} is %s, not a single value", name, target->kind == YNODE_MAP ? "a mapping" : "a list");
            break;
        }
        if (target == n) {
            rc = key_fail(n, key, "${%s} refers to itself", name);
            break;
        }
        if ((rc = interpolate_scalar(in, target, name, depth + 1)) != SPES_OK) break;
        whole = start == n->value && end[1] == '\0';
        target_plain = target->plain;
        const char *value = ytree_is_null(target) && !whole ? "None" : target->value;   // OmegaConf's str(None)
        rc = text_add(&out, value, strlen(value), n, key);
        p = end + 1;
    }
    if (rc == SPES_OK && out.len > INTERP_MAX_TOTAL - in->total)
        rc = key_fail(n, key, "interpolated values add up to over %u MiB (references nested too often?)",
                      INTERP_MAX_TOTAL >> 20);
    if (rc != SPES_OK) {
        free(out.p);
        return rc;
    }
    in->total += out.len;
    free(n->value);
    n->value = out.p;
    n->plain = whole ? target_plain : false;
    return SPES_OK;
}

static int interpolate_tree(Interp *in, YNode *n, const char *path) {
    if (n->kind == YNODE_SCALAR) return interpolate_scalar(in, n, path, 0);
    for (int i = 0; i < n->n; i++) {
        char child[512];
        if (n->kind == YNODE_MAP) snprintf(child, sizeof child, "%s%s%s", path, path[0] ? "." : "", n->keys[i]);
        else snprintf(child, sizeof child, "%s[%d]", path, i);
        SPES_TRY(interpolate_tree(in, n->items[i], child));
    }
    return SPES_OK;
}

// ---------------------------------------------------------------------------------------
// Validation: cross-field checks, errors at the line of the key that was set.

static const YNode *where(const YNode *root, const char *path) { return root ? ytree_get_path(root, path) : NULL; }

#define CHECK(cond, key, ...)                                         \
    do {                                                              \
        if (!(cond)) return key_fail(where(root, key), key, __VA_ARGS__); \
    } while (0)

// OLMo writes two kinds of checkpoint, sharded every save_interval and unsharded every
// save_interval_unsharded; ours are one kind that serves both (resumable, HF-loadable). The
// reference's 3B config sets only save_interval: taken alone it would leave a run with one save,
// at its end. So save_interval (and its keep count) stands in when save_interval_unsharded is
// unset, and a save_interval shorter than a set save_interval_unsharded is warned about.
static int resolve_save_interval(TrainConfig *cfg, const YNode *root) {
    const char *src = cfg->source_path ? cfg->source_path : "config";
    if (cfg->save_interval_sharded <= 0) return SPES_OK;
    if (cfg->save_interval_unsharded > 0) {
        if (cfg->save_interval_sharded < cfg->save_interval_unsharded)
            log_warn("%s: save_interval %" PRId64 " (OLMo's sharded checkpoints) is shorter than "
                     "save_interval_unsharded %" PRId64 ", and checkpoints here are one kind, saved every "
                     "save_interval_unsharded steps: set save_interval_unsharded to %" PRId64 " to save as often",
                     src, cfg->save_interval_sharded, cfg->save_interval_unsharded, cfg->save_interval_sharded);
        return SPES_OK;
    }
    CHECK(cfg->save_num_sharded_checkpoints_to_keep == -1 || cfg->save_num_sharded_checkpoints_to_keep >= 1,
          "save_num_checkpoints_to_keep", "must be -1 (keep all) or >= 1, got %d (it keeps the checkpoints "
          "save_interval makes)", cfg->save_num_sharded_checkpoints_to_keep);
    cfg->save_interval_unsharded = cfg->save_interval_sharded;
    if (cfg->save_num_unsharded_checkpoints_to_keep == -1)
        cfg->save_num_unsharded_checkpoints_to_keep = cfg->save_num_sharded_checkpoints_to_keep;
    char kept[32] = "all";
    if (cfg->save_num_unsharded_checkpoints_to_keep > 0)
        snprintf(kept, sizeof kept, "the newest %d", cfg->save_num_unsharded_checkpoints_to_keep);
    log_info("%s: save_interval_unsharded is not set: checkpoints every save_interval = %" PRId64
             " steps (OLMo's sharded interval; checkpoints here are one kind), keeping %s",
             src, cfg->save_interval_unsharded, kept);
    return SPES_OK;
}

static int validate_at(TrainConfig *cfg, const YNode *root) {
    ModelConfig *m = &cfg->model;
    // model: fill what OLMo derives, then check shapes
    if (m->n_kv_heads == 0) m->n_kv_heads = m->n_heads;
    if (m->embedding_size == 0) m->embedding_size = m->vocab_size;
    CHECK(m->d_model > 0 && m->n_heads > 0 && m->n_layers > 0 && m->vocab_size > 0 && m->num_experts > 0,
          "model", "d_model, n_heads, n_layers, vocab_size and moe_num_experts must be > 0");
    CHECK(m->n_heads % m->n_kv_heads == 0, "model.n_kv_heads", "n_heads (%d) must be a multiple of n_kv_heads (%d)",
          m->n_heads, m->n_kv_heads);
    if (m->head_dim == 0) {
        CHECK(m->d_model % m->n_heads == 0, "model.n_heads", "d_model (%d) is not divisible by n_heads (%d); set model.head_dim",
              m->d_model, m->n_heads);
        m->head_dim = m->d_model / m->n_heads;
    }
    CHECK(m->head_dim % 2 == 0, "model.head_dim", "head_dim %d must be even (rotary embeddings rotate pairs)", m->head_dim);
    CHECK(m->embedding_size >= m->vocab_size, "model.embedding_size", "must be >= vocab_size (%d), got %d",
          m->vocab_size, m->embedding_size);
    CHECK(m->top_k <= m->num_experts, "model.moe_top_k", "must be <= moe_num_experts (%d), got %d", m->num_experts, m->top_k);
    CHECK(m->expert_hidden > 0, "model.mlp_hidden_size", "expert hidden size must be > 0");
    CHECK(m->max_seq_len >= 2, "model.max_sequence_length", "must be >= 2 (an instance predicts positions 1..T-1), got %d",
          m->max_seq_len);
    // model_config_validate's bounds (the trainer checks them again, without a line)
    CHECK(m->d_model <= MODEL_MAX_WIDTH, "model.d_model", "%d is larger than the %lld the model code handles", m->d_model,
          MODEL_MAX_WIDTH);
    CHECK(m->embedding_size <= MODEL_MAX_WIDTH, m->embedding_size == m->vocab_size ? "model.vocab_size" : "model.embedding_size",
          "%d rows is more than the %lld the model code handles", m->embedding_size, MODEL_MAX_WIDTH);
    CHECK(m->expert_hidden <= MODEL_MAX_WIDTH, "model.mlp_hidden_size", "expert hidden size %d is larger than the %lld the "
          "model code handles", m->expert_hidden, MODEL_MAX_WIDTH);
    CHECK((long long)m->n_heads * m->head_dim <= MODEL_MAX_WIDTH, "model.n_heads", "n_heads x head_dim = %lld is larger "
          "than the %lld the model code handles", (long long)m->n_heads * m->head_dim, MODEL_MAX_WIDTH);
    CHECK(m->num_experts <= MODEL_MAX_EXPERTS, "model.moe_num_experts", "%d is more than the %d the model code handles",
          m->num_experts, MODEL_MAX_EXPERTS);
    CHECK(m->n_layers <= MODEL_MAX_LAYERS, "model.n_layers", "%d is more than the %d the model code handles", m->n_layers,
          MODEL_MAX_LAYERS);
    // OLMo's defaults (50256 for both, GPT-2's ids) are no id of a smaller vocabulary, and training
    // reads neither id (checkpoints' config.json does; a load_path's ids take their place there,
    // train/source_model.h): a default outside the embedding means none, where a value the
    // YAML sets is checked.
    if (root && !where(root, "model.eos_token_id") && m->eos_token_id >= m->embedding_size) m->eos_token_id = -1;
    if (root && !where(root, "model.pad_token_id") && m->pad_token_id >= m->embedding_size) m->pad_token_id = -1;
    CHECK(m->eos_token_id < m->embedding_size, "model.eos_token_id", "%d is outside the embedding (%d rows)",
          m->eos_token_id, m->embedding_size);
    CHECK(m->pad_token_id < m->embedding_size, "model.pad_token_id", "%d is outside the embedding (%d rows)",
          m->pad_token_id, m->embedding_size);

    // batch and duration
    CHECK(cfg->global_train_batch_size > 0, "global_train_batch_size", "must be > 0");
    CHECK(cfg->device_train_microbatch_size > 0, "device_train_microbatch_size", "must be > 0");
    CHECK(cfg->global_train_batch_size % cfg->device_train_microbatch_size == 0, "device_train_microbatch_size",
          "global_train_batch_size (%d) must be a multiple of device_train_microbatch_size (%d)",
          cfg->global_train_batch_size, cfg->device_train_microbatch_size);
    CHECK(cfg->max_duration > 0, "max_duration", "must be > 0");

    // optimizer and schedule
    CHECK(cfg->schedule.alpha_f <= 1.0, "scheduler.alpha_f", "must be in [0, 1], got %g", cfg->schedule.alpha_f);
    // Only the decaying schedulers read t_max (OLMo's others ignore it).
    CHECK(cfg->schedule.t_max <= 0 || !schedule_kind_decays(cfg->schedule.kind) ||
              cfg->schedule.t_max > cfg->schedule.t_warmup, "scheduler.t_max",
          "must be > t_warmup (%" PRId64 "), got %" PRId64, cfg->schedule.t_warmup, cfg->schedule.t_max);
    CHECK(cfg->schedule.warmup_min_lr < 0 || cfg->schedule.warmup_min_lr <= cfg->learning_rate, "scheduler.warmup_min_lr",
          "must be <= optimizer.learning_rate (%g), got %g", cfg->learning_rate, cfg->schedule.warmup_min_lr);

    // checkpoints
    CHECK(cfg->save_folder && cfg->save_folder[0], "save_folder", "must be a directory path");
    SPES_TRY(resolve_save_interval(cfg, root));
    CHECK(cfg->save_num_unsharded_checkpoints_to_keep == -1 || cfg->save_num_unsharded_checkpoints_to_keep >= 1,
          "save_num_unsharded_checkpoints_to_keep", "must be -1 (keep all) or >= 1, got %d",
          cfg->save_num_unsharded_checkpoints_to_keep);

    // SPES topology
    // The SPES configs set using_dilico together with using_spes: dilico (FedAvg) is a mode of
    // the federated client in which every expert is trainable, so ownership is not checked.
    CHECK(cfg->num_peers >= 1, "spes_config.num_peers", "must be >= 1");
    CHECK(cfg->peer_id >= 0 && cfg->peer_id < cfg->num_peers, "spes_config.peer_id", "must be in [0, num_peers = %d), got %d",
          cfg->num_peers, cfg->peer_id);
    if (cfg->num_train_experts_per_node == 0)
        cfg->num_train_experts_per_node = cfg->using_spes && !cfg->using_dilico ? m->num_experts / cfg->num_peers : m->num_experts;
    CHECK(cfg->num_train_experts_per_node >= 1 && cfg->num_train_experts_per_node <= m->num_experts,
          "spes_config.num_train_experts_per_node", "must be in [1, moe_num_experts = %d], got %d", m->num_experts,
          cfg->num_train_experts_per_node);
    if (cfg->using_spes && !cfg->using_dilico) {
        // This peer owns the experts of group peer_id mod E/m (sync/expert_owners.h). num_peers
        // a multiple of E/m gives every expert the same number of owners (1: the reference's
        // partition; more: replicas the server averages). Other topologies (E not a multiple of
        // m, or num_peers not one of E/m) leave experts with fewer owners or none; the server
        // refuses them, the peer only warns (its config may be one of several being written).
        int m_own = cfg->num_train_experts_per_node, E = m->num_experts;
        if (!expert_owners_even(cfg->num_peers, m_own, E))
            log_warn("%s: spes_config: num_peers (%d) x num_train_experts_per_node (%d) does not cover the %d experts "
                     "evenly: a server refuses it (every expert needs the same number of owners)",
                     cfg->source_path ? cfg->source_path : "config", cfg->num_peers, m_own, E);
        else if (expert_replicas(cfg->num_peers, m_own, E) > 1)
            log_info("spes_config: %d peers x %d of %d experts: every expert has %d owners (replicas)", cfg->num_peers,
                     m_own, E, expert_replicas(cfg->num_peers, m_own, E));
    }
    if (cfg->using_spes || cfg->using_dilico)
        CHECK(cfg->server_addr && cfg->server_addr[0], "spes_config.server_addr", "needs host:port of the parameter server");
    Precision precision;
    CHECK(cfg->precision && precision_from_name(cfg->precision, &precision) == SPES_OK, "precision",
          "expected fp32, amp_bf16 or amp_fp16, got '%s'", cfg->precision ? cfg->precision : "null");
    int cuda_index;
    CHECK(cfg->device && backend_parse_device(cfg->device, &cuda_index) == SPES_OK, "device",
          "expected auto, cpu, cuda or cuda:N, got '%s'", cfg->device ? cfg->device : "null");
    CHECK(cfg->distributed_strategy && (strcmp(cfg->distributed_strategy, "single") == 0 ||
                                        strcmp(cfg->distributed_strategy, "ddp") == 0 ||
                                        strcmp(cfg->distributed_strategy, "fsdp") == 0),
          "distributed_strategy", "expected single, ddp or fsdp, got '%s'",
          cfg->distributed_strategy ? cfg->distributed_strategy : "null");
    const char *ss = cfg->fsdp_sharding_strategy;
    CHECK(ss && (strcmp(ss, "NO_SHARD") == 0 || strcmp(ss, "SHARD_OPTIM") == 0 || strcmp(ss, "SHARD_GRAD_OP") == 0 ||
                 strcmp(ss, "FULL_SHARD") == 0),
          "fsdp.sharding_strategy", "expected NO_SHARD, SHARD_OPTIM, SHARD_GRAD_OP or FULL_SHARD, got '%s' (hybrid "
          "sharding across nodes is what the SPES server does)", ss ? ss : "null");
    CHECK(cfg->sync_steps > 0, "spes_config.sync_steps", "must be > 0");
    CHECK(cfg->sync_warmup_every > 0 && cfg->sync_warmup_every <= cfg->sync_steps, "spes_config.sync_warmup_every",
          "must be in [1, sync_steps = %" PRId64 "], got %" PRId64, cfg->sync_steps, cfg->sync_warmup_every);
    // A warm-up ending on the regular schedule's grid and on its own: spes_sync_due's ramp starts there.
    CHECK(cfg->sync_warmup_steps == 0 || (cfg->sync_warmup_steps % cfg->sync_steps == 0 &&
                                          cfg->sync_warmup_steps % cfg->sync_warmup_every == 0),
          "spes_config.sync_warmup_steps", "must be a multiple of sync_steps (%" PRId64 ") and of sync_warmup_every (%" PRId64
          "), got %" PRId64, cfg->sync_steps, cfg->sync_warmup_every, cfg->sync_warmup_steps);
    CHECK(cfg->lr_scale > 0 && cfg->lr_scale <= 100, "spes_config.lr_scale", "must be in (0, 100], got %g", cfg->lr_scale);
    CHECK(cfg->peer_beta1 == -1 || (cfg->peer_beta1 >= 0 && cfg->peer_beta1 < 1), "spes_config.beta1",
          "must be in [0, 1) or null, got %g", cfg->peer_beta1);
    CHECK(cfg->decayed_factor_update_steps > 0, "spes_config.decayed_factor_update_steps", "must be > 0");
    // The ranges `spes server --outer_lr / --outer_momentum` accept (src/cli/server.c).
    CHECK(cfg->outer_lr >= 1e-6f && cfg->outer_lr <= 10.0f, "spes_config.outer_lr", "must be in [1e-6, 10], got %g",
          (double)cfg->outer_lr);
    CHECK(cfg->outer_momentum >= 0.0f && cfg->outer_momentum < 1.0f, "spes_config.outer_momentum",
          "must be in [0, 1), got %g", (double)cfg->outer_momentum);
    return SPES_OK;
}

int config_validate(TrainConfig *cfg) { return validate_at(cfg, NULL); }

int64_t instance_filter_min_tokens(const InstanceFilterConfig *f) {
    int64_t times = f->max_count > 3 ? f->max_count : 3;
    return times * (f->min_period > 1 ? f->min_period : 1);
}

int config_key_fail(const TrainConfig *cfg, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = key_vfail(where(cfg->tree, key), key, fmt, ap);
    va_end(ap);
    return rc;
}

static int schedule_fail_at_key(void *cfg, const char *key, const char *msg) {
    return config_key_fail(cfg, key, "%s", msg);
}

ScheduleRun config_schedule_run(const TrainConfig *cfg, int64_t max_steps) {
    ScheduleRun run = {.max_steps = max_steps,
                       .tokens_per_step = (int64_t)cfg->global_train_batch_size * cfg->model.max_seq_len,
                       .max_tokens = -1};
    // olmo/train.py's max_tokens: "<N>T" as given, "<N>ep" epochs x batches_per_epoch x
    // tokens_per_batch (config_max_steps' steps), steps: derived at each step (schedule_position).
    if (cfg->max_duration_unit == DURATION_TOKENS) run.max_tokens = cfg->max_duration;
    else if (cfg->max_duration_unit == DURATION_EPOCHS) run.max_tokens = max_steps * run.tokens_per_step;
    return run;
}

int config_schedule_validate(const TrainConfig *cfg, int64_t max_steps) {
    // The run's length in the schedule's units, as it stands before step 1.
    const ScheduleRun run = config_schedule_run(cfg, max_steps);
    int64_t max = schedule_position(&cfg->schedule, &run, 0, 0).max;
    return schedule_validate(&cfg->schedule, cfg->learning_rate, max, schedule_fail_at_key, (void *)cfg);
}

// An instance filter that can never mask anything: no instance of model.max_sequence_length
// tokens holds enough repeats of a pattern of repetition_min_period tokens or more. A warning,
// not an error: OLMo takes such a config (its InstanceFilterConfig checks nothing, and its
// _validate_instance just never finds a long enough repetition), so the run trains every
// instance exactly as OLMo's would; refusing it would refuse configs OLMo runs.
static void warn_inert_instance_filter(const TrainConfig *cfg, const YNode *root) {
    const InstanceFilterConfig *f = &cfg->data.instance_filter;
    int64_t need = instance_filter_min_tokens(f);
    if (!f->enabled || need <= cfg->model.max_seq_len) return;
    char filter[600], seq[600];
    key_where(where(root, "data.instance_filter"), "data.instance_filter", filter, sizeof filter);
    key_where(where(root, "model.max_sequence_length"), "model.max_sequence_length", seq, sizeof seq);
    log_warn("%s: never masks an instance: a pattern of repetition_min_period %d token%s repeated "
             "repetition_max_count %d time%s (3 at least) takes %" PRId64 " tokens, and an instance has %d (%s); OLMo "
             "takes such a config and masks nothing, and so does this run (lower repetition_min_period or "
             "repetition_max_count, or set data.instance_filter: null)",
             filter, f->min_period, f->min_period == 1 ? "" : "s", f->max_count, f->max_count == 1 ? "" : "s", need,
             cfg->model.max_seq_len, seq);
}

// A clipping warm-up that changes nothing: one of its two keys without the other, or no
// max_grad_norm to multiply. A warning: OLMo takes such a config and clips as without it.
static void warn_inert_clip_warmup(const TrainConfig *cfg, const YNode *root) {
    const ScheduleConfig *s = &cfg->schedule;
    bool steps = s->grad_clip_warmup_steps >= 0, factor = s->grad_clip_warmup_factor > 0;
    if (!steps && !factor) return;
    const char *set = steps ? "scheduler.grad_clip_warmup_steps" : "scheduler.grad_clip_warmup_factor";
    char at[600];
    key_where(where(root, set), set, at, sizeof at);
    if (steps != factor)
        log_warn("%s: set without scheduler.%s, so no clipping warm-up: OLMo needs both, and so does this run", at,
                 steps ? "grad_clip_warmup_factor" : "grad_clip_warmup_steps");
    else if (cfg->max_grad_norm <= 0 && cfg->max_grad_norm_ratio <= 0)
        log_warn("%s: max_grad_norm and max_grad_norm_ratio are null (no clipping), so the clipping warm-up changes "
                 "nothing", at);
}

// OLMo clips a group adaptively when it has max_grad_norm_ratio and never looks at its
// max_grad_norm then: say so when both are set.
static void warn_ignored_max_grad_norm(const TrainConfig *cfg, const YNode *root) {
    if (cfg->max_grad_norm <= 0 || cfg->max_grad_norm_ratio <= 0) return;
    char at[600];
    key_where(where(root, "max_grad_norm"), "max_grad_norm", at, sizeof at);
    log_warn("%s: ignored: max_grad_norm_ratio is set, and adaptive clipping replaces the global one (as in OLMo)",
             at);
}

// ---------------------------------------------------------------------------------------
// Loading

static void report_keys(const TrainConfig *cfg, ParseCtx *ctx) {
    if (ctx->ignored.n) {
        char *list = strlist_join(&ctx->ignored, ", ");
        log_info("%s: %d GPU/cluster-only key%s ignored (docs/config-keys.md says why): %s", cfg->source_path,
                 ctx->ignored.n, ctx->ignored.n == 1 ? "" : "s", list ? list : "");
        free(list);
    }
    if (ctx->downstream.n) {
        char *list = strlist_join(&ctx->downstream, ", ");
        log_warn("%s: %d downstream evaluator%s skipped during training (run `spes eval` for them): %s",
                 cfg->source_path, ctx->downstream.n, ctx->downstream.n == 1 ? "" : "s", list ? list : "");
        free(list);
    }
    if (ctx->unknown.n)
        log_warn("%s: %d unknown key%s ignored (typo? docs/config-keys.md lists the known ones): %s", cfg->source_path,
                 ctx->unknown.n, ctx->unknown.n == 1 ? "" : "s", cfg->unknown_keys ? cfg->unknown_keys : "");
}

// report: say which keys were ignored, skipped or unknown (not when reading back a saved copy).
static int load_string(const char *yaml_text, const char *name, int n_overrides, char **overrides, TrainConfig *cfg,
                       bool report) {
    config_defaults(cfg);
    YNode *root = NULL;
    ParseCtx ctx = {.mlp_ratio = 4.0};
    int rc = SPES_ERR;
    if (!cfg->save_folder || !cfg->server_addr || !(cfg->source_path = spes_strdup(name))) goto out;
    // node origins point at cfg->source_path, which outlives the tree
    if (ytree_parse(yaml_text, strlen(yaml_text), cfg->source_path, 0, &root) != SPES_OK) goto out;
    if (root->kind != YNODE_MAP) {
        spes_fail("%s:%d: a config must be a mapping of keys (key: value lines)", name, root->line);
        goto out;
    }
    if (apply_overrides(root, n_overrides, overrides) != SPES_OK) goto out;
    Interp interp = {.root = root};
    if (interpolate_tree(&interp, root, "") != SPES_OK) goto out;
    if (config_apply_tree(&ctx, root, cfg) != SPES_OK) goto out;
    if (config_finish(&ctx, root, cfg) != SPES_OK) goto out;
    if (ctx.unknown.n && !(cfg->unknown_keys = strlist_join(&ctx.unknown, ", "))) goto out;
    if (validate_at(cfg, root) != SPES_OK) goto out;
    if (report) report_keys(cfg, &ctx);
    if (report) warn_inert_instance_filter(cfg, root);
    if (report) warn_inert_clip_warmup(cfg, root);
    if (report) warn_ignored_max_grad_norm(cfg, root);
    cfg->tree = root;   // config_free frees it
    root = NULL;
    rc = SPES_OK;
out:
    ytree_free(root);
    strlist_free(&ctx.unknown);
    strlist_free(&ctx.ignored);
    strlist_free(&ctx.downstream);
    if (rc != SPES_OK) config_free(cfg);
    return rc;
}

int config_load_string(const char *yaml_text, const char *name, int n_overrides, char **overrides, TrainConfig *cfg) {
    return load_string(yaml_text, name, n_overrides, overrides, cfg, true);
}

// A config is read whole; a token file or an image given by mistake could be gigabytes.
#define CONFIG_MAX_BYTES (64u << 20)

static int load_file(const char *path, int n_overrides, char **overrides, TrainConfig *cfg, bool report) {
    uint8_t *text = NULL;
    size_t len = 0;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > (off_t)CONFIG_MAX_BYTES) {
        *cfg = (TrainConfig){0};
        return spes_fail("config: %s is %lld bytes, more than a YAML config can be (%u MiB); is it a token or "
                         "checkpoint file?", path, (long long)st.st_size, CONFIG_MAX_BYTES >> 20);
    }
    if (file_read_all(path, &text, &len) != SPES_OK) {
        *cfg = (TrainConfig){0};
        return spes_fail_context("config");
    }
    int rc = SPES_OK;
    if (strlen((const char *)text) != len) rc = spes_fail("%s: NUL byte in the config file", path);
    else rc = load_string((const char *)text, path, n_overrides, overrides, cfg, report);
    if (rc != SPES_OK) *cfg = (TrainConfig){0};
    free(text);
    return rc;
}

int config_load(const char *path, int n_overrides, char **overrides, TrainConfig *cfg) {
    return load_file(path, n_overrides, overrides, cfg, true);
}

// ---------------------------------------------------------------------------------------
// Derived quantities

int config_grad_accum_steps(const TrainConfig *cfg) {
    return cfg->global_train_batch_size / cfg->device_train_microbatch_size;
}

int64_t config_last_step(const TrainConfig *cfg, int64_t max_steps) {
    return cfg->stop_at >= 0 && cfg->stop_at < max_steps ? cfg->stop_at : max_steps;
}

int config_max_steps(const TrainConfig *cfg, int64_t dataset_instances, int64_t *steps) {
    switch (cfg->max_duration_unit) {
    case DURATION_STEPS: *steps = cfg->max_duration; return SPES_OK;
    case DURATION_TOKENS: {
        int64_t per_step = (int64_t)cfg->global_train_batch_size * cfg->model.max_seq_len;
        *steps = cfg->max_duration / per_step + (cfg->max_duration % per_step != 0);   // ceil, no overflow
        return SPES_OK;
    }
    case DURATION_EPOCHS: {
        if (dataset_instances < 0)
            return config_key_fail(cfg, "max_duration", "%" PRId64 "ep needs the dataset size", cfg->max_duration);
        int64_t per_epoch = dataset_instances / cfg->global_train_batch_size;   // OLMo: floor
        if (per_epoch == 0)
            return config_key_fail(cfg, "max_duration", "%" PRId64 "ep: the dataset (%" PRId64 " instances) holds less "
                                   "than one global batch (%d)", cfg->max_duration, dataset_instances,
                                   cfg->global_train_batch_size);
        if (cfg->max_duration > INT64_MAX / per_epoch)   // the product would wrap (to a negative or small count)
            return config_key_fail(cfg, "max_duration", "%" PRId64 "ep of %" PRId64 " steps each is more steps than a "
                                   "64-bit count holds", cfg->max_duration, per_epoch);
        *steps = cfg->max_duration * per_epoch;
        return SPES_OK;
    }
    }
    return config_key_fail(cfg, "max_duration", "unknown unit");
}

// The "key=value" lines of `which` keys (config_write_values), as one string (caller frees).
static char *value_lines(const TrainConfig *cfg, ConfigOutput which, size_t *len) {
    char *text = NULL;
    FILE *mem = open_memstream(&text, len);
    if (!mem) return NULL;
    config_write_values(cfg, mem, which);
    if (fclose(mem) != 0) free(text), text = NULL;
    return text;
}

uint64_t config_hash(const TrainConfig *cfg) {
    size_t len = 0;
    char *text = value_lines(cfg, CONFIG_LINES_HASHED, &len);
    if (!text) return 0;
    uint64_t h = 0xcbf29ce484222325ULL;   // FNV-1a 64
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)text[i];
        h *= 0x100000001b3ULL;
    }
    free(text);
    return h;
}

char *config_job_lines(const TrainConfig *cfg) {
    size_t len = 0;
    return value_lines(cfg, CONFIG_LINES_JOB, &len);
}

void config_write_yaml(const TrainConfig *cfg, FILE *out) { config_write_values(cfg, out, CONFIG_DUMP_YAML); }

// "key=value" lines split in place into *lines (caller frees *lines; the text stays the caller's).
static int split_lines(char *text, char ***lines, int *n) {
    *lines = NULL, *n = 0;
    int count = 0;
    for (const char *c = text; *c; c++) count += *c == '\n';
    if (!(*lines = spes_calloc((size_t)count + 1, sizeof(char *)))) return SPES_ERR;
    for (char *line = text, *end; *line && (end = strchr(line, '\n')); line = end + 1) {
        *end = '\0';
        (*lines)[(*n)++] = line;
    }
    return SPES_OK;
}

// The value of `key` among "key=value" lines, or NULL.
static const char *value_of(char **lines, int n, const char *key, size_t key_len) {
    for (int i = 0; i < n; i++)
        if (strncmp(lines[i], key, key_len) == 0 && lines[i][key_len] == '=') return lines[i] + key_len + 1;
    return NULL;
}

// "old -> new" for one key, each value cut at 60 characters (data.paths can list thousands).
static void describe_change(TextBuf *b, const char *key, size_t key_len, const char *was, const char *now) {
    text_buf_printf(b, "%s%.*s: ", b->len ? "; " : "", (int)key_len, key);
    const char *sides[2] = {was ? was : "(unset)", now ? now : "(unset)"};
    for (int i = 0; i < 2; i++)
        text_buf_printf(b, "%s%.60s%s", i ? " -> " : "", sides[i], strlen(sides[i]) > 60 ? "..." : "");
}

char *config_diff_lines(const char *was_text, const char *now_text) {
    char *text_was = spes_strdup(was_text), *text_now = spes_strdup(now_text), **was = NULL, **cur = NULL;
    int n_was = 0, n_now = 0;
    TextBuf b;
    text_buf_init(&b);
    if (text_was && text_now && split_lines(text_was, &was, &n_was) == SPES_OK &&
        split_lines(text_now, &cur, &n_now) == SPES_OK) {
        for (int i = 0; i < n_now; i++) {   // keys set now, in table order
            size_t key_len = strcspn(cur[i], "=");
            const char *old_value = value_of(was, n_was, cur[i], key_len);
            if (!old_value || strcmp(old_value, cur[i] + key_len + 1) != 0)
                describe_change(&b, cur[i], key_len, old_value, cur[i] + key_len + 1);
        }
        for (int i = 0; i < n_was; i++) {   // keys set then and unset now
            size_t key_len = strcspn(was[i], "=");
            if (!value_of(cur, n_now, was[i], key_len)) describe_change(&b, was[i], key_len, was[i] + key_len + 1, NULL);
        }
    }
    free(text_was), free(text_now), free(was), free(cur);
    size_t len;
    char *out = text_buf_take(&b, &len);
    if (out && len == 0) free(out), out = NULL;
    return out;
}

char *config_changes_since(const char *saved_path, const TrainConfig *now) {
    TrainConfig saved;
    if (load_file(saved_path, 0, NULL, &saved, false) != SPES_OK) return NULL;
    size_t len;
    char *was = value_lines(&saved, CONFIG_LINES_HASHED, &len), *cur = value_lines(now, CONFIG_LINES_HASHED, &len);
    char *out = was && cur ? config_diff_lines(was, cur) : NULL;
    free(was), free(cur);
    config_free(&saved);
    return out;
}
