// A run for the status tests (tests/unit/test_status_*.c) to render and serve: 4 peers
// (alive, late, missing, unseen) with loss curves, one NaN loss, 6 rounds of which one partial,
// an open round. Included by each of them (static inline functions).
#pragma once
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "status/run_status.h"

#define FIXTURE_NOW 1795000000.0

// Fills s (allocating it); returns SPES_OK, SPES_ERR when out of memory.
static inline int status_fixture(RunStatus *s) {
    if (run_status_alloc(s, 4) != 0)
        return SPES_ERR;
    s->now_unix = FIXTURE_NOW;
    s->rounds = (RoundsStatus){.rounds_completed = 6, .open_step = 70, .num_uploaded = 2, .peers_uploaded = {0, 3},
                               .last_aggregate_step = 60, .bytes_received = 123456789, .bytes_sent = 987654321,
                               .uploads_rejected = 2, .fingerprint = 0x0123456789abcdefULL,
                               .last_aggregate_seconds = 0.25, .rounds_partial = 1, .last_round_peers = 3,
                               .total_peers = 4, .mode = SYNC_MODE_SPES};
    PeerLiveness states[4] = {PEER_ALIVE, PEER_LATE, PEER_MISSING, PEER_UNSEEN};
    for (int p = 0; p < 4; p++) {
        PeerStatus *ps = &s->peers[p];
        ps->liveness = states[p];
        if (states[p] == PEER_UNSEEN)
            continue;
        ps->last_seen_unix = FIXTURE_NOW - 5 - 60 * p;
        ps->last_upload_step = 60 - 10 * p;
        ps->num_points = 30 - 5 * p;
        for (int i = 0; i < ps->num_points; i++)
            ps->points[i] = (PeerMetricPoint){.step = 2 * i + 1, .loss = 4.0 / (1 + 0.1 * i) + 0.05 * p,
                                              .ce = 3.5, .lb = 0.01, .tokens_per_s = 1000 + p, .mfu = 0.25,
                                              .device_mem_mb = 512, .route_min = 0.5, .route_max = 1.5};
    }
    s->peers[1].points[3].loss = NAN;           // a diverged step: null in JSON, left out of the curve
    s->peers[0].points[29].mfu = INFINITY;      // the newest point of peer 0: null in JSON, "-" on the page
    s->num_rounds = 6;
    for (int i = 0; i < 6; i++)
        s->round_history[i] = (RoundRecord){.step = 10 * (i + 1), .started_unix = FIXTURE_NOW - 600 + 100 * i,
                                            .duration_s = 1.5 + i, .partial = i == 4, .peers = i == 4 ? 3 : 4,
                                            .bytes_in = 1000000 * (i + 1), .bytes_out = 3000000,
                                            .merge_alpha = i < 2 ? 0.3 : 0};
    return SPES_OK;
}

// StatusFill (status/status_http.h) serving the fixture.
static inline int status_fixture_fill(void *ctx, RunStatus *out) {
    (void)ctx;
    return status_fixture(out);
}

// Occurrences of what in text.
static inline int count_in(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}
