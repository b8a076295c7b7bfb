// Token authentication of parameter-server calls (see auth.h).
#include "sync/auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "sync/call_status.h"

// Trims whitespace at both ends of s[0..*len) in place; returns the new start.
static char *trim(char *s, size_t *len) {
    while (*len > 0 && isspace((unsigned char)s[*len - 1])) s[--*len] = '\0';
    while (*len > 0 && isspace((unsigned char)*s)) s++, (*len)--;
    return s;
}

int auth_read_token_file(const char *path, char **token) {
    uint8_t *data;
    size_t len;
    SPES_TRY(file_read_all(path, &data, &len));
    char *t = trim((char *)data, &len);
    int rc = len == 0 ? spes_fail("token file %s is empty", path) : SPES_OK;
    if (rc == SPES_OK && memchr(t, '\n', len)) rc = spes_fail("token file %s: the token must be one line", path);
    if (rc == SPES_OK && !(*token = spes_strdup(t))) rc = SPES_ERR;
    free(data);
    return rc;
}

static int load_peer_tokens(const char *path, int num_peers, AuthTokens *a) {
    uint8_t *data;
    size_t len;
    SPES_TRY(file_read_all(path, &data, &len));
    int rc = SPES_OK, line_no = 0;
    char *save = NULL;
    for (char *line = strtok_r((char *)data, "\n", &save); line && rc == SPES_OK; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        size_t n = strlen(line);
        line = trim(line, &n);
        if (n == 0 || line[0] == '#') continue;
        int peer, used = 0;
        char token[1024];
        if (sscanf(line, "%d %1023s%n", &peer, token, &used) != 2 || line[used] != '\0' || peer < 0) {
            rc = spes_fail("%s line %d: expected \"peer_id token\"", path, line_no);
            break;
        }
        if (num_peers > 0 && peer >= num_peers)
            rc = spes_fail("%s line %d: peer %d is outside [0, %d) (--total_peers %d)", path, line_no, peer, num_peers,
                           num_peers);
        // A token shared by two peers would let either act as both: it binds nobody.
        for (int i = 0; rc == SPES_OK && i < a->count; i++) {
            if (a->peer[i] == peer) rc = spes_fail("%s line %d: peer %d has a token already", path, line_no, peer);
            else if (!strcmp(a->token[i], token))
                rc = spes_fail("%s line %d: peer %d's token is also peer %d's; every peer needs its own", path, line_no,
                               peer, a->peer[i]);
        }
        if (rc != SPES_OK) break;
        int *peers = spes_realloc(a->peer, (size_t)(a->count + 1) * sizeof *peers);
        if (peers) a->peer = peers;
        char **tokens = spes_realloc(a->token, (size_t)(a->count + 1) * sizeof *tokens);
        if (tokens) a->token = tokens;
        char *copy = peers && tokens ? spes_strdup(token) : NULL;
        if (!copy) {
            rc = SPES_ERR;
            break;
        }
        a->peer[a->count] = peer;
        a->token[a->count++] = copy;
    }
    if (rc == SPES_OK && a->count == 0) rc = spes_fail("%s holds no \"peer_id token\" line", path);
    free(data);
    return rc;
}

int auth_load(const char *token_file, const char *peer_tokens_file, int num_peers, AuthTokens *out) {
    memset(out, 0, sizeof *out);
    int rc = token_file ? auth_read_token_file(token_file, &out->shared) : SPES_OK;
    if (rc == SPES_OK && peer_tokens_file) rc = load_peer_tokens(peer_tokens_file, num_peers, out);
    if (rc != SPES_OK) auth_free(out);
    return rc;
}

void auth_free(AuthTokens *a) {
    free(a->shared);
    for (int i = 0; i < a->count; i++) free(a->token[i]);
    free(a->token);
    free(a->peer);
    memset(a, 0, sizeof *a);
}

bool auth_enabled(const AuthTokens *a) { return a->shared || a->count > 0; }

bool auth_equal(const char *a, size_t a_len, const char *b, size_t b_len) {
    size_t n = a_len > b_len ? a_len : b_len;
    unsigned diff = a_len != b_len;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < a_len ? (unsigned char)a[i] : 0, y = i < b_len ? (unsigned char)b[i] : 0;
        diff |= (unsigned)(x ^ y);
    }
    return diff == 0;
}

grpc_status_code auth_check(const AuthTokens *a, const grpc_metadata_array *md, int *bound_peer) {
    *bound_peer = -1;
    static const char prefix[] = "Bearer ";
    const char *value = NULL;
    size_t len = 0;
    for (size_t i = 0; i < md->count; i++)
        if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") == 0) {
            // Two headers: which one a proxy or the server would honour is ambiguous; refuse.
            if (value)
                return status_fail(GRPC_STATUS_UNAUTHENTICATED,
                                   "more than one 'authorization' metadata entry; send exactly one");
            value = (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
            len = GRPC_SLICE_LENGTH(md->metadata[i].value);
        }
    if (!value || len < sizeof prefix - 1 || memcmp(value, prefix, sizeof prefix - 1) != 0)
        return status_fail(GRPC_STATUS_UNAUTHENTICATED,
                           "this server needs a token: metadata 'authorization: Bearer <token>' (peers: "
                           "spes_config.auth_token_file)");
    value += sizeof prefix - 1;
    len -= sizeof prefix - 1;
    // Every token is compared, whatever matches, so the time does not tell which one did.
    bool ok = a->shared && auth_equal(value, len, a->shared, strlen(a->shared));
    for (int i = 0; i < a->count; i++)
        if (auth_equal(value, len, a->token[i], strlen(a->token[i]))) {
            ok = true;
            *bound_peer = a->peer[i];
        }
    if (!ok) return status_fail(GRPC_STATUS_UNAUTHENTICATED, "wrong token");
    return GRPC_STATUS_OK;
}
