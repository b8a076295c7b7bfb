// Security of the parameter server against a real in-process server and the real client:
// without the right token every RPC is UNAUTHENTICATED and nothing is stored; a per-peer token
// only acts as its own peer (PERMISSION_DENIED otherwise); token files are validated; the
// comparison is constant-time equality; TLS with a CA and certificates made by openssl here
// (server certificate checked by the client, client certificate required by the server).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "base/file.h"
#include "sync/auth.h"
#include "sync/client.h"
#include "server/server.h"
#include "sync_test_client.h"

static char dir[] = "/tmp/spes_security_XXXXXX";

static char *in_dir(const char *name) { return path_join(dir, name); }

static void write_text(const char *name, const char *text) {
    char *path = in_dir(name);
    assert_int_equal(file_write_atomic(path, text, strlen(text)), SPES_OK);
    free(path);
}

static SyncServer *start_server(const char *token, const char *peer_tokens, bool tls, bool client_certs) {
    SyncServerConfig cfg;
    sync_server_config_defaults(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.rounds.agg = (AggregateConfig){.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4};
    char *t = token ? in_dir(token) : NULL, *pt = peer_tokens ? in_dir(peer_tokens) : NULL;
    char *cert = in_dir("server.pem"), *key = in_dir("server.key"), *ca = in_dir("ca.pem");
    cfg.auth_token_file = t;
    cfg.peer_tokens_file = pt;
    if (tls) {
        cfg.tls_cert = cert;
        cfg.tls_key = key;
        if (client_certs) cfg.tls_ca = ca;
    }
    SyncServer *srv;
    assert_int_equal(sync_server_start(&cfg, &srv), SPES_OK);
    free(t);
    free(pt);
    free(cert);
    free(key);
    free(ca);
    return srv;
}

static SyncClient *client(SyncServer *srv, int peer, const char *token, const char *host, bool tls, bool cert) {
    char addr[64];
    snprintf(addr, sizeof addr, "%s:%d", host, sync_server_port(srv));
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = addr;
    cfg.peer_id = peer;
    cfg.num_peers = 2;
    cfg.experts_per_node = 2;
    cfg.connect_timeout_s = 0.5;
    cfg.wait_timeout_s = 3;   // a wait the server takes for a round that never comes fails, not hangs
    cfg.auth_token = token;
    char *ca = in_dir("ca.pem"), *c = in_dir("client.pem"), *k = in_dir("client.key");
    if (tls) cfg.tls_ca = ca;
    if (tls && cert) {
        cfg.tls_cert = c;
        cfg.tls_key = k;
    }
    SyncClient *out;
    assert_int_equal(sync_client_create(&cfg, &out), SPES_OK);
    free(ca);
    free(c);
    free(k);
    return out;
}

static int upload(SyncClient *c, int as_peer, int step) {
    return sync_test_client_upload(c, 4, 2, as_peer, step, NULL);
}

static int hello(SyncClient *c) {
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    int rc = sync_client_hello(c, &spec);
    model_spec_free(&spec);
    return rc;
}

static void test_constant_time_equal(void **state) {
    (void)state;
    assert_true(auth_equal("abc", 3, "abc", 3));
    assert_false(auth_equal("abc", 3, "abd", 3));
    assert_false(auth_equal("abc", 3, "abcd", 4));
    assert_false(auth_equal("", 0, "a", 1));
    assert_true(auth_equal("", 0, "", 0));
}

static void test_token_files_validated(void **state) {
    (void)state;
    AuthTokens a;
    char *empty = in_dir("empty"), *bad = in_dir("bad_peers"), *dup = in_dir("dup_peers"), *ok = in_dir("peers");
    write_text("empty", " \n");
    write_text("bad_peers", "0 tokA\nnot-a-line\n");
    write_text("dup_peers", "0 tokA\n0 tokB\n");
    assert_int_equal(auth_load(empty, NULL, 2, &a), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "empty"));
    assert_int_equal(auth_load(NULL, bad, 2, &a), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "line 2"));
    assert_int_equal(auth_load(NULL, dup, 2, &a), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "peer 0"));
    // The same token for two peers binds neither; a token for a peer the run does not have.
    char *shared = in_dir("shared_peers"), *outside = in_dir("outside_peers");
    write_text("shared_peers", "0 tokA\n1 tokA\n");
    write_text("outside_peers", "0 tokA\n# spare\n2 tokC\n");
    assert_int_equal(auth_load(NULL, shared, 2, &a), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "shared_peers line 2: peer 1's token is also peer 0's"));
    assert_int_equal(auth_load(NULL, outside, 2, &a), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "outside_peers line 3: peer 2 is outside [0, 2)"));
    free(shared);
    free(outside);
    assert_int_equal(auth_load(NULL, ok, 2, &a), SPES_OK);
    assert_int_equal(a.count, 2);
    auth_free(&a);
    free(empty);
    free(bad);
    free(dup);
    free(ok);
}

// Two authorization entries (a proxy adding one, a client another): refused whichever is right.
static void test_duplicate_authorization_refused(void **state) {
    (void)state;
    AuthTokens a = {0};
    a.shared = strdup("s3cret");
    grpc_metadata entries[2];
    entries[0].key = grpc_slice_from_static_string("authorization");
    entries[0].value = grpc_slice_from_static_string("Bearer wrong");
    entries[1].key = grpc_slice_from_static_string("authorization");
    entries[1].value = grpc_slice_from_static_string("Bearer s3cret");
    grpc_metadata_array md = {.count = 2, .capacity = 2, .metadata = entries};
    int bound;
    assert_int_equal(auth_check(&a, &md, &bound), GRPC_STATUS_UNAUTHENTICATED);
    assert_non_null(strstr(spes_last_error(), "more than one 'authorization'"));
    md.count = 1;
    md.metadata = &entries[1];
    assert_int_equal(auth_check(&a, &md, &bound), GRPC_STATUS_OK);
    auth_free(&a);
}

// Without the right token: every RPC UNAUTHENTICATED, nothing stored.
static void test_tokens_required(void **state) {
    (void)state;
    SyncServer *srv = start_server("token", "peers", false, false);
    const char *wrong[] = {NULL, "guess", "s3cre", "s3cret2"};
    for (int i = 0; i < 4; i++) {
        SyncClient *c = client(srv, 0, wrong[i], "127.0.0.1", false, false);
        assert_int_equal(hello(c), SPES_ERR);
        assert_int_equal(sync_client_last_status(c), GRPC_STATUS_UNAUTHENTICATED);
        assert_int_equal(upload(c, 0, 2), SPES_ERR);
        assert_int_equal(sync_client_last_status(c), GRPC_STATUS_UNAUTHENTICATED);
        RoundsStatus st;
        assert_int_equal(sync_client_status(c, &st), SPES_ERR);
        assert_int_equal(sync_client_last_status(c), GRPC_STATUS_UNAUTHENTICATED);
        uint8_t *bytes;
        size_t len;
        assert_int_equal(sync_client_wait_and_download(c, 2, &bytes, &len), SPES_ERR);
        assert_int_equal(sync_client_last_status(c), GRPC_STATUS_UNAUTHENTICATED);
        sync_client_destroy(c);
    }
    RoundsStatus st;
    rounds_status(sync_server_rounds(srv), &st);
    assert_int_equal(st.fingerprint, 0);   // no Hello got through
    assert_int_equal(st.bytes_received, 0);
    assert_int_equal(st.open_step, -1);

    // A per-peer token acts only as its peer; the shared token as any.
    SyncClient *p0 = client(srv, 0, "tokA", "127.0.0.1", false, false);
    SyncClient *p1 = client(srv, 1, "tokA", "127.0.0.1", false, false);
    assert_int_equal(hello(p1), SPES_ERR);
    assert_int_equal(sync_client_last_status(p1), GRPC_STATUS_PERMISSION_DENIED);
    assert_int_equal(upload(p1, 1, 2), SPES_ERR);
    assert_int_equal(sync_client_last_status(p1), GRPC_STATUS_PERMISSION_DENIED);
    assert_non_null(strstr(spes_last_error(), "belongs to peer 0"));
    assert_int_equal(hello(p0), SPES_OK);
    // Size limit per upload: more than the peer's tensors in F32 (+ header room) is refused.
    size_t big = (size_t)1 << 22;
    uint8_t *zeros = calloc(big, 1);
    assert_int_equal(sync_client_upload_bytes(p0, 2, zeros, big), SPES_ERR);
    assert_int_equal(sync_client_last_status(p0), GRPC_STATUS_RESOURCE_EXHAUSTED);
    free(zeros);
    // A Hello with another model (fingerprint) is refused.
    ModelSpec other;
    assert_int_equal(sync_test_spec(&other, 4, 8), SPES_OK);
    assert_int_equal(sync_client_hello(p0, &other), SPES_ERR);
    assert_int_equal(sync_client_last_status(p0), GRPC_STATUS_FAILED_PRECONDITION);
    model_spec_free(&other);
    assert_int_equal(upload(p0, 0, 2), SPES_OK);
    SyncClient *shared = client(srv, 1, "s3cret", "127.0.0.1", false, false);
    assert_int_equal(upload(shared, 1, 2), SPES_OK);   // completes the round
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_client_wait_and_download(p0, 2, &bytes, &len), SPES_OK);
    free(bytes);
    rounds_status(sync_server_rounds(srv), &st);
    assert_int_equal(st.rounds_completed, 1);
    sync_client_destroy(p0);
    sync_client_destroy(p1);
    sync_client_destroy(shared);
    sync_server_stop(srv);
}

// A per-peer token waits for and downloads aggregates only as its own peer, as it says Hello and
// uploads only as it. Its wait as another peer used to be served, and claimed that peer's id for
// its process: after a server restart (no Hello held), the honest peer's next call was then
// refused FAILED_PRECONDITION as a "second process" of itself.
static void test_per_peer_token_waits_only_as_its_peer(void **state) {
    (void)state;
    SyncServer *srv = start_server(NULL, "peers", false, false);
    SyncClient *imposter = client(srv, 0, "tokB", "127.0.0.1", false, false);   // peer 1's token
    uint8_t *bytes = NULL;
    size_t len;
    assert_int_equal(sync_client_wait_and_download(imposter, 2, &bytes, &len), SPES_ERR);
    assert_int_equal(sync_client_last_status(imposter), GRPC_STATUS_PERMISSION_DENIED);
    assert_non_null(strstr(spes_last_error(), "wait as peer 0 refused: the caller's token belongs to peer 1"));
    // Peer 0 itself, going on without a Hello (the server restarted under it), is taken.
    SyncClient *p0 = client(srv, 0, "tokA", "127.0.0.1", false, false);
    assert_int_equal(upload(p0, 0, 2), SPES_OK);
    SyncClient *p1 = client(srv, 1, "tokB", "127.0.0.1", false, false);
    assert_int_equal(upload(p1, 1, 2), SPES_OK);
    assert_int_equal(sync_client_wait_and_download(p0, 2, &bytes, &len), SPES_OK);
    free(bytes);
    // The round's aggregate is there now: a download of it as the other peer is refused too.
    assert_int_equal(sync_client_wait_and_download(imposter, 2, &bytes, &len), SPES_ERR);
    assert_int_equal(sync_client_last_status(imposter), GRPC_STATUS_PERMISSION_DENIED);
    sync_client_destroy(imposter);
    sync_client_destroy(p0);
    sync_client_destroy(p1);
    sync_server_stop(srv);
}

// TLS: a client trusting the CA talks to the server (by the name in its certificate); one
// without TLS does not; with --tls_ca the server also requires a client certificate.
static void test_tls(void **state) {
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=spes-test-ca "
             "&& for n in server client; do openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr -subj /CN=$n "
             "&& printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > $n.ext "
             "&& openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem -days 2 "
             "-extfile $n.ext || exit 1; done >/dev/null 2>&1",
             dir);
    if (system("command -v openssl >/dev/null 2>&1") != 0) skip();
    assert_int_equal(system(cmd), 0);

    SyncServer *srv = start_server(NULL, NULL, true, false);
    SyncClient *ok = client(srv, 0, NULL, "localhost", true, false);
    RoundsStatus st;
    assert_int_equal(sync_client_status(ok, &st), SPES_OK);
    SyncClient *plain = client(srv, 0, NULL, "localhost", false, false);
    assert_int_equal(sync_client_status(plain, &st), SPES_ERR);
    sync_client_destroy(ok);
    sync_client_destroy(plain);
    sync_server_stop(srv);

    srv = start_server(NULL, NULL, true, true);
    SyncClient *no_cert = client(srv, 0, NULL, "localhost", true, false);
    assert_int_equal(sync_client_status(no_cert, &st), SPES_ERR);
    SyncClient *with_cert = client(srv, 0, NULL, "localhost", true, true);
    assert_int_equal(sync_client_status(with_cert, &st), SPES_OK);
    sync_client_destroy(no_cert);
    sync_client_destroy(with_cert);
    sync_server_stop(srv);
}

static int setup(void **state) {
    (void)state;
    if (!mkdtemp(dir)) return -1;
    write_text("token", "s3cret\n");
    write_text("peers", "# peer token\n0 tokA\n1 tokB\n");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return remove_tree(dir) == SPES_OK ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant_time_equal),
        cmocka_unit_test(test_token_files_validated),
        cmocka_unit_test(test_duplicate_authorization_refused),
        cmocka_unit_test(test_tokens_required),
        cmocka_unit_test(test_per_peer_token_waits_only_as_its_peer),
        cmocka_unit_test(test_tls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
