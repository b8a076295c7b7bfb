// Per-peer peak memory of one training step with m of E experts trainable (a SPES peer)
// against every tensor trainable (plain / DiLiCo training), on a model where experts dominate:
// bench-small's attention (d_model 512, 8 heads) with E=16 experts of hidden 2048, 2 layers,
// vocab 1024; micro-batch 4 x seq 256.
//
// Each variant runs in its own forked child (so one's peak cannot hide the other's): create
// the model, set the trainable mask, AdamW state, one forward+backward, one AdamW update,
// then getrusage(RUSAGE_SELF).ru_maxrss.
//
// Theory, per variant, from the parameter table (floats are 4 bytes):
//   bytes = 4 * (P + 3*T) + A
//   P = all parameters, T = trainable parameters (gradient + AdamW m + v each),
//   A = the activation arena the model plans for (B, T) (identical in both variants: frozen
//       experts still need their activations for dX, they only skip dW).
// theory_ratio = bytes(spes) / bytes(all); measured_ratio = peak_rss(spes) / peak_rss(all).
// The measured peaks also hold what the child itself touches besides these buffers (code,
// library pages, OpenBLAS/OpenMP buffers, the logits row block): a few MB here.
// model_create allocates the full gradient buffer before the trainable mask shrinks it;
// large aligned blocks are lazily mapped (src/base/alloc.c), so that buffer is never
// resident: with --experts-per-peer 1, 702 MB measured vs 697 MB theory (it was 794 MB,
// +14%, when the buffer was zeroed eagerly).
//
// usage: spes_memory [--experts-per-peer M] [--threads N]
// Last line: spes-memory: spes_mb=<x> all_trainable_mb=<x> theory_ratio=<x> measured_ratio=<x>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/rng.h"
#include "base/threads.h"
#include "model/model.h"
#include "model/model_internal.h"   // the activation arena's size, for the theory column
#include "train/optimizer.h"

enum { BATCH = 4, SEQ = 256 };

typedef struct {
    double peak_mb;        // ru_maxrss at the end of the step
    double theory_mb;      // 4*(P + 3T) + A
    size_t params, trainable, act_bytes;
    double loss;
    int ok;
} VariantResult;

static int bench_config(ModelConfig *cfg) {
    SPES_TRY(model_config_preset("bench-small", cfg));
    cfg->n_layers = 2;
    cfg->num_experts = 16;
    cfg->top_k = 2;
    cfg->expert_hidden = 2048;
    cfg->vocab_size = 1024;
    cfg->embedding_size = 1024;
    cfg->max_seq_len = SEQ;
    return model_config_validate(cfg);
}

static double max_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;   // kilobytes on Linux
}

// The child's work: one real training step. experts_per_peer <= 0: everything trainable.
static int run_variant(int experts_per_peer, VariantResult *r) {
    ModelConfig cfg;
    Model m;
    AdamW opt;
    SPES_TRY(bench_config(&cfg));
    SPES_TRY(model_create(&m, &cfg));
    model_init_weights(&m, 1);
    if (experts_per_peer > 0 && model_set_trainable_experts(&m, 0, experts_per_peer - 1) != SPES_OK) return SPES_ERR;
    AdamWConfig acfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    SPES_TRY(adamw_create(&opt, &m.table, &acfg));
    int32_t *inputs = spes_malloc(sizeof(int32_t) * BATCH * SEQ), *targets = spes_malloc(sizeof(int32_t) * BATCH * SEQ);
    if (!inputs || !targets) return SPES_ERR;
    Rng rng;
    rng_seed(&rng, 7);
    for (int i = 0; i < BATCH * SEQ; i++) {
        inputs[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
        targets[i] = (int32_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
    }
    LossWeights w = {.lm_z_mult = 1e-4f, .lb_weight = 0.01f, .router_z_weight = 0.001f};
    LossValues loss;
    SPES_TRY(model_forward_backward(&m, inputs, targets, BATCH, SEQ, &w, 1.0f, &loss, NULL));
    adamw_step(&opt, &m.table, m.params, m.grads, 1.0f, (Buf){0}, 4e-4);
    r->peak_mb = max_rss_mb();
    r->params = m.table.total_numel;
    r->trainable = m.table.trainable_numel;
    r->act_bytes = m.acts->arena_bytes;
    r->theory_mb = (4.0 * ((double)r->params + 3.0 * (double)r->trainable) + (double)r->act_bytes) / (1024.0 * 1024.0);
    r->loss = loss.total;
    r->ok = 1;
    return SPES_OK;
}

// Forks a child for one variant; its result comes back through a pipe.
static int measure(int experts_per_peer, VariantResult *r) {
    memset(r, 0, sizeof *r);
    int fds[2];
    if (pipe(fds) != 0) return spes_fail("pipe failed");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return spes_fail("fork failed");
    if (pid == 0) {
        close(fds[0]);
        VariantResult mine = {0};
        if (run_variant(experts_per_peer, &mine) != SPES_OK) fprintf(stderr, "spes_memory: %s\n", spes_last_error());
        ssize_t n = write(fds[1], &mine, sizeof mine);
        _exit(n == (ssize_t)sizeof mine && mine.ok ? 0 : 1);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], r, sizeof *r);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (n != (ssize_t)sizeof *r || !r->ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return spes_fail("the %s child failed", experts_per_peer > 0 ? "spes" : "all-trainable");
    return SPES_OK;
}

static void print_variant(const char *name, const VariantResult *r) {
    printf("%-14s params=%zu trainable=%zu activations_mb=%.1f theory_mb=%.1f peak_rss_mb=%.1f "
           "loss=%.4f\n",
           name, r->params, r->trainable, r->act_bytes / (1024.0 * 1024.0), r->theory_mb, r->peak_mb, r->loss);
}

int main(int argc, char **argv) {
    int experts_per_peer = 4, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--experts-per-peer") && i + 1 < argc) experts_per_peer = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: spes_memory [--experts-per-peer M] [--threads N]\n");
            return 2;
        }
    }
    if (experts_per_peer < 1 || experts_per_peer > 16) {
        fprintf(stderr, "spes_memory: --experts-per-peer must be 1..16\n");
        return 2;
    }
    threads_set(threads);
    printf("model: d_model 512, 2 layers, E=16 (expert hidden 2048, top-2), vocab 1024; batch %d x seq %d; "
           "spes peer trains %d of 16 experts\n", BATCH, SEQ, experts_per_peer);
    printf("theory per variant: 4 bytes * (params + 3 * trainable) + activation arena\n");
    VariantResult spes, all;
    if (measure(experts_per_peer, &spes) != SPES_OK || measure(0, &all) != SPES_OK) {
        fprintf(stderr, "spes_memory: %s\n", spes_last_error());
        return 1;
    }
    print_variant("spes", &spes);
    print_variant("all-trainable", &all);
    printf("spes-memory: spes_mb=%.1f all_trainable_mb=%.1f theory_ratio=%.3f measured_ratio=%.3f\n", spes.peak_mb,
           all.peak_mb, spes.theory_mb / all.theory_mb, spes.peak_mb / all.peak_mb);
    return 0;
}
