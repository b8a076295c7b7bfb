// Round bookkeeping without a network: handshake adoption and refusal, a bad upload does not
// poison the round, retries replace, completion aggregates, late uploads, keep_steps,
// long-poll timeout, spec inferred from a Hello-less first upload.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <glob.h>
#include <jansson.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/timer.h"
#include "base/file.h"
#include "server/rounds.h"
#include "server/server_state.h"
#include "sync/aggregate_step.h"
#include "sync_test_model.h"

static Rounds *make_rounds_in(int keep_steps, const char *state_dir) {
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                        .keep_steps = keep_steps, .max_upload_bytes = 1 << 20, .max_open_rounds = 2,
                        .state_dir = state_dir};
    Rounds *r;
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    return r;
}
static Rounds *make_rounds(int keep_steps) { return make_rounds_in(keep_steps, NULL); }

static void hello(Rounds *r, int peer, int64_t lm_head_rows, RoundsResult want) {
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, lm_head_rows), SPES_OK);
    int last;
    assert_int_equal(rounds_hello(r, peer, 2, 2, SYNC_MODE_SPES, DTYPE_F32, &spec, &last), want);
    model_spec_free(&spec);
}

static RoundsResult upload(Rounds *r, int peer, int step, SyncTestTweak tweak) {
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, peer, DTYPE_F32, tweak, &bytes, &len), SPES_OK);
    model_spec_free(&spec);
    return rounds_upload(r, peer, step, bytes, len);
}

static void make_nan(StWriteTensor *w, float *d, int t) { d[0] = 0.0f / 0.0f; }
static void plus_one(StWriteTensor *w, float *d, int t) { d[0] += 1.0f; }

static void test_round_completes_despite_a_bad_upload(void **state) {
    (void)state;
    Rounds *r = make_rounds(2);
    hello(r, 0, 6, ROUNDS_OK);
    hello(r, 1, 8, ROUNDS_MISMATCH);
    assert_non_null(strstr(spes_last_error(), "lm_head.weight"));
    assert_int_equal(upload(r, 0, 10, plus_one), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 10, NULL), ROUNDS_OK);             // a retry replaces the first
    assert_int_equal(upload(r, 1, 10, make_nan), ROUNDS_BAD_REQUEST);
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, 10, 0, &blob), ROUNDS_OK);
    assert_null(blob);                                                    // not complete yet
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.open_step, 10);
    assert_int_equal(st.num_uploaded, 1);
    assert_int_equal(st.peers_uploaded[0], 0);
    assert_int_equal(st.uploads_rejected, 1);
    assert_int_equal(upload(r, 1, 10, NULL), ROUNDS_OK);             // completes and aggregates
    assert_int_equal(rounds_get(r, 10, 0, &blob), ROUNDS_OK);
    assert_non_null(blob);
    SafeTensors agg;
    assert_int_equal(safetensors_parse(blob->bytes, blob->len, "aggregate", &agg), SPES_OK);
    // embed (t = 0): mean of peer 0 (0 + 0.01 i) and peer 1 (1 + 0.01 i), not of the replaced upload.
    float v;
    memcpy(&v, safetensors_find(&agg, "model.embed_tokens.weight")->data + 4, 4);
    assert_float_equal(v, (0.01f + 1.01f) / 2, 1e-7);
    safetensors_close(&agg);
    rounds_release(r, blob);
    assert_int_equal(upload(r, 0, 10, NULL), ROUNDS_ALREADY_AGGREGATED);   // late upload
    rounds_status(r, &st);
    assert_int_equal(st.rounds_completed, 1);
    assert_int_equal(st.last_aggregate_step, 10);
    assert_int_equal(st.open_step, -1);
    rounds_destroy(r);
}

static void rename_with_escapes(StWriteTensor *w, float *d, int t) {
    if (t == 0) w->name = "evil\x1b[2J\nserver: step 9: aggregated";
}

// A refusal quotes the peer's tensor name; the log must not carry its control bytes raw.
static void test_refusal_log_escapes_control_bytes(void **state) {
    (void)state;
    char path[] = "/tmp/spes_rounds_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    Rounds *r = make_rounds(1);
    hello(r, 0, 6, ROUNDS_OK);
    RoundsResult code = upload(r, 0, 1, rename_with_escapes);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rounds_destroy(r);
    assert_int_equal(code, ROUNDS_BAD_REQUEST);
    uint8_t *text;
    size_t len;
    assert_int_equal(file_read_all(path, &text, &len), SPES_OK);
    close(fd);
    unlink(path);
    assert_null(memchr(text, 0x1b, len));
    assert_non_null(memmem(text, len, "evil\\x1b[2J\\x0aserver", 21));
    free(text);
}

static void complete(Rounds *r, int step) {
    assert_int_equal(upload(r, 0, step, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 1, step, NULL), ROUNDS_OK);
    assert_int_equal(rounds_last_completed_step(r), step);
}

// One peer uploading far ahead (or a bogus step) can neither lock the others out of the
// open-round slots nor make a far-future round the newest one.
static void test_far_ahead_uploads_cannot_stall_or_poison(void **state) {
    (void)state;
    // Before any round completed: a bogus step seen first is dropped once the run's real first
    // round shows up, and can no longer be completed afterwards.
    Rounds *r = make_rounds(2);   // max_open_rounds 2
    hello(r, 0, 6, ROUNDS_OK);
    assert_int_equal(upload(r, 0, 2147483647, NULL), ROUNDS_OK);
    complete(r, 10);
    assert_int_equal(upload(r, 1, 2147483647, NULL), ROUNDS_TOO_FAR_AHEAD);
    assert_non_null(strstr(spes_last_error(), "more than 4 rounds ahead of the newest completed step 10"));
    assert_int_equal(rounds_last_completed_step(r), 10);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.open_step, -1);   // nothing left open
    // Spacing 10 now known (rounds 10, 20): up to 20 + 4 x 10 = 60 is taken, beyond is not.
    complete(r, 20);
    assert_int_equal(upload(r, 0, 61, NULL), ROUNDS_TOO_FAR_AHEAD);
    assert_int_equal(upload(r, 0, 1000000000, NULL), ROUNDS_TOO_FAR_AHEAD);
    size_t cap;   // the same answers from an upload's first message, before its bytes
    assert_int_equal(rounds_upload_start(r, 0, 61, &cap), ROUNDS_TOO_FAR_AHEAD);
    assert_int_equal(rounds_upload_start(r, 0, 20, &cap), ROUNDS_ALREADY_AGGREGATED);
    assert_int_equal(rounds_upload_start(r, 2, 30, &cap), ROUNDS_BAD_REQUEST);
    assert_int_equal(rounds_upload_start(r, 0, 30, &cap), ROUNDS_OK);
    assert_true(cap > 0 && cap < (1 << 20));
    // Valid steps just ahead fill both slots; the round the run needs next still opens (the
    // highest one gives way), completes, and the stale round below it is dropped.
    assert_int_equal(upload(r, 0, 59, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 60, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 30, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 1, 30, NULL), ROUNDS_OK);
    assert_int_equal(rounds_last_completed_step(r), 30);
    assert_int_equal(upload(r, 1, 59, NULL), ROUNDS_OK);   // 59 is still open: completes
    assert_int_equal(rounds_last_completed_step(r), 59);
    rounds_destroy(r);
}

static long status_kb(const char *key) {
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    long kb = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kb = atol(line + n + 1);
    if (f) fclose(f);
    return kb;
}

// The server's memory does not grow with the number of peers: 8 fedavg peers (each uploads the
// whole model, 4 tensors) over 3 rounds with keep_steps 1 stay within (2 + keep_steps) models
// above idle, plus the 2 models this test itself holds while it builds an upload (its floats
// and their serialisation), plus 1/4 slack. Uploads used to stay in memory until their round
// completed: 8 models and more. Measured in a child, so its peak is its own.
static void test_memory_independent_of_peers(void **state) {
    (void)state;
    // Resident memory is what this measures; under AddressSanitizer (make test-asan sets
    // SPES_ASAN) the allocator's quarantine and shadow memory make it meaningless.
    if (getenv("SPES_ASAN")) skip();
    pid_t child = fork();
    if (child == 0) {
        enum { P = 8 };
        RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_FEDAVG, .num_peers = P, .merge_topk = 4}, .keep_steps = 1,
                            .max_upload_bytes = (size_t)1 << 30, .max_open_rounds = 2};
        Rounds *r;
        if (rounds_create(&cfg, &r) != SPES_OK) _exit(2);
        ModelSpec spec;
        model_spec_init(&spec);
        int64_t big[2] = {1024, 1024};   // 4 x 4 MiB
        static const char *names[4] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "w"};
        for (int t = 0; t < 4; t++) model_spec_add(&spec, names[t], DTYPE_F32, 2, big);
        model_spec_finish(&spec);
        double model = (double)spec.total_numel * 4 / 1024.0;   // KiB
        long idle = status_kb("VmRSS");
        int last;
        if (rounds_hello(r, 0, P, 0, SYNC_MODE_FEDAVG, DTYPE_F32, &spec, &last) != ROUNDS_OK) _exit(3);
        ModelSpec again;
        model_spec_init(&again);
        for (int t = 0; t < 4; t++) model_spec_add(&again, names[t], DTYPE_F32, 2, big);
        model_spec_finish(&again);
        for (int step = 1; step <= 3; step++)
            for (int p = 0; p < P; p++) {
                uint8_t *bytes;
                size_t len;
                if (sync_test_upload(&again, SYNC_MODE_FEDAVG, 1, p, DTYPE_F32, NULL, &bytes, &len) != SPES_OK) _exit(4);
                if (rounds_upload(r, p, step, bytes, len) != ROUNDS_OK) _exit(5);
            }
        double peak = (double)(status_kb("VmHWM") - idle) / model;
        // Uploads go to disk as they arrive, so the test's own copy (freed inside rounds_upload)
        // and its serialisation are most of what is above the bound: measured 4.0.
        fprintf(stderr, "server memory: peak %.2f models above idle (bound 3, + up to 2 held by the test)\n", peak);
        rounds_destroy(r);
        _exit(peak <= 4.5 ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_keep_steps_and_long_poll(void **state) {
    (void)state;
    Rounds *r = make_rounds(1);
    hello(r, 0, 6, ROUNDS_OK);
    for (int step = 1; step <= 2; step++) {
        assert_int_equal(upload(r, 0, step, NULL), ROUNDS_OK);
        assert_int_equal(upload(r, 1, step, NULL), ROUNDS_OK);
    }
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, 1, 0, &blob), ROUNDS_NOT_KEPT);   // dropped: keep_steps 1
    assert_non_null(strstr(spes_last_error(), "no longer kept"));
    assert_int_equal(rounds_get(r, 2, 0, &blob), ROUNDS_OK);
    assert_non_null(blob);
    rounds_release(r, blob);
    // Step 3 is aggregated into the buffer of the dropped step 1: every byte must be new.
    assert_int_equal(upload(r, 0, 3, plus_one), ROUNDS_OK);
    assert_int_equal(upload(r, 1, 3, plus_one), ROUNDS_OK);
    assert_int_equal(rounds_get(r, 3, 0, &blob), ROUNDS_OK);
    SafeTensors agg;
    assert_int_equal(safetensors_parse(blob->bytes, blob->len, "aggregate", &agg), SPES_OK);
    float v;
    memcpy(&v, safetensors_find(&agg, "model.embed_tokens.weight")->data, 4);
    assert_float_equal(v, (1.0f + 2.0f) / 2, 1e-7);
    safetensors_close(&agg);
    rounds_release(r, blob);
    double start = now_seconds();
    assert_int_equal(rounds_get(r, 4, 0.2, &blob), ROUNDS_OK);   // nobody uploads step 4
    assert_null(blob);
    double waited = now_seconds() - start;
    assert_true(waited >= 0.19 && waited < 2.0);
    // Too many open rounds at once (max_open_rounds 2) is refused, not buffered forever.
    assert_int_equal(upload(r, 0, 4, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 5, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 6, NULL), ROUNDS_NO_ROOM);
    rounds_close(r);
    assert_int_equal(rounds_get(r, 4, 5, &blob), ROUNDS_CLOSING);
    rounds_destroy(r);
}

static void test_spec_inferred_without_hello(void **state) {
    (void)state;
    Rounds *r = make_rounds(2);
    assert_int_equal(upload(r, 1, 7, make_nan), ROUNDS_BAD_REQUEST);   // a bad first upload fixes nothing
    RoundsStatus st;
    rounds_status(r, &st);
    assert_true(st.fingerprint == 0);
    assert_int_equal(upload(r, 1, 7, NULL), ROUNDS_OK);
    rounds_status(r, &st);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    assert_true(st.fingerprint == spec.fingerprint);
    model_spec_free(&spec);
    assert_int_equal(upload(r, 0, 7, NULL), ROUNDS_OK);
    hello(r, 0, 6, ROUNDS_OK);   // a later Hello with the same model is accepted
    rounds_status(r, &st);
    assert_int_equal(st.rounds_completed, 1);
    rounds_destroy(r);
}

static int count_files(const char *dir, const char *prefix) {
    StateFile *files;
    int n, count = 0;
    assert_int_equal(state_list(dir, &files, &n), SPES_OK);
    for (int i = 0; i < n; i++) count += files[i].kind == prefix[0];
    free(files);
    return count;
}

// A server with a state dir, dropped without any shutdown (as after SIGKILL: only what is on
// disk survives), comes back with the spec, bookkeeping, kept aggregates and open uploads;
// the aggregate of a round finished after the restart is byte-identical to one computed
// without any restart; leftovers are cleaned up; another run's settings are refused.
static void test_state_dir_survives_restart(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_state_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *calm = make_rounds(2), *r = make_rounds_in(2, dir);
    hello(calm, 0, 6, ROUNDS_OK);
    hello(r, 0, 6, ROUNDS_OK);
    for (int step = 2; step <= 6; step += 2)
        for (int p = 0; p < 2; p++) {
            assert_int_equal(upload(calm, p, step, NULL), ROUNDS_OK);
            assert_int_equal(upload(r, p, step, NULL), ROUNDS_OK);
        }
    assert_int_equal(upload(calm, 1, 8, plus_one), ROUNDS_OK);
    assert_int_equal(upload(r, 1, 8, plus_one), ROUNDS_OK);
    assert_int_equal(count_files(dir, "a"), 2);   // keep_steps 2: step 2's aggregate removed
    assert_int_equal(count_files(dir, "u"), 1);
    rounds_destroy(r);

    // Leftovers of a crash between writes: an upload of a completed step and an aggregate
    // that rounds.json does not know about yet.
    assert_int_equal(state_save_upload(dir, 4, 0, (const uint8_t *)"x", 1), SPES_OK);
    assert_int_equal(state_save_aggregate(dir, 7, (const uint8_t *)"x", 1), SPES_OK);
    r = make_rounds_in(2, dir);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.rounds_completed, 3);
    assert_int_equal(st.last_aggregate_step, 6);
    assert_int_equal(st.open_step, 8);
    assert_int_equal(st.num_uploaded, 1);
    assert_int_equal(st.peers_uploaded[0], 1);
    assert_int_equal(count_files(dir, "a"), 2);
    assert_int_equal(count_files(dir, "u"), 1);
    int last;
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    assert_int_equal(rounds_hello(r, 1, 2, 2, SYNC_MODE_SPES, DTYPE_F32, &spec, &last), ROUNDS_OK);
    model_spec_free(&spec);
    assert_int_equal(last, 6);
    assert_int_equal(upload(r, 0, 6, NULL), ROUNDS_ALREADY_AGGREGATED);
    AggregateBlob *a, *b;
    assert_int_equal(rounds_get(r, 6, 0, &a), ROUNDS_OK);   // a kept aggregate, reloaded
    assert_int_equal(rounds_get(calm, 6, 0, &b), ROUNDS_OK);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->len, b->len);
    assert_memory_equal(a->bytes, b->bytes, a->len);
    rounds_release(r, a);
    rounds_release(calm, b);
    assert_int_equal(upload(calm, 0, 8, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 8, NULL), ROUNDS_OK);    // completes the reloaded round
    assert_int_equal(rounds_get(r, 8, 0, &a), ROUNDS_OK);
    assert_int_equal(rounds_get(calm, 8, 0, &b), ROUNDS_OK);
    assert_non_null(a);
    assert_int_equal(a->len, b->len);
    assert_memory_equal(a->bytes, b->bytes, a->len);
    rounds_release(r, a);
    rounds_release(calm, b);
    assert_int_equal(count_files(dir, "u"), 0);
    rounds_destroy(r);
    rounds_destroy(calm);

    RoundsConfig other = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 4, .experts_per_node = 1, .merge_topk = 4},
                          .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2, .state_dir = dir};
    assert_int_equal(rounds_create(&other, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "--total_peers 4"));

    // One server per state dir: a second one is refused while the first holds it.
    r = make_rounds_in(2, dir);
    Rounds *second;
    RoundsConfig same_dir = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                             .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2, .state_dir = dir};
    assert_int_equal(rounds_create(&same_dir, &second), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "is in use by another spes server"));
    assert_non_null(strstr(spes_last_error(), dir));
    rounds_destroy(r);

    // spec.json lost but rounds.json still there: refused as damaged, not a fresh start.
    char *spec_path = path_join(dir, "spec.json");
    assert_int_equal(unlink(spec_path), 0);
    free(spec_path);
    RoundsConfig same = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                         .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2, .state_dir = dir};
    assert_int_equal(rounds_create(&same, &r), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "rounds.json but no spec.json"));
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// Reads dir/name whole (malloc'd, NUL-terminated).
static char *read_state_file(const char *dir, const char *name, size_t *len) {
    char *path = path_join(dir, name);
    uint8_t *bytes;
    assert_int_equal(file_read_all(path, &bytes, len), SPES_OK);
    free(path);
    char *text = realloc(bytes, *len + 1);
    text[*len] = '\0';
    return text;
}
static void write_state_file(const char *dir, const char *name, const void *bytes, size_t len) {
    char *path = path_join(dir, name);
    assert_int_equal(file_write_atomic(path, bytes, len), SPES_OK);
    free(path);
}
// A server on dir must refuse to start, saying `says`.
static void restart_refused(const char *dir, const char *says) {
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2, .state_dir = dir};
    Rounds *r = NULL;
    if (rounds_create(&cfg, &r) == SPES_OK) {
        rounds_destroy(r);
        fail_msg("a damaged state dir was taken (want: %s)", says);
    }
    if (!strstr(spes_last_error(), says)) fail_msg("want '%s', got: %s", says, spes_last_error());
}

// The expert merging and rotation flags shape every aggregate, so spec.json records them and a
// restart with other values is refused naming both; they used to change silently. Operational
// settings (keep_steps, round_timeout, min_peers) stay free, and a spec.json of an older server,
// which recorded none, still loads.
static int restart_with(const char *dir, AggregateConfig agg, int keep_steps) {
    RoundsConfig cfg = {.agg = agg, .keep_steps = keep_steps, .max_upload_bytes = 1 << 20, .max_open_rounds = 2,
                        .state_dir = dir, .round_timeout_s = 5, .min_peers = 1};
    Rounds *r = NULL;
    int rc = rounds_create(&cfg, &r);
    if (rc == SPES_OK) rounds_destroy(r);
    return rc;
}
static void test_run_flags_fixed_by_state_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_flags_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const AggregateConfig run = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_interval = 2,
                                 .merge_alpha_start = 0.5f, .merge_decay_steps = 100, .merge_topk = 4,
                                 .rotation_steps = 4};
    RoundsConfig cfg = {.agg = run, .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2,
                        .state_dir = dir};
    Rounds *r;
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    hello(r, 0, 6, ROUNDS_OK);   // writes spec.json
    rounds_destroy(r);

    AggregateConfig other = run;
    other.rotation_steps = 0;
    assert_int_equal(restart_with(dir, other, 2), SPES_ERR);
    const char *e = spes_last_error();
    if (!strstr(e, "written by a run with --expert_rotation_steps 4; this server runs --expert_rotation_steps 0") ||
        !strstr(e, "use the same values, or another --state_dir") || strstr(e, "merge"))
        fail_msg("rotation change: %s", e);
    other = run;
    other.merge_alpha_start = 0.25f;
    other.merge_topk = 1;
    assert_int_equal(restart_with(dir, other, 2), SPES_ERR);
    e = spes_last_error();
    if (!strstr(e, "with --merge_alpha_start 0.5 --merge_topk 4; this server runs --merge_alpha_start 0.25 --merge_topk 1"))
        fail_msg("merge change: %s", e);
    other = run;
    other.merge_interval = 3;
    other.merge_decay_steps = 1000;
    assert_int_equal(restart_with(dir, other, 2), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "--merge_interval 2 --merge_decay_steps 100;"));
    assert_int_equal(restart_with(dir, run, 3), SPES_OK);   // keep_steps, round_timeout, min_peers: free

    // spec.json of an older server: none of the keys; loads whatever the flags.
    char *path = path_join(dir, "spec.json");
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    assert_non_null(j);
    const char *keys[] = {"merge_interval", "merge_alpha_start", "merge_decay_steps", "merge_topk", "expert_rotation_steps"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) assert_int_equal(json_object_del(j, keys[i]), 0);
    assert_int_equal(json_dump_file(j, path, 0), 0);
    json_decref(j);
    free(path);
    other = run;
    other.rotation_steps = 0;
    assert_int_equal(restart_with(dir, other, 2), SPES_OK);
    // ... and from then on records this server's flags: a later change is refused, not passed with
    // a warning at every restart (the old spec.json stayed without them for good).
    assert_int_equal(restart_with(dir, run, 2), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "written by a run with --expert_rotation_steps 0; this server runs "
                                              "--expert_rotation_steps 4"));
    assert_int_equal(restart_with(dir, other, 2), SPES_OK);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// An upload file beyond the run's window at a restart: a bogus step accepted before the first
// round, then the run's real first upload, committed just before a crash (the running server
// would have dropped the bogus round when it stored the real one), or a file copied in by hand.
// The server used to refuse to start ("server state DIR: upload of peer 0 for step N: ... too far
// ahead", no file named); it now sets the file aside, naming it, and starts. Any other upload it
// cannot take names the file.
static void save_valid_upload(const char *dir, int step, int peer) {
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_small_upload(peer, &bytes, &len), SPES_OK);
    assert_int_equal(state_save_upload(dir, step, peer, bytes, len), SPES_OK);
    free(bytes);
}
static bool state_file_exists(const char *dir, const char *name) {
    char *path = path_join(dir, name);
    bool there = file_exists(path);
    free(path);
    return there;
}
static void test_far_ahead_upload_file_at_restart(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_ahead_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *r = make_rounds_in(2, dir);
    hello(r, 0, 6, ROUNDS_OK);
    assert_int_equal(upload(r, 0, 2147483647, NULL), ROUNDS_OK);   // before any round: taken
    rounds_destroy(r);
    save_valid_upload(dir, 10, 1);   // the real first round, committed, then the crash
    r = make_rounds_in(2, dir);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.open_step, 10);
    assert_int_equal(st.num_uploaded, 1);
    assert_false(state_file_exists(dir, "upload_s2147483647_p0.safetensors"));
    assert_true(state_file_exists(dir, "upload_s2147483647_p0.safetensors.far-ahead"));
    assert_int_equal(upload(r, 0, 10, NULL), ROUNDS_OK);   // completes the reloaded round
    complete(r, 12);   // spacing 2: steps up to 12 + 4 x 2 = 20 are taken
    rounds_destroy(r);

    // After rounds completed: a file more than 4 rounds ahead is set aside the same way.
    save_valid_upload(dir, 100, 0);
    save_valid_upload(dir, 14, 0);
    r = make_rounds_in(2, dir);
    rounds_status(r, &st);
    assert_int_equal(st.last_aggregate_step, 12);
    assert_int_equal(st.open_step, 14);
    assert_true(state_file_exists(dir, "upload_s100_p0.safetensors.far-ahead"));
    assert_true(state_file_exists(dir, "upload_s14_p0.safetensors"));
    rounds_destroy(r);

    // More open steps on disk than open-round slots (2): the running server never acknowledges
    // such an upload (refused at its first message; an evicted round's files are removed), so the
    // highest is one a crash left between its commit and its bookkeeping (or a copied file). The
    // lower steps keep the slots, as on the running server; it is set aside, not a reason to stay
    // down (before, the restart refused to start, naming it).
    save_valid_upload(dir, 16, 0);
    save_valid_upload(dir, 18, 0);
    r = make_rounds_in(2, dir);
    rounds_status(r, &st);
    assert_int_equal(st.open_step, 14);
    assert_true(state_file_exists(dir, "upload_s16_p0.safetensors"));
    assert_false(state_file_exists(dir, "upload_s18_p0.safetensors"));
    assert_true(state_file_exists(dir, "upload_s18_p0.safetensors.no-slot"));
    complete(r, 14);   // the run goes on with the adopted ones
    assert_int_equal(upload(r, 1, 16, NULL), ROUNDS_OK);
    assert_int_equal(rounds_last_completed_step(r), 16);
    rounds_destroy(r);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// An aggregation that fails (here: peer 0's upload file damaged on disk after it was accepted)
// answers the completing peer "retry the upload" and forgets its upload; its file stayed in the
// state dir, so a restart took as accepted an upload its peer heard refused (and, the round
// completing without a retry, aggregated it). The file now goes with the refusal.
static void test_failed_aggregation_leaves_no_file(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_aggfail_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *r = make_rounds_in(2, dir);
    hello(r, 0, 6, ROUNDS_OK);
    assert_int_equal(upload(r, 0, 2, NULL), ROUNDS_OK);
    char *path = path_join(dir, "upload_s2_p0.safetensors");
    assert_int_equal(file_write_atomic(path, "damaged", 7), SPES_OK);
    free(path);
    assert_int_equal(upload(r, 1, 2, NULL), ROUNDS_NO_ROOM);
    assert_non_null(strstr(spes_last_error(), "aggregating step 2 (retry the upload)"));
    assert_false(state_file_exists(dir, "upload_s2_p1.safetensors"));
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.open_step, 2);
    assert_int_equal(st.num_uploaded, 1);
    rounds_destroy(r);
    r = make_rounds_in(2, dir);   // the restart has what the running server had: no upload of peer 1
    rounds_status(r, &st);
    assert_int_equal(st.last_aggregate_step, -1);
    rounds_destroy(r);
    assert_false(state_file_exists(dir, "upload_s2_p1.safetensors"));
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// An upload refused after its file was committed to the state dir (here: both open-round slots
// hold lower steps, which round_accepts does not check; a round completing or closing in the
// meantime is the same path) left that file behind, in no round: the restarted server then
// refused to start on it ("upload_s6_p0.safetensors (peer 0, step 6): ... 2 rounds are already
// open"), or would have taken as accepted an upload its peer heard refused. The refusal now
// removes it.
static void test_refused_upload_leaves_no_file(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_refused_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *r = make_rounds_in(2, dir);   // max_open_rounds 2
    hello(r, 0, 6, ROUNDS_OK);
    assert_int_equal(upload(r, 0, 2, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 4, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 6, NULL), ROUNDS_NO_ROOM);
    assert_non_null(strstr(spes_last_error(), "2 rounds are already open"));
    assert_false(state_file_exists(dir, "upload_s6_p0.safetensors"));
    assert_int_equal(count_files(dir, "upload_s"), 2);
    rounds_destroy(r);
    r = make_rounds_in(2, dir);   // the restart takes what the book says
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.open_step, 2);
    complete(r, 2);
    assert_int_equal(upload(r, 1, 4, NULL), ROUNDS_OK);
    assert_int_equal(rounds_last_completed_step(r), 4);
    rounds_destroy(r);
    assert_int_equal(count_files(dir, "upload_s"), 0);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// Peer 0's upload of step as one attempt begun (its bytes all arrived, not yet finished).
static void begin_attempt(Rounds *r, int step, SyncTestTweak tweak, RoundsUpload *up) {
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 0, DTYPE_F32, tweak, &bytes, &len), SPES_OK);
    model_spec_free(&spec);
    assert_int_equal(rounds_upload_begin(r, 0, step, up), ROUNDS_OK);
    assert_int_equal(rounds_upload_append(up, bytes, len), ROUNDS_OK);
    free(bytes);
}

// Value 0 of the embedding in step's aggregate.
static float embed_value(Rounds *r, int step) {
    AggregateBlob *blob;
    assert_int_equal(rounds_get(r, step, 0, &blob), ROUNDS_OK);
    assert_non_null(blob);
    SafeTensors agg;
    assert_int_equal(safetensors_parse(blob->bytes, blob->len, "aggregate", &agg), SPES_OK);
    float v;
    memcpy(&v, safetensors_find(&agg, "model.embed_tokens.weight")->data, 4);
    safetensors_close(&agg);
    rounds_release(r, blob);
    return v;
}

// Two attempts of one peer's upload of a step in flight together (the peer retried after its side
// gave up while the server still received the first): the newest attempt wins, whichever ends
// first; the older one is refused (ABORTED: superseded) and its bytes never replace the newer's.
// Today's file name is one per peer and step: the attempt renamed last used to win, both were OK.
static void test_newest_upload_attempt_wins(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_attempts_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *r = make_rounds_in(2, dir);
    hello(r, 0, 6, ROUNDS_OK);
    for (int step = 10; step <= 12; step += 2) {
        RoundsUpload older, newer;
        begin_attempt(r, step, plus_one, &older);   // the first attempt's bytes differ from the retry's
        begin_attempt(r, step, NULL, &newer);
        if (step == 10) {   // the newer one ends first, then the older
            assert_int_equal(rounds_upload_finish(r, &newer), ROUNDS_OK);
            assert_int_equal(rounds_upload_finish(r, &older), ROUNDS_SUPERSEDED);
        } else {            // the older one ends first, then the newer
            assert_int_equal(rounds_upload_finish(r, &older), ROUNDS_SUPERSEDED);
            assert_int_equal(rounds_upload_finish(r, &newer), ROUNDS_OK);
        }
        assert_non_null(strstr(spes_last_error(), "superseded"));
        char pattern[64];
        snprintf(pattern, sizeof pattern, "%s/upload_s%d_p0.*", dir, step);
        glob_t g;
        assert_int_equal(glob(pattern, 0, NULL, &g), 0);
        assert_int_equal(g.gl_pathc, 1);   // the newer upload; no temp file left
        globfree(&g);
        assert_int_equal(upload(r, 1, step, NULL), ROUNDS_OK);   // completes the round
        // embed[0]: mean of peer 0's newer upload (0; the older one's is 1) and peer 1's (1)
        assert_float_equal(embed_value(r, step), 0.5f, 1e-7);
    }
    rounds_destroy(r);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// A crash between a partial round's peers.json and its aggregate leaves the peers.json; the
// restarted round then completed with every peer, and its full aggregate was read back at the
// next restart as partial, with the stale peer list: the peer it left out heard "closed without
// it" for an upload the aggregate holds. A full round's aggregate removes such a file first.
static void test_full_round_drops_a_stale_peer_list(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_peers_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *r = make_rounds_in(2, dir);
    hello(r, 0, 6, ROUNDS_OK);
    assert_int_equal(upload(r, 0, 2, NULL), ROUNDS_OK);
    rounds_destroy(r);
    const char *stale = "{\"step\": 2, \"peers\": [0]}";
    write_state_file(dir, "aggregate_s2.peers.json", stale, strlen(stale));
    r = make_rounds_in(2, dir);
    assert_int_equal(upload(r, 1, 2, NULL), ROUNDS_OK);   // the round completes with both peers
    assert_int_equal(rounds_last_completed_step(r), 2);
    rounds_destroy(r);
    assert_false(state_file_exists(dir, "aggregate_s2.peers.json"));
    r = make_rounds_in(2, dir);
    assert_int_equal(upload(r, 1, 2, NULL), ROUNDS_ALREADY_AGGREGATED);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.last_round_peers, 2);   // the status page's "peers in the latest aggregate"
    rounds_destroy(r);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// The step a kept aggregate states (spes_step); -1: none.
static int stated_step(Rounds *r, int step, size_t *len) {
    AggregateBlob *a;
    assert_int_equal(rounds_get(r, step, 0, &a), ROUNDS_OK);
    assert_non_null(a);
    SafeTensors st;
    assert_int_equal(safetensors_parse(a->bytes, a->len, "aggregate", &st), SPES_OK);
    int stated;
    assert_int_equal(sync_aggregate_stated_step(&st, "aggregate", &stated), SPES_OK);
    safetensors_close(&st);
    *len = a->len;
    rounds_release(r, a);
    return stated;
}

// Rewrites dir's aggregate of step as a server before spes_step wrote it (the same tensors, no
// __metadata__) and records that file in rounds.json. Returns its bytes.
static char *make_older_aggregate(const char *dir, int step, size_t *older_len) {
    char name[64];
    snprintf(name, sizeof name, "aggregate_s%d.safetensors", step);
    size_t len;
    char *bytes = read_state_file(dir, name, &len);
    SafeTensors st;
    assert_int_equal(safetensors_parse((const uint8_t *)bytes, len, name, &st), SPES_OK);
    StWriteTensor w[64];
    assert_true(st.count <= 64);
    for (int i = 0; i < st.count; i++) {
        w[i] = (StWriteTensor){.name = st.tensors[i].name, .dtype = st.tensors[i].dtype, .ndim = st.tensors[i].ndim,
                               .data = st.tensors[i].data};
        memcpy(w[i].shape, st.tensors[i].shape, sizeof w[i].shape);
    }
    uint8_t *older;
    assert_int_equal(safetensors_serialize(w, st.count, NULL, NULL, 0, &older, older_len), SPES_OK);
    safetensors_close(&st);
    free(bytes);
    assert_true(*older_len < len);
    write_state_file(dir, name, older, *older_len);
    StateBook *book = calloc(1, sizeof *book);
    bool found;
    assert_int_equal(state_load_book(dir, book, &found), SPES_OK);
    for (int i = 0; i < book->n_kept; i++)
        if (book->kept[i].step == step) book->kept[i].bytes = *older_len, book->kept[i].crc32c = crc32c(older, *older_len);
    assert_int_equal(state_save_book(dir, book), SPES_OK);
    free(book);
    return (char *)older;
}

// Every aggregate states its step (spes_step, aggregate_step.h), its header as long as the step's
// digits make it. An aggregate file written before the key (an older server's state dir) is
// reloaded and served as it is (peers take an aggregate stating no step), next to newer ones.
static void test_aggregates_state_their_step(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_step_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *r = make_rounds_in(2, dir);
    hello(r, 0, 6, ROUNDS_OK);
    complete(r, 8);
    complete(r, 10);
    size_t len;
    assert_int_equal(stated_step(r, 8, &len), 8);
    assert_int_equal(stated_step(r, 10, &len), 10);
    rounds_destroy(r);

    size_t older_len;
    char *older = make_older_aggregate(dir, 10, &older_len);
    r = make_rounds_in(2, dir);
    assert_int_equal(stated_step(r, 10, &len), -1);
    AggregateBlob *a;
    assert_int_equal(rounds_get(r, 10, 0, &a), ROUNDS_OK);
    assert_int_equal(a->len, older_len);
    assert_memory_equal(a->bytes, older, older_len);
    rounds_release(r, a);
    complete(r, 12);   // aggregated behind the older one; step 8's drops out
    assert_int_equal(stated_step(r, 12, &len), 12);
    rounds_destroy(r);
    r = make_rounds_in(2, dir);
    assert_int_equal(stated_step(r, 10, &len), -1);
    assert_int_equal(stated_step(r, 12, &len), 12);
    rounds_destroy(r);
    free(older);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// A state dir damaged between two runs (issue 29): an aggregate with one value changed (to NaN)
// or replaced by an older aggregate's bytes, rounds.json edited to another step, are refused by
// name instead of served; one junk upload file is set aside with a log line and the server starts.
static void test_damaged_state_dir_refused(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_damage_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *r = make_rounds_in(2, dir);
    hello(r, 0, 6, ROUNDS_OK);
    for (int step = 2; step <= 6; step += 2)   // step 6's aggregate differs from step 4's
        for (int p = 0; p < 2; p++) assert_int_equal(upload(r, p, step, step == 6 ? plus_one : NULL), ROUNDS_OK);
    rounds_destroy(r);
    size_t len6, len4, book_len;
    char *agg6 = read_state_file(dir, "aggregate_s6.safetensors", &len6);
    char *agg4 = read_state_file(dir, "aggregate_s4.safetensors", &len4);
    char *book = read_state_file(dir, "rounds.json", &book_len);
    assert_int_equal(len4, len6);
    assert_memory_not_equal(agg4, agg6, len6);

    char *nan = malloc(len6);
    memcpy(nan, agg6, len6);
    memcpy(nan + len6 - 4, &(float){NAN}, 4);   // the last value of the last tensor
    write_state_file(dir, "aggregate_s6.safetensors", nan, len6);
    restart_refused(dir, "aggregate_s6.safetensors does not match rounds.json");
    write_state_file(dir, "aggregate_s6.safetensors", agg4, len4);   // an older aggregate's bytes
    restart_refused(dir, "the file is damaged or was replaced");
    write_state_file(dir, "aggregate_s6.safetensors", agg6, len6);

    // rounds.json edited to another step: back (it would drop step 6) or ahead.
    char *step = strstr(book, "\"last_completed_step\": 6");
    assert_non_null(step);
    const char edits[] = {'4', '8'};
    for (size_t k = 0; k < sizeof edits; k++) {
        step[strlen("\"last_completed_step\": ")] = edits[k];
        write_state_file(dir, "rounds.json", book, book_len);
        restart_refused(dir, "rounds.json: its check does not match its content");
    }
    step[strlen("\"last_completed_step\": ")] = '6';
    write_state_file(dir, "rounds.json", book, book_len);
    // The newest aggregate gone: refused by name (not a silent rewind to step 4).
    char *path6 = path_join(dir, "aggregate_s6.safetensors");
    assert_int_equal(unlink(path6), 0);
    restart_refused(dir, "aggregate_s6.safetensors) is missing");
    write_state_file(dir, "aggregate_s6.safetensors", agg6, len6);

    // A junk upload of the open round: set aside, the server starts and serves what it has.
    assert_int_equal(state_save_upload(dir, 8, 0, (const uint8_t *)"junk", 4), SPES_OK);
    r = make_rounds_in(2, dir);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.last_aggregate_step, 6);
    assert_int_equal(st.open_step, -1);
    assert_int_equal(count_files(dir, "u"), 0);
    char *aside = path_join(dir, "upload_s8_p0.safetensors.damaged");
    assert_true(file_exists(aside));
    AggregateBlob *a;
    assert_int_equal(rounds_get(r, 6, 0, &a), ROUNDS_OK);
    assert_non_null(a);
    assert_memory_equal(a->bytes, agg6, len6);
    rounds_release(r, a);
    assert_int_equal(upload(r, 0, 8, NULL), ROUNDS_OK);   // the peer's retry is taken
    rounds_destroy(r);
    free(aside);
    free(path6);
    free(nan);
    free(agg6);
    free(agg4);
    free(book);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// The process's peak resident memory in bytes since the last reset_peak (VmHWM).
static size_t peak_resident_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}
static void reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    assert_non_null(f);
    fputs("5", f);
    fclose(f);
}

// A Hello of a few hundred bytes may declare a model of any size (issue 29: a 2.5 GB model's Hello
// made the server allocate and touch 2.5 GB). Fixing the spec plans the aggregate's layout
// without materialising it: here a 512 MB model costs the server almost nothing.
static void test_hello_of_a_huge_model_costs_no_memory(void **state) {
    (void)state;
    Rounds *r = make_rounds(2);
    reset_peak();
    size_t before = peak_resident_bytes();
    hello(r, 0, (int64_t)1 << 25, ROUNDS_OK);   // lm_head [2^25, 4]: 512 MB in F32
    const size_t after = peak_resident_bytes();
    assert_true(before > 0 && after > 0);       // /proc/self/status read
    // A kernel may report the reset peak a little above what it reports next (seen once under
    // load: the subtraction wrapped): no growth then, not 16 EB of it.
    const size_t grown = after > before ? after - before : 0;
    if (grown > ((size_t)64 << 20)) fail_msg("the Hello cost %zu MB of resident memory", grown >> 20);
    assert_true(rounds_model_bytes(r) > ((size_t)512 << 20));
    rounds_destroy(r);
}

// The state dir stops taking writes (RLIMIT_FSIZE stands in for a full disk: a write past it
// fails with EFBIG as ENOSPC would, issue 29): the aggregate that cannot be written is not lost
// and not published; the uploader hears OK, the round keeps its uploads, waiters wait, and once
// writes work again a waiter's retry writes and publishes it (byte-identical to a calm server's).
// An upload that cannot be stored is refused ROUNDS_STORAGE (gRPC UNAVAILABLE: peers retry).
static void test_full_disk_stalls_nothing(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_full_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *calm = make_rounds(2), *r = make_rounds_in(2, dir);
    hello(calm, 0, 6, ROUNDS_OK);
    hello(r, 0, 6, ROUNDS_OK);
    assert_int_equal(upload(calm, 0, 2, NULL), ROUNDS_OK);
    assert_int_equal(upload(calm, 1, 2, plus_one), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 2, NULL), ROUNDS_OK);
    struct rlimit was;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit tight = {3000, was.rlim_max};   // an upload (2464 bytes) fits, the aggregate (4288) not
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &tight), 0);
    assert_int_equal(upload(r, 1, 2, plus_one), ROUNDS_OK);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.last_aggregate_step, -1);
    assert_int_equal(st.open_step, 2);
    assert_int_equal(st.num_uploaded, 2);
    AggregateBlob *a = NULL, *b = NULL;
    assert_int_equal(rounds_get(r, 2, ROUNDS_PERSIST_RETRY_S + 0.5, &a), ROUNDS_OK);   // retried, still full
    assert_null(a);
    tight.rlim_cur = 1000;   // now an upload does not fit either
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &tight), 0);
    assert_int_equal(upload(r, 0, 4, NULL), ROUNDS_STORAGE);
    assert_non_null(strstr(spes_last_error(), "the server cannot store it now"));
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);   // space is back
    assert_int_equal(rounds_get(r, 2, 3 * ROUNDS_PERSIST_RETRY_S, &a), ROUNDS_OK);
    assert_non_null(a);
    assert_int_equal(rounds_get(calm, 2, 0, &b), ROUNDS_OK);
    assert_int_equal(a->len, b->len);
    assert_memory_equal(a->bytes, b->bytes, a->len);
    rounds_release(r, a);
    rounds_release(calm, b);
    rounds_destroy(r);
    r = make_rounds_in(2, dir);   // and it is durable
    rounds_status(r, &st);
    assert_int_equal(st.last_aggregate_step, 2);
    rounds_destroy(r);
    rounds_destroy(calm);
    signal(SIGXFSZ, SIG_DFL);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// Killed during aggregation: every upload of a round is on disk, the aggregate is not. The
// restarted server completes the round itself, byte-identical to an uninterrupted server.
static void test_restart_completes_a_full_round(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_agg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Rounds *calm = make_rounds(2), *r = make_rounds_in(2, dir);
    hello(calm, 0, 6, ROUNDS_OK);
    hello(r, 0, 6, ROUNDS_OK);
    assert_int_equal(upload(calm, 0, 2, NULL), ROUNDS_OK);
    assert_int_equal(upload(calm, 1, 2, plus_one), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 2, NULL), ROUNDS_OK);
    rounds_destroy(r);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 1, DTYPE_F32, plus_one, &bytes, &len), SPES_OK);
    model_spec_free(&spec);
    assert_int_equal(state_save_upload(dir, 2, 1, bytes, len), SPES_OK);   // on disk, never aggregated
    free(bytes);
    r = make_rounds_in(2, dir);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.last_aggregate_step, 2);
    assert_int_equal(st.rounds_completed, 1);
    assert_int_equal(count_files(dir, "u"), 0);
    AggregateBlob *a, *b;
    assert_int_equal(rounds_get(r, 2, 0, &a), ROUNDS_OK);
    assert_int_equal(rounds_get(calm, 2, 0, &b), ROUNDS_OK);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->len, b->len);
    assert_memory_equal(a->bytes, b->bytes, a->len);
    rounds_release(r, a);
    rounds_release(calm, b);
    rounds_destroy(r);
    rounds_destroy(calm);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// The adaptive deadline: max(round_timeout, 3 x median of the recent full rounds).
static void test_deadline_rule(void **state) {
    (void)state;
    double recent[ROUNDS_RECENT] = {1, 9, 2, 3};
    assert_true(rounds_deadline(5, recent, 0) == 5);
    assert_true(rounds_deadline(5, recent, 3) == 6);       // median of {1, 9, 2} = 2
    assert_true(rounds_deadline(5, recent, 4) == 7.5);     // median of {1, 2, 3, 9} = 2.5
    assert_true(rounds_deadline(10, recent, 4) == 10);
}

// A round timeout closes a round with the peers that arrived once a waiter looks after the
// deadline; not for the first round (no earlier aggregate for the missing owner's experts);
// the late peer is answered ABORTED, an included one ALREADY_EXISTS.
static void test_round_timeout_closes_partial_round(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_partial_XXXXXX";
    assert_non_null(mkdtemp(dir));
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2,
                        .round_timeout_s = 0.2, .min_peers = 1, .state_dir = dir};
    Rounds *r;
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    hello(r, 0, 6, ROUNDS_OK);
    AggregateBlob *blob;
    assert_int_equal(upload(r, 0, 2, NULL), ROUNDS_OK);
    assert_int_equal(rounds_get(r, 2, 0.4, &blob), ROUNDS_OK);
    assert_null(blob);                                     // first round: waits for everyone
    assert_int_equal(upload(r, 1, 2, NULL), ROUNDS_OK);
    assert_int_equal(upload(r, 0, 4, plus_one), ROUNDS_OK);
    double start = now_seconds();
    assert_int_equal(rounds_get(r, 4, 5, &blob), ROUNDS_OK);
    assert_non_null(blob);                                 // closed by the timeout, not after 5 s
    assert_true(now_seconds() - start < 2);
    AggregateBlob *prev;
    assert_int_equal(rounds_get(r, 2, 0, &prev), ROUNDS_OK);
    SafeTensors a, b;
    assert_int_equal(safetensors_parse(blob->bytes, blob->len, "partial", &a), SPES_OK);
    assert_int_equal(safetensors_parse(prev->bytes, prev->len, "previous", &b), SPES_OK);
    // Peer 1 (experts 2, 3) missing: its experts keep step 2's values; shared = peer 0's upload.
    const StTensor *x = safetensors_find(&a, "model.layers.0.mlp.experts.3.up_proj.weight");
    const StTensor *y = safetensors_find(&b, "model.layers.0.mlp.experts.3.up_proj.weight");
    assert_memory_equal(x->data, y->data, x->nbytes);
    float v;
    memcpy(&v, safetensors_find(&a, "model.embed_tokens.weight")->data, 4);
    assert_float_equal(v, 1.0f, 0);                        // peer 0's first value 0 + 1 (plus_one)
    safetensors_close(&a);
    safetensors_close(&b);
    rounds_release(r, blob);
    rounds_release(r, prev);
    RoundsStatus st;
    rounds_status(r, &st);
    assert_int_equal(st.rounds_partial, 1);
    assert_int_equal(st.last_round_peers, 1);
    assert_int_equal(upload(r, 1, 4, NULL), ROUNDS_CLOSED_WITHOUT_PEER);
    assert_non_null(strstr(spes_last_error(), "newest aggregate (step 4)"));
    assert_int_equal(upload(r, 0, 4, NULL), ROUNDS_ALREADY_AGGREGATED);
    rounds_destroy(r);
    // After a restart the round is still known as partial, without peer 1.
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    rounds_status(r, &st);
    assert_int_equal(st.rounds_partial, 1);
    assert_int_equal(upload(r, 1, 4, NULL), ROUNDS_CLOSED_WITHOUT_PEER);
    assert_int_equal(upload(r, 0, 4, NULL), ROUNDS_ALREADY_AGGREGATED);
    rounds_destroy(r);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

// The outer optimizer on (lr 0.7, momentum 0.9): every shared tensor of each aggregate is
// outer_opt_step applied to the plain aggregate (the mean) with the previous outer aggregate
// as theta, experts are the plain ones; a restart resumes its state bit for bit, and a
// restart with other outer settings is refused by name.
static Rounds *make_outer_rounds(const char *dir, float lr, float momentum) {
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2, .state_dir = dir,
                        .outer = {.lr = lr, .momentum = momentum}};
    Rounds *r;
    assert_int_equal(rounds_create(&cfg, &r), SPES_OK);
    return r;
}

static void round_of(Rounds *r, int step, SyncTestTweak tweak0) {
    assert_int_equal(upload(r, 0, step, tweak0), ROUNDS_OK);
    assert_int_equal(upload(r, 1, step, NULL), ROUNDS_OK);
    assert_int_equal(rounds_last_completed_step(r), step);
}

static void test_outer_optimizer_steps_the_shared_tensors(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_rounds_outer_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const OuterOptConfig oc = {.lr = 0.7f, .momentum = 0.9f};
    Rounds *plain = make_rounds(2), *outer = make_outer_rounds(dir, oc.lr, oc.momentum);
    hello(plain, 0, 6, ROUNDS_OK);
    hello(outer, 0, 6, ROUNDS_OK);
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    int64_t numel[64] = {0};
    assert_true(spec.count <= 64);
    for (int t = 0; t < spec.count; t++) numel[t] = spec.tensors[t].expert >= 0 ? 0 : (int64_t)spec.tensors[t].numel;
    OuterOptState want;
    assert_int_equal(outer_opt_state_init(&want, spec.count, numel), SPES_OK);
    float *theta[64] = {0}, *expect = malloc(spec.total_numel * sizeof(float));
    const int steps[3] = {10, 20, 30};
    const SyncTestTweak tweaks[3] = {NULL, plus_one, NULL};
    int shared_changed = 0;
    for (int i = 0; i < 3; i++) {
        round_of(plain, steps[i], tweaks[i]);
        if (i == 2) {   // restart the outer server between its rounds 20 and 30
            rounds_destroy(outer);
            Rounds *other = NULL;
            RoundsConfig bad = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                                .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2, .state_dir = dir,
                                .outer = {.lr = 0.5f, .momentum = 0.9f}};
            assert_int_equal(rounds_create(&bad, &other), SPES_ERR);
            assert_non_null(strstr(spes_last_error(), "--outer_lr 0.7"));
            outer = make_outer_rounds(dir, oc.lr, oc.momentum);
        }
        round_of(outer, steps[i], tweaks[i]);
        AggregateBlob *pb, *ob;
        assert_int_equal(rounds_get(plain, steps[i], 0, &pb), ROUNDS_OK);
        assert_int_equal(rounds_get(outer, steps[i], 0, &ob), ROUNDS_OK);
        SafeTensors ps, os;
        assert_int_equal(safetensors_parse(pb->bytes, pb->len, "plain", &ps), SPES_OK);
        assert_int_equal(safetensors_parse(ob->bytes, ob->len, "outer", &os), SPES_OK);
        for (int t = 0; t < spec.count; t++) {
            const SpecTensor *x = &spec.tensors[t];
            const StTensor *p = safetensors_find(&ps, x->name), *o = safetensors_find(&os, x->name);
            memcpy(expect, p->data, x->numel * sizeof(float));
            if (numel[t]) {
                assert_int_equal(outer_opt_step(&oc, &want, t, theta[t], expect, expect), SPES_OK);
                shared_changed += i > 0 && memcmp(expect, p->data, x->numel * sizeof(float)) != 0;
                if (!theta[t]) theta[t] = malloc(x->numel * sizeof(float));
                memcpy(theta[t], expect, x->numel * sizeof(float));
            }
            assert_memory_equal(o->data, expect, x->numel * sizeof(float));
        }
        outer_opt_end_round(&want, steps[i]);
        safetensors_close(&ps);
        safetensors_close(&os);
        rounds_release(plain, pb);
        rounds_release(outer, ob);
    }
    assert_true(shared_changed > 0);   // the outer step really moved something
    char pattern[64];
    snprintf(pattern, sizeof pattern, "%s/outer_s*.bin", dir);
    glob_t g;
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    assert_int_equal(g.gl_pathc, 2);   // pruned with the aggregates (keep_steps 2): steps 20, 30
    globfree(&g);
    for (int t = 0; t < spec.count; t++) free(theta[t]);
    free(expect);
    outer_opt_state_free(&want);
    model_spec_free(&spec);
    rounds_destroy(plain);
    rounds_destroy(outer);
    assert_int_equal(remove_tree(dir), SPES_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        // First: it forks, and OpenMP's thread pool (made by any aggregation) does not survive a fork.
        cmocka_unit_test(test_memory_independent_of_peers),
        cmocka_unit_test(test_round_completes_despite_a_bad_upload),
        cmocka_unit_test(test_keep_steps_and_long_poll),
        cmocka_unit_test(test_far_ahead_uploads_cannot_stall_or_poison),
        cmocka_unit_test(test_refusal_log_escapes_control_bytes),
        cmocka_unit_test(test_spec_inferred_without_hello),
        cmocka_unit_test(test_state_dir_survives_restart),
        cmocka_unit_test(test_restart_completes_a_full_round),
        cmocka_unit_test(test_damaged_state_dir_refused),
        cmocka_unit_test(test_aggregates_state_their_step),
        cmocka_unit_test(test_run_flags_fixed_by_state_dir),
        cmocka_unit_test(test_far_ahead_upload_file_at_restart),
        cmocka_unit_test(test_refused_upload_leaves_no_file),
        cmocka_unit_test(test_failed_aggregation_leaves_no_file),
        cmocka_unit_test(test_newest_upload_attempt_wins),
        cmocka_unit_test(test_full_round_drops_a_stale_peer_list),
        cmocka_unit_test(test_full_disk_stalls_nothing),
        cmocka_unit_test(test_hello_of_a_huge_model_costs_no_memory),
        cmocka_unit_test(test_deadline_rule),
        cmocka_unit_test(test_round_timeout_closes_partial_round),
        cmocka_unit_test(test_outer_optimizer_steps_the_shared_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
