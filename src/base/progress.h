// One-line progress display with rate and ETA on stderr. Redraws in place on a terminal,
// prints a plain line every few seconds otherwise (CI logs stay readable).
#pragma once
#include <stdint.h>

typedef struct {
    const char *label;
    const char *unit;         // e.g. "docs", "steps"
    uint64_t total;           // 0 when unknown (no ETA)
    uint64_t done;
    double start_time;
    double last_draw;
    int is_tty;
} Progress;

void progress_start(Progress *p, const char *label, const char *unit, uint64_t total);
// Sets the count and redraws at most ~10x a second; `extra` (may be NULL) is appended.
void progress_update(Progress *p, uint64_t done, const char *extra);
void progress_finish(Progress *p, const char *extra);
// "1h02m", "3m05s", "12s" into buf.
void format_duration(double seconds, char *buf, int bufsize);
