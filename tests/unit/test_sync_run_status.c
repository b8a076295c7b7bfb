// The server's view of a run for operators (server/peer_watch.h, server/rounds.h: rounds_run_status): the
// liveness rule and its thresholds, metric points validated and bounded, the round history
// with partial rounds and bytes, and the same over the wire (peers report metrics with their
// uploads; Status lists every peer).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <math.h>
#include <unistd.h>

#include "base/timer.h"
#include "sync/client.h"
#include "server/peer_watch.h"
#include "server/server.h"
#include "sync_test_model.h"

static void test_liveness_rule(void **state) {
    (void)state;
    PeerLivenessInput in = {.now_unix = 1000, .last_seen_unix = 0, .late_after_s = 5, .missing_after_s = 30};
    assert_int_equal(peer_liveness(&in), PEER_UNSEEN);
    in.last_seen_unix = 990;
    assert_int_equal(peer_liveness(&in), PEER_ALIVE);
    in.open_wait_s = 6;                                    // the open round waited long, but not on it
    assert_int_equal(peer_liveness(&in), PEER_ALIVE);
    in.awaited = true;
    assert_int_equal(peer_liveness(&in), PEER_LATE);
    in.open_wait_s = 4;
    assert_int_equal(peer_liveness(&in), PEER_ALIVE);      // awaited, within the usual time
    in.last_seen_unix = 969;                               // silent 31 s > 30
    assert_int_equal(peer_liveness(&in), PEER_MISSING);
    in.last_seen_unix = 990;
    in.left_out_of_partial = true;                         // the newest round closed without it at 995
    in.partial_closed_unix = 995;
    assert_int_equal(peer_liveness(&in), PEER_MISSING);
    in.last_seen_unix = 996;                               // it called since: back
    assert_int_equal(peer_liveness(&in), PEER_ALIVE);
}

static void test_liveness_thresholds(void **state) {
    (void)state;
    double late, missing;
    peer_liveness_thresholds(NULL, 0, NULL, 0, 0, &late, &missing);
    assert_true(late == PEER_LATE_MIN_S && missing == PEER_MISSING_MIN_S);
    double recent[ROUNDS_RECENT] = {1, 9, 2};              // median 2: usual round 3 x 2 = 6 s
    double starts[] = {0, 10, 15, 40};                     // longest gap 25 s: missing after 75 s
    peer_liveness_thresholds(recent, 3, starts, 4, 0, &late, &missing);
    assert_true(late == 6 && missing == 75);
    peer_liveness_thresholds(recent, 3, starts, 4, 100, &late, &missing);   // a longer round deadline
    assert_true(missing == 100);
    // Only the gaps between the last ROUNDS_RECENT + 1 starts count.
    double many[ROUNDS_RECENT + 3] = {0, 500};
    for (int i = 2; i < ROUNDS_RECENT + 3; i++) many[i] = many[i - 1] + 1;
    peer_liveness_thresholds(NULL, 0, many, ROUNDS_RECENT + 3, 0, &late, &missing);
    assert_true(missing == PEER_MISSING_MIN_S);
}

static PeerMetricPoint point(int64_t step) {
    return (PeerMetricPoint){.step = step, .loss = 3, .ce = 2.9, .lb = 1, .tokens_per_s = 100, .mfu = 0.1,
                             .device_mem_mb = 50, .route_min = 0.5, .route_max = 1.5};
}

static void fill(PeerWatch *w, int P, RunStatus *run) {
    assert_int_equal(run_status_alloc(run, P), 0);
    run->now_unix = unix_seconds();
    peer_watch_fill(w, NULL, 0, NULL, 0, 0, run);
}

static void test_metrics_validated_and_bounded(void **state) {
    (void)state;
    PeerWatch *w;
    assert_int_equal(peer_watch_create(2, &w), SPES_OK);
    PeerMetricPoint pts[5] = {point(1), point(2), point(3), point(4), point(-1)};
    pts[1].loss = NAN;
    pts[2].mfu = 2000;
    pts[3].tokens_per_s = INFINITY;
    assert_int_equal(peer_watch_metrics(w, 0, 100, pts, 5), 1);   // only step 1 is sound
    assert_int_equal(peer_watch_metrics(w, 0, 100, pts, 1), 0);   // a resend
    assert_int_equal(peer_watch_metrics(w, 2, 100, pts, 1), 0);   // no such peer
    assert_int_equal(peer_watch_metrics(w, -1, 100, pts, 1), 0);
    PeerMetricPoint beyond = point(INT64_MAX);   // past any step the run takes: not kept (issue 29)
    assert_int_equal(peer_watch_metrics(w, 0, 100, &beyond, 1), 0);
    PeerMetricPoint huge = point(50);            // a finite but absurd loss (issue 29): not kept
    huge.loss = -1.7e308;
    assert_int_equal(peer_watch_metrics(w, 0, 100, &huge, 1), 0);
    huge.loss = 3, huge.ce = 2e6;
    assert_int_equal(peer_watch_metrics(w, 0, 100, &huge, 1), 0);
    // One upload carries at most SYNC_MAX_METRIC_POINTS: the newest are kept; the ring holds the
    // newest RUN_STATUS_POINTS.
    int n = SYNC_MAX_METRIC_POINTS + 10;
    PeerMetricPoint *many = calloc((size_t)n, sizeof *many);
    for (int i = 0; i < n; i++) many[i] = point(10 + i);
    assert_int_equal(peer_watch_metrics(w, 1, INT32_MAX, many, n), SYNC_MAX_METRIC_POINTS);
    for (int i = 0; i < n; i++) many[i] = point(10000 + i);
    assert_int_equal(peer_watch_metrics(w, 1, INT32_MAX, many, SYNC_MAX_METRIC_POINTS), SYNC_MAX_METRIC_POINTS);
    assert_int_equal(peer_watch_metrics(w, 1, INT32_MAX, many + SYNC_MAX_METRIC_POINTS, 10), 10);
    free(many);
    RunStatus run;
    fill(w, 2, &run);
    assert_int_equal(run.peers[0].num_points, 1);
    assert_int_equal(run.peers[0].points[0].step, 1);
    assert_int_equal(run.peers[1].num_points, RUN_STATUS_POINTS);
    assert_int_equal(run.peers[1].points[RUN_STATUS_POINTS - 1].step, 10000 + SYNC_MAX_METRIC_POINTS + 9);
    // 2 x 256 + 10 points went in: the first batch (steps 20 ..) lost its oldest 10.
    assert_int_equal(run.peers[1].points[0].step, 20 + 2 * SYNC_MAX_METRIC_POINTS + 10 - RUN_STATUS_POINTS);
    assert_int_equal(run.peers[0].liveness, PEER_UNSEEN);  // metrics alone are not a call
    run_status_free(&run);
    peer_watch_free(w);
}

static void test_round_history_ring(void **state) {
    (void)state;
    PeerWatch *w;
    assert_int_equal(peer_watch_create(2, &w), SPES_OK);
    for (int i = 1; i <= RUN_STATUS_ROUNDS + 3; i++) {
        RoundRecord rec = {.step = 2 * i, .started_unix = 1000 + i, .duration_s = 0.5, .peers = 2, .bytes_in = i};
        peer_watch_round(w, &rec, NULL);
    }
    peer_watch_sent(w, 2 * (RUN_STATUS_ROUNDS + 3), 70);
    peer_watch_sent(w, 2 * (RUN_STATUS_ROUNDS + 3), 30);
    peer_watch_sent(w, 2, 99);                             // dropped from the history: nothing to add to
    RunStatus run;
    fill(w, 2, &run);
    assert_int_equal(run.num_rounds, RUN_STATUS_ROUNDS);
    assert_int_equal(run.round_history[0].step, 8);        // the oldest three dropped
    assert_int_equal(run.round_history[RUN_STATUS_ROUNDS - 1].bytes_out, 100);
    assert_int_equal(run.round_history[0].bytes_out, 0);
    run_status_free(&run);
    peer_watch_free(w);
}

static RoundsResult upload(Rounds *r, int peer, int step) {
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_small_upload(peer, &bytes, &len), SPES_OK);
    return rounds_upload(r, peer, step, bytes, len);
}

// rounds_run_status through a full round, a partial one (peer 1 missing from it) and an open
// round that waits on peer 1 past the late threshold.
static void test_rounds_run_status(void **state) {
    (void)state;
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4,
                                .merge_interval = 4, .merge_alpha_start = 0.5f},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2,
                        .round_timeout_s = 0.2, .min_peers = 1};
    Rounds *r;
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    PeerWatch *w = rounds_watch(r);
    peer_watch_seen(w, 0);
    peer_watch_seen(w, 1);
    double t0 = unix_seconds();
    assert_int_equal(upload(r, 0, 2), ROUNDS_OK);
    assert_int_equal(upload(r, 1, 2), ROUNDS_OK);
    rounds_count_sent(r, 2, 1234);
    assert_int_equal(upload(r, 0, 4), ROUNDS_OK);
    RunStatus run;
    assert_int_equal(rounds_run_status(r, &run), SPES_OK);
    assert_int_equal(run.rounds.open_step, 4);
    assert_int_equal(run.peers[1].liveness, PEER_ALIVE);   // awaited, but only just
    run_status_free(&run);
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, 4, 5, &blob), ROUNDS_OK);   // closes partial after 0.2 s
    assert_non_null(blob);
    rounds_release(r, blob);
    PeerMetricPoint pt = point(4);
    assert_int_equal(peer_watch_metrics(w, 0, 4, &pt, 1), 1);
    assert_int_equal(rounds_run_status(r, &run), SPES_OK);
    assert_int_equal(run.num_peers, 2);
    assert_int_equal(run.rounds.rounds_completed, 2);
    assert_int_equal(run.num_rounds, 2);
    const RoundRecord *full = &run.round_history[0], *partial = &run.round_history[1];
    assert_int_equal(full->step, 2);
    assert_false(full->partial);
    assert_int_equal(full->peers, 2);
    assert_true(full->bytes_in > 0);
    assert_int_equal(full->bytes_out, 1234);
    assert_true(full->started_unix >= t0 - 1 && full->started_unix <= run.now_unix);
    assert_true(full->merge_alpha == 0);                   // step 2: not a merge step
    assert_int_equal(partial->step, 4);
    assert_true(partial->partial);
    assert_int_equal(partial->peers, 1);
    assert_int_equal(partial->bytes_in, full->bytes_in / 2);
    assert_true(partial->duration_s >= 0.2 && partial->duration_s < 5);
    assert_true(partial->merge_alpha > 0);                 // step 4 merges (alpha 0.5, no decay)
    assert_int_equal(run.peers[0].liveness, PEER_ALIVE);
    assert_int_equal(run.peers[0].last_upload_step, 4);
    assert_int_equal(run.peers[0].num_points, 1);
    assert_int_equal(run.peers[1].liveness, PEER_MISSING); // left out of the partial round, silent since
    assert_int_equal(run.peers[1].last_upload_step, 2);
    assert_int_equal(run.peers[1].num_points, 0);
    run_status_free(&run);
    // Peer 1 calls again (its late upload, say): alive; then the next round waits on it.
    peer_watch_seen(w, 1);
    assert_int_equal(upload(r, 0, 6), ROUNDS_OK);
    assert_int_equal(rounds_run_status(r, &run), SPES_OK);
    assert_int_equal(run.peers[1].liveness, PEER_ALIVE);
    run_status_free(&run);
    usleep((useconds_t)((PEER_LATE_MIN_S + 0.2) * 1e6));   // past the late threshold (the usual round is short)
    assert_int_equal(rounds_run_status(r, &run), SPES_OK);
    assert_int_equal(run.peers[1].liveness, PEER_LATE);
    assert_int_equal(run.peers[0].liveness, PEER_ALIVE);   // it has uploaded for the open round
    run_status_free(&run);
    rounds_destroy(r);
}

// Over the wire: peers note metrics, the upload carries them (a NaN point ignored, the upload
// still accepted); Status lists each peer with its newest point, liveness and last upload step.
static void test_metrics_and_peers_over_the_wire(void **state) {
    (void)state;
    SyncServerConfig scfg;
    sync_server_config_defaults(&scfg);
    scfg.host = "127.0.0.1";
    scfg.port = 0;
    scfg.rounds.keep_steps = 1;
    scfg.rounds.agg = (AggregateConfig){.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4};
    SyncServer *srv;
    assert_int_equal(sync_server_start(&scfg, &srv), SPES_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sync_server_port(srv));
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = addr;
    cfg.num_peers = 2;
    cfg.experts_per_node = 2;
    cfg.peer_id = 0;
    SyncClient *peer;
    assert_int_equal(sync_client_create(&cfg, &peer), SPES_OK);
    assert_int_equal(sync_client_hello(peer, &spec), SPES_OK);
    PeerMetricPoint pts[3] = {point(1), point(2), point(3)};
    pts[1].ce = NAN;
    pts[2].loss = 2.5;
    for (int i = 0; i < 3; i++) sync_client_note_metrics(peer, &pts[i]);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 0, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
    assert_int_equal(sync_client_upload_bytes(peer, 3, bytes, len), SPES_OK);
    free(bytes);
    RunStatus run;
    assert_int_equal(rounds_run_status(sync_server_rounds(srv), &run), SPES_OK);
    assert_int_equal(run.peers[0].num_points, 2);          // steps 1 and 3; the NaN one ignored
    assert_int_equal(run.peers[0].points[1].step, 3);
    assert_true(run.peers[0].points[1].loss == 2.5);
    run_status_free(&run);
    // The points went with that upload: the next one carries none again.
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 0, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
    assert_int_equal(sync_client_upload_bytes(peer, 3, bytes, len), SPES_OK);   // a repeat replaces it
    free(bytes);
    assert_int_equal(sync_client_run_status(peer, &run), SPES_OK);
    assert_int_equal(run.num_peers, 2);
    assert_int_equal(run.rounds.open_step, 3);
    assert_int_equal(run.peers[0].liveness, PEER_ALIVE);
    assert_true(run.peers[0].last_seen_unix > 0);
    assert_int_equal(run.peers[0].last_upload_step, 3);
    assert_int_equal(run.peers[0].num_points, 1);          // Status carries the newest point
    assert_int_equal(run.peers[0].points[0].step, 3);
    assert_true(run.peers[0].points[0].route_max == 1.5);
    assert_int_equal(run.peers[1].liveness, PEER_UNSEEN);
    assert_int_equal(run.peers[1].last_upload_step, -1);
    run_status_free(&run);
    sync_client_destroy(peer);
    model_spec_free(&spec);
    sync_server_stop(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_liveness_rule),
        cmocka_unit_test(test_liveness_thresholds),
        cmocka_unit_test(test_metrics_validated_and_bounded),
        cmocka_unit_test(test_round_history_ring),
        cmocka_unit_test(test_rounds_run_status),
        cmocka_unit_test(test_metrics_and_peers_over_the_wire),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
