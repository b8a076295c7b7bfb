// The run as an operator sees it (status/run_status.h), filled from the round state: what the
// gRPC Status call returns, each peer's liveness (rule: server/peer_watch.h), last call, last
// upload step and reported metrics, and the newest rounds. Separate from rounds.h because
// status/run_status.h includes rounds.h (for RoundsStatus).
#pragma once
#include "status/run_status.h"
#include "server/rounds.h"

// Allocates *out (run_status_alloc with the run's peer count) and fills it; the caller frees it
// with run_status_free. SPES_ERR (nothing to free) when out of memory.
int rounds_run_status(Rounds *r, RunStatus *out);
