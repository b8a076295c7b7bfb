// The training loop. See trainer.h for the contract.
#include "train/trainer.h"

#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/progress.h"
#include "base/threads.h"
#include "base/timer.h"
#include "data/loader.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/sharded_grads.h"
#include "parallel/sharded_params.h"
#include "eval/mc_score.h"
#include "model/hf_import.h"
#include "sync/expert_owners.h"
#include "train/checkpoint.h"
#include "train/clip_adaptive.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"
#include "train/overlap_step.h"
#include "train/plan_check.h"
#include "train/save_failure.h"
#include "train/save_space.h"
#include "train/schedule.h"
#include "train/source_model.h"
#include "train/spes_peer.h"

// An lm evaluator reads token files; a downstream one (cfg->requests) scores a multiple-choice
// task read once at start, with the trainer's tokenizer.
typedef struct {
    const EvaluatorConfig *cfg;
    TokenDataset *ds;
    DataLoader *dl;
    McTask task;
    McScore *scores;            // [task.num_requests]
} Evaluator;

struct Trainer {
    const TrainConfig *cfg;
    TrainerOptions opt;
    Backend *be;                // where the model trains (device / precision keys)
    Model model;
    bool model_created;
    uint8_t *generation_config;   // the source model's (rank 0; state.generation_config points here)
    AdamW adamw;
    TokenDataset *train_ds;
    DataLoader *train_dl;
    Evaluator *evals;
    int n_evals;
    Tokenizer *tokenizer;       // tokenizer.identifier, for downstream evaluators (NULL: none)
    LossWeights weights;
    TrainState state;
    int64_t max_steps;
    int64_t last_saved_step, last_eval_step;   // last_saved_step: the newest checkpoint (-1: none)
    int64_t failed_save_step;   // the newest save that failed since the last good one (0: none)
    bool batch_unread;          // the step failed reading its batch, before anything changed
    size_t checkpoint_bytes;    // rank 0: one checkpoint on disk (for a failed save's message)
    int64_t *step_counts;       // [L*E] tokens per expert, summed over the step's micro-batches
    LossScaler scaler;          // amp_fp16: dynamic loss scaling (disabled otherwise)
    int64_t force_overflow_step;   // SPES_FORCE_GRAD_OVERFLOW_STEP (tests): treat that step as an overflow
    MetricsLog log;
    double peak_flops;
    double peak_measured_at;    // now_seconds() of the last sgemm measurement (0: configured)
    double timed_seconds;       // wall time of the steps after the first (for the ETA)
    int64_t timed_steps;
    int64_t steps_this_run;
    // ranks inside the node (parallel/): dist false with one rank, and nothing below is used
    Comm *comm;
    bool dist, rank0;
    int save_lock_fd;           // rank 0: the lock on save_folder/train.lock (-1: none)
    DataParallel dp;
    ShardedGrads zgrads;        // fsdp SHARD_GRAD_OP and FULL_SHARD (ZeRO-2/3): the gradients, sharded
    bool zgrads_on;
    ShardedParams z3;           // fsdp FULL_SHARD (dp.stage DP_ZERO3): the parameters, sharded during the steps
    bool z3_on;
    double *micro_losses;       // [6 * micro-batches] per-micro-batch losses, summed over ranks
    int n_micro_losses;
    size_t planned_peak;        // the plan's peak of backend memory on this rank (train/plan_check.h)
    // optimizer.overlap_next_forward (one rank): each step's AdamW queued under the next forward
    OverlapStep overlap;
    bool overlap_on;
    bool update_queued;         // the last step's update may still run (parameters_at_rest waits)
    bool grads_zeroed_by_update;   // the queued update zeroes the gradients behind it
    // max_grad_norm_ratio: OLMo's adaptive clipping, per tensor (train/clip_adaptive.h)
    ClipAdaptive clip;
    bool clip_on;
    const char *clip_dump_dir;  // SPES_CLIP_DUMP_GRADS (tests, one rank): each step's gradient before clipping
};

int trainer_own_experts(const TrainConfig *cfg, int experts, int *first, int *last) {
    // Plain training and the fedavg baseline (using_dilico) train every expert.
    if (!cfg->using_spes || cfg->using_dilico) {
        *first = 0, *last = experts - 1;
        return SPES_OK;
    }
    int per = cfg->num_train_experts_per_node;
    *first = expert_first_owned(cfg->peer_id, per, experts), *last = *first + per - 1;
    if (per <= 0 || *first < 0 || *first + per > experts)
        return spes_fail("spes_config: peer %d with %d experts per node owns experts [%d, %d), outside the model's "
                         "%d experts; check peer_id and num_train_experts_per_node",
                         cfg->peer_id, per, *first, *first + per, experts);
    return SPES_OK;
}

int trainer_setup_trainable(Model *m, const TrainConfig *cfg) {
    int first, last;
    SPES_TRY(trainer_own_experts(cfg, m->cfg.num_experts, &first, &last));
    return model_set_trainable_experts(m, first, last);
}

// sgemm throughput on this machine with the current thread count: the ceiling MFU is
// measured against when no peak is configured (CPU "peak" is what BLAS reaches).
static double measure_peak_flops(void) {
    const int n = 512, reps = 8;
    float *a = spes_alloc_aligned((size_t)n * n * sizeof(float) * 3);
    if (!a) return 0;
    float *b = a + (size_t)n * n, *c = b + (size_t)n * n;
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 13) * 0.01f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);   // warm-up
    double best = INFINITY;   // the fastest run: the machine may be shared
    for (int r = 0; r < reps; r++) {
        double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        best = fmin(best, now_seconds() - t0);
    }
    spes_free_aligned(a);
    return best > 0 ? 2.0 * n * n * (double)n / best : 0;
}

// On a device backend: one square GEMM in the compute type through the backend, the
// ceiling MFU is then relative to (what cuBLAS reaches on this GPU).
static double measure_backend_peak_flops(Backend *be) {
    const int n = 4096;
    const size_t bytes = (size_t)n * n * num_type_size(be->compute);
    void *a = NULL, *c = NULL;
    double best = INFINITY;
    if (backend_alloc(be, bytes, &a) == SPES_OK && backend_alloc(be, bytes, &c) == SPES_OK) {
        const Buf A = buf_of(a, be->compute), C = buf_of(c, be->compute);
        for (int r = 0; r < 4; r++) {   // the first is a warm-up
            double t0 = now_seconds();
            be->ops->gemm(be, false, true, n, n, n, 1.0f, A, n, A, n, 0.0f, C, n);
            if (backend_sync(be) != SPES_OK) break;
            if (r > 0) best = fmin(best, now_seconds() - t0);
        }
    }
    backend_free(be, a);
    backend_free(be, c);
    return isfinite(best) && best > 0 ? 2.0 * n * n * (double)n / best : 0;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss / 1024.0 : 0;   // ru_maxrss is in KiB
}

// A peer (using_spes or using_dilico) trains at spes_config.lr_scale times the schedule's rate and
// with spes_config.beta1 as AdamW's beta1; a centralised run of the same config keeps optimizer.*,
// so one config file drives both sides of the comparison (docs/quality.md).
static bool is_peer(const TrainConfig *cfg) { return cfg->using_spes || cfg->using_dilico; }

static AdamWConfig peer_adamw_config(const TrainConfig *cfg) {
    AdamWConfig c = cfg->adamw;
    if (is_peer(cfg) && cfg->peer_beta1 >= 0) c.beta1 = cfg->peer_beta1;
    return c;
}

// Resume from the newest complete checkpoint in save_folder. *resumed false when none.
static int resume_latest(Trainer *t, bool *resumed) {
    const TrainConfig *cfg = t->cfg;
    char *dir;
    int64_t step;
    *resumed = false;
    SPES_TRY(checkpoint_find_latest(cfg->save_folder, &dir, &step));
    if (!dir) {
        log_info("no checkpoint in %s: starting from scratch", cfg->save_folder);
        return SPES_OK;
    }
    TrainState saved;
    int rc = checkpoint_read_state(dir, &saved);
    uint64_t mine = config_hash(cfg);
    if (rc == SPES_OK && saved.config_hash != mine) {
        // The checkpoint's config.yaml tells which settings changed (older spes versions hashed
        // fewer keys: a key they did not know shows as "(unset) -> value").
        char *saved_yaml = path_join(dir, "config.yaml");
        char *changes = saved_yaml ? config_changes_since(saved_yaml, cfg) : NULL;
        free(saved_yaml);
        const char *what = changes ? changes : "model, optimizer, schedule, data or batch settings";
        if (t->opt.ignore_config_hash)
            log_warn("%s was written with a different configuration (hash %016" PRIx64 ", now %016" PRIx64
                     "; changed: %s); resuming anyway as asked",
                     dir, saved.config_hash, mine, what);
        else
            rc = spes_fail("%s was written with a different configuration (hash %016" PRIx64 ", now %016" PRIx64
                           "; changed: %s). Resume with the same settings, or pass --force-resume to continue anyway",
                           dir, saved.config_hash, mine, what);
        free(changes);
    }
    // Sharded optimizer state (ZeRO-1/2): every rank reads the full state, written at any world
    // size, and keeps its shard.
    bool sharded = t->dist && t->dp.stage != DP_DDP;
    AdamW full = {0};
    if (rc == SPES_OK && sharded) rc = adamw_create(&full, &t->model.table, &t->adamw.cfg);
    if (rc == SPES_OK) rc = checkpoint_load(dir, &t->model, sharded ? &full : &t->adamw, &t->state);
    if (rc == SPES_OK) rc = model_params_to_device(&t->model);
    if (rc == SPES_OK) rc = sharded ? dp_scatter_state(&t->dp, &full, &t->adamw) : adamw_state_to_device(&t->adamw);
    if (sharded) adamw_free(&full);
    if (rc == SPES_OK) rc = loader_set_position(t->train_dl, t->state.data);
    if (rc == SPES_OK) {
        t->state.config_hash = mine;
        log_info("resumed from %s: step %" PRId64 ", %" PRId64 " tokens seen, data epoch %" PRId64 " index %" PRId64,
                 dir, t->state.step, t->state.tokens_seen, t->state.data.epoch, t->state.data.index);
        *resumed = true;
    }
    free(dir);
    return rc;
}

// load_path: weights only (an HF OLMoE/Qwen3-MoE directory or one of our step directories);
// the optimizer starts fresh and the step count at 0.
static int load_initial_weights(Model *m, const char *dir) {
    HfTensorSet set;
    if (hf_tensors_open(dir, &set) != SPES_OK) return spes_fail_context("load_path %s", dir);
    int rc = hf_tensors_load_model(&set, m, false);
    hf_tensors_close(&set);
    if (rc != SPES_OK) return spes_fail_context("load_path %s", dir);
    log_info("initial weights from %s", dir);
    return SPES_OK;
}

// The step's micro-batches are split over the ranks in contiguous shares (step()); when they
// do not divide, some ranks compute one more than others (or none at all) and every step
// waits for the busiest. OLMo refuses such a batch; it trains the same here, only slower.
static const char *computes(int ranks) { return ranks == 1 ? "computes" : "compute"; }

static void warn_uneven_shares(const TrainConfig *cfg, int ranks) {
    int n_micro = config_grad_accum_steps(cfg);
    if (ranks <= 1 || n_micro % ranks == 0) return;
    int busier = n_micro % ranks, share = n_micro / ranks;
    char others[64];
    if (share) snprintf(others, sizeof others, "%d %s %d", ranks - busier, computes(ranks - busier), share);
    else snprintf(others, sizeof others, "%d %s none (idle)", ranks - busier, computes(ranks - busier));
    log_warn("dist: the step's %d micro-batches (global_train_batch_size %d / device_train_microbatch_size %d) do "
             "not divide over %d ranks: %d %s %d, %s, and each step waits for the busiest; a "
             "global_train_batch_size that is a multiple of %d (ranks x micro-batch) uses every rank fully",
             n_micro, cfg->global_train_batch_size, cfg->device_train_microbatch_size, ranks, busier,
             computes(busier), share + 1, others, ranks * cfg->device_train_microbatch_size);
}

// A fresh run must not mix its checkpoints with an older run's (OLMo refuses too).
static int claim_save_folder(const TrainConfig *cfg, bool rank0) {
    if (!rank0) return SPES_OK;   // rank 0 decides and removes; the others wait at a barrier
    char *dir;
    int64_t step;
    SPES_TRY(checkpoint_find_latest(cfg->save_folder, &dir, &step));
    if (!dir) return SPES_OK;
    int rc = SPES_OK;
    if (!cfg->save_overwrite)
        rc = spes_fail("%s already holds checkpoints (newest %s): pass --resume to continue that run, "
                       "--save_overwrite=true to replace it, or choose another save_folder",
                       cfg->save_folder, dir);
    else {
        log_warn("save_overwrite: removing the checkpoints in %s", cfg->save_folder);
        rc = checkpoint_remove_all(cfg->save_folder);
    }
    free(dir);
    return rc;
}

// Warns at start when the save_folder's disk cannot take the run's checkpoints (save_space.h).
static int check_save_space(Trainer *t) {
    SPES_TRY(save_space_checkpoint_bytes(t->cfg, &t->model.table, &t->checkpoint_bytes));
    save_space_check(t->cfg, t->checkpoint_bytes, t->state.step, config_last_step(t->cfg, t->max_steps));
    return SPES_OK;
}

// tokenizer.identifier for the downstream evaluator `label`, loaded once; its ids must fit the
// model's embedding (else the first evaluation would stop the run).
static int open_tokenizer(Trainer *t, const char *label) {
    if (t->tokenizer) return SPES_OK;
    const char *path = t->cfg->tokenizer_identifier;
#define NEED_TOKENIZER                                                                                               \
    "evaluator '%s' (downstream) tokenises its requests with tokenizer.identifier, which must name a tokenizer.json, " \
    "a folder holding one, or bytes"
    if (!path) return spes_fail(NEED_TOKENIZER "; it is not set", label);
    if (tokenizer_load(path, &t->tokenizer) != SPES_OK) return spes_fail_context(NEED_TOKENIZER, label);
#undef NEED_TOKENIZER
    uint32_t vocab = tokenizer_vocab_size(t->tokenizer);
    if ((int64_t)vocab > t->cfg->model.embedding_size)
        return config_key_fail(t->cfg, "tokenizer.identifier", "evaluator '%s' (downstream): %s has %u ids, more than the model's "
                         "embedding (model.embedding_size %d)",
                         label, path, vocab, t->cfg->model.embedding_size);
    return SPES_OK;
}

static int open_evaluators(Trainer *t) {
    if (t->cfg->n_evaluators == 0) return SPES_OK;
    t->evals = spes_calloc((size_t)t->cfg->n_evaluators, sizeof *t->evals);
    if (!t->evals) return SPES_ERR;
    for (int i = 0; i < t->cfg->n_evaluators; i++) {
        Evaluator *e = &t->evals[i];
        e->cfg = &t->cfg->evaluators[i];
        t->n_evals++;
        if (!e->cfg->requests) {
            if (loader_open_eval(t->cfg, e->cfg, &e->ds, &e->dl) != SPES_OK) return SPES_ERR;   // names the evaluator
            continue;
        }
        // downstream: the tokenizer (once) and the task, checked now rather than at the first evaluation
        SPES_TRY(open_tokenizer(t, e->cfg->label));
        if (mc_task_load(e->cfg->requests, e->cfg->limit, &e->task) != SPES_OK)
            return spes_fail_context("evaluator '%s'", e->cfg->label);
        if (!(e->scores = spes_calloc((size_t)e->task.num_requests + 1, sizeof(McScore)))) return SPES_ERR;
    }
    return SPES_OK;
}

// What this rank holds on its backend, by role (the sizes of the buffers allocated), for the
// per-strategy memory table of docs/distributed.md (bench/dist_memory.sh reads this line).
static void log_memory(const Trainer *t) {
    const double mb = 1.0 / 1048576.0;
    size_t total = t->model.table.total_numel, trainable = t->model.table.trainable_numel;
    double params = (double)total * (4 + (t->model.cparams ? num_type_size(t->be->compute) : 0)) * mb;
    double grads = (double)trainable * 4 * mb, state = (double)t->adamw.numel * 8 * mb, scratch = 0;
    if (t->dist) scratch = (double)t->dp.scratch_n * 4 * mb;
    if (t->zgrads_on) grads = (double)sharded_grads_bytes(&t->zgrads) * mb;
    if (t->z3_on) params = (double)sharded_params_bytes(&t->z3) * mb;   // while training (between steps: full)
    log_info("memory per rank (%s): parameters %.3f MB, gradients %.3f MB, optimizer state %.3f MB%s, collective "
             "scratch %.3f MB",
             t->be->name, params, grads, state, t->adamw.offload ? " (host memory, offloaded)" : "", scratch);
    if (t->zgrads_on)
        log_info("%s per rank: gradient shard %.3f MB, part gradient buffer%s %.3f MB", dp_stage_name(t->dp.stage),
                 t->zgrads.shard_n * 4 * mb, t->zgrads.n_work == 2 ? "s (2, overlap)" : "",
                 (double)t->zgrads.n_work * t->zgrads.work_n * 4 * mb);
    if (t->z3_on)
        log_info("zero3 per rank while training: parameter shard %.3f MB, frozen tensors %.3f MB, part buffers%s %.3f MB "
                 "(the full parameters only around checkpoints, evaluations and SPES syncs)",
                 t->z3.shard_n * 4 * mb, t->z3.gather.frozen_numel * 4 * mb, t->z3.n_work == 2 ? " (2, prefetch)" : "",
                 (double)(sharded_params_bytes(&t->z3) - (t->z3.shard_n + t->z3.gather.frozen_numel) * 4) * mb);
    if (t->adamw.offload && t->be->host_memory)
        log_info("optimizer.cpu_offload on the cpu backend: the moments are host memory already; the update runs "
                 "through the offload path's host copies (the same bits, a little slower)");
}

int trainer_create(const TrainConfig *cfg, const TrainerOptions *opt, Trainer **out) {
    *out = NULL;
    Trainer *t = spes_calloc(1, sizeof *t);
    if (!t) return SPES_ERR;
    t->cfg = cfg;
    t->opt = *opt;
    t->last_eval_step = -1;
    threads_set(cfg->threads);
    t->comm = opt->comm;
    t->dist = comm_is_multi(opt->comm);
    t->rank0 = comm_rank(opt->comm) == 0;
    t->save_lock_fd = -1;
    // One run a save_folder, held from before anything is read from it: two runs in one (two
    // SPES peers given the same folder, a --resume started while the first still trains) would
    // resume from each other's steps, replace and prune them.
    if (t->rank0) {
        char what[4200];
        snprintf(what, sizeof what, "save_folder %s", cfg->save_folder);
        if (dir_lock(cfg->save_folder, "train.lock", what, "spes train",
                     "give each run (each SPES peer) its own save_folder", &t->save_lock_fd) != SPES_OK) {
            free(t);
            return SPES_ERR;
        }
    }
    t->weights = (LossWeights){.lm_z_mult = cfg->softmax_auxiliary_loss ? cfg->auxiliary_loss_multiplier : 0.0f,
                               .lb_weight = cfg->moe_loss_weight,
                               .router_z_weight = cfg->moe_zloss_weight,
                               .lb_count_factor = opt->lb_count_factor};
    // The device first: a missing GPU is said before the data are opened and checked (minutes
    // on a large corpus). Rank r of a node uses GPU LOCAL_RANK (an explicit cuda:N is taken as given).
    Precision precision;
    if (precision_from_name(cfg->precision, &precision) != SPES_OK) goto fail;
    if (backend_open_for_rank(cfg->device, comm_local_rank(t->comm), precision, &t->be) != SPES_OK) goto fail;
    // Before anything big is allocated: a run whose plan cannot fit stops here, with the plan.
    if (plan_check_device(cfg, t->be, comm_size(t->comm), t->rank0, &t->planned_peak) != SPES_OK) goto fail;
    if (loader_open_train(cfg, &t->train_ds, &t->train_dl) != SPES_OK) goto fail;
    if (config_max_steps(cfg, token_dataset_len(t->train_ds), &t->max_steps) != SPES_OK) goto fail;
    if (config_schedule_validate(cfg, t->max_steps) != SPES_OK) goto fail;
    if (open_evaluators(t) != SPES_OK) goto fail;
    // Frozen first: trainer_setup_trainable allocates the gradients of what this run trains only.
    if (model_create_frozen_on(&t->model, &cfg->model, t->be) != SPES_OK) goto fail;
    t->model_created = true;
    if (trainer_setup_trainable(&t->model, cfg) != SPES_OK) goto fail;
    if (model_set_activation_checkpointing(&t->model, cfg->activation_checkpointing) != SPES_OK) goto fail;
    // The optimizer's settings from here on: t->adamw.cfg (resume and save build theirs from it).
    const AdamWConfig adamw_cfg = peer_adamw_config(cfg);
    if (t->dist) {
        DpStage stage;
        if (dp_stage_from_config(cfg, comm_size(t->comm), &stage) != SPES_OK) goto fail;
        if (dp_create(&t->dp, t->comm, t->be, stage, &t->model.table, cfg->model.n_layers, cfg->ddp_bucket_cap_mb) !=
            SPES_OK)
            goto fail;
        if (dp_shards_grads(stage)) {
            if (sharded_grads_create(&t->zgrads, &t->model, &t->dp, cfg->ddp_overlap_grad_reduce) != SPES_OK) goto fail;
            t->zgrads_on = true;
        }
        if (stage == DP_ZERO3) {
            if (sharded_params_create(&t->z3, &t->model, &t->dp, &t->zgrads, cfg->fsdp_prefetch) != SPES_OK) goto fail;
            t->z3_on = true;
        }
        size_t lo, hi;
        dp_state_range(&t->dp, &lo, &hi);
        if (adamw_create_shard(&t->adamw, &t->model.table, &adamw_cfg, t->be, lo, hi) != SPES_OK) goto fail;
        if (dp_shards_grads(stage))
            log_info("dist: %d ranks, strategy %s; this rank holds %s and optimizer state for [%zu, %zu) of %zu "
                     "trainable values; each part's gradients are reduce-scattered right after its backward (no "
                     "buckets), %s",
                     comm_size(t->comm), dp_stage_name(stage), stage == DP_ZERO3 ? "parameters, gradients" : "gradients",
                     lo, hi, t->model.table.trainable_numel,
                     cfg->ddp_overlap_grad_reduce ? "overlapped with the next part's backward"
                                                  : "waited for before the backward goes on");
        else
            log_info("dist: %d ranks, strategy %s; this rank holds optimizer state for [%zu, %zu) of %zu trainable "
                     "values; %zu gradient buckets, %s",
                     comm_size(t->comm), dp_stage_name(stage), lo, hi, t->model.table.trainable_numel,
                     t->dp.n_buckets,
                     cfg->ddp_overlap_grad_reduce ? "overlapped with the backward" : "reduced after the backward");
    } else if (adamw_create_on(&t->adamw, &t->model.table, &adamw_cfg, t->be) != SPES_OK) {
        goto fail;
    }
    size_t n_counts = (size_t)cfg->model.n_layers * (size_t)cfg->model.num_experts;
    if (!(t->step_counts = spes_calloc(n_counts, sizeof *t->step_counts))) goto fail;

    t->state = (TrainState){.data_seed = (uint64_t)cfg->data.seed, .config_hash = config_hash(cfg)};
    bool resumed = false;
    if ((opt->resume || cfg->try_load_latest_save) && resume_latest(t, &resumed) != SPES_OK) goto fail;
    if (!resumed) {
        if (claim_save_folder(cfg, t->rank0) != SPES_OK) goto fail;
        if (comm_barrier(t->comm) != SPES_OK) goto fail;
        model_init_weights(&t->model, (uint64_t)cfg->seed);
        if (cfg->load_path && load_initial_weights(&t->model, cfg->load_path) != SPES_OK) goto fail;
        if (model_params_to_device(&t->model) != SPES_OK) goto fail;
    }
    t->last_saved_step = resumed ? t->state.step : -1;
    // What checkpoints carry on of the source model: its token ids, its generation_config.json.
    source_model_token_ids(cfg, &t->model.cfg, t->rank0);
    if (t->rank0) source_model_generation_config(cfg, &t->generation_config, &t->state.generation_config_len, true);
    t->state.generation_config = t->generation_config;
    if (mkdir_p(cfg->save_folder) != SPES_OK) goto fail;
    if (t->rank0 && metrics_open(&t->log, cfg->save_folder, t->state.step) != SPES_OK) goto fail;
    if (t->rank0 && check_save_space(t) != SPES_OK) goto fail;

    if (opt->peak_flops > 0)
        t->peak_flops = opt->peak_flops;
    else if (!t->be->host_memory)
        t->peak_flops = measure_backend_peak_flops(t->be);
    else {
        t->peak_flops = measure_peak_flops();
        t->peak_measured_at = now_seconds();
    }
    loss_scale_init(&t->scaler, precision == PRECISION_AMP_FP16);
    if (t->scaler.enabled && t->state.loss_scale > 0) {   // resumed: the scale carries on
        t->scaler.scale = t->state.loss_scale;
        t->scaler.good_steps = t->state.loss_scale_good_steps;
    }
    if (cfg->optimizer_overlap) {
        if (t->dist)
            log_warn("optimizer.overlap_next_forward: ignored with %d ranks (data parallelism and sharding hook "
                     "the same events of the forward)", comm_size(t->comm));
        else if (t->adamw.offload)
            log_warn("optimizer.overlap_next_forward: ignored with optimizer.cpu_offload (the update runs on the host)");
        else if (overlap_step_init(&t->overlap, &t->model, &t->adamw) != SPES_OK)
            log_warn("optimizer.overlap_next_forward: ignored: %s", spes_last_error());
        else
            t->overlap_on = true;
    }
    const char *force = getenv("SPES_FORCE_GRAD_OVERFLOW_STEP");
    t->force_overflow_step = force && *force ? strtoll(force, NULL, 10) : -1;
    if (cfg->max_grad_norm_ratio > 0) {
        if (clip_adaptive_create(&t->clip, t->be, &t->model.table) != SPES_OK) goto fail;
        t->clip_on = true;
        const char *dump = getenv("SPES_CLIP_DUMP_GRADS");
        t->clip_dump_dir = dump && *dump && !t->dist ? dump : NULL;
        log_info("optimizer: adaptive clipping, each tensor to %g x its running gradient-norm average "
                 "(max_grad_norm_ratio)", cfg->max_grad_norm_ratio);
    }
    int n_trainable = 0;
    for (int i = 0; i < t->model.table.count; i++) n_trainable += t->model.table.entries[i].trainable;
    log_memory(t);
    log_info("device: %s", t->be->description);
    log_info("model: %zu parameters, %zu trainable in %d of %d tensors; %" PRId64 " training instances of %d "
             "tokens; %" PRId64 " steps of %d instances (%d micro-batches); MFU relative to %.1f GFLOP/s%s%s",
             t->model.table.total_numel, t->model.table.trainable_numel, n_trainable, t->model.table.count,
             token_dataset_len(t->train_ds), cfg->model.max_seq_len, t->max_steps, cfg->global_train_batch_size,
             config_grad_accum_steps(cfg), t->peak_flops / 1e9,
             opt->peak_flops > 0 ? "" : t->be->host_memory ? " (measured sgemm)" : " (measured GEMM)",
             t->scaler.enabled ? "; amp_fp16 dynamic loss scaling" : "");
    if (t->rank0) warn_uneven_shares(cfg, comm_size(t->comm));
    if (t->overlap_on) log_info("optimizer: each step's AdamW runs under the next step's forward (optimizer.overlap_next_forward)");
    const InstanceFilterConfig *f = &cfg->data.instance_filter;
    if (f->enabled)
        log_info("data: instance filter on: the loss of an instance with a pattern of %d..%d tokens repeated %d times "
                 "or more in a row is masked (OLMo's instance_filter)",
                 f->min_period, f->max_period, f->max_count);
    *out = t;
    return SPES_OK;
fail:
    trainer_free(t);
    return SPES_ERR;
}

void trainer_free(Trainer *t) {
    if (!t) return;
    if (t->update_queued) (void)backend_sync(t->be);   // before the buffers it writes go
    metrics_close(&t->log);
    for (int i = 0; i < t->n_evals; i++) {
        loader_free(t->evals[i].dl);
        token_dataset_close(t->evals[i].ds);
        mc_task_free(&t->evals[i].task);   // zeroed for an lm evaluator
        free(t->evals[i].scores);
    }
    free(t->evals);
    free(t->generation_config);
    tokenizer_free(t->tokenizer);
    free(t->step_counts);
    free(t->micro_losses);
    adamw_free(&t->adamw);
    if (t->clip_on) clip_adaptive_free(&t->clip);
    if (t->z3_on) sharded_params_free(&t->z3);
    if (t->zgrads_on) sharded_grads_free(&t->zgrads);
    if (t->dist) dp_free(&t->dp);
    if (t->model_created) model_free(&t->model);
    backend_close(t->be);
    loader_free(t->train_dl);
    token_dataset_close(t->train_ds);
    if (t->save_lock_fd >= 0) close(t->save_lock_fd);   // releases the save_folder
    free(t);
}

Model *trainer_model(Trainer *t) { return &t->model; }
int64_t trainer_step_count(const Trainer *t) { return t->state.step; }
int64_t trainer_max_steps(const Trainer *t) { return t->max_steps; }
TrainState *trainer_state(Trainer *t) { return &t->state; }

// ---- several ranks ----
static int prepare_micro_losses(Trainer *t, int n_micro) {
    if (t->n_micro_losses < n_micro) {
        free(t->micro_losses);
        t->n_micro_losses = 0;
        if (!(t->micro_losses = spes_calloc((size_t)n_micro * 6, sizeof(double)))) return SPES_ERR;
        t->n_micro_losses = n_micro;
    }
    memset(t->micro_losses, 0, (size_t)n_micro * 6 * sizeof(double));
    return SPES_OK;
}

// The step's losses are the mean of the micro-batch losses (OLMo's train_batch): mean += lv / n_micro.
static void add_micro_batch(LossValues *mean, const LossValues *lv, int n_micro) {
    mean->ce += lv->ce / n_micro;
    mean->lm_z += lv->lm_z / n_micro;
    mean->lb += lv->lb / n_micro;
    mean->router_z += lv->router_z / n_micro;
    mean->total += lv->total / n_micro;
    mean->num_targets += lv->num_targets;
}

// Every micro-batch's losses come from exactly one rank (the others add zeros, exactly), then
// the means are taken in micro-batch order as one rank takes them: the same bits.
static int combine_ranks(Trainer *t, int n_micro, size_t n_counts, LossValues *mean) {
    SPES_TRY(comm_allreduce_sum(t->comm, NULL, t->micro_losses, (size_t)n_micro * 6, COMM_F64));
    SPES_TRY(comm_allreduce_sum(t->comm, NULL, t->step_counts, n_counts, COMM_I64));
    for (int i = 0; i < n_micro; i++) {
        const double *ml = t->micro_losses + (size_t)6 * i;
        const LossValues lv = {.ce = ml[0], .lm_z = ml[1], .lb = ml[2], .router_z = ml[3], .total = ml[4],
                               .num_targets = (int64_t)ml[5]};
        add_micro_batch(mean, &lv, n_micro);
    }
    return SPES_OK;
}

// Adaptive clipping: the reduced gradient's per-tensor sums of squares into t->clip.sums (a ZeRO-2/3
// rank's pieces summed over the ranks in one all-reduce), and the global norm from them.
static int step_tensor_norms(Trainer *t, double *norm) {
    const ParamTable *table = &t->model.table;
    if (!t->zgrads_on) {
        SPES_TRY(clip_adaptive_sums(&t->clip, table, t->model.grads, 0, table->trainable_numel));
    } else {
        const int r = comm_rank(t->comm);
        int rc = clip_adaptive_sums(&t->clip, table, t->zgrads.shard, t->dp.lo[r], t->dp.lo[r + 1]);
        // A failed sum still enters the all-reduce, as NaNs: every rank gets them (dp_shard_grad_norm's way).
        if (rc != SPES_OK)
            for (int i = 0; i < t->clip.count; i++) t->clip.sums[i] = NAN;
        SPES_TRY(comm_allreduce_sum(t->comm, NULL, t->clip.sums, (size_t)t->clip.count, COMM_F64));
        SPES_TRY(rc);
    }
    *norm = sqrt(clip_adaptive_total(&t->clip));
    return SPES_OK;
}

// The reduced gradient: sharded over the ranks (ZeRO-2/3), else whole on every rank.
static int step_grad_norm(Trainer *t, double *norm) {
    if (t->clip_on) return step_tensor_norms(t, norm);
    if (t->zgrads_on) return dp_shard_grad_norm(&t->dp, t->zgrads.shard, norm);
    double sumsq;
    SPES_TRY(grad_sum_of_squares(t->be, t->model.grads, t->model.table.trainable_numel, &sumsq));
    *norm = sqrt(sumsq);
    return SPES_OK;
}

// The hooks of a pass: ZeRO-3's (gather parts, reduce their gradients), ZeRO-2's (reduce),
// else the buckets' on the last pass when overlapped.
static const ModelHooks *pass_hooks(Trainer *t, bool last_overlapped) {
    if (t->overlap_on) return &t->overlap.hooks;   // one rank: none of the others
    if (t->z3_on) return sharded_params_hooks(&t->z3);
    if (t->zgrads_on) return sharded_grads_hooks(&t->zgrads);
    return last_overlapped ? &t->dp.hooks : NULL;
}

// Adaptive clipping of step `step` from its per-tensor norms (step_tensor_norms): the factors
// for AdamW and the running averages; with SPES_CLIP_DUMP_GRADS the gradient goes to a file first.
static int clip_step(Trainer *t, double ratio, double unscale, int64_t step) {
    if (t->clip_dump_dir)
        SPES_TRY(clip_adaptive_dump_grads(t->clip_dump_dir, &t->model.table, t->be, t->model.grads,
                                          t->model.table.trainable_numel, step));
    clip_adaptive_apply(&t->clip, &t->adamw, &t->model.table, ratio, unscale, step);
    t->adamw.tensor_scale = t->clip.scale;
    return SPES_OK;
}

// data.instance_filter's count for the step: a kept instance has exactly T - 1 targets and a
// masked one none, so the targets counted by the losses (summed over the ranks) tell it.
static int64_t masked_instances(int rows, int T, int64_t num_targets) {
    return T < 2 ? 0 : rows - num_targets / (T - 1);
}

int trainer_step(Trainer *t, StepMetrics *out) {
    const TrainConfig *cfg = t->cfg;
    Model *m = &t->model;
    // A measured peak is the fastest sgemm seen, re-measured once a minute (outside the step's
    // timing): a measurement taken while the machine was busy would inflate MFU for good.
    if (t->peak_measured_at > 0 && now_seconds() - t->peak_measured_at > 60) {
        t->peak_flops = fmax(t->peak_flops, measure_peak_flops());
        t->peak_measured_at = now_seconds();
    }
    double t0 = now_seconds();
    // ZeRO-3 shards the parameters at the first step (after resume and the SPES handshake,
    // which read and write the full model) and after anything that unsharded them.
    if (t->z3_on && !t->z3.sharded) SPES_TRY(sharded_params_shard(&t->z3));
    int rows = loader_peek_rows(t->train_dl), micro = cfg->device_train_microbatch_size;
    int n_micro = (rows + micro - 1) / micro;   // a short last batch (drop_last false) has fewer
    int64_t step = t->state.step + 1;
    size_t n_counts = (size_t)m->cfg.n_layers * (size_t)m->cfg.num_experts;
    memset(t->step_counts, 0, n_counts * sizeof *t->step_counts);
    // The last step's queued update zeroes each part's gradients behind it (and a zeroing here,
    // on the main queue, could run under that update, which still reads them).
    if (!t->grads_zeroed_by_update) model_zero_grad(m);
    t->grads_zeroed_by_update = false;

    // Gradient accumulation: grads of sum_i loss_i / n_micro (OLMo's train_batch). With
    // several ranks this rank computes micro-batches [first, last) and the gradient sum
    // over ranks is the one rank's; the losses are combined per micro-batch, in order.
    int first = 0, last = n_micro;
    if (t->dist) {
        int r = comm_rank(t->comm), size = comm_size(t->comm);
        first = (int)((int64_t)n_micro * r / size);
        last = (int)((int64_t)n_micro * (r + 1) / size);
        SPES_TRY(prepare_micro_losses(t, n_micro));
    }
    // This rank reads only its micro-batches' rows of the global batch. Nothing of the last
    // step's state has changed yet: a read that fails on any rank (a data file cut or damaged
    // under the run, a network filesystem's I/O error) fails the step on every rank, and the
    // run saves that state before it stops (trainer_run: save_then_fail).
    const Batch *batch;
    int read = loader_next_range(t->train_dl, first * micro, last * micro, &batch);
    if (t->dist) read = comm_all_ok(t->comm, read, "read their rows of the step's batch");
    if (read != SPES_OK) {
        t->batch_unread = true;
        return spes_fail_context("step %" PRId64 ": reading the batch", step);
    }
    const int T = batch->T;
    size_t n_grad = m->table.trainable_numel;
    // ZeRO-2/3 reduce each part's gradients from the hooks; DDP and ZeRO-1 in buckets.
    bool reduce = t->dist && n_grad > 0 && !t->zgrads_on;
    if (reduce) dp_reduce_begin(&t->dp, m->grads);
    // The last pass's backward starts the gradient buckets it finishes (overlap).
    bool overlap = reduce && cfg->ddp_overlap_grad_reduce;
    if (t->zgrads_on) {
        SPES_TRY(sharded_grads_zero(&t->zgrads));
        // Every rank runs as many passes as the busiest (the part gathers and gradient
        // reductions are collectives): a rank with fewer micro-batches replays the missing
        // passes first, without work.
        int passes = (n_micro + comm_size(t->comm) - 1) / comm_size(t->comm), idle = passes - (last - first);
        for (int k = 0; k < idle; k++) SPES_TRY(sharded_grads_idle_pass(&t->zgrads, pass_hooks(t, false)));
    }
    // OLMo's train_batch divides each micro-batch's cross-entropy (and LM z-loss) sum by the
    // whole batch's token count, batch_size_in_tokens = instances x seq_len (masked instances and
    // each row's last position, which has no target, included), and the MoE losses by the
    // number of micro-batches. A micro-batch's share of that divisor makes ce_scale
    // (grad_scale / share) = scale / batch tokens, and the mean over micro-batches below the
    // batch's ce sum / batch tokens: OLMo's figure, with any number of ranks.
    LossWeights weights = t->weights;
    weights.ce_tokens = (double)rows * T / n_micro;
    LossValues mean = {0};
    for (int i = first; i < last; i++) {
        int r0 = i * micro, nb = rows - r0 < micro ? rows - r0 : micro;
        LossValues lv;
        m->hooks = pass_hooks(t, overlap && i == last - 1);
        int rc = model_forward_backward(m, batch->inputs + (size_t)r0 * T, batch->targets + (size_t)r0 * T, nb, T,
                                        &weights, (float)(t->scaler.scale / n_micro), &lv, NULL);
        m->hooks = NULL;
        if (rc != SPES_OK) return spes_fail_context("step %" PRId64 ", micro-batch %d", step, i);
        if (t->dist) {
            double *ml = t->micro_losses + (size_t)6 * i;
            ml[0] = lv.ce, ml[1] = lv.lm_z, ml[2] = lv.lb, ml[3] = lv.router_z, ml[4] = lv.total;
            ml[5] = (double)lv.num_targets;
        } else {
            add_micro_batch(&mean, &lv, n_micro);
        }
        for (size_t k = 0; k < n_counts; k++) t->step_counts[k] += m->expert_counts[k];
    }
    // MFU is the node's: the whole batch's FLOPs (linear in its rows) over every rank's peak
    // (with uneven shares rank 0's own work, which it logs, would say nothing of the others').
    double flops = model_train_flops(m, rows, T);
    if (t->dist) flops /= comm_size(t->comm);
    // Every rank starts the remaining buckets and waits, before any other collective (MPI wants
    // collectives in the same order on every rank, and a rank may have had no micro-batch).
    if (reduce) {
        size_t early = t->dp.started_in_backward;
        SPES_TRY(dp_reduce_grads(&t->dp, m->grads));
        if (t->steps_this_run == 0)
            log_info("dist: step %" PRId64 ": %zu of %zu gradient buckets started during the backward", step, early,
                     t->dp.n_buckets);
    }
    if (t->zgrads_on) SPES_TRY(sharded_grads_finish(&t->zgrads));   // the last part's reduction
    if (t->z3_on && t->steps_this_run == 0)
        log_info("dist: step %" PRId64 ": %ld part gathers on this rank, %ld of them prefetched", step, t->z3.gathers,
                 t->z3.prefetched);
    if (t->dist) SPES_TRY(combine_ranks(t, n_micro, n_counts, &mean));
    if (!isfinite(mean.total))
        return spes_fail("step %" PRId64 ": the loss is %g (ce %g); lower optimizer.learning_rate or set "
                         "max_grad_norm; the last checkpoint is unaffected",
                         step, mean.total, mean.ce);

    // OLMo's scheduler_current / scheduler_max (steps, or tokens seen counting this step's batch).
    const ScheduleRun run = config_schedule_run(cfg, t->max_steps);
    const SchedulePos pos = schedule_position(&cfg->schedule, &run, step, t->state.tokens_seen + (int64_t)rows * T);
    double lr = schedule_lr(&cfg->schedule, cfg->learning_rate, pos.now, pos.max);
    double max_norm = schedule_clip_max_norm(&cfg->schedule, cfg->max_grad_norm, step, t->state.tokens_seen);
    // Adaptive clipping replaces the global one (OLMo never reads max_grad_norm then); its ratio
    // follows the clipping warm-up as max_grad_norm does.
    double ratio = schedule_clip_max_norm(&cfg->schedule, cfg->max_grad_norm_ratio, step, t->state.tokens_seen);
    if (t->clip_on) max_norm = 0;
    if (is_peer(cfg) && cfg->lr_scale != 1.0) lr *= cfg->lr_scale;
    double norm = 0.0;
    bool apply = true;
    float grad_scale = 1.0f;   // clipping (and unscaling), applied by AdamW as it reads the gradient
    if (t->scaler.enabled) {
        // Gradients are scaled by the loss scale: a non-finite norm is an overflow (skip the
        // step, halve the scale); otherwise unscale and clip in one multiply.
        if (n_grad) SPES_TRY(step_grad_norm(t, &norm));
        norm /= t->scaler.scale;
        bool finite = isfinite(norm) && step != t->force_overflow_step;
        apply = loss_scale_update(&t->scaler, finite);
        if (!apply) {
            log_warn("step %" PRId64 ": gradient overflow in fp16; step skipped, loss scale now %g", step,
                     t->scaler.scale);
        } else if (n_grad) {
            grad_scale = (float)(1.0 / t->scaler.scale * grad_clip_coef(norm, max_norm));
            if (t->clip_on) SPES_TRY(clip_step(t, ratio, 1.0 / t->scaler.scale, step));
        }
    } else if (n_grad) {
        // clip_grad_norm_ over the reduced gradient (whole or sharded), its factor applied by AdamW. A non-finite
        // norm with a finite loss would make every weight NaN: stop before the update (every
        // rank has the same norm), so no checkpoint holds such weights.
        SPES_TRY(step_grad_norm(t, &norm));
        if (step == t->force_overflow_step) norm = INFINITY;   // tests: SPES_FORCE_GRAD_OVERFLOW_STEP
        if (!isfinite(norm))
            return spes_fail("step %" PRId64 ": the gradient norm is %g with a finite loss (%g): an overflow in the "
                             "backward; lower optimizer.learning_rate; the last checkpoint is unaffected", step, norm, mean.total);
        grad_scale = grad_clip_coef(norm, max_norm);
        if (t->clip_on) SPES_TRY(clip_step(t, ratio, 1.0, step));
    }
    const Buf compute = {m->cparams, t->be->compute};
    bool queued = false;   // this step's update left running under the next forward
    if (n_grad && apply && t->z3_on) {   // the shard in place; nothing to all-gather
        SPES_TRY(adamw_step_packed(&t->adamw, &m->table, t->z3.shard, t->zgrads.shard, grad_scale, lr));
        SPES_TRY(sharded_params_updated(&t->z3));
    } else if (n_grad && apply && t->overlap_on) {   // under the next forward; the gradients zeroed behind it
        SPES_TRY(overlap_queue_update(&t->overlap, grad_scale, lr));
        queued = t->grads_zeroed_by_update = true;
    } else if (n_grad && apply) {
        float *grads = t->zgrads_on ? t->zgrads.shard : t->dist ? dp_step_grads(&t->dp, m->grads) : m->grads;
        SPES_TRY(adamw_step(&t->adamw, &m->table, m->dparams, grads, grad_scale, compute, lr));
        if (t->dist) SPES_TRY(dp_gather_params(&t->dp, &m->table, m->dparams, compute));
    }
    // The last step's update stays "queued" until something waited for both queues: this step's
    // end, unless it queued one of its own (a step that fails before here leaves it set).
    if (!queued) SPES_TRY(backend_sync(t->be));
    t->update_queued = queued;

    t->state.step = step;
    t->state.tokens_seen += (int64_t)rows * T;
    t->state.data = loader_get_position(t->train_dl);

    double dt = now_seconds() - t0;
    if (t->steps_this_run++ > 0) {   // this process's first step warms caches: no ETA basis
        t->timed_seconds += dt;
        t->timed_steps++;
    }
    double avg = t->timed_steps ? t->timed_seconds / (double)t->timed_steps : dt;
    *out = (StepMetrics){.step = step,
                         .max_steps = t->max_steps,
                         .loss = mean,
                         .lr = lr,
                         .grad_norm = norm,
                         .tokens_seen = t->state.tokens_seen,
                         .instance_filter = cfg->data.instance_filter.enabled,
                         .masked_instances = masked_instances(rows, T, mean.num_targets),
                         .clip_adaptive = t->clip_on,
                         .clipping_rate = t->clip_on && t->clip.eligible ? (double)t->clip.clipped / t->clip.eligible : 0,
                         .expert_counts = t->step_counts,
                         .n_layers = m->cfg.n_layers,
                         .n_experts = m->cfg.num_experts,
                         .step_seconds = dt,
                         .tokens_per_second = dt > 0 ? (double)rows * T / dt : 0,
                         .mfu = dt > 0 && t->peak_flops > 0 ? flops / dt / t->peak_flops : 0,
                         .eta_seconds = avg * (double)(t->max_steps - step),
                         .peak_rss_mb = peak_rss_mb(),
                         .loss_scale = t->scaler.enabled ? t->scaler.scale : 0,
                         .step_skipped = !apply};
    if (!t->be->host_memory) {
        size_t in_use = 0, peak = 0;
        t->be->ops->memory(t->be, &in_use, &peak);
        out->device_mem_mb = in_use / 1048576.0;
        out->device_peak_mb = peak / 1048576.0;
    }
    return SPES_OK;
}

// A downstream evaluator: its task scored as `spes eval --task` scores it (mc_score.h).
static int evaluate_downstream(Trainer *t, Evaluator *e) {
    double t0 = now_seconds();
    McScoreOptions opt = {.max_seq = 0, .show_progress = 0};
    McMetrics mm = {0};
    int rc = mc_task_score(&t->model, t->tokenizer, &e->task, &opt, e->scores);
    if (rc == SPES_OK) rc = mc_task_metrics(&e->task, e->scores, &mm);
    if (rc != SPES_OK) return spes_fail_context("evaluator '%s'", e->cfg->label);
    char line[256];
    int len = snprintf(line, sizeof line, "eval %s at step %" PRId64 ": %d docs", e->cfg->label, t->state.step, mm.num_docs);
    for (int k = 0; k < MC_NUM_METRICS && len < (int)sizeof line; k++)
        if (!isnan(mc_metric(&mm, k)))
            len += snprintf(line + len, sizeof line - (size_t)len, " %s %.4f", MC_METRIC_NAMES[k], mc_metric(&mm, k));
    log_info("%s (%.1fs)", line, now_seconds() - t0);
    rc = metrics_write_downstream(&t->log, t->state.step, e->cfg->label, &mm);
    mc_metrics_free(&mm);
    return rc;
}

// Every evaluator on this rank's model (which holds its full parameters).
static int evaluate_here(Trainer *t) {
    for (int i = 0; i < t->n_evals; i++) {
        Evaluator *e = &t->evals[i];
        if (e->cfg->requests) {
            SPES_TRY(evaluate_downstream(t, e));
            continue;
        }
        double t0 = now_seconds(), ce_sum = 0;
        int64_t targets = 0;
        SPES_TRY(loader_set_position(e->dl, (LoaderPosition){0, 0}));
        for (;;) {
            const Batch *b;
            SPES_TRY(loader_next(e->dl, &b));
            if (b->rows == 0) break;
            LossValues lv;
            if (model_forward(&t->model, b->inputs, b->targets, b->rows, b->T, &t->weights, &lv, NULL) != SPES_OK)
                return spes_fail_context("evaluator '%s'", e->cfg->label);
            ce_sum += lv.ce * (double)lv.num_targets;
            targets += lv.num_targets;
        }
        double ce = targets ? ce_sum / (double)targets : NAN;
        log_info("eval %s at step %" PRId64 ": ce %.4f, perplexity %.3f over %" PRId64 " tokens (%.1fs)",
                 e->cfg->label, t->state.step, ce, exp(ce), targets, now_seconds() - t0);
        SPES_TRY(metrics_write_eval(&t->log, t->state.step, e->cfg->label, ce, targets));
    }
    return SPES_OK;
}

// Every rank learns rank 0's outcome `rc` of `what` (the others' own rc stands when they failed).
static int share_outcome(Trainer *t, int rc, const char *what) {
    int64_t ok = rc == SPES_OK;
    SPES_TRY(comm_broadcast(t->comm, NULL, &ok, sizeof ok, 0));
    if (rc == SPES_OK && !ok) rc = spes_fail("rank 0 could not %s at step %" PRId64 " (its log says why)", what, t->state.step);
    return rc;
}

// Between steps, for what reads or writes the parameters or the optimizer state (checkpoint,
// evaluation, SPES sync, the end of a run): the last step's update finished if it was queued
// under the next forward (optimizer.overlap_next_forward), and under ZeRO-3 the full
// parameters; *was tells whether to shard them again after.
static int parameters_at_rest(Trainer *t, bool *was) {
    *was = false;
    if (t->update_queued) {
        t->update_queued = false;
        SPES_TRY(backend_sync(t->be));
    }
    *was = t->z3_on && t->z3.sharded;
    return *was ? sharded_params_unshard(&t->z3) : SPES_OK;
}

int trainer_evaluate(Trainer *t) {
    bool resharded;
    SPES_TRY(parameters_at_rest(t, &resharded));
    int rc = t->rank0 ? evaluate_here(t) : SPES_OK;
    if (t->dist) rc = share_outcome(t, rc, "evaluate");
    if (rc == SPES_OK && resharded) rc = sharded_params_shard(&t->z3);
    if (rc == SPES_OK) t->last_eval_step = t->state.step;
    return rc;
}

// The checkpoint's contents on the host: the parameters, and the optimizer state (*state: with
// several ranks under a sharded strategy, gathered into *full, which the caller frees).
static int save_prepare(Trainer *t, AdamW *full, const AdamW **state) {
    *state = &t->adamw;
    SPES_TRY(model_params_to_host(&t->model));
    t->state.loss_scale = t->scaler.enabled ? t->scaler.scale : 0;
    t->state.loss_scale_good_steps = t->scaler.enabled ? t->scaler.good_steps : 0;
    if (!t->dist) return adamw_state_to_host(&t->adamw);
    bool sharded = t->dp.stage != DP_DDP;
    int rc = adamw_state_to_host(&t->adamw);
    if (sharded) {
        if (rc == SPES_OK) rc = adamw_create(full, &t->model.table, &t->adamw.cfg);
        // The gathers need every rank: one that failed alone here would leave the others in them.
        rc = comm_all_ok(t->comm, rc, "bring the optimizer state to the host");
        if (rc == SPES_OK) rc = dp_gather_state(&t->dp, &t->adamw, full);
        *state = full;
    }
    return rc;
}

// One attempt at writing the checkpoint: rank 0 writes, every rank learns whether that worked.
// On success the oldest checkpoints are pruned (a prune that fails is a warning: the new one is whole).
static int save_write(Trainer *t, const AdamW *state) {
    int rc = t->rank0 ? checkpoint_save(t->cfg->save_folder, &t->model, state, &t->state, t->cfg) : SPES_OK;
    if (t->dist) rc = share_outcome(t, rc, "save");
    if (rc == SPES_OK && t->rank0 &&
        checkpoint_prune(t->cfg->save_folder, t->cfg->save_num_unsharded_checkpoints_to_keep) != SPES_OK)
        log_warn("saved step %" PRId64 ", but the older checkpoints could not be pruned: %s", t->state.step,
                 spes_last_error());
    return rc;
}

// "step 10" or "none yet": the newest checkpoint a resume would start from.
static void newest_checkpoint_text(const Trainer *t, char *out, size_t cap) {
    if (t->last_saved_step >= 0) snprintf(out, cap, "step %" PRId64, t->last_saved_step);
    else snprintf(out, cap, "none yet");
}

// The save_interval save after this step's, or the run's last step.
static int64_t next_save_step(const Trainer *t) {
    return save_space_next_save(t->state.step, config_last_step(t->cfg, t->max_steps), t->cfg->save_interval_unsharded);
}

// Whether a stop signal came since the count was stops_at_start (spes train's handler counts them).
static bool stopped_since(const Trainer *t, int stops_at_start) { return t->opt.stop && *t->opt.stop > stops_at_start; }

// Rank 0 waits up to every_s before the next attempt; a stop signal ends the wait early.
// Returns whether one came.
static bool wait_to_retry(const Trainer *t, int stops_at_start) {
    double until = now_seconds() + t->opt.save_retry.every_s;
    while (now_seconds() < until && !stopped_since(t, stops_at_start))
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    return stopped_since(t, stops_at_start);
}

// Rank 0's report of a failed attempt and of what follows (save_failure.h).
static void report_failed_save(const Trainer *t, SaveKind kind, SaveAction action, const char *why, double waited) {
    char space[4400], newest[48];
    save_space_describe(t->cfg->save_folder, t->checkpoint_bytes, space, sizeof space);
    newest_checkpoint_text(t, newest, sizeof newest);
    const SaveRetry *r = &t->opt.save_retry;
    if (action == SAVE_RETRY)
        log_error("could not save step %" PRId64 ": %s (%s). Retrying in %.0fs, for up to %.0fs more (--save_retry); "
                  "free space there, or SIGINT/SIGTERM to stop waiting. Newest checkpoint: %s",
                  t->state.step, why, space, r->every_s, r->for_s - waited, newest);
    else if (action == SAVE_TRAIN_ON)
        log_error("could not save step %" PRId64 "%s: %s (%s). Training on; the next save, at step %" PRId64
                  ", tries again. Newest checkpoint: %s",
                  t->state.step, kind == SAVE_ON_REQUEST ? " (asked for by SIGUSR1)" : "", why, space,
                  next_save_step(t), newest);
    else
        log_error("could not save step %" PRId64 ": %s (%s)", t->state.step, why, space);
}

// The error a final save that gave up leaves: what is lost.
static int fail_lost(const Trainer *t, const char *why, bool stopped) {
    const char *how = stopped ? "stopped while waiting to retry" : "out of retries (--save_retry)";
    if (t->last_saved_step >= 0)
        return spes_fail("the final checkpoint, step %" PRId64 ", was not saved (%s; the last attempt: %s): steps %" PRId64
                         "-%" PRId64 " are lost; the newest checkpoint is step %" PRId64 " in %s",
                         t->state.step, how, why, t->last_saved_step + 1, t->state.step, t->last_saved_step,
                         t->cfg->save_folder);
    return spes_fail("the final checkpoint, step %" PRId64 ", was not saved (%s; the last attempt: %s): the run's "
                     "training is lost; no checkpoint of it exists in %s",
                     t->state.step, how, why, t->cfg->save_folder);
}

// Attempts until one writes the checkpoint or the policy (save_failure.h) says otherwise; rank 0
// decides and every rank follows. *saved: whether the checkpoint was written.
static int save_with_retries(Trainer *t, SaveKind kind, const AdamW *state, bool *saved) {
    int stops_at_start = t->opt.stop ? *t->opt.stop : 0;
    double first_failure = 0;
    int rc = SPES_OK;
    *saved = false;
    for (int attempt = 0;; attempt++) {
        if (save_write(t, state) == SPES_OK) {
            *saved = true;
            break;
        }
        char why[2048];
        snprintf(why, sizeof why, "%s", spes_last_error());
        // From the first failure on, a stop signal only counts (spes train's handler): it ends the wait.
        if (t->opt.save_waiting) *t->opt.save_waiting = 1;
        if (attempt == 0) first_failure = now_seconds();
        int64_t action = SAVE_TRAIN_ON;
        if (t->rank0) {
            double waited = now_seconds() - first_failure;
            action = save_after_failure(kind, &t->opt.save_retry, waited, stopped_since(t, stops_at_start));
            report_failed_save(t, kind, (SaveAction)action, why, waited);
            if (action == SAVE_RETRY && wait_to_retry(t, stops_at_start)) {
                action = save_after_failure(kind, &t->opt.save_retry, waited, true);
                log_warn("stop signal: no more retries of the save of step %" PRId64, t->state.step);
            }
        }
        if (t->dist && comm_broadcast(t->comm, NULL, &action, sizeof action, 0) != SPES_OK) {
            rc = SPES_ERR;
            break;
        }
        if (action == SAVE_RETRY) continue;
        if (action == SAVE_GIVE_UP) rc = fail_lost(t, why, stopped_since(t, stops_at_start));
        else spes_clear_error();
        break;
    }
    if (t->opt.save_waiting) *t->opt.save_waiting = 0;
    return rc;
}

int trainer_save(Trainer *t, SaveKind kind) {
    double t0 = now_seconds();
    bool resharded, saved = false;
    SPES_TRY(parameters_at_rest(t, &resharded));
    AdamW full = {0};
    const AdamW *state;
    int rc = save_prepare(t, &full, &state);
    if (rc == SPES_OK) rc = save_with_retries(t, kind, state, &saved);
    if (state == &full) adamw_free(&full);
    SPES_TRY(rc);
    if (resharded) SPES_TRY(sharded_params_shard(&t->z3));
    if (!saved) {
        t->failed_save_step = t->state.step;
        return SPES_OK;
    }
    t->last_saved_step = t->state.step;
    t->failed_save_step = 0;
    log_info("saved %s/step%" PRId64 " (%.1fs)", t->cfg->save_folder, t->state.step, now_seconds() - t0);
    return SPES_OK;
}

// The after-step hook (SPES), on every rank; under ZeRO-3 with the full parameters when it
// says the step touches them.
static int after_step(Trainer *t, int64_t step) {
    const TrainerOptions *o = &t->opt;
    bool touches = true, resharded = false;
    if (o->after_step_touches_model) SPES_TRY(o->after_step_touches_model(o->after_step_ctx, step, &touches));
    if (touches) SPES_TRY(parameters_at_rest(t, &resharded));
    if (o->after_step(o->after_step_ctx, &t->model, step) != SPES_OK) return spes_fail_context("after step %" PRId64, step);
    // A round replaced the weights: spes_config.reset_moments_at_sync starts the moments over from
    // there (off: each peer keeps the moments of its own gradients, the reference's behaviour).
    if (touches && o->after_step_touches_model && t->cfg->reset_moments_at_sync) SPES_TRY(adamw_reset(&t->adamw));
    return resharded ? sharded_params_shard(&t->z3) : SPES_OK;
}

// A stop signal that came while the run started (spes train's handlers are installed before the
// config is read): on any rank, every rank stops before the first step.
static int stopped_at_start(Trainer *t, bool *stopped) {
    int64_t any = t->opt.stop && *t->opt.stop;
    if (t->dist) SPES_TRY(comm_allreduce_sum(t->comm, NULL, &any, 1, COMM_I64));
    *stopped = any > 0;
    return SPES_OK;
}

// A step that could not read its batch, or an evaluation that failed, leaves the model as the
// last step left it: that state is saved (as a final save: retried on a full disk) before the
// run stops with the error, so what was trained since the last checkpoint is not lost with it.
static int save_then_fail(Trainer *t) {
    char why[2048];
    snprintf(why, sizeof why, "%s", spes_last_error());
    if (t->last_saved_step == t->state.step || t->state.step == 0) return spes_fail("%s", why);
    if (trainer_save(t, SAVE_FINAL) != SPES_OK)
        return spes_fail("%s; and step %" PRId64 " could not be saved before stopping: %s", why, t->state.step,
                         spes_last_error());
    log_error("saved step %" PRId64 " before stopping on this error: %s", t->state.step, why);
    return spes_fail("%s (step %" PRId64 " was saved first: --resume goes on from it once this is mended)", why,
                     t->state.step);
}

int trainer_run(Trainer *t) {
    const TrainConfig *cfg = t->cfg;
    int64_t log_every = cfg->console_log_interval > 0 ? cfg->console_log_interval : 1;
    bool stopped;
    SPES_TRY(stopped_at_start(t, &stopped));
    if (stopped) {   // nothing trained: no checkpoint to write (a resumed run's stays the newest)
        log_info("stopped by signal before step %" PRId64 ": nothing trained, no checkpoint written", t->state.step + 1);
        return SPES_OK;
    }
    while (t->state.step < t->max_steps) {
        if (cfg->stop_at >= 0 && t->state.step >= cfg->stop_at) {
            log_info("stop_at %" PRId64 " reached", cfg->stop_at);
            break;
        }
        StepMetrics sm;
        if (trainer_step(t, &sm) != SPES_OK) return t->batch_unread ? save_then_fail(t) : SPES_ERR;
        int64_t step = sm.step;
        sm.failed_save_step = t->failed_save_step;   // the console says so until a save works
        sm.newest_checkpoint = t->last_saved_step;
        bool log_step = step % log_every == 0 || step == 1 || step == t->max_steps;
        if (log_step && t->rank0) {
            char line[512];
            metrics_format_console(&sm, line, sizeof line);
            log_info("%s", line);
        }
        if (t->rank0) SPES_TRY(metrics_write_step(&t->log, &sm, step % log_every == 0));
        if (t->rank0 && t->opt.on_metrics) t->opt.on_metrics(t->opt.on_metrics_ctx, &sm);
        if (t->opt.after_step) SPES_TRY(after_step(t, step));
        bool interrupted = t->opt.stop && *t->opt.stop;
        bool save_now = t->opt.save_now && *t->opt.save_now;
        if (save_now) *t->opt.save_now = 0;   // taken: a later signal asks for a later save
        // A stop seen by any rank stops them all at the same step; a save on request is rank 0's
        // to ask (mpirun passes the signal to every rank, and each may see it at another step).
        if (t->dist) {
            int64_t any[2] = {interrupted, t->rank0 && save_now};
            SPES_TRY(comm_allreduce_sum(t->comm, NULL, any, 2, COMM_I64));
            interrupted = any[0] > 0;
            save_now = any[1] > 0;
        }
        // The run's last step (or a stop's) is the final save, which a full disk must not lose (save_failure.h).
        bool last = step >= config_last_step(cfg, t->max_steps) || interrupted;
        bool on_interval = cfg->save_interval_unsharded > 0 && step % cfg->save_interval_unsharded == 0;
        if (last) {
            SPES_TRY(trainer_save(t, SAVE_FINAL));
        } else if (on_interval || save_now) {
            SPES_TRY(trainer_save(t, save_now ? SAVE_ON_REQUEST : SAVE_ON_INTERVAL));
            if (save_now && t->rank0 && t->last_saved_step == step)
                log_info("saved step %" PRId64 " as asked (SIGUSR1); training on", step);
        }
        if (interrupted) {
            log_info("interrupted: finishing at step %" PRId64, step);
            break;
        }
        if (t->n_evals > 0 && cfg->eval_interval > 0 && step % cfg->eval_interval == 0 && trainer_evaluate(t) != SPES_OK)
            return save_then_fail(t);
    }
    if (t->last_saved_step != t->state.step) SPES_TRY(trainer_save(t, SAVE_FINAL));
    // A completed run ends with a validation figure even off the eval_interval grid.
    bool completed = t->state.step >= t->max_steps;
    if (completed && t->n_evals > 0 && t->last_eval_step != t->state.step) SPES_TRY(trainer_evaluate(t));
    bool resharded;   // the model holds its full parameters after a run
    SPES_TRY(parameters_at_rest(t, &resharded));
    size_t in_use = 0, peak = 0;   // the plan's peak beside the measured one (tests/integration/plan_memory.sh)
    t->be->ops->memory(t->be, &in_use, &peak);
    if (t->rank0 && peak > 0)
        log_info("memory: backend peak %zu bytes on this rank, planned %zu (%.4f)%s", peak, t->planned_peak,
                 (double)t->planned_peak / (double)peak,
                 config_grad_accum_steps(cfg) < comm_size(t->comm) ? " (rank 0 computes no micro-batch)" : "");
    return SPES_OK;
}
