// Peers' metric points ride on their uploads (proto PeerMetrics, docs/operating.md). Issue 29:
// the points of a refused upload were kept, and one point with step 2^63-1 froze the peer's curve
// (every later point was dropped as a resend). Against a real gRPC server: the points of a
// refused upload are not kept, and a point with a step beyond its upload's step is ignored.
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

static PeerMetricPoint point(int64_t step, double loss) {
    return (PeerMetricPoint){.step = step, .loss = loss, .ce = loss, .lb = 0.01, .tokens_per_s = 100, .mfu = 0.1,
                             .device_mem_mb = 50, .route_min = 0.5, .route_max = 1.5};
}

static void nan_first(StWriteTensor *w, float *d, int t) { if (t == 0) d[0] = 0.0f / 0.0f; }

static int upload(SyncClient *c, int step, SyncTestTweak tweak) {
    return sync_test_client_upload(c, PEERS * M, M, 0, step, tweak);
}

// Peer 0's newest point as the server's Status reports it (step -1: none).
static int64_t latest_step(SyncClient *c, double *loss) {
    RunStatus run;
    assert_int_equal(sync_client_run_status(c, &run), SPES_OK);
    int64_t step = run.peers[0].num_points ? run.peers[0].points[run.peers[0].num_points - 1].step : -1;
    if (loss && run.peers[0].num_points) *loss = run.peers[0].points[run.peers[0].num_points - 1].loss;
    run_status_free(&run);
    return step;
}

static void test_metrics_only_from_accepted_uploads(void **state) {
    (void)state;
    SyncServer *srv = sync_test_server_start(PEERS, M, NULL);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sync_server_port(srv));
    SyncClientConfig ccfg;
    sync_client_config_defaults(&ccfg);
    ccfg.server_addr = addr;
    ccfg.num_peers = PEERS;
    ccfg.experts_per_node = M;
    ccfg.connect_timeout_s = 5;
    SyncClient *c;
    assert_int_equal(sync_client_create(&ccfg, &c), SPES_OK);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, PEERS * M, 6), SPES_OK);
    assert_int_equal(sync_client_hello(c, &spec), SPES_OK);
    model_spec_free(&spec);

    // A refused upload (a NaN in it): its points are not kept.
    PeerMetricPoint p = point(1, 9.5);
    sync_client_note_metrics(c, &p);
    assert_int_equal(upload(c, 2, nan_first), SPES_ERR);
    assert_int_equal(sync_client_last_status(c), GRPC_STATUS_INVALID_ARGUMENT);
    assert_int_equal(latest_step(c, NULL), -1);

    // A point with a step beyond its upload's (2^63-1) is ignored; the sound ones are taken.
    p = point(INT64_MAX, 1.0);
    sync_client_note_metrics(c, &p);
    p = point(2, 3.5);
    sync_client_note_metrics(c, &p);
    assert_int_equal(upload(c, 2, NULL), SPES_OK);
    double loss = 0;
    assert_int_equal(latest_step(c, &loss), 2);
    assert_true(loss == 3.5);
    // and later points still arrive: the curve is not frozen
    p = point(4, 3.25);
    sync_client_note_metrics(c, &p);
    assert_int_equal(upload(c, 4, NULL), SPES_OK);
    assert_int_equal(latest_step(c, &loss), 4);
    assert_true(loss == 3.25);
    sync_client_destroy(c);
    sync_server_stop(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_only_from_accepted_uploads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
