// Shared by the sync unit tests that talk to a server through the peer's client (include after
// cmocka.h): a local server, and one peer's upload of the tiny model (sync_test_model.h).
#pragma once
#include "server/server.h"
#include "sync/client.h"
#include "sync_test_model.h"

// A spes-mode server on 127.0.0.1 at a free port for `peers` peers with m experts each (merge
// top-k 4), the outer optimizer `outer` (NULL: the defaults'); fails the test if it cannot start.
static inline SyncServer *sync_test_server_start(int peers, int m, const OuterOptConfig *outer) {
    SyncServerConfig cfg;
    sync_server_config_defaults(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.rounds.agg = (AggregateConfig){.mode = SYNC_MODE_SPES, .num_peers = peers, .experts_per_node = m, .merge_topk = 4};
    if (outer) cfg.rounds.outer = *outer;
    SyncServer *srv;
    assert_int_equal(sync_server_start(&cfg, &srv), SPES_OK);
    return srv;
}

// Peer `peer`'s upload for `step` through c: the tensors it sends in spes mode, F32, of the
// sync_test_spec model with E experts (6 lm_head rows) and m experts per peer, `tweak` (may be
// NULL) applied; returns sync_client_upload_bytes's result.
static inline int sync_test_client_upload(SyncClient *c, int E, int m, int peer, int step, SyncTestTweak tweak) {
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, E, 6), SPES_OK);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, m, peer, DTYPE_F32, tweak, &bytes, &len), SPES_OK);
    model_spec_free(&spec);
    int rc = sync_client_upload_bytes(c, step, bytes, len);
    free(bytes);
    return rc;
}
