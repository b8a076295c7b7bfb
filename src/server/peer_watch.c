// Peers' last calls, reported metrics and the round history (see peer_watch.h).
#include "server/peer_watch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "server/round_deadline.h"

typedef struct {
    double last_seen_unix;
    int last_upload_step;
    PeerMetricPoint *points;        // ring of RUN_STATUS_POINTS
    int head, count;                // oldest at head
} WatchedPeer;

struct PeerWatch {
    pthread_mutex_t mu;
    int num_peers;
    WatchedPeer *peers;             // [num_peers]
    RoundRecord *rounds;            // ring of RUN_STATUS_ROUNDS
    int rounds_head, rounds_count;
    bool *last_included;            // [num_peers] peers of the newest round
    bool last_partial;
    double last_closed_unix;
};

PeerLiveness peer_liveness(const PeerLivenessInput *in) {
    if (in->last_seen_unix <= 0) return PEER_UNSEEN;
    double silent = in->now_unix - in->last_seen_unix;
    if (silent > in->missing_after_s) return PEER_MISSING;
    if (in->left_out_of_partial && in->last_seen_unix < in->partial_closed_unix) return PEER_MISSING;
    if (in->awaited && in->open_wait_s > in->late_after_s) return PEER_LATE;
    return PEER_ALIVE;
}

void peer_liveness_thresholds(const double *recent, int n, const double *starts, int n_starts, double deadline_s,
                              double *late_after_s, double *missing_after_s) {
    double usual = rounds_deadline(0, recent, n);   // 3 x the median full round
    *late_after_s = usual > PEER_LATE_MIN_S ? usual : PEER_LATE_MIN_S;
    double gap = 0;
    int first = n_starts > ROUNDS_RECENT + 1 ? n_starts - ROUNDS_RECENT - 1 : 0;
    for (int i = first + 1; i < n_starts; i++)
        if (starts[i] - starts[i - 1] > gap) gap = starts[i] - starts[i - 1];
    double missing = 3 * gap;
    if (deadline_s > missing) missing = deadline_s;
    *missing_after_s = missing > PEER_MISSING_MIN_S ? missing : PEER_MISSING_MIN_S;
}

int peer_watch_create(int num_peers, PeerWatch **out) {
    *out = NULL;
    PeerWatch *w = spes_calloc(1, sizeof *w);
    if (!w) return SPES_ERR;
    pthread_mutex_init(&w->mu, NULL);
    w->num_peers = num_peers;
    w->peers = spes_calloc((size_t)num_peers, sizeof *w->peers);
    w->rounds = spes_calloc(RUN_STATUS_ROUNDS, sizeof *w->rounds);
    w->last_included = spes_calloc((size_t)num_peers, sizeof *w->last_included);
    if (!w->peers || !w->rounds || !w->last_included) {
        peer_watch_free(w);
        return SPES_ERR;
    }
    for (int p = 0; p < num_peers; p++) {
        w->peers[p].last_upload_step = -1;
        if (!(w->peers[p].points = spes_calloc(RUN_STATUS_POINTS, sizeof *w->peers[p].points))) {
            peer_watch_free(w);
            return SPES_ERR;
        }
    }
    *out = w;
    return SPES_OK;
}

void peer_watch_free(PeerWatch *w) {
    if (!w) return;
    if (w->peers)
        for (int p = 0; p < w->num_peers; p++) free(w->peers[p].points);
    free(w->peers);
    free(w->rounds);
    free(w->last_included);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void peer_watch_seen(PeerWatch *w, int peer) {
    if (peer < 0 || peer >= w->num_peers) return;
    double now = unix_seconds();
    pthread_mutex_lock(&w->mu);
    w->peers[peer].last_seen_unix = now;
    pthread_mutex_unlock(&w->mu);
}

void peer_watch_uploaded(PeerWatch *w, int peer, int step) {
    if (peer < 0 || peer >= w->num_peers) return;
    pthread_mutex_lock(&w->mu);
    if (step > w->peers[peer].last_upload_step) w->peers[peer].last_upload_step = step;
    pthread_mutex_unlock(&w->mu);
}

static int64_t newest_step(const WatchedPeer *wp) {
    if (wp->count == 0) return -1;
    return wp->points[(wp->head + wp->count - 1) % RUN_STATUS_POINTS].step;
}

int peer_watch_metrics(PeerWatch *w, int peer, int64_t max_step, const PeerMetricPoint *points, int n) {
    if (peer < 0 || peer >= w->num_peers || n <= 0) return 0;
    int first = n > SYNC_MAX_METRIC_POINTS ? n - SYNC_MAX_METRIC_POINTS : 0;
    int taken = 0, ignored = first;
    const char *why = first ? "more points than an upload may carry" : NULL;
    int64_t why_step = first ? points[0].step : 0;
    pthread_mutex_lock(&w->mu);
    WatchedPeer *wp = &w->peers[peer];
    for (int i = first; i < n; i++) {
        const char *problem = peer_metric_point_problem(&points[i], max_step);
        if (!problem && points[i].step <= newest_step(wp)) continue;   // a resend (retried upload)
        if (problem) {
            if (!why) {
                why = problem;
                why_step = points[i].step;
            }
            ignored++;
            continue;
        }
        int at = (wp->head + wp->count) % RUN_STATUS_POINTS;
        if (wp->count == RUN_STATUS_POINTS) wp->head = (wp->head + 1) % RUN_STATUS_POINTS;
        else wp->count++;
        wp->points[at] = points[i];
        taken++;
    }
    pthread_mutex_unlock(&w->mu);
    if (ignored)
        log_warn("server: peer %d: %d of %d metric points ignored (first: step %lld has %s)", peer, ignored, n,
                 (long long)why_step, why);
    return taken;
}

void peer_watch_round(PeerWatch *w, const RoundRecord *rec, const bool *included) {
    pthread_mutex_lock(&w->mu);
    int at = (w->rounds_head + w->rounds_count) % RUN_STATUS_ROUNDS;
    if (w->rounds_count == RUN_STATUS_ROUNDS) w->rounds_head = (w->rounds_head + 1) % RUN_STATUS_ROUNDS;
    else w->rounds_count++;
    w->rounds[at] = *rec;
    w->last_partial = rec->partial;
    w->last_closed_unix = rec->started_unix + rec->duration_s;
    for (int p = 0; p < w->num_peers; p++) w->last_included[p] = !included || included[p];
    pthread_mutex_unlock(&w->mu);
}

void peer_watch_sent(PeerWatch *w, int step, int64_t bytes) {
    pthread_mutex_lock(&w->mu);
    // Downloads are of the newest rounds: look from the newest back.
    for (int i = w->rounds_count - 1; i >= 0; i--) {
        RoundRecord *rec = &w->rounds[(w->rounds_head + i) % RUN_STATUS_ROUNDS];
        if (rec->step == step) {
            rec->bytes_out += bytes;
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
}

void peer_watch_fill(PeerWatch *w, const bool *awaited, double open_wait_s, const double *recent, int n_recent,
                     double deadline_s, RunStatus *out) {
    pthread_mutex_lock(&w->mu);
    double starts[ROUNDS_RECENT + 1];
    int n_starts = 0;
    int first = w->rounds_count > ROUNDS_RECENT + 1 ? w->rounds_count - ROUNDS_RECENT - 1 : 0;
    for (int i = first; i < w->rounds_count; i++)
        starts[n_starts++] = w->rounds[(w->rounds_head + i) % RUN_STATUS_ROUNDS].started_unix;
    PeerLivenessInput in = {.now_unix = out->now_unix, .open_wait_s = open_wait_s,
                            .partial_closed_unix = w->last_closed_unix};
    peer_liveness_thresholds(recent, n_recent, starts, n_starts, deadline_s, &in.late_after_s, &in.missing_after_s);
    int P = out->num_peers < w->num_peers ? out->num_peers : w->num_peers;
    for (int p = 0; p < P; p++) {
        const WatchedPeer *wp = &w->peers[p];
        PeerStatus *ps = &out->peers[p];
        ps->peer = p;
        ps->last_seen_unix = wp->last_seen_unix;
        ps->last_upload_step = wp->last_upload_step;
        ps->num_points = wp->count;
        for (int i = 0; i < wp->count; i++) ps->points[i] = wp->points[(wp->head + i) % RUN_STATUS_POINTS];
        in.last_seen_unix = wp->last_seen_unix;
        in.awaited = awaited && awaited[p];
        in.left_out_of_partial = w->last_partial && !w->last_included[p];
        ps->liveness = peer_liveness(&in);
    }
    out->num_rounds = w->rounds_count;
    for (int i = 0; i < w->rounds_count; i++)
        out->round_history[i] = w->rounds[(w->rounds_head + i) % RUN_STATUS_ROUNDS];
    pthread_mutex_unlock(&w->mu);
}
