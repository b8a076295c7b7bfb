// Durable parameter-server state (see server_state.h).
#include "server/server_state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"

int state_open(const char *dir, int *lock_fd) {
    // Two servers writing one state dir would interleave rounds and corrupt each other.
    char what[4200];
    snprintf(what, sizeof what, "server --state_dir %s", dir);
    return dir_lock(dir, "lock", what, "spes server", "give each server its own state dir", lock_fd);
}

void state_close(int lock_fd) {
    if (lock_fd >= 0) close(lock_fd);   // releases the lock
}

// Serialises j (consumed) atomically to dir/name.
static int save_json(const char *dir, const char *name, json_t *j) {
    char *text = j ? json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text) return spes_fail("server state: out of memory writing %s", name);
    char *path = path_join(dir, name);
    int rc = path ? file_write_atomic(path, text, strlen(text)) : SPES_ERR;
    free(path);
    free(text);
    return rc;
}

// Parses dir/name; *found false (and *out NULL) when it does not exist.
static int load_json(const char *dir, const char *name, json_t **out, bool *found) {
    *out = NULL;
    *found = false;
    char *path = path_join(dir, name);
    if (!path) return SPES_ERR;
    if (!file_exists(path)) {
        free(path);
        return SPES_OK;
    }
    json_error_t err;
    *out = json_load_file(path, 0, &err);
    int rc = *out ? SPES_OK
                  : spes_fail("server state %s: line %d: %s (a damaged state directory; move it away to start afresh)",
                              path, err.line, err.text);
    *found = *out != NULL;
    free(path);
    return rc;
}

// The `spes server` flags of AggregateConfig that decide what every aggregate holds, recorded in
// spec.json under their flag names so that a restart cannot change them silently:
//   merge_interval, merge_alpha_start, merge_decay_steps, merge_topk: the expert merge of each
//     aggregate (aggregate.h); its strength is a function of the step, so other values at a
//     restart make the rest of the run one no single run makes, not the run the dir holds;
//   expert_rotation_steps: which position holds which expert after each rotation; another
//     period moves experts to other owners than the peers' checkpoints were trained as.
// They are compared exactly, even where merging is off and the other merge flags are inert:
// "the same flags" is the rule a restart is documented by, and the simplest one to check.
// Mode, peers and experts per node are checked above; the outer optimizer below. Every other
// flag (keep_steps, round_timeout, min_peers, timeouts, sizes, binds, tokens, TLS, the status
// page) decides how and when rounds are served, never what an aggregate of given uploads holds,
// and may change at a restart. (A partial round's peers already depend on timing, not flags.)
static const struct {
    const char *flag;           // the server flag, and its key in spec.json
    size_t offset;              // of its int (or float) in AggregateConfig
    bool is_float;
    double old_default;         // what `spes server` ran without the flag
} RUN_FLAGS[] = {
    {"merge_interval", offsetof(AggregateConfig, merge_interval), false, 0},
    {"merge_alpha_start", offsetof(AggregateConfig, merge_alpha_start), true, 0},
    {"merge_decay_steps", offsetof(AggregateConfig, merge_decay_steps), false, 1000},
    {"merge_topk", offsetof(AggregateConfig, merge_topk), false, 4},
    {"expert_rotation_steps", offsetof(AggregateConfig, rotation_steps), false, 0},
};
#define N_RUN_FLAGS (sizeof RUN_FLAGS / sizeof *RUN_FLAGS)

// RUN_FLAGS[i]'s value in agg (a float or an int: exact as a double either way).
static double run_flag(const AggregateConfig *agg, size_t i) {
    const char *at = (const char *)agg + RUN_FLAGS[i].offset;
    return RUN_FLAGS[i].is_float ? (double)*(const float *)at : (double)*(const int *)at;
}

// Appends " --flag value" for RUN_FLAGS[i] to text[cap] at *at.
static void append_run_flag(char *text, size_t cap, size_t *at, size_t i, double value) {
    if (*at >= cap) return;
    int n = RUN_FLAGS[i].is_float ? snprintf(text + *at, cap - *at, " --%s %g", RUN_FLAGS[i].flag, value)
                                  : snprintf(text + *at, cap - *at, " --%s %.0f", RUN_FLAGS[i].flag, value);
    *at += n > 0 ? (size_t)n : 0;
}

// Sets agg's RUN_FLAGS in spec.json's object j.
static void set_run_flags(json_t *j, const AggregateConfig *agg) {
    for (size_t i = 0; j && i < N_RUN_FLAGS; i++) {
        double v = run_flag(agg, i);
        json_object_set_new(j, RUN_FLAGS[i].flag, RUN_FLAGS[i].is_float ? json_real(v) : json_integer((json_int_t)v));
    }
}

// Refuses a spec.json whose recorded RUN_FLAGS differ from agg's, naming the saved and the new
// values of those that differ. A key that is absent was not recorded (*unrecorded_any): spec.json
// of a server older than RUN_FLAGS, which ran the same values or not (it wrote none whatever they
// were). Such a dir still loads (refusing it would strand every run started before), with a
// warning when this server's value is not the old default, the one case where a silent change
// is possible.
static int check_run_flags(const char *dir, json_t *j, const AggregateConfig *agg, bool *unrecorded_any) {
    *unrecorded_any = false;
    char saved[512], now[512], unrecorded[512];
    size_t at_saved = 0, at_now = 0, at_unrecorded = 0;
    saved[0] = now[0] = unrecorded[0] = '\0';
    for (size_t i = 0; i < N_RUN_FLAGS; i++) {
        json_t *v = json_object_get(j, RUN_FLAGS[i].flag);
        double value = run_flag(agg, i);
        if (v && !json_is_number(v))
            return spes_fail("server state %s/spec.json: '%s' is not a number (a damaged state directory; restore "
                             "it, or move the directory away to start afresh)",
                             dir, RUN_FLAGS[i].flag);
        *unrecorded_any |= !v;
        if (!v && value != RUN_FLAGS[i].old_default) append_run_flag(unrecorded, sizeof unrecorded, &at_unrecorded, i, value);
        if (!v || json_number_value(v) == value) continue;
        append_run_flag(saved, sizeof saved, &at_saved, i, json_number_value(v));
        append_run_flag(now, sizeof now, &at_now, i, value);
    }
    if (at_unrecorded)
        log_warn("server state %s/spec.json: written by an older server, which did not record the expert merging and "
                 "rotation flags; this server runs%s and cannot check that the run did (restart with the run's flags)",
                 dir, unrecorded);
    if (!at_saved) return SPES_OK;
    return spes_fail("server state %s was written by a run with%s; this server runs%s (expert merging and rotation "
                     "cannot change mid-run: use the same values, or another --state_dir)",
                     dir, saved, now);
}

int state_save_spec(const char *dir, const AggregateConfig *agg, const OuterOptConfig *outer, const ModelSpec *spec,
                    const char *payload_name) {
    json_t *tensors = json_array();
    for (int t = 0; tensors && t < spec->count; t++) {
        const SpecTensor *x = &spec->tensors[t];
        json_t *shape = json_array();
        for (int d = 0; shape && d < x->ndim; d++) json_array_append_new(shape, json_integer(x->shape[d]));
        json_array_append_new(tensors, json_pack("{s:s, s:s, s:o}", "name", x->name, "dtype", dtype_name(x->dtype),
                                                 "shape", shape));
    }
    char fingerprint[32];
    snprintf(fingerprint, sizeof fingerprint, "%016" PRIx64, spec->fingerprint);
    json_t *j = json_pack("{s:i, s:s, s:i, s:i, s:s, s:s, s:o}", "version", 1, "mode", sync_mode_name(agg->mode),
                          "num_peers", agg->num_peers, "experts_per_node", agg->experts_per_node, "payload_dtype",
                          payload_name, "fingerprint", fingerprint, "tensors", tensors);
    if (j && !outer_opt_is_off(outer)) {
        json_object_set_new(j, "outer_lr", json_real(outer->lr));
        json_object_set_new(j, "outer_momentum", json_real(outer->momentum));
    }
    set_run_flags(j, agg);
    return save_json(dir, "spec.json", j);
}

int state_load_spec(const char *dir, const AggregateConfig *agg, const OuterOptConfig *outer, ModelSpec *spec,
                    DType *payload_dtype, const DeltaCodec **delta, bool *found) {
    json_t *j;
    model_spec_init(spec);
    *delta = NULL;
    SPES_TRY(load_json(dir, "spec.json", &j, found));
    if (!*found) return SPES_OK;
    const char *mode = NULL, *dtype = NULL, *fingerprint = NULL;
    int version = 0, peers = 0, per_node = 0;
    json_t *tensors = NULL;
    json_error_t err;
    int rc = SPES_OK;
    if (json_unpack_ex(j, &err, 0, "{s:i, s:s, s:i, s:i, s:s, s:s, s:o}", "version", &version, "mode", &mode,
                       "num_peers", &peers, "experts_per_node", &per_node, "payload_dtype", &dtype, "fingerprint",
                       &fingerprint, "tensors", &tensors) != 0 ||
        version != 1 || !json_is_array(tensors))
        rc = spes_fail("server state %s/spec.json: %s", dir, version != 1 ? "unknown version" : err.text);
    if (rc == SPES_OK && (strcmp(mode, sync_mode_name(agg->mode)) != 0 || peers != agg->num_peers ||
                          (agg->mode == SYNC_MODE_SPES && per_node != agg->experts_per_node)))
        rc = spes_fail("server state %s was written by a run with mode %s, %d peers, %d experts per node; this server "
                       "runs mode %s, --total_peers %d, --num_train_experts_per_node %d (use another --state_dir)",
                       dir, mode, peers, per_node, sync_mode_name(agg->mode), agg->num_peers, agg->experts_per_node);
    // Absent keys: a run without the outer optimizer (lr 1, momentum 0). The values went
    // through float on the way in, so comparing them as floats is exact.
    json_t *lr = json_object_get(j, "outer_lr"), *mu = json_object_get(j, "outer_momentum");
    float saved_lr = lr ? (float)json_number_value(lr) : 1.0f, saved_mu = mu ? (float)json_number_value(mu) : 0.0f;
    if (rc == SPES_OK && (saved_lr != outer->lr || saved_mu != outer->momentum))
        rc = spes_fail("server state %s was written by a run with --outer_lr %g --outer_momentum %g; this server runs "
                       "--outer_lr %g --outer_momentum %g (the outer optimizer cannot change mid-run: use the same "
                       "values, or another --state_dir)",
                       dir, (double)saved_lr, (double)saved_mu, (double)outer->lr, (double)outer->momentum);
    bool unrecorded = false;
    if (rc == SPES_OK) rc = check_run_flags(dir, j, agg, &unrecorded);
    *delta = rc == SPES_OK ? delta_codec_by_wire(dtype) : NULL;   // "I8", "I4": a delta run
    if (rc == SPES_OK && *delta) *payload_dtype = DTYPE_I8;
    else if (rc == SPES_OK) rc = dtype_from_name(dtype, payload_dtype);
    size_t i;
    json_t *x;
    json_array_foreach(tensors, i, x) {
        if (rc != SPES_OK) break;
        const char *name, *tdtype;
        json_t *shape;
        DType dt;
        int64_t dims[ST_MAX_DIMS];
        if (json_unpack_ex(x, &err, 0, "{s:s, s:s, s:o}", "name", &name, "dtype", &tdtype, "shape", &shape) != 0 ||
            !json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS) {
            rc = spes_fail("server state %s/spec.json: tensor %zu is malformed", dir, i);
            break;
        }
        for (size_t d = 0; d < json_array_size(shape); d++) dims[d] = json_integer_value(json_array_get(shape, d));
        rc = dtype_from_name(tdtype, &dt);
        if (rc == SPES_OK) rc = model_spec_add(spec, name, dt, (int)json_array_size(shape), dims);
    }
    if (rc == SPES_OK) rc = model_spec_finish(spec);
    char expected[32];
    snprintf(expected, sizeof expected, "%016" PRIx64, spec->fingerprint);
    if (rc == SPES_OK && strcmp(expected, fingerprint) != 0)
        rc = spes_fail("server state %s/spec.json: fingerprint %s does not match its tensors (%s)", dir, fingerprint,
                       expected);
    // An older server's spec.json gets this server's flags, so that from this restart on a change is
    // refused instead of passing with a warning at every restart.
    if (rc == SPES_OK && unrecorded) {
        set_run_flags(j, agg);
        rc = save_json(dir, "spec.json", json_incref(j));
        if (rc == SPES_OK)
            log_info("server state %s/spec.json: recorded this server's expert merging and rotation flags; later "
                     "restarts must keep them", dir);
    }
    json_decref(j);
    if (rc != SPES_OK) {
        model_spec_free(spec);
        *found = false;
    }
    return rc;
}

const StateKept *state_book_find(const StateBook *book, int step) {
    for (int i = 0; i < book->n_kept; i++)
        if (book->kept[i].step == step) return &book->kept[i];
    return NULL;
}

// The fixed text form of a book's fields that its "check" covers.
static uint32_t book_check(const StateBook *book) {
    size_t cap = 128 + (size_t)book->n_kept * 96;
    char *text = spes_malloc(cap);
    if (!text) return 0;   // never a file's check: the load refuses, the save writes a check that fails
    int at = snprintf(text, cap, "rounds.json v2 %d %" PRId64 " %" PRId64 " %d", book->last_completed_step,
                      book->rounds_completed, book->rounds_partial, book->n_kept);
    for (int i = 0; i < book->n_kept && (size_t)at < cap; i++) {
        const StateKept *k = &book->kept[i];
        at += snprintf(text + at, cap - (size_t)at, " %d:%" PRIu64 ":%08x:%d:%" PRIu64 ":%08x", k->step, k->bytes,
                       k->crc32c, k->has_delta, k->delta_bytes, k->delta_crc32c);
    }
    uint32_t crc = crc32c(text, (size_t)at < cap ? (size_t)at : cap);
    free(text);
    return crc;
}

int state_save_book(const char *dir, const StateBook *book) {
    json_t *kept = json_array();
    for (int i = 0; kept && i < book->n_kept; i++) {
        const StateKept *k = &book->kept[i];
        json_t *e = json_pack("{s:i, s:I, s:I}", "step", k->step, "bytes", (json_int_t)k->bytes, "crc32c",
                              (json_int_t)k->crc32c);
        if (e && k->has_delta) {
            json_object_set_new(e, "delta_bytes", json_integer((json_int_t)k->delta_bytes));
            json_object_set_new(e, "delta_crc32c", json_integer((json_int_t)k->delta_crc32c));
        }
        json_array_append_new(kept, e);
    }
    json_t *j = json_pack("{s:i, s:i, s:I, s:I, s:o, s:I}", "version", 2, "last_completed_step",
                          book->last_completed_step, "rounds_completed", (json_int_t)book->rounds_completed,
                          "rounds_partial", (json_int_t)book->rounds_partial, "aggregates", kept, "check",
                          (json_int_t)book_check(book));
    return save_json(dir, "rounds.json", j);
}

// One entry of rounds.json's "aggregates"; false when malformed.
static bool load_kept(json_t *e, StateKept *k) {
    json_int_t step, bytes, crc, delta_bytes = 0, delta_crc = 0;
    json_error_t err;
    if (json_unpack_ex(e, &err, 0, "{s:I, s:I, s:I, s?I, s?I}", "step", &step, "bytes", &bytes, "crc32c", &crc,
                       "delta_bytes", &delta_bytes, "delta_crc32c", &delta_crc) != 0 ||
        step < 0 || step > INT32_MAX || bytes < 0 || crc < 0 || crc > UINT32_MAX || delta_bytes < 0 || delta_crc < 0 ||
        delta_crc > UINT32_MAX)
        return false;
    *k = (StateKept){.step = (int)step, .bytes = (uint64_t)bytes, .crc32c = (uint32_t)crc,
                     .has_delta = json_object_get(e, "delta_bytes") != NULL, .delta_bytes = (uint64_t)delta_bytes,
                     .delta_crc32c = (uint32_t)delta_crc};
    return true;
}

// What every rounds.json a server wrote satisfies, whatever its check says (a file rewritten with a
// matching check, or a version 1 one, has none to trust): the counters and steps agree with each
// other, and no kept aggregate lies past the last completed step (the restart would delete it).
#define BOOK_DAMAGED "the file was edited or is damaged (restore it, or move the state dir away to start afresh)"
static int check_book(const char *dir, const StateBook *book) {
    const char *bad = book->last_completed_step < -1                                 ? "last_completed_step is below -1"
                      : book->rounds_completed < 0 || book->rounds_partial < 0       ? "a round count is negative"
                      : book->rounds_partial > book->rounds_completed                ? "more partial rounds than rounds"
                      : (book->last_completed_step >= 0) != (book->rounds_completed > 0)
                          ? "last_completed_step and rounds_completed disagree (one says no round completed)"
                          : NULL;
    for (int i = 0; !bad && i < book->n_kept; i++) {
        if (book->kept[i].step > book->last_completed_step)
            return spes_fail("server state %s/rounds.json: aggregates entry %d (step %d) is past last_completed_step "
                             "%d: " BOOK_DAMAGED,
                             dir, i, book->kept[i].step, book->last_completed_step);
        for (int j = 0; j < i; j++)
            if (book->kept[j].step == book->kept[i].step)
                return spes_fail("server state %s/rounds.json: aggregates entries %d and %d both name step %d: "
                                 BOOK_DAMAGED, dir, j, i, book->kept[i].step);
    }
    if (!bad) return SPES_OK;
    return spes_fail("server state %s/rounds.json: %s (last_completed_step %d, rounds_completed %lld, rounds_partial "
                     "%lld): " BOOK_DAMAGED,
                     dir, bad, book->last_completed_step, (long long)book->rounds_completed,
                     (long long)book->rounds_partial);
}
#undef BOOK_DAMAGED

int state_load_book(const char *dir, StateBook *book, bool *found) {
    json_t *j;
    memset(book, 0, sizeof *book);
    book->last_completed_step = -1;
    SPES_TRY(load_json(dir, "rounds.json", &j, found));
    if (!*found) return SPES_OK;
    json_int_t completed = 0, partial = 0, check = -1;
    int version = 0;
    json_t *kept = NULL;
    json_error_t err;
    int rc = json_unpack_ex(j, &err, 0, "{s:i, s:i, s:I, s:I, s?o, s?I}", "version", &version, "last_completed_step",
                            &book->last_completed_step, "rounds_completed", &completed, "rounds_partial", &partial,
                            "aggregates", &kept, "check", &check) == 0
                 ? SPES_OK
                 : spes_fail("server state %s/rounds.json: %s", dir, err.text);
    book->rounds_completed = completed;
    book->rounds_partial = partial;
    if (rc == SPES_OK && version == 1) {
        log_warn("server state %s/rounds.json: written by an older server (version 1): the kept aggregates carry no "
                 "checksum and are reloaded unverified",
                 dir);
    } else if (rc == SPES_OK && version == 2) {
        size_t i;
        json_t *e;
        if (!json_is_array(kept) || json_array_size(kept) > STATE_MAX_KEPT)
            rc = spes_fail("server state %s/rounds.json: 'aggregates' must be a list of at most %d", dir, STATE_MAX_KEPT);
        json_array_foreach(rc == SPES_OK ? kept : NULL, i, e) {
            if (!load_kept(e, &book->kept[i])) {
                rc = spes_fail("server state %s/rounds.json: aggregates entry %zu is malformed", dir, i);
                break;
            }
            book->n_kept = (int)i + 1;
        }
        if (rc == SPES_OK && (check < 0 || (uint32_t)check != book_check(book)))
            rc = spes_fail("server state %s/rounds.json: its check does not match its content: the file was edited or "
                           "is damaged (restore it, or move the state dir away to start afresh)",
                           dir);
        book->verified = rc == SPES_OK;
    } else if (rc == SPES_OK) {
        rc = spes_fail("server state %s/rounds.json: unknown version %d", dir, version);
    }
    if (rc == SPES_OK) rc = check_book(dir, book);
    json_decref(j);
    return rc;
}

char *state_file_path(const char *dir, const StateFile *f) {
    char name[64];
    if (f->kind == 'u') snprintf(name, sizeof name, "upload_s%d_p%d.safetensors", f->step, f->peer);
    else snprintf(name, sizeof name, "aggregate_s%d.safetensors", f->step);
    return path_join(dir, name);
}

static int save_file(const char *dir, const StateFile *f, const uint8_t *bytes, size_t len) {
    char *path = state_file_path(dir, f);
    int rc = path ? file_write_atomic(path, bytes, len) : SPES_ERR;
    free(path);
    return rc;
}

static void remove_file(const char *dir, const StateFile *f) {
    char *path = state_file_path(dir, f);
    if (path && unlink(path) != 0 && errno != ENOENT) log_warn("server state: cannot remove %s: %s", path, strerror(errno));
    free(path);
}

int state_save_upload(const char *dir, int step, int peer, const uint8_t *bytes, size_t len) {
    return save_file(dir, &(StateFile){'u', step, peer}, bytes, len);
}
int state_save_aggregate(const char *dir, int step, const uint8_t *bytes, size_t len) {
    return save_file(dir, &(StateFile){'a', step, -1}, bytes, len);
}
int state_upload_open(const char *dir, int step, int peer, StateUpload *up) {
    static _Atomic unsigned long counter;
    memset(up, 0, sizeof *up);
    up->fd = -1;
    up->step = step;
    up->peer = peer;
    char name[128];
    snprintf(name, sizeof name, "upload_s%d_p%d.safetensors.part.%ld.%lu", step, peer, (long)getpid(), ++counter);
    up->dir = spes_strdup(dir);
    up->temp_path = up->dir ? path_join(dir, name) : NULL;
    if (!up->temp_path) {
        state_upload_abort(up);
        return SPES_ERR;
    }
    up->fd = open(up->temp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (up->fd < 0) {
        int rc = spes_fail("server: cannot create %s: %s", up->temp_path, strerror(errno));
        free(up->temp_path);
        up->temp_path = NULL;   // not ours to remove
        state_upload_abort(up);
        return rc;
    }
    return SPES_OK;
}

int state_upload_append(StateUpload *up, const void *data, size_t len) {
    int err = fd_write_all(up->fd, data, len);
    if (err) return spes_fail("server: cannot write %s: %s", up->temp_path, strerror(err));
    up->len += len;
    return SPES_OK;
}

int state_upload_flush(StateUpload *up) {
    int rc = fsync(up->fd) == 0 ? SPES_OK : spes_fail("server: cannot flush %s: %s", up->temp_path, strerror(errno));
    if (close(up->fd) != 0 && rc == SPES_OK) rc = spes_fail("server: cannot close %s: %s", up->temp_path, strerror(errno));
    up->fd = -1;
    return rc;
}

int state_upload_commit(StateUpload *up) {
    char *final = state_file_path(up->dir, &(StateFile){'u', up->step, up->peer});
    int rc = final ? SPES_OK : SPES_ERR;
    if (rc == SPES_OK && up->fd >= 0) rc = spes_fail("server: %s committed before it was flushed", up->temp_path);
    if (rc == SPES_OK && rename(up->temp_path, final) != 0)
        rc = spes_fail("server: cannot rename %s to %s: %s", up->temp_path, final, strerror(errno));
    if (rc == SPES_OK) {
        free(up->temp_path);
        up->temp_path = NULL;   // nothing left to remove
        int dfd = open(up->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) != 0) rc = spes_fail("server: cannot sync directory %s: %s", up->dir, strerror(errno));
        if (dfd >= 0) close(dfd);
    }
    free(final);
    state_upload_abort(up);
    return rc;
}

void state_upload_abort(StateUpload *up) {
    if (up->fd >= 0) close(up->fd);
    if (up->temp_path) unlink(up->temp_path);
    free(up->temp_path);
    free(up->dir);
    up->fd = -1;
    up->temp_path = NULL;
    up->dir = NULL;
}

void state_remove_partial(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int step, peer, used = 0;
        if (sscanf(e->d_name, "upload_s%d_p%d.safetensors.part.%n", &step, &peer, &used) != 2 || !used) continue;
        char *path = path_join(dir, e->d_name);
        if (path && unlink(path) != 0 && errno != ENOENT)
            log_warn("server state: cannot remove %s: %s", path, strerror(errno));
        free(path);
    }
    closedir(d);
}

void state_remove_upload(const char *dir, int step, int peer) { remove_file(dir, &(StateFile){'u', step, peer}); }

void state_set_aside_upload(const char *dir, int step, int peer, const char *suffix, const char *why) {
    char *path = state_file_path(dir, &(StateFile){'u', step, peer});
    size_t n = path ? strlen(path) + strlen(suffix) + 2 : 0;
    char *aside = path ? spes_malloc(n) : NULL;
    if (aside) snprintf(aside, n, "%s.%s", path, suffix);
    if (aside && rename(path, aside) == 0)
        log_warn("server state: %s %s; moved aside to %s", path, why, aside);
    else if (path)
        log_warn("server state: %s %s and cannot be moved aside: %s; ignored", path, why, strerror(errno));
    free(aside);
    free(path);
}
static char *included_name(int step) {
    char *name = spes_malloc(48);
    if (name) snprintf(name, 48, "aggregate_s%d.peers.json", step);
    return name;
}

// The files kept beside an aggregate (server_state.h: StateBlob): the name of each from its step,
// and what a missing one is.
static const struct {
    const char *name;           // printf pattern of the step
    const char *what;           // NULL: a missing file reads as none; else what it holds, to name it
} BLOBS[] = {
    [STATE_BLOB_DELTA] = {"aggregate_s%d.int8.safetensors", NULL},
    [STATE_BLOB_OUTER] = {"outer_s%d.bin", "the outer optimizer's state"},
};

static char *blob_path(const char *dir, StateBlob blob, int step) {
    char name[64];
    snprintf(name, sizeof name, BLOBS[blob].name, step);
    return path_join(dir, name);
}

int state_save_blob(const char *dir, StateBlob blob, int step, const uint8_t *bytes, size_t len) {
    char *path = blob_path(dir, blob, step);
    int rc = path ? file_write_atomic(path, bytes, len) : SPES_ERR;
    free(path);
    return rc;
}

int state_load_blob(const char *dir, StateBlob blob, int step, uint8_t **bytes, size_t *len) {
    *bytes = NULL;
    *len = 0;
    char *path = blob_path(dir, blob, step);
    if (!path) return SPES_ERR;
    int rc = file_exists(path) ? file_read_all(path, bytes, len)
             : !BLOBS[blob].what
                 ? SPES_OK
                 : spes_fail("server state: %s is missing (%s after step %d, the newest aggregate; a damaged state "
                             "directory?)",
                             path, BLOBS[blob].what, step);
    free(path);
    return rc;
}

void state_remove_aggregate(const char *dir, int step) {
    remove_file(dir, &(StateFile){'a', step, -1});
    if (state_remove_included(dir, step) != SPES_OK) log_warn("%s", spes_last_error());
    for (size_t b = 0; b < sizeof BLOBS / sizeof *BLOBS; b++) {
        char *path = blob_path(dir, (StateBlob)b, step);
        if (path && unlink(path) != 0 && errno != ENOENT) log_warn("server state: cannot remove %s: %s", path, strerror(errno));
        free(path);
    }
}

int state_remove_included(const char *dir, int step) {
    char *name = included_name(step), *path = name ? path_join(dir, name) : NULL;
    int rc = !path ? SPES_ERR
             : unlink(path) != 0 && errno != ENOENT ? spes_fail("server state: cannot remove %s: %s", path, strerror(errno))
                                                    : SPES_OK;
    free(path);
    free(name);
    return rc;
}

int state_save_included(const char *dir, int step, const bool *included, int num_peers) {
    json_t *peers = json_array();
    for (int p = 0; peers && p < num_peers; p++)
        if (included[p]) json_array_append_new(peers, json_integer(p));
    char *name = included_name(step);
    int rc = name ? save_json(dir, name, json_pack("{s:i, s:o}", "step", step, "peers", peers)) : SPES_ERR;
    free(name);
    return rc;
}

int state_load_included(const char *dir, int step, int num_peers, bool **included) {
    *included = NULL;
    char *name = included_name(step);
    if (!name) return SPES_ERR;
    json_t *j;
    bool found;
    int rc = load_json(dir, name, &j, &found);
    json_t *peers = found ? json_object_get(j, "peers") : NULL;
    if (rc == SPES_OK && found && !json_is_array(peers)) rc = spes_fail("server state %s/%s: no peers list", dir, name);
    if (rc == SPES_OK && found && !(*included = spes_calloc((size_t)num_peers, sizeof(bool)))) rc = SPES_ERR;
    size_t i;
    json_t *x;
    if (rc == SPES_OK && found) json_array_foreach(peers, i, x) {
        json_int_t p = json_integer_value(x);
        if (!json_is_integer(x) || p < 0 || p >= num_peers) {
            rc = spes_fail("server state %s/%s: peer %zu is not in [0, %d)", dir, name, i, num_peers);
            break;
        }
        (*included)[p] = true;
    }
    if (rc != SPES_OK) {
        free(*included);
        *included = NULL;
    }
    json_decref(j);
    free(name);
    return rc;
}

static int compare_files(const void *a, const void *b) {
    const StateFile *x = a, *y = b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->peer > y->peer) - (x->peer < y->peer);
}

int state_list(const char *dir, StateFile **out, int *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return spes_fail("server state: cannot list %s: %s", dir, strerror(errno));
    int cap = 0, rc = SPES_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        StateFile f;
        int used = 0;
        if (sscanf(e->d_name, "upload_s%d_p%d.safetensors%n", &f.step, &f.peer, &used) == 2 && !e->d_name[used])
            f.kind = 'u';
        else if (sscanf(e->d_name, "aggregate_s%d.safetensors%n", &f.step, &used) == 1 && !e->d_name[used])
            f.kind = 'a', f.peer = -1;
        else
            continue;   // spec.json, rounds.json, temp files of an interrupted write
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            StateFile *grown = spes_realloc(*out, (size_t)cap * sizeof **out);
            if (!grown) {
                rc = SPES_ERR;
                break;
            }
            *out = grown;
        }
        (*out)[(*count)++] = f;
    }
    closedir(d);
    if (rc != SPES_OK) {
        free(*out);
        *out = NULL;
        *count = 0;
        return rc;
    }
    if (*count) qsort(*out, (size_t)*count, sizeof **out, compare_files);
    return SPES_OK;
}

int state_read(const char *dir, const StateFile *f, uint8_t **bytes, size_t *len) {
    char *path = state_file_path(dir, f);
    int rc = path ? file_read_all(path, bytes, len) : SPES_ERR;
    free(path);
    return rc;
}
