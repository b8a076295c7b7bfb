// Checkpoints (src/train/checkpoint.c): layout, bit-exact round trip of weights, moments and
// train state, newest-complete lookup, pruning, and the errors for damaged or mismatched
// checkpoints.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "config/config.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

typedef struct {
    char dir[64];
    TrainConfig cfg;
    Model model;
    AdamW opt;
} Fixture;

static char *join(const char *a, const char *b) {
    char *p = path_join(a, b);
    assert_non_null(p);
    return p;
}

// A tiny model with random weights, experts 2..3 trainable, and non-trivial moments.
static int setup(void **state) {
    Fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/spes_ckpt_test_XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    config_defaults(&f->cfg);
    assert_int_equal(model_config_preset("tiny", &f->cfg.model), SPES_OK);
    assert_int_equal(model_create(&f->model, &f->cfg.model), SPES_OK);
    model_init_weights(&f->model, 7);
    assert_int_equal(model_set_trainable_experts(&f->model, 2, 3), SPES_OK);
    AdamWConfig ac = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    assert_int_equal(adamw_create(&f->opt, &f->model.table, &ac), SPES_OK);
    for (size_t i = 0; i < f->opt.numel; i++) {
        f->opt.m[i] = (float)i * 1e-3f - 0.5f;
        f->opt.v[i] = (float)(i % 17) * 1e-4f;
    }
    f->opt.step = 3;   // at most every sample_state step: a checkpoint never has more updates than steps
    *state = f;
    return 0;
}

static int teardown(void **state) {
    Fixture *f = *state;
    adamw_free(&f->opt);
    model_free(&f->model);
    config_free(&f->cfg);
    remove_tree(f->dir);
    free(f);
    return 0;
}

static TrainState sample_state(int64_t step) {
    return (TrainState){.step = step,
                        .tokens_seen = step * 4096,
                        .data = {.epoch = 1, .index = 24},
                        .data_seed = 6198,
                        .config_hash = 0xfedcba9876543210ull};
}

static void test_layout_and_round_trip(void **state) {
    Fixture *f = *state;
    TrainState st = sample_state(10);
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *step_dir = join(f->dir, "step10"), *tmp_dir = join(f->dir, "step10.tmp");
    assert_true(dir_exists(step_dir));
    assert_false(dir_exists(tmp_dir));
    const char *files[] = {"model.safetensors", "config.json", "config.yaml", "train_state.safetensors",
                           "train_state.json"};
    for (int i = 0; i < 5; i++) {
        char *p = join(step_dir, files[i]);
        if (!file_exists(p)) fail_msg("missing %s", p);
        free(p);
    }
    // Moments are named exp_avg.<name> / exp_avg_sq.<name>, only for trainable tensors.
    char *ts_path = join(step_dir, "train_state.safetensors");
    SafeTensors ts;
    assert_int_equal(safetensors_open(ts_path, &ts), SPES_OK);
    assert_non_null(safetensors_find(&ts, "exp_avg.model.layers.0.mlp.experts.2.gate_proj.weight"));
    assert_non_null(safetensors_find(&ts, "exp_avg_sq.lm_head.weight"));
    assert_null(safetensors_find(&ts, "exp_avg.model.layers.0.mlp.experts.0.gate_proj.weight"));
    safetensors_close(&ts);

    // Load into a fresh model + optimizer with the same trainable set: bit-identical.
    Model m2;
    AdamW o2;
    assert_int_equal(model_create(&m2, &f->cfg.model), SPES_OK);
    assert_int_equal(model_set_trainable_experts(&m2, 2, 3), SPES_OK);
    assert_int_equal(adamw_create(&o2, &m2.table, &f->opt.cfg), SPES_OK);
    TrainState back;
    assert_int_equal(checkpoint_load(step_dir, &m2, &o2, &back), SPES_OK);
    assert_memory_equal(m2.params, f->model.params, f->model.table.total_numel * sizeof(float));
    assert_memory_equal(o2.m, f->opt.m, f->opt.numel * sizeof(float));
    assert_memory_equal(o2.v, f->opt.v, f->opt.numel * sizeof(float));
    assert_int_equal(o2.step, 3);
    assert_int_equal(back.step, 10);
    assert_int_equal(back.tokens_seen, 40960);
    assert_int_equal(back.data.epoch, 1);
    assert_int_equal(back.data.index, 24);
    assert_int_equal(back.data_seed, 6198);
    assert_true(back.config_hash == 0xfedcba9876543210ull);

    // A different trainable set is refused by name, before anything is read.
    assert_int_equal(model_set_trainable_experts(&m2, 0, 1), SPES_OK);
    adamw_free(&o2);
    assert_int_equal(adamw_create(&o2, &m2.table, &f->opt.cfg), SPES_OK);
    assert_int_equal(checkpoint_load(step_dir, &m2, &o2, &back), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "trainable"));
    adamw_free(&o2);
    model_free(&m2);
    free(ts_path);
    free(step_dir);
    free(tmp_dir);
}

// checkpoint_disk_bytes is what the save writes: the two .safetensors to the byte, the small
// files inside their allowance; the checkpoint count follows saves and prunes.
static void test_disk_bytes(void **state) {
    Fixture *f = *state;
    TrainState st = sample_state(10);
    int count = -1;
    assert_int_equal(checkpoint_count(f->dir, &count), SPES_OK);
    assert_int_equal(count, 0);
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *step_dir = join(f->dir, "step10");
    const char *files[] = {"model.safetensors", "train_state.safetensors", "config.json", "config.yaml",
                           "train_state.json"};
    size_t tensors = 0, small = 0;
    for (int i = 0; i < 5; i++) {
        char *p = join(step_dir, files[i]);
        struct stat sb;
        assert_int_equal(stat(p, &sb), 0);
        *(i < 2 ? &tensors : &small) += (size_t)sb.st_size;
        free(p);
    }
    size_t planned;
    assert_int_equal(checkpoint_disk_bytes(&f->model.table, 0, &planned), SPES_OK);
    assert_true(small <= CHECKPOINT_SMALL_FILES_BYTES);
    assert_int_equal(planned, tensors + CHECKPOINT_SMALL_FILES_BYTES);
    assert_int_equal(checkpoint_disk_bytes(&f->model.table, 1000, &planned), SPES_OK);
    assert_int_equal(planned, tensors + CHECKPOINT_SMALL_FILES_BYTES + 1000);
    // Only the trainable tensors have moments: more trainable experts, a bigger train_state.
    size_t more;
    assert_int_equal(model_set_trainable_experts(&f->model, 0, 3), SPES_OK);
    assert_int_equal(checkpoint_disk_bytes(&f->model.table, 0, &more), SPES_OK);
    assert_true(more > tensors + CHECKPOINT_SMALL_FILES_BYTES);
    st.step = 20;
    assert_int_equal(model_set_trainable_experts(&f->model, 2, 3), SPES_OK);
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    assert_int_equal(checkpoint_count(f->dir, &count), SPES_OK);
    assert_int_equal(count, 2);
    free(step_dir);
}

// max_grad_norm_ratio's norm averages: saved for the tensors that have one, loaded back exactly
// (none for the rest), sized by checkpoint_norm_avg_bytes to the byte once all have one, and a
// negative one refused as damage.
static void test_norm_averages(void **state) {
    Fixture *f = *state;
    TrainState st = sample_state(10);
    const ParamTable *t = &f->model.table;
    int first = -1, second = -1;
    for (int i = 0; i < t->count; i++) {
        if (!t->entries[i].trainable) continue;
        f->opt.norm_avg[i] = 0.25f + (float)i;
        f->opt.norm_avg_set[i] = first >= 0;   // all but the first trainable tensor
        if (first < 0) first = i;
        else if (second < 0) second = i;
    }
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *step_dir = join(f->dir, "step10");
    AdamW o2;
    assert_int_equal(adamw_create(&o2, t, &f->opt.cfg), SPES_OK);
    TrainState back;
    assert_int_equal(checkpoint_load(step_dir, &f->model, &o2, &back), SPES_OK);
    for (int i = 0; i < t->count; i++) {
        assert_true(o2.norm_avg_set[i] == f->opt.norm_avg_set[i]);
        if (o2.norm_avg_set[i]) assert_true(o2.norm_avg[i] == f->opt.norm_avg[i]);
    }
    // all set: the file grows by checkpoint_norm_avg_bytes over one without any
    struct stat with, without;
    f->opt.norm_avg_set[first] = true;
    st.step = 11;
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *d11 = join(f->dir, "step11"), *p11 = join(d11, "train_state.safetensors");
    assert_int_equal(stat(p11, &with), 0);
    memset(f->opt.norm_avg_set, 0, (size_t)t->count * sizeof(bool));
    st.step = 12;
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *d12 = join(f->dir, "step12"), *p12 = join(d12, "train_state.safetensors");
    assert_int_equal(stat(p12, &without), 0);
    size_t extra;
    assert_int_equal(checkpoint_norm_avg_bytes(t, &extra), SPES_OK);
    assert_int_equal((size_t)with.st_size, (size_t)without.st_size + extra);
    // a negative average is damage
    f->opt.norm_avg_set[second] = true;
    f->opt.norm_avg[second] = -1.0f;
    st.step = 13;
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *d13 = join(f->dir, "step13");
    assert_int_equal(checkpoint_load(d13, &f->model, &o2, &back), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "grad_norm_exp_avg."));
    adamw_free(&o2);
    free(step_dir), free(d11), free(p11), free(d12), free(p12), free(d13);
}

static void test_latest_and_prune(void **state) {
    Fixture *f = *state;
    char *dir;
    int64_t step;
    assert_int_equal(checkpoint_find_latest(f->dir, &dir, &step), SPES_OK);
    assert_null(dir);
    assert_int_equal(step, -1);
    int64_t steps[] = {3, 12, 9, 20};
    for (int i = 0; i < 4; i++) {
        TrainState st = sample_state(steps[i]);
        assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    }
    // Incomplete directories never count: an interrupted save and a step dir without state.
    char *tmp = join(f->dir, "step99.tmp"), *partial = join(f->dir, "step50"), *other = join(f->dir, "step7x");
    assert_int_equal(mkdir_p(tmp), SPES_OK);
    assert_int_equal(mkdir_p(partial), SPES_OK);
    assert_int_equal(mkdir_p(other), SPES_OK);
    assert_int_equal(checkpoint_find_latest(f->dir, &dir, &step), SPES_OK);
    assert_int_equal(step, 20);
    assert_non_null(strstr(dir, "step20"));
    free(dir);

    assert_int_equal(checkpoint_prune(f->dir, 2), SPES_OK);
    char *gone3 = join(f->dir, "step3"), *gone9 = join(f->dir, "step9"), *kept12 = join(f->dir, "step12");
    assert_false(dir_exists(gone3));
    assert_false(dir_exists(gone9));
    assert_true(dir_exists(kept12));
    assert_false(dir_exists(tmp));      // leftovers of interrupted saves are cleaned
    assert_true(dir_exists(other));     // not ours: untouched
    assert_int_equal(checkpoint_remove_all(f->dir), SPES_OK);
    assert_int_equal(checkpoint_find_latest(f->dir, &dir, &step), SPES_OK);
    assert_null(dir);
    free(tmp);
    free(partial);
    free(other);
    free(gone3);
    free(gone9);
    free(kept12);
}

static void write_text(const char *path, const char *text) {
    assert_int_equal(file_write_atomic(path, text, strlen(text)), SPES_OK);
}

static void test_damaged_state(void **state) {
    Fixture *f = *state;
    TrainState st = sample_state(4);
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *dir = join(f->dir, "step4"), *json = join(dir, "train_state.json");
    TrainState back;
    write_text(json, "{\"schema_version\": 1, \"step\": \"four\"}");
    assert_int_equal(checkpoint_read_state(dir, &back), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "step"));
    write_text(json, "{not json");
    assert_int_equal(checkpoint_read_state(dir, &back), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "train_state.json"));
    write_text(json, "{\"schema_version\": 99}");
    assert_int_equal(checkpoint_read_state(dir, &back), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "schema_version"));
    // Truncated moments file: a clear error naming it, not a crash.
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *moments = join(dir, "train_state.safetensors");
    assert_int_equal(truncate(moments, 100), 0);
    assert_int_equal(checkpoint_load(dir, &f->model, &f->opt, &back), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "train_state.safetensors"));
    free(moments);
    free(json);
    free(dir);
}

// A SPES peer's local state after a failed sync round: "synced": false round-trips, ordinary
// checkpoints never carry the key, and saving the step again (synced, after the round is redone)
// replaces the directory in place with the new weights and no marker.
static void test_unsynced_marker_and_resave(void **state) {
    Fixture *f = *state;
    TrainState st = sample_state(6);
    st.unsynced = true;
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    char *dir = join(f->dir, "step6"), *json = join(dir, "train_state.json"), *tmp = join(f->dir, "step6.tmp");
    uint8_t *text;
    size_t len;
    assert_int_equal(file_read_all(json, &text, &len), SPES_OK);
    assert_non_null(strstr((char *)text, "\"synced\": false"));
    free(text);
    TrainState back;
    assert_int_equal(checkpoint_read_state(dir, &back), SPES_OK);
    assert_true(back.unsynced);

    float before = f->model.params[0];
    f->model.params[0] = before + 1.0f;   // "the aggregate"
    st.unsynced = false;
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);
    assert_false(dir_exists(tmp));
    assert_int_equal(file_read_all(json, &text, &len), SPES_OK);
    assert_null(strstr((char *)text, "synced"));
    free(text);
    assert_int_equal(checkpoint_read_state(dir, &back), SPES_OK);
    assert_false(back.unsynced);
    Model m2;
    AdamW o2;
    assert_int_equal(model_create(&m2, &f->cfg.model), SPES_OK);
    assert_int_equal(model_set_trainable_experts(&m2, 2, 3), SPES_OK);
    assert_int_equal(adamw_create(&o2, &m2.table, &f->opt.cfg), SPES_OK);
    assert_int_equal(checkpoint_load(dir, &m2, &o2, &back), SPES_OK);
    assert_true(m2.params[0] == before + 1.0f);
    adamw_free(&o2);
    model_free(&m2);

    // A marker that is not a boolean is an error naming it.
    assert_int_equal(file_read_all(json, &text, &len), SPES_OK);
    char *bad = malloc(len + 32);
    snprintf(bad, len + 32, "{\"synced\": \"no\",%s", (char *)text + 1);
    write_text(json, bad);
    free(bad);
    free(text);
    assert_int_equal(checkpoint_read_state(dir, &back), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "synced"));
    free(json);
    free(dir);
    free(tmp);
}

static int fail_extra(void *ctx, const char *dir) {
    (void)ctx, (void)dir;
    return spes_fail("the extra state could not be written (test)");
}

// A save that fails leaves no stepN.tmp behind (issue 29: a failed save on a full disk left a
// model-sized stepN.tmp until the next save or resume), and the previous checkpoint of that
// step, if any, stays. Two failures: after every file is written (save_extra fails), and in the
// middle of the weights (the file size limit: write fails with EFBIG, as on a full disk).
static void test_failed_save_cleans_up(void **state) {
    Fixture *f = *state;
    TrainState st = sample_state(12);
    char *tmp_dir = join(f->dir, "step12.tmp"), *step_dir = join(f->dir, "step12");
    st.save_extra = fail_extra;
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "saving checkpoint step 12"));
    assert_false(dir_exists(tmp_dir));
    assert_false(dir_exists(step_dir));

    st.save_extra = NULL;
    assert_int_equal(checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg), SPES_OK);   // step12 exists
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);   // EFBIG instead of the signal
    struct rlimit small = {.rlim_cur = 4096, .rlim_max = old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = checkpoint_save(f->dir, &f->model, &f->opt, &st, &f->cfg);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(rc, SPES_ERR);
    assert_false(dir_exists(tmp_dir));
    assert_true(dir_exists(step_dir));   // the complete earlier save of the step is untouched
    TrainState back;
    assert_int_equal(checkpoint_read_state(step_dir, &back), SPES_OK);
    assert_int_equal(back.step, 12);
    free(tmp_dir);
    free(step_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_layout_and_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_averages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latest_and_prune, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsynced_marker_and_resave, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_save_cleans_up, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
