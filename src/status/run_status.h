// A SPES run as an operator sees it: what `spes server --status_port` serves as /status.json
// and draws as its page (status_json.h, status_page.h, status_http.h). The server fills one
// on demand from its round state (server/rounds.h: rounds_run_status) and hands it to the
// renderers, which only read it; nothing here knows about gRPC or HTTP.
//
// Peers report metrics with their uploads (proto PeerMetrics); the server keeps the newest
// RUN_STATUS_POINTS per peer and the newest RUN_STATUS_ROUNDS rounds.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "sync/model_spec.h"

#define RUN_STATUS_POINTS 512
#define RUN_STATUS_ROUNDS 256

// The round counters: everything the gRPC Status call returns (server/rounds.h: rounds_status
// fills it on the server, sync/client.h: sync_client_status on a peer).
typedef struct {
    int64_t rounds_completed;
    int open_step;              // lowest step with uploads but no aggregate, -1 if none
    int num_uploaded;           // peers that uploaded for open_step
    int peers_uploaded[1024];   // their ids (first num_uploaded; capped at 1024)
    int last_aggregate_step;    // -1 if none
    int64_t bytes_received, bytes_sent, uploads_rejected;
    uint64_t fingerprint;       // 0 until the spec is known
    double last_aggregate_seconds;
    int64_t rounds_partial;     // rounds closed by the round timeout without every peer
    int last_round_peers;       // peers in the latest aggregate
    int total_peers;            // the run's peer count
    SyncMode mode;
    // Why a round with every upload in has no aggregate yet: the state dir cannot take it
    // ("step 4: cannot write the aggregate to the state dir D: No space left on device"); "" none.
    char aggregate_problem[320];
} RoundsStatus;

// alive: seen recently and keeping up; late: the open round has waited on it longer than
// usual; missing: not seen for much longer than a round takes (server/rounds.h says exactly when);
// unseen: never connected.
typedef enum { PEER_UNSEEN, PEER_ALIVE, PEER_LATE, PEER_MISSING } PeerLiveness;
const char *peer_liveness_name(PeerLiveness l);   // "unseen", "alive", "late", "missing"

// One training step a peer reported (the numbers of its metrics.jsonl line).
typedef struct {
    int64_t step;
    double loss, ce, lb;          // total loss and its cross-entropy and load-balancing terms
    double tokens_per_s, mfu;     // mfu as a fraction (0..1)
    double device_mem_mb;         // GPU memory in use, else the process's peak RSS
    double route_min, route_max;  // least / most loaded expert as a multiple of the even share
} PeerMetricPoint;

// Metric points one upload may carry (proto UploadChunkRequest.metrics); more: the newest kept.
#define SYNC_MAX_METRIC_POINTS 256
// The largest loss magnitude (loss, ce, lb) a metric point may carry.
#define PEER_MAX_LOSS 1e6
// Why a metric point cannot be kept or shown (the rules of server/peer_watch.h: peer_watch_metrics,
// and of what a peer shows of a server's Status), or NULL when it can.
const char *peer_metric_point_problem(const PeerMetricPoint *pt, int64_t max_step);

typedef struct {
    int peer;
    PeerLiveness liveness;
    double last_seen_unix;        // last call from this peer of any kind; 0: never
    int last_upload_step;         // -1: none yet
    int num_points;               // points[0 .. num_points), oldest first
    PeerMetricPoint *points;
} PeerStatus;

typedef struct {
    int step;
    double started_unix;          // first upload of the round
    double duration_s;            // first upload to aggregate
    bool partial;                 // closed by the round timeout without every peer
    int peers;                    // peers in the aggregate
    int64_t bytes_in;             // upload payload bytes taken for this round
    int64_t bytes_out;            // download payload bytes sent of this round's aggregate so far
    double merge_alpha;           // expert-merge weight applied on this round; 0: none
} RoundRecord;

typedef struct {
    double now_unix;              // when it was filled
    RoundsStatus rounds;          // everything the gRPC Status call returns
    int num_peers;
    PeerStatus *peers;            // [num_peers], by peer id
    int num_rounds;
    RoundRecord *round_history;   // [num_rounds], oldest first
} RunStatus;

// Allocates peers (with RUN_STATUS_POINTS points each, num_points 0) and round_history
// (RUN_STATUS_ROUNDS records, num_rounds 0); everything else zero. -1 when out of memory.
int run_status_alloc(RunStatus *s, int num_peers);
void run_status_free(RunStatus *s);
