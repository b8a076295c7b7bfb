// Which failed calls a peer repeats (with the client's backoff, 0.1 s doubling to 2 s, for up to
// SyncClientConfig.connect_timeout_s; each attempt bounded by its own call deadline,
// call_deadline.h), as a pure function of the call's status and message: no clock, no gRPC call.
//
// Repeated: the server is unreachable (UNAVAILABLE: not up yet, restarting, shutting down, or it
// cannot store an upload now, a full disk); it said "server busy" (RESOURCE_EXHAUSTED: its call
// limit, a token's call cap or the upload budget is full for now); or its gRPC receive quota
// (--max_receive_buffer) reset the call under memory pressure. gRPC's transport resets the stream
// it picks with HTTP/2 RST_STREAM ENHANCE_YOUR_CALM (11), honest or not, and the peer's gRPC
// reports RESOURCE_EXHAUSTED "Received RST_STREAM with error code 11" (gRPC 1.51, checked
// against a real server: tests/integration/server_hostile_peers.sh, case quota_reset); or the
// round the upload completed failed to aggregate ("aggregating step S (retry the upload)": the
// server dropped the upload and reopened the round; a cause that lasts fails every retry, and the
// retries end with connect_timeout_s as for an unreachable server).
//
// Not repeated: every other RESOURCE_EXHAUSTED, which a retry would meet again: an upload larger
// than its tensors can take, a chunk larger than the server's whole upload budget, a request
// larger than its RPC needs, a message beyond gRPC's size limits ("Received message larger than
// max"), every open-round slot taken by lower steps, this client out of memory packing a request.
#pragma once
#include <grpc/status.h>
#include <stdbool.h>

typedef enum {
    SYNC_RETRY_NO,            // a final answer
    SYNC_RETRY_UNREACHABLE,   // UNAVAILABLE
    SYNC_RETRY_BUSY,          // RESOURCE_EXHAUSTED "server busy"
    SYNC_RETRY_QUOTA_RESET,   // RESOURCE_EXHAUSTED: the server's receive quota reset the call
    SYNC_RETRY_AGGREGATION,   // RESOURCE_EXHAUSTED: the upload completed a round whose aggregation
                              // failed (out of memory, a file it could not read), and it says so
} SyncRetry;

// What the server says when the aggregation an upload completed failed (rounds_aggregate.c): the
// upload was dropped and the round reopened, so the same upload can complete it again.
#define SYNC_AGGREGATION_RETRY_MESSAGE "(retry the upload)"

// The message gRPC gives a call whose stream the server reset with ENHANCE_YOUR_CALM.
#define SYNC_QUOTA_RESET_MESSAGE "Received RST_STREAM with error code 11"

// Why a call that failed with `code` and `message` (the server's details, or the client's error
// quoting them; NULL: none) is worth repeating, or SYNC_RETRY_NO.
SyncRetry sync_call_retry(grpc_status_code code, const char *message);
