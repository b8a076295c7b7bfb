// `spes status ADDR`: the parameter server's Status in a terminal (for ssh sessions): the run
// (peers, mode, model fingerprint), the rounds (completed, partial, the latest aggregate and
// how long it took), the open round (which peers have uploaded, which are still awaited) and
// the traffic, and each peer as the server sees it (alive / late / missing, last call, last
// upload, its newest reported step, loss and tokens/s). One gRPC Status call, through the same client the peers use, so a token and
// TLS work as they do for a peer.
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "sync/auth.h"
#include "sync/client.h"
#include "server/peer_watch.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes status HOST:PORT [--auth_token_file F] [--tls_ca F [--tls_cert F --tls_key F]]\n"
            "                   [--timeout S]\n\n"
            "Prints the parameter server's status: peers, rounds (completed, partial), the open round's\n"
            "uploaded and awaited peers, bytes in and out, and each peer as the server sees it\n"
            "(alive / late / missing, last call, last upload, newest step, loss, tokens/s). --timeout: seconds to keep trying an\n"
            "unreachable server (default 10).\n");
}

static void print_mb(const char *what, int64_t bytes) { printf("%-22s %.1f MB\n", what, (double)bytes / 1e6); }

static void print_status(const char *addr, const RoundsStatus *st) {
    printf("%-22s %s\n", "server", addr);
    printf("%-22s %d, mode %s\n", "peers", st->total_peers, sync_mode_name(st->mode));
    if (st->fingerprint)
        printf("%-22s %016" PRIx64 "\n", "model fingerprint", st->fingerprint);
    else
        printf("%-22s not known yet (no peer has said hello)\n", "model fingerprint");
    printf("%-22s %" PRId64 " completed, %" PRId64 " partial\n", "rounds", st->rounds_completed, st->rounds_partial);
    if (st->last_aggregate_step >= 0)
        printf("%-22s step %d, %d peers, aggregated in %.3f s\n", "latest aggregate", st->last_aggregate_step,
               st->last_round_peers, st->last_aggregate_seconds);
    else
        printf("%-22s none yet\n", "latest aggregate");
    if (st->open_step < 0) {
        printf("%-22s none (no uploads waiting)\n", "open round");
    } else {
        printf("%-22s step %d: %d of %d peers uploaded\n", "open round", st->open_step, st->num_uploaded,
               st->total_peers);
        printf("%-22s", "  uploaded");
        for (int i = 0; i < st->num_uploaded; i++) printf(" %d", st->peers_uploaded[i]);
        printf("\n%-22s", "  awaited");
        for (int p = 0, i = 0; p < st->total_peers; p++) {
            while (i < st->num_uploaded && st->peers_uploaded[i] < p) i++;
            if (i >= st->num_uploaded || st->peers_uploaded[i] != p) printf(" %d", p);
        }
        printf("\n");
        if (st->aggregate_problem[0]) printf("%-22s %s (retried)\n", "  not published", st->aggregate_problem);
    }
    print_mb("received (uploads)", st->bytes_received);
    print_mb("sent (downloads)", st->bytes_sent);
    printf("%-22s %" PRId64 "\n", "uploads rejected", st->uploads_rejected);
}

// One line per peer (a server without the per-peer extension lists none: nothing printed).
static void print_peers(const RunStatus *run) {
    if (run->num_peers == 0) return;
    printf("\n%-5s %-8s %-12s %-12s %-8s %-10s %s\n", "peer", "state", "last seen", "last upload", "step", "loss",
           "tokens/s");
    for (int p = 0; p < run->num_peers; p++) {
        const PeerStatus *ps = &run->peers[p];
        char seen[32] = "never", upload[16] = "none", step[24] = "-", loss[24] = "-", tps[24] = "-";
        if (ps->last_seen_unix > 0) snprintf(seen, sizeof seen, "%.1f s ago", run->now_unix - ps->last_seen_unix);
        if (ps->last_upload_step >= 0) snprintf(upload, sizeof upload, "step %d", ps->last_upload_step);
        if (ps->num_points > 0) {
            const PeerMetricPoint *pt = &ps->points[ps->num_points - 1];
            snprintf(step, sizeof step, "%" PRId64, pt->step);
            snprintf(loss, sizeof loss, "%.4f", pt->loss);
            snprintf(tps, sizeof tps, "%.0f", pt->tokens_per_s);
        }
        printf("%-5d %-8s %-12s %-12s %-8s %-10s %s\n", p, peer_liveness_name(ps->liveness), seen, upload, step, loss,
               tps);
    }
}

int cmd_status(int argc, char **argv) {
    static const struct option options[] = {
        {"auth_token_file", required_argument, 0, 'a'}, {"tls_ca", required_argument, 0, 'c'},
        {"tls_cert", required_argument, 0, 'C'},        {"tls_key", required_argument, 0, 'K'},
        {"timeout", required_argument, 0, 't'},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    const char *token_file = NULL;
    float timeout = 10.0f;
    int c, status = SPES_OK;
    optind = 1;
    while (status == SPES_OK && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'a': token_file = optarg; break;
        case 'c': cfg.tls_ca = optarg; break;
        case 'C': cfg.tls_cert = optarg; break;
        case 'K': cfg.tls_key = optarg; break;
        case 't': status = cli_float("timeout", optarg, 0.1, 3600.0, &timeout); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (status != SPES_OK) return cli_report_error();
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    cfg.server_addr = argv[optind];
    cfg.connect_timeout_s = timeout;
    cfg.call_timeout_s = timeout;
    char *token = NULL;
    if (token_file && auth_read_token_file(token_file, &token) != SPES_OK) {
        spes_fail_context("--auth_token_file");
        return cli_report_error();
    }
    cfg.auth_token = token;
    SyncClient *client = NULL;
    RunStatus run;
    status = sync_client_create(&cfg, &client);
    if (status == SPES_OK) status = sync_client_run_status(client, &run);
    if (status == SPES_OK) {
        print_status(cfg.server_addr, &run.rounds);
        print_peers(&run);
        run_status_free(&run);
    }
    sync_client_destroy(client);
    free(token);
    return status == SPES_OK ? 0 : cli_report_error();
}
