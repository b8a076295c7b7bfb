// `spes train CONFIG [--a.b=value ...] [--resume] [--force-resume] [--peak_gflops=X]`
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "config/config.h"
#include "train/spes_peer.h"
#include "train/trainer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes train CONFIG.yaml [--key.sub=value ...] [--resume] [--force-resume] [--peak_gflops=X]\n"
            "\n"
            "Trains from a SPES/OLMo YAML config on token files (data.paths).\n"
            "  --key.sub=value   override any config key, e.g. --optimizer.learning_rate=3e-4 --stop_at=100\n"
            "  --resume          continue from the newest complete save_folder/stepN (as try_load_latest_save)\n"
            "  --force-resume    resume even if the checkpoint was written with a different config hash\n"
            "  --peak_gflops=X   peak GFLOP/s for the MFU column (default: measured sgemm throughput)\n"
            "Ctrl-C (SIGINT) or SIGTERM: finish the current step, save a checkpoint, exit 0.\n"
            "Writes save_folder/stepN/ checkpoints and save_folder/metrics.jsonl (docs/training.md).\n");
}

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
    static const char msg[] = "\nspes train: stopping after this step (signal again to abort without saving)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
}

static void install_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;   // a second signal gets the default action: immediate exit
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int cmd_train(int argc, char **argv) {
    const char *config_path = NULL;
    TrainerOptions opt = {.stop = &stop_requested};
    char **overrides = calloc((size_t)argc, sizeof *overrides);
    int n_overrides = 0;
    if (!overrides) {
        fprintf(stderr, "spes: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(overrides);
            return 0;
        } else if (!strcmp(a, "--resume")) {
            opt.resume = true;
        } else if (!strcmp(a, "--force-resume")) {
            opt.resume = opt.ignore_config_hash = true;
        } else if (!strncmp(a, "--peak_gflops=", 14)) {
            char *end;
            opt.peak_flops = strtod(a + 14, &end) * 1e9;
            if (end == a + 14 || *end || !(opt.peak_flops > 0)) {
                fprintf(stderr, "spes: --peak_gflops needs a positive number, got '%s'\n", a + 14);
                free(overrides);
                return 2;
            }
        } else if (!strncmp(a, "--", 2)) {
            overrides[n_overrides++] = argv[i];   // "--a.b=v", or "--a.b" followed by its value
            if (!strchr(a, '=') && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                overrides[n_overrides++] = argv[++i];
        } else if (!config_path) {
            config_path = a;
        } else {
            fprintf(stderr, "spes: unexpected argument '%s' (one CONFIG file; overrides look like --a.b=value)\n", a);
            free(overrides);
            return 2;
        }
    }
    if (!config_path) {
        usage(stderr);
        free(overrides);
        return 2;
    }

    TrainConfig cfg;
    if (config_load(config_path, n_overrides, overrides, &cfg) != SPES_OK) {
        fprintf(stderr, "spes: %s\n", spes_last_error());
        free(overrides);
        return 1;
    }
    free(overrides);
    Trainer *trainer = NULL;
    SpesPeer *peer = NULL;
    install_handlers();
    int rc = SPES_OK;
    // A SPES (or fedavg) peer: sync with the parameter server after every sync_steps steps.
    if (cfg.using_spes || cfg.using_dilico) {
        if (cfg.take_over_peer_id >= 0) cfg.peer_id = cfg.take_over_peer_id;   // failover: see spes_peer.h
        rc = spes_peer_create(&cfg, &peer);
        if (rc == SPES_OK) {
            opt.after_step = spes_peer_after_step;
            opt.after_step_ctx = peer;
            opt.lb_count_factor = spes_peer_lb_count_factor(peer);
        }
    }
    if (rc == SPES_OK) rc = trainer_create(&cfg, &opt, &trainer);
    // A finished run (resumed at its last step) has no round left to sync.
    if (rc == SPES_OK && peer && trainer_step_count(trainer) < trainer_max_steps(trainer))
        rc = spes_peer_connect(peer, trainer_model(trainer), trainer_step_count(trainer), trainer_max_steps(trainer));
    if (rc == SPES_OK) rc = trainer_run(trainer);
    if (rc != SPES_OK) fprintf(stderr, "spes: %s\n", spes_last_error());
    else if (stop_requested) log_info("stopped by signal at step %lld; resume with --resume", (long long)trainer_step_count(trainer));
    trainer_free(trainer);
    spes_peer_free(peer);
    config_free(&cfg);
    return rc == SPES_OK ? 0 : 1;
}
