// libFuzzer harness: the parameter server's upload path on arbitrary bytes, as a peer's
// payload: safetensors parsing, validation against the handshake's model spec, and, when an
// upload is accepted, the aggregation of its round. A second server without a handshake
// infers its model spec from the bytes (the seeds' clients' path).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "server/rounds.h"

#include "tiny_spec.h"

// Peer 1's valid upload (shared tensors + experts 2, 3), to complete a round.
static int peer1_upload(const ModelSpec *spec, uint8_t **bytes, size_t *len) {
    static float values[64];
    StWriteTensor w[64];
    int n = 0;
    for (int t = 0; t < spec->count; t++) {
        if (!model_spec_peer_sends(spec, SYNC_MODE_SPES, 2, 1, t)) continue;
        w[n] = (StWriteTensor){.name = spec->tensors[t].name, .dtype = DTYPE_F32, .ndim = 2, .data = values};
        memcpy(w[n].shape, spec->tensors[t].shape, sizeof w[n].shape);
        n++;
    }
    return safetensors_serialize(w, n, NULL, NULL, 0, bytes, len);
}

static Rounds *make_rounds(void) {
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_interval = 2,
                                .merge_alpha_start = 0.5f, .merge_decay_steps = 1000000, .merge_topk = 2},
                        .keep_steps = 1, .max_upload_bytes = 1 << 20, .max_open_rounds = 2};
    Rounds *r = NULL;
    if (rounds_create(&cfg, &r) != 0) abort();
    return r;
}

static uint8_t *copy_of(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (size) memcpy(copy, data, size);
    return copy;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Rounds *with_hello = NULL;
    static ModelSpec spec;
    static int step = 0;
    if (!with_hello) {
        log_set_level(LOG_ERROR);
        with_hello = make_rounds();
        ModelSpec hello;
        int last;
        if (build_spec(&spec) != 0 || build_spec(&hello) != 0 ||
            rounds_hello(with_hello, 0, 2, 2, SYNC_MODE_SPES, DTYPE_F32, &hello, &last) != ROUNDS_OK)
            abort();
        model_spec_free(&hello);
    }
    step++;
    if (rounds_upload(with_hello, 0, step, copy_of(data, size), size) == ROUNDS_OK) {
        uint8_t *bytes;
        size_t len;
        if (peer1_upload(&spec, &bytes, &len) != 0 || rounds_upload(with_hello, 1, step, bytes, len) != ROUNDS_OK)
            abort();   // a valid upload completing an accepted round must aggregate
        AggregateBlob *blob;
        if (rounds_get(with_hello, step, 0, &blob) != ROUNDS_OK || !blob) abort();
        rounds_release(with_hello, blob);
    }
    Rounds *inferring = make_rounds();   // no Hello: the bytes define the model
    rounds_upload(inferring, 1, 1, copy_of(data, size), size);
    rounds_destroy(inferring);
    return 0;
}
