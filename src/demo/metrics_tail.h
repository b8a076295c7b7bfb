// Follows a metrics.jsonl (src/train/metrics.h) that a training process is still appending
// to, for the demo's live view. Each poll reads only the bytes appended since the previous
// one, so watching a run costs O(its output) in all, not O(output^2) as re-reading the whole
// file every second did. A last line whose '\n' has not been written yet is left for the
// next poll. Evaluation records (lines with an "eval" key) are skipped: the view shows
// training progress, taken from the newest complete training record.
#pragma once
#include <stdint.h>
#include <sys/types.h>

typedef struct {
    char *path;
    off_t offset;           // bytes of complete lines read so far
    dev_t dev;              // the file read (0, 0: none yet): another one at path is read from its start
    ino_t ino;
    int64_t step;           // newest training record's "step"; 0 before the first
    double loss;            // its "ce"; NAN before the first
    double tokens_per_s;    // its "perf"."tokens_per_s"; NAN before the first
} MetricsTail;

int metrics_tail_init(MetricsTail *t, const char *path);
// Reads what was appended since the last poll. A file that does not exist yet is no error
// (the process has not written a step); a file shorter than what was read (rewritten from
// the start), or another file at the path (removed and started anew), is read from its beginning.
void metrics_tail_poll(MetricsTail *t);
void metrics_tail_free(MetricsTail *t);
