// How long a peer gives one upload or download call, as pure functions of the bytes it moves
// (no clock, no gRPC): a stalled server (one that takes the call and never answers, or trickles
// bytes) is given up after about what the call needs on a slow link, not a fixed 30 minutes.
//
// deadline = SYNC_CALL_FLOOR_S + bytes x sharing / SYNC_MIN_RATE, at most the cap
// (SyncClientConfig.call_timeout_s). `sharing`: calls in flight together on the link (a download
// keeps DOWNLOAD_WINDOW chunks in flight, so each may get a quarter of the rate). The floor covers
// the round trip and the server's own work before it answers (an upload that completes a round
// waits for the aggregate to be computed and written). A link slower than SYNC_MIN_RATE is not
// served; the cap keeps the old limit for the largest calls (a 1 GB upload: 30 min, as before).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#define SYNC_CALL_FLOOR_S 60.0
#define SYNC_MIN_RATE (64.0 * 1024)   // bytes/s: the slowest link a call is waited for

// The deadline in seconds of a call moving `bytes` with `sharing` (>= 1) calls in flight on the
// link; cap_s <= 0: no cap.
double sync_call_deadline(size_t bytes, int sharing, double cap_s);
// The bytes one DownloadChunk call of a download of `total` bytes in `chunks` calls may carry:
// the server's chunk_size where its Hello stated one (0: not stated; then an even split), never
// more than the whole download.
size_t sync_download_chunk_bytes(size_t total, int chunks, size_t chunk_size);

// Who ended a call that failed DEADLINE_EXCEEDED after elapsed_s, its deadline being deadline_s:
// this peer (its deadline had run out, or its own timer of one upload message stopped the call:
// own_timer), or the server before that deadline (its --idle_timeout_seconds cancels a call that
// makes no progress: this peer, or its link, was the slow side). A status within
// SYNC_DEADLINE_SLACK_S of the deadline counts as the deadline's.
typedef enum { SYNC_DEADLINE_PEER, SYNC_DEADLINE_SERVER } SyncDeadlineSide;
#define SYNC_DEADLINE_SLACK_S 1.0
SyncDeadlineSide sync_deadline_side(double elapsed_s, double deadline_s, bool own_timer);
