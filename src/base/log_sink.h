// The bookkeeping of a log-like output that a failing disk must not stop: metrics.jsonl, the
// TensorBoard event file, the console, a SPES peer's sync audit copies. A write that fails is
// not an error of the run (the model and its checkpoints come first): the sink counts what was
// lost and says so twice, not once a line: at the first failure of a streak (the path and the
// cause, errno's text), and when writing works again or at the end (how many were lost, of which
// steps). Pure: the caller writes, passes the outcome, and logs the message it gets back.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *what;           // the output, as messages name it (a path, or "stderr")
    const char *unit;           // what one write holds: "line", "record", "file"
    bool failing;               // the last write failed
    char cause[512];            // why the first write of the current streak failed (errno's text)
    int64_t lost;               // units lost in the current streak
    int64_t first_step, last_step;   // the steps of those (-1: none given)
    int64_t lost_total;         // over the whole run
} LogSink;

typedef enum {
    SINK_QUIET,                 // nothing to say
    SINK_FAILING,               // the first failure of a streak
    SINK_RECOVERED,             // the first write that worked after a streak
} SinkNews;

void log_sink_init(LogSink *s, const char *what, const char *unit);
// After one write of a unit of `step` (-1: none): ok, or failed for `cause` (strerror's text, or
// an error message naming the file). On news, the message to log is in msg (always NUL-terminated).
SinkNews log_sink_note(LogSink *s, bool ok, const char *cause, int64_t step, char *msg, size_t cap);
// At the end of the run: whether units of a streak that never recovered were lost, and the
// message saying so; the sink is quiet after.
bool log_sink_final(LogSink *s, char *msg, size_t cap);
