// `spes plan CONFIG [--key.sub=value ...] [--gpus N] [--device_memory 48GB] [--link_gbps X]
//  [--mfu X] [--peak_tflops X] [--rounds R] [--json]`: what a run needs before it starts.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bytes_text.h"
#include "base/error.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "config/config.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "train/plan_print.h"
#include "train/save_space.h"
#include "train/plan_sync.h"
#include "train/spes_peer.h"

// The README's bench-gpu figures (1B SPES config, 8 x 2048, amp_bf16, on an H200, 2026-11-28): MFU 0.322
// of the 989 TFLOP/s bf16 dense peak of an H100/H200.
#define DEFAULT_MFU 0.322
#define DEFAULT_PEAK_TFLOPS 989.0

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes plan CONFIG.yaml [--key.sub=value ...] [--gpus N] [--device_memory SIZE] [--link_gbps X]\n"
            "                 [--mfu X] [--peak_tflops X] [--rounds R] [--json]\n"
            "\n"
            "What a training run needs before it starts, from the config as `spes train` reads it (same overrides,\n"
            "same checks): parameters; memory per rank for its strategy and every other one (fp32 master, compute\n"
            "copy, gradients, AdamW moments, activations by activation_checkpointing, working buffers, peak);\n"
            "the largest micro-batch that fits; sync bytes per round for each payload_dtype; FLOPs and time.\n"
            "  --gpus N            ranks (GPUs) of the node, as --nproc_per_node (default 1)\n"
            "  --device_memory S   memory of one GPU (or the host, device: cpu): 48GB, 80GiB, 24e9 (default: none)\n"
            "  --link_gbps X       the peer's link to the server, Gbit/s, for transfer times (default 1)\n"
            "  --mfu X             model FLOPs utilisation for step times (default %.3f: bench-gpu on an H200)\n"
            "  --peak_tflops X     the GPU's peak, TFLOP/s (default %.0f: H100/H200 bf16 dense)\n"
            "  --rounds R          also the server's byte counters after R rounds (default: the run's rounds)\n"
            "  --json              one JSON object instead of the text\n"
            "device: cpu plans the cpu backend (fp32); any other device plans a GPU in the precision's compute type.\n"
            "docs/plan.md says what each figure counts.\n",
            DEFAULT_MFU, DEFAULT_PEAK_TFLOPS);
}

// "48GB", "80GiB", "48G", "4.5e10": bytes. Decimal units (KB, MB, GB, TB, and K, M, G, T),
// binary ones (KiB, MiB, GiB, TiB); a bare number is bytes.
static int parse_size(const char *text, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || !(v > 0))
        return spes_fail("--device_memory: '%s' is not a size (e.g. 48GB, 80GiB)", text);
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},          {"B", 1},          {"K", 1e3},        {"KB", 1e3},       {"M", 1e6},
                 {"MB", 1e6},      {"G", 1e9},        {"GB", 1e9},       {"T", 1e12},       {"TB", 1e12},
                 {"KiB", 1024.0},  {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].unit) == 0) {
            *out = (size_t)(v * units[i].scale);
            return SPES_OK;
        }
    return spes_fail("--device_memory: unknown unit '%s' in '%s' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", end, text);
}

typedef struct {
    const char *config;
    int gpus, rounds;
    size_t device_memory;    // 0: not given
    const char *device_memory_text;   // as given
    double link_gbps, mfu, peak_tflops;
    bool json;
} Opts;

typedef struct {
    const char *what;        // the change, as config keys
    size_t peak;
    bool fits;
} Option;

// What to change when micro-batch 1 does not fit: each change alone and together, and ZeRO-3
// over the fewest ranks (up to 64) where it fits. Under ZeRO-3 every rank still holds the frozen
// tensors and, at checkpoints and SPES syncs, the full parameters (plan.h's boundary), so more
// ranks stop helping once those dominate.
static int options_when_nothing_fits(const TrainConfig *cfg, const PlanTarget *base, size_t budget, Option *opts,
                                     int *n) {
    *n = 0;
    PlanTarget t;
    Plan p;
    static char zero3_text[96], zero3_all_text[160];
#define TRY(text, setup)                                                                 \
    do {                                                                                 \
        t = *base;                                                                       \
        t.micro_batch = 1;                                                               \
        setup;                                                                           \
        SPES_TRY(plan_compute(cfg, &t, &p));                                             \
        opts[(*n)++] = (Option){(text), p.mem.peak, p.mem.peak <= budget};                \
    } while (0)
    if (base->micro_batch > 1) TRY("device_train_microbatch_size: 1", (void)0);
    if (base->checkpointing != 2) TRY("activation_checkpointing: whole_layer", t.checkpointing = 2);
    if (!base->cpu_offload) TRY("optimizer.cpu_offload: true", t.cpu_offload = true);
    TRY("activation_checkpointing: whole_layer + optimizer.cpu_offload: true",
        (t.checkpointing = 2, t.cpu_offload = true));
    int k = base->ranks > 1 ? base->ranks : 2;
    for (; k < 64; k *= 2) {
        t = *base;
        t.micro_batch = 1, t.strategy = PLAN_ZERO3, t.ranks = k;
        SPES_TRY(plan_compute(cfg, &t, &p));
        if (p.mem.peak <= budget) break;
    }
    snprintf(zero3_text, sizeof zero3_text, "fsdp.sharding_strategy: FULL_SHARD over %d GPUs (--gpus %d)", k, k);
    TRY(zero3_text, (t.strategy = PLAN_ZERO3, t.ranks = k));
    snprintf(zero3_all_text, sizeof zero3_all_text, "FULL_SHARD over %d GPUs + whole_layer + cpu_offload", k);
    TRY(zero3_all_text, (t.checkpointing = 2, t.cpu_offload = true, t.strategy = PLAN_ZERO3, t.ranks = k));
#undef TRY
    return SPES_OK;
}

static double gib(size_t b) { return (double)b / 1073741824.0; }

// Seconds of one optimizer step on one rank at the given MFU (its share of the global batch).
static double step_seconds(const TrainConfig *cfg, const Plan *p, const Opts *o) {
    double tokens = (double)cfg->global_train_batch_size * p->target.seq_len / p->target.ranks;
    return p->flops_per_token * tokens / (o->mfu * o->peak_tflops * 1e12);
}

// Steps the run trains when max_duration counts steps (stop_at when it comes first); -1 when
// the length depends on the data (tokens or epochs).
static int64_t run_length_steps(const TrainConfig *cfg) {
    return cfg->max_duration_unit == DURATION_STEPS ? config_last_step(cfg, cfg->max_duration) : -1;
}

// The checkpoints' line: one's bytes on disk, and over a run of known length the saves and the
// most the save_folder holds at once (train/save_space.h: what `spes train` checks at start).
static void print_checkpoints(const TrainConfig *cfg, const Plan *plan, int64_t run_steps, int64_t saves,
                              size_t folder_bytes) {
    int keep = cfg->save_num_unsharded_checkpoints_to_keep;
    char each[24], most[24];
    printf("checkpoints: %s each on disk (model, AdamW moments%s)", bytes_text(plan->checkpoint_bytes, each, sizeof each),
           spes_peer_saves_sync_state(cfg) ? ", sync state" : "");
    if (saves < 0) {   // keeping k: k + 1 while a save runs
        if (keep > 0)
            printf("; keeping %d: save_folder holds up to %s\n", keep,
                   bytes_text((size_t)(keep + 1) * plan->checkpoint_bytes, most, sizeof most));
        else
            printf("; keeping all (how many the run saves depends on its data)\n");
        return;
    }
    if (cfg->save_interval_unsharded > 0)
        printf("; %lld saves in %lld steps (every %lld steps and at the end)", (long long)saves, (long long)run_steps,
               (long long)cfg->save_interval_unsharded);
    else
        printf("; the final save alone");
    if (keep > 0) printf(", keeping %d", keep);
    else printf(", keeping all");
    printf(": save_folder holds up to %s\n", bytes_text(folder_bytes, most, sizeof most));
}

static int run(const Opts *o, TrainConfig *cfg) {
    const bool gpu = strcmp(cfg->device, "cpu") != 0;
    PlanTarget target;
    Plan plan;
    SPES_TRY(plan_target_from_config(cfg, o->gpus, gpu, &target));
    SPES_TRY(plan_compute(cfg, &target, &plan));
    // The largest micro-batch by checkpointing mode, when a memory size is given.
    int best[3] = {0, 0, 0};
    Option opts[8];   // options_when_nothing_fits: 6 at most
    int n_opts = 0;
    if (o->device_memory) {
        for (int k = 0; k < 3; k++) {
            PlanTarget t = target;
            t.checkpointing = k;
            SPES_TRY(plan_max_micro_batch(cfg, &t, o->device_memory, cfg->global_train_batch_size, &best[k]));
        }
        if (best[target.checkpointing] == 0)
            SPES_TRY(options_when_nothing_fits(cfg, &target, o->device_memory, opts, &n_opts));
    }
    const bool spes = cfg->using_spes || cfg->using_dilico;
    PlanSync sync[4];
    size_t run_in[4] = {0}, run_out[4] = {0};
    int rounds = o->rounds;
    if (rounds < 0 && run_length_steps(cfg) > 0 && cfg->sync_steps > 0)
        rounds = (int)(run_length_steps(cfg) / cfg->sync_steps);
    for (int d = 0; spes && d < 4; d++) {
        SPES_TRY(plan_sync(cfg, (PayloadDtype)d, (int)cfg->sync_steps, &sync[d]));
        if (rounds > 0) SPES_TRY(plan_sync_run(cfg, (PayloadDtype)d, rounds, &run_in[d], &run_out[d]));
    }
    const double step_s = gpu ? step_seconds(cfg, &plan, o) : 0, link = o->link_gbps * 1e9 / 8;
    const PlanParams *pp = &plan.params;
    // Checkpoints on disk over a fresh run (the length known when max_duration is in steps).
    int64_t run_steps = run_length_steps(cfg);
    int64_t saves = run_steps > 0 ? save_space_saves_left(0, run_steps, cfg->save_interval_unsharded) : -1;
    size_t folder_bytes = saves > 0 ? save_space_needed(plan.checkpoint_bytes, cfg->save_num_unsharded_checkpoints_to_keep,
                                                        0, saves)
                                    : 0;

    if (o->json) {
        printf("{\"config\": \"%s\", \"params\": {\"total\": %zu, \"active\": %zu, \"trainable\": %zu, \"frozen\": %zu}, ",
               o->config, pp->total, pp->active, pp->trainable, pp->frozen);
        printf("\"target\": {\"gpu\": %s, \"compute\": \"%s\", \"ranks\": %d, \"strategy\": \"%s\", \"micro_batch\": %d, "
               "\"seq_len\": %d, \"activation_checkpointing\": \"%s\", \"cpu_offload\": %s}, ",
               gpu ? "true" : "false", num_type_name(target.compute), target.ranks, plan_strategy_name(target.strategy),
               target.micro_batch, target.seq_len, plan_checkpointing_name(target.checkpointing),
               target.cpu_offload ? "true" : "false");
        printf("\"memory\": ");
        plan_print_json_memory(stdout, &plan.mem);
        printf(", \"strategies\": {");
        for (int s = 0; s < PLAN_STRATEGY_COUNT; s++) {
            PlanTarget t = target;
            Plan p;
            t.strategy = (PlanStrategy)s;
            t.ranks = s == PLAN_SINGLE ? 1 : target.ranks > 1 ? target.ranks : 2;
            SPES_TRY(plan_compute(cfg, &t, &p));
            printf("%s\"%s\": {\"ranks\": %d, \"memory\": ", s ? ", " : "", plan_strategy_name(t.strategy), t.ranks);
            plan_print_json_memory(stdout, &p.mem);
            printf("}");
        }
        printf("}");
        if (o->device_memory)
            printf(", \"fits\": {\"device_memory\": %zu, \"fits\": %s, \"max_micro_batch\": {\"none\": %d, "
                   "\"fine_grained\": %d, \"whole_layer\": %d}}",
                   o->device_memory, plan.mem.peak <= o->device_memory ? "true" : "false", best[0], best[1], best[2]);
        printf(", \"checkpoint\": {\"bytes\": %zu", plan.checkpoint_bytes);
        if (saves >= 0) printf(", \"saves\": %lld, \"save_folder_bytes\": %zu", (long long)saves, folder_bytes);
        printf("}, \"flops_per_token\": %.6g", plan.flops_per_token);
        if (gpu) printf(", \"step_seconds\": %.6g, \"mfu\": %g, \"peak_tflops\": %g", step_s, o->mfu, o->peak_tflops);
        if (spes) {
            printf(", \"sync\": {\"sync_steps\": %lld, \"peers\": %d, \"rounds\": %d", (long long)cfg->sync_steps,
                   sync[0].peers, rounds);
            for (int d = 0; d < 4; d++)
                printf(", \"%s\": {\"up_first\": %zu, \"down_first\": %zu, \"up\": %zu, \"down\": %zu, \"egress_first\": "
                       "%zu, \"egress\": %zu, \"upper_bound\": %s, \"run_bytes_in\": %zu, \"run_bytes_out\": %zu}",
                       plan_payload_name((PayloadDtype)d), sync[d].up_first, sync[d].down_first, sync[d].up,
                       sync[d].down, sync[d].egress_first, sync[d].egress, sync[d].upper_bound ? "true" : "false",
                       run_in[d], run_out[d]);
            printf("}");
        }
        printf("}\n");
        return SPES_OK;
    }

    printf("spes plan: %s\n", o->config);
    int first = 0, last = 0;
    if (cfg->using_spes && !cfg->using_dilico) SPES_TRY(trainer_own_experts(cfg, cfg->model.num_experts, &first, &last));
    printf("parameters: %.3fB total; %.3fB active per token (top-%d of %d experts); %.3fB trainable on this peer",
           pp->total / 1e9, pp->active / 1e9, cfg->model.top_k, cfg->model.num_experts, pp->trainable / 1e9);
    if (cfg->using_spes && !cfg->using_dilico)
        printf(" (shared + experts %d..%d of each layer), %.3fB frozen\n", first, last, pp->frozen / 1e9);
    else
        printf(" (every tensor), %.3fB frozen\n", pp->frozen / 1e9);
    printf("run: %s, %d rank%s, strategy %s; global batch %d in micro-batches of %d x %d tokens\n",
           gpu ? "GPU" : "cpu backend", target.ranks, target.ranks == 1 ? "" : "s", plan_strategy_name(target.strategy),
           cfg->global_train_batch_size, target.micro_batch, target.seq_len);
    plan_print_memory(stdout, cfg, &plan);
    if (o->device_memory) {
        printf("fits %s (%.2f GiB): %s (peak %.2f GiB = %.2f GB)", o->device_memory_text, gib(o->device_memory),
               plan.mem.peak <= o->device_memory ? "YES" : "NO", gib(plan.mem.peak), plan.mem.peak / 1e9);
        printf("; largest micro-batch that fits: %d (none), %d (fine_grained), %d (whole_layer)\n", best[0], best[1],
               best[2]);
        if (n_opts) {
            printf("nothing fits at micro-batch 1 with these settings; what to change (peak per rank at micro-batch 1):\n");
            for (int i = 0; i < n_opts; i++)
                printf("  %-72s %8.2f GiB  %s\n", opts[i].what, gib(opts[i].peak), opts[i].fits ? "fits" : "does not fit");
        } else if (best[target.checkpointing] < target.micro_batch) {
            printf("the config's micro-batch %d does not fit: set device_train_microbatch_size to %d (or less)\n",
                   target.micro_batch, best[target.checkpointing]);
        }
    }
    printf("compute: %.3f GFLOP per token (training: forward + backward, dW for trainable tensors only)\n",
           plan.flops_per_token / 1e9);
    if (gpu)
        printf("  at MFU %.3f of %.0f TFLOP/s: %.3f s per step (%d x %d tokens per rank)\n", o->mfu, o->peak_tflops,
               step_s, cfg->global_train_batch_size / target.ranks, target.seq_len);
    print_checkpoints(cfg, &plan, run_steps, saves, folder_bytes);
    if (!spes) return SPES_OK;
    const double round_s = step_s * (double)cfg->sync_steps;
    printf("sync every %lld steps with %d peers; bytes per round for peer %d (server egress: every peer's download):\n",
           (long long)cfg->sync_steps, sync[0].peers, cfg->peer_id);
    if (sync[0].peers < cfg->num_peers)
        printf("  (num_peers %d, but only %d peers' experts exist: %d experts, %d per peer)\n", cfg->num_peers,
               sync[0].peers, cfg->model.num_experts, cfg->num_train_experts_per_node);
    printf("  %-5s %11s %11s %11s %11s %13s %13s %10s %s\n", "dtype", "up", "down", "up 1st", "down 1st", "egress",
           "egress 1st", "link s", gpu ? "GB/hour up+down" : "");
    for (int d = 0; d < 4; d++) {
        const PlanSync *s = &sync[d];
        printf("  %-5s %9.2fMB %9.2fMB %9.2fMB %9.2fMB %11.2fMB %11.2fMB %10.2f", plan_payload_name((PayloadDtype)d),
               s->up / 1e6, s->down / 1e6, s->up_first / 1e6, s->down_first / 1e6, s->egress / 1e6,
               s->egress_first / 1e6, (double)(s->up + s->down) / link);
        const double bytes = (double)(s->up + s->down);   // a round: its steps, then up + down on the link
        if (gpu && round_s > 0) printf(" %10.2f", bytes * 3600.0 / (round_s + bytes / link) / 1e9);
        printf("%s\n", s->upper_bound ? "  (int4: at most; zstd took ~24% off in docs/communication.md's runs)" : "");
    }
    printf("  link s: up + down at %.3g Gbit/s%s", o->link_gbps,
           gpu && round_s > 0 ? "; GB/hour: per peer, rounds of sync_steps steps at the MFU above plus the transfer\n" : "\n");
    if (rounds > 0) {
        printf("  server counters after %d rounds (bytes in / out):", rounds);
        for (int d = 0; d < 4; d++)
            printf(" %s %zu / %zu%s", plan_payload_name((PayloadDtype)d), run_in[d], run_out[d], d < 3 ? ";" : "\n");
    }
    return SPES_OK;
}

int cmd_plan(int argc, char **argv) {
    Opts o = {.gpus = 1, .rounds = -1, .link_gbps = 1.0, .mfu = DEFAULT_MFU, .peak_tflops = DEFAULT_PEAK_TFLOPS};
    char **overrides = calloc((size_t)argc + 1, sizeof *overrides);
    int n_overrides = 0, rc = SPES_OK;
    if (!overrides) return cli_report_error();
    // Our flags, with their value as the next word or after '='; anything else starting with
    // "--" is a config override (as `spes train` takes them).
    for (int i = 1; rc == SPES_OK && i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(overrides);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            o.json = true;
            continue;
        }
        static const char *const flags[] = {"--gpus", "--device_memory", "--link_gbps",
                                            "--mfu",  "--peak_tflops",   "--rounds"};
        int f = -1;
        const char *v = NULL;
        for (int k = 0; k < 6 && f < 0; k++) {
            size_t len = strlen(flags[k]);
            if (!strncmp(a, flags[k], len) && (a[len] == '=' || a[len] == '\0')) {
                f = k;
                v = a[len] == '=' ? a + len + 1 : i + 1 < argc ? argv[++i] : NULL;
            }
        }
        if (f >= 0 && !v) {
            rc = spes_fail("%s needs a value", flags[f]);
        } else if (f == 0) {
            rc = cli_int("gpus", v, 1, 4096, &o.gpus);
        } else if (f == 1) {
            rc = parse_size(v, &o.device_memory);
            o.device_memory_text = v;
        } else if (f >= 2 && f <= 4) {
            float x;
            rc = cli_float(flags[f], v, 1e-9, 1e9, &x);
            if (rc == SPES_OK && f == 3 && x > 1) rc = spes_fail("--mfu: %s is not a fraction in (0, 1]", v);
            if (rc == SPES_OK) *(f == 2 ? &o.link_gbps : f == 3 ? &o.mfu : &o.peak_tflops) = x;
        } else if (f == 5) {
            rc = cli_int("rounds", v, 0, 1 << 30, &o.rounds);
        } else if (!strncmp(a, "--", 2)) {
            overrides[n_overrides++] = argv[i];   // "--a.b=v", or "--a.b" followed by its value
            if (!strchr(a, '=') && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) overrides[n_overrides++] = argv[++i];
        } else if (!o.config) {
            o.config = a;
        } else {
            rc = spes_fail("unexpected argument '%s' (one CONFIG file; overrides look like --a.b=value)", a);
        }
    }
    if (rc == SPES_OK && !o.config) {
        usage(stderr);
        free(overrides);
        return 2;
    }
    TrainConfig cfg;
    if (rc == SPES_OK) rc = config_load(o.config, n_overrides, overrides, &cfg);
    free(overrides);
    if (rc != SPES_OK) return cli_report_error();
    rc = run(&o, &cfg);
    config_free(&cfg);
    return rc == SPES_OK ? 0 : cli_report_error();
}
