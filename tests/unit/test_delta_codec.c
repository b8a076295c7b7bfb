// The delta codec (delta_codec.h, delta_payload.h, delta_peer.h) and the delta rounds of the
// server, for both code widths (every test runs with DELTA_INT8 and DELTA_INT4 as its state):
// round trips, rounding, the error-feedback bound, hostile payloads refused with the reason, and
// exactness: what the server holds after a delta round is bit for bit what a peer reconstructs
// from its download (with and without its own experts in it). int4's packing (odd lengths, the
// padding nibble, truncated codes) has its own tests at the end.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <zstd.h>

#include "base/rng.h"
#include "sync/delta_codec.h"
#include "sync/delta_payload.h"
#include "sync/delta_peer.h"
#include "server/rounds.h"
#include "sync_test_model.h"

static float wire_scale(const DeltaCodec *c, float s) {
    return c->scale_dtype == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

static void test_round_trip_and_bound(void **state) {
    const DeltaCodec *c = *state;
    Rng rng;
    rng_seed(&rng, 7);
    size_t sizes[] = {0, 1, 255, 256, 257, 1000};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        float *d = malloc((n + 1) * sizeof(float)), *out = malloc((n + 1) * sizeof(float));
        float *zero = calloc(n + 1, sizeof(float)), *scale = malloc((delta_blocks(n) + 1) * sizeof(float));
        int8_t *q = malloc(n + 1);
        for (size_t i = 0; i < n; i++) d[i] = (float)((rng_uniform(&rng) - 0.5) * pow(10.0, (double)(i % 7) - 4));
        for (size_t i = 256; i < n && i < 512; i++) d[i] = 0.0f;   // an all-zero block: scale 0
        delta_encode(c, d, n, q, scale);
        delta_reconstruct(zero, q, scale, n, out);
        for (size_t b = 0; b < delta_blocks(n); b++) {
            float maxabs = 0;
            size_t largest = b * DELTA_BLOCK;
            for (size_t i = b * DELTA_BLOCK; i < n && i < (b + 1) * DELTA_BLOCK; i++)
                if (fabsf(d[i]) > maxabs) maxabs = fabsf(d[i]), largest = i;
            assert_true(scale[b] == wire_scale(c, maxabs / (float)c->qmax));
            if (maxabs > 0) assert_int_equal(abs(q[largest]), c->qmax);   // the largest magnitude: the end code
            else assert_true(scale[b] == 0.0f);                            // a block of zeros
        }
        for (size_t i = 0; i < n; i++) {
            float s = scale[i / DELTA_BLOCK];
            assert_true(q[i] >= -c->qmax && q[i] <= c->qmax);
            assert_true(fabsf(out[i] - d[i]) <= 0.5f * s * 1.0001f);
        }
        size_t where;
        const char *why;
        assert_true(delta_check(c, q, scale, n, &where, &why));
        free(d), free(out), free(zero), free(scale), free(q);
    }
}

static void test_rounding_ties_to_even(void **state) {
    const DeltaCodec *c = *state;
    float qmax = (float)c->qmax, d[6] = {qmax, 0.5f, 1.5f, 2.5f, -0.5f, -(qmax - 0.5f)}, scale;
    int8_t q[6];
    delta_encode(c, d, 6, q, &scale);
    assert_true(scale == 1.0f);
    int8_t want[6] = {(int8_t)c->qmax, 0, 2, 2, 0, (int8_t)(1 - c->qmax)};   // -6.5 -> -6, -126.5 -> -126
    assert_memory_equal(q, want, sizeof want);
}

// A value too small for its block's scale is lost without error feedback but arrives over
// rounds with it: the sum of what was sent never drifts more than half a step from the truth.
static void test_error_feedback_carries_what_rounding_lost(void **state) {
    const DeltaCodec *c = *state;
    enum { N = 300, ROUNDS = 50 };
    float base[N] = {0}, w[N], residual[N] = {0}, scale[2], sent_sum[N] = {0}, step[N];
    int8_t q[N];
    for (int i = 0; i < N; i++) w[i] = i == 0 ? (float)c->qmax : 0.3f;   // block 0: scale 1; 0.3 rounds to 0
    for (int r = 0; r < ROUNDS; r++) {
        delta_encode_feedback(c, w, base, residual, N, q, scale);
        delta_reconstruct((float[N]){0}, q, scale, N, step);
        for (int i = 0; i < N; i++) {
            sent_sum[i] += step[i];
            assert_true(fabsf(residual[i]) <= 0.5f * scale[i / DELTA_BLOCK] * 1.0001f);
            // Everything sent plus what is still owed is exactly everything there was to send.
            assert_true(fabsf(sent_sum[i] + residual[i] - (float)(r + 1) * w[i]) < 1e-3f * (float)(r + 1) * fabsf(w[i]));
        }
    }
    assert_true(fabsf(sent_sum[1] - ROUNDS * 0.3f) <= 0.5f);   // about 15 arrived, not 0
    assert_true(sent_sum[1] > 14.0f);
}

static void test_check_refuses_hostile_codes(void **state) {
    const DeltaCodec *c = *state;
    int8_t q[300] = {0};
    float scale[2] = {1.0f, 1.0f};
    size_t where;
    const char *why;
    float bad[] = {NAN, INFINITY, -1.0f, 1e31f};
    const char *says[] = {"NaN", "infinite", "negative", "too large"};
    for (int i = 0; i < 4; i++) {
        scale[1] = bad[i];
        assert_false(delta_check(c, q, scale, 300, &where, &why));
        assert_int_equal(where, 1);
        assert_non_null(strstr(why, says[i]));
    }
    scale[1] = 0.0f;
    q[299] = (int8_t)(-c->qmax - 1);   // -128 / -8
    assert_false(delta_check(c, q, scale, 300, &where, &why));
    assert_int_equal(where, 299);
    assert_non_null(strstr(why, c->bits == 8 ? "-128" : "-8"));
}

// ---- the server's delta rounds and a peer's side of them ----

#define P 2
#define M 2

// A server of P peers, peer 0 greeted with the test model: in a delta run of codec c, or in an
// F32 run when c is NULL.
static Rounds *make_rounds(const DeltaCodec *c) {
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = P, .experts_per_node = M, .merge_topk = 2},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2};
    Rounds *r;
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    int last;
    if (c)
        assert_int_equal(rounds_hello_delta(r, 0, P, M, SYNC_MODE_SPES, DTYPE_I8, c, &spec, &last), ROUNDS_OK);
    else
        assert_int_equal(rounds_hello(r, 0, P, M, SYNC_MODE_SPES, DTYPE_F32, &spec, &last), ROUNDS_OK);
    model_spec_free(&spec);
    return r;
}

// A peer of the test model: its parameters (spec order, back to back) and delta state.
typedef struct {
    ModelSpec spec;
    float *params;
    DeltaPeer deltas;
    StWriteTensor *w;           // its upload tensors, pointing into params
    int n;
} TestPeer;

static void peer_init(TestPeer *tp, const DeltaCodec *c, int peer) {
    memset(tp, 0, sizeof *tp);
    assert_int_equal(sync_test_spec(&tp->spec, 4, 6), SPES_OK);
    tp->params = calloc(tp->spec.total_numel, sizeof(float));
    DeltaPeerTensor *x = calloc((size_t)tp->spec.count, sizeof *x);
    tp->w = calloc((size_t)tp->spec.count, sizeof *tp->w);
    size_t at = 0;
    for (int t = 0; t < tp->spec.count; t++) {
        const SpecTensor *s = &tp->spec.tensors[t];
        bool sends = model_spec_peer_sends(&tp->spec, SYNC_MODE_SPES, M, peer, t);
        x[t] = (DeltaPeerTensor){.name = s->name, .ndim = s->ndim, .numel = s->numel, .offset = at, .sent = sends,
                                .own = s->expert >= 0 && s->expert / M == peer};
        memcpy(x[t].shape, s->shape, sizeof x[t].shape);
        for (size_t i = 0; i < s->numel; i++) tp->params[at + i] = 0.01f * (float)(t + 1) + 0.001f * (float)i;
        if (sends) {
            tp->w[tp->n] = (StWriteTensor){.name = s->name, .dtype = DTYPE_F32, .ndim = s->ndim, .data = tp->params + at};
            memcpy(tp->w[tp->n++].shape, s->shape, sizeof s->shape);
        }
        at += s->numel;
    }
    assert_int_equal(delta_peer_init(&tp->deltas, c, x, tp->spec.count, tp->spec.total_numel), SPES_OK);
    free(x);
}

static void peer_free(TestPeer *tp) {
    delta_peer_free(&tp->deltas);
    free(tp->params);
    free(tp->w);
    model_spec_free(&tp->spec);
}

// Local training: every trainable value moves by a peer- and round-dependent amount.
static void peer_train(TestPeer *tp, int peer, int round) {
    for (int i = 0; i < tp->n; i++) {
        float *v = (float *)tp->w[i].data;
        size_t n = 1;
        for (int d = 0; d < tp->w[i].ndim; d++) n *= (size_t)tp->w[i].shape[d];
        for (size_t k = 0; k < n; k++) v[k] += 0.003f * (float)((k * 7 + (size_t)peer * 3 + (size_t)round) % 11) - 0.01f;
    }
}

static RoundsResult peer_upload(Rounds *r, TestPeer *tp, int peer, int step) {
    uint8_t *bytes;
    size_t len;
    if (tp->deltas.base_step >= 0) {
        assert_int_equal(delta_peer_encode(&tp->deltas, tp->params, &bytes, &len), SPES_OK);
    } else {
        assert_int_equal(safetensors_serialize(tp->w, tp->n, NULL, NULL, 0, &bytes, &len), SPES_OK);
        delta_peer_sent_full(&tp->deltas, tp->params);
    }
    RoundsResult code = rounds_upload(r, peer, step, bytes, len);
    if (code == ROUNDS_OK) delta_peer_commit(&tp->deltas);
    return code;
}

static void gather(void *ctx, const uint8_t *data, size_t len) {
    uint8_t **at = ctx;
    memcpy(*at, data, len);
    *at += len;
}

// The peer downloads step's aggregate as the server serves it to it and loads it; then its
// parameters must be the server's aggregate bit for bit. Returns the view's name.
static const char *peer_download(Rounds *r, TestPeer *tp, int peer, int step) {
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, step, 0, &blob), ROUNDS_OK);
    assert_non_null(blob);
    RoundsViewRequest q = {.omit_own_experts = true, .has_delta_base = tp->deltas.base_step >= 0,
                           .delta_base_step = tp->deltas.base_step};
    const AggregateView *v;
    const char *name;
    assert_int_equal(rounds_view(r, blob, peer, &q, &v, &name), ROUNDS_OK);
    uint8_t *bytes = malloc(v->len), *at = bytes;
    aggregate_view_range(v, 0, v->len, gather, &at);
    SafeTensors st;
    assert_int_equal(safetensors_parse(bytes, v->len, "download", &st), SPES_OK);
    if (strncmp(name, tp->deltas.codec->encoding, strlen(tp->deltas.codec->encoding)) == 0) {
        bool omitted = strstr(name, SYNC_VIEW_OMIT_OWN) != NULL;
        assert_int_equal(delta_peer_apply_delta(&tp->deltas, &st, omitted, step, tp->params, "download"), SPES_OK);
    } else {
        assert_string_equal(name, "");
        for (int t = 0; t < tp->spec.count; t++)
            assert_int_equal(safetensors_to_f32(safetensors_find(&st, tp->spec.tensors[t].name),
                                                tp->params + (tp->deltas.tensors[t].offset)),
                             SPES_OK);
        delta_peer_set_base(&tp->deltas, tp->params, step);
    }
    // Bit for bit the server's aggregate (F32, spec order, back to back after the header).
    SafeTensors agg;
    assert_int_equal(safetensors_parse(blob->bytes, blob->len, "aggregate", &agg), SPES_OK);
    for (int t = 0; t < tp->spec.count; t++) {
        const StTensor *x = safetensors_find(&agg, tp->spec.tensors[t].name);
        assert_memory_equal(x->data, tp->params + tp->deltas.tensors[t].offset, x->nbytes);
    }
    safetensors_close(&agg);
    safetensors_close(&st);
    free(bytes);
    static char names[4][48];
    snprintf(names[peer], sizeof names[peer], "%s", name);
    rounds_release(r, blob);
    return names[peer];
}

static void test_server_and_peers_reconstruct_the_same_bits(void **state) {
    const DeltaCodec *c = *state;
    Rounds *r = make_rounds(c);
    TestPeer tp[P];
    for (int p = 0; p < P; p++) peer_init(&tp[p], c, p);
    for (int round = 1; round <= 4; round++) {
        int step = 2 * round;
        for (int p = 0; p < P; p++) peer_train(&tp[p], p, round);
        for (int p = 0; p < P; p++) assert_int_equal(peer_upload(r, &tp[p], p, step), ROUNDS_OK);
        for (int p = 0; p < P; p++) {
            const char *view = peer_download(r, &tp[p], p, step);
            // First round: no base anywhere, the whole aggregate; then deltas without own experts.
            assert_string_equal(view, round == 1 ? "" : c->view_omit_own);
        }
        assert_memory_equal(tp[0].params, tp[1].params, tp[0].spec.total_numel * sizeof(float));
    }
    for (int p = 0; p < P; p++) peer_free(&tp[p]);
    rounds_destroy(r);
}

// Hostile delta uploads: refused with the reason, the round left as it was.
typedef void (*Damage)(DeltaTensor *w, int n, int8_t *q, float *scales, int *base_step);
static void nan_scale(DeltaTensor *w, int n, int8_t *q, float *s, int *b) { s[0] = NAN; }
static void minus_128(DeltaTensor *w, int n, int8_t *q, float *s, int *b) { q[3] = -128; }
static void minus_8(DeltaTensor *w, int n, int8_t *q, float *s, int *b) { q[3] = -8; }   // int4's -128
static void huge_scale(DeltaTensor *w, int n, int8_t *q, float *s, int *b) { s[1] = 3e38f; }
// Finite and under DELTA_MAX_SCALE, but no healthy peer's change: a damaged error feedback of
// 1e30 sent scales like this one (issue 29).
static void poisoning_scale(DeltaTensor *w, int n, int8_t *q, float *s, int *b) { s[0] = 8e27f; }
static void unknown_base(DeltaTensor *w, int n, int8_t *q, float *s, int *b) { *b = 99; }
static void extra_scale(DeltaTensor *w, int n, int8_t *q, float *s, int *b) { w[0].numel = 300; }   // 2 scales

// Serialises peer 0's upload (codec c) of ones against base step 2, damaged.
static RoundsResult hostile_upload(Rounds *r, const DeltaCodec *c, Damage damage) {
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    DeltaTensor w[64];
    int8_t q[4096];
    float scales[512];
    int n = 0, base = 2;
    size_t at = 0, blocks = 0;
    for (int t = 0; t < spec.count; t++) {
        if (!model_spec_peer_sends(&spec, SYNC_MODE_SPES, M, 0, t)) continue;
        const SpecTensor *s = &spec.tensors[t];
        for (size_t i = 0; i < s->numel; i++) q[at + i] = 1;
        scales[blocks] = 0.5f;
        w[n] = (DeltaTensor){.name = s->name, .ndim = s->ndim, .numel = s->numel, .q = q + at, .scale = scales + blocks};
        memcpy(w[n++].shape, s->shape, sizeof s->shape);
        at += s->numel;
        blocks += delta_blocks(s->numel);
    }
    damage(w, n, q, scales, &base);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(delta_payload_serialize(c, w, n, base, &bytes, &len), SPES_OK);
    model_spec_free(&spec);
    return rounds_upload(r, 0, 4, bytes, len);
}

static void test_hostile_delta_uploads_refused(void **state) {
    const DeltaCodec *c = *state;
    Rounds *r = make_rounds(c);
    TestPeer tp[P];
    for (int p = 0; p < P; p++) peer_init(&tp[p], c, p);
    for (int p = 0; p < P; p++) assert_int_equal(peer_upload(r, &tp[p], p, 2), ROUNDS_OK);
    struct {
        Damage damage;
        RoundsResult code;
        const char *says;
    } cases[] = {
        {nan_scale, ROUNDS_BAD_REQUEST, "scale is NaN at block 0"},
        {c->bits == 8 ? minus_128 : minus_8, ROUNDS_BAD_REQUEST, c->bits == 8 ? "value -128" : "value -8"},
        {huge_scale, ROUNDS_BAD_REQUEST, "too large"},
        {poisoning_scale, ROUNDS_BAD_REQUEST, "not within +-65504"},
        {unknown_base, ROUNDS_NO_BASE, "aggregate of step 99, is not kept"},
        {extra_scale, ROUNDS_BAD_REQUEST, "one scale per 256 values"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(hostile_upload(r, c, cases[i].damage), cases[i].code);
        if (!strstr(spes_last_error(), cases[i].says)) fail_msg("case %zu: %s", i, spes_last_error());
    }
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.open_step, -1);   // nothing taken for step 4
    for (int p = 0; p < P; p++) peer_free(&tp[p]);
    rounds_destroy(r);
}

static void test_delta_upload_refused_in_a_float_run(void **state) {
    const DeltaCodec *c = *state;
    Rounds *r = make_rounds(NULL);
    ModelSpec spec;
    int last;
    char want[96];
    assert_int_equal(hostile_upload(r, c, unknown_base), ROUNDS_BAD_REQUEST);
    snprintf(want, sizeof want, "an %s delta, but this run's payload dtype is F32", c->name);
    assert_non_null(strstr(spes_last_error(), want));
    // And a peer of a delta run is refused by a float run at the handshake.
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    assert_int_equal(rounds_hello_delta(r, 1, P, M, SYNC_MODE_SPES, DTYPE_I8, c, &spec, &last), ROUNDS_MISMATCH);
    snprintf(want, sizeof want, "payload dtype %s, but the other peers use F32", c->wire);
    assert_non_null(strstr(spes_last_error(), want));
    model_spec_free(&spec);
    rounds_destroy(r);
}

// ---- int4 only: the packing, and the two codecs never taken for each other ----

// Encodes d[n] as one int4 tensor "t" (shape [n]) and returns the payload parsed.
static void int4_payload(const float *d, size_t n, uint8_t **bytes, size_t *len, SafeTensors *st) {
    int8_t q[600];
    float scale[4];
    delta_encode(&DELTA_INT4, d, n, q, scale);
    DeltaTensor w = {.name = "t", .ndim = 1, .numel = n, .q = q, .scale = scale};
    w.shape[0] = (int64_t)n;
    assert_int_equal(delta_payload_serialize(&DELTA_INT4, &w, 1, 3, bytes, len), SPES_OK);
    assert_int_equal(safetensors_parse(*bytes, *len, "int4 payload", st), SPES_OK);
}

static int decode_t(const SafeTensors *st, size_t n, float *out) {
    float zero[600] = {0}, scales[4];
    int8_t codes[600];
    int64_t shape[1] = {(int64_t)n};
    return delta_payload_decode(&DELTA_INT4, st, "int4 payload", "t", 1, shape, n, zero, out, scales, codes);
}

static void test_int4_packing_round_trip(void **state) {
    (void)state;
    size_t sizes[] = {1, 2, 255, 257, 513};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        float d[600], want[600], got[600], zero[600] = {0}, scale[4];
        int8_t q[600];
        for (size_t i = 0; i < n; i++) d[i] = (float)((int)(i * 37 % 29) - 14) * 0.01f;
        delta_encode(&DELTA_INT4, d, n, q, scale);
        delta_reconstruct(zero, q, scale, n, want);
        uint8_t *bytes;
        size_t len;
        SafeTensors st;
        int4_payload(d, n, &bytes, &len, &st);
        const StTensor *codes = safetensors_find(&st, "t"), *scales = safetensors_find(&st, "t.scale");
        assert_int_equal(codes->dtype, DTYPE_U8);   // one zstd frame of the codes, two a byte, an odd count padded
        assert_int_equal(ZSTD_getFrameContentSize(codes->data, codes->numel), (n + 1) / 2);
        assert_int_equal(scales->dtype, DTYPE_BF16);
        assert_int_equal(scales->numel, delta_blocks(n));
        assert_string_equal(safetensors_meta(&st, "spes_encoding"), "int4-delta");
        assert_int_equal(decode_t(&st, n, got), SPES_OK);
        assert_memory_equal(got, want, n * sizeof(float));   // the same bits as the unpacked codes give
        safetensors_close(&st);
        free(bytes);
    }
}

// An int4 payload of tensor "t" (257 values) from raw pieces: `codes` (codes_len bytes, as the
// tensor's data) and two bf16 scales.
static void raw_int4_payload(const uint8_t *codes, size_t codes_len, uint16_t s0, uint16_t s1, uint8_t **bytes,
                             size_t *len, SafeTensors *st) {
    uint16_t scales[2] = {s0, s1};
    StWriteTensor w[2] = {{.name = "t", .dtype = DTYPE_U8, .ndim = 1, .shape = {(int64_t)codes_len}, .data = codes},
                          {.name = "t.scale", .dtype = DTYPE_BF16, .ndim = 1, .shape = {2}, .data = scales}};
    const char *keys[] = {"spes_encoding", "spes_base_step", "spes_block"}, *values[] = {"int4-delta", "3", "256"};
    assert_int_equal(safetensors_serialize(w, 2, keys, values, 3, bytes, len), SPES_OK);
    assert_int_equal(safetensors_parse(*bytes, *len, "int4 payload", st), SPES_OK);
}

// The packed codes (len bytes) as the zstd frame the tensor holds, plus `extra` bytes after it.
static size_t frame_of(const uint8_t *packed, size_t len, uint8_t *frame, size_t extra) {
    size_t n = ZSTD_compress(frame, 1024, packed, len, 1);
    assert_false(ZSTD_isError(n));
    memset(frame + n, 0x55, extra);
    return n + extra;
}

static void test_int4_hostile_packing_refused(void **state) {
    (void)state;
    struct {
        int packed_at;             // byte of the 129 packed bytes to set (-1: none)
        uint8_t value;
        uint16_t s0, s1;           // bf16 scales
        size_t packed_len;         // bytes the frame holds (129 is right for 257 codes)
        int frame;                 // 1: a zstd frame, 0: the raw packed bytes, 2: a frame and one byte more
        const char *says;
    } cases[] = {
        {128, 0x10, 0x3f00, 0x3f00, 129, 1, "padding nibble after its last (odd) code is not 0"},
        {5, 0x80, 0x3f00, 0x3f00, 129, 1, "value -8 (the code is symmetric, -7..7) at flat index 11"},
        {-1, 0, 0x3f00, 0x7fc0, 129, 1, "scale is NaN at block 1"},
        {-1, 0, 0xbf00, 0x3f00, 129, 1, "scale is negative at block 0"},
        {-1, 0, 0x7f80, 0x3f00, 129, 1, "scale is infinite at block 0"},
        {-1, 0, 0x3f00, 0x3f00, 128, 1, "the codes' zstd frame holds 128 bytes, expected 129"},   // truncated packing
        {-1, 0, 0x3f00, 0x3f00, 130, 1, "holds 130 bytes, expected 129"},
        {-1, 0, 0x3f00, 0x3f00, 129, 0, "not a zstd frame"},
        {-1, 0, 0x3f00, 0x3f00, 129, 2, "exactly one zstd frame"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t packed[130], frame[1100], *bytes;
        for (int k = 0; k < 130; k++) packed[k] = 0x21;   // codes 1, 2, 1, 2, ...
        packed[128] = 0x01;                                 // 257 codes: the last byte's high nibble is padding
        if (cases[i].packed_at >= 0) packed[cases[i].packed_at] = cases[i].value;
        size_t frame_len = cases[i].frame ? frame_of(packed, cases[i].packed_len, frame, cases[i].frame == 2)
                                          : (memcpy(frame, packed, 129), 129);
        size_t len;
        SafeTensors st;
        float out[257];
        raw_int4_payload(frame, frame_len, cases[i].s0, cases[i].s1, &bytes, &len, &st);
        assert_int_equal(decode_t(&st, 257, out), SPES_ERR);
        if (!strstr(spes_last_error(), cases[i].says)) fail_msg("case %zu: %s", i, spes_last_error());
        safetensors_close(&st);
        free(bytes);
    }
    // The same pieces, undamaged, decode: codes 1, 2, ... at scale 0.5.
    uint8_t packed[129], frame[1100], *bytes;
    memset(packed, 0x21, sizeof packed);
    packed[128] = 0x01;
    size_t len;
    SafeTensors st;
    float out[257];
    raw_int4_payload(frame, frame_of(packed, 129, frame, 0), 0x3f00, 0x3f00, &bytes, &len, &st);
    assert_int_equal(decode_t(&st, 257, out), SPES_OK);
    assert_true(out[0] == 0.5f && out[1] == 1.0f && out[256] == 0.5f);
    safetensors_close(&st);
    free(bytes);
    // The int8 layout in an int4 payload: refused by name.
    int8_t q[257] = {0};
    float s[2] = {0.5f, 0.5f};
    DeltaTensor t8 = {.name = "t", .ndim = 1, .shape = {257}, .numel = 257, .q = q, .scale = s};
    assert_int_equal(delta_payload_serialize(&DELTA_INT8, &t8, 1, 3, &bytes, &len), SPES_OK);
    assert_int_equal(safetensors_parse(bytes, len, "int8 payload", &st), SPES_OK);
    assert_int_equal(decode_t(&st, 257, out), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "must be U8"));
    safetensors_close(&st);
    free(bytes);
}

// An int4 run refuses int8 peers and payloads, and the other way round, by name.
static void test_int4_and_int8_runs_refuse_each_other(void **state) {
    (void)state;
    const DeltaCodec *runs[2] = {&DELTA_INT4, &DELTA_INT8};
    for (int k = 0; k < 2; k++) {
        const DeltaCodec *run = runs[k], *other = runs[1 - k];
        Rounds *r = make_rounds(run);
        ModelSpec spec;
        int last;
        char want[96];
        assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
        assert_int_equal(rounds_hello_delta(r, 1, P, M, SYNC_MODE_SPES, DTYPE_I8, other, &spec, &last), ROUNDS_MISMATCH);
        snprintf(want, sizeof want, "payload dtype %s, but the other peers use %s", other->wire, run->wire);
        if (!strstr(spes_last_error(), want)) fail_msg("%s", spes_last_error());
        model_spec_free(&spec);
        TestPeer tp[P];
        for (int p = 0; p < P; p++) peer_init(&tp[p], run, p);
        for (int p = 0; p < P; p++) assert_int_equal(peer_upload(r, &tp[p], p, 2), ROUNDS_OK);
        assert_int_equal(hostile_upload(r, other, unknown_base), ROUNDS_BAD_REQUEST);
        snprintf(want, sizeof want, "an %s delta, but this run's payload dtype is %s", other->name, run->wire);
        if (!strstr(spes_last_error(), want)) fail_msg("%s", spes_last_error());
        for (int p = 0; p < P; p++) peer_free(&tp[p]);
        rounds_destroy(r);
    }
}

// A residual restored from a checkpoint: what healthy rounds leave passes; a damaged value (finite
// but far beyond half a quantisation step, or NaN) is refused naming the tensor and index.
static void test_damaged_residual_refused(void **state) {
    const DeltaCodec *c = *state;
    Rounds *r = make_rounds(c);
    TestPeer tp[P];
    for (int p = 0; p < P; p++) peer_init(&tp[p], c, p);
    for (int round = 1; round <= 3; round++) {
        for (int p = 0; p < P; p++) peer_train(&tp[p], p, round);
        for (int p = 0; p < P; p++) assert_int_equal(peer_upload(r, &tp[p], p, 2 * round), ROUNDS_OK);
        for (int p = 0; p < P; p++) peer_download(r, &tp[p], p, 2 * round);
    }
    DeltaPeer *d = &tp[0].deltas;
    assert_int_equal(delta_peer_check_residual(d, "step6/spes_sync_state.safetensors"), SPES_OK);
    float bound = delta_peer_residual_bound(c);
    assert_true(bound > 500.0f && bound < 11000.0f);
    d->residual[3] = bound;   // the bound itself is a value a peer can hold
    assert_int_equal(delta_peer_check_residual(d, "ckpt"), SPES_OK);
    const float damaged[] = {1e30f, -1e30f, NAN, 2.0f * bound};
    for (size_t k = 0; k < sizeof damaged / sizeof *damaged; k++) {
        d->residual[d->sent_total - 1] = damaged[k];
        assert_int_equal(delta_peer_check_residual(d, "step6/spes_sync_state.safetensors"), SPES_ERR);
        if (!strstr(spes_last_error(), "step6/spes_sync_state.safetensors: the ") ||
            !strstr(spes_last_error(), "error feedback of tensor '") || !strstr(spes_last_error(), "damaged"))
            fail_msg("%s", spes_last_error());
    }
    for (int p = 0; p < P; p++) peer_free(&tp[p]);
    rounds_destroy(r);
}

#define BOTH(f) cmocka_unit_test_prestate(f, (void *)&DELTA_INT8), cmocka_unit_test_prestate(f, (void *)&DELTA_INT4)

int main(void) {
    const struct CMUnitTest tests[] = {
        BOTH(test_round_trip_and_bound),
        BOTH(test_rounding_ties_to_even),
        BOTH(test_error_feedback_carries_what_rounding_lost),
        BOTH(test_check_refuses_hostile_codes),
        BOTH(test_server_and_peers_reconstruct_the_same_bits),
        BOTH(test_hostile_delta_uploads_refused),
        BOTH(test_delta_upload_refused_in_a_float_run),
        BOTH(test_damaged_residual_refused),
        cmocka_unit_test(test_int4_packing_round_trip),
        cmocka_unit_test(test_int4_hostile_packing_refused),
        cmocka_unit_test(test_int4_and_int8_runs_refuse_each_other),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
