#include "status/status_json.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

// A JSON number, or null where JSON has none (NaN, infinities).
static json_t *number(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *point_json(const PeerMetricPoint *p) {
    // "o": json_pack takes over the new references number() returns ("O" would add one more).
    return json_pack("{sI so so so so so so so so}", "step", (json_int_t)p->step, "loss", number(p->loss), "ce",
                     number(p->ce), "lb", number(p->lb), "tokens_per_s", number(p->tokens_per_s), "mfu",
                     number(p->mfu), "device_mem_mb", number(p->device_mem_mb), "route_min", number(p->route_min),
                     "route_max", number(p->route_max));
}

// The index of the first of the newest `limit` of n items (limit -1: all).
static int newest(int n, int limit) { return limit >= 0 && limit < n ? n - limit : 0; }

static json_t *peer_json(const PeerStatus *p, double now, int max_points) {
    json_t *points = json_array();
    for (int i = newest(p->num_points, max_points); i < p->num_points; i++)
        json_array_append_new(points, point_json(&p->points[i]));
    bool seen = p->last_seen_unix > 0;
    return json_pack("{si ss so so si so so}", "peer", p->peer, "state", peer_liveness_name(p->liveness), "last_seen",
                     seen ? number(p->last_seen_unix) : json_null(), "seconds_since_seen",
                     seen ? number(now - p->last_seen_unix) : json_null(), "last_upload_step", p->last_upload_step,
                     "latest", p->num_points ? point_json(&p->points[p->num_points - 1]) : json_null(), "points",
                     points);
}

static json_t *round_json(const RoundRecord *r) {
    return json_pack("{si so so sb si sI sI so}", "step", r->step, "started", number(r->started_unix), "duration_s",
                     number(r->duration_s), "partial", r->partial, "peers", r->peers, "bytes_in",
                     (json_int_t)r->bytes_in, "bytes_out", (json_int_t)r->bytes_out, "merge_alpha",
                     number(r->merge_alpha));
}

char *status_json_render(const RunStatus *s, StatusJsonLimits limits, size_t *len) {
    const RoundsStatus *rs = &s->rounds;
    int uploaded_n = rs->num_uploaded < 1024 ? rs->num_uploaded : 1024;
    json_t *uploaded = json_array(), *peers = json_array(), *rounds = json_array();
    for (int i = 0; i < uploaded_n; i++) json_array_append_new(uploaded, json_integer(rs->peers_uploaded[i]));
    for (int p = 0; p < s->num_peers; p++)
        json_array_append_new(peers, peer_json(&s->peers[p], s->now_unix, limits.points));
    for (int i = newest(s->num_rounds, limits.rounds); i < s->num_rounds; i++)
        json_array_append_new(rounds, round_json(&s->round_history[i]));
    char fingerprint[17];
    snprintf(fingerprint, sizeof fingerprint, "%016" PRIx64, rs->fingerprint);
    json_t *doc = json_pack(
        "{so sI si so si sI sI sI ss so sI si si ss so so ss}", "now", number(s->now_unix), "rounds_completed",
        (json_int_t)rs->rounds_completed, "open_step", rs->open_step, "peers_uploaded", uploaded,
        "last_aggregate_step", rs->last_aggregate_step, "bytes_received", (json_int_t)rs->bytes_received, "bytes_sent",
        (json_int_t)rs->bytes_sent, "uploads_rejected", (json_int_t)rs->uploads_rejected, "fingerprint", fingerprint,
        "last_aggregate_seconds", number(rs->last_aggregate_seconds), "rounds_partial", (json_int_t)rs->rounds_partial,
        "last_round_peers", rs->last_round_peers, "total_peers", rs->total_peers, "mode", sync_mode_name(rs->mode),
        "peers", peers, "rounds", rounds, "aggregate_problem", rs->aggregate_problem);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) {
        spes_fail("status: out of memory writing status.json");
        return NULL;
    }
    if (len)
        *len = strlen(text);
    return text;
}
