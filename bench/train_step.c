// One full training step (forward, backward, AdamW over trainable tensors) on bench-small,
// micro-batch 8 x seq 256, fp32, against the machine's sgemm ceiling.
//
// usage: train_step [--threads N] [--steps S] [--preset NAME] [--batch B] [--seq T]
// Prints a per-phase profile and machine-readable lines: ours_tok_s=, gflops=,
// sgemm_gflops=, mfu=, peak_rss_mb= (bench/run_all.sh assembles the final line).
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/rng.h"
#include "base/threads.h"
#include "base/timer.h"
#include "model/model.h"
#include "ops/cpu/cpu_ops.h"

// Plain AdamW (decoupled weight decay), enough for a representative step; the trainer's
// optimizer lives in src/train. It zeroes each gradient after using it, so the step needs
// no separate pass to clear the gradient buffer.
typedef struct {
    float *m, *v;
    int64_t step;
} Adam;

static void adamw_step(Model *model, Adam *opt, float lr) {
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    opt->step++;
    const float inv_c1 = 1.0f / (1.0f - powf(b1, (float)opt->step));
    const float inv_c2 = 1.0f / (1.0f - powf(b2, (float)opt->step));
    // One parallel region for all tensors (nowait: no barrier between tensors).
#pragma omp parallel
    for (int i = 0; i < model->table.count; i++) {
        const ParamInfo *p = &model->table.entries[i];
        if (!p->trainable) continue;
        float *restrict w = model_param(model, i), *restrict g = model_grad(model, i);
        float *restrict m = opt->m + p->grad_offset, *restrict v = opt->v + p->grad_offset;
        const float keep = 1.0f - lr * (param_kind_is_norm(p->kind) || p->kind == PARAM_EMBED ? 0.0f : wd);
#pragma omp for schedule(static) nowait
        for (size_t j = 0; j < p->numel; j++) {
            float gj = g[j];
            m[j] = b1 * m[j] + (1 - b1) * gj;
            v[j] = b2 * v[j] + (1 - b2) * gj * gj;
            w[j] = w[j] * keep - lr * (m[j] * inv_c1) / (sqrtf(v[j] * inv_c2) + eps);
            g[j] = 0.0f;
        }
    }
}

static double sgemm_ceiling_gflops(int n) {
    float *a = spes_alloc_aligned((size_t)n * n * sizeof(float));
    float *b = spes_alloc_aligned((size_t)n * n * sizeof(float));
    float *c = spes_alloc_aligned((size_t)n * n * sizeof(float));
    if (!a || !b || !c) return 0.0;
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)((i % 7) * 0.1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);   // warm-up
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double g = 2.0 * n * (double)n * n / (now_seconds() - t0) / 1e9;
        if (g > best) best = g;
    }
    spes_free_aligned(a), spes_free_aligned(b), spes_free_aligned(c);
    return best;
}

int main(int argc, char **argv) {
    op_blas_ensure_fast_kernels(argv);
    int threads = 2, steps = 3, B = 8, T = 256;
    const char *preset = "bench-small";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: train_step [--threads N] [--steps S] [--preset NAME] [--batch B] [--seq T]\n");
            return 2;
        }
    }
    if (threads <= 0 || steps <= 0 || B <= 0 || T <= 0) {
        fprintf(stderr, "train_step: threads, steps, batch and seq must be positive\n");
        return 2;
    }
    threads_set(threads);
    ModelConfig cfg;
    Model model;
    if (model_config_preset(preset, &cfg) != SPES_OK || model_create(&model, &cfg) != SPES_OK) {
        fprintf(stderr, "train_step: %s\n", spes_last_error());
        return 1;
    }
    if (T > cfg.max_seq_len) {
        fprintf(stderr, "train_step: --seq %d exceeds the preset's max_seq_len %d\n", T, cfg.max_seq_len);
        return 2;
    }
    model_init_weights(&model, 1);
    Adam opt = {spes_calloc(model.table.trainable_numel, sizeof(float)),
                spes_calloc(model.table.trainable_numel, sizeof(float)), 0};
    int32_t *inputs = spes_calloc((size_t)B * T, sizeof(int32_t)), *targets = spes_calloc((size_t)B * T, sizeof(int32_t));
    if (!opt.m || !opt.v || !inputs || !targets) {
        fprintf(stderr, "train_step: %s\n", spes_last_error());
        return 1;
    }
    Rng rng;
    rng_seed(&rng, 7);
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
        targets[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
    }
    // SPES config weights, as bench/train_step_torch.py
    LossWeights w = {.lm_z_mult = 1e-5f, .lb_weight = 0.01f, .router_z_weight = 0.001f};

    // one warm-up step (plans activations, faults pages in), then the timed steps
    double times[64], optimizer_seconds = 0.0;
    if (steps > 64) steps = 64;
    LossValues v;
    for (int s = -1; s < steps; s++) {
        if (s == 0) model_phase_reset(&model);
        double t0 = now_seconds();
        if (model_forward_backward(&model, inputs, targets, B, T, &w, 1.0f, &v, NULL) != SPES_OK) {
            fprintf(stderr, "train_step: %s\n", spes_last_error());
            return 1;
        }
        double t_opt = now_seconds();
        adamw_step(&model, &opt, 5e-4f);
        if (s >= 0) {
            times[s] = now_seconds() - t0;
            optimizer_seconds += now_seconds() - t_opt;
        }
    }
    double best = times[0], total = 0.0;
    for (int s = 0; s < steps; s++) {
        total += times[s];
        if (times[s] < best) best = times[s];
    }
    double mean = total / steps;
    double tok_s = (double)B * T / mean;
    double gflops = model_train_flops(&model, B, T) / mean / 1e9;
    double ceiling = sgemm_ceiling_gflops(2048);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);

    printf("OpenBLAS kernels: %s\n", op_blas_core_name());
    printf("%s: B=%d T=%d threads=%d params=%.1fM, %d steps: mean %.3f s, best %.3f s, loss %.4f\n", preset, B, T,
           threads, model.table.total_numel / 1e6, steps, mean, best, v.total);
    double phase[MODEL_PHASE_COUNT], phase_sum = 0.0;
    model_phase_seconds(&model, phase);
    for (int i = 0; i < MODEL_PHASE_COUNT; i++) phase_sum += phase[i];
    printf("profile (per step):\n");
    for (int i = 0; i < MODEL_PHASE_COUNT; i++)
        printf("  %-15s %8.1f ms  %5.1f%%\n", model_phase_name((ModelPhase)i), 1e3 * phase[i] / steps,
               100.0 * phase[i] / (mean * steps));
    printf("  %-15s %8.1f ms  %5.1f%%\n", "AdamW", 1e3 * optimizer_seconds / steps,
           100.0 * optimizer_seconds / (mean * steps));
    double rest = mean * steps - phase_sum - optimizer_seconds;
    printf("  %-15s %8.1f ms  %5.1f%%\n", "other", 1e3 * rest / steps, 100.0 * rest / (mean * steps));
    printf("ours_tok_s=%.1f\n", tok_s);
    printf("gflops=%.1f\n", gflops);
    printf("sgemm_gflops=%.1f\n", ceiling);
    printf("mfu=%.3f\n", ceiling > 0 ? gflops / ceiling : 0.0);
    printf("peak_rss_mb=%.1f\n", ru.ru_maxrss / 1024.0);
    free(opt.m), free(opt.v), free(inputs), free(targets);
    model_free(&model);
    return 0;
}
