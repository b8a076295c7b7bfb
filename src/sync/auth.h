// Who may talk to the parameter server: a shared-secret token (`--auth_token_file`) and/or
// per-peer tokens (`--peer_tokens`, lines "peer_id token"), sent by peers as call metadata
// `authorization: Bearer <token>`. Tokens are compared in constant time. A per-peer token also
// binds the caller: it may only upload (and say Hello) as its own peer_id.
#pragma once
#include <grpc/grpc.h>
#include <grpc/status.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *shared;               // NULL: no shared token
    int count;                  // per-peer tokens
    int *peer;
    char **token;
} AuthTokens;

// Reads the token files (either may be NULL). Tokens are the file's text without surrounding
// whitespace; an empty token, a malformed line, a repeated peer, a token given to two peers or
// (num_peers > 0) a peer id >= num_peers is an error naming the file and line.
int auth_load(const char *token_file, const char *peer_tokens_file, int num_peers, AuthTokens *out);
void auth_free(AuthTokens *a);
bool auth_enabled(const AuthTokens *a);

// Reads one token file (the whole file, trimmed). *token malloc'd.
int auth_read_token_file(const char *path, char **token);

// Constant-time equality (time depends only on the lengths).
bool auth_equal(const char *a, size_t a_len, const char *b, size_t b_len);

// Checks a call's metadata. OK: *bound_peer is the peer a per-peer token belongs to, -1 for
// the shared token (any peer). UNAUTHENTICATED (message set) without a valid token, or with
// more than one authorization entry.
grpc_status_code auth_check(const AuthTokens *a, const grpc_metadata_array *md, int *bound_peer);
