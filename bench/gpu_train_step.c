// One full training step of the SPES 1B MoE on a GPU (bf16 mixed precision: fp32 master
// weights and moments, bf16 GEMM operands), as one SPES peer (experts 0..3 of 16 trainable)
// and with every tensor trainable, next to a cuBLAS bf16 GEMM timed in the same run.
//
// Model: the reference's spes_moe_1b_4nodes config: d_model 768, 12 heads (MHA, head_dim 64),
// 12 layers, 16 experts top-2, expert hidden 2048 (mlp_hidden_size 4096 halved: SwiGLU),
// vocab = embedding 151665, rope_theta 500000, RMSNorm eps 1e-6, full QK-norm, OLMo init
// (seed 1). Micro-batch 8 x 2048 random tokens (seed 7). Losses with the SPES weights
// (LM z-loss 1e-5, load balancing 0.01, router z-loss 0.001); AdamW lr 5e-4, betas
// (0.9, 0.95), eps 1e-8, weight decay 0.1 (norms and embeddings decay, as the reference).
//
// One step = zero grads + forward/backward + global-norm clipping (1.0) + AdamW, then
// backend_sync. Every timing is taken after a backend_sync, so it is GPU time. The model's
// per-phase profile (model_phase_seconds) comes from one more forward+backward after the timed
// steps with m.phase_sync set: the backend is synced at every phase boundary, so each phase is
// its device time. Those syncs cost the overlap of host and device, so the phases may add up
// to more than the timed steps' forward+backward; both are printed.
//
// Each measurement runs in its own forked child (GEMM ceiling, peer, all-trainable), so one
// variant's peak memory cannot hide in the other's and an out-of-memory in one is reported
// without losing the others. The parent never touches the GPU (CUDA does not survive fork).
//
// Memory (be->ops->memory: bytes allocated through the backend, peak since open), per
// variant, against the parameter table's prediction:
//   predicted = 4P (fp32 master) + 2P (bf16 compute copy) + 4T (fp32 gradients)
//               + 8T (AdamW m, v) + A (the model's activation arena, as planned for B x T)
// P = all parameters, T = trainable ones. "other" = measured peak - predicted: backend
// scratch (GEMM conversions, cuBLAS workspace, reductions) and transient buffers.
//
// usage: gpu_train_step [--device cuda|cuda:N|cpu] [--batch B] [--seq T] [--warmup W]
//                       [--steps S] [--experts-per-peer M] [--gemm-n N] [--peak-tflops X]
//                       [--preset 1b|tiny|bench-small] [--profile-step] [--overlap-adamw]
// --profile-step: only the all-trainable run, in this process (no child), and after its timed
// steps one more full step between cudaProfilerStart and cudaProfilerStop, for a profiler
// started with profiling off (scripts/gpu_check.sh profile: ncu, one line per kernel of it).
// --overlap-adamw: after the timed steps, as many again back to back without the syncs between
// a step's parts, then as many with each step's AdamW on the backend's aux queue under the next
// step's forward (src/train/overlap_step.h), both timed from a synced start to a synced end:
// "AdamW under the next forward" lines (the two and their ratio) and ours_tok_s_overlap=.
// (--device cpu with --preset tiny exercises the code path on a machine without a GPU.)
//
// Exit status: 0 measured (out-of-memory of a variant is reported as such, values NA),
// 77 no GPU backend could be opened (this spes has no CUDA, or no GPU is visible): the
// line "gpu_train_step: skipped (<why>)", 1 a real failure.
// Machine-readable lines (bench/run_gpu.sh assembles the final line): ours_tok_s= and mfu=,
// gemm_ceiling_frac= for the all-trainable run (the same work as the PyTorch peer),
// peer_tok_s=, peer_mfu= for the SPES peer, gemm_tflops=, copy_gbs= (the ceilings),
// peak_mem_gb= (peer),
// peak_mem_gb_all_trainable=, mem_ratio_measured=, mem_ratio_predicted=.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/rng.h"
#include "base/threads.h"
#include "base/timer.h"
#include "model/model.h"
#include "model/model_internal.h"   // the activation arena's size, for the memory prediction
#include "config/config.h"
#include "train/optimizer.h"
#include "train/overlap_step.h"
#include "train/plan.h"

#ifdef SPES_WITH_CUDA
#include <cuda_profiler_api.h>   // cudaProfilerStart/Stop: what `ncu --profile-from-start off` profiles
#endif

enum { MAX_STEPS = 256 };
enum { RES_OK = 0, RES_FAIL = 1, RES_OOM = 3, RES_SKIP = 77 };

typedef struct {
    const char *device;
    const char *preset;
    int B, T, warmup, steps, experts_per_peer, gemm_n;
    double peak_tflops;
    bool profile_step;          // --profile-step: all-trainable only, in this process, one more step profiled
    bool overlap_adamw;         // --overlap-adamw: the steps again with AdamW under the next forward
} Opts;

// What a child sends back through its pipe (fixed size, no pointers).
typedef struct {
    int status;                 // RES_*
    char message[512];          // the error, when status != RES_OK
    char device[160];           // be->description
    // GEMM child: the ceilings
    double gemm_tflops;
    double copy_gbs;            // device-to-device copy, bytes read + written per second
    // training children
    int B, T, steps;
    size_t params, trainable, arena_bytes;
    bool compute_copy;          // a separate compute-type copy of the parameters exists
    size_t static_bytes;        // backend bytes in use after setup (before the first step)
    size_t peak_bytes;          // backend peak since open
    double mean_s, best_s, fb_s, clip_s, adam_s, loss, grad_norm, flops;
    double overlap_s;           // --overlap-adamw: mean step with AdamW under the next forward (0: not run)
    double plain_b2b_s;         // --overlap-adamw: mean plain step timed as those (back to back, no inner syncs)
    double phase[MODEL_PHASE_COUNT];
    double phase_flops[MODEL_PHASE_COUNT];   // GEMM FLOPs of the phases that are mostly GEMMs, else 0
} Result;

// ---- helpers --------------------------------------------------------------------------

// backend_open's message when there is no GPU backend to use: this is a skip, not a failure.
static bool is_no_gpu(const char *msg) {
    return strstr(msg, "built without CUDA") || strstr(msg, "no NVIDIA GPU is visible");
}

static bool is_oom(const char *msg) {
    return strcasestr(msg, "out of memory") || strstr(msg, "cudaErrorMemoryAllocation") || strstr(msg, "OOM");
}

// Sets the result's status from the error message now pending.
static void set_error(Result *r, const char *stage) {
    const char *msg = spes_last_error();
    snprintf(r->message, sizeof r->message, "%s: %s", stage, msg && *msg ? msg : "unknown error");
    r->status = is_no_gpu(r->message) ? RES_SKIP : is_oom(r->message) ? RES_OOM : RES_FAIL;
}

static double gb(size_t bytes) { return (double)bytes / 1e9; }

// The reference's spes_moe_1b_4nodes model, or a named preset (tiny / bench-small) for quick runs.
static int bench_config(const char *preset, ModelConfig *cfg) {
    if (strcmp(preset, "1b") != 0) return model_config_preset(preset, cfg);
    SPES_TRY(model_config_preset("bench-small", cfg));   // shared defaults (init, qk-norm), then the 1B shape
    cfg->d_model = 768;
    cfg->n_heads = 12;
    cfg->n_kv_heads = 12;
    cfg->head_dim = 64;
    cfg->n_layers = 12;
    cfg->vocab_size = 151665;
    cfg->embedding_size = 151665;
    cfg->num_experts = 16;
    cfg->top_k = 2;
    cfg->expert_hidden = 2048;   // mlp_hidden_size 4096 / 2 (SwiGLU)
    cfg->max_seq_len = 2048;
    cfg->rope_theta = 500000.0f;
    cfg->norm_eps = 1e-6f;
    cfg->qk_norm = QK_NORM_FULL;
    cfg->normalize_expert_weights = false;
    cfg->init_std = 0.02f;
    cfg->init_cutoff_factor = 3.0f;
    cfg->eos_token_id = 151643;
    cfg->pad_token_id = 151643;
    return model_config_validate(cfg);
}

// ---- child: the GEMM ceiling ------------------------------------------------------------

// C = A @ B^T, n x n x n, operands and output in the backend's compute type (bf16 under
// amp_bf16), fp32 accumulation: what cuBLAS reaches on this GPU. Random values (zeros run
// faster on some GPUs). Best of 3 batches of 10 after 3 warm-ups.
static Precision bench_precision(const Opts *o) {
    return strcmp(o->device, "cpu") == 0 ? PRECISION_FP32 : PRECISION_AMP_BF16;   // cpu: fp32 only (no warning)
}

// The memory ceiling: the backend's copy of 1 GiB (64 MiB in host memory), counting the bytes
// read and written, best of 3 batches of 10 after 3 warm-ups. The memory-bound phases' floors
// (AdamW's below) are bytes over this rate.
static int measure_copy(Backend *be, double *gbs) {
    const size_t bytes = be->host_memory ? (size_t)64 << 20 : (size_t)1 << 30;
    void *src = NULL, *dst = NULL;
    int rc = SPES_ERR;
    if (backend_alloc(be, bytes, &src) != SPES_OK || backend_alloc(be, bytes, &dst) != SPES_OK) goto done;
    be->ops->zero(be, src, bytes);
    for (int i = 0; i < 3; i++) be->ops->copy(be, dst, src, bytes);
    if (backend_sync(be) != SPES_OK) goto done;
    *gbs = 0.0;
    for (int batch = 0; batch < 3; batch++) {
        const int reps = 10;
        double t0 = now_seconds();
        for (int i = 0; i < reps; i++) be->ops->copy(be, dst, src, bytes);
        if (backend_sync(be) != SPES_OK) goto done;
        double rate = 2.0 * (double)bytes * reps / (now_seconds() - t0) / 1e9;
        if (rate > *gbs) *gbs = rate;
    }
    rc = SPES_OK;
done:
    backend_free(be, src), backend_free(be, dst);
    return rc;
}

static void run_gemm(const Opts *o, Result *r) {
    Backend *be = NULL;
    void *tmp = NULL, *a = NULL, *b = NULL, *c = NULL;
    float *host = NULL;
    if (backend_open(o->device, bench_precision(o), &be) != SPES_OK) {
        set_error(r, "open");
        return;
    }
    snprintf(r->device, sizeof r->device, "%s", be->description);
    const int n = o->gemm_n;
    const size_t elems = (size_t)n * n, cbytes = elems * num_type_size(be->compute);
    if (!(host = spes_malloc(elems * sizeof(float)))) goto fail;
    Rng rng;
    rng_seed(&rng, 11);
    for (size_t i = 0; i < elems; i++) host[i] = (float)(rng_uniform(&rng) - 0.5);
    if (backend_alloc(be, elems * sizeof(float), &tmp) != SPES_OK || backend_alloc(be, cbytes, &a) != SPES_OK ||
        backend_alloc(be, cbytes, &b) != SPES_OK || backend_alloc(be, cbytes, &c) != SPES_OK)
        goto fail;
    if (be->ops->upload(be, tmp, host, elems * sizeof(float)) != SPES_OK) goto fail;
    Buf A = buf_of(a, be->compute), B = buf_of(b, be->compute), C = buf_of(c, be->compute);
    be->ops->convert(be, A, buf_f32(tmp), elems);
    be->ops->convert(be, B, buf_f32(tmp), elems);
    if (backend_sync(be) != SPES_OK) goto fail;
    for (int i = 0; i < 3; i++) be->ops->gemm(be, false, true, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    if (backend_sync(be) != SPES_OK) goto fail;
    double best = 0.0;
    const int reps = 10;
    for (int batch = 0; batch < 3; batch++) {
        double t0 = now_seconds();
        for (int i = 0; i < reps; i++) be->ops->gemm(be, false, true, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        if (backend_sync(be) != SPES_OK) goto fail;
        double tflops = 2.0 * n * (double)n * n * reps / (now_seconds() - t0) / 1e12;
        if (tflops > best) best = tflops;
    }
    r->gemm_tflops = best;
    if (measure_copy(be, &r->copy_gbs) != SPES_OK) goto fail;
    r->status = RES_OK;
    goto done;
fail:
    set_error(r, "gemm");
done:
    free(host);
    if (be) {
        backend_free(be, tmp), backend_free(be, a), backend_free(be, b), backend_free(be, c);
        backend_close(be);
    }
}

// ---- child: training steps -----------------------------------------------------------------

// One training step as the trainer runs it: zero grads, forward+backward, the global norm read
// back (the clip factor), AdamW; synced after each part, whose seconds go to sec[0..2].
static int train_step(Model *m, AdamW *opt, const int32_t *inputs, const int32_t *targets, int B, int T,
                      const LossWeights *w, Buf compute, LossValues *v, double *grad_norm, double sec[3]) {
    double t0 = now_seconds();
    model_zero_grad(m);
    SPES_TRY(model_forward_backward(m, inputs, targets, B, T, w, 1.0f, v, NULL));
    SPES_TRY(backend_sync(m->be));
    double t1 = now_seconds();
    *grad_norm = grad_global_norm(m->be, m->grads, m->table.trainable_numel);
    double t2 = now_seconds();
    SPES_TRY(adamw_step(opt, &m->table, m->dparams, m->grads, grad_clip_coef(*grad_norm, 1.0), compute, 5e-4));
    SPES_TRY(backend_sync(m->be));
    sec[0] = t1 - t0, sec[1] = t2 - t1, sec[2] = now_seconds() - t2;
    if (!isfinite(v->total)) return spes_fail("the loss is %g", v->total);
    return SPES_OK;
}

// The step a profiler sees (scripts/gpu_check.sh's profile stage: ncu --profile-from-start off).
static int profiled_train_step(Model *m, AdamW *opt, const int32_t *inputs, const int32_t *targets, int B, int T,
                               const LossWeights *w, Buf compute) {
    LossValues v;
    double norm, sec[3];
#ifdef SPES_WITH_CUDA
    if (strncmp(m->be->name, "cuda", 4) == 0) (void)cudaProfilerStart();
#endif
    int rc = train_step(m, opt, inputs, targets, B, T, w, compute, &v, &norm, sec);
#ifdef SPES_WITH_CUDA
    if (strncmp(m->be->name, "cuda", 4) == 0) (void)cudaProfilerStop();
#endif
    if (rc == SPES_OK)
        printf("profile-step: one more step, between cudaProfilerStart and Stop: %.1f ms (forward+backward %.1f, clip %.1f, "
               "AdamW %.1f)\n", 1e3 * (sec[0] + sec[1] + sec[2]), 1e3 * sec[0], 1e3 * sec[1], 1e3 * sec[2]);
    return rc;
}

// The plain step without train_step's syncs between its parts: the global norm's read-back is
// its only wait.
static int plain_step(Model *m, AdamW *opt, const int32_t *inputs, const int32_t *targets, int B, int T,
                      const LossWeights *w, LossValues *v) {
    model_zero_grad(m);
    SPES_TRY(model_forward_backward(m, inputs, targets, B, T, w, 1.0f, v, NULL));
    double norm = grad_global_norm(m->be, m->grads, m->table.trainable_numel);
    if (!isfinite(norm)) return backend_sync(m->be) != SPES_OK ? SPES_ERR : spes_fail("the gradient norm is %g", norm);
    return adamw_step(opt, &m->table, m->dparams, m->grads, grad_clip_coef(norm, 1.0), (Buf){m->cparams, m->be->compute},
                      5e-4);
}

// `steps` steps back to back after one untimed, timed from a synced start to a synced end (the
// last update included): the plain step (plain_step) or, with `overlap`, each step's AdamW on
// the aux queue under the next forward (src/train/overlap_step.h). Timed alike, so their ratio
// is the overlap's alone. Mean seconds a step.
static int back_to_back_steps(Model *m, AdamW *opt, const int32_t *inputs, const int32_t *targets, int B, int T,
                              const LossWeights *w, int steps, bool overlap, double *mean_s) {
    OverlapStep os;
    LossValues v = {0};
    double norm, t0 = 0.0;
    if (overlap) SPES_TRY(overlap_step_begin(&os, m, opt));
    int rc = SPES_OK;
    for (int s = -1; s < steps && rc == SPES_OK; s++) {
        if (s == 0) {
            if ((rc = backend_sync(m->be)) != SPES_OK) break;
            t0 = now_seconds();
        }
        rc = overlap ? overlap_step(&os, inputs, targets, B, T, w, 5e-4, 1.0, &v, &norm)
                     : plain_step(m, opt, inputs, targets, B, T, w, &v);
    }
    int end = overlap ? overlap_step_end(&os) : backend_sync(m->be);   // waits for the last update
    *mean_s = (now_seconds() - t0) / steps;
    if (rc == SPES_OK && !isfinite(v.total)) rc = spes_fail("the loss is %g", v.total);
    return rc != SPES_OK ? rc : end;
}

// experts_per_peer > 0: experts 0..M-1 trainable (a SPES peer); 0: every tensor trainable.
static void run_train(const Opts *o, int experts_per_peer, Result *r) {
    Backend *be = NULL;
    Model m;
    bool model_ok = false, opt_ok = false;
    AdamW opt;
    int32_t *inputs = NULL, *targets = NULL;
    const char *stage = "open";
    if (backend_open(o->device, bench_precision(o), &be) != SPES_OK) goto fail;
    snprintf(r->device, sizeof r->device, "%s", be->description);
    ModelConfig cfg;
    stage = "config";
    if (bench_config(o->preset, &cfg) != SPES_OK) goto fail;
    if (o->T > cfg.max_seq_len) {
        spes_fail("--seq %d exceeds the model's max_seq_len %d", o->T, cfg.max_seq_len);
        goto fail;
    }
    if (experts_per_peer > cfg.num_experts) {
        spes_fail("--experts-per-peer %d: the model has %d experts", experts_per_peer, cfg.num_experts);
        goto fail;
    }
    stage = "model";
    if (model_create_on(&m, &cfg, be) != SPES_OK) goto fail;
    model_ok = true;
    model_init_weights(&m, 1);
    if (experts_per_peer > 0 && model_set_trainable_experts(&m, 0, experts_per_peer - 1) != SPES_OK) goto fail;
    if (model_params_to_device(&m) != SPES_OK) goto fail;
    stage = "optimizer";
    AdamWConfig acfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                        .decay_norm_and_bias = true, .decay_embeddings = true};
    if (adamw_create_on(&opt, &m.table, &acfg, be) != SPES_OK) goto fail;
    opt_ok = true;
    if (adamw_state_to_device(&opt) != SPES_OK) goto fail;

    const int B = o->B, T = o->T;
    stage = "tokens";
    if (!(inputs = spes_malloc(sizeof(int32_t) * (size_t)B * T)) ||
        !(targets = spes_malloc(sizeof(int32_t) * (size_t)B * T)))
        goto fail;
    Rng rng;
    rng_seed(&rng, 7);
    for (size_t i = 0; i < (size_t)B * T; i++) {
        inputs[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
        targets[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
    }
    stage = "setup";
    if (backend_sync(be) != SPES_OK) goto fail;
    size_t in_use = 0, peak = 0;
    be->ops->memory(be, &in_use, &peak);
    r->static_bytes = in_use;

    const LossWeights w = {.lm_z_mult = 1e-5f, .lb_weight = 0.01f, .router_z_weight = 0.001f};
    const Buf compute = {m.cparams, be->compute};
    double total = 0.0, best = INFINITY;
    LossValues v = {0};
    for (int s = -o->warmup; s < o->steps; s++) {
        if (s == 0) model_phase_reset(&m);
        stage = s < 0 ? "warm-up step" : "timed step";
        double sec[3];
        if (train_step(&m, &opt, inputs, targets, B, T, &w, compute, &v, &r->grad_norm, sec) != SPES_OK) goto fail;
        if (s >= 0) {
            total += sec[0] + sec[1] + sec[2];
            best = fmin(best, sec[0] + sec[1] + sec[2]);
            r->fb_s += sec[0];
            r->clip_s += sec[1];
            r->adam_s += sec[2];
        }
    }
    stage = "profiled step";
    if (o->profile_step && profiled_train_step(&m, &opt, inputs, targets, B, T, &w, compute) != SPES_OK) goto fail;
    stage = "back-to-back plain steps";
    if (o->overlap_adamw &&
        back_to_back_steps(&m, &opt, inputs, targets, B, T, &w, o->steps, false, &r->plain_b2b_s) != SPES_OK)
        goto fail;
    stage = "overlapped steps";
    if (o->overlap_adamw && back_to_back_steps(&m, &opt, inputs, targets, B, T, &w, o->steps, true, &r->overlap_s) != SPES_OK)
        goto fail;
    be->ops->memory(be, &in_use, &peak);
    r->peak_bytes = peak;
    r->B = B, r->T = T, r->steps = o->steps;
    r->mean_s = total / o->steps;
    r->best_s = best;
    r->fb_s /= o->steps, r->clip_s /= o->steps, r->adam_s /= o->steps;
    r->loss = v.total;
    r->flops = model_train_flops(&m, B, T);
    r->params = m.table.total_numel;
    r->trainable = m.table.trainable_numel;
    r->arena_bytes = m.acts ? m.acts->arena_bytes : 0;
    r->compute_copy = m.cparams != NULL;
    // The phases: one more forward+backward, synced at every phase boundary.
    stage = "phase step";
    model_phase_reset(&m);
    m.phase_sync = true;
    model_zero_grad(&m);
    LossValues pv;
    if (model_forward_backward(&m, inputs, targets, B, T, &w, 1.0f, &pv, NULL) != SPES_OK) goto fail;
    if (backend_sync(be) != SPES_OK) goto fail;
    m.phase_sync = false;
    model_phase_seconds(&m, r->phase);
    {   // the GEMM work of the expert and LM-head phases, to read their rates beside the times
        const double N = (double)B * T, NK = N * cfg.top_k, H = cfg.d_model, I = cfg.expert_hidden;
        const double expert_gemm = 2.0 * NK * 3.0 * H * I * cfg.n_layers;   // gate+up [2I,H], down [H,I]: NK rows a layer
        const double trained = experts_per_peer > 0 ? (double)experts_per_peer / cfg.num_experts : 1.0;
        r->phase_flops[MODEL_PHASE_EXPERTS_FWD] = expert_gemm;
        r->phase_flops[MODEL_PHASE_EXPERTS_BWD] = expert_gemm * (1.0 + trained);   // dX, dW of the trained share
        r->phase_flops[MODEL_PHASE_LM_HEAD] = 3.0 * 2.0 * N * cfg.embedding_size * H;
    }
    r->status = RES_OK;
    goto done;
fail:
    set_error(r, stage);
done:
    free(inputs), free(targets);
    if (opt_ok) adamw_free(&opt);
    if (model_ok) model_free(&m);
    backend_close(be);
}

// ---- parent ---------------------------------------------------------------------------------

typedef enum { JOB_GEMM, JOB_PEER, JOB_ALL } Job;

// Runs one job here: *r from zero, a failure unless the job says otherwise.
static void run_job(const Opts *o, Job job, Result *r) {
    memset(r, 0, sizeof *r);
    r->status = RES_FAIL;
    if (job == JOB_GEMM) run_gemm(o, r);
    else run_train(o, job == JOB_PEER ? o->experts_per_peer : 0, r);
}

// Runs one job in a forked child; its Result comes back through a pipe. A child that dies
// (a signal, a crash in the driver) is a failure with that said.
static void measure(const Opts *o, Job job, Result *r) {
    memset(r, 0, sizeof *r);
    r->status = RES_FAIL;
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(r->message, sizeof r->message, "pipe failed");
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(r->message, sizeof r->message, "fork failed");
        close(fds[0]), close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        Result mine;
        run_job(o, job, &mine);
        ssize_t n = write(fds[1], &mine, sizeof mine);
        _exit(n == (ssize_t)sizeof mine ? 0 : 1);
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof *r) {
        ssize_t n = read(fds[0], (char *)r + got, sizeof *r - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    if (got != sizeof *r) {
        memset(r, 0, sizeof *r);
        r->status = RES_FAIL;
        if (WIFSIGNALED(wstatus))
            snprintf(r->message, sizeof r->message, "the child died of signal %d", WTERMSIG(wstatus));
        else
            snprintf(r->message, sizeof r->message, "the child exited with status %d without a result",
                     WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1);
    }
}

// The plan's peak (src/train/plan.h, what `spes plan` prints) of this job: the same model,
// micro-batch, compute type and trainable set on one rank, no checkpointing. The plan follows
// the trainer's allocations; this bench allocates the same buffers (its setup differs: every
// gradient first, then the peer's), and the step's peak is the same.
static double plan_bytes(const Opts *o, int experts_per_peer, NumType compute) {
    TrainConfig cfg;
    config_defaults(&cfg);
    PlanTarget target;
    Plan plan;
    double peak = 0;
    if (bench_config(o->preset, &cfg.model) == SPES_OK) {
        cfg.using_spes = experts_per_peer > 0;
        cfg.num_train_experts_per_node = experts_per_peer;
        cfg.num_peers = experts_per_peer > 0 ? cfg.model.num_experts / experts_per_peer : 1;
        cfg.peer_id = 0;
        cfg.device_train_microbatch_size = o->B;
        if (plan_target_from_config(&cfg, 1, strcmp(o->device, "cpu") != 0, &target) == SPES_OK) {
            target.compute = target.layout.compute = compute;   // the backend's, as it opened
            target.seq_len = o->T;
            target.micro_batch = o->B;
            if (plan_compute(&cfg, &target, &plan) == SPES_OK) peak = (double)plan.mem.peak_step;
        }
    }
    config_free(&cfg);
    return peak;
}

static double predicted_bytes(const Result *r) {
    return 4.0 * (double)r->params + (r->compute_copy ? 2.0 * (double)r->params : 0.0) + 12.0 * (double)r->trainable +
           (double)r->arena_bytes;
}

// ceilings: the GEMM child's result (NULL: not measured).
static void print_train(const char *name, const Result *r, const Opts *o, const Result *ceilings, bool async,
                        int experts_per_peer) {
    const double gemm_tflops = ceilings ? ceilings->gemm_tflops : 0.0, copy_gbs = ceilings ? ceilings->copy_gbs : 0.0;
    if (r->status == RES_OOM) {
        printf("%s: DOES NOT FIT in GPU memory at micro-batch %d x %d (%s); try --batch %d\n", name, o->B, o->T,
               r->message, o->B > 1 ? o->B / 2 : 1);
        return;
    }
    if (r->status != RES_OK) {
        printf("%s: FAILED: %s\n", name, r->message);
        return;
    }
    double tok_s = (double)r->B * r->T / r->mean_s, tflops = r->flops / r->mean_s / 1e12;
    printf("%s: params %.3fB, trainable %.3fB; %d steps: mean %.1f ms, best %.1f ms; loss %.4f, grad norm %.3f\n",
           name, r->params / 1e9, r->trainable / 1e9, r->steps, 1e3 * r->mean_s, 1e3 * r->best_s, r->loss,
           r->grad_norm);
    printf("%s: %.0f tok/s, %.1f model TFLOP/s (%.2f TFLOP/step), MFU %.3f vs %.0f TFLOP/s", name, tok_s, tflops,
           r->flops / 1e12, tflops / o->peak_tflops, o->peak_tflops);
    if (gemm_tflops > 0) printf(", %.3f of the measured GEMM", tflops / gemm_tflops);
    printf("\n");
    printf("%s: synced split per step: forward+backward %.1f ms, clip %.1f ms, AdamW %.1f ms\n", name, 1e3 * r->fb_s,
           1e3 * r->clip_s, 1e3 * r->adam_s);
    if (copy_gbs > 0) {
        // AdamW's bytes per trainable parameter: fp32 gradient, weight and both moments read, the
        // last three written, and the compute copy written when there is one.
        const double per_param = 28.0 + (r->compute_copy ? 2.0 : 0.0), floor_s = per_param * r->trainable / copy_gbs / 1e9;
        printf("%s: AdamW's floor at the measured copy rate (%.0f bytes a trainable parameter at %.0f GB/s): %.1f ms; "
               "measured %.2fx it\n",
               name, per_param, copy_gbs, 1e3 * floor_s, r->adam_s / floor_s);
    }
    if (r->overlap_s > 0)
        printf("%s: AdamW under the next forward (--overlap-adamw): mean %.1f ms a step, %.0f tok/s; the plain step "
               "timed alike (back to back, no syncs inside) %.1f ms: %.3fx\n",
               name, 1e3 * r->overlap_s, (double)r->B * r->T / r->overlap_s, 1e3 * r->plain_b2b_s,
               r->plain_b2b_s / r->overlap_s);
    if (r->peak_bytes > 0) {
        double pred = predicted_bytes(r);
        printf("%s: memory peak %.2f GB; predicted %.2f GB = master %.2f + compute copy %.2f + grads %.2f + "
               "moments %.2f + activations %.2f; other %.2f GB (backend scratch, transients); after setup %.2f GB\n",
               name, gb(r->peak_bytes), pred / 1e9, 4.0 * r->params / 1e9, r->compute_copy ? 2.0 * r->params / 1e9 : 0.0,
               4.0 * r->trainable / 1e9, 8.0 * r->trainable / 1e9, r->arena_bytes / 1e9,
               ((double)r->peak_bytes - pred) / 1e9, gb(r->static_bytes));
        double planned = plan_bytes(o, experts_per_peer, r->compute_copy ? NUM_BF16 : NUM_F32);
        if (planned > 0)
            printf("%s: memory peak %.2f GB measured, %.2f GB planned by spes plan's ledger (%.4f; the rest: the "
                   "backend's scratch)\n",
                   name, gb(r->peak_bytes), planned / 1e9, planned / (double)r->peak_bytes);
    } else {
        printf("%s: memory: this backend does not track its allocations; predicted %.2f GB\n", name,
               predicted_bytes(r) / 1e9);
    }
    double phases = 0.0;
    for (int i = 0; i < MODEL_PHASE_COUNT; i++) phases += r->phase[i];
    printf("%s: model phases of one more forward+backward, %s: sum %.1f ms (the timed steps' forward+backward: "
           "%.1f ms)\n",
           name, async ? "synced at every phase boundary (device time)" : "wall time", 1e3 * phases, 1e3 * r->fb_s);
    for (int i = 0; i < MODEL_PHASE_COUNT; i++) {
        printf("    %-15s %8.2f ms  %5.1f%%", model_phase_name((ModelPhase)i), 1e3 * r->phase[i],
               phases > 0 ? 100.0 * r->phase[i] / phases : 0.0);
        if (r->phase_flops[i] > 0 && r->phase[i] > 0)
            printf("  %6.1f TFLOP/s of GEMMs (%.2f TFLOP)", r->phase_flops[i] / r->phase[i] / 1e12,
                   r->phase_flops[i] / 1e12);
        printf("\n");
    }
}

static void usage(FILE *out) {
    fprintf(out, "usage: gpu_train_step [--device cuda|cuda:N|cpu] [--batch B] [--seq T] [--warmup W] [--steps S]\n"
                 "                      [--experts-per-peer M] [--gemm-n N] [--peak-tflops X] [--preset 1b|tiny|bench-small]\n"
                 "                      [--profile-step] [--overlap-adamw]\n");
}

int main(int argc, char **argv) {
    Opts o = {.device = "cuda", .preset = "1b", .B = 8, .T = 2048, .warmup = 2, .steps = 5, .experts_per_peer = 4,
              .gemm_n = 8192, .peak_tflops = 989.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--profile-step")) {
            o.profile_step = true;
            continue;
        }
        if (!strcmp(a, "--overlap-adamw")) {
            o.overlap_adamw = true;
            continue;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--preset")) o.preset = v;
        else if (!strcmp(a, "--batch")) o.B = atoi(v);
        else if (!strcmp(a, "--seq")) o.T = atoi(v);
        else if (!strcmp(a, "--warmup")) o.warmup = atoi(v);
        else if (!strcmp(a, "--steps")) o.steps = atoi(v);
        else if (!strcmp(a, "--experts-per-peer")) o.experts_per_peer = atoi(v);
        else if (!strcmp(a, "--gemm-n")) o.gemm_n = atoi(v);
        else if (!strcmp(a, "--peak-tflops")) o.peak_tflops = atof(v);
        else {
            usage(stderr);
            return 2;
        }
    }
    if (o.B <= 0 || o.T <= 0 || o.warmup < 0 || o.steps <= 0 || o.steps > MAX_STEPS || o.experts_per_peer <= 0 ||
        o.gemm_n <= 0 || o.peak_tflops <= 0) {
        fprintf(stderr, "gpu_train_step: batch, seq, steps (<= %d), experts-per-peer, gemm-n and peak-tflops must be "
                        "positive, warmup >= 0\n", MAX_STEPS);
        return 2;
    }
    threads_set(0);   // host work (weight init, token generation): every core

    const bool async = strcmp(o.device, "cpu") != 0;
    if (o.profile_step) {   // in this process, so that a profiler started on it sees the kernels
        Result all;
        run_job(&o, JOB_ALL, &all);
        if (all.status == RES_SKIP) {
            printf("gpu_train_step: skipped (%s)\n", all.message);
            return 77;
        }
        print_train("all-trainable", &all, &o, NULL, async, 0);
        return all.status == RES_OK ? 0 : 1;
    }
    Result gemm, peer, all;
    measure(&o, JOB_GEMM, &gemm);
    if (gemm.status == RES_SKIP) {
        printf("gpu_train_step: skipped (%s)\n", gemm.message);
        return 77;
    }
    printf("device: %s\n", gemm.device[0] ? gemm.device : o.device);
    printf("model: %s, micro-batch %d x %d, amp_bf16, %d warm-up + %d timed steps; SPES peer trains experts 0..%d\n",
           o.preset, o.B, o.T, o.warmup, o.steps, o.experts_per_peer - 1);
    if (gemm.status == RES_OK)
        printf("gemm: %d^3 in the compute type: %.2f TFLOP/s; copy: %.0f GB/s (bytes read + written)\n", o.gemm_n,
               gemm.gemm_tflops, gemm.copy_gbs);
    else
        printf("gemm: FAILED: %s\n", gemm.message);
    measure(&o, JOB_PEER, &peer);
    print_train("peer", &peer, &o, &gemm, async, o.experts_per_peer);
    measure(&o, JOB_ALL, &all);
    print_train("all-trainable", &all, &o, &gemm, async, 0);

    // Machine-readable lines; NA where a measurement is missing.
    char buf[64];
#define NUM(fmt, ok, x) ((ok) ? (snprintf(buf, sizeof buf, fmt, x), buf) : "NA")
    const bool g = gemm.status == RES_OK && gemm.gemm_tflops > 0, p = peer.status == RES_OK,
               a = all.status == RES_OK;
    const double a_tflops = a ? all.flops / all.mean_s / 1e12 : 0, p_tflops = p ? peer.flops / peer.mean_s / 1e12 : 0;
    printf("ours_tok_s=%s\n", NUM("%.1f", a, (double)all.B * all.T / all.mean_s));
    printf("tflops=%s\n", NUM("%.2f", a, a_tflops));
    printf("mfu=%s\n", NUM("%.4f", a, a_tflops / o.peak_tflops));
    if (o.overlap_adamw) printf("ours_tok_s_overlap=%s\n", NUM("%.1f", a, (double)all.B * all.T / all.overlap_s));
    printf("gemm_tflops=%s\n", NUM("%.1f", g, gemm.gemm_tflops));
    printf("gemm_ceiling_frac=%s\n", NUM("%.4f", a && g, a_tflops / gemm.gemm_tflops));
    printf("copy_gbs=%s\n", NUM("%.0f", g && gemm.copy_gbs > 0, gemm.copy_gbs));
    printf("peer_tok_s=%s\n", NUM("%.1f", p, (double)peer.B * peer.T / peer.mean_s));
    printf("peer_tflops=%s\n", NUM("%.2f", p, p_tflops));
    printf("peer_mfu=%s\n", NUM("%.4f", p, p_tflops / o.peak_tflops));
    printf("peak_mem_gb=%s\n", NUM("%.2f", p && peer.peak_bytes > 0, gb(peer.peak_bytes)));
    printf("peak_mem_gb_all_trainable=%s\n", NUM("%.2f", a && all.peak_bytes > 0, gb(all.peak_bytes)));
    printf("mem_ratio_measured=%s\n",
           NUM("%.3f", p && a && peer.peak_bytes > 0 && all.peak_bytes > 0, (double)peer.peak_bytes / all.peak_bytes));
    printf("mem_ratio_predicted=%s\n", NUM("%.3f", p && a, predicted_bytes(&peer) / predicted_bytes(&all)));
    if (peer.status == RES_OOM || all.status == RES_OOM)
        printf("oom=%s%s\n", peer.status == RES_OOM ? "peer" : "",
               all.status == RES_OOM ? (peer.status == RES_OOM ? ",all_trainable" : "all_trainable") : "");
#undef NUM
    // Out of memory is a result (reported above), anything else that failed is a failure.
    bool failed = gemm.status == RES_FAIL || peer.status == RES_FAIL || all.status == RES_FAIL ||
                  gemm.status == RES_SKIP || peer.status == RES_SKIP || all.status == RES_SKIP;
    return failed ? 1 : 0;
}
