// RunStatus -> the HTML page the status server sends for GET /: the run's counters, a peers
// table (state, last seen, step, loss, tokens/s), each peer's loss curve and the round
// durations as inline SVG (svg_chart.h), and a rounds table, newest first. No scripts, no
// external resources: it works offline and reloads itself every STATUS_PAGE_REFRESH_S seconds.
// Element ids a test (or a scraper) can rely on: table#peers (tr.peer per peer, with
// data-peer and data-state), svg#loss-curves (polyline#loss-peer-N per peer with points),
// svg#round-times (rect.bar per round), table#rounds (tr.round per round).
#pragma once
#include <stddef.h>

#include "status/run_status.h"

#define STATUS_PAGE_REFRESH_S 5
#define STATUS_PAGE_ROUND_ROWS 50   // rounds listed in the table (the chart shows every kept one)

// The page (malloc'd, NUL-terminated) and its length; NULL with spes_fail when out of memory.
// query_token: the token the page was asked for with (`/?token=...`), kept on its link to
// status.json so a browser that passed it once can follow the link; NULL: none (the page never
// shows a token it was not given: one sent as an Authorization header stays out of the page).
char *status_page_render(const RunStatus *s, const char *query_token, size_t *len);
