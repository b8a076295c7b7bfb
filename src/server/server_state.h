// The parameter server's state on disk (`spes server --state_dir DIR`), so that a server
// killed at any point restarts where it was. Every file is written atomically (temp + fsync +
// rename + fsync of the directory), so a crash leaves the old file or the new one.
//
//   DIR/lock                             flock'd by the server using the dir (one server per dir)
//   DIR/spec.json                        model spec + run settings (the flags a restart must keep), written
//                                        once at the handshake
//   DIR/rounds.json                      bookkeeping: last completed step, rounds completed, partial rounds
//   DIR/upload_s<step>_p<peer>.safetensors   each accepted upload of a round not yet aggregated
//   DIR/aggregate_s<step>.safetensors    each kept aggregate
//   DIR/aggregate_s<step>.peers.json     for a partial round: the peers in it (written first)
//   DIR/outer_s<step>.bin                with --outer_lr/--outer_momentum: the outer optimizer's state
//                                        after the round of step (written before its aggregate)
//
// Order of writes (rounds.c): an upload is on disk before the peer hears OK; an aggregate and
// then rounds.json are on disk before any peer can download the aggregate; only then are the
// round's uploads and the aggregate that dropped out of the kept list removed. Files left over
// by a crash between those steps (uploads of a completed step, aggregates beyond keep_steps)
// are recognised and removed at the next start.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/aggregate.h"
#include "sync/delta_codec.h"
#include "sync/model_spec.h"
#include "server/outer_optimizer.h"

// What rounds.json records of a kept aggregate, so that a restart serves only the bytes it
// wrote: a damaged file, or another step's aggregate copied over it, no longer matches.
typedef struct {
    int step;
    uint64_t bytes;
    uint32_t crc32c;                // base/crc32c.h: crc32c of the aggregate's bytes
    bool has_delta;                 // delta runs: its aggregate_s<step>.int8.safetensors
    uint64_t delta_bytes;
    uint32_t delta_crc32c;
} StateKept;

#define STATE_MAX_KEPT 1000         // kept aggregates rounds.json may list (--keep_steps' bound)

typedef struct {
    int last_completed_step;        // -1: none
    int64_t rounds_completed;
    int64_t rounds_partial;         // completed without every peer (round timeout)
    // The kept aggregates, newest first. Written by every server since issue 29; a rounds.json
    // of an older one (version 1) lists none and has no check: verified is then false.
    StateKept kept[STATE_MAX_KEPT];
    int n_kept;
    bool verified;
} StateBook;

// The entry of step in book, or NULL.
const StateKept *state_book_find(const StateBook *book, int step);

// Creates dir if needed and takes an exclusive lock on DIR/lock (flock), held until
// state_close(*lock_fd); another server's lock on the same dir is an error naming it.
int state_open(const char *dir, int *lock_fd);
void state_close(int lock_fd);

// Writes / reads spec.json. state_load_spec sets *found false when the file does not exist;
// a file from a run with other settings (peers, experts per node, mode) is an error naming both.
// The outer optimizer settings are stored only when it is on (spec.json of a run without it
// keeps its old bytes); a file whose settings differ from `outer` is refused, naming both.
// So are the expert merging and rotation flags of agg (always stored; server_state.c:
// RUN_FLAGS says which and why); a file of an older server, without them, loads, and is
// rewritten with agg's so that later restarts are checked.
// The payload is stored by its Hello name ("F32", "BF16", "I8", "I4"); a delta run's reads back
// as DTYPE_I8 with its codec (*delta; NULL otherwise).
int state_save_spec(const char *dir, const AggregateConfig *agg, const OuterOptConfig *outer, const ModelSpec *spec,
                    const char *payload_name);
int state_load_spec(const char *dir, const AggregateConfig *agg, const OuterOptConfig *outer, ModelSpec *spec,
                    DType *payload_dtype, const DeltaCodec **delta, bool *found);

// rounds.json (version 2) carries "check", the CRC-32C of its fields in a fixed text form, so a
// hand-edited or damaged file is refused by name instead of rewinding or skipping rounds.
int state_save_book(const char *dir, const StateBook *book);
int state_load_book(const char *dir, StateBook *book, bool *found);

int state_save_upload(const char *dir, int step, int peer, const uint8_t *bytes, size_t len);
int state_save_aggregate(const char *dir, int step, const uint8_t *bytes, size_t len);

// An upload written to dir as its chunks arrive, so that an upload in flight costs the server
// one chunk of memory, not the upload: a private temp file "upload_s<step>_p<peer>.safetensors
// .part.<pid>.<n>" (ignored by state_list, removed by state_remove_partial at the next start),
// made visible under the upload's name only by state_upload_flush (fsync) then state_upload_commit
// (rename, fsync of the directory): a crash leaves the previous file or the complete new one,
// never a torn one.
typedef struct {
    int fd;                     // -1: closed
    char *dir, *temp_path;
    int step, peer;
    size_t len;                 // bytes written so far
} StateUpload;
int state_upload_open(const char *dir, int step, int peer, StateUpload *up);
int state_upload_append(StateUpload *up, const void *data, size_t len);
// Makes the temp file's bytes durable and closes it (the slow part of a commit).
int state_upload_flush(StateUpload *up);
// Renames the flushed temp file to the upload's name (replacing an earlier upload of that peer and
// step) and makes the rename durable.
int state_upload_commit(StateUpload *up);
// Closes and removes the temp file (safe on a zeroed or already committed one).
void state_upload_abort(StateUpload *up);
// Removes the temp files of uploads interrupted by a crash (best effort).
void state_remove_partial(const char *dir);
// The peers in a partial round's aggregate; state_load_included sets *included NULL (every
// peer) when there is no such file.
int state_save_included(const char *dir, int step, const bool *included, int num_peers);
int state_load_included(const char *dir, int step, int num_peers, bool **included);
// Removes a step's .peers.json (none is fine): a full round's aggregate must not find one a
// crash left from the partial close of the same round before it.
int state_remove_included(const char *dir, int step);
// The files kept beside the aggregate of a step, and removed with it; each is bytes written whole
// (atomically) and read back whole:
//   STATE_BLOB_DELTA  delta runs: the delta the aggregate goes down as,
//                     "aggregate_s<step>.int8.safetensors", so that a restarted server serves the
//                     same bytes (a peer downloading across a restart must get the view it started);
//                     state_load_blob sets *bytes NULL when there is none;
//   STATE_BLOB_OUTER  the outer optimizer's state after the round of step
//                     (outer_opt_state_serialise bytes), "outer_s<step>.bin"; state_load_blob: a
//                     missing file is an error naming it.
typedef enum { STATE_BLOB_DELTA, STATE_BLOB_OUTER } StateBlob;
int state_save_blob(const char *dir, StateBlob blob, int step, const uint8_t *bytes, size_t len);
int state_load_blob(const char *dir, StateBlob blob, int step, uint8_t **bytes, size_t *len);
// Renames an upload file a restart cannot take aside ("<name>.<suffix>", which state_list
// ignores), logging "<path> <why>; moved aside to <path>.<suffix>": one bad file must not keep the
// server from starting.
void state_set_aside_upload(const char *dir, int step, int peer, const char *suffix, const char *why);
// Removing is best effort (a leftover is cleaned up at the next start); failures are logged.
void state_remove_upload(const char *dir, int step, int peer);
void state_remove_aggregate(const char *dir, int step);   // and its .peers.json, .int8 delta, outer state

// The files present: kind 'u' (upload, peer >= 0) or 'a' (aggregate, peer -1).
typedef struct {
    char kind;
    int step;
    int peer;
} StateFile;
// Lists the upload and aggregate files of dir, sorted by (kind, step, peer); *out malloc'd.
int state_list(const char *dir, StateFile **out, int *count);
// Its path in dir (malloc'd).
char *state_file_path(const char *dir, const StateFile *f);
// Reads one of them (malloc'd bytes).
int state_read(const char *dir, const StateFile *f, uint8_t **bytes, size_t *len);
