// The straggler policy of the parameter server, as pure functions of the numbers it needs (no
// clock, no lock, no round state): when an open round stops waiting for its missing peers.
//
// With round_timeout_s > 0 a round that has waited rounds_deadline(...) seconds since its first
// upload, and has at least min_peers uploads, is aggregated with the peers that arrived
// (aggregate_compute_partial: shared tensors averaged over them, a missing owner's experts keep
// the latest aggregate's values) and marked partial. The deadline adapts to the run:
// max(round_timeout_s, 3 x the median duration of the last (up to ROUNDS_RECENT) rounds that
// completed with every peer). The first round of a spes run is never partial (a missing
// owner's experts have no earlier value). A waiter for the round (WaitAggregate,
// DownloadChunk) closes it (rounds.h); a late upload for a closed round is answered
// ROUNDS_CLOSED_WITHOUT_PEER with the newest step, and the peer fetches that aggregate and
// carries on.
#pragma once
#include <stdbool.h>

#define ROUNDS_RECENT 8

// max(round_timeout_s, 3 x the median of recent[0..n)) (n capped at ROUNDS_RECENT; n 0: recent
// may be NULL).
double rounds_deadline(double round_timeout_s, const double *recent, int n);

typedef struct {
    double round_timeout_s;     // 0: rounds wait for every peer
    double opened_at, now;      // the round's first upload and now, monotonic seconds
    const double *recent;       // durations of the last full rounds
    int n_recent;
    int uploaded, min_peers;    // uploads in the round, the quorum of a partial round
    bool needs_earlier;         // spes mode: missing owners' experts need an earlier aggregate
    bool have_earlier;          // an aggregate of an earlier step is kept
} RoundWait;

typedef enum {
    ROUND_KEEP_WAITING,         // before the deadline (or no timeout): *due is the deadline (0: none)
    ROUND_PAST_DEADLINE_NO_QUORUM,  // past it, but it may not close yet: look again at *due
    ROUND_CLOSE_PARTIAL,        // past it with a quorum: aggregate the peers that arrived
} RoundWaitDecision;

RoundWaitDecision round_wait_decide(const RoundWait *w, double *due);
