// Reloading the parameter server's round state from its state dir at start (rounds.h:
// rounds_create with cfg->state_dir): the model spec, the round bookkeeping, the kept aggregates
// (with their int8 deltas and the outer optimizer's state) and the uploads of open rounds,
// completing any round whose uploads were all in before the crash. The files and their atomic
// writes are server_state.c's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/error.h"
#include "base/log.h"
#include "sync/aggregate_step.h"
#include "sync/delta_payload.h"
#include "server/rounds_internal.h"
#include "server/server_state.h"

// Loads one upload file of an open round into it (aggregating when it completes the round);
// *taken false when it was set aside: its bytes were bad, its step is beyond the run's window
// (a bogus step, or a far-ahead peer's upload kept by a crash before the round that would have
// dropped it), or lower steps hold every open-round slot (an upload never acknowledged). The
// running server drops or refuses such an upload (rounds_sweep_rounds, no_room); refusing to start
// instead would keep the whole run down for one file. Every other failure names the file.
static int restore_upload(Rounds *r, const StateFile *f, bool *taken) {
    *taken = false;
    uint8_t *bytes;
    size_t len;
    SPES_TRY(state_read(r->cfg.state_dir, f, &bytes, &len));
    SafeTensors st;
    const StTensor **row = spes_calloc((size_t)r->spec.count, sizeof *row);
    if (!row) {
        free(bytes);
        return SPES_ERR;
    }
    RoundsResult code = f->peer >= r->cfg.agg.num_peers ? rounds_fail(ROUNDS_BAD_REQUEST, "peer %d is out of range", f->peer)
                                                        : rounds_check_upload(r, f->peer, f->step, bytes, len, &st, row);
    if (code == ROUNDS_OK) safetensors_close(&st);
    free(row);
    free(bytes);   // the file stays: the round reads it back when it aggregates
    OpenRound *round = NULL;
    bool complete = false;
    bool checked = code == ROUNDS_OK;
    if (checked) code = rounds_store_upload(r, f->peer, f->step, len, &round, &complete);
    char why[1024];
    if (code == ROUNDS_BAD_REQUEST) {
        snprintf(why, sizeof why, "is damaged (%s): peer %d must upload step %d again", spes_last_error(), f->peer,
                 f->step);
        state_set_aside_upload(r->cfg.state_dir, f->step, f->peer, "damaged", why);
        return SPES_OK;
    }
    if (code == ROUNDS_TOO_FAR_AHEAD) {
        snprintf(why, sizeof why, "is beyond the run's window (%s); the running server drops such a round",
                 spes_last_error());
        state_set_aside_upload(r->cfg.state_dir, f->step, f->peer, "far-ahead", why);
        return SPES_OK;
    }
    // Every open-round slot taken by lower steps (files are taken in step order): the running
    // server refuses such an upload at its first message and removes the files of a round it
    // evicts, so this one was never acknowledged (a crash between its commit and its store) or
    // was copied in. As the running server would, the lower steps keep the slots.
    if (checked && code == ROUNDS_NO_ROOM) {
        snprintf(why, sizeof why, "finds no open-round slot (%s); never acknowledged to its peer (a crash between its "
                 "write and its bookkeeping), peer %d uploads step %d again if the run still needs it",
                 spes_last_error(), f->peer, f->step);
        state_set_aside_upload(r->cfg.state_dir, f->step, f->peer, "no-slot", why);
        return SPES_OK;
    }
    if (code != ROUNDS_OK) {
        char *path = state_file_path(r->cfg.state_dir, f);
        int rc = spes_fail_context("server state: %s (peer %d, step %d)", path ? path : r->cfg.state_dir, f->peer, f->step);
        free(path);
        return rc;
    }
    *taken = true;
    if (complete && rounds_complete_round(r, round, f->peer) != ROUNDS_OK) return SPES_ERR;
    return SPES_OK;
}

// The delta kept beside an aggregate, in the run's codec (none: peers take that aggregate whole).
// sum: what rounds.json recorded of it (NULL: a version 1 book, unverified).
static int restore_delta(Rounds *r, AggregateBlob *blob, int step, const StateKept *sum) {
    SPES_TRY(state_load_blob(r->cfg.state_dir, STATE_BLOB_DELTA, step, &blob->delta, &blob->delta_len));
    if (!blob->delta) return SPES_OK;
    char what[96];
    snprintf(what, sizeof what, "server state %s: %s delta of step %d", r->cfg.state_dir, r->delta->name, step);
    SafeTensors st;
    const DeltaCodec *codec = NULL;
    int base = -1;
    blob->delta_crc32c = crc32c(blob->delta, blob->delta_len);
    int rc = sum && (!sum->has_delta || sum->delta_bytes != blob->delta_len || sum->delta_crc32c != blob->delta_crc32c)
                 ? spes_fail("%s: does not match its checksum in rounds.json", what)
                 : SPES_OK;
    if (rc == SPES_OK) rc = safetensors_parse(blob->delta, blob->delta_len, what, &st);
    if (rc == SPES_OK) {
        rc = delta_payload_kind(&st, what, &codec, &base);
        if (rc == SPES_OK && (codec != r->delta || base >= step))
            rc = spes_fail("%s: not an %s delta against an earlier step", what, r->delta->name);
        safetensors_close(&st);
    }
    if (rc != SPES_OK) {   // damaged: serve the aggregate whole instead
        log_warn("server: %s; peers will download step %d whole", spes_last_error(), step);
        free(blob->delta);
        blob->delta = NULL;
        return SPES_OK;
    }
    blob->delta_base = base;
    return SPES_OK;
}

// An aggregate read back from the state dir against what rounds.json recorded of it (sum; NULL:
// a version 1 book, unverified), so that a damaged file, or an older aggregate's bytes copied over
// it, is never served (with the outer optimizer, its NaN would flow into every later round).
static int check_aggregate(const char *dir, int step, AggregateBlob *blob, const StateKept *sum) {
    blob->crc32c = crc32c(blob->bytes, blob->len);
    if (!sum || (sum->bytes == blob->len && sum->crc32c == blob->crc32c)) return SPES_OK;
    return spes_fail("server state %s: aggregate_s%d.safetensors does not match rounds.json (%zu bytes, crc32c %08x; "
                     "recorded: %llu bytes, crc32c %08x): the file is damaged or was replaced; restore it, or move the "
                     "state dir away to start afresh",
                     dir, step, blob->len, blob->crc32c, (unsigned long long)sum->bytes, sum->crc32c);
}

// Where a reloaded aggregate's tensors begin (blob->header_len): its header states its step or
// none (one written before aggregates stated their step: served as it is, peers take it), within
// the room planned for the widest step, and its tensors are the model's, in spec order and the
// payload dtype. Its bytes then get room for aggregate_cap, like every blob's (the spare).
static int reloaded_layout(Rounds *r, int step, AggregateBlob *blob) {
    char what[160];
    snprintf(what, sizeof what, "server state %s: aggregate_s%d.safetensors", r->cfg.state_dir, step);
    SafeTensors st;
    if (safetensors_parse(blob->bytes, blob->len, what, &st) != SPES_OK)
        return spes_fail_context("damaged state directory?");
    int stated = -1, rc = sync_aggregate_stated_step(&st, what, &stated);
    size_t header_len = blob->len >= r->data_len ? blob->len - r->data_len : 0;
    const char *bad = rc != SPES_OK                                          ? NULL
                      : stated >= 0 && stated != step                        ? "it states another step"
                      : st.count != r->spec.count || header_len < 8 || header_len > r->header_cap ? "another size"
                                                                                                  : NULL;
    for (int t = 0; rc == SPES_OK && !bad && t < st.count; t++) {
        const StTensor *x = &st.tensors[t];   // in file order
        if (strcmp(x->name, r->spec.tensors[t].name) != 0 || x->dtype != r->payload_dtype ||
            x->numel != r->spec.tensors[t].numel)
            bad = "tensors other than the model's, in its order and payload dtype";
    }
    safetensors_close(&st);
    if (rc != SPES_OK) return rc;
    if (bad)
        return spes_fail("%s: %s (%zu bytes; the model's aggregate has %zu data bytes): a damaged state directory?",
                         what, bad, blob->len, r->data_len);
    uint8_t *bytes = realloc(blob->bytes, r->aggregate_cap);
    if (!bytes) return spes_fail("%s: out of memory", what);
    blob->bytes = bytes;
    blob->header_len = header_len;
    return SPES_OK;
}

// The outer optimizer's state after the newest reloaded aggregate (outer_s<step>.bin), or a
// fresh one when no aggregate was kept. A missing or damaged file is an error naming it.
static int restore_outer(Rounds *r) {
    int newest = -1;
    for (int i = 0; i < r->cfg.keep_steps; i++)
        if (r->kept[i] && r->kept[i]->step > newest) newest = r->kept[i]->step;
    if (newest < 0) return SPES_OK;   // adopt_spec made a fresh state
    uint8_t *bytes;
    size_t len;
    SPES_TRY(state_load_blob(r->cfg.state_dir, STATE_BLOB_OUTER, newest, &bytes, &len));
    char what[96];
    snprintf(what, sizeof what, "server state %s: outer_s%d.bin", r->cfg.state_dir, newest);
    int64_t *numel = rounds_outer_numel(r);
    outer_opt_state_free(&r->outer);
    int rc = numel ? outer_opt_state_restore(&r->outer, bytes, len, r->spec.count, numel, what) : SPES_ERR;
    if (rc == SPES_OK && r->outer.last_step != newest)
        rc = spes_fail("%s: holds the state after step %lld, not %d", what, (long long)r->outer.last_step, newest);
    free(numel);
    free(bytes);
    return rc;
}

// The bookkeeping from rounds.json (publishing the reloaded aggregates counted them again).
static void apply_book(Rounds *r, const StateBook *book) {
    r->last_completed_step = book->last_completed_step;
    r->stats.last_aggregate_step = book->last_completed_step;
    r->stats.rounds_completed = book->rounds_completed;
    r->rounds_partial = book->rounds_partial;
    r->stats.rounds_partial = book->rounds_partial;
}

// Reloads the state dir (see rounds_create): spec, bookkeeping, the newest keep_steps
// aggregates, then the uploads of rounds not yet aggregated. Leftovers of a crash between two
// writes (uploads of completed steps, aggregates not yet in rounds.json, aggregates beyond
// keep_steps) are removed.
int rounds_restore_state(Rounds *r) {
    const char *dir = r->cfg.state_dir;
    SPES_TRY(state_open(dir, &r->lock_fd));
    r->upload_dir = (char *)dir;
    state_remove_partial(dir);   // uploads a crash interrupted: never acknowledged
    ModelSpec spec;
    DType dtype;
    const DeltaCodec *delta;
    bool found;
    SPES_TRY(state_load_spec(dir, &r->cfg.agg, &r->cfg.outer, &spec, &dtype, &delta, &found));
    if (!found) {
        // spec.json is written first of all, so rounds or uploads without it mean the directory
        // lost files: starting afresh would silently drop (and later overwrite) that run.
        StateBook book;
        StateFile *files;
        int n;
        SPES_TRY(state_load_book(dir, &book, &found));
        SPES_TRY(state_list(dir, &files, &n));
        free(files);
        if (found || n > 0)
            return spes_fail("server state %s: %s but no spec.json (a damaged state directory; restore spec.json, or "
                             "move the directory away to start afresh)",
                             dir, found ? "rounds.json" : "upload or aggregate files");
        log_info("server: state dir %s holds no run yet; starting afresh", dir);
        return SPES_OK;
    }
    pthread_mutex_lock(&r->mu);
    RoundsResult code = rounds_adopt_spec(r, &spec, dtype, delta, false);
    pthread_mutex_unlock(&r->mu);
    model_spec_free(&spec);
    if (code != ROUNDS_OK) return spes_fail_context("server state %s/spec.json", dir);
    StateBook book;
    SPES_TRY(state_load_book(dir, &book, &found));
    StateFile *files;
    int n;
    SPES_TRY(state_list(dir, &files, &n));
    // Without rounds.json no round was ever recorded: an aggregate is then a crash's leftover of a
    // round written just before its bookkeeping, whose uploads stay until rounds.json records it.
    // One without uploads means rounds.json was lost: removing it (as a leftover) would silently
    // drop the run's aggregates and restart the rounds from nothing.
    for (int i = 0; !found && i < n; i++) {
        if (files[i].kind != 'a') continue;
        bool uploads = false;
        for (int j = 0; j < n; j++) uploads |= files[j].kind == 'u' && files[j].step == files[i].step;
        if (uploads) continue;
        int step = files[i].step;
        free(files);
        return spes_fail("server state %s: aggregate_s%d.safetensors but no rounds.json (and no upload of step %d: not "
                         "a round cut short by a crash); a damaged state directory: restore rounds.json, or move the "
                         "directory away to start afresh",
                         dir, step, step);
    }
    // Each round writes its aggregate before rounds.json: the newest step it names must be there.
    bool newest_found = book.last_completed_step < 0;
    for (int i = 0; i < n; i++) newest_found |= files[i].kind == 'a' && files[i].step == book.last_completed_step;
    if (!newest_found) {
        free(files);
        return spes_fail("server state %s: rounds.json names step %d as the last completed, but its aggregate "
                         "(aggregate_s%d.safetensors) is missing (a damaged state directory: restore the file, or "
                         "move the directory away to start afresh)",
                         dir, book.last_completed_step, book.last_completed_step);
    }
    int durable = 0, kept = 0, reopened = 0, rc = SPES_OK;
    bool book_applied = false;
    for (int i = 0; i < n; i++) durable += files[i].kind == 'a' && files[i].step <= book.last_completed_step;
    for (int i = 0; i < n && rc == SPES_OK; i++) {   // sorted: aggregates by step, then uploads by step
        const StateFile *f = &files[i];
        if (f->kind == 'a') {
            bool keep = f->step <= book.last_completed_step && durable-- <= r->cfg.keep_steps;
            if (!keep) {
                state_remove_aggregate(dir, f->step);
                continue;
            }
            const StateKept *sum = book.verified ? state_book_find(&book, f->step) : NULL;
            if (book.verified && !sum) {   // kept but never recorded: a leftover (--keep_steps grew)
                log_warn("server state %s: aggregate of step %d is not recorded in rounds.json; removed", dir, f->step);
                state_remove_aggregate(dir, f->step);
                continue;
            }
            AggregateBlob *blob = spes_calloc(1, sizeof *blob);
            rc = blob ? state_read(dir, f, &blob->bytes, &blob->len) : SPES_ERR;
            if (rc == SPES_OK) rc = check_aggregate(dir, f->step, blob, sum);
            if (rc == SPES_OK) rc = state_load_included(dir, f->step, r->cfg.agg.num_peers, &blob->included);
            if (rc == SPES_OK && r->delta_run) rc = restore_delta(r, blob, f->step, sum);
            if (rc == SPES_OK) rc = reloaded_layout(r, f->step, blob);
            if (rc != SPES_OK) {
                if (blob) free(blob->bytes);
                if (blob) free(blob->included);
                if (blob) free(blob->delta);
                free(blob);
                break;
            }
            blob->step = f->step;
            blob->refs = 1;
            rounds_publish(r, NULL, blob, 0);
            kept++;
            continue;
        }
        if (f->step <= book.last_completed_step) {
            state_remove_upload(dir, f->step, f->peer);
            continue;
        }
        if (!book_applied) {   // before the open rounds complete (if they do)
            apply_book(r, &book);
            if (r->outer_on) rc = restore_outer(r);
            book_applied = true;
        }
        bool taken = false;
        if (rc == SPES_OK) rc = restore_upload(r, f, &taken);
        reopened += taken;
    }
    free(files);
    if (rc == SPES_OK && !book_applied && r->outer_on) rc = restore_outer(r);
    if (rc != SPES_OK) return rc;
    if (!book_applied) apply_book(r, &book);
    rounds_check_space(r, kept);
    log_info("server: resumed from state dir %s: model fingerprint %016llx, %lld rounds completed (last step %d), %d "
             "aggregates kept, %d uploads of open rounds reloaded",
             dir, (unsigned long long)r->spec.fingerprint, (long long)r->stats.rounds_completed, r->last_completed_step,
             kept, reopened);
    return SPES_OK;
}
