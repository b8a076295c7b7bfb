// Inside the parameter server's round state (rounds.h): the structures and the functions that
// rounds.c (the state machine, aggregation, downloads) shares with rounds_restore.c (reloading
// a state dir at start). Nothing outside those files includes this.
#pragma once
#include <pthread.h>

#include "base/file.h"
#include "io/safetensors.h"
#include "server/peer_watch.h"
#include "server/rounds.h"

typedef struct {
    int step;                   // -1: free slot
    bool aggregating;           // all uploads in; no more changes
    int num_uploaded;
    bool *uploaded;             // [P] its accepted upload is in upload_dir (not in memory)
    double opened_at;           // now_seconds() of its first upload
    double opened_unix;         // the same in wall-clock time (the status page's round history)
    int64_t bytes_in;           // upload bytes taken for it (retries too)
    bool warned;                // "cannot close partially" logged once
    // Its aggregate could not be written (a full disk under the state dir): the round keeps its
    // uploads and is aggregated again by a waiter from this time on (now_seconds; 0: never failed).
    double retry_at;
} OpenRound;

struct Rounds {
    RoundsConfig cfg;
    pthread_mutex_t mu;
    pthread_mutex_t persist_mu; // orders the writes of aggregates + rounds.json with their publishing
    pthread_mutex_t aggregate_mu;   // one aggregation at a time: bounds the memory of completing rounds
    char *upload_dir;           // where accepted uploads wait for their round: the state dir, or a
    bool own_upload_dir;        // private spool dir (removed at the end)
    pthread_cond_t changed;     // an aggregate was published, or closing
    bool closing;

    bool have_spec;             // once set, spec and the layout below never change
    ModelSpec spec;
    DType payload_dtype;        // dtype of the aggregate (the peers' payload dtype; F32 in int8 runs)
    DType wire_dtype;           // the peers' payload dtype from Hello (I8 in int8 runs)
    bool delta_run;                  // a delta run (wire_dtype I8): int8 or int4 codes, as delta says
    const DeltaCodec *delta;    // the run's delta codec (NULL: an F32 / BF16 run)
    // Every aggregate: its header stating its step (rounds_aggregate_header: as long as the step's
    // digits make it, at most header_cap), then the tensors back to back in spec order.
    size_t header_cap, data_len;
    size_t aggregate_cap;       // header_cap + data_len: what the bytes of every blob hold
    size_t *tensor_offset;      // [spec.count] byte offset of tensor t in the aggregate's data

    OpenRound *open;            // [max_open_rounds]
    AggregateBlob **kept;       // [keep_steps], NULL: empty
    uint8_t *spare;             // bytes of a dropped aggregate, reused by the next round: a fresh
                                // model-sized buffer would page-fault through every byte again
    int last_completed_step;
    int prev_completed_step;    // the completed step before it (-1: none): their gap is the round spacing
    int64_t rounds_partial;
    double recent[ROUNDS_RECENT];   // durations of the last rounds completed by every peer (ring)
    int n_recent;
    RoundsStatus stats;         // counters (open_step / peers are computed on demand)
    int lock_fd;                // the state dir's lock (server_state.h), -1 without one
    bool outer_on;              // cfg.outer is not off
    OuterOptState outer;        // its state after the newest published aggregate (under mu;
                                // replaced under aggregate_mu, so rounds step it in turn)
    uint64_t *instance;         // [P] the process holding each peer_id (HelloRequest.instance_id); 0: none yet
    uint64_t attempts;          // upload attempts begun so far (RoundsUpload.attempt)
    uint64_t *newest_attempt;   // [P] each peer's newest one: it wins over older ones in flight
    pthread_mutex_t commit_mu;  // one upload's check-then-rename into its final name at a time
    PeerWatch *watch;           // peers' last calls and metrics, round history (own lock, taken
                                // after mu where both are held)
};

// Writes the header of step's aggregate (stating its spes_step, aggregate_step.h) into
// out[r->header_cap]; *header_len: its length, where the tensors begin.
int rounds_aggregate_header(const Rounds *r, int step, uint8_t *out, size_t *header_len);
// Tensor t's bytes in an aggregate blob.
static inline uint8_t *rounds_blob_tensor(const Rounds *r, const AggregateBlob *blob, int t) {
    return blob->bytes + blob->header_len + r->tensor_offset[t];
}
// The kept aggregate of step, or NULL. Under r->mu.
AggregateBlob *rounds_find_kept(Rounds *r, int step);
// Elements per tensor of the outer optimizer's state (0: not covered); malloc'd, NULL: out of memory.
int64_t *rounds_outer_numel(const Rounds *r);
// Takes spec as the run's model (moving its contents out); with persist, writes it to the state dir.
RoundsResult rounds_adopt_spec(Rounds *r, ModelSpec *spec, DType payload_dtype, const DeltaCodec *delta, bool persist);
// Warns when the upload dir's filesystem has less free space than a round needs (state_space.h);
// kept_now: aggregates already in the state dir. Once the spec is known.
void rounds_check_space(Rounds *r, int kept_now);
// Validates an upload's bytes against the spec (st parsed from them; row: its tensors in spec order).
RoundsResult rounds_check_upload(Rounds *r, int peer, int step, const uint8_t *bytes, size_t len, SafeTensors *st,
                                 const StTensor **row);
// Makes the upload file of len bytes peer's upload of step; *complete when every peer is in.
RoundsResult rounds_store_upload(Rounds *r, int peer, int step, size_t len, OpenRound **round_out, bool *complete);
// Aggregates a round whose uploads are all in (peer: the one whose upload completed it).
RoundsResult rounds_complete_round(Rounds *r, OpenRound *round, int peer);
// Makes blob the aggregate of round's step, kept for download.
int rounds_publish(Rounds *r, OpenRound *round, AggregateBlob *blob, double seconds);
// Frees an open round's bookkeeping (its slot becomes free).
void rounds_free_round(Rounds *r, OpenRound *round);
// Drops a reference; the last one frees the blob (keeping its bytes as the spare). Under r->mu.
void rounds_blob_unref(Rounds *r, AggregateBlob *blob);
// Drops open rounds that can never become the newest aggregate (at or below the newest completed
// step, or beyond the window of rounds ahead); step: an upload under way. Under r->mu.
void rounds_sweep_rounds(Rounds *r, int step);
// Lets go of the pages of a read-only mapping that hold [p, p + n) (dropped from RSS, not lost).
void rounds_drop_pages(const MappedFile *mf, const uint8_t *p, size_t n);
// An int8 delta upload checked against its base (acc NULL) or, with acc, also added to the aggregate.
RoundsResult rounds_int8_upload_walk(Rounds *r, int peer, int step, const SafeTensors *st, int base_step,
                                     AggregateAcc *acc);
// Whether an upload is an int8 delta (*is_int8, its base step in *base); refuses one in a run
// that is not int8 (and a bad header).
RoundsResult rounds_upload_kind(Rounds *r, int peer, int step, const SafeTensors *st, bool *is_int8, int *base);
// With a state dir: reloads spec, bookkeeping, kept aggregates and open rounds' uploads.
int rounds_restore_state(Rounds *r);
