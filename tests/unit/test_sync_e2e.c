// End to end over real gRPC on loopback: a server (in this process) and 4 peer processes
// (forked before gRPC starts here) exchange crafted tensors for 3 rounds (steps 10, 20, 30;
// step 20 merges). Peer 1 first sends a NaN upload, garbage bytes, an oversized upload and an
// upload holding another peer's expert: each is refused while the round still completes.
// Checks here: downloads byte-identical across peers, shared tensors = mean of the uploads,
// experts = their owners' uploads (non-merge steps); a Hello with another model or other run
// settings is refused with a message naming the difference; Status counts.
// With SYNC_E2E_DIR set, uploads and downloads stay there for tests/ref/check_sync_e2e.py,
// which checks them independently (merge step included).
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <grpc/status.h>

#include "base/error.h"
#include "base/file.h"
#include "sync/client.h"
#include "server/server.h"

#define PEERS 4
#define EXPERTS 8
#define M (EXPERTS / PEERS)
static const int steps[3] = {10, 20, 30};

// A small OLMoE-shaped model: embed, per layer norm + router + experts, final norm, lm_head.
static void build_spec(ModelSpec *spec, int64_t lm_head_rows) {
    model_spec_init(spec);
    int64_t embed[2] = {16, 8}, norm[1] = {8}, router[2] = {EXPERTS, 8}, gate[2] = {6, 8}, down[2] = {8, 6};
    int64_t head[2] = {lm_head_rows, 8};
    char name[128];
    assert_int_equal(model_spec_add(spec, "model.embed_tokens.weight", DTYPE_F32, 2, embed), SPES_OK);
    for (int l = 0; l < 2; l++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        assert_int_equal(model_spec_add(spec, name, DTYPE_F32, 1, norm), SPES_OK);
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        assert_int_equal(model_spec_add(spec, name, DTYPE_F32, 2, router), SPES_OK);
        static const char *proj[3] = {"gate", "up", "down"};
        for (int e = 0; e < EXPERTS; e++)
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, proj[p]);
                assert_int_equal(model_spec_add(spec, name, DTYPE_F32, 2, p == 2 ? down : gate), SPES_OK);
            }
    }
    assert_int_equal(model_spec_add(spec, "model.norm.weight", DTYPE_F32, 1, norm), SPES_OK);
    assert_int_equal(model_spec_add(spec, "lm_head.weight", DTYPE_F32, 2, head), SPES_OK);
    assert_int_equal(model_spec_finish(spec), SPES_OK);
}

static float crafted(int peer, int step, int t, size_t i) {
    uint64_t x = (uint64_t)(peer + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(step + 7) * 0xbf58476d1ce4e5b9ull ^
                 ((uint64_t)t << 20 | i) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    x *= 0xd6e8feb96a9e3b5dull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

// Peer's upload for step: shared tensors + own experts (or, with other_expert, one of peer+1's too).
static int serialize_upload(const ModelSpec *spec, int peer, int step, bool nan, bool other_expert, uint8_t **bytes,
                            size_t *len) {
    StWriteTensor *w = calloc((size_t)spec->count, sizeof *w);
    float **data = calloc((size_t)spec->count, sizeof *data);
    int n = 0;
    for (int t = 0; t < spec->count; t++) {
        const SpecTensor *st = &spec->tensors[t];
        bool mine = model_spec_peer_sends(spec, SYNC_MODE_SPES, M, peer, t);
        bool extra = other_expert && st->expert == ((peer + 1) % PEERS) * M && st->proj == 0;
        if (!mine && !extra) continue;
        data[n] = malloc(st->numel * sizeof(float));
        for (size_t i = 0; i < st->numel; i++) data[n][i] = crafted(peer, step, t, i);
        if (nan && n == 3) data[n][1] = NAN;
        w[n] = (StWriteTensor){.name = st->name, .dtype = DTYPE_F32, .ndim = st->ndim, .data = data[n]};
        memcpy(w[n].shape, st->shape, sizeof w[n].shape);
        n++;
    }
    int rc = safetensors_serialize(w, n, NULL, NULL, 0, bytes, len);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(w);
    return rc;
}

static void save(const char *dir, const char *kind, int step, int peer, const uint8_t *bytes, size_t len) {
    char name[64];
    snprintf(name, sizeof name, "%s_s%d_p%d.safetensors", kind, step, peer);
    char *path = path_join(dir, name);
    if (!path || file_write_atomic(path, bytes, len) != SPES_OK) {
        fprintf(stderr, "cannot save %s: %s\n", name, spes_last_error());
        _exit(3);
    }
    free(path);
}

#define PEER_CHECK(cond, ...)                     \
    do {                                          \
        if (!(cond)) {                            \
            fprintf(stderr, "peer %d: ", peer);   \
            fprintf(stderr, __VA_ARGS__);         \
            fprintf(stderr, "\n");                \
            _exit(2);                             \
        }                                         \
    } while (0)

// Peer 1's bad uploads for step 10: each must be refused with the right status.
static void send_bad_uploads(SyncClient *c, const ModelSpec *spec, int peer) {
    uint8_t *bytes;
    size_t len;
    PEER_CHECK(serialize_upload(spec, peer, 10, true, false, &bytes, &len) == SPES_OK, "serialize");
    PEER_CHECK(sync_client_upload_bytes(c, 10, bytes, len) == SPES_ERR &&
                   sync_client_last_status(c) == GRPC_STATUS_INVALID_ARGUMENT &&
                   strstr(spes_last_error(), "non-finite"),
               "NaN upload not refused as INVALID_ARGUMENT: %s", spes_last_error());
    free(bytes);
    uint8_t garbage[5000];
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (uint8_t)(i * 37 + 11);
    PEER_CHECK(sync_client_upload_bytes(c, 10, garbage, sizeof garbage) == SPES_ERR &&
                   sync_client_last_status(c) == GRPC_STATUS_INVALID_ARGUMENT,
               "garbage upload not refused: %s", spes_last_error());
    size_t huge = 4u << 20;   // far beyond this peer's F32 tensors + header room
    uint8_t *big = calloc(huge, 1);
    PEER_CHECK(sync_client_upload_bytes(c, 10, big, huge) == SPES_ERR &&
                   sync_client_last_status(c) == GRPC_STATUS_RESOURCE_EXHAUSTED,
               "oversized upload not refused as RESOURCE_EXHAUSTED: %s", spes_last_error());
    free(big);
    PEER_CHECK(serialize_upload(spec, peer, 10, false, true, &bytes, &len) == SPES_OK, "serialize");
    PEER_CHECK(sync_client_upload_bytes(c, 10, bytes, len) == SPES_ERR && strstr(spes_last_error(), "owned by peer"),
               "upload with another peer's expert not refused: %s", spes_last_error());
    free(bytes);
}

static void run_peer(int peer, int port_fd, const char *dir) {
    alarm(90);   // never hang the test suite
    int port;
    PEER_CHECK(read(port_fd, &port, sizeof port) == (ssize_t)sizeof port, "no port from the parent");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = addr;
    cfg.peer_id = peer;
    cfg.num_peers = PEERS;
    cfg.experts_per_node = M;
    cfg.chunk_size = 777;   // many chunks per upload
    cfg.wait_timeout_s = 60;
    ModelSpec spec;
    build_spec(&spec, 16);
    SyncClient *c;
    PEER_CHECK(sync_client_create(&cfg, &c) == SPES_OK, "create: %s", spes_last_error());
    PEER_CHECK(sync_client_hello(c, &spec) == SPES_OK, "hello: %s", spes_last_error());
    for (int r = 0; r < 3; r++) {
        int step = steps[r];
        if (peer == 1 && step == 10) send_bad_uploads(c, &spec, peer);
        uint8_t *bytes, *agg;
        size_t len, agg_len;
        PEER_CHECK(serialize_upload(&spec, peer, step, false, false, &bytes, &len) == SPES_OK, "serialize");
        save(dir, "up", step, peer, bytes, len);
        PEER_CHECK(sync_client_upload_bytes(c, step, bytes, len) == SPES_OK, "upload step %d: %s", step,
                   spes_last_error());
        free(bytes);
        PEER_CHECK(sync_client_wait_and_download(c, step, &agg, &agg_len) == SPES_OK, "download step %d: %s", step,
                   spes_last_error());
        save(dir, "down", step, peer, agg, agg_len);
        free(agg);
        const SyncStats *st = sync_client_stats(c);
        PEER_CHECK(st->bytes_up == len && st->bytes_down == agg_len && st->rounds == r + 1, "stats do not add up");
    }
    sync_client_destroy(c);
    model_spec_free(&spec);
    _exit(0);
}

static float value_at(const StTensor *t, size_t i) {
    float v;
    memcpy(&v, t->data + 4 * i, 4);
    return v;
}

// Independent check of one round from the saved files (mean and owner rules, no merge).
static void check_round(const char *dir, const ModelSpec *spec, int step, bool check_experts) {
    uint8_t *down[PEERS], *up[PEERS];
    size_t down_len[PEERS], up_len[PEERS];
    SafeTensors ups[PEERS], agg;
    for (int p = 0; p < PEERS; p++) {
        char name[64];
        snprintf(name, sizeof name, "down_s%d_p%d.safetensors", step, p);
        char *path = path_join(dir, name);
        assert_int_equal(file_read_all(path, &down[p], &down_len[p]), SPES_OK);
        free(path);
        snprintf(name, sizeof name, "up_s%d_p%d.safetensors", step, p);
        path = path_join(dir, name);
        assert_int_equal(file_read_all(path, &up[p], &up_len[p]), SPES_OK);
        free(path);
        assert_int_equal(safetensors_parse(up[p], up_len[p], "upload", &ups[p]), SPES_OK);
        assert_int_equal(down_len[p], down_len[0]);
        assert_memory_equal(down[p], down[0], down_len[0]);   // every peer holds the same bytes
    }
    assert_int_equal(safetensors_parse(down[0], down_len[0], "aggregate", &agg), SPES_OK);
    assert_int_equal(agg.count, spec->count);
    for (int t = 0; t < spec->count; t++) {
        const SpecTensor *st = &spec->tensors[t];
        const StTensor *a = safetensors_find(&agg, st->name);
        assert_non_null(a);
        assert_int_equal(a->numel, st->numel);
        for (size_t i = 0; i < st->numel; i++) {
            if (st->expert < 0) {
                float sum = 0;
                for (int p = 0; p < PEERS; p++) sum += value_at(safetensors_find(&ups[p], st->name), i);
                assert_true(value_at(a, i) == sum / PEERS);
            } else if (check_experts) {
                assert_true(value_at(a, i) == value_at(safetensors_find(&ups[st->expert / M], st->name), i));
            }
        }
    }
    safetensors_close(&agg);
    for (int p = 0; p < PEERS; p++) {
        safetensors_close(&ups[p]);
        free(up[p]);
        free(down[p]);
    }
}

// A Hello that must be refused, with a message containing `expect`.
static void expect_hello_refused(int port, const ModelSpec *spec, int num_peers, SyncMode mode, const char *expect) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = addr;
    cfg.peer_id = 0;
    cfg.num_peers = num_peers;
    cfg.experts_per_node = M;
    cfg.mode = mode;
    SyncClient *c;
    assert_int_equal(sync_client_create(&cfg, &c), SPES_OK);
    assert_int_equal(sync_client_hello(c, spec), SPES_ERR);
    assert_int_equal(sync_client_last_status(c), GRPC_STATUS_FAILED_PRECONDITION);
    if (!strstr(spes_last_error(), expect)) fail_msg("refusal '%s' does not mention '%s'", spes_last_error(), expect);
    sync_client_destroy(c);
}

static void test_four_peers_three_rounds(void **state) {
    (void)state;
    const char *keep = getenv("SYNC_E2E_DIR");
    char tmp[] = "/tmp/spes_sync_e2e_XXXXXX";
    const char *dir = keep ? keep : mkdtemp(tmp);
    assert_non_null(dir);
    assert_int_equal(mkdir_p(dir), SPES_OK);
    fflush(NULL);
    int pipes[PEERS][2];
    pid_t pids[PEERS];
    for (int p = 0; p < PEERS; p++) {
        assert_int_equal(pipe(pipes[p]), 0);
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) run_peer(p, pipes[p][0], dir);
    }
    SyncServerConfig cfg;
    sync_server_config_defaults(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.chunk_size = 1000;
    cfg.rounds.agg = (AggregateConfig){.mode = SYNC_MODE_SPES,
                                       .num_peers = PEERS,
                                       .experts_per_node = M,
                                       .merge_interval = 20,
                                       .merge_alpha_start = 0.5f,
                                       .merge_decay_steps = 100,
                                       .merge_topk = 3};
    SyncServer *srv;
    assert_int_equal(sync_server_start(&cfg, &srv), SPES_OK);
    int port = sync_server_port(srv);
    for (int p = 0; p < PEERS; p++) assert_int_equal(write(pipes[p][1], &port, sizeof port), (ssize_t)sizeof port);
    int failures = 0;
    for (int p = 0; p < PEERS; p++) {
        int status;
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "peer %d failed (status %d)\n", p, status);
            failures++;
        }
    }
    assert_int_equal(failures, 0);

    // After the peers: handshake refusals and the server's Status.
    ModelSpec spec, other;
    build_spec(&spec, 16);
    build_spec(&other, 24);
    expect_hello_refused(port, &other, PEERS, SYNC_MODE_SPES, "lm_head.weight");
    expect_hello_refused(port, &spec, PEERS + 1, SYNC_MODE_SPES, "--total_peers 4");
    expect_hello_refused(port, &spec, PEERS, SYNC_MODE_FEDAVG, "fedavg mode");
    RoundsStatus st;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    SyncClientConfig ccfg;
    sync_client_config_defaults(&ccfg);
    ccfg.server_addr = addr;
    SyncClient *c;
    assert_int_equal(sync_client_create(&ccfg, &c), SPES_OK);
    assert_int_equal(sync_client_status(c, &st), SPES_OK);   // the Status RPC
    sync_client_destroy(c);
    assert_int_equal(st.fingerprint, spec.fingerprint);
    assert_true(st.bytes_sent > 0 && st.bytes_received > 0);
    assert_int_equal(st.rounds_completed, 3);
    assert_int_equal(st.last_aggregate_step, 30);
    assert_int_equal(st.open_step, -1);
    assert_true(st.uploads_rejected >= 3);   // NaN, garbage, other's expert (oversized is cut off in transport)
    sync_server_stop(srv);

    check_round(dir, &spec, 10, true);
    check_round(dir, &spec, 20, false);   // merge step: experts checked by tests/ref/check_sync_e2e.py
    check_round(dir, &spec, 30, true);
    model_spec_free(&spec);
    model_spec_free(&other);
    if (!keep) remove_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_four_peers_three_rounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
