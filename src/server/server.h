// The parameter server's transport: gRPC C core around rounds.h. One accept thread takes new
// calls from the server's completion queue and gives each call a thread of its own with its
// own completion queue, so a slow or silent peer only ever holds up its own call (and is
// cancelled after idle_timeout). Aggregation runs in the thread of the upload that completes
// a round. RPCs: see proto/federated.proto and docs/sync.md.
#pragma once
#include <stddef.h>

#include "server/rounds.h"

// Largest Hello request (its tensor list; a 50k-tensor model needs ~3 MiB), largest other
// unary request, most tensors a Hello may declare.
#define SYNC_MAX_HELLO_BYTES ((size_t)16 << 20)
#define SYNC_MAX_SMALL_REQUEST ((size_t)64 << 10)
#define SYNC_MAX_TENSORS (1 << 20)
// Largest upload before the model is known (a Hello-less seeds client's first upload defines
// it): also the default upload budget until then.
#define SYNC_PRESPEC_UPLOAD_CAP ((size_t)4 << 30)

typedef struct {
    const char *host;               // address to bind, e.g. "0.0.0.0" or "127.0.0.1"
    int port;                       // 0: any free port (see sync_server_port)
    size_t chunk_size;              // download chunk payload bytes
    size_t max_message_size;        // largest message accepted or sent
    double max_wait_seconds;        // longest single WaitAggregate long poll
    double idle_timeout_seconds;    // a call making no progress this long is cancelled
    int max_calls;                  // concurrent calls, more are refused RESOURCE_EXHAUSTED "server
                                    // busy" (clients retry); <= 0: sync_server_max_calls(P)
    size_t max_buffered_bytes;      // memory all upload calls together may hold (each 3 chunks: uploads
                                    // go to disk chunk by chunk); 0: a quarter of the
                                    // model's F32 size, at least 2 calls' worth (8 before the model is known)
    size_t max_receive_bytes;       // gRPC's memory for requests being received (its resource quota; past
                                    // it gRPC resets streams); 0: sync_server_receive_quota(P, chunk_size)
    const char *auth_token_file;    // shared token (auth.h); NULL: none
    const char *peer_tokens_file;   // "peer_id token" lines (auth.h); NULL: none
    const char *tls_cert, *tls_key; // PEM files: serve TLS (both or neither)
    const char *tls_ca;             // PEM: with TLS, require client certificates signed by it
    RoundsConfig rounds;
} SyncServerConfig;

// Defaults for everything but rounds.agg (mode, peers, merge settings).
void sync_server_config_defaults(SyncServerConfig *cfg);

// The default call limit for P peers: 4 P + 64 (an upload or long poll, or 4 download chunks
// in flight, per peer, and room for Status calls), at most SYNC_MAX_CALLS_CEILING. Each call
// in progress is a thread blocked on its own queue (a long poll: a condition variable), so a
// waiting peer costs a thread's stack, not CPU.
#define SYNC_MAX_CALLS_CEILING 16384
int sync_server_max_calls(int num_peers);

// The most calls one peer bound by its per-peer token (--peer_tokens) may have in progress; more
// are refused RESOURCE_EXHAUSTED "server busy" (clients retry). An honest peer holds one upload
// or long poll, or 4 download chunks, and a Hello or Status; after a broken connection the same
// again until the server notices (the idle timeout): 16 leaves room for that, and a token holder
// that stalls calls takes 16 of the 4 P + 64 slots, not all of them. Callers with the shared
// token, or none, are not peers the server knows (a request's peer_id is only a claim): the
// global limit alone bounds them (docs/operating.md).
#define SYNC_MAX_CALLS_PER_PEER 16

// The default bound on the memory gRPC may take for requests being received (a resource quota,
// GRPC_ARG_RESOURCE_QUOTA). Without one, every call may receive a whole max_message_size message
// (64 MiB) before the server sees its size, and a client that stops one byte short holds it until
// the idle timeout: 4 P + 64 calls of 64 MiB. Past the quota gRPC resets streams (RST_STREAM
// ENHANCE_YOUR_CALM; the client sees RESOURCE_EXHAUSTED) until it is back under. An honest peer
// has at most one upload chunk being received at a time: two chunks per peer (a retry beside a
// dying attempt), and at least 256 MiB (Hellos of up to 16 MiB at once, 64 KiB of read-ahead per
// connection).
#define SYNC_MIN_RECEIVE_QUOTA ((size_t)256 << 20)
size_t sync_server_receive_quota(int num_peers, size_t chunk_size);

typedef struct SyncServer SyncServer;

// Binds, starts serving in background threads, returns.
int sync_server_start(const SyncServerConfig *cfg, SyncServer **out);
int sync_server_port(const SyncServer *s);
Rounds *sync_server_rounds(SyncServer *s);
// Refuses new calls, cancels those in progress, waits for their threads, frees everything.
void sync_server_stop(SyncServer *s);
