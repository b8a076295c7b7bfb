// Counting what a failing log-like output lost. See log_sink.h.
#include "base/log_sink.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void log_sink_init(LogSink *s, const char *what, const char *unit) {
    memset(s, 0, sizeof *s);
    s->what = what;
    s->unit = unit;
    s->first_step = s->last_step = -1;
}

// "3 lines (steps 600-620)", "1 line (step 600)" or "2 files".
static void describe_lost(const LogSink *s, char *out, size_t cap) {
    int n = snprintf(out, cap, "%" PRId64 " %s%s", s->lost, s->unit, s->lost == 1 ? "" : "s");
    if (n < 0 || (size_t)n >= cap || s->first_step < 0) return;
    if (s->first_step == s->last_step) snprintf(out + n, cap - (size_t)n, " (step %" PRId64 ")", s->first_step);
    else snprintf(out + n, cap - (size_t)n, " (steps %" PRId64 "-%" PRId64 ")", s->first_step, s->last_step);
}

// Ends a streak of failures: its message (format: what, cause, what was lost) into msg, and the
// counts back to none.
static void close_streak(LogSink *s, const char *format, char *msg, size_t cap) {
    char lost[96];
    describe_lost(s, lost, sizeof lost);
    snprintf(msg, cap, format, s->what, s->cause, lost);
    s->failing = false;
    s->lost = 0;
    s->first_step = s->last_step = -1;
}

SinkNews log_sink_note(LogSink *s, bool ok, const char *cause, int64_t step, char *msg, size_t cap) {
    if (cap) msg[0] = '\0';
    if (ok) {
        if (!s->failing) return SINK_QUIET;
        close_streak(s, "%s is written again; lost while it could not be (%s): %s", msg, cap);
        return SINK_RECOVERED;
    }
    s->lost++;
    s->lost_total++;
    if (step >= 0) {
        if (s->first_step < 0) s->first_step = step;
        s->last_step = step;
    }
    if (s->failing) return SINK_QUIET;
    s->failing = true;
    snprintf(s->cause, sizeof s->cause, "%s", cause ? cause : "unknown error");
    char at[48] = "";
    if (step >= 0) snprintf(at, sizeof at, " at step %" PRId64, step);
    snprintf(msg, cap,
             "cannot write %s%s: %s. Training goes on without it; each later %s is tried again, and what is lost "
             "is counted and said when writing works again or at the end",
             s->what, at, s->cause, s->unit);
    return SINK_FAILING;
}

bool log_sink_final(LogSink *s, char *msg, size_t cap) {
    if (cap) msg[0] = '\0';
    if (!s->failing || s->lost == 0) return false;
    close_streak(s, "%s could not be written up to the end of the run (%s); lost: %s", msg, cap);
    return true;
}
