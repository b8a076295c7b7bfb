// Training configuration: the SPES/OLMo YAML keys that matter for training, loaded with
// libyaml, `${key}` interpolation, `--a.b=value` command-line overrides, and validation.
//
// Loading never opens data files (paths are checked when the dataset opens). Every value
// remembers its file:line, so errors read
//   "run.yaml:57: optimizer.learning_rate: expected a number, got 'abc'".
// Keys are listed in one table (config_keys.c): supported ones fill the struct below, known
// GPU/cluster-only ones are ignored with a reason, anything else gets ONE warning listing
// every unknown key. docs/config-keys.md is generated from that table.
//
// Defaults are OLMo's (olmo/config.py) except where noted in docs/config-keys.md.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model_config.h"
#include "train/optimizer.h"
#include "train/schedule.h"

// data.memmap_dtype: element type of raw (headerless) token files; real .npy files carry
// their own dtype in the header (src/io/npy.h).
typedef enum { MEMMAP_UINT16 = 0, MEMMAP_UINT32 } MemmapDtype;

// max_duration: "50000" (steps), "2e9T" / "2000000000T" (tokens), "3ep" (epochs).
typedef enum { DURATION_STEPS = 0, DURATION_TOKENS, DURATION_EPOCHS } DurationUnit;

// spes_config.payload_dtype: what peers upload/download.
// int8 / int4: changes against the last aggregate, int8 or int4 codes per block with error feedback
// (docs/communication.md).
typedef enum { PAYLOAD_F32 = 0, PAYLOAD_BF16, PAYLOAD_INT8, PAYLOAD_INT4 } PayloadDtype;

// An `evaluators:` entry: type lm, validation loss on token files; or type downstream with our
// `requests:` key, multiple-choice accuracy on an oe-eval request file or folder (what `spes
// eval --task` reads), tokenised with tokenizer.identifier. Downstream entries without
// `requests` (OLMo's built-in tasks) are skipped with a warning.
typedef struct {
    char *label;
    char **paths;               // lm: token files or .txt manifests (as data.paths)
    int n_paths;
    char *requests;             // downstream: requests.jsonl[.gz] or a folder holding one; NULL: lm
    int limit;                  // downstream: the first `limit` documents (0: all)
} EvaluatorConfig;

// data.instance_filter (OLMo's InstanceFilterConfig): a training instance holding a run of
// some 1..max_period token pattern repeated max_count times or more is trained with its loss
// masked out (src/data/instance_filter.h). Off unless the config has the mapping.
typedef struct {
    bool enabled;               // the key is set (a mapping); null/absent: every instance trains
    int max_period;             // repetition_max_period, default 13
    int min_period;             // repetition_min_period, default 1
    int max_count;              // repetition_max_count, default 32
} InstanceFilterConfig;

// The fewest tokens an instance needs for f to mask it: max_count periods (at least the 3 a
// repetition covers, find_periodic_sequences) of min_period tokens; a longer period needs more.
// A shorter instance is never masked, whatever its tokens. (Here, beside the type, so the
// config's load can warn of a filter that cannot fire without reaching up into src/data.)
int64_t instance_filter_min_tokens(const InstanceFilterConfig *f);

typedef struct {
    char **paths;               // token files; an entry ending in .txt is a manifest (one path a line)
    int n_paths;
    MemmapDtype memmap_dtype;   // default uint16 (OLMo)
    int64_t seed;               // shuffle seed; data.seed, or the top-level seed when unset
    bool drop_last;             // drop the last incomplete global batch of an epoch
    InstanceFilterConfig instance_filter;
} DataConfig;

typedef struct {
    // Model section, mapped onto the model's own struct (expert_hidden = mlp_hidden_size/2
    // or mlp_ratio*d_model/2; head_dim, n_kv_heads, embedding_size derived when unset).
    ModelConfig model;
    float moe_loss_weight;            // model.moe_loss_weight (load balancing), default 0.1
    float moe_zloss_weight;           // model.moe_zloss_weight (router z-loss), default 0 (null)
    bool softmax_auxiliary_loss;      // LM z-loss on/off, default false
    float auxiliary_loss_multiplier;  // its weight, default 1e-4

    // optimizer: AdamW only (name: adamw). OLMo defaults: lr 1e-4, betas [0.9, 0.95],
    // eps 1e-5, weight_decay 0, decay_norm_and_bias false, decay_embeddings false.
    double learning_rate;
    AdamWConfig adamw;                // betas, eps, weight_decay, decay groups
    double max_grad_norm;             // <= 0: no clipping (null), default null
    double max_grad_norm_ratio;       // adaptive clipping (train/clip_adaptive.h); <= 0: off (null), default null

    // scheduler. Default cosine_with_warmup, units steps, t_warmup 100, t_max null (-> the
    // run's max steps), alpha_f 0.1, warmup_min_lr null (-> 0.1 * lr, OLMo).
    ScheduleConfig schedule;

    DataConfig data;
    EvaluatorConfig *evaluators;      // type lm, and downstream ones with `requests`
    char *tokenizer_identifier;       // tokenizer.identifier: a tokenizer.json (or its folder) for
                                      // downstream evaluators; NULL: none
    int n_evaluators;
    int64_t eval_interval;            // steps, default 1000
    int device_eval_batch_size;       // default 16

    // duration and batch
    int64_t max_duration;             // in max_duration_unit, default 10000 steps
    DurationUnit max_duration_unit;
    int64_t stop_at;                  // < 0: unset (null)
    int global_train_batch_size;      // instances per optimizer step, default 512
    int device_train_microbatch_size; // instances per forward/backward, default 16

    // checkpoints and logging
    char *save_folder;                // default "./"
    int64_t save_interval_unsharded;  // steps; <= 0: only the final save (null)
    int save_num_unsharded_checkpoints_to_keep;   // < 0: keep all, default -1
    int64_t save_interval_sharded;    // OLMo's save_interval (sharded); <= 0: unset. Taken as the
                                      // checkpoints' interval when save_interval_unsharded is unset
    int save_num_sharded_checkpoints_to_keep;     // OLMo's save_num_checkpoints_to_keep, default -1
    bool save_overwrite;              // default false
    char *load_path;                  // NULL: none. Initial weights only (HF dir or checkpoint)
    bool try_load_latest_save;        // resume from the newest complete save_folder/stepN
    int64_t console_log_interval;     // default 1

    char *run_name;                   // default NULL
    int64_t seed;                     // default 6198
    int threads;                      // 0: all cores (our extension)
    char *device;                     // auto | cpu | cuda | cuda:N (default auto)
    char *precision;                  // fp32 | amp_bf16 | amp_fp16 (default fp32: OLMo's)
    char *activation_checkpointing;   // NULL (none) | fine_grained | whole_layer

    // ranks inside a node (src/parallel/; used when the job has more than one rank)
    char *distributed_strategy;       // single | ddp | fsdp (default fsdp, OLMo's)
    char *fsdp_sharding_strategy;     // fsdp.sharding_strategy: NO_SHARD | SHARD_OPTIM (ours: ZeRO-1) |
                                      // SHARD_GRAD_OP | FULL_SHARD (default FULL_SHARD, OLMo's)
    bool fsdp_prefetch;               // fsdp.prefetch: FULL_SHARD gathers the next part while one runs (true)
    double ddp_bucket_cap_mb;         // ddp.bucket_cap_mb: gradient all-reduce / parameter all-gather buckets (25, torch's)
    bool ddp_overlap_grad_reduce;     // ddp.overlap_grad_reduce: reduce gradients during the backward (true)
    bool optimizer_overlap;           // optimizer.overlap_next_forward: AdamW under the next forward (false)

    // SPES
    bool using_spes;                  // train only own experts and sync through the server
    bool using_dilico;                // fedavg baseline: everything trainable, all averaged
    int num_peers;                    // spes_config.*, defaults 1, 0, moe_num_experts, 100
    int peer_id;
    int num_train_experts_per_node;
    int64_t sync_steps;
    char *server_addr;                // default "127.0.0.1:50051"
    bool using_decayed_aux_loss;      // default false
    int64_t decayed_factor_update_steps;   // default 1 (recompute c(t) every N steps)
    PayloadDtype payload_dtype;       // default f32
    bool sync_overlap;                // spes_config.sync_overlap: train on while a round is in flight
    char *auth_token_file;            // spes_config.auth_token_file: token for the server (NULL: none)
    char *tls_ca, *tls_cert, *tls_key;   // spes_config.tls_*: TLS to the server (NULL: insecure)
    int take_over_peer_id;            // spes_config.take_over_peer_id: act as this (lost) peer; -1: no
    double retry_timeout_s;           // spes_config.retry_timeout_s: retry an unreachable server this long (60)
    float outer_lr;                   // spes_config.outer_lr: the server's outer optimizer this peer expects (1)
    float outer_momentum;             // spes_config.outer_momentum: its Nesterov momentum (0); stated in Hello
    int64_t sync_warmup_steps;        // spes_config.sync_warmup_steps: sync every sync_warmup_every steps up to
                                      // this step, then widen to sync_steps (0: off; spes_sync_due)
    int64_t sync_warmup_every;        // spes_config.sync_warmup_every: the warm-up's interval (1)
    bool reset_moments_at_sync;       // spes_config.reset_moments_at_sync: fresh AdamW moments after every
                                      // round (false: a peer keeps its own, the reference)
    double lr_scale;                  // spes_config.lr_scale: a peer's learning rate is this times the
                                      // schedule's (1; only with using_spes or using_dilico)
    double peer_beta1;                // spes_config.beta1: a peer's AdamW beta1 (-1, null: optimizer.betas')

    // Where the config came from (for messages and the checkpoint copy).
    char *source_path;
    // The loaded YAML (after overrides and interpolation), kept so that checks after the load
    // name a key's file:line (config_key_fail); NULL for a config built in code.
    struct YNode *tree;
    // Keys found in the file that no table entry knows ("a.b (line 3), ..."; NULL when
    // none). config_load already warned once; kept so tests and tools can inspect them.
    char *unknown_keys;
} TrainConfig;

// OLMo defaults. cfg must be freshly declared (nothing owned yet).
void config_defaults(TrainConfig *cfg);

// Loads a YAML file, applies command-line overrides, interpolates ${...}, fills *cfg and
// validates it. `overrides` are command-line words: "--a.b=value" or "--a.b" "value"
// (the value is parsed as YAML: numbers, true/false, null, [a, b] lists). Unknown keys in
// the file: one warning; unknown override keys: an error. On error *cfg is freed.
int config_load(const char *path, int n_overrides, char **overrides, TrainConfig *cfg);
// The same from YAML text in memory (`name` appears in messages as the file name).
int config_load_string(const char *yaml_text, const char *name, int n_overrides, char **overrides,
                       TrainConfig *cfg);

// Cross-field checks (called by config_load; public for configs built in code).
int config_validate(TrainConfig *cfg);

// For checks after the load, of values known only then (the run's max_steps): raises the
// message about `key` as the loader's own errors read, at the line that set it
// ("run.yaml:57: key: msg", "command line --key: msg", or "key: msg" for a default). SPES_ERR.
int config_key_fail(const TrainConfig *cfg, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// schedule_validate of cfg's schedule and learning rate over the run of max_steps steps (in the
// schedule's units: config_schedule_run), its errors so located.
int config_schedule_validate(const TrainConfig *cfg, int64_t max_steps);
// The run the schedule spans (schedule_position): max_steps (config_max_steps), the tokens a
// step (global_train_batch_size x max_sequence_length) and max_duration's fixed token count.
ScheduleRun config_schedule_run(const TrainConfig *cfg, int64_t max_steps);

// Optimizer steps max_duration means: steps as given, tokens / (global batch * seq len)
// rounded up, epochs * (dataset_instances / global batch) (dataset_instances only needed for
// epochs; pass -1 when unknown: then an epoch duration is an error). Errors name max_duration
// at the line that set it (config_key_fail).
int config_max_steps(const TrainConfig *cfg, int64_t dataset_instances, int64_t *steps);
// The step a run of max_steps ends at: stop_at when it comes first.
int64_t config_last_step(const TrainConfig *cfg, int64_t max_steps);
// Micro-batches per optimizer step (global / micro; validated to divide exactly).
int config_grad_accum_steps(const TrainConfig *cfg);

// 64-bit hash of the semantic configuration: model, losses, optimizer, schedule, data,
// batch, SPES topology. Run-control keys (intervals, folders, run_name, threads, stop_at,
// load/resume) are excluded, so a resume with a different save_folder still matches.
uint64_t config_hash(const TrainConfig *cfg);
// What changed in those keys since the config saved at `saved_path` (a checkpoint's
// config.yaml): "key: old -> new; ..." (caller frees). NULL when nothing differs or the saved
// copy cannot be read.
char *config_changes_since(const char *saved_path, const TrainConfig *now);
// The "key=value" lines every rank of one job must share: every key but the per-rank ones
// (threads, device), compared by dist_check_config (caller frees; NULL: out of memory).
char *config_job_lines(const TrainConfig *cfg);
// What differs between two sets of "key=value" lines, as config_changes_since says it:
// "key: was -> now; ..." (caller frees), NULL when they hold the same keys and values.
char *config_diff_lines(const char *was, const char *now);

// Resolved configuration as YAML (every supported key, after overrides and interpolation).
void config_write_yaml(const TrainConfig *cfg, FILE *out);
// The key table as a Markdown table (docs/config-keys.md).
void config_write_keys_markdown(FILE *out);

void config_free(TrainConfig *cfg);
