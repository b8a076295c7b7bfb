// Download views (rounds_view, aggregate_view.h): a peer's own experts are left out of its
// download exactly when the round took them unchanged from its upload; the view is a valid
// safetensors image whose tensors are the aggregate's bytes; otherwise the whole aggregate,
// byte for byte (the seeds' download; after a rotation of the experts, every peer's).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/rounds.h"
#include "sync_test_model.h"

static Rounds *make_rounds_rotating(int merge_interval, double round_timeout_s, int rotation_steps) {
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 2,
                                .merge_interval = merge_interval, .merge_alpha_start = 0.5f,
                                .rotation_steps = rotation_steps},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2,
                        .round_timeout_s = round_timeout_s, .min_peers = 1};
    Rounds *r;
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    int last;
    assert_int_equal(rounds_hello(r, 0, 2, 2, SYNC_MODE_SPES, DTYPE_F32, &spec, &last), ROUNDS_OK);
    model_spec_free(&spec);
    return r;
}

static Rounds *make_rounds(int merge_interval, double round_timeout_s) {
    return make_rounds_rotating(merge_interval, round_timeout_s, 0);
}

static void upload(Rounds *r, int peer, int step) {
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_small_upload(peer, &bytes, &len), SPES_OK);
    assert_int_equal(rounds_upload(r, peer, step, bytes, len), ROUNDS_OK);
}

static void gather(void *ctx, const uint8_t *data, size_t len) {
    uint8_t **at = ctx;
    memcpy(*at, data, len);
    *at += len;
}

// The view's bytes, read back through aggregate_view_range in odd-sized pieces.
static uint8_t *view_bytes(const AggregateView *v) {
    uint8_t *buf = malloc(v->len), *at = buf;
    for (size_t off = 0; off < v->len; off += 37) assert_true(aggregate_view_range(v, off, 37, gather, &at) > 0);
    assert_int_equal((size_t)(at - buf), v->len);
    return buf;
}

// Checks peer's view of blob: with `omitted`, every tensor but the peer's experts, each equal
// to the aggregate's; else the aggregate itself, byte for byte.
static void check_view(Rounds *r, AggregateBlob *blob, int peer, bool omitted) {
    RoundsViewRequest q = {.omit_own_experts = true};
    const AggregateView *v;
    const char *name;
    assert_int_equal(rounds_view(r, blob, peer, &q, &v, &name), ROUNDS_OK);
    assert_string_equal(name, omitted ? SYNC_VIEW_OMIT_OWN : "");
    uint8_t *bytes = view_bytes(v);
    if (!omitted) {
        assert_int_equal(v->len, blob->len);
        assert_memory_equal(bytes, blob->bytes, blob->len);
        free(bytes);
        return;
    }
    SafeTensors got, all;
    assert_int_equal(safetensors_parse(bytes, v->len, "view", &got), SPES_OK);
    assert_int_equal(safetensors_parse(blob->bytes, blob->len, "aggregate", &all), SPES_OK);
    assert_string_equal(safetensors_meta(&got, "spes_view"), SYNC_VIEW_OMIT_OWN);
    int expected = 0;
    for (int i = 0; i < all.count; i++) {
        const char *n = all.tensors[i].name;
        int e = -1;
        bool own = sscanf(n, "model.layers.%*d.mlp.experts.%d.", &e) == 1 && e / 2 == peer;
        const StTensor *x = safetensors_find(&got, n);
        if (own) {
            assert_null(x);
            continue;
        }
        expected++;
        assert_non_null(x);
        assert_int_equal(x->nbytes, all.tensors[i].nbytes);
        assert_memory_equal(x->data, all.tensors[i].data, x->nbytes);
    }
    assert_int_equal(got.count, expected);
    assert_true(expected < all.count);
    safetensors_close(&got);
    safetensors_close(&all);
    free(bytes);
}

static void test_own_experts_left_out_unless_changed(void **state) {
    (void)state;
    Rounds *r = make_rounds(4, 0);   // merging on step 4
    upload(r, 0, 2);
    upload(r, 1, 2);
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, 2, 0, &blob), ROUNDS_OK);
    assert_non_null(blob);
    check_view(r, blob, 0, true);
    check_view(r, blob, 1, true);
    check_view(r, blob, 1, true);   // built once, served again
    // Not asked: the whole aggregate.
    RoundsViewRequest whole = {0};
    const AggregateView *v;
    const char *name;
    assert_int_equal(rounds_view(r, blob, 0, &whole, &v, &name), ROUNDS_OK);
    assert_int_equal(v->len, blob->len);
    rounds_release(r, blob);
    upload(r, 0, 4);
    upload(r, 1, 4);
    assert_int_equal(rounds_get(r, 4, 0, &blob), ROUNDS_OK);
    check_view(r, blob, 0, false);   // merged: every expert changed
    rounds_release(r, blob);
    rounds_destroy(r);
}

static void test_peer_missing_from_partial_round_gets_everything(void **state) {
    (void)state;
    Rounds *r = make_rounds(0, 0.1);
    upload(r, 0, 2);
    upload(r, 1, 2);
    upload(r, 0, 4);
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, 4, 5, &blob), ROUNDS_OK);   // closed by the round timeout
    assert_non_null(blob);
    assert_non_null(blob->included);
    check_view(r, blob, 0, true);
    check_view(r, blob, 1, false);   // its experts are the previous aggregate's, not its upload
    rounds_release(r, blob);
    rounds_destroy(r);
}

// A rotation step: every expert moved, so each peer downloads the whole aggregate, in which
// peer 0's uploaded experts 0-1 sit at positions 2-3 (peer 1's to train next) and peer 1's at 0-1.
static void test_rotated_aggregate_goes_down_whole(void **state) {
    (void)state;
    Rounds *r = make_rounds_rotating(0, 0, 4);
    upload(r, 0, 2);
    upload(r, 1, 2);
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, 2, 0, &blob), ROUNDS_OK);
    check_view(r, blob, 0, true);   // not a rotation step
    rounds_release(r, blob);
    upload(r, 0, 4);
    upload(r, 1, 4);
    assert_int_equal(rounds_get(r, 4, 0, &blob), ROUNDS_OK);
    check_view(r, blob, 0, false);
    check_view(r, blob, 1, false);
    SafeTensors all;
    assert_int_equal(safetensors_parse(blob->bytes, blob->len, "aggregate", &all), SPES_OK);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    for (int e = 0; e < 4; e++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.up_proj.weight", e);
        int t = model_spec_find(&spec, name);   // sync_test_upload's value of t for the peer that trained it
        snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.up_proj.weight", (e + 2) % 4);
        const StTensor *x = safetensors_find(&all, name);
        assert_non_null(x);
        float got;
        memcpy(&got, x->data + 4 * 5, 4);
        assert_float_equal(got, (float)(e / 2) + 0.5f * (float)t + 0.01f * 5.0f, 0.0f);
    }
    model_spec_free(&spec);
    safetensors_close(&all);
    rounds_release(r, blob);
    rounds_destroy(r);
}

// The outer optimizer's state follows positions, which a rotation would scramble: refused.
static void test_rotation_with_outer_optimizer_refused(void **state) {
    (void)state;
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 2,
                                .rotation_steps = 4},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2, .min_peers = 1,
                        .outer = {.lr = 0.7f, .momentum = 0.9f}};
    Rounds *r = NULL;
    assert_int_equal(rounds_create(&cfg, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "--expert_rotation_steps"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_experts_left_out_unless_changed),
        cmocka_unit_test(test_peer_missing_from_partial_round_gets_everything),
        cmocka_unit_test(test_rotated_aggregate_goes_down_whole),
        cmocka_unit_test(test_rotation_with_outer_optimizer_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
