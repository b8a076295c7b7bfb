// RunStatus -> the JSON document the status server sends for GET /status.json:
//   {"now": unix s, "rounds_completed", "open_step", "peers_uploaded": [..], "last_aggregate_step",
//    "bytes_received", "bytes_sent", "uploads_rejected", "fingerprint": "16 hex digits",
//    "last_aggregate_seconds", "rounds_partial", "last_round_peers", "total_peers", "mode",
//    "peers": [{"peer", "state": "alive|late|missing|unseen", "last_seen": unix s or null,
//               "seconds_since_seen": s or null, "last_upload_step", "latest": point or null,
//               "points": [{"step", "loss", "ce", "lb", "tokens_per_s", "mfu", "device_mem_mb",
//                           "route_min", "route_max"}, ..]}],
//    "rounds": [{"step", "started", "duration_s", "partial", "peers", "bytes_in", "bytes_out",
//                "merge_alpha"}, ..]}           (oldest round first)
// Numbers that are not finite are written as null (JSON has no NaN). A client that polls a large
// run asks for less: only the newest `points` metric points of each peer ("latest" stays) and
// the newest `rounds` rounds (GET /status.json?points=N&rounds=M).
#pragma once
#include <stddef.h>

#include "status/run_status.h"

typedef struct {
    int points;   // newest metric points per peer to include; -1: all kept
    int rounds;   // newest rounds to include; -1: all kept
} StatusJsonLimits;

#define STATUS_JSON_ALL ((StatusJsonLimits){-1, -1})

// The document (malloc'd, NUL-terminated) and its length; NULL with spes_fail when out of memory.
char *status_json_render(const RunStatus *s, StatusJsonLimits limits, size_t *len);
