// `spes server`: the SPES parameter server (gRPC). Runs until SIGINT or SIGTERM (SIGUSR1 is answered).
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "config/config.h"
#include "status/status_http.h"
#include "sync/auth.h"
#include "server/server.h"
#include "sync/wire.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes server --total_peers P [options]\n"
            "\n"
            "Parameter server: peers upload their trainable tensors every sync_steps, the server\n"
            "aggregates when all P peers uploaded a step, peers download the aggregate.\n"
            "\n"
            "  --total_peers P                  number of peers (required)\n"
            "  --num_train_experts_per_node M   experts each peer owns; P*M = experts per layer (spes mode), or a\n"
            "                                   multiple of them: each expert then has several owners, averaged\n"
            "  --mode spes|fedavg               spes: owners' experts + mean of shared; fedavg: mean of all (default "
            "spes)\n"
            "  --host ADDR                      address to bind (default 0.0.0.0)\n"
            "  --port N                         port (default 50051; 0: any free port, printed at start)\n"
            "  --merge_interval N               expert-merging warm-up every N steps (default 0: never)\n"
            "  --merge_alpha_start A            merge strength at step 0, in [0, 1] (default 0)\n"
            "  --merge_decay_steps N            alpha decays linearly to 0 at step N (default 1000)\n"
            "  --merge_topk K                   merge each expert with its K most similar (default 4)\n"
            "  --expert_rotation_steps N        every N steps move each layer's experts one peer on, so that every\n"
            "                                   peer trains every expert in turn (default 0: fixed owners)\n"
            "  --keep_steps N                   aggregates kept for download (default 2)\n"
            "  --chunk_size BYTES               download chunk payload (default %zu)\n"
            "  --max_message_size BYTES         largest gRPC message (default %zu)\n"
            "  --max_wait_seconds S             longest WaitAggregate long poll (default 30)\n"
            "  --idle_timeout_seconds S         cancel a call idle this long (default 120)\n"
            "  --max_upload_buffer BYTES        memory all upload calls together may hold, each 3 chunks (they go to\n"
            "                                   disk chunk by chunk; default: a quarter of the model's F32 size, at least\n"
            "                                   2 calls); more calls: 'server busy' (they retry)\n"
            "  --max_receive_buffer BYTES       memory gRPC may hold of requests being received; past it, streams\n"
            "                                   are reset (default: 2 chunks per peer, at least 256 MiB)\n"
            "  --state_dir DIR                  persist spec, uploads, aggregates and round bookkeeping in DIR;\n"
            "                                   a restarted server with the same DIR continues the run. Fixed for\n"
            "                                   a DIR (a restart with others is refused): --total_peers,\n"
            "                                   --num_train_experts_per_node, --mode, --merge_*,\n"
            "                                   --expert_rotation_steps, --outer_lr/--outer_momentum and the peers'\n"
            "                                   payload dtype; the other flags may change at a restart\n"
            "  --spool_dir DIR                  without --state_dir: accepted uploads wait for their round in a\n"
            "                                   private directory made under DIR (default $TMPDIR or /tmp)\n"
            "  --round_timeout S                close a round S seconds after its first upload with the peers\n"
            "                                   that arrived (at least max(S, 3 x median recent round time);\n"
            "                                   default 0: wait for every peer)\n"
            "  --min_peers Q                    quorum for such a partial round (default: a majority)\n"
            "  --outer_lr X                     outer optimizer (DiLoCo Nesterov) on the shared tensors: step size\n"
            "                                   on the pseudo-gradient (previous aggregate - mean); default 1\n"
            "  --outer_momentum Y               its Nesterov momentum in [0, 1) (default 0; with lr 1: off, the\n"
            "                                   plain mean). Fixed for a --state_dir; peers state the values their\n"
            "                                   config expects (spes_config.outer_lr/outer_momentum) and are refused\n"
            "                                   when they differ\n"
            "  --config CONFIG.yaml             take --outer_lr/--outer_momentum from the peers' config\n"
            "                                   (spes_config.outer_lr/outer_momentum) unless given as flags\n"
            "  --auth_token_file F              require 'authorization: Bearer <token in F>' on every call\n"
            "  --peer_tokens F                  lines 'peer_id token': per-peer tokens, each only valid for its peer\n"
            "  --tls_cert PEM --tls_key PEM     serve TLS\n"
            "  --tls_ca PEM                     with TLS: require client certificates signed by this CA\n"
            "  --status_port N                  serve the run's status over HTTP on port N (0: any free port, printed\n"
            "                                   at start): a page at / and /status.json (docs/status.md); default off\n"
            "  --status_bind ADDR               numeric address of the status server (default 127.0.0.1)\n"
            "  --status_token_file F            the status server requires the token in F ('Authorization: Bearer' or\n"
            "                                   '?token='); default: the --auth_token_file token, if any\n",
            SYNC_DEFAULT_CHUNK_SIZE, SYNC_DEFAULT_MAX_MESSAGE);
}

static int parse_size(const char *flag, const char *text, size_t *out) {
    uint64_t v;
    SPES_TRY(cli_u64(flag, text, &v));
    if (v == 0 || v > ((uint64_t)1 << 31)) return spes_fail("--%s must be in [1, 2^31] bytes (got %s)", flag, text);
    *out = (size_t)v;
    return SPES_OK;
}

// The status page starts before the parameter server (so that its bad flags fail before anything
// says "listening on"): until the server is up it answers 503.
static int fill_status(void *server, RunStatus *out) {
    SyncServer *srv = atomic_load((_Atomic(SyncServer *) *)server);
    if (!srv) return spes_fail("the parameter server is starting");
    return rounds_run_status(sync_server_rounds(srv), out);
}

// The status server (docs/status.md) over srv's rounds. Its tokens: status_token_file's; else
// every token the gRPC Status takes (the shared auth_token_file's and each of peer_tokens_file's),
// so a run that needs a token for Status never shows its page without one; else none.
static int start_status_page(StatusHttpConfig *http, const char *status_token_file, const char *auth_token_file,
                             const char *peer_tokens_file, int num_peers, _Atomic(SyncServer *) *srv, StatusHttp **out) {
    char *token = NULL;
    AuthTokens peers = {0};
    if (status_token_file && auth_read_token_file(status_token_file, &token) != SPES_OK)
        return spes_fail_context("--status_token_file");
    if (!status_token_file && (auth_token_file || peer_tokens_file) &&
        auth_load(auth_token_file, peer_tokens_file, num_peers, &peers) != SPES_OK)
        return SPES_ERR;
    http->token = token ? token : peers.shared;
    http->tokens = (const char *const *)peers.token;
    http->n_tokens = peers.count;
    int rc = status_http_start(http, fill_status, srv, out);
    bool needs_token = http->token || http->n_tokens > 0;
    free(token);
    auth_free(&peers);
    http->token = NULL;
    http->tokens = NULL;
    http->n_tokens = 0;
    if (rc != SPES_OK)
        return rc;
    const char *addr = http->bind_addr ? http->bind_addr : "127.0.0.1";
    printf("spes server: status page on http://%s%s%s:%d/ (%s)\n", strchr(addr, ':') ? "[" : "", addr,
           strchr(addr, ':') ? "]" : "", status_http_port(*out),
           !needs_token ? "no token" : status_token_file || !peer_tokens_file ? "token required" : "token required: the shared or any peer's");
    if (!needs_token && strcmp(addr, "127.0.0.1") != 0 && strcmp(addr, "::1") != 0)
        log_warn("server: the status page on %s needs no token: anyone who reaches it sees the run "
                 "(--status_token_file F to require one)", addr);
    return SPES_OK;
}

// --config: the outer optimizer the peers' config expects (spes_config.outer_lr/outer_momentum),
// for each setting not given as a flag, so a launcher that starts the server from the peers'
// config runs what the peers will state in Hello.
static int outer_from_config(const char *path, bool lr_given, bool momentum_given, OuterOptConfig *outer) {
    TrainConfig tc;
    if (config_load(path, 0, NULL, &tc) != SPES_OK) return spes_fail_context("spes server --config %s", path);
    if (!lr_given) outer->lr = tc.outer_lr;
    if (!momentum_given) outer->momentum = tc.outer_momentum;
    config_free(&tc);
    log_info("server: outer optimizer lr %g, momentum %g (%s%s)", (double)outer->lr, (double)outer->momentum,
             lr_given || momentum_given ? "flags over " : "from ", path);
    return SPES_OK;
}

int cmd_server(int argc, char **argv) {
    SyncServerConfig cfg;
    sync_server_config_defaults(&cfg);
    AggregateConfig *agg = &cfg.rounds.agg;
    agg->merge_decay_steps = 1000;
    float seconds;
    static const struct option options[] = {
        {"total_peers", required_argument, NULL, 'P'},
        {"num_train_experts_per_node", required_argument, NULL, 'm'},
        {"mode", required_argument, NULL, 'M'},
        {"host", required_argument, NULL, 'H'},
        {"port", required_argument, NULL, 'p'},
        {"merge_interval", required_argument, NULL, 'i'},
        {"merge_alpha_start", required_argument, NULL, 'a'},
        {"merge_decay_steps", required_argument, NULL, 'd'},
        {"merge_topk", required_argument, NULL, 'k'},
        {"expert_rotation_steps", required_argument, NULL, 'R'},
        {"keep_steps", required_argument, NULL, 'K'},
        {"chunk_size", required_argument, NULL, 'c'},
        {"max_message_size", required_argument, NULL, 'x'},
        {"max_wait_seconds", required_argument, NULL, 'w'},
        {"idle_timeout_seconds", required_argument, NULL, 't'},
        {"max_upload_buffer", required_argument, NULL, 'U'},
        {"max_receive_buffer", required_argument, NULL, 'W'},
        {"spool_dir", required_argument, NULL, 'V'},
        {"state_dir", required_argument, NULL, 'S'},
        {"round_timeout", required_argument, NULL, 'T'},
        {"min_peers", required_argument, NULL, 'Q'},
        {"auth_token_file", required_argument, NULL, 'A'},
        {"peer_tokens", required_argument, NULL, 'B'},
        {"tls_cert", required_argument, NULL, 'C'},
        {"tls_key", required_argument, NULL, 'D'},
        {"tls_ca", required_argument, NULL, 'E'},
        {"outer_lr", required_argument, NULL, 'o'},
        {"outer_momentum", required_argument, NULL, 'u'},
        {"config", required_argument, NULL, 'G'},
        {"status_port", required_argument, NULL, 's'},
        {"status_bind", required_argument, NULL, 'b'},
        {"status_token_file", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int status = SPES_OK, c;
    StatusHttpConfig http = {.port = -1};   // -1: no status server
    const char *status_token_file = NULL;
    const char *config_path = NULL;   // --config: the outer settings not given as flags come from it
    bool outer_lr_given = false, outer_momentum_given = false;
    optind = 1;
    while (status == SPES_OK && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'P': status = cli_int("total_peers", optarg, 1, 100000, &agg->num_peers); break;
        case 'm': status = cli_int("num_train_experts_per_node", optarg, 1, 100000, &agg->experts_per_node); break;
        case 'M': status = sync_mode_parse(optarg, &agg->mode); break;
        case 'H': cfg.host = optarg; break;
        case 'p': status = cli_int("port", optarg, 0, 65535, &cfg.port); break;
        case 'i': status = cli_int("merge_interval", optarg, 0, 1 << 30, &agg->merge_interval); break;
        case 'a': status = cli_float("merge_alpha_start", optarg, 0, 1, &agg->merge_alpha_start); break;
        case 'd': status = cli_int("merge_decay_steps", optarg, 0, 1 << 30, &agg->merge_decay_steps); break;
        case 'k': status = cli_int("merge_topk", optarg, 1, 100000, &agg->merge_topk); break;
        case 'R': status = cli_int("expert_rotation_steps", optarg, 0, 1 << 30, &agg->rotation_steps); break;
        case 'K': status = cli_int("keep_steps", optarg, 1, 1000, &cfg.rounds.keep_steps); break;
        case 'c': status = parse_size("chunk_size", optarg, &cfg.chunk_size); break;
        case 'x': status = parse_size("max_message_size", optarg, &cfg.max_message_size); break;
        case 'w':
            status = cli_float("max_wait_seconds", optarg, 0.01, 3600, &seconds);
            cfg.max_wait_seconds = seconds;
            break;
        case 't':
            status = cli_float("idle_timeout_seconds", optarg, 1, 86400, &seconds);
            cfg.idle_timeout_seconds = seconds;
            break;
        case 'U': {
            uint64_t v;
            status = cli_u64("max_upload_buffer", optarg, &v);
            if (status == SPES_OK && (v < ((uint64_t)1 << 20) || v > ((uint64_t)1 << 44)))
                status = spes_fail("--max_upload_buffer must be in [1 MiB, 16 TiB] bytes (got %s)", optarg);
            cfg.max_buffered_bytes = (size_t)v;
            cfg.rounds.max_upload_bytes = (size_t)v;   // also the first upload's cap before the model is known
            break;
        }
        case 'W': {
            uint64_t v;
            status = cli_u64("max_receive_buffer", optarg, &v);
            if (status == SPES_OK && (v == 0 || v > ((uint64_t)1 << 44)))   // its least: sync_server_start
                status = spes_fail("--max_receive_buffer must be in [1, 16 TiB] bytes (got %s)", optarg);
            cfg.max_receive_bytes = (size_t)v;
            break;
        }
        case 'S': cfg.rounds.state_dir = optarg; break;
        case 'V': cfg.rounds.spool_dir = optarg; break;
        case 'T':
            status = cli_float("round_timeout", optarg, 0, 1e6, &seconds);
            cfg.rounds.round_timeout_s = seconds;
            break;
        case 'Q': status = cli_int("min_peers", optarg, 1, 100000, &cfg.rounds.min_peers); break;
        case 'A': cfg.auth_token_file = optarg; break;
        case 'B': cfg.peer_tokens_file = optarg; break;
        case 'C': cfg.tls_cert = optarg; break;
        case 'D': cfg.tls_key = optarg; break;
        case 'E': cfg.tls_ca = optarg; break;
        case 'o':
            status = cli_float("outer_lr", optarg, 1e-6, 10, &cfg.rounds.outer.lr);
            outer_lr_given = true;
            break;
        case 'u':
            status = cli_float("outer_momentum", optarg, 0, 0.999999, &cfg.rounds.outer.momentum);
            outer_momentum_given = true;
            break;
        case 'G': config_path = optarg; break;
        case 's': status = cli_int("status_port", optarg, 0, 65535, &http.port); break;
        case 'b': http.bind_addr = optarg; break;
        case 'F': status_token_file = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (status == SPES_OK && config_path) status = outer_from_config(config_path, outer_lr_given, outer_momentum_given,
                                                                     &cfg.rounds.outer);
    if (status != SPES_OK) return cli_report_error();
    if (optind < argc) {
        fprintf(stderr, "spes server: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (agg->num_peers < 1) {
        fprintf(stderr, "spes server: --total_peers is required\n");
        usage(stderr);
        return 2;
    }
    if (agg->mode == SYNC_MODE_SPES && agg->experts_per_node < 1) {
        fprintf(stderr, "spes server: --num_train_experts_per_node is required in spes mode\n");
        return 2;
    }
    if (agg->merge_alpha_start > 0 && agg->merge_interval <= 0)
        log_warn("server: --merge_alpha_start %g has no effect without --merge_interval N > 0", (double)agg->merge_alpha_start);
    // Block the signals before any thread starts, so only sigwait below sees them. SIGUSR1 (a
    // scheduler's warning before its time limit, `spes train`'s "save now", sent to a whole job)
    // would end the server by its default action: it is answered and the server goes on.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &signals, NULL);
    // The console's reader gone (`spes server 2>&1 | head`, a log collector that ended): SIGPIPE's
    // default action ended the server, and a run's rounds with it, at its next log line. Ignored,
    // such a line is lost and the server serves on.
    signal(SIGPIPE, SIG_IGN);
    // The status page first: "listening on" tells launchers and scripts the server is up, so
    // nothing says it before everything that can still fail (a bad --status_bind, an empty token
    // file) has not.
    static _Atomic(SyncServer *) page_server;
    StatusHttp *page = NULL;
    if (http.port >= 0 && start_status_page(&http, status_token_file, cfg.auth_token_file, cfg.peer_tokens_file,
                                            agg->num_peers, &page_server, &page) != SPES_OK)
        return cli_report_error();
    SyncServer *srv;
    if (sync_server_start(&cfg, &srv) != SPES_OK) {
        status_http_stop(page);
        return cli_report_error();
    }
    atomic_store(&page_server, srv);
    printf("spes server: listening on %s:%d (%d peers, mode %s, %d experts per node)\n", cfg.host,
           sync_server_port(srv), agg->num_peers, sync_mode_name(agg->mode), agg->experts_per_node);
    fflush(stdout);
    int sig = 0;
    while (sigwait(&signals, &sig) == 0 && sig == SIGUSR1)
        log_info("server: SIGUSR1: nothing to save now (%s); serving on",
                 cfg.rounds.state_dir ? "the state dir is written as each upload and round completes"
                               : "no --state_dir: rounds live in memory only, and a restart starts the run's rounds anew");
    log_info("server: signal %d, shutting down", sig);
    status_http_stop(page);
    atomic_store(&page_server, NULL);
    RoundsStatus st;
    rounds_status(sync_server_rounds(srv), &st);
    sync_server_stop(srv);
    printf(
        "spes server: stopped after %lld rounds (last step %d), %lld bytes in, %lld bytes out, %lld uploads refused\n",
        (long long)st.rounds_completed, st.last_aggregate_step, (long long)st.bytes_received, (long long)st.bytes_sent,
        (long long)st.uploads_rejected);
    return 0;
}
