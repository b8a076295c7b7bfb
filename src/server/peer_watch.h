// What the parameter server knows about its peers and rounds beyond the round state itself, for
// an operator (status/run_status.h: the status page and `spes status`): when each peer last
// called, the step it last uploaded, the metrics it reported with its uploads (the newest
// RUN_STATUS_POINTS per peer), and the history of the newest RUN_STATUS_ROUNDS rounds.
//
// Liveness (peer_liveness below; docs/communication.md says the same):
//   unseen   never called;
//   missing  silent for longer than missing_after_s = max(PEER_MISSING_MIN_S, 3 x the longest gap
//            between the starts of the last ROUNDS_RECENT rounds, the round deadline); or left out
//            of the newest round, which closed partial (--round_timeout), and silent since it closed;
//   late     not missing, and the open round (the lowest step with uploads) has waited on it for
//            longer than late_after_s = max(PEER_LATE_MIN_S, 3 x the median duration of the last
//            rounds every peer made: the adaptive part of rounds_deadline);
//   alive    otherwise.
// A peer is "seen" at the start and at the end of each of its calls (Hello, UploadChunk,
// WaitAggregate, DownloadChunk), so a peer in a long poll counts as present.
//
// Thread-safe (one mutex); wall-clock times are Unix seconds, durations monotonic.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "status/run_status.h"

#define PEER_LATE_MIN_S 2.0
#define PEER_MISSING_MIN_S 30.0

typedef struct {
    double now_unix;
    double last_seen_unix;          // 0: never
    bool awaited;                   // an open round exists and has no upload from this peer
    double open_wait_s;             // how long that round has waited since its first upload
    bool left_out_of_partial;       // the newest completed round closed partial without this peer
    double partial_closed_unix;     // when it closed
    double late_after_s, missing_after_s;
} PeerLivenessInput;
PeerLiveness peer_liveness(const PeerLivenessInput *in);

// The thresholds above from the durations of the last full rounds (recent[n], as rounds_deadline
// takes them), the starts of the newest rounds (starts[n_starts], oldest first) and the round
// deadline (0 without --round_timeout).
void peer_liveness_thresholds(const double *recent, int n, const double *starts, int n_starts, double deadline_s,
                              double *late_after_s, double *missing_after_s);

typedef struct PeerWatch PeerWatch;

int peer_watch_create(int num_peers, PeerWatch **out);
void peer_watch_free(PeerWatch *w);

// peer called now (peer outside [0, P): ignored).
void peer_watch_seen(PeerWatch *w, int peer);
// peer's upload for step was accepted.
void peer_watch_uploaded(PeerWatch *w, int peer, int step);
// Metric points peer reported (oldest first) with an accepted upload (the server hands them over
// only once the upload is taken). Points at or before the newest kept step are resends (a retried
// upload) and skipped; points with a negative step, a step beyond max_step (the highest step the
// run takes uploads for, rounds_step_limit: an overlapped peer logs a few steps past its upload's
// before it goes), or a value that is not finite (or out of its range: negative throughput, memory or
// routing ratios, mfu outside [0, 1e3], a loss beyond +-PEER_MAX_LOSS) are ignored with one log line per call; more than
// SYNC_MAX_METRIC_POINTS: the newest kept. Returns the number of points taken.
int peer_watch_metrics(PeerWatch *w, int peer, int64_t max_step, const PeerMetricPoint *points, int n);

// A round was aggregated (rounds_completed grows): its record goes into the history (the oldest
// dropped when full). included[P] the peers in it (NULL: every peer).
void peer_watch_round(PeerWatch *w, const RoundRecord *rec, const bool *included);
// bytes of step's aggregate were sent to a peer.
void peer_watch_sent(PeerWatch *w, int step, int64_t bytes);

// Fills out's peers (liveness from the given open-round state: awaited[p], open_wait_s; a NULL
// awaited: no open round) and round history, and uses recent/deadline for the thresholds. out
// comes from run_status_alloc with P peers.
void peer_watch_fill(PeerWatch *w, const bool *awaited, double open_wait_s, const double *recent, int n_recent,
                     double deadline_s, RunStatus *out);
