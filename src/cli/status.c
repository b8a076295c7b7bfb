// `spes status ADDR`: the parameter server's Status in a terminal (for ssh sessions): the run
// (peers, mode, model fingerprint), the rounds (completed, partial, the latest aggregate and
// how long it took), the open round (which peers have uploaded, which are still awaited) and
// the traffic. One gRPC Status call, through the same client the peers use, so a token and
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

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes status HOST:PORT [--auth_token_file F] [--tls_ca F [--tls_cert F --tls_key F]]\n"
            "                   [--timeout S]\n\n"
            "Prints the parameter server's status: peers, rounds (completed, partial), the open round's\n"
            "uploaded and awaited peers, bytes in and out. --timeout: seconds to keep trying an\n"
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
    }
    print_mb("received (uploads)", st->bytes_received);
    print_mb("sent (downloads)", st->bytes_sent);
    printf("%-22s %" PRId64 "\n", "uploads rejected", st->uploads_rejected);
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
    RoundsStatus st;
    status = sync_client_create(&cfg, &client);
    if (status == SPES_OK) status = sync_client_status(client, &st);
    if (status == SPES_OK) print_status(cfg.server_addr, &st);
    sync_client_destroy(client);
    free(token);
    return status == SPES_OK ? 0 : cli_report_error();
}
