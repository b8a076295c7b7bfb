// Disk space for the parameter server's state dir (or, without one, its spool dir): what a round
// needs there at its fullest, and the warning when the dir's filesystem has less free, said once
// the model is known (at start from a state dir's spec.json, else at the first Hello) instead of
// first as refused uploads. A full disk loses nothing (uploads are refused UNAVAILABLE and peers
// retry, an aggregate that cannot be written waits: docs/operating.md), but the run stalls.
#pragma once
#include <stddef.h>

typedef struct {
    int peers;            // uploads of one round
    size_t upload;        // one peer's upload, at most
    size_t aggregate;     // one aggregate file (0: none on disk, a spool dir)
    size_t beside;        // what a round writes beside its aggregate: its int8/int4 delta, the outer state
    int keep_steps;       // aggregates kept (--keep_steps)
} StateSpace;

// Bytes the dir grows by at its fullest: a round's uploads, and (with aggregates on disk) the
// keep_steps kept plus the one being written, each with what is written beside it, less the
// kept_now already there (at least the one being written).
size_t state_space_needed(const StateSpace *s, int kept_now);

// The check: a warning naming the dir, the bytes needed and free when its filesystem has less free
// than state_space_needed. `flag`: the server's flag that named the dir (--state_dir, --spool_dir).
// Never an error (space may be freed before it is needed); a dir that cannot be asked is a debug line.
void state_space_check(const char *dir, const char *flag, const StateSpace *s, int kept_now);
