// Two live processes with one peer_id (issue 29): each client draws a random instance id and
// sends it with every call; the newest Hello holds the peer_id, and the other process's next
// upload, wait or download is refused FAILED_PRECONDITION naming both instances, instead of both
// being taken (the second used to end out of sync with the others and exit 0). A real gRPC
// server and two SyncClients as peer 0.
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

static SyncClient *peer0(SyncServer *srv, char *addr, size_t cap) {
    snprintf(addr, cap, "127.0.0.1:%d", sync_server_port(srv));
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = addr;
    cfg.peer_id = 0;
    cfg.num_peers = PEERS;
    cfg.experts_per_node = M;
    cfg.connect_timeout_s = 5;
    cfg.wait_timeout_s = 1;
    SyncClient *c;
    assert_int_equal(sync_client_create(&cfg, &c), SPES_OK);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, PEERS * M, 6), SPES_OK);
    assert_int_equal(sync_client_hello(c, &spec), SPES_OK);
    model_spec_free(&spec);
    return c;
}

static int upload(SyncClient *c, int step) {
    return sync_test_client_upload(c, PEERS * M, M, 0, step, NULL);
}

static void expect_superseded(SyncClient *c, int rc) {
    assert_int_equal(rc, SPES_ERR);
    assert_int_equal(sync_client_last_status(c), GRPC_STATUS_FAILED_PRECONDITION);
    if (!strstr(spes_last_error(), "another process (instance ") ||
        !strstr(spes_last_error(), "two live processes must not share a peer_id"))
        fail_msg("%s", spes_last_error());
}

static void test_second_process_with_the_same_peer_id(void **state) {
    (void)state;
    SyncServer *srv = sync_test_server_start(PEERS, M, NULL);
    char addr_a[64], addr_b[64];
    SyncClient *a = peer0(srv, addr_a, sizeof addr_a);
    assert_int_equal(upload(a, 2), SPES_OK);
    SyncClient *b = peer0(srv, addr_b, sizeof addr_b);   // a second process says Hello as peer 0
    assert_int_equal(upload(b, 2), SPES_OK);            // it holds the peer_id (its retry replaces a's)
    expect_superseded(a, upload(a, 4));
    uint8_t *bytes = NULL;
    size_t len = 0;
    expect_superseded(a, sync_client_wait_and_download(a, 2, &bytes, &len));
    assert_null(bytes);
    RoundsStatus st;
    assert_int_equal(sync_client_status(b, &st), SPES_OK);
    assert_int_equal(st.num_uploaded, 1);
    sync_client_destroy(a);
    sync_client_destroy(b);
    sync_server_stop(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_process_with_the_same_peer_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
