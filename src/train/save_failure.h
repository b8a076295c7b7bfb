// What a run does when a checkpoint cannot be written (a full disk, a quota, an I/O error): the
// policy, a pure function of the save's kind, the retry bounds and what happened since the first
// failed attempt. The trainer (train/trainer.c) makes the attempts, waits and reports; with several
// ranks rank 0 decides and every rank follows its answer, so no rank waits in a collective alone.
//
//   SAVE_ON_INTERVAL  save_interval_unsharded: reported, training goes on, the next interval tries
//                     again (the model is still in memory; nothing is lost yet)
//   SAVE_ON_REQUEST   SIGUSR1: retried every `every_s` for up to `for_s` seconds (the signal is
//                     often a scheduler's warning before its time limit); then training goes on
//   SAVE_FINAL        the end of the run, a stop signal's save, a SPES peer's unsynced state:
//                     retried the same way; then the run ends with an error saying what was lost
//
// A stop signal (SIGINT/SIGTERM) that comes while a save waits to retry ends the wait: the
// request's save gives way to training on (to the stop at the next step boundary), the final save
// gives up at once.
#pragma once
#include <stdbool.h>

typedef enum { SAVE_ON_INTERVAL, SAVE_ON_REQUEST, SAVE_FINAL } SaveKind;

typedef enum {
    SAVE_TRAIN_ON,   // leave the step unsaved; training goes on
    SAVE_RETRY,      // wait every_s, then try again
    SAVE_GIVE_UP,    // the run ends with an error naming the steps lost
} SaveAction;

typedef struct {
    double for_s;     // how long after the first failure a retry may still start (0: none)
    double every_s;   // the wait between attempts
} SaveRetry;

// spes train's defaults (--save_retry): every 30 s for up to 10 minutes.
#define SAVE_RETRY_FOR_S 600.0
#define SAVE_RETRY_EVERY_S 30.0

// After a failed attempt: `waited_s` seconds since the first failed attempt of this save,
// `stopped` whether a stop signal came since that save began.
SaveAction save_after_failure(SaveKind kind, const SaveRetry *retry, double waited_s, bool stopped);
