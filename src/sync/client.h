// A peer's side of the parameter server. Typical use in the trainer:
//
//   SyncClientConfig cfg; sync_client_config_defaults(&cfg);
//   cfg.server_addr = "10.0.0.1:50051"; cfg.peer_id = 2; cfg.num_peers = 4; cfg.experts_per_node = 2;
//   SyncClient *c; SPES_TRY(sync_client_create(&cfg, &c));
//   SPES_TRY(sync_client_hello(c, &spec));            // whole model: names, shapes, dtypes
//   every sync_steps steps:
//     SPES_TRY(sync_client_upload(c, step, trainable, n));   // shared tensors + own experts (F32)
//     SPES_TRY(sync_client_wait_and_download(c, step, &bytes, &len));
//     safetensors_parse(bytes, len, ...) -> load every tensor; free(bytes)
//     sync_client_stats(c) -> upload/wait/download seconds and bytes for the console
//   sync_client_destroy(c);
//
// Calls retry an unreachable server (UNAVAILABLE) with exponential backoff up to
// connect_timeout_s; the wait for an aggregate is a series of server-side long polls (no
// fixed sleeps). Not thread-safe: one client per thread.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "sync/delta_codec.h"
#include "sync/model_spec.h"
#include "status/run_status.h"

typedef struct {
    const char *server_addr;        // "host:port"
    int peer_id;
    int num_peers;
    int experts_per_node;           // m (spes mode)
    SyncMode mode;
    DType payload_dtype;            // F32 or BF16: uploads are converted, the aggregate comes back in it;
                                    // I8: an int8 run (uploads are int8 deltas the caller encodes, or
                                    // full F32 payloads; see docs/communication.md)
    const DeltaCodec *delta;        // I8 runs: the codes, DELTA_INT8 or DELTA_INT4 (NULL: int8); Hello
                                    // says "I8" or "I4" and the server must list the codec's encoding
    size_t chunk_size;              // upload chunk payload bytes (0: the server's, from Hello)
    size_t max_message_size;
    double connect_timeout_s;       // how long to retry an unreachable server
    double call_timeout_s;          // the cap on the deadline of one upload / download call, which
                                    // follows its bytes (sync/call_deadline.h); 0: no cap
    double wait_timeout_s;          // longest wait for one aggregate (0: forever)
    const char *auth_token;         // sent as `authorization: Bearer <token>` (NULL: none)
    const char *tls_ca;             // PEM file: connect with TLS, trusting this CA (NULL: insecure)
    const char *tls_cert, *tls_key; // PEM files: client certificate for servers that require one
    bool omit_own_experts;          // say in Hello that downloads may leave out this peer's own
                                    // experts (the caller fills them in: see SyncDownload)
    OuterOptConfig outer;           // the server's outer optimizer this peer's config expects
                                    // (spes_config.outer_lr / outer_momentum), stated in Hello; the
                                    // server refuses another. lr 0 (the default): not stated
} SyncClientConfig;

// What a download held (sync_client_wait_and_download_view): the view the server served.
typedef struct {
    bool own_experts_omitted;       // the peer's own experts are not in it: the round took them
                                    // unchanged from its upload (rounds.h: rounds_view)
    bool is_delta;                // a delta (the run's codec, int8 or int4) against the aggregate the
                                    // peer asked for as base
    char view[48];                  // the server's name of the view ("" the whole aggregate)
} SyncDownload;

typedef struct {
    int step;                       // last round
    double upload_s, wait_s, download_s;
    uint64_t bytes_up, bytes_down;  // payload bytes of the last round
    uint64_t total_bytes_up, total_bytes_down;
    int rounds;
} SyncStats;

typedef struct SyncClient SyncClient;

void sync_client_config_defaults(SyncClientConfig *cfg);
int sync_client_create(const SyncClientConfig *cfg, SyncClient **out);
void sync_client_destroy(SyncClient *c);

// Handshake: the server adopts or checks the model spec and run settings. A refusal names
// what differs (e.g. a tensor's shape, num_peers, mode).
int sync_client_hello(SyncClient *c, const ModelSpec *spec);
// Serialises the tensors (converted to the payload dtype) as safetensors and uploads them
// for step. Tensors are given in F32 or BF16.
int sync_client_upload(SyncClient *c, int step, const StWriteTensor *tensors, int n);
// The same in two steps (e.g. to keep an audit copy of the payload): serialise, then upload.
int sync_client_serialize(const SyncClient *c, const StWriteTensor *tensors, int n, uint8_t **bytes, size_t *len);
// The same, stating `step` in its metadata (spes_step) as the server's aggregate of that step
// does (sync/aggregate_step.h): a peer's copy of a whole aggregate it completed itself (a delta
// or a view without its own experts) is then byte for byte the server's.
int sync_client_serialize_aggregate(const SyncClient *c, const StWriteTensor *tensors, int n, int step, uint8_t **bytes,
                                    size_t *len);
// Uploads ready-made safetensors bytes.
int sync_client_upload_bytes(SyncClient *c, int step, const uint8_t *bytes, size_t len);
// Waits for step's aggregate and downloads it whole: *bytes (malloc'd, caller frees) is safetensors.
int sync_client_wait_and_download(SyncClient *c, int step, uint8_t **bytes, size_t *len);
// The same, asking for the smallest view this client and the server both speak (with
// cfg.omit_own_experts and a server that serves it: without the peer's own experts where the
// round did not change them; in an int8 run with delta_base_step >= 0, the int8 delta against
// the aggregate of that step, which the peer holds). *got says what came.
int sync_client_wait_and_download_view(SyncClient *c, int step, int delta_base_step, uint8_t **bytes, size_t *len,
                                       SyncDownload *got);
// Whether the server said in Hello that it serves `encoding` (e.g. "omit-own-experts").
bool sync_client_server_speaks(const SyncClient *c, const char *encoding);
int sync_client_status(SyncClient *c, RoundsStatus *out);
// Status with every peer as the server sees it (liveness, last call, last upload step, the newest
// metric point: points[0] when num_points is 1). Allocates *out (free with run_status_free).
// Peers are listed for runs of up to SYNC_MAX_STATUS_PEERS; a server that lists none (without
// this extension): num_peers 0.
#define SYNC_MAX_STATUS_PEERS 65536
int sync_client_run_status(SyncClient *c, RunStatus *out);
// A training step's numbers to report to the server with the next upload (proto
// UploadChunkRequest.metrics); kept until an upload carrying them is answered, the newest
// SYNC_MAX_METRIC_POINTS (status/run_status.h). Any thread, also while an upload is in flight.
void sync_client_note_metrics(SyncClient *c, const PeerMetricPoint *point);
// The newest aggregate (its step from Status): what a peer loads after its upload was answered
// ABORTED (its round closed without it, see rounds.h) or when it rejoins a run.
int sync_client_download_latest(SyncClient *c, int *step, uint8_t **bytes, size_t *len);

const SyncStats *sync_client_stats(const SyncClient *c);
// gRPC status of the last failed call (GRPC_STATUS_OK if none failed).
int sync_client_last_status(const SyncClient *c);
