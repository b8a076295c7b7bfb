// gRPC transport of the parameter server (see server.h): accept loop, one thread per call,
// one handler per RPC.
#include "server/server.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "sync/auth.h"
#include "sync/call_status.h"
#include "server/peer_watch.h"
#include "sync/wire.h"

// The one place where the round state machine's results (rounds.h) become gRPC statuses.
static grpc_status_code grpc_status_of(RoundsResult result) {
    switch (result) {
    case ROUNDS_OK: return GRPC_STATUS_OK;
    case ROUNDS_BAD_REQUEST: return GRPC_STATUS_INVALID_ARGUMENT;
    case ROUNDS_MISMATCH: return GRPC_STATUS_FAILED_PRECONDITION;
    case ROUNDS_NO_BASE: return GRPC_STATUS_FAILED_PRECONDITION;   // the client resends its upload whole
    case ROUNDS_ALREADY_AGGREGATED: return GRPC_STATUS_ALREADY_EXISTS;
    case ROUNDS_CLOSED_WITHOUT_PEER: return GRPC_STATUS_ABORTED;
    case ROUNDS_TOO_FAR_AHEAD: return GRPC_STATUS_OUT_OF_RANGE;
    case ROUNDS_NOT_KEPT: return GRPC_STATUS_NOT_FOUND;
    case ROUNDS_NO_ROOM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case ROUNDS_CLOSING: return GRPC_STATUS_UNAVAILABLE;
    case ROUNDS_STORAGE: return GRPC_STATUS_UNAVAILABLE;   // clients retry with backoff until space is back
    case ROUNDS_SUPERSEDED: return GRPC_STATUS_ABORTED;    // a newer attempt of the peer's upload won
    case ROUNDS_INTERNAL: break;
    }
    return GRPC_STATUS_INTERNAL;
}

typedef struct Call Call;

struct SyncServer {
    SyncServerConfig cfg;
    char *host;
    Rounds *rounds;
    AuthTokens auth;
    grpc_server *server;
    grpc_completion_queue *cq;      // new-call notifications and the shutdown tag
    pthread_t accept_thread;
    int port;
    int shutdown_tag;
    pthread_mutex_t mu;
    pthread_cond_t calls_done;
    int active_calls;
    size_t buffered;                // upload bytes reserved by calls in progress (under mu)
    Call **uploading;               // [P] each peer's newest upload call in progress (under mu; upload_begin)
    int *peer_calls;                // [P] calls in progress of each token-bound peer (under mu)
    pthread_mutex_t hello_mu;       // one Hello unpacked and checked at a time (recv_hello)
};

struct Call {
    SyncServer *srv;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array metadata;
    grpc_completion_queue *cq;      // this call's own queue (pluck)
    int bound_peer;                 // the peer a per-peer token belongs to; -1: any
    bool over_limit;                // arrived while max_calls others were in progress
    int upload_peer;                // the peer whose newest upload this is (srv->uploading); -1: none
    uint64_t upload_attempt;        // its attempt number (RoundsUpload.attempt)
};

void sync_server_config_defaults(SyncServerConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "0.0.0.0";
    cfg->port = 50051;
    cfg->chunk_size = SYNC_DEFAULT_CHUNK_SIZE;
    cfg->max_message_size = SYNC_DEFAULT_MAX_MESSAGE;
    cfg->max_wait_seconds = 30;
    cfg->idle_timeout_seconds = 120;
    cfg->max_calls = 0;   // from the number of peers: sync_server_max_calls
    cfg->rounds.keep_steps = 2;
    cfg->rounds.max_upload_bytes = SYNC_PRESPEC_UPLOAD_CAP;
    cfg->rounds.max_open_rounds = 4;
    cfg->rounds.agg.merge_topk = 4;
}

// ---- call plumbing ----

static Call *call_new(SyncServer *srv) {
    Call *c = spes_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = srv;
    c->upload_peer = -1;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->metadata);
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    return c;
}

static void call_free(Call *c) {
    if (c->call) grpc_call_unref(c->call);
    grpc_completion_queue_shutdown(c->cq);
    while (grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->cq);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->metadata);
    free(c);
}

// The next request message; NULL at the end of the client's stream or when the call failed
// (*ok false: cancelled, idle too long, or the connection dropped).
static grpc_byte_buffer *recv_message(Call *c, bool *ok) {
    grpc_byte_buffer *bb = NULL;
    grpc_op op = {0};
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    *ok = wire_run_batch(c->call, c->cq, &op, 1, c->srv->cfg.idle_timeout_seconds);
    if (!*ok && bb) {
        grpc_byte_buffer_destroy(bb);
        bb = NULL;
    }
    return bb;
}

// Sends the response (when code is OK) and the final status; details from spes_last_error().
static void finish(Call *c, grpc_status_code code, const ProtobufCMessage *response) {
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    grpc_byte_buffer *bb = NULL;
    if (code == GRPC_STATUS_OK && response) {
        bb = wire_pack(response);
        if (!bb) code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    if (bb) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    grpc_slice details = grpc_slice_from_copied_string(code == GRPC_STATUS_OK ? "" : spes_last_error());
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    ops[n++].data.send_status_from_server.status_details = &details;
    int cancelled = 0;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &cancelled;
    wire_run_batch(c->call, c->cq, ops, n, c->srv->cfg.idle_timeout_seconds);
    grpc_slice_unref(details);
    if (bb) grpc_byte_buffer_destroy(bb);
}

// Receives the single request of a unary call, at most max_bytes on the wire (unpacking allocates
// several times a message's size, so each RPC admits only what it can need); on failure finishes
// the call and returns NULL.
static grpc_byte_buffer *recv_request_bytes(Call *c, const ProtobufCMessageDescriptor *desc, size_t max_bytes) {
    bool ok;
    grpc_byte_buffer *bb = recv_message(c, &ok);
    if (!bb) {
        spes_fail("no %s request message", desc->name);
        if (ok) finish(c, GRPC_STATUS_INVALID_ARGUMENT, NULL);
        return NULL;
    }
    size_t len = grpc_byte_buffer_length(bb);
    if (len > max_bytes) {
        grpc_byte_buffer_destroy(bb);
        spes_fail("%s request of %zu bytes refused: at most %zu bytes", desc->name, len, max_bytes);
        log_refusal("request");
        finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);
        return NULL;
    }
    return bb;
}

// Reads and unpacks the single request of a unary call (recv_request_bytes); on failure
// finishes the call and returns NULL.
static ProtobufCMessage *recv_request(Call *c, const ProtobufCMessageDescriptor *desc, size_t max_bytes) {
    grpc_byte_buffer *bb = recv_request_bytes(c, desc, max_bytes);
    if (!bb) return NULL;
    ProtobufCMessage *msg = wire_unpack(desc, bb);
    grpc_byte_buffer_destroy(bb);
    if (!msg) {
        spes_fail("malformed %s message", desc->name);
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, NULL);
    }
    return msg;
}

// ---- handlers ----

// One upload stream being received: chunks checked in order and written to the upload's temp
// file as they arrive (rounds_upload_append), so the call holds one chunk, not the upload.
typedef struct {
    int peer, step, total_chunks, next_chunk;
    size_t cap, len;
    size_t reserved;                // bytes of srv->buffered held by this call
    bool open;                      // file holds a temp file
    RoundsUpload file;
    PeerMetricPoint *metrics;       // [n_metrics] the first message's points, kept once the upload is
    int n_metrics;                  // accepted (SYNC_MAX_METRIC_POINTS allocated)
} UploadStream;

// What one upload call holds while a chunk of `chunk` bytes is in hand: gRPC's received
// message, its flattened copy and the unpacked message (wire_unpack).
static size_t call_cost(size_t chunk) { return 3 * chunk; }

// The most bytes all upload calls together may hold: --max_upload_buffer, or by default a
// quarter of the model's F32 size but room for at least two calls with the server's chunk size
// (part of the server's memory bound, docs/operating.md), and before the model is known eight.
static size_t upload_budget(SyncServer *srv) {
    if (srv->cfg.max_buffered_bytes) return srv->cfg.max_buffered_bytes;
    size_t quarter = rounds_model_bytes(srv->rounds) / 4, least = 2 * call_cost(srv->cfg.chunk_size);
    if (!quarter) return 4 * least;
    return quarter > least ? quarter : least;
}

// Grows up's reservation to `want` bytes; RESOURCE_EXHAUSTED ("busy": the client backs off and
// retries) when the server-wide budget has no room.
static grpc_status_code reserve(Call *c, UploadStream *up, size_t want) {
    if (want <= up->reserved) return GRPC_STATUS_OK;
    SyncServer *srv = c->srv;
    size_t budget = upload_budget(srv), extra = want - up->reserved;
    // The default budget assumes chunks of about the server's chunk_size; a peer sending
    // bigger ones is taken when no other upload holds memory. An explicit budget is a limit.
    bool alone = !srv->cfg.max_buffered_bytes && want > budget;
    if (want > budget && !alone)   // never fits: not "busy", a retry would not help
        return status_fail(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "upload from peer %d step %d needs %zu bytes of buffer (chunks of that size), more than the "
                           "server's whole upload budget of %zu bytes (--max_upload_buffer)",
                           up->peer, up->step, want, budget);
    pthread_mutex_lock(&srv->mu);
    bool fits = alone ? srv->buffered == up->reserved : extra <= budget && srv->buffered <= budget - extra;
    size_t in_use = srv->buffered;
    if (fits) srv->buffered += extra;
    pthread_mutex_unlock(&srv->mu);
    if (!fits)
        return status_fail(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "server busy: upload from peer %d step %d needs %zu bytes of buffer, %zu of the %zu-byte "
                           "upload budget are in use (retry later)",
                           up->peer, up->step, want, in_use, budget);
    up->reserved = want;
    return GRPC_STATUS_OK;
}

static void release(Call *c, UploadStream *up) {
    pthread_mutex_lock(&c->srv->mu);
    c->srv->buffered -= up->reserved;
    pthread_mutex_unlock(&c->srv->mu);
    up->reserved = 0;
}

// A caller with a per-peer token may only act as that peer.
static grpc_status_code check_bound_peer(const Call *c, const char *what, int peer) {
    if (c->bound_peer < 0 || c->bound_peer == peer) return GRPC_STATUS_OK;
    return status_fail(GRPC_STATUS_PERMISSION_DENIED, "%s as peer %d refused: the caller's token belongs to peer %d",
                       what, peer, c->bound_peer);
}

// Whether an upload, wait or download may go on as `peer`: a per-peer token only as its own peer
// (a call as another would also claim that peer's id for its process, locking the real one out
// after a server restart), and only from the process holding the peer's id.
static grpc_status_code peer_call_check(const Call *c, int peer, uint64_t instance, const char *what) {
    grpc_status_code code = check_bound_peer(c, what, peer);
    if (code != GRPC_STATUS_OK) return code;
    return grpc_status_of(rounds_peer_instance(c->srv->rounds, peer, instance, false, what));
}

// The peer named in a request called (for the status page's "last seen"); a caller whose token
// belongs to another peer does not count (its call is refused).
static void note_seen(const Call *c, int peer) {
    if (c->bound_peer < 0 || c->bound_peer == peer) peer_watch_seen(rounds_watch(c->srv->rounds), peer);
}

// The metric points an upload's first message carries (proto PeerMetrics), kept with the stream
// until the upload is accepted (a refused upload's points are not the peer's: issue 29). Metrics
// on later chunks are ignored (logged).
static void take_metrics(UploadStream *up, const UploadChunkRequest *m, bool first) {
    if (m->n_metrics == 0) return;
    if (!first) {
        log_warn("server: upload from peer %d: %zu metric points on chunk %d ignored (only the first chunk's count)",
                 m->peer_id, m->n_metrics, m->chunk_id);
        return;
    }
    size_t skip = m->n_metrics > SYNC_MAX_METRIC_POINTS ? m->n_metrics - SYNC_MAX_METRIC_POINTS : 0;
    if (!up->metrics && !(up->metrics = spes_malloc(SYNC_MAX_METRIC_POINTS * sizeof *up->metrics))) return;
    up->n_metrics = 0;
    for (size_t i = skip; i < m->n_metrics; i++) up->metrics[up->n_metrics++] = wire_metrics_from_proto(m->metrics[i]);
    if (skip)
        log_warn("server: upload from peer %d: %zu metric points, more than %d; the oldest %zu ignored", m->peer_id,
                 m->n_metrics, SYNC_MAX_METRIC_POINTS, skip);
}

// Begins the upload's attempt (rounds_upload_begin) and makes this call its peer's newest upload
// call, cancelling the one before if it is still in progress. rounds would refuse that older
// attempt "superseded" at its next chunk, but a stalled stream sends none: it would keep its
// call slot and upload budget until the idle timeout, and a peer retrying after its side gave up
// would find the server "busy" meanwhile. The cancelled call's own thread ends it as any
// cancelled call (its receive fails: upload_drop); the call stays allocated until then, since
// its thread takes it out of srv->uploading (under mu) before freeing it (call_main).
static grpc_status_code upload_begin(Call *c, UploadStream *up) {
    SyncServer *srv = c->srv;
    grpc_status_code code = grpc_status_of(rounds_upload_begin(srv->rounds, up->peer, up->step, &up->file));
    if (code != GRPC_STATUS_OK) return code;
    up->open = true;
    char why[200];
    snprintf(why, sizeof why,
             "upload from peer %d superseded: a newer upload of peer %d (step %d) began while this one was in "
             "flight; the newest one is taken, this one cancelled",
             up->peer, up->peer, up->step);
    pthread_mutex_lock(&srv->mu);
    Call *older = srv->uploading[up->peer];
    // Attempts are numbered when they begin; two beginning at once are registered in that order.
    bool newest = !older || older->upload_attempt < up->file.attempt;
    if (newest) {
        if (older) grpc_call_cancel_with_status(older->call, GRPC_STATUS_ABORTED, why, NULL);
        srv->uploading[up->peer] = c;
        c->upload_peer = up->peer;
        c->upload_attempt = up->file.attempt;
    }
    pthread_mutex_unlock(&srv->mu);
    if (older && newest) log_warn("server: peer %d began a new upload for step %d: its older upload call cancelled",
                                  up->peer, up->step);
    return grpc_status_of(rounds_upload_current(srv->rounds, &up->file));   // not newest: a newer one began meanwhile
}

static grpc_status_code take_chunk(Call *c, UploadStream *up, const UploadChunkRequest *m) {
    take_metrics(up, m, up->next_chunk == 0);
    if (up->next_chunk == 0) {
        // Everything the first message can tell is decided now, before anything is stored.
        grpc_status_code code = peer_call_check(c, m->peer_id, m->instance_id, "upload");
        if (code != GRPC_STATUS_OK) return code;
        note_seen(c, m->peer_id);
        up->peer = m->peer_id;
        up->step = m->step;
        up->total_chunks = m->total_chunks;
        code = grpc_status_of(rounds_upload_start(c->srv->rounds, m->peer_id, m->step, &up->cap));
        if (code != GRPC_STATUS_OK) return code;
        if (m->total_chunks < 1 || (size_t)m->total_chunks > up->cap)
            return status_fail(GRPC_STATUS_INVALID_ARGUMENT,
                               "upload from peer %d: total_chunks %d is not a sensible count", m->peer_id,
                               m->total_chunks);
    } else if (m->peer_id != up->peer || m->step != up->step || m->total_chunks != up->total_chunks) {
        return status_fail(
            GRPC_STATUS_INVALID_ARGUMENT,
            "upload stream began as peer %d step %d of %d chunks but chunk %d says peer %d step %d of %d", up->peer,
            up->step, up->total_chunks, m->chunk_id, m->peer_id, m->step, m->total_chunks);
    }
    if (m->chunk_id != up->next_chunk)
        return status_fail(
            GRPC_STATUS_INVALID_ARGUMENT,
            "upload from peer %d step %d: chunk %d arrived where chunk %d was expected (chunks go in order, once)",
            up->peer, up->step, m->chunk_id, up->next_chunk);
    if (m->chunk_id >= up->total_chunks)
        return status_fail(GRPC_STATUS_INVALID_ARGUMENT, "upload from peer %d step %d: chunk %d beyond total_chunks %d",
                           up->peer, up->step, m->chunk_id, up->total_chunks);
    size_t add = m->chunk_data.len;
    if (add > up->cap - up->len)
        return status_fail(
            GRPC_STATUS_RESOURCE_EXHAUSTED,
            "upload from peer %d step %d: more than %zu bytes, the most its tensors can take (F32 + header)", up->peer,
            up->step, up->cap);
    grpc_status_code code = reserve(c, up, call_cost(add));   // the largest chunk so far
    if (code != GRPC_STATUS_OK) return code;   // "busy": refused before it begins, superseding nothing
    // Later chunks: a newer attempt of this peer began meanwhile (it cancelled this call; this
    // thread may be past its receive already): stop taking its bytes.
    code = up->open ? grpc_status_of(rounds_upload_current(c->srv->rounds, &up->file)) : upload_begin(c, up);
    if (code != GRPC_STATUS_OK) return code;
    code = grpc_status_of(rounds_upload_append(&up->file, m->chunk_data.data, add));
    if (code != GRPC_STATUS_OK) return code;
    up->len += add;
    up->next_chunk++;
    return GRPC_STATUS_OK;
}

static void upload_drop(Call *c, UploadStream *up) {
    if (up->open) rounds_upload_abort(&up->file);
    up->open = false;
    release(c, up);
    free(up->metrics);
    up->metrics = NULL;
}

static void handle_upload(Call *c) {
    UploadStream up = {0};
    grpc_status_code code = GRPC_STATUS_OK;
    // Budget already full for a call with the server's chunk size: refuse before reading the
    // first (multi-MiB) message, so that peers retrying "busy" do not each hold one.
    SyncServer *srv = c->srv;
    size_t need = call_cost(srv->cfg.chunk_size), budget = upload_budget(srv);
    pthread_mutex_lock(&srv->mu);
    size_t in_use = srv->buffered;
    pthread_mutex_unlock(&srv->mu);
    if (need <= budget && in_use > budget - need) {
        spes_fail("server busy: %zu of the %zu-byte upload budget are in use, an upload needs up to %zu (retry later)",
                  in_use, budget, need);
        rounds_count_rejected(srv->rounds);
        finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);
        return;
    }
    for (;;) {
        bool ok;
        grpc_byte_buffer *bb = recv_message(c, &ok);
        if (!ok) {
            upload_drop(c, &up);
            return;   // cancelled or gone: nobody to answer
        }
        if (!bb) break;
        UploadChunkRequest *m = (UploadChunkRequest *)wire_unpack(&upload_chunk_request__descriptor, bb);
        grpc_byte_buffer_destroy(bb);
        if (!m) {
            code = status_fail(GRPC_STATUS_INVALID_ARGUMENT, "malformed UploadChunkRequest message");
        } else {
            code = take_chunk(c, &up, m);
            upload_chunk_request__free_unpacked(m, NULL);
        }
        if (code != GRPC_STATUS_OK) break;
    }
    // A stream cancelled by a newer attempt ends here too (gRPC ends its receives without an error).
    if (code == GRPC_STATUS_OK && up.open) code = grpc_status_of(rounds_upload_current(c->srv->rounds, &up.file));
    if (code == GRPC_STATUS_OK && up.next_chunk == 0) {
        code = status_fail(GRPC_STATUS_INVALID_ARGUMENT, "upload stream without chunks");
    } else if (code == GRPC_STATUS_OK && up.next_chunk != up.total_chunks) {
        code = status_fail(GRPC_STATUS_INVALID_ARGUMENT, "upload from peer %d step %d ended after %d of %d chunks",
                           up.peer, up.step, up.next_chunk, up.total_chunks);
    }
    if (code != GRPC_STATUS_OK) {
        upload_drop(c, &up);
        rounds_count_rejected(c->srv->rounds);
        log_refusal("upload");
        finish(c, code, NULL);
        return;
    }
    release(c, &up);   // the chunks are on disk: validation and aggregation read them back
    up.open = false;
    code = grpc_status_of(rounds_upload_finish(c->srv->rounds, &up.file));   // closes the file on every path
    note_seen(c, up.peer);
    if (code == GRPC_STATUS_OK)
        peer_watch_metrics(rounds_watch(c->srv->rounds), up.peer, rounds_step_limit(c->srv->rounds, up.step), up.metrics,
                           up.n_metrics);
    free(up.metrics);
    UploadChunkResponse resp = UPLOAD_CHUNK_RESPONSE__INIT;
    resp.success = code == GRPC_STATUS_OK;
    finish(c, code, &resp.base);
}

static size_t chunk_count(size_t len, size_t chunk) { return len == 0 ? 1 : (len + chunk - 1) / chunk; }

// A DownloadChunkResponse {chunk_data = bytes [at, at+n) of a view of the aggregate, last_chunk,
// ready = true} whose data are slices of the aggregate (and of the view's header) themselves, not
// copies: P peers with 4 chunks in flight each would otherwise hold 4 P chunk copies. Each slice
// keeps a reference to the blob until gRPC has sent it. Field order on the wire does not matter
// to protobuf parsers.
typedef struct {
    Rounds *rounds;
    AggregateBlob *blob;
} BlobRef;

static void blob_ref_done(void *arg) {
    BlobRef *ref = arg;
    rounds_release(ref->rounds, ref->blob);
    free(ref);
}

typedef struct {
    Rounds *rounds;
    AggregateBlob *blob;
    grpc_slice slices[64];
    int n;
    bool failed;
} ChunkSlices;

static void add_slice(void *arg, const uint8_t *data, size_t len) {
    ChunkSlices *cs = arg;
    BlobRef *ref = cs->n < 63 ? spes_malloc(sizeof *ref) : NULL;
    if (!ref) {
        cs->failed = true;
        return;
    }
    ref->rounds = cs->rounds;
    ref->blob = cs->blob;
    rounds_retain(cs->rounds, cs->blob);
    cs->slices[cs->n++] = grpc_slice_new_with_user_data((void *)data, len, blob_ref_done, ref);
}

static grpc_byte_buffer *chunk_response(Rounds *rounds, AggregateBlob *blob, const AggregateView *view, size_t at,
                                        size_t n, bool last) {
    uint8_t head[16], tail[4];
    size_t h = 0, len = n;
    head[h++] = 0x0a;   // field 1 (chunk_data), length-delimited
    do {
        head[h++] = (uint8_t)((len & 0x7f) | (len > 0x7f ? 0x80 : 0));
        len >>= 7;
    } while (len);
    size_t k = 0;
    if (last) tail[k++] = 0x10, tail[k++] = 0x01;   // field 2 (last_chunk) = true
    tail[k++] = 0x18, tail[k++] = 0x01;             // field 3 (ready) = true
    ChunkSlices cs = {.rounds = rounds, .blob = blob};
    cs.slices[cs.n++] = grpc_slice_from_copied_buffer((const char *)head, h);
    // A chunk spans few pieces (a view's pieces are runs of tensors); a chunk that would need
    // more than 62 slices is refused rather than cut short.
    aggregate_view_range(view, at, n, add_slice, &cs);
    cs.slices[cs.n++] = grpc_slice_from_copied_buffer((const char *)tail, k);
    grpc_byte_buffer *bb = cs.failed ? NULL : grpc_raw_byte_buffer_create(cs.slices, (size_t)cs.n);
    for (int i = 0; i < cs.n; i++) grpc_slice_unref(cs.slices[i]);
    return bb;
}

// The view a download or wait asks for (absent fields: the whole aggregate).
static grpc_status_code request_view(Call *c, AggregateBlob *blob, int peer, bool omit, bool has_base, int base,
                                     const AggregateView **view, const char **name) {
    RoundsViewRequest q = {.omit_own_experts = omit, .has_delta_base = has_base, .delta_base_step = base};
    return grpc_status_of(rounds_view(c->srv->rounds, blob, peer, &q, view, name));
}

// Like finish() with an already packed response.
static void finish_packed(Call *c, grpc_byte_buffer *bb) {
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    grpc_slice details = grpc_empty_slice();
    ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[2].data.send_status_from_server.status_details = &details;
    int cancelled = 0;
    ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[3].data.recv_close_on_server.cancelled = &cancelled;
    wire_run_batch(c->call, c->cq, ops, 4, c->srv->cfg.idle_timeout_seconds);
    grpc_byte_buffer_destroy(bb);
}

static void handle_download(Call *c) {
    DownloadChunkRequest *req = (DownloadChunkRequest *)recv_request(c, &download_chunk_request__descriptor, SYNC_MAX_SMALL_REQUEST);
    if (!req) return;
    note_seen(c, req->peer_id);
    AggregateBlob *blob = NULL;
    grpc_status_code code = peer_call_check(c, req->peer_id, req->instance_id, "download");
    if (code != GRPC_STATUS_OK) log_refusal("download");
    if (code == GRPC_STATUS_OK) code = grpc_status_of(rounds_get(c->srv->rounds, req->step, 0, &blob));
    DownloadChunkResponse resp = DOWNLOAD_CHUNK_RESPONSE__INIT;
    const AggregateView *view = NULL;
    const char *name = "";
    if (code == GRPC_STATUS_OK && blob)
        code = request_view(c, blob, req->peer_id, req->omit_own_experts, req->has_delta_base, req->delta_base_step,
                            &view, &name);
    if (code == GRPC_STATUS_OK && blob) {
        size_t chunk = c->srv->cfg.chunk_size, n = chunk_count(view->len, chunk);
        if (req->chunk_id < 0 || (size_t)req->chunk_id >= n) {
            code = status_fail(GRPC_STATUS_OUT_OF_RANGE, "download of step %d: chunk_id %d is outside [0, %zu)",
                               req->step, req->chunk_id, n);
        } else {
            size_t at = (size_t)req->chunk_id * chunk, len = view->len - at < chunk ? view->len - at : chunk;
            grpc_byte_buffer *bb = chunk_response(c->srv->rounds, blob, view, at, len, (size_t)req->chunk_id == n - 1);
            if (bb) {
                finish_packed(c, bb);
                rounds_count_sent(c->srv->rounds, blob->step, len);
                rounds_release(c->srv->rounds, blob);
                download_chunk_request__free_unpacked(req, NULL);
                return;
            }
            code = status_fail(GRPC_STATUS_RESOURCE_EXHAUSTED, "download of step %d: out of memory", req->step);
        }
    }
    finish(c, code, &resp.base);
    rounds_release(c->srv->rounds, blob);
    download_chunk_request__free_unpacked(req, NULL);
}

// The peer's model spec from its Hello; checks the fingerprint it claims.
static grpc_status_code spec_from_hello(const HelloRequest *req, ModelSpec *spec) {
    model_spec_init(spec);
    for (size_t i = 0; i < req->n_tensors; i++) {
        const TensorInfo *ti = req->tensors[i];
        DType dtype;
        if (dtype_from_name(ti->dtype, &dtype) != SPES_OK || ti->n_shape > ST_MAX_DIMS ||
            model_spec_add(spec, ti->name, dtype, (int)ti->n_shape, ti->shape) != SPES_OK) {
            if (ti->n_shape > ST_MAX_DIMS) spes_fail("tensor '%s' has %zu dimensions", ti->name, ti->n_shape);
            spes_fail_context("hello from peer %d: tensor %zu", req->peer_id, i);
            return GRPC_STATUS_INVALID_ARGUMENT;
        }
    }
    if (model_spec_finish(spec) != SPES_OK) {
        spes_fail_context("hello from peer %d", req->peer_id);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (spec->fingerprint != req->fingerprint)
        return status_fail(GRPC_STATUS_INVALID_ARGUMENT,
                           "hello from peer %d: fingerprint %016llx does not match its own tensor list (%016llx)",
                           req->peer_id, (unsigned long long)req->fingerprint, (unsigned long long)spec->fingerprint);
    return GRPC_STATUS_OK;
}

// The Hello request, unpacked with c->srv->hello_mu held (still held when it returns one; on
// failure the call is finished, unlocked). A tensor entry of ~8 bytes on the wire unpacks to ~140
// (protobuf-c's struct, name and shape allocations): a 16 MiB Hello of 2 million tiny entries cost
// ~300 MB, and every concurrent one as much again, until the count was checked after unpacking.
// The count is read off the wire first, and Hellos are unpacked one at a time.
static HelloRequest *recv_hello(Call *c) {
    grpc_byte_buffer *bb = recv_request_bytes(c, &hello_request__descriptor, SYNC_MAX_HELLO_BYTES);
    if (!bb) return NULL;
    grpc_byte_buffer_reader reader;
    grpc_slice flat = grpc_empty_slice();
    if (grpc_byte_buffer_reader_init(&reader, bb)) {
        flat = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
    }
    grpc_byte_buffer_destroy(bb);
    const uint8_t *data = GRPC_SLICE_START_PTR(flat);
    size_t len = GRPC_SLICE_LENGTH(flat), tensors = 0;
    uint32_t field = (uint32_t)protobuf_c_message_descriptor_get_field_by_name(&hello_request__descriptor, "tensors")->id;
    HelloRequest *req = NULL;
    grpc_status_code code = GRPC_STATUS_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->srv->hello_mu);
    if (!wire_count_field(data, len, field, &tensors))
        spes_fail("malformed HelloRequest message");
    else if (tensors > SYNC_MAX_TENSORS)
        spes_fail("hello: %zu tensors; at most %d are accepted", tensors, SYNC_MAX_TENSORS);
    else if (!(req = (HelloRequest *)protobuf_c_message_unpack(&hello_request__descriptor, NULL, len, data)))
        spes_fail("malformed HelloRequest message");
    grpc_slice_unref(flat);
    if (req) return req;
    pthread_mutex_unlock(&c->srv->hello_mu);
    log_refusal("hello");
    finish(c, code, NULL);
    return NULL;
}

static void handle_hello(Call *c) {
    HelloRequest *req = recv_hello(c);
    if (!req) return;
    ModelSpec spec;
    SyncMode mode = SYNC_MODE_SPES;
    DType payload = DTYPE_F32;
    // "I8" / "I4": a delta run of that codec (docs/communication.md); other names are dtypes.
    const DeltaCodec *delta = delta_codec_by_wire(req->payload_dtype);
    if (delta) payload = DTYPE_I8;
    int last = -1;
    model_spec_init(&spec);
    grpc_status_code code = check_bound_peer(c, "hello", req->peer_id);
    note_seen(c, req->peer_id);
    if (code == GRPC_STATUS_OK && (sync_mode_parse(req->mode, &mode) != SPES_OK ||
                                   (req->payload_dtype[0] && !delta && dtype_from_name(req->payload_dtype, &payload) != SPES_OK)))
        code = GRPC_STATUS_INVALID_ARGUMENT;
    // Settings first: a peer of another run is refused before its tensor list costs anything.
    if (code == GRPC_STATUS_OK)
        code = grpc_status_of(rounds_hello_settings(c->srv->rounds, req->peer_id, req->num_peers, req->experts_per_node, mode, payload));
    if (code == GRPC_STATUS_OK) {
        OuterOptConfig stated = {.lr = req->outer_lr, .momentum = req->outer_momentum};   // lr 0: not stated
        code = grpc_status_of(rounds_hello_outer(c->srv->rounds, req->peer_id, &stated));
    }
    if (code == GRPC_STATUS_OK) code = spec_from_hello(req, &spec);
    if (code == GRPC_STATUS_OK)
        code = grpc_status_of(rounds_hello_delta(c->srv->rounds, req->peer_id, req->num_peers, req->experts_per_node, mode,
                                                 payload, delta, &spec, &last));
    HelloResponse resp = HELLO_RESPONSE__INIT;
    resp.fingerprint = spec.fingerprint;
    if (code == GRPC_STATUS_OK) {
        RoundsStatus st;
        rounds_status(c->srv->rounds, &st);
        resp.fingerprint = st.fingerprint;
        rounds_peer_instance(c->srv->rounds, req->peer_id, req->instance_id, true, "hello");
        log_info("server: hello from peer %d accepted", req->peer_id);
    } else {
        log_refusal("hello");
    }
    // The download views this server serves (proto HelloRequest.encodings, docs/communication.md).
    static char *encodings[] = {SYNC_VIEW_OMIT_OWN, SYNC_VIEW_INT8, SYNC_VIEW_INT4};
    resp.n_encodings = sizeof encodings / sizeof *encodings;
    resp.encodings = encodings;
    resp.chunk_size = (int64_t)c->srv->cfg.chunk_size;
    resp.max_message_size = (int64_t)c->srv->cfg.max_message_size;
    resp.last_completed_step = last;
    OuterOptConfig outer = rounds_outer_config(c->srv->rounds);   // the peer checks it too (an older server states none)
    resp.outer_lr = outer.lr;
    resp.outer_momentum = outer.momentum;
    model_spec_free(&spec);
    hello_request__free_unpacked(req, NULL);
    pthread_mutex_unlock(&c->srv->hello_mu);   // before the reply, which a slow client may hold up
    finish(c, code, &resp.base);
}

static void handle_wait(Call *c) {
    WaitAggregateRequest *req = (WaitAggregateRequest *)recv_request(c, &wait_aggregate_request__descriptor, SYNC_MAX_SMALL_REQUEST);
    if (!req) return;
    double timeout = req->timeout_ms / 1000.0;
    if (timeout > c->srv->cfg.max_wait_seconds) timeout = c->srv->cfg.max_wait_seconds;
    AggregateBlob *blob = NULL;
    note_seen(c, req->peer_id);   // at both ends of the long poll: a waiting peer is present
    grpc_status_code code = peer_call_check(c, req->peer_id, req->instance_id, "wait");
    if (code != GRPC_STATUS_OK) log_refusal("wait");
    if (code == GRPC_STATUS_OK) code = grpc_status_of(rounds_get(c->srv->rounds, req->step, timeout, &blob));
    note_seen(c, req->peer_id);
    WaitAggregateResponse resp = WAIT_AGGREGATE_RESPONSE__INIT;
    const AggregateView *view = NULL;
    const char *name = "";
    if (blob && code == GRPC_STATUS_OK)
        code = request_view(c, blob, req->peer_id, req->omit_own_experts, req->has_delta_base, req->delta_base_step,
                            &view, &name);
    if (blob && view) {
        resp.ready = true;
        resp.total_bytes = (int64_t)view->len;
        resp.total_chunks = (int32_t)chunk_count(view->len, c->srv->cfg.chunk_size);
        resp.view = (char *)name;
    }
    resp.last_completed_step = rounds_last_completed_step(c->srv->rounds);
    rounds_release(c->srv->rounds, blob);
    finish(c, code, &resp.base);
    wait_aggregate_request__free_unpacked(req, NULL);
}

static void handle_status(Call *c) {
    StatusRequest *req = (StatusRequest *)recv_request(c, &status_request__descriptor, SYNC_MAX_SMALL_REQUEST);
    if (!req) return;
    RunStatus run;
    if (rounds_run_status(c->srv->rounds, &run) != SPES_OK) {
        finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);
        status_request__free_unpacked(req, NULL);
        return;
    }
    RoundsStatus st = run.rounds;
    // Each peer as the server sees it, with the newest metric point it reported.
    PeerState *states = spes_calloc((size_t)run.num_peers + 1, sizeof *states);
    PeerState **state_ptrs = spes_calloc((size_t)run.num_peers + 1, sizeof *state_ptrs);
    PeerMetrics *latest = spes_calloc((size_t)run.num_peers + 1, sizeof *latest);
    if (!states || !state_ptrs || !latest) {
        free(states);
        free(state_ptrs);
        free(latest);
        run_status_free(&run);
        finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);
        status_request__free_unpacked(req, NULL);
        return;
    }
    for (int p = 0; p < run.num_peers; p++) {
        const PeerStatus *ps = &run.peers[p];
        peer_state__init(&states[p]);
        states[p].peer_id = ps->peer;
        states[p].liveness = (char *)peer_liveness_name(ps->liveness);
        states[p].last_seen_unix = ps->last_seen_unix;
        states[p].last_upload_step = ps->last_upload_step;
        if (ps->num_points > 0) {
            wire_metrics_to_proto(&ps->points[ps->num_points - 1], &latest[p]);
            states[p].latest = &latest[p];
        }
        state_ptrs[p] = &states[p];
    }
    StatusResponse resp = STATUS_RESPONSE__INIT;
    resp.n_peers = (size_t)run.num_peers;
    resp.peers = state_ptrs;
    resp.rounds_completed = st.rounds_completed;
    resp.open_step = st.open_step;
    resp.n_peers_uploaded = (size_t)st.num_uploaded;
    resp.peers_uploaded = st.peers_uploaded;
    resp.last_aggregate_step = st.last_aggregate_step;
    resp.bytes_received = st.bytes_received;
    resp.bytes_sent = st.bytes_sent;
    resp.total_peers = st.total_peers;
    resp.mode = (char *)sync_mode_name(st.mode);
    resp.fingerprint = st.fingerprint;
    resp.uploads_rejected = st.uploads_rejected;
    resp.last_aggregate_seconds = st.last_aggregate_seconds;
    resp.rounds_partial = st.rounds_partial;
    resp.last_round_peers = st.last_round_peers;
    resp.aggregate_problem = st.aggregate_problem;
    finish(c, GRPC_STATUS_OK, &resp.base);
    free(states);
    free(state_ptrs);
    free(latest);
    run_status_free(&run);
    status_request__free_unpacked(req, NULL);
}

typedef struct {
    const char *method;
    void (*handle)(Call *c);
} Route;

static const Route routes[] = {
    {"/FederatedServer/UploadChunk", handle_upload},     {"/FederatedServer/DownloadChunk", handle_download},
    {"/FederatedServer/Hello", handle_hello},            {"/FederatedServer/WaitAggregate", handle_wait},
    {"/FederatedServer/Status", handle_status},
};

// Adds delta to a token-bound peer's calls in progress; returns the new count.
static int peer_calls_add(SyncServer *srv, int peer, int delta) {
    pthread_mutex_lock(&srv->mu);
    int n = srv->peer_calls[peer] += delta;
    pthread_mutex_unlock(&srv->mu);
    return n;
}

static void *call_main(void *arg) {
    Call *c = arg;
    SyncServer *srv = c->srv;
    const Route *route = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (grpc_slice_str_cmp(c->details.method, routes[i].method) == 0) route = &routes[i];
    bool too_many = c->over_limit;
    c->bound_peer = -1;
    grpc_status_code auth = auth_enabled(&srv->auth) ? auth_check(&srv->auth, &c->metadata, &c->bound_peer)
                                                     : GRPC_STATUS_OK;
    // A per-peer token says who calls: its holder may not stall calls into every slot.
    int peer = auth == GRPC_STATUS_OK && !too_many ? c->bound_peer : -1;
    bool peer_busy = peer >= 0 && peer_calls_add(srv, peer, 1) > SYNC_MAX_CALLS_PER_PEER;
    if (auth != GRPC_STATUS_OK) {   // before reading anything: nothing from this caller is stored
        char *method = grpc_slice_to_c_string(c->details.method);
        if (route == &routes[0]) rounds_count_rejected(srv->rounds);
        log_refusal(method);
        gpr_free(method);
        finish(c, auth, NULL);
    } else if (too_many || peer_busy) {
        if (route == &routes[0]) rounds_count_rejected(srv->rounds);
        if (too_many)
            spes_fail("server busy: more than %d calls in progress", srv->cfg.max_calls);
        else
            spes_fail("server busy: peer %d (by its token) has %d calls in progress, the most one peer may have",
                      peer, SYNC_MAX_CALLS_PER_PEER);
        finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);
    } else if (!route) {
        char *method = grpc_slice_to_c_string(c->details.method);
        spes_fail("no method %s on this server", method);
        gpr_free(method);
        finish(c, GRPC_STATUS_UNIMPLEMENTED, NULL);
    } else {
        route->handle(c);
    }
    if (peer >= 0) peer_calls_add(srv, peer, -1);
    pthread_mutex_lock(&srv->mu);   // before it is freed: nobody may cancel it any more (upload_begin)
    if (c->upload_peer >= 0 && srv->uploading[c->upload_peer] == c) srv->uploading[c->upload_peer] = NULL;
    pthread_mutex_unlock(&srv->mu);
    call_free(c);
    pthread_mutex_lock(&srv->mu);
    if (--srv->active_calls == 0) pthread_cond_broadcast(&srv->calls_done);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

// ---- accept loop and lifecycle ----

static bool request_next_call(SyncServer *srv) {
    Call *c = call_new(srv);
    if (!c) return false;
    if (grpc_server_request_call(srv->server, &c->call, &c->details, &c->metadata, c->cq, srv->cq, c) != GRPC_CALL_OK) {
        call_free(c);
        return false;
    }
    return true;
}

static void *accept_loop(void *arg) {
    SyncServer *srv = arg;
    bool requesting = request_next_call(srv);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        if (ev.tag == &srv->shutdown_tag) {
            grpc_completion_queue_shutdown(srv->cq);
            continue;
        }
        Call *c = ev.tag;
        if (!ev.success) {   // the server is shutting down: no more calls
            call_free(c);
            requesting = false;
            continue;
        }
        // Admission is decided here, in arrival order: a call's own thread reading the count
        // later could see a burst behind it and refuse a call that was within the limit.
        pthread_mutex_lock(&srv->mu);
        c->over_limit = ++srv->active_calls > srv->cfg.max_calls;
        pthread_mutex_unlock(&srv->mu);
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attr, call_main, c) != 0) {
            spes_fail("server: cannot start a thread for a new call");
            finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);
            call_free(c);
            pthread_mutex_lock(&srv->mu);
            srv->active_calls--;
            pthread_mutex_unlock(&srv->mu);
        }
        pthread_attr_destroy(&attr);
        if (requesting) requesting = request_next_call(srv);
    }
    return NULL;
}

// Insecure, or TLS from the configured PEM files (client certificates required with a CA).
static int server_credentials(const SyncServerConfig *cfg, grpc_server_credentials **out) {
    if (!cfg->tls_cert && !cfg->tls_key) {
        if (cfg->tls_ca) return spes_fail("server: --tls_ca needs --tls_cert and --tls_key");
        *out = grpc_insecure_server_credentials_create();
        return SPES_OK;
    }
    if (!cfg->tls_cert || !cfg->tls_key) return spes_fail("server: TLS needs both --tls_cert and --tls_key");
    uint8_t *cert = NULL, *key = NULL, *ca = NULL;
    size_t len;
    int rc = file_read_all(cfg->tls_cert, &cert, &len);
    if (rc == SPES_OK) rc = file_read_all(cfg->tls_key, &key, &len);
    if (rc == SPES_OK && cfg->tls_ca) rc = file_read_all(cfg->tls_ca, &ca, &len);
    if (rc == SPES_OK) {
        grpc_ssl_pem_key_cert_pair pair = {(const char *)key, (const char *)cert};
        *out = grpc_ssl_server_credentials_create_ex(
            (const char *)ca, &pair, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!*out) rc = spes_fail("server: the TLS certificate %s or key %s is not usable PEM", cfg->tls_cert, cfg->tls_key);
    }
    free(cert);
    free(key);
    free(ca);
    return rc;
}

int sync_server_max_calls(int num_peers) {
    // A peer holds at most one upload or long poll, or DOWNLOAD_WINDOW (4) chunk requests, at
    // once; the rest is room for Status calls and retries.
    int64_t calls = 4 * (int64_t)num_peers + 64;
    return calls < SYNC_MAX_CALLS_CEILING ? (int)calls : SYNC_MAX_CALLS_CEILING;
}

size_t sync_server_receive_quota(int num_peers, size_t chunk_size) {
    size_t peers = num_peers > 0 ? (size_t)num_peers : 0, honest = 2 * peers * chunk_size;
    return honest > SYNC_MIN_RECEIVE_QUOTA ? honest : SYNC_MIN_RECEIVE_QUOTA;
}

int sync_server_start(const SyncServerConfig *cfg, SyncServer **out) {
    if (cfg->chunk_size < 1 || cfg->chunk_size + 1024 > cfg->max_message_size)
        return spes_fail("server: chunk_size %zu must be >= 1 and at least 1 KiB below max_message_size %zu",
                         cfg->chunk_size, cfg->max_message_size);
    // Two of the largest requests must fit: one a call receives, one its retry's.
    size_t largest = cfg->chunk_size > SYNC_MAX_HELLO_BYTES ? cfg->chunk_size : SYNC_MAX_HELLO_BYTES;
    if (cfg->max_receive_bytes && cfg->max_receive_bytes < 2 * largest)
        return spes_fail("server: --max_receive_buffer %zu is below two of the largest requests (2 x %zu bytes: a Hello or "
                         "an upload chunk)",
                         cfg->max_receive_bytes, largest);
    SyncServer *srv = spes_calloc(1, sizeof *srv);
    if (!srv) return SPES_ERR;
    srv->cfg = *cfg;
    if (srv->cfg.max_calls <= 0) srv->cfg.max_calls = sync_server_max_calls(cfg->rounds.agg.num_peers);
    if (!srv->cfg.max_receive_bytes)
        srv->cfg.max_receive_bytes = sync_server_receive_quota(cfg->rounds.agg.num_peers, cfg->chunk_size);
    srv->host = spes_strdup(cfg->host);
    size_t peers = cfg->rounds.agg.num_peers > 0 ? (size_t)cfg->rounds.agg.num_peers : 0;   // else refused below
    srv->uploading = spes_calloc(peers + 1, sizeof *srv->uploading);
    srv->peer_calls = spes_calloc(peers + 1, sizeof *srv->peer_calls);
    if (!srv->host || !srv->uploading || !srv->peer_calls ||
        auth_load(cfg->auth_token_file, cfg->peer_tokens_file, cfg->rounds.agg.num_peers, &srv->auth) != SPES_OK ||
        rounds_create(&cfg->rounds, &srv->rounds) != SPES_OK) {
        auth_free(&srv->auth);
        free(srv->uploading);
        free(srv->peer_calls);
        free(srv->host);
        free(srv);
        return SPES_ERR;
    }
    srv->cfg.host = srv->host;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_mutex_init(&srv->hello_mu, NULL);
    pthread_cond_init(&srv->calls_done, NULL);
    grpc_init();
    grpc_arg args[6];
    grpc_channel_args channel_args;
    wire_channel_args(cfg->max_message_size, args, &channel_args);
    // gRPC binds with SO_REUSEPORT by default: a second server on the same port would start
    // and silently share the peers' connections with the first. Own the port exclusively.
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    channel_args.num_args = 3;
    // gRPC's transport reads ahead of the calls by up to the flow-control window, which BDP
    // probing grows to megabytes per connection: with one connection per peer that is memory
    // growing with P (and "busy" uploads' data the server never reads). Without probing, and
    // with a 64 KiB window, a connection holds little more than what a call asks for: a call
    // reading a message still gets a window for the whole message.
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = (char *)GRPC_ARG_HTTP2_BDP_PROBE;
    args[3].value.integer = 0;
    args[4].type = GRPC_ARG_INTEGER;
    args[4].key = (char *)GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
    args[4].value.integer = 64 * 1024;
    // What gRPC holds of requests being received is bounded by a resource quota: its memory
    // allocator charges the bytes read from connections until they are freed.
    grpc_resource_quota *quota = grpc_resource_quota_create("spes-server");
    grpc_resource_quota_resize(quota, srv->cfg.max_receive_bytes);
    args[5].type = GRPC_ARG_POINTER;
    args[5].key = (char *)GRPC_ARG_RESOURCE_QUOTA;
    args[5].value.pointer.p = quota;
    args[5].value.pointer.vtable = grpc_resource_quota_arg_vtable();
    channel_args.num_args = 6;
    srv->server = grpc_server_create(&channel_args, NULL);
    grpc_resource_quota_unref(quota);   // the server holds its own reference
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    char addr[300];
    snprintf(addr, sizeof addr, strchr(cfg->host, ':') ? "[%s]:%d" : "%s:%d", cfg->host, cfg->port);
    grpc_server_credentials *creds = NULL;
    bool creds_ok = server_credentials(cfg, &creds) == SPES_OK;
    srv->port = creds_ok ? grpc_server_add_http2_port(srv->server, addr, creds) : 0;
    if (creds) grpc_server_credentials_release(creds);
    if (srv->port == 0) {
        grpc_server_destroy(srv->server);   // never started: nothing to shut down
        grpc_completion_queue_shutdown(srv->cq);
        while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(srv->cq);
        rounds_destroy(srv->rounds);
        auth_free(&srv->auth);
        free(srv->uploading);
        free(srv->peer_calls);
        free(srv->host);
        free(srv);
        grpc_shutdown();
        if (!creds_ok) return SPES_ERR;
        return spes_fail("server: cannot listen on %s: the port is in use (another spes server?) or not an address "
                         "of this host",
                         addr);
    }
    grpc_server_start(srv->server);
    pthread_create(&srv->accept_thread, NULL, accept_loop, srv);
    log_info("server: listening on %s:%d (at most %d calls at once, %zu MiB for requests being received)", cfg->host,
             srv->port, srv->cfg.max_calls, srv->cfg.max_receive_bytes >> 20);
    *out = srv;
    return SPES_OK;
}

int sync_server_port(const SyncServer *s) { return s->port; }
Rounds *sync_server_rounds(SyncServer *s) { return s->rounds; }

void sync_server_stop(SyncServer *s) {
    if (!s) return;
    rounds_close(s->rounds);   // long polls return now
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    grpc_server_cancel_all_calls(s->server);
    pthread_join(s->accept_thread, NULL);
    pthread_mutex_lock(&s->mu);
    while (s->active_calls > 0) pthread_cond_wait(&s->calls_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    grpc_server_destroy(s->server);
    grpc_completion_queue_destroy(s->cq);
    rounds_destroy(s->rounds);
    auth_free(&s->auth);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->hello_mu);
    pthread_cond_destroy(&s->calls_done);
    free(s->uploading);
    free(s->peer_calls);
    free(s->host);
    free(s);
    grpc_shutdown();
}
