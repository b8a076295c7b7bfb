// The parameter server's state, independent of the transport: the model spec agreed at the
// handshake, open rounds (uploads per step), and the aggregates kept for download.
//
// Round semantics: the round of `step` completes when every one of the P peers has a valid
// upload for it; the thread whose upload completes it aggregates (aggregate.h) and publishes
// the result, which downloads of that step then return. A bad upload is refused with a status
// and message and leaves the round as it was (the peer may retry; other uploads stay). A
// repeated valid upload from the same peer for an open round replaces its previous one.
// Steps are expected to increase: an upload for a step <= the last completed one is answered
// ROUNDS_ALREADY_AGGREGATED. The newest keep_steps aggregates stay downloadable.
//
// Thread-safe: every function may be called from any call thread.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/aggregate.h"
#include "server/aggregate_view.h"
#include "sync/model_spec.h"
#include "sync/delta_codec.h"
#include "server/outer_optimizer.h"
#include "server/round_deadline.h"
#include "server/server_state.h"
#include "status/run_status.h"


// What a round operation came to. The state machine knows nothing of the transport: the
// server turns each result into its gRPC status in one place (server.c: grpc_status_of), and
// sends the message the operation left with spes_fail.
typedef enum {
    ROUNDS_OK = 0,
    ROUNDS_BAD_REQUEST,         // malformed or invalid input (a payload, a peer id, a step)
    ROUNDS_MISMATCH,            // the peer's model or run settings differ from the run's
    ROUNDS_NO_BASE,             // an int8 delta against an aggregate that is not kept
    ROUNDS_ALREADY_AGGREGATED,  // the step's round is done and has this peer's upload
    ROUNDS_CLOSED_WITHOUT_PEER, // the step's round closed (partial) without this peer
    ROUNDS_TOO_FAR_AHEAD,       // the step is beyond the window of open rounds
    ROUNDS_NOT_KEPT,            // the step was aggregated but its aggregate is no longer kept
    ROUNDS_NO_ROOM,             // too many open rounds, or out of memory
    ROUNDS_CLOSING,             // the server is shutting down
    ROUNDS_STORAGE,             // the upload or state dir cannot be written now (a full disk): retry later
    ROUNDS_SUPERSEDED,          // a newer upload attempt of the same peer began: this older one is dropped
    ROUNDS_INTERNAL,            // the server's own failure (memory, a file it wrote that reads back bad)
} RoundsResult;

// Leaves the message (printf-style, like spes_fail) and returns result.
RoundsResult rounds_fail(RoundsResult result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Logs "server: <what> refused: <the error message>", control bytes escaped as \xNN.
void log_refusal(const char *what);

typedef struct {
    AggregateConfig agg;        // mode, P, m, merge settings
    int keep_steps;             // aggregates kept for download (>= 1)
    size_t max_upload_bytes;    // upload cap while no model spec is known yet (SYNC_PRESPEC_UPLOAD_CAP)
    int max_open_rounds;        // steps with uploads but no aggregate yet (bounds memory)
    const char *state_dir;      // NULL: state in memory only; else persisted there (server_state.h)
                                // and reloaded by rounds_create
    const char *spool_dir;      // without a state dir, uploads wait for their round in a private
                                // directory made under this one (NULL: $TMPDIR, else /tmp)
    double round_timeout_s;     // 0: a round waits for every peer; else round_deadline.h
    int min_peers;              // quorum of a partial round (>= 1)
    int max_rounds_ahead;       // 0: ROUNDS_AHEAD. Uploads more than this many rounds ahead of
                                // the newest completed step are refused ROUNDS_TOO_FAR_AHEAD (below)
    OuterOptConfig outer;       // outer optimizer on the shared tensors (every tensor in fedavg
                                // mode); lr 0 means 1; lr 1 momentum 0: off (the plain mean). The
                                // server alone decides it (peers just download the aggregate); it
                                // is stored in the state dir's spec.json and cannot change mid-run
} RoundsConfig;

// How far ahead of the run an upload may be. The server does not know the peers' sync_steps;
// it takes the round spacing from the gap between the two newest completed rounds, and while
// that is unknown uses max(anchor, ROUNDS_DEFAULT_SPACING) steps. An upload for step s is taken
// when s <= anchor + max_rounds_ahead * spacing, the anchor being the newest completed step, or
// before any round completed the lowest step with uploads. Open rounds that fall outside that
// window, or at or below the newest completed step, are dropped; when every open-round slot is
// taken, the highest open round gives way to a lower step. So a peer uploading far ahead (or
// a bogus step such as 2^31-1) can neither lock the others out nor become the newest round.
#define ROUNDS_AHEAD 4
#define ROUNDS_DEFAULT_SPACING 1000

// Stragglers (--round_timeout): server/round_deadline.h.

// A round whose aggregate could not be written to the state dir (a full disk) keeps its uploads
// and is written again by a waiting peer's call every this many seconds.
#define ROUNDS_PERSIST_RETRY_S 2.0

typedef struct {
    int step;
    uint8_t *bytes;             // the aggregate as safetensors bytes
    size_t len;
    int refs;                   // the kept list holds one; each download in progress one
    bool *included;             // [P] peers whose uploads are in it; NULL: every peer
    AggregateView *views;       // [2 * (P + 1)] built on first use (rounds_view), NULL until then
    // int8 runs: bytes is the aggregate as every peer reconstructs it (F32), delta its int8
    // change against the aggregate of step delta_base (delta_payload.h); NULL for the first
    // round and after a server restart (peers then download bytes whole).
    uint8_t *delta;
    size_t delta_len;
    int delta_base;
    uint32_t crc32c, delta_crc32c;   // crc32c (base/crc32c.h) of bytes and delta, recorded in rounds.json
    size_t header_len;          // its tensors follow: the header's length varies with the step it states
} AggregateBlob;

typedef struct Rounds Rounds;

// With cfg->state_dir, reloads what a previous server left there: the model spec, the
// bookkeeping, the kept aggregates and the uploads of open rounds (completing any round whose
// uploads were all in before the crash).
int rounds_create(const RoundsConfig *cfg, Rounds **out);
// Wakes every waiter (they return ROUNDS_CLOSING) and refuses new work.
void rounds_close(Rounds *r);
void rounds_destroy(Rounds *r);

// payload dtype: F32 or BF16 (uploads and aggregates in it), or I8 (a delta run, int8 or int4 codes
// as its DeltaCodec says: uploads are deltas against an aggregate the server keeps, or full F32
// payloads; the aggregate is kept in F32 and goes down as a delta to peers holding the previous
// one; docs/communication.md).
//
// The cheap half of the handshake: the run settings (peers, peer id, mode, experts per node,
// payload dtype) against the server's, before the peer's tensor list costs anything.
RoundsResult rounds_hello_settings(const Rounds *r, int peer, int num_peers, int experts_per_node, SyncMode mode,
                                       DType payload_dtype);
// The outer optimizer a peer's config expects (HelloRequest.outer_lr / outer_momentum) against
// the server's (--outer_lr / --outer_momentum, or what its --state_dir fixed). stated NULL or
// stated->lr == 0: the peer did not say (an older peer), accepted whatever the server runs, since
// the server alone decides the outer step. A stated pair must equal the server's exactly:
// ROUNDS_MISMATCH with a message naming both pairs and the settings to change.
RoundsResult rounds_hello_outer(const Rounds *r, int peer, const OuterOptConfig *stated);
// The server's outer optimizer settings (for its Hello answer).
OuterOptConfig rounds_outer_config(const Rounds *r);
// Handshake (rounds_hello_settings first). Adopts *spec (moving its contents out) when the server has none yet, otherwise
// compares. The caller frees *spec afterwards in every case. Sets *last_completed_step.
// Results: ROUNDS_OK, ROUNDS_BAD_REQUEST, ROUNDS_MISMATCH (the message names what differs).
RoundsResult rounds_hello(Rounds *r, int peer, int num_peers, int experts_per_node, SyncMode mode, DType payload_dtype,
                              ModelSpec *spec, int *last_completed_step);
// The highest step an upload is taken for now (with an upload of `step` under way: it is the
// anchor before any round completed), the window described above ROUNDS_AHEAD.
int64_t rounds_step_limit(Rounds *r, int step);

// Which process holds peer's id (proto HelloRequest.instance_id, sent with every call; 0: not
// stated, as the seeds' clients do, and never checked). An accepted Hello (hello true) takes the
// peer_id for its instance: a restarted peer is taken at once, even while its dead process's
// calls linger. Any other call (`what`: "upload", "wait", "download") from an instance that no
// longer holds the peer_id is refused ROUNDS_MISMATCH naming both: of two live processes with one
// peer_id, the one that said Hello first is refused at its next call. A call of an unregistered
// peer (after a server restart) registers its instance.
RoundsResult rounds_peer_instance(Rounds *r, int peer, uint64_t instance, bool hello, const char *what);
// The same with the delta codec of an I8 payload (HelloRequest.payload_dtype "I8": DELTA_INT8, "I4":
// DELTA_INT4; rounds_hello takes an I8 payload as int8). Every peer of a run uses one codec; another
// is refused naming both.
RoundsResult rounds_hello_delta(Rounds *r, int peer, int num_peers, int experts_per_node, SyncMode mode,
                                DType payload_dtype, const DeltaCodec *delta, ModelSpec *spec, int *last_completed_step);

// What can be decided about an upload from its first message, before its bytes are buffered:
// peer in range, step not negative, not already aggregated (ROUNDS_ALREADY_AGGREGATED / ROUNDS_CLOSED_WITHOUT_PEER as in
// rounds_upload), not too far ahead (ROUNDS_TOO_FAR_AHEAD), a round slot for it now (ROUNDS_NO_ROOM),
// server not closing. *cap: the largest
// upload accepted from peer (its tensors in F32 + header room once the spec is known, else
// max_upload_bytes), set whatever the status.
RoundsResult rounds_upload_start(Rounds *r, int peer, int step, size_t *cap);
// The model's size in F32 (0 until the spec is known).
size_t rounds_model_bytes(Rounds *r);
// The largest upload cap of any peer (0 until the spec is known).
size_t rounds_largest_upload(Rounds *r);
// One more reference to a blob from rounds_get (released with rounds_release).
void rounds_retain(Rounds *r, AggregateBlob *blob);

// An upload received chunk by chunk: rounds_upload_begin (after rounds_upload_start said OK)
// opens a temp file in the upload dir, rounds_upload_append writes each chunk to it as it
// arrives (an upload in flight costs one chunk of memory, whatever its size), and
// rounds_upload_finish validates the complete file (mapped back a window at a time), makes it
// the peer's upload of the round and, if it completes the round, aggregates, with the statuses
// of rounds_upload. rounds_upload_abort drops an unfinished one; finish always closes it.
//
// Attempts of one peer's upload may overlap: a peer whose side of the call gave up (its deadline,
// a dropped link) retries while the server still receives or validates the first stream, and both
// would end under one file name. The newest attempt wins: begun, it supersedes every older one
// of its peer still in flight, which is refused ROUNDS_SUPERSEDED at its next chunk
// (rounds_upload_current) or at the latest before its file could replace the newer one's
// (finish); the server also cancels the older call at once (server.c: upload_begin), since a
// stalled stream sends no next chunk. Refusing the newer one instead would lock a retrying peer out until the server
// noticed the first stream was dead (its idle timeout); and the older attempt's peer is gone or
// has moved on. A newer attempt that fails leaves the round without this peer's upload until it
// retries, as any failed upload does.
typedef struct {
    StateUpload file;
    int peer, step;
    uint64_t attempt;           // its number among all attempts (rounds_upload_begin)
} RoundsUpload;
RoundsResult rounds_upload_begin(Rounds *r, int peer, int step, RoundsUpload *up);
RoundsResult rounds_upload_append(RoundsUpload *up, const void *data, size_t len);
// ROUNDS_OK while up is its peer's newest attempt, else ROUNDS_SUPERSEDED (message set).
RoundsResult rounds_upload_current(Rounds *r, const RoundsUpload *up);
RoundsResult rounds_upload_finish(Rounds *r, RoundsUpload *up);
void rounds_upload_abort(RoundsUpload *up);

// One complete upload in memory (safetensors bytes; ownership passes to r on every path):
// rounds_upload_begin + append + finish. Validates, stores and, if it completes the round,
// aggregates before returning.
// Results: ROUNDS_OK, ROUNDS_BAD_REQUEST (bad payload), ROUNDS_NO_BASE (an int8 delta against an
// aggregate the server no longer has: send it whole), ROUNDS_ALREADY_AGGREGATED (round already
// aggregated with this peer's upload), ROUNDS_CLOSED_WITHOUT_PEER (round closed without this peer:
// fetch the newest aggregate), ROUNDS_NO_ROOM (too many open rounds, out of memory), ROUNDS_CLOSING.
RoundsResult rounds_upload(Rounds *r, int peer, int step, uint8_t *bytes, size_t len);

// The aggregate of step, waiting up to timeout_s (0: just look). *out is a reference to
// release with rounds_release, or NULL when not ready in time.
// Results: ROUNDS_OK (ready or not), ROUNDS_NOT_KEPT (aggregated but no longer kept), ROUNDS_CLOSING.
RoundsResult rounds_get(Rounds *r, int step, double timeout_s, AggregateBlob **out);
void rounds_release(Rounds *r, AggregateBlob *blob);

// What a download asks for (proto WaitAggregateRequest / DownloadChunkRequest): the whole
// aggregate by default; with omit_own_experts, without the peer's own experts where the round
// took them unchanged from the peer's upload (spes mode, the peer in the round, no merging on
// that step); with a delta base, the delta (the run's codec) against the aggregate of that step
// where the server has one (rounds of a delta run). The view actually served is named in *name:
// "", "omit-own-experts", "int8-delta" or "int8-delta+omit-own-experts" (int4 runs: "int4-delta"
// ...; also in the view's __metadata__ "spes_view"; the names: sync/model_spec.h SYNC_VIEW_*).
// The view lives as long as blob.
typedef struct {
    bool omit_own_experts;
    bool has_delta_base;
    int delta_base_step;
} RoundsViewRequest;
RoundsResult rounds_view(Rounds *r, AggregateBlob *blob, int peer, const RoundsViewRequest *req,
                             const AggregateView **view, const char **name);

// bytes of step's aggregate went to a peer (the Status counters and the round history).
void rounds_count_sent(Rounds *r, int step, size_t bytes);
// An upload refused before it reached rounds_upload (token, call limit, chunk stream errors,
// size caps): counted in uploads_rejected like the others.
void rounds_count_rejected(Rounds *r);
void rounds_status(Rounds *r, RoundsStatus *out);
int rounds_last_completed_step(Rounds *r);
// The peers' last calls, their reported metrics and the round history (server/peer_watch.h; the
// transport tells it who called); rounds_run_status (below) reads it out.
// Liveness, in short (exactly: peer_watch.h): late = the open round has waited on the peer
// longer than 3 x the usual full round (at least 2 s); missing = silent for longer than 3 x the
// round spacing, the deadline and 30 s, or left out of the newest (partial) round and silent
// since it closed.
typedef struct PeerWatch PeerWatch;
PeerWatch *rounds_watch(Rounds *r);
// The run as an operator sees it (status/run_status.h), filled from the round state: what the
// gRPC Status call returns, each peer's liveness (rule: server/peer_watch.h), last call, last
// upload step and reported metrics, and the newest rounds. Allocates *out (run_status_alloc with
// the run's peer count) and fills it; the caller frees it with run_status_free. SPES_ERR
// (nothing to free) when out of memory.
int rounds_run_status(Rounds *r, RunStatus *out);
