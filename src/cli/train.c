// `spes train CONFIG [--a.b=value ...] [--resume] [--force-resume] [--peak_gflops=X] [--save_retry=S[,E]]
//  [--nproc_per_node N]`
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/launch.h"
#include "train/spes_peer.h"
#include "train/spes_ranks.h"
#include "train/trainer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes train CONFIG.yaml [--key.sub=value ...] [--resume] [--force-resume] [--peak_gflops=X]\n"
            "                  [--save_retry=S[,E]] [--nproc_per_node N]\n"
            "\n"
            "Trains from a SPES/OLMo YAML config on token files (data.paths).\n"
            "  --key.sub=value   override any config key, e.g. --optimizer.learning_rate=3e-4 --stop_at=100\n"
            "  --resume          continue from the newest complete save_folder/stepN (as try_load_latest_save)\n"
            "  --force-resume    resume even if the checkpoint was written with a different config hash\n"
            "  --peak_gflops=X   peak GFLOP/s for the MFU column (default: measured sgemm throughput)\n"
            "  --save_retry=S[,E]  a final (or SIGUSR1) save that cannot be written, e.g. on a full disk, is\n"
            "                    retried every E seconds for up to S (default 600,30; 0: not retried). A save\n"
            "                    every save_interval that fails is reported and training goes on\n"
            "  --nproc_per_node N  N ranks on this node (data parallel: distributed_strategy, fsdp.*; started\n"
            "                    through mpirun; `mpirun -np N spes train ...` works too). docs/distributed.md\n"
            "SIGUSR1: save a checkpoint after the current step and train on (a scheduler's warning before a\n"
            "time limit, or a checkpoint on demand; with several ranks rank 0's counts: mpirun passes it on).\n"
            "Ctrl-C (SIGINT) or SIGTERM: finish the current step, save a checkpoint, exit 0; again: abort at once,\n"
            "or, while a failed save waits to retry, stop waiting and exit 1 saying what was lost. A SPES peer\n"
            "whose sync round fails or is interrupted saves its local state marked not synced and exits 1;\n"
            "--resume redoes that round. A signal during the start is kept for the first step boundary (a\n"
            "stop then exits 0 before step 1, nothing trained or saved).\n"
            "Writes save_folder/stepN/ checkpoints and save_folder/metrics.jsonl (docs/training.md).\n");
}

// stop_requested counts SIGINT/SIGTERM; save_waiting is the trainer's: a failed save waits to retry.
static volatile sig_atomic_t stop_requested = 0, save_requested = 0, save_waiting = 0;

static void say(const char *text, size_t len) {
    ssize_t ignored = write(STDERR_FILENO, text, len);
    (void)ignored;
}

// SIGINT / SIGTERM: stop after this step (and save); again: abort at once (the default action),
// unless a failed save waits to retry, whose wait it ends. SIGUSR1: save after this step, train on.
static void on_signal(int sig) {
    static const char stop[] = "\nspes train: stopping after this step (signal again to abort without saving)\n";
    static const char wait[] = "\nspes train: stopping; no more waiting to retry the save\n";
    static const char save[] = "\nspes train: saving a checkpoint after this step (SIGUSR1), then training on\n";
    if (sig == SIGUSR1) {
        save_requested = 1;
        say(save, sizeof save - 1);
        return;
    }
    if (stop_requested && !save_waiting) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        raise(sig);   // blocked in this handler: delivered, with the default action, as it returns
        return;
    }
    stop_requested = stop_requested + 1;   // both stop signals are blocked in here: no lost count
    if (save_waiting) say(wait, sizeof wait - 1);
    else say(stop, sizeof stop - 1);
}

static void install_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    // System calls resume after a signal: one that comes while the config or a token file is read,
    // or a checkpoint written, must not fail that read or write (waits poll the flags).
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    // SIGUSR1's default action ends the process without a save: a scheduler's warning before its
    // time limit (SLURM's --signal=USR1@120) would lose what was trained since the last checkpoint.
    // It may come many times, so the handler stays.
    sigaction(SIGUSR1, &sa, NULL);
    // The console is a log, not the run: with its reader gone (`spes train ... 2>&1 | head`, a log
    // collector that ended) SIGPIPE's default action would end the run unsaved. Ignored,
    // a write there fails with EPIPE, and the lines are counted as lost (base/log.h).
    signal(SIGPIPE, SIG_IGN);
}

// --save_retry=S[,E]: retry for up to S seconds, every E (default SAVE_RETRY_EVERY_S, or S when less).
static int parse_save_retry(const char *v, SaveRetry *r) {
    char *end;
    r->for_s = strtod(v, &end);
    r->every_s = SAVE_RETRY_EVERY_S < r->for_s ? SAVE_RETRY_EVERY_S : r->for_s;
    if (end != v && *end == ',') {
        const char *e = end + 1;
        r->every_s = strtod(e, &end);
        if (end == e || !(r->every_s > 0)) return SPES_ERR;
    }
    return end != v && !*end && r->for_s >= 0 && r->for_s < 1e9 && r->every_s < 1e9 ? SPES_OK : SPES_ERR;
}

// Handshake, then catch up with the run. A checkpoint marked not synced holds the local weights
// of a round that never completed: the peer redoes that round (spes_peer_connect) and saves the
// step again, synced, so the folder ends as an undisturbed run's would. A finished run (resumed at
// its last step) has no round left to sync unless that last one is pending.
static int connect_peer(SpesRanks *peer, Trainer *trainer, const TrainConfig *cfg) {
    TrainState *state = trainer_state(trainer);
    if (spes_peer_saves_sync_state(cfg)) {   // checkpoints carry the delta error feedback (spes_peer.h)
        state->save_extra = spes_ranks_save_state;
        state->save_extra_ctx = peer;
    }
    bool pending = state->unsynced;
    if (trainer_step_count(trainer) >= trainer_max_steps(trainer) && !pending) return SPES_OK;
    SPES_TRY(spes_ranks_connect(peer, trainer_model(trainer), trainer_step_count(trainer), trainer_max_steps(trainer),
                                pending));
    if (!pending) return SPES_OK;
    state->unsynced = false;
    // Unsaved, the not-synced checkpoint stays the newest (resume redoes the round again): train on.
    return trainer_save(trainer, SAVE_ON_INTERVAL);
}

// The round of the current step failed (server gone, refused, or a signal): keep the local work
// of the steps since the last save as a checkpoint marked not synced, keeping the error message.
static void save_unsynced(Trainer *trainer) {
    char why[1024];
    snprintf(why, sizeof why, "%s", spes_last_error());
    int64_t step = trainer_step_count(trainer);
    trainer_state(trainer)->unsynced = true;
    if (trainer_save(trainer, SAVE_FINAL) == SPES_OK)
        log_warn("saved step %lld with this peer's local weights, NOT synced (its round did not complete); "
                 "resume with --resume, which redoes the sync of step %lld", (long long)step, (long long)step);
    else
        log_error("could not save the local state of step %lld: %s", (long long)step, spes_last_error());
    spes_fail("%s", why);
}

int cmd_train(int argc, char **argv) {
    // First thing: a signal while the config loads, the ranks join or the data are checked (minutes
    // on a large corpus) is kept for the first step boundary. SIGUSR1's default action would end
    // the process, and a stop would kill it without a word.
    install_handlers();
    const char *config_path = NULL;
    TrainerOptions opt = {.stop = &stop_requested,
                          .save_now = &save_requested,
                          .save_waiting = &save_waiting,
                          .save_retry = {.for_s = SAVE_RETRY_FOR_S, .every_s = SAVE_RETRY_EVERY_S}};
    int nproc = 1;
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
        } else if (!strncmp(a, "--save_retry=", 13)) {
            if (parse_save_retry(a + 13, &opt.save_retry) != SPES_OK) {
                fprintf(stderr, "spes: --save_retry needs S or S,E: seconds to keep retrying and between tries "
                                "(E > 0), got '%s'\n", a + 13);
                free(overrides);
                return 2;
            }
        } else if (!strcmp(a, "--nproc_per_node") || !strncmp(a, "--nproc_per_node=", 17)) {
            const char *v = a[16] == '=' ? a + 17 : i + 1 < argc ? argv[++i] : "";
            char *end;
            long n = strtol(v, &end, 10);
            if (end == v || *end || n < 1 || n > 4096) {
                fprintf(stderr, "spes: --nproc_per_node needs a number of ranks >= 1, got '%s'\n", v);
                free(overrides);
                return 2;
            }
            nproc = (int)n;
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

    // Several ranks asked for and none started yet: become mpirun, which starts them (each
    // with the same arguments but --nproc_per_node, so each is one rank).
    if (nproc > 1 && !dist_launched()) {
        char **args = calloc((size_t)argc, sizeof *args);
        int n_args = 0;
        for (int i = 0; args && i < argc; i++) {
            if (!strcmp(argv[i], "--nproc_per_node")) i++;
            else if (strncmp(argv[i], "--nproc_per_node=", 17) != 0) args[n_args++] = argv[i];
        }
        if (args) dist_exec_mpirun(nproc, n_args, args);
        fprintf(stderr, "spes: %s\n", args ? spes_last_error() : "out of memory");
        free(args);
        free(overrides);
        return 1;
    }
    Comm *comm = NULL;
    if (dist_check_env() != SPES_OK || comm_init(&comm) != SPES_OK) {
        fprintf(stderr, "spes: %s\n", spes_last_error());
        free(overrides);
        return 1;
    }
    int rank = comm_rank(comm);
    if (rank > 0) log_set_level(LOG_WARN);   // rank 0 speaks for the job; others warn and fail
    opt.comm = comm;

    TrainConfig cfg;
    // Every rank loads the same config (dist_check_config compares them), so its warnings are
    // rank 0's to say; the other ranks still fail with their error.
    if (rank > 0) log_set_level(LOG_ERROR);
    int loaded = config_load(config_path, n_overrides, overrides, &cfg);
    if (rank > 0) log_set_level(LOG_WARN);
    free(overrides);
    // Options outside the config that ranks must share: one resuming alone would start at
    // another step than the others (mismatched collectives).
    char flags[64];
    snprintf(flags, sizeof flags, "--resume=%s\n--force-resume=%s\n", opt.resume ? "true" : "false",
             opt.ignore_config_hash ? "true" : "false");
    if (loaded != SPES_OK || dist_check_config(comm, &cfg, flags) != SPES_OK) {
        if (comm_is_multi(comm)) fprintf(stderr, "spes: rank %d of %d: %s\n", rank, comm_size(comm), spes_last_error());
        else fprintf(stderr, "spes: %s\n", spes_last_error());
        fflush(stderr);
        // dist_check_config fails on every rank at once: each says why before any ends the job.
        if (loaded == SPES_OK) comm_barrier(comm), config_free(&cfg);
        comm_abort(comm, 1);
        comm_finalize(comm);
        return 1;
    }
    Trainer *trainer = NULL;
    SpesRanks *peer = NULL;
    int rc = SPES_OK;
    // A SPES (or fedavg) peer: sync with the parameter server after every sync_steps steps.
    if (cfg.using_spes || cfg.using_dilico) {
        if (cfg.take_over_peer_id >= 0) cfg.peer_id = cfg.take_over_peer_id;   // failover: see spes_peer.h
        rc = spes_ranks_create(&cfg, comm, &peer);
        if (rc == SPES_OK) {
            opt.after_step = spes_ranks_after_step;
            opt.after_step_touches_model = spes_ranks_step_touches_model;
            opt.after_step_ctx = peer;
            opt.on_metrics = spes_ranks_note_metrics;   // reported to the server with each upload
            opt.on_metrics_ctx = peer;
            opt.lb_count_factor = spes_ranks_lb_count_factor(peer);
            spes_ranks_set_stop_flag(peer, &stop_requested);
        }
    }
    if (rc == SPES_OK) rc = trainer_create(&cfg, &opt, &trainer);
    if (rc == SPES_OK && peer) rc = connect_peer(peer, trainer, &cfg);
    else if (rc == SPES_OK && trainer_state(trainer)->unsynced) {
        log_warn("the checkpoint resumed from was not synced with a parameter server; training on without one");
        trainer_state(trainer)->unsynced = false;
    }
    if (rc == SPES_OK) rc = trainer_run(trainer);
    if (rc != SPES_OK && peer && spes_ranks_unsynced_step(peer) >= 0 &&
        spes_ranks_unsynced_step(peer) == trainer_step_count(trainer))
        save_unsynced(trainer);
    if (rc != SPES_OK && comm_is_multi(comm)) {
        // One failing rank ends the job: the others may be waiting in a collective for it.
        fprintf(stderr, "spes: rank %d of %d: %s\n", rank, comm_size(comm), spes_last_error());
        fflush(stderr);
        comm_abort(comm, 1);
    } else if (rc != SPES_OK) {
        fprintf(stderr, "spes: %s\n", spes_last_error());
    } else if (stop_requested && trainer_step_count(trainer) > 0) {
        log_info("stopped by signal at step %lld; resume with --resume", (long long)trainer_step_count(trainer));
    }
    trainer_free(trainer);
    spes_ranks_free(peer);
    config_free(&cfg);
    comm_finalize(comm);
    log_report_lost();
    return rc == SPES_OK ? 0 : 1;
}
