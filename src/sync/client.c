// Peer side of the parameter server (see client.h).
#include "sync/client.h"

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/printable.h"
#include "base/rng.h"
#include "base/timer.h"
#include "sync/aggregate_step.h"
#include "sync/call_deadline.h"
#include "sync/call_retry.h"
#include "sync/call_status.h"
#include "sync/wire.h"

struct SyncClient {
    SyncClientConfig cfg;
    char *addr;
    grpc_channel *channel;
    grpc_completion_queue *cq;
    size_t chunk_size;
    SyncStats stats;
    grpc_status_code last_status;
    char last_details[256];         // what the server said with last_status
    Rng jitter;                     // retry delays: peers restarting together do not retry in lockstep
    uint64_t instance_id;           // this process's random id, sent with every call (proto HelloRequest)
    grpc_metadata auth;             // authorization: Bearer <token>
    size_t n_metadata;              // 1 with a token, else 0
    size_t download_chunk;          // HelloResponse.chunk_size: bytes per download chunk (0: not known)
    size_t download_max;            // the largest download the model can make (0: no Hello yet)
    char **server_encodings;        // from HelloResponse.encodings
    size_t n_server_encodings;
    pthread_mutex_t metrics_mu;     // the trainer notes metrics while an upload may be in flight
    PeerMetricPoint metrics[SYNC_MAX_METRIC_POINTS];   // steps not yet reported, oldest first
    int n_metrics;
};

// The download view asked for by the calls of one download (WaitAggregate and DownloadChunk
// must ask for the same one).
typedef struct {
    bool omit_own_experts;
    bool has_delta_base;
    int delta_base_step;
} ViewAsk;

// Sets the initial-metadata op of every call: the token, if any.
static void send_metadata(const SyncClient *c, grpc_op *op) {
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    op->data.send_initial_metadata.count = c->n_metadata;
    op->data.send_initial_metadata.metadata = c->n_metadata ? (grpc_metadata *)&c->auth : NULL;
}

// Insecure, or TLS trusting cfg->tls_ca (with a client certificate when given).
static int channel_credentials(const SyncClientConfig *cfg, grpc_channel_credentials **out) {
    if (!cfg->tls_ca) {
        if (cfg->tls_cert || cfg->tls_key) return spes_fail("sync client: a TLS client certificate needs tls_ca too");
        *out = grpc_insecure_credentials_create();
        return SPES_OK;
    }
    if (!cfg->tls_cert != !cfg->tls_key) return spes_fail("sync client: tls_cert and tls_key go together");
    uint8_t *ca = NULL, *cert = NULL, *key = NULL;
    size_t len;
    int rc = file_read_all(cfg->tls_ca, &ca, &len);
    if (rc == SPES_OK && cfg->tls_cert) rc = file_read_all(cfg->tls_cert, &cert, &len);
    if (rc == SPES_OK && cfg->tls_key) rc = file_read_all(cfg->tls_key, &key, &len);
    if (rc == SPES_OK) {
        grpc_ssl_pem_key_cert_pair pair = {(const char *)key, (const char *)cert};
        *out = grpc_ssl_credentials_create((const char *)ca, cert ? &pair : NULL, NULL, NULL);
        if (!*out) rc = spes_fail("sync client: TLS files %s are not usable PEM", cfg->tls_ca);
    }
    free(ca);
    free(cert);
    free(key);
    return rc;
}

void sync_client_config_defaults(SyncClientConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->server_addr = "127.0.0.1:50051";
    cfg->mode = SYNC_MODE_SPES;
    cfg->payload_dtype = DTYPE_F32;
    cfg->max_message_size = SYNC_DEFAULT_MAX_MESSAGE;
    cfg->connect_timeout_s = 60;
    cfg->call_timeout_s = 1800;
    cfg->wait_timeout_s = 0;
}

int sync_client_create(const SyncClientConfig *cfg, SyncClient **out) {
    if (cfg->payload_dtype != DTYPE_F32 && cfg->payload_dtype != DTYPE_BF16 && cfg->payload_dtype != DTYPE_I8)
        return spes_fail("sync client: payload dtype must be F32, BF16 or I8");
    if (cfg->payload_dtype != DTYPE_I8 && cfg->delta) return spes_fail("sync client: a delta codec needs payload dtype I8");
    SyncClient *c = spes_calloc(1, sizeof *c);
    if (!c) return SPES_ERR;
    pthread_mutex_init(&c->metrics_mu, NULL);
    c->cfg = *cfg;
    c->addr = spes_strdup(cfg->server_addr);
    if (!c->addr) {
        free(c);
        return SPES_ERR;
    }
    c->cfg.server_addr = c->addr;
    rng_seed(&c->jitter, (uint64_t)now_seconds() * 1000003u + (uint64_t)cfg->peer_id);
    // Random, never 0 (0 on the wire means "not stated"); the clock and pid only if getrandom fails.
    if (getrandom(&c->instance_id, sizeof c->instance_id, 0) != (ssize_t)sizeof c->instance_id)
        c->instance_id = (uint64_t)(now_seconds() * 1e9) ^ ((uint64_t)getpid() << 32);
    if (c->instance_id == 0) c->instance_id = 1;
    c->chunk_size = cfg->chunk_size ? cfg->chunk_size : SYNC_DEFAULT_CHUNK_SIZE;
    grpc_init();
    grpc_channel_credentials *creds = NULL;
    if (channel_credentials(cfg, &creds) != SPES_OK) {
        free(c->addr);
        free(c);
        grpc_shutdown();
        return SPES_ERR;
    }
    if (cfg->auth_token) {
        char *bearer = spes_malloc(strlen(cfg->auth_token) + 8);
        if (bearer) sprintf(bearer, "Bearer %s", cfg->auth_token);
        c->auth.key = grpc_slice_from_static_string("authorization");
        c->auth.value = grpc_slice_from_copied_string(bearer ? bearer : "");
        c->n_metadata = 1;
        free(bearer);
    }
    c->cfg.auth_token = c->cfg.tls_ca = c->cfg.tls_cert = c->cfg.tls_key = NULL;   // not kept past create
    grpc_arg args[2];
    grpc_channel_args channel_args;
    wire_channel_args(cfg->max_message_size, args, &channel_args);
    c->channel = grpc_channel_create(c->addr, creds, &channel_args);
    grpc_channel_credentials_release(creds);
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    *out = c;
    return SPES_OK;
}

void sync_client_destroy(SyncClient *c) {
    if (!c) return;
    grpc_channel_destroy(c->channel);
    grpc_completion_queue_shutdown(c->cq);
    while (grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->cq);
    if (c->n_metadata) grpc_slice_unref(c->auth.value);
    for (size_t i = 0; i < c->n_server_encodings; i++) free(c->server_encodings[i]);
    free(c->server_encodings);
    free(c->addr);
    pthread_mutex_destroy(&c->metrics_mu);
    free(c);
    grpc_shutdown();
}

const SyncStats *sync_client_stats(const SyncClient *c) { return &c->stats; }
int sync_client_last_status(const SyncClient *c) { return c->last_status; }

// ---- one call ----

// Records a failed call: the error message names the server, the method, the status and the
// server's details.
static grpc_status_code call_failed(SyncClient *c, const char *method, grpc_status_code code, grpc_slice details) {
    char *text = grpc_slice_to_c_string(details);
    snprintf(c->last_details, sizeof c->last_details, "%s", text);
    // gRPC's words for a stream the server's receive quota reset say nothing of why.
    const char *why = sync_call_retry(code, text) == SYNC_RETRY_QUOTA_RESET
                          ? " (the server's gRPC receive quota, --max_receive_buffer, reset the call: it was short of "
                            "memory for requests being received)"
                          : "";
    spes_fail("server %s: %s failed (%s): %s%s", c->addr, method, wire_status_name(code), text, why);
    gpr_free(text);
    return c->last_status = code;
}

// A call that failed DEADLINE_EXCEEDED after elapsed_s: either it ran past the deadline it was
// given for its size (call_deadline.h), and the error names the server, the call and the rule, so
// a stalled server is told from a slow link; or the server ended it before (sync_deadline_side),
// and the error says that this peer was the slow side, not the server.
static void explain_deadline(SyncClient *c, grpc_status_code code, const char *method, size_t bytes, int sharing,
                             double deadline_s, double elapsed_s, bool own_timer) {
    if (code != GRPC_STATUS_DEADLINE_EXCEEDED) return;
    if (sync_deadline_side(elapsed_s, deadline_s, own_timer) == SYNC_DEADLINE_SERVER) {
        spes_fail("server %s: %s failed (DEADLINE_EXCEEDED) after %.0f s, before this peer's deadline of %.0f s: the "
                  "server ended the call (it said: %s), having seen no progress from this peer within its "
                  "--idle_timeout_seconds: this peer or its link was the slow side (a peer paused, or a link slower "
                  "than that timeout allows)",
                  c->addr, method, elapsed_s, deadline_s, c->last_details);
        return;
    }
    char rule[160];
    if (deadline_s < sync_call_deadline(bytes, sharing, 0))
        snprintf(rule, sizeof rule, "call_timeout_s, the cap of %.0f s + bytes at %.0f KiB/s", SYNC_CALL_FLOOR_S,
                 SYNC_MIN_RATE / 1024);
    else
        snprintf(rule, sizeof rule, "%.0f s + %zu bytes x %d at %.0f KiB/s", SYNC_CALL_FLOOR_S, bytes, sharing,
                 SYNC_MIN_RATE / 1024);
    spes_fail("server %s: %s failed (DEADLINE_EXCEEDED): no answer within its deadline of %.0f s (%s): the server "
              "stalled, or the link is slower than %.0f KiB/s",
              c->addr, method, deadline_s, rule, SYNC_MIN_RATE / 1024);
}

static grpc_call *start_call(SyncClient *c, const char *method, double timeout_s) {
    return grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                    grpc_slice_from_static_string(method), NULL, wire_deadline(timeout_s), NULL);
}

// Final part of the upload stream: initial metadata, the response, the status.
static grpc_status_code finish_stream(SyncClient *c, grpc_call *call, const char *method) {
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_byte_buffer *response = NULL;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &response;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[2].data.recv_status_on_client.status = &code;
    ops[2].data.recv_status_on_client.status_details = &details;
    wire_run_batch(call, c->cq, ops, 3, 0);   // bounded by the call's own deadline
    if (code != GRPC_STATUS_OK) call_failed(c, method, code, details);
    if (response) grpc_byte_buffer_destroy(response);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    return code;
}

// A unary call in flight: unary_start sends the request and asks for the reply in one batch
// tagged with the call itself, unary_finish plucks that tag. Several may be in flight at once.
typedef struct {
    const char *method;
    grpc_call *call;
    grpc_byte_buffer *request, *response;
    grpc_metadata_array initial, trailing;
    grpc_status_code code;
    grpc_slice details;
    bool started;
    double started_at;          // now_seconds() when it was started
} UnaryCall;

static void unary_start(SyncClient *c, UnaryCall *u, const char *method, const ProtobufCMessage *req, double timeout_s) {
    memset(u, 0, sizeof *u);
    u->method = method;
    u->started_at = now_seconds();
    u->code = GRPC_STATUS_UNKNOWN;
    u->details = grpc_empty_slice();
    grpc_metadata_array_init(&u->initial);
    grpc_metadata_array_init(&u->trailing);
    u->request = wire_pack(req);
    if (!u->request) return;
    u->call = start_call(c, method, timeout_s);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    send_metadata(c, &ops[0]);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = u->request;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->response;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->trailing;
    ops[5].data.recv_status_on_client.status = &u->code;
    ops[5].data.recv_status_on_client.status_details = &u->details;
    u->started = grpc_call_start_batch(u->call, ops, 6, u, NULL) == GRPC_CALL_OK;
}

// Waits for u and releases it; on OK *resp is the unpacked response (resp may be NULL to
// discard it).
static grpc_status_code unary_finish(SyncClient *c, UnaryCall *u, const ProtobufCMessageDescriptor *resp_desc,
                                     ProtobufCMessage **resp) {
    if (u->started) grpc_completion_queue_pluck(c->cq, u, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_status_code code = u->code;
    if (!u->request) code = status_fail(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory packing a %s request", u->method);
    else if (code != GRPC_STATUS_OK) call_failed(c, u->method, code, u->details);
    if (resp) *resp = NULL;
    if (code == GRPC_STATUS_OK && resp) {
        *resp = u->response ? wire_unpack(resp_desc, u->response) : NULL;
        if (!*resp) code = c->last_status = status_fail(GRPC_STATUS_INTERNAL, "server %s: %s returned a malformed response",
                                                         c->addr, u->method);
    }
    if (u->response) grpc_byte_buffer_destroy(u->response);
    if (u->request) grpc_byte_buffer_destroy(u->request);
    if (u->call) grpc_call_unref(u->call);
    grpc_slice_unref(u->details);
    grpc_metadata_array_destroy(&u->initial);
    grpc_metadata_array_destroy(&u->trailing);
    memset(u, 0, sizeof *u);
    return code;
}

static grpc_status_code unary_once(SyncClient *c, const char *method, const ProtobufCMessage *req,
                                   const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                                   double timeout_s) {
    UnaryCall u;
    unary_start(c, &u, method, req, timeout_s);
    return unary_finish(c, &u, resp_desc, resp);
}

static void sleep_seconds(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// Whether a failed call is worth repeating (call_retry.h: unreachable, "server busy", or reset
// by the server's receive quota), judged from the error message the failure left.
static bool transient(grpc_status_code code) { return sync_call_retry(code, spes_last_error()) != SYNC_RETRY_NO; }

// Says that a call is repeated because the server's receive quota reset it: the server logs
// nothing of it (gRPC resets the stream), so this line is where an operator sees it.
static void note_retry(const SyncClient *c, grpc_status_code code) {
    SyncRetry why = sync_call_retry(code, spes_last_error());
    if (why == SYNC_RETRY_QUOTA_RESET)
        log_warn("server %s: a call was reset by the server's receive quota (--max_receive_buffer: it is short of "
                 "memory for requests being received); retrying", c->addr);
    else if (why == SYNC_RETRY_AGGREGATION)
        log_warn("server %s: the round this upload completed failed to aggregate (%s); uploading again", c->addr,
                 spes_last_error());
}

// Runs attempt(...) until it succeeds, fails with a status that is not transient(), or
// connect_timeout_s passes: backoff 0.1 s doubling up to 2 s between tries, each delay scaled
// by a random factor in [0.5, 1) (jitter).
#define WITH_RETRY(c, code, attempt)                                                         \
    do {                                                                                     \
        double retry_start_ = now_seconds(), backoff_ = 0.1;                                 \
        for (;;) {                                                                           \
            (code) = (attempt);                                                              \
            if (!transient(code) ||                                                          \
                now_seconds() - retry_start_ + backoff_ > (c)->cfg.connect_timeout_s)        \
                break;                                                                       \
            note_retry((c), code);                                                           \
            sleep_seconds(backoff_ * (0.5 + 0.5 * rng_uniform(&(c)->jitter)));              \
            backoff_ = backoff_ * 2 > 2.0 ? 2.0 : backoff_ * 2;                              \
        }                                                                                    \
    } while (0)

static grpc_status_code unary(SyncClient *c, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp, double timeout_s) {
    grpc_status_code code;
    WITH_RETRY(c, code, unary_once(c, method, req, resp_desc, resp, timeout_s));
    return code;
}

// ---- RPCs ----

// The delta codec of an I8 run (NULL for F32 / BF16).
static const DeltaCodec *delta_codec_of(const SyncClient *c) {
    if (c->cfg.payload_dtype != DTYPE_I8) return NULL;
    return c->cfg.delta ? c->cfg.delta : &DELTA_INT8;
}

// The largest download a server can send for the model: every tensor in F32 (the widest dtype of
// an aggregate; an int8 or int4 delta is about a quarter of it) plus room for the safetensors
// header (two entries a tensor in a delta: the codes and `name.scale`) and the view's metadata.
// A WaitAggregate announcing more is not believed: the buffer is allocated from it.
static size_t download_max_bytes(const ModelSpec *spec) {
    size_t bytes = 64 * 1024;
    for (int t = 0; t < spec->count; t++) bytes += spec->tensors[t].numel * 4 + 2 * strlen(spec->tensors[t].name) + 512;
    return bytes;
}

// Download chunks of `total` bytes at `chunk` bytes each (the server's rule: at least one).
static size_t chunk_count(size_t total, size_t chunk) { return total == 0 ? 1 : (total + chunk - 1) / chunk; }

// Uploads go in chunks of the size the server's Hello states, kept within [SYNC_MIN_UPLOAD_CHUNK,
// what one message holds]: a server stating 1 byte had the peer send a message per byte (the
// server takes any chunk size up to its message limit).
#define SYNC_MIN_UPLOAD_CHUNK ((size_t)64 * 1024)
static size_t upload_chunk_from_server(const SyncClient *c, int64_t stated) {
    size_t most = c->cfg.max_message_size > 2 * SYNC_MIN_UPLOAD_CHUNK ? c->cfg.max_message_size - 1024 : SYNC_MIN_UPLOAD_CHUNK;
    size_t chunk = (uint64_t)stated > most ? most : (size_t)stated;
    return chunk < SYNC_MIN_UPLOAD_CHUNK ? SYNC_MIN_UPLOAD_CHUNK : chunk;
}

int sync_client_hello(SyncClient *c, const ModelSpec *spec) {
    HelloRequest req = HELLO_REQUEST__INIT;
    req.instance_id = c->instance_id;
    req.peer_id = c->cfg.peer_id;
    req.num_peers = c->cfg.num_peers;
    req.experts_per_node = c->cfg.experts_per_node;
    req.mode = (char *)sync_mode_name(c->cfg.mode);
    req.fingerprint = spec->fingerprint;
    const DeltaCodec *delta = delta_codec_of(c);
    req.payload_dtype = (char *)(delta ? delta->wire : dtype_name(c->cfg.payload_dtype));
    if (c->cfg.outer.lr != 0.0f) {   // stated: both values (proto HelloRequest.outer_lr)
        req.outer_lr = c->cfg.outer.lr;
        req.outer_momentum = c->cfg.outer.momentum;
    }
    TensorInfo *infos = spes_calloc((size_t)spec->count, sizeof *infos);
    TensorInfo **ptrs = spes_calloc((size_t)spec->count, sizeof *ptrs);
    if (!infos || !ptrs) {
        free(infos);
        free(ptrs);
        return SPES_ERR;
    }
    for (int t = 0; t < spec->count; t++) {
        tensor_info__init(&infos[t]);
        infos[t].name = spec->tensors[t].name;
        infos[t].dtype = (char *)dtype_name(spec->tensors[t].dtype);
        infos[t].n_shape = (size_t)spec->tensors[t].ndim;
        infos[t].shape = (int64_t *)spec->tensors[t].shape;
        ptrs[t] = &infos[t];
    }
    req.n_tensors = (size_t)spec->count;
    req.tensors = ptrs;
    char *encodings[2];
    req.encodings = encodings;
    if (c->cfg.omit_own_experts) encodings[req.n_encodings++] = SYNC_VIEW_OMIT_OWN;
    if (delta) encodings[req.n_encodings++] = (char *)delta->encoding;
    HelloResponse *resp = NULL;
    grpc_status_code code = unary(c, "/FederatedServer/Hello", &req.base, &hello_response__descriptor,
                                  (ProtobufCMessage **)&resp, 60);
    free(infos);
    free(ptrs);
    if (code != GRPC_STATUS_OK) return SPES_ERR;
    // A server that states another model's fingerprint would serve aggregates of that model (0: not stated).
    if (resp->fingerprint != 0 && resp->fingerprint != spec->fingerprint) {
        unsigned long long theirs = resp->fingerprint;
        hello_response__free_unpacked(resp, NULL);
        return spes_fail("server %s: its Hello answers model fingerprint %016llx, but this peer's model is %016llx (a "
                         "server of another model, or a broken one)",
                         c->addr, theirs, (unsigned long long)spec->fingerprint);
    }
    if (!c->cfg.chunk_size && resp->chunk_size > 0) c->chunk_size = upload_chunk_from_server(c, resp->chunk_size);
    c->download_chunk = resp->chunk_size > 0 ? (size_t)resp->chunk_size : 0;
    c->download_max = download_max_bytes(spec);
    bool delta_ok = false;
    for (size_t i = 0; delta && i < resp->n_encodings; i++) delta_ok |= strcmp(resp->encodings[i], delta->encoding) == 0;
    if (delta && !delta_ok) {
        hello_response__free_unpacked(resp, NULL);
        return spes_fail("server %s does not serve %s deltas (its Hello lists no '%s'); use payload_dtype f32 or "
                         "bf16%s, or a newer server",
                         c->addr, delta->name, delta->encoding, delta == &DELTA_INT4 ? " (or int8, if it lists int8-delta)" : "");
    }
    // A server that states no outer settings (an older one) may run anything: only a peer at the
    // reference settings (lr 1, momentum 0, or none stated) goes on without knowing.
    if (resp->outer_lr == 0.0f && c->cfg.outer.lr != 0.0f && !outer_opt_is_off(&c->cfg.outer)) {
        hello_response__free_unpacked(resp, NULL);
        return spes_fail("server %s does not state its outer optimizer (an older server); this peer's config expects "
                         "outer_lr %g, outer_momentum %g: use a newer server, or set spes_config.outer_lr 1 and "
                         "outer_momentum 0 if that server runs without --outer_lr/--outer_momentum",
                         c->addr, (double)c->cfg.outer.lr, (double)c->cfg.outer.momentum);
    }
    for (size_t i = 0; i < c->n_server_encodings; i++) free(c->server_encodings[i]);
    free(c->server_encodings);
    c->n_server_encodings = 0;
    c->server_encodings = spes_calloc(resp->n_encodings + 1, sizeof(char *));
    for (size_t i = 0; c->server_encodings && i < resp->n_encodings; i++)
        if ((c->server_encodings[c->n_server_encodings] = spes_strdup(resp->encodings[i]))) c->n_server_encodings++;
    hello_response__free_unpacked(resp, NULL);
    return c->server_encodings ? SPES_OK : SPES_ERR;
}

bool sync_client_server_speaks(const SyncClient *c, const char *encoding) {
    for (size_t i = 0; i < c->n_server_encodings; i++)
        if (strcmp(c->server_encodings[i], encoding) == 0) return true;
    return false;
}

void sync_client_note_metrics(SyncClient *c, const PeerMetricPoint *point) {
    pthread_mutex_lock(&c->metrics_mu);
    if (c->n_metrics == SYNC_MAX_METRIC_POINTS) {   // keep the newest
        memmove(c->metrics, c->metrics + 1, (SYNC_MAX_METRIC_POINTS - 1) * sizeof *c->metrics);
        c->n_metrics--;
    }
    c->metrics[c->n_metrics++] = *point;
    pthread_mutex_unlock(&c->metrics_mu);
}

// The points an upload carries (proto PeerMetrics, on its first message): a snapshot of the
// pending ones. points[SYNC_MAX_METRIC_POINTS], ptrs likewise.
static int pending_metrics(SyncClient *c, PeerMetrics *points, PeerMetrics **ptrs) {
    pthread_mutex_lock(&c->metrics_mu);
    int n = c->n_metrics;
    for (int i = 0; i < n; i++) {
        wire_metrics_to_proto(&c->metrics[i], &points[i]);
        ptrs[i] = &points[i];
    }
    pthread_mutex_unlock(&c->metrics_mu);
    return n;
}

// The server has the points up to step `through`: drop them (newer ones noted meanwhile stay).
static void drop_reported_metrics(SyncClient *c, int64_t through) {
    pthread_mutex_lock(&c->metrics_mu);
    int keep = 0;
    while (keep < c->n_metrics && c->metrics[keep].step <= through) keep++;
    memmove(c->metrics, c->metrics + keep, (size_t)(c->n_metrics - keep) * sizeof *c->metrics);
    c->n_metrics -= keep;
    pthread_mutex_unlock(&c->metrics_mu);
}

// One attempt at streaming the whole payload.
static grpc_status_code upload_once(SyncClient *c, int step, const uint8_t *bytes, size_t len) {
    static const char *method = "/FederatedServer/UploadChunk";
    size_t n_chunks = len == 0 ? 1 : (len + c->chunk_size - 1) / c->chunk_size;
    if (n_chunks > 0x7fffffff)
        return status_fail(GRPC_STATUS_INVALID_ARGUMENT, "upload of %zu bytes needs too many chunks", len);
    // The whole stream gets the deadline of its bytes, and each message one of its own that
    // restarts as it is sent: a server that stops reading mid-stream is given up after about
    // what that message needs, even where the stream's deadline is the cap. Two messages' bytes:
    // gRPC may finish sending one only once the one before it has left too.
    double deadline = sync_call_deadline(len, 1, c->cfg.call_timeout_s);
    size_t message_bytes = c->chunk_size < len ? c->chunk_size : len;
    double message_deadline = sync_call_deadline(message_bytes, 2, c->cfg.call_timeout_s);
    bool message_stalled = false;
    double started_at = now_seconds();
    grpc_call *call = start_call(c, method, deadline);
    grpc_op op;
    memset(&op, 0, sizeof op);
    send_metadata(c, &op);
    bool sending = wire_run_batch(call, c->cq, &op, 1, 0);
    // Metrics are best effort: without memory for them the upload goes without.
    PeerMetrics *points = malloc(SYNC_MAX_METRIC_POINTS * sizeof *points);
    PeerMetrics **point_ptrs = malloc(SYNC_MAX_METRIC_POINTS * sizeof *point_ptrs);
    int n_points = points && point_ptrs ? pending_metrics(c, points, point_ptrs) : 0;
    for (size_t i = 0; sending && i < n_chunks; i++) {
        UploadChunkRequest m = UPLOAD_CHUNK_REQUEST__INIT;
        m.instance_id = c->instance_id;
        if (i == 0) {   // the steps logged since the last upload ride on the first message
            m.n_metrics = (size_t)n_points;
            m.metrics = point_ptrs;
        }
        m.peer_id = c->cfg.peer_id;
        m.step = step;
        m.chunk_id = (int32_t)i;
        m.total_chunks = (int32_t)n_chunks;
        m.chunk_data.data = (uint8_t *)bytes + i * c->chunk_size;
        m.chunk_data.len = len - i * c->chunk_size < c->chunk_size ? len - i * c->chunk_size : c->chunk_size;
        grpc_byte_buffer *bb = wire_pack(&m.base);
        if (!bb) break;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_SEND_MESSAGE;
        op.data.send_message.send_message = bb;
        // Fails once the server has answered early, or when the message is not taken in time.
        double sent_at = now_seconds();
        sending = wire_run_batch(call, c->cq, &op, 1, message_deadline);
        message_stalled = !sending && now_seconds() - sent_at >= message_deadline;
        grpc_byte_buffer_destroy(bb);
    }
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    wire_run_batch(call, c->cq, &op, 1, 0);
    grpc_status_code code = finish_stream(c, call, method);
    grpc_call_unref(call);
    double elapsed = now_seconds() - started_at;
    if (message_stalled)
        explain_deadline(c, code, "/FederatedServer/UploadChunk (one message of the stream)", message_bytes, 2,
                         message_deadline, elapsed, true);
    else
        explain_deadline(c, code, method, len, 1, deadline, elapsed, false);
    // Answered by the server (accepted, or refused after reading the first message): it has the
    // points. A transport failure keeps them for the retry or the next upload.
    if (n_points > 0 && !transient(code)) drop_reported_metrics(c, points[n_points - 1].step);
    free(points);
    free(point_ptrs);
    return code;
}

int sync_client_upload_bytes(SyncClient *c, int step, const uint8_t *bytes, size_t len) {
    double start = now_seconds();
    grpc_status_code code;
    WITH_RETRY(c, code, upload_once(c, step, bytes, len));
    // ALREADY_EXISTS: the round was aggregated with our earlier upload (a retry after a lost reply).
    if (code != GRPC_STATUS_OK && code != GRPC_STATUS_ALREADY_EXISTS) return SPES_ERR;
    c->stats.step = step;
    c->stats.upload_s = now_seconds() - start;
    c->stats.bytes_up = len;
    c->stats.total_bytes_up += len;
    return SPES_OK;
}

// sync_client_serialize, stating `step` (spes_step) when it is >= 0.
static int serialize_payload(const SyncClient *c, const StWriteTensor *tensors, int n, int step, uint8_t **bytes,
                             size_t *len) {
    // Convert to the payload dtype where needed (bf16 halves the traffic).
    StWriteTensor *w = spes_calloc(n > 0 ? (size_t)n : 1, sizeof *w);
    uint16_t **converted = spes_calloc(n > 0 ? (size_t)n : 1, sizeof *converted);
    int rc = w && converted ? SPES_OK : SPES_ERR;
    for (int i = 0; rc == SPES_OK && i < n; i++) {
        w[i] = tensors[i];
        // int8 runs: full payloads (a peer without a base) go in F32; deltas are encoded by the caller.
        if (tensors[i].dtype == c->cfg.payload_dtype || c->cfg.payload_dtype == DTYPE_I8) continue;
        if (tensors[i].dtype != DTYPE_F32 || c->cfg.payload_dtype != DTYPE_BF16) {
            rc = spes_fail("upload: tensor '%s' is %s; give F32 (or the payload dtype %s)", tensors[i].name,
                           dtype_name(tensors[i].dtype), dtype_name(c->cfg.payload_dtype));
            break;
        }
        size_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++) numel *= (size_t)tensors[i].shape[d];
        converted[i] = spes_malloc(numel * 2 + 1);
        if (!converted[i]) {
            rc = SPES_ERR;
            break;
        }
        const float *src = tensors[i].data;
        for (size_t k = 0; k < numel; k++) converted[i][k] = f32_to_bf16(src[k]);
        w[i].dtype = DTYPE_BF16;
        w[i].data = converted[i];
    }
    char step_text[16];
    snprintf(step_text, sizeof step_text, "%d", step);
    const char *keys[] = {SYNC_META_STEP}, *values[] = {step_text};
    if (rc == SPES_OK) rc = safetensors_serialize(w, n, keys, values, step >= 0 ? 1 : 0, bytes, len);
    for (int i = 0; converted && i < n; i++) free(converted[i]);
    free(converted);
    free(w);
    return rc;
}

int sync_client_serialize(const SyncClient *c, const StWriteTensor *tensors, int n, uint8_t **bytes, size_t *len) {
    return serialize_payload(c, tensors, n, -1, bytes, len);
}

int sync_client_serialize_aggregate(const SyncClient *c, const StWriteTensor *tensors, int n, int step, uint8_t **bytes,
                                    size_t *len) {
    return serialize_payload(c, tensors, n, step, bytes, len);
}

int sync_client_upload(SyncClient *c, int step, const StWriteTensor *tensors, int n) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    SPES_TRY(sync_client_serialize(c, tensors, n, &bytes, &len));
    int rc = sync_client_upload_bytes(c, step, bytes, len);
    free(bytes);
    return rc;
}

// A wait for an aggregate says why it lasts, first after SYNC_WAIT_NOTE_S, then at doubling
// intervals up to SYNC_WAIT_NOTE_MAX_S: without it a peer waiting on a missing one (no
// --round_timeout, no wait_timeout_s) or on a server that cannot write its state dir waited for
// ever without a line.
#define SYNC_WAIT_NOTE_S 10.0
#define SYNC_WAIT_NOTE_MAX_S 300.0

// Logs that step's aggregate is still awaited after `waited` s, with what the server's Status says
// of the round (the peers it still waits for), or without it when Status fails.
static void note_waiting(SyncClient *c, int step, double waited) {
    RoundsStatus *st = spes_calloc(1, sizeof *st);   // large (1024 peer ids): not on the stack
    char why[1024] = "";
    if (st && sync_client_status(c, st) == SPES_OK && st->open_step == step && st->total_peers > 0) {
        bool in[1024] = {false};
        for (int i = 0; i < st->num_uploaded && i < 1024; i++)
            if (st->peers_uploaded[i] >= 0 && st->peers_uploaded[i] < 1024) in[st->peers_uploaded[i]] = true;
        int at = snprintf(why, sizeof why, "; the server has the uploads of %d of %d peers", st->num_uploaded,
                          st->total_peers);
        if (st->num_uploaded >= st->total_peers && st->aggregate_problem[0]) {
            snprintf(why + at, sizeof why - (size_t)at, " but cannot publish the aggregate: %s (it retries)",
                     st->aggregate_problem);
        } else if (st->num_uploaded >= st->total_peers) {
            snprintf(why + at, sizeof why - (size_t)at, " but has not published the aggregate (see the server's log)");
        } else {
            at += snprintf(why + at, sizeof why - (size_t)at, ", waiting for peer");
            for (int p = 0, shown = 0; p < st->total_peers && p < 1024 && (size_t)at < sizeof why - 16; p++)
                if (!in[p]) at += snprintf(why + at, sizeof why - (size_t)at, "%s%d", shown++ ? ", " : " ", p);
        }
    } else if (st && st->total_peers > 0) {
        snprintf(why, sizeof why, "; the server's open round is step %d, its newest aggregate step %d", st->open_step,
                 st->last_aggregate_step);
    }
    free(st);
    log_warn("sync step %d: still waiting for the aggregate after %.0f s%s (`spes status %s` shows the run)", step,
             waited, why, c->addr);
}

// Long-polls until step's aggregate is ready; fills the size and chunk count of the view asked
// for and the name of the view served.
static int wait_ready(SyncClient *c, int step, const ViewAsk *ask, int64_t *total_bytes, int *total_chunks,
                      char *view, size_t view_cap) {
    double start = now_seconds(), note_after = SYNC_WAIT_NOTE_S;
    for (;;) {
        double waited = now_seconds() - start;
        double left = c->cfg.wait_timeout_s > 0 ? c->cfg.wait_timeout_s - waited : 1e9;
        if (left <= 0)
            return spes_fail(
                "server %s: the aggregate of step %d was not ready after %.0f s (a peer missing? see `Status`)",
                c->addr, step, c->cfg.wait_timeout_s);
        if (waited >= note_after) {
            note_waiting(c, step, waited);
            note_after = note_after * 2 < SYNC_WAIT_NOTE_MAX_S ? note_after * 2 : note_after + SYNC_WAIT_NOTE_MAX_S;
        }
        if (left > note_after - waited) left = note_after - waited + 0.05;   // wake up for the next note
        WaitAggregateRequest req = WAIT_AGGREGATE_REQUEST__INIT;
        req.instance_id = c->instance_id;
        req.peer_id = c->cfg.peer_id;
        req.step = step;
        req.timeout_ms = (int32_t)(left < 25.0 ? left * 1000 : 25000);
        req.omit_own_experts = ask->omit_own_experts;
        req.has_delta_base = ask->has_delta_base;
        req.delta_base_step = ask->delta_base_step;
        WaitAggregateResponse *resp = NULL;
        grpc_status_code code =
            unary(c, "/FederatedServer/WaitAggregate", &req.base, &wait_aggregate_response__descriptor,
                  (ProtobufCMessage **)&resp, req.timeout_ms / 1000.0 + 30);
        if (code != GRPC_STATUS_OK) return SPES_ERR;
        bool ready = resp->ready;
        *total_bytes = resp->total_bytes;
        *total_chunks = resp->total_chunks;
        snprintf(view, view_cap, "%s", resp->view ? resp->view : "");
        wait_aggregate_response__free_unpacked(resp, NULL);
        if (ready) break;
    }
    if (*total_bytes < 0 || *total_chunks < 1)
        return spes_fail("server %s: step %d's aggregate has %lld bytes in %d chunks?", c->addr, step,
                         (long long)*total_bytes, *total_chunks);
    // The buffer and the number of chunk calls follow these two numbers: they must fit the model
    // (once its Hello said what it is) and the chunk size the server stated.
    if (c->download_max && (uint64_t)*total_bytes > c->download_max)
        return spes_fail("server %s: WaitAggregate for step %d announces total_bytes %lld, more than this model's "
                         "aggregate can take (%zu: every tensor in F32 plus header room)",
                         c->addr, step, (long long)*total_bytes, c->download_max);
    size_t want = chunk_count((size_t)*total_bytes, c->download_chunk ? c->download_chunk : 1);
    if (c->download_chunk ? (size_t)*total_chunks != want : (size_t)*total_chunks > want)
        return spes_fail("server %s: WaitAggregate for step %d announces total_chunks %d for %lld bytes; %s %zu", c->addr,
                         step, *total_chunks, (long long)*total_bytes,
                         c->download_chunk ? "the chunk_size its Hello stated makes" : "at most", want);
    return SPES_OK;
}

// Chunks in flight at once while downloading: hides the round trip per chunk on slow links.
#define DOWNLOAD_WINDOW 4

static DownloadChunkRequest chunk_request(const SyncClient *c, int step, int chunk, const ViewAsk *ask) {
    DownloadChunkRequest req = DOWNLOAD_CHUNK_REQUEST__INIT;
    req.instance_id = c->instance_id;
    req.peer_id = c->cfg.peer_id;
    req.step = step;
    req.chunk_id = chunk;
    req.omit_own_experts = ask->omit_own_experts;
    req.has_delta_base = ask->has_delta_base;
    req.delta_base_step = ask->delta_base_step;
    return req;
}

static void start_chunk(SyncClient *c, UnaryCall *u, int step, int chunk, const ViewAsk *ask, double deadline_s) {
    DownloadChunkRequest req = chunk_request(c, step, chunk, ask);
    unary_start(c, u, "/FederatedServer/DownloadChunk", &req.base, deadline_s);
}

// Downloads chunks [0, chunks) of step's aggregate into buf[total], DOWNLOAD_WINDOW at a
// time, appending them in order. A chunk that meets an unreachable or busy server is fetched
// again with the usual retries.
static int download_chunks(SyncClient *c, int step, const ViewAsk *ask, int chunks, uint8_t *buf, size_t total) {
    UnaryCall window[DOWNLOAD_WINDOW];
    int started = 0, finished = 0, rc = SPES_OK;
    size_t have = 0;
    // Each chunk call's deadline follows its bytes, the calls in flight sharing the link.
    size_t chunk_bytes = sync_download_chunk_bytes(total, chunks, c->download_chunk);
    int sharing = chunks < DOWNLOAD_WINDOW ? chunks : DOWNLOAD_WINDOW;
    double deadline = sync_call_deadline(chunk_bytes, sharing, c->cfg.call_timeout_s);
    for (; started < chunks && started < DOWNLOAD_WINDOW; started++)
        start_chunk(c, &window[started], step, started, ask, deadline);
    for (int i = 0; i < chunks; i++) {
        DownloadChunkResponse *resp = NULL;
        double chunk_started = window[i % DOWNLOAD_WINDOW].started_at;
        grpc_status_code code = unary_finish(c, &window[i % DOWNLOAD_WINDOW], &download_chunk_response__descriptor,
                                             (ProtobufCMessage **)&resp);
        finished = i + 1;
        if (transient(code)) {
            chunk_started = now_seconds();
            DownloadChunkRequest req = chunk_request(c, step, i, ask);
            code = unary(c, "/FederatedServer/DownloadChunk", &req.base, &download_chunk_response__descriptor,
                         (ProtobufCMessage **)&resp, deadline);
        }
        if (code != GRPC_STATUS_OK) {
            explain_deadline(c, code, "/FederatedServer/DownloadChunk", chunk_bytes, sharing, deadline,
                             now_seconds() - chunk_started, false);
            rc = SPES_ERR;
            break;
        }
        bool bad = !resp->ready || resp->chunk_data.len > total - have || resp->last_chunk != (i == chunks - 1);
        if (!bad) memcpy(buf + have, resp->chunk_data.data, resp->chunk_data.len);
        have += bad ? 0 : resp->chunk_data.len;
        download_chunk_response__free_unpacked(resp, NULL);
        if (bad) {
            rc = spes_fail("server %s: chunk %d of step %d's aggregate is inconsistent (not ready, too long, or "
                           "last_chunk misplaced)",
                           c->addr, i, step);
            break;
        }
        if (started < chunks) start_chunk(c, &window[i % DOWNLOAD_WINDOW], step, started++, ask, deadline);
    }
    // After a failure, let the calls still in flight end without touching the error message.
    char message[1024];
    snprintf(message, sizeof message, "%s", spes_last_error());
    grpc_status_code first_status = c->last_status;
    for (int j = finished; j < started; j++) unary_finish(c, &window[j % DOWNLOAD_WINDOW], NULL, NULL);
    c->last_status = first_status;
    if (rc != SPES_OK) return spes_fail("%s", message);
    if (have != total)
        return spes_fail("server %s: step %d's aggregate came to %zu bytes, %zu announced", c->addr, step, have, total);
    return SPES_OK;
}

// Waits for step's aggregate and downloads the view `ask` names; *view: the view served.
static int wait_and_download(SyncClient *c, int step, const ViewAsk *ask, uint8_t **bytes, size_t *len, char *view,
                             size_t view_cap) {
    double start = now_seconds();
    int64_t total = 0;
    int chunks = 0;
    SPES_TRY(wait_ready(c, step, ask, &total, &chunks, view, view_cap));
    double waited = now_seconds();
    uint8_t *buf = spes_malloc(total ? (size_t)total : 1);
    if (!buf) return SPES_ERR;
    // An aggregate of another round would load without a sign: refused by the step it states.
    if (download_chunks(c, step, ask, chunks, buf, (size_t)total) != SPES_OK ||
        sync_aggregate_check_step(buf, (size_t)total, step, c->addr) != SPES_OK) {
        free(buf);
        return SPES_ERR;
    }
    c->stats.step = step;
    c->stats.wait_s = waited - start;
    c->stats.download_s = now_seconds() - waited;
    c->stats.bytes_down = (uint64_t)total;
    c->stats.total_bytes_down += (uint64_t)total;
    c->stats.rounds++;
    *bytes = buf;
    *len = (size_t)total;
    return SPES_OK;
}

int sync_client_wait_and_download(SyncClient *c, int step, uint8_t **bytes, size_t *len) {
    ViewAsk whole = {0};
    char view[48];
    SPES_TRY(wait_and_download(c, step, &whole, bytes, len, view, sizeof view));
    if (view[0]) {   // a server must fall back to the whole aggregate when asked for nothing else
        free(*bytes);
        *bytes = NULL;
        return spes_fail("server %s: asked for step %d's whole aggregate, got the view '%s'", c->addr, step, view);
    }
    return SPES_OK;
}

int sync_client_wait_and_download_view(SyncClient *c, int step, int delta_base_step, uint8_t **bytes, size_t *len,
                                       SyncDownload *got) {
    ViewAsk ask = {.omit_own_experts = c->cfg.omit_own_experts && sync_client_server_speaks(c, SYNC_VIEW_OMIT_OWN)};
    const DeltaCodec *delta = delta_codec_of(c);
    ask.has_delta_base = delta && delta_base_step >= 0;
    ask.delta_base_step = ask.has_delta_base ? delta_base_step : 0;
    memset(got, 0, sizeof *got);
    SPES_TRY(wait_and_download(c, step, &ask, bytes, len, got->view, sizeof got->view));
    // A view is taken only when it is one of the four names and holds nothing this peer did not ask for.
    got->own_experts_omitted = strstr(got->view, SYNC_VIEW_OMIT_OWN) != NULL;
    got->is_delta = delta && strncmp(got->view, delta->encoding, strlen(delta->encoding)) == 0;
    const char *known[] = {"", SYNC_VIEW_OMIT_OWN, delta ? delta->encoding : "", delta ? delta->view_omit_own : ""};
    bool asked = (!got->own_experts_omitted || ask.omit_own_experts) && (!got->is_delta || ask.has_delta_base), is_known = false;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) is_known |= strcmp(got->view, known[i]) == 0;
    asked = asked && is_known;
    if (!asked) {
        free(*bytes);
        *bytes = NULL;
        return spes_fail("server %s: step %d's aggregate came as view '%s', which this peer did not ask for", c->addr,
                         step, got->view);
    }
    return SPES_OK;
}

static void rounds_from_status(const StatusResponse *resp, RoundsStatus *out) {
    memset(out, 0, sizeof *out);
    out->rounds_completed = resp->rounds_completed;
    out->open_step = resp->open_step;
    out->num_uploaded = resp->n_peers_uploaded < 1024 ? (int)resp->n_peers_uploaded : 1024;
    for (int i = 0; i < out->num_uploaded; i++) out->peers_uploaded[i] = resp->peers_uploaded[i];
    out->last_aggregate_step = resp->last_aggregate_step;
    out->bytes_received = resp->bytes_received;
    out->bytes_sent = resp->bytes_sent;
    out->uploads_rejected = resp->uploads_rejected;
    out->fingerprint = resp->fingerprint;
    out->last_aggregate_seconds = resp->last_aggregate_seconds;
    out->rounds_partial = resp->rounds_partial;
    out->last_round_peers = resp->last_round_peers;
    out->total_peers = resp->total_peers;
    // The server's words: escaped, so a hostile server cannot put control sequences on a terminal.
    if (resp->aggregate_problem && *resp->aggregate_problem)
        escape_printable(resp->aggregate_problem, strlen(resp->aggregate_problem), out->aggregate_problem,
                         sizeof out->aggregate_problem);
    // A mode this client does not know stays spes: Status is informational, nothing acts on it.
    if (resp->mode && sync_mode_parse(resp->mode, &out->mode) != SPES_OK) spes_clear_error();
}

// Whether a Status answer can be a server's (counters not negative, peers within the run and
// SYNC_MAX_STATUS_PEERS, steps >= -1, times finite): a hostile or broken server must not make a
// caller print gigabytes (total_peers 2^31-1) or absurd counters. Names the first bad field.
static int status_sane(const SyncClient *c, const StatusResponse *r) {
    const char *bad = NULL;
    long long value = 0;
    double real = 0;
    int64_t P = r->total_peers;
#define CHECK_INT(cond, field) \
    if (!bad && !(cond)) bad = #field, value = (long long)r->field
    CHECK_INT(r->total_peers >= 0 && r->total_peers <= SYNC_MAX_STATUS_PEERS, total_peers);
    CHECK_INT(r->rounds_completed >= 0, rounds_completed);
    CHECK_INT(r->rounds_partial >= 0 && r->rounds_partial <= r->rounds_completed, rounds_partial);
    CHECK_INT(r->bytes_received >= 0, bytes_received);
    CHECK_INT(r->bytes_sent >= 0, bytes_sent);
    CHECK_INT(r->uploads_rejected >= 0, uploads_rejected);
    CHECK_INT(r->open_step >= -1, open_step);
    CHECK_INT(r->last_aggregate_step >= -1, last_aggregate_step);
    CHECK_INT(r->last_round_peers >= 0 && r->last_round_peers <= P, last_round_peers);
    CHECK_INT(r->n_peers_uploaded <= (size_t)P, n_peers_uploaded);
    CHECK_INT(r->n_peers <= (size_t)P, n_peers);
#undef CHECK_INT
    for (size_t i = 0; !bad && i < r->n_peers_uploaded; i++)
        if (r->peers_uploaded[i] < 0 || r->peers_uploaded[i] >= P) bad = "peers_uploaded[]", value = r->peers_uploaded[i];
    if (!bad && !(r->last_aggregate_seconds >= 0 && r->last_aggregate_seconds < 1e9))
        bad = "last_aggregate_seconds", real = r->last_aggregate_seconds;
    for (size_t i = 0; !bad && i < r->n_peers; i++) {
        const PeerState *st = r->peers[i];
        if (st->peer_id < 0 || st->peer_id >= P) bad = "peers[].peer_id", value = st->peer_id;
        else if (st->last_upload_step < -1) bad = "peers[].last_upload_step", value = st->last_upload_step;
        else if (!(st->last_seen_unix >= 0 && st->last_seen_unix < 1e11)) bad = "peers[].last_seen_unix", real = st->last_seen_unix;
    }
    if (!bad) return SPES_OK;
    if (real != 0 || strstr(bad, "seconds") || strstr(bad, "unix"))
        return spes_fail("server %s: its Status cannot be right: %s %g", c->addr, bad, real);
    return spes_fail("server %s: its Status cannot be right: %s %lld", c->addr, bad, value);
}

// The Status call, bounded by the client's call timeout (spes status --timeout) and at most 30 s.
static StatusResponse *status_call(SyncClient *c) {
    StatusRequest req = STATUS_REQUEST__INIT;
    StatusResponse *resp = NULL;
    double timeout = c->cfg.call_timeout_s > 0 && c->cfg.call_timeout_s < 30 ? c->cfg.call_timeout_s : 30;
    if (unary(c, "/FederatedServer/Status", &req.base, &status_response__descriptor, (ProtobufCMessage **)&resp,
              timeout) != GRPC_STATUS_OK)
        return NULL;
    if (status_sane(c, resp) != SPES_OK) {
        status_response__free_unpacked(resp, NULL);
        return NULL;
    }
    return resp;
}

int sync_client_status(SyncClient *c, RoundsStatus *out) {
    StatusResponse *resp = status_call(c);
    if (!resp) return SPES_ERR;
    rounds_from_status(resp, out);
    status_response__free_unpacked(resp, NULL);
    return SPES_OK;
}

static PeerLiveness liveness_from_name(const char *name) {
    static const PeerLiveness all[] = {PEER_ALIVE, PEER_LATE, PEER_MISSING};
    for (size_t i = 0; name && i < sizeof all / sizeof *all; i++)
        if (strcmp(name, peer_liveness_name(all[i])) == 0) return all[i];
    return PEER_UNSEEN;
}

int sync_client_run_status(SyncClient *c, RunStatus *out) {
    StatusResponse *resp = status_call(c);
    if (!resp) return SPES_ERR;
    // The peers the server listed (a server without the extension lists none: num_peers 0), by
    // peer id; ids outside the run are not shown.
    int P = resp->n_peers > 0 && resp->total_peers > 0 && resp->total_peers <= SYNC_MAX_STATUS_PEERS ? resp->total_peers : 0;
    if (run_status_alloc(out, P) != 0) {
        status_response__free_unpacked(resp, NULL);
        return spes_fail("status: out of memory for %d peers", P);
    }
    out->now_unix = unix_seconds();
    rounds_from_status(resp, &out->rounds);
    for (size_t i = 0; i < resp->n_peers; i++) {
        const PeerState *st = resp->peers[i];
        if (st->peer_id < 0 || st->peer_id >= P) continue;
        PeerStatus *ps = &out->peers[st->peer_id];
        ps->liveness = liveness_from_name(st->liveness);
        ps->last_seen_unix = st->last_seen_unix;
        ps->last_upload_step = st->last_upload_step;
        if (st->latest) {   // a point no server keeps is not shown
            ps->points[0] = wire_metrics_from_proto(st->latest);
            ps->num_points = peer_metric_point_problem(&ps->points[0], INT64_MAX) ? 0 : 1;
        }
    }
    status_response__free_unpacked(resp, NULL);
    return SPES_OK;
}

int sync_client_download_latest(SyncClient *c, int *step, uint8_t **bytes, size_t *len) {
    RoundsStatus st;
    SPES_TRY(sync_client_status(c, &st));
    if (st.last_aggregate_step < 0) return spes_fail("server %s: no aggregate exists yet", c->addr);
    *step = st.last_aggregate_step;
    return sync_client_wait_and_download(c, *step, bytes, len);
}
