// The outer optimizer in the handshake (issue #14, docs/sync.md): a peer states in Hello the
// outer settings its config expects (spes_config.outer_lr / outer_momentum); a real gRPC server
// refuses a stated pair that differs from its --outer_lr / --outer_momentum with a message
// naming both pairs and the settings to change, takes a matching pair, and takes a peer that
// states nothing (an older peer: HelloRequest.outer_lr 0) whatever it runs.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include <grpc/status.h>

#include "base/error.h"
#include "sync/client.h"
#include "server/server.h"
#include "sync_test_client.h"

#define PEERS 2
#define M 2

static SyncServer *start_server(OuterOptConfig outer) { return sync_test_server_start(PEERS, M, &outer); }

// Hello from peer 0 stating `outer` (lr 0: nothing stated). Returns the client's result; the
// refusal's message is left in spes_last_error().
static int hello(SyncServer *srv, OuterOptConfig outer, int *grpc_status) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sync_server_port(srv));
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = addr;
    cfg.num_peers = PEERS;
    cfg.experts_per_node = M;
    cfg.connect_timeout_s = 5;
    cfg.outer = outer;
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, PEERS * M, 6), SPES_OK);
    SyncClient *c;
    assert_int_equal(sync_client_create(&cfg, &c), SPES_OK);
    int rc = sync_client_hello(c, &spec);
    *grpc_status = sync_client_last_status(c);
    sync_client_destroy(c);
    model_spec_free(&spec);
    return rc;
}

static void expect_refused(SyncServer *srv, OuterOptConfig outer, const char *const *mentions) {
    int status;
    assert_int_equal(hello(srv, outer, &status), SPES_ERR);
    assert_int_equal(status, GRPC_STATUS_FAILED_PRECONDITION);
    for (int i = 0; mentions[i]; i++)
        if (!strstr(spes_last_error(), mentions[i]))
            fail_msg("refusal '%s' does not mention '%s'", spes_last_error(), mentions[i]);
}

static void expect_accepted(SyncServer *srv, OuterOptConfig outer) {
    int status;
    if (hello(srv, outer, &status) != SPES_OK)
        fail_msg("hello stating outer_lr %g, outer_momentum %g refused: %s", (double)outer.lr, (double)outer.momentum,
                 spes_last_error());
}

static const OuterOptConfig NOT_STATED = {.lr = 0.0f, .momentum = 0.0f};

static void test_default_server(void **state) {
    (void)state;
    SyncServer *srv = start_server((OuterOptConfig){0});   // lr 0: the default, 1 (no outer optimizer)
    expect_accepted(srv, NOT_STATED);                      // an older peer
    expect_accepted(srv, OUTER_OPT_OFF);                   // a peer at the config's defaults
    const char *mentions[] = {"outer_lr 0.7", "outer_momentum 0.9", "--outer_lr 1 --outer_momentum 0",
                              "spes_config.outer_lr", "start the server with --outer_lr 0.7 --outer_momentum 0.9", NULL};
    expect_refused(srv, (OuterOptConfig){.lr = 0.7f, .momentum = 0.9f}, mentions);
    sync_server_stop(srv);
}

static void test_outer_server(void **state) {
    (void)state;
    SyncServer *srv = start_server((OuterOptConfig){.lr = 0.7f, .momentum = 0.9f});
    expect_accepted(srv, (OuterOptConfig){.lr = 0.7f, .momentum = 0.9f});
    expect_accepted(srv, NOT_STATED);   // an older peer cannot say; the server decides
    const char *off[] = {"outer_lr 1, outer_momentum 0", "--outer_lr 0.7 --outer_momentum 0.9", NULL};
    expect_refused(srv, OUTER_OPT_OFF, off);
    const char *momentum[] = {"outer_momentum 0.5", "--outer_momentum 0.9", NULL};
    expect_refused(srv, (OuterOptConfig){.lr = 0.7f, .momentum = 0.5f}, momentum);
    sync_server_stop(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_server),
        cmocka_unit_test(test_outer_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
