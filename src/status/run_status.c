#include "status/run_status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *peer_liveness_name(PeerLiveness l) {
    switch (l) {
    case PEER_ALIVE: return "alive";
    case PEER_LATE: return "late";
    case PEER_MISSING: return "missing";
    case PEER_UNSEEN: break;
    }
    return "unseen";
}

const char *peer_metric_point_problem(const PeerMetricPoint *pt, int64_t max_step) {
    const double values[] = {pt->loss, pt->ce, pt->lb, pt->tokens_per_s, pt->mfu, pt->device_mem_mb, pt->route_min, pt->route_max};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++)
        if (!isfinite(values[i])) return "a value that is not finite";
    if (pt->step < 0) return "a negative step";
    // Beyond any step the run takes uploads for: bogus, and kept it would make every real point
    // after it look like a resend (a frozen curve).
    if (pt->step > max_step) return "a step beyond the run's";
    if (pt->tokens_per_s < 0 || pt->device_mem_mb < 0 || pt->route_min < 0 || pt->route_max < 0)
        return "a negative throughput, memory or routing ratio";
    if (pt->mfu < 0 || pt->mfu > 1e3) return "an mfu outside [0, 1000]";
    // Losses are a few units (ln of the vocabulary at start): 1e6 is no training's; a hostile
    // +-1.7e308 would squash every other peer's curve on the page.
    if (fabs(pt->loss) > PEER_MAX_LOSS || fabs(pt->ce) > PEER_MAX_LOSS || fabs(pt->lb) > PEER_MAX_LOSS)
        return "a loss beyond +-1e6";
    return NULL;
}

int run_status_alloc(RunStatus *s, int num_peers) {
    memset(s, 0, sizeof *s);
    s->num_peers = num_peers;
    s->peers = calloc((size_t)(num_peers > 0 ? num_peers : 1), sizeof *s->peers);
    s->round_history = calloc(RUN_STATUS_ROUNDS, sizeof *s->round_history);
    if (!s->peers || !s->round_history) {
        run_status_free(s);
        return -1;
    }
    for (int p = 0; p < num_peers; p++) {
        s->peers[p].peer = p;
        s->peers[p].last_upload_step = -1;
        if (!(s->peers[p].points = calloc(RUN_STATUS_POINTS, sizeof *s->peers[p].points))) {
            run_status_free(s);
            return -1;
        }
    }
    return 0;
}

void run_status_free(RunStatus *s) {
    if (s->peers)
        for (int p = 0; p < s->num_peers; p++) free(s->peers[p].points);
    free(s->peers);
    free(s->round_history);
    memset(s, 0, sizeof *s);
}
