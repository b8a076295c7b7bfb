// Driving the aggregation of a round whose uploads are in (rounds.h): each upload read back
// from its file (F32 / BF16 payloads, or int8 deltas decoded against the kept base) into the
// accumulator of aggregate.h one tensor at a time, the outer optimizer's step, the int8 delta of
// the aggregate for the peers, and publishing it (written to the state dir first, atomically,
// then kept for download). The maths itself is aggregate.c's and outer_optimizer.c's.
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "sync/delta_codec.h"
#include "sync/delta_payload.h"
#include "server/expert_rotation.h"
#include "server/rounds_internal.h"
#include "server/server_state.h"
#include "server/upload_check.h"

// *dst := a copy of src, through its serialised bytes (*bytes, *len keep them for the state dir).
static int outer_state_copy(const Rounds *r, const OuterOptState *src, OuterOptState *dst, uint8_t **bytes, size_t *len) {
    *len = outer_opt_state_size(src);
    *bytes = spes_malloc(*len);
    if (!*bytes) return SPES_ERR;
    outer_opt_state_serialise(src, *bytes);
    int64_t *numel = rounds_outer_numel(r);
    int rc = numel ? outer_opt_state_restore(dst, *bytes, *len, r->spec.count, numel, "outer optimizer state") : SPES_ERR;
    free(numel);
    return rc;
}

// The newest kept aggregate older than step, with a reference, or NULL. Under r->mu.
static AggregateBlob *latest_before(Rounds *r, int step) {
    AggregateBlob *best = NULL;
    for (int i = 0; i < r->cfg.keep_steps; i++)
        if (r->kept[i] && r->kept[i]->step < step && (!best || r->kept[i]->step > best->step)) best = r->kept[i];
    if (best) best->refs++;
    return best;
}

// The tensors of an aggregate blob in spec order (the layout is fixed: tensor t at
// rounds_blob_tensor), as rows for aggregate_compute_partial's `previous`.
static StTensor *blob_tensors(const Rounds *r, const AggregateBlob *blob) {
    StTensor *x = spes_calloc((size_t)r->spec.count, sizeof *x);
    for (int t = 0; x && t < r->spec.count; t++) {
        const SpecTensor *st = &r->spec.tensors[t];
        x[t] = (StTensor){.name = st->name, .dtype = r->payload_dtype, .ndim = st->ndim, .numel = st->numel,
                          .nbytes = st->numel * dtype_size(r->payload_dtype), .data = rounds_blob_tensor(r, blob, t)};
        memcpy(x[t].shape, st->shape, sizeof x[t].shape);
    }
    return x;
}

// Lets go of the pages of a read-only file mapping that hold [p, p + n): clean file pages,
// dropped from the process (and its RSS), not lost; touching them again reads them back.
void rounds_drop_pages(const MappedFile *mf, const uint8_t *p, size_t n) {
    if (!mf->mapping || n == 0) return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t)mf->mapping, limit = base + ((mf->size + page - 1) & ~(page - 1));
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)p + n + page - 1) & ~(uintptr_t)(page - 1);
    if (lo < base) lo = base;
    if (hi > limit) hi = limit;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

// A delta upload (delta_payload.h, the run's codec) of peer for step against the kept aggregate of
// base_step: every tensor the peer sends is decoded against the base and must be finite, and the
// payload holds nothing else. With acc, each reconstructed tensor is also added to the
// aggregate (one tensor of scratch memory at a time). The check on arrival and the read-back at
// aggregation are this one function.
RoundsResult rounds_int8_upload_walk(Rounds *r, int peer, int step, const SafeTensors *st, int base_step,
                                         AggregateAcc *acc) {
    char what[64];
    snprintf(what, sizeof what, "%s upload from peer %d for step %d", r->delta->name, peer, step);
    const ModelSpec *spec = &r->spec;
    pthread_mutex_lock(&r->mu);
    AggregateBlob *base = rounds_find_kept(r, base_step);
    pthread_mutex_unlock(&r->mu);
    if (!base)
        return rounds_fail(ROUNDS_NO_BASE,
                           "%s: its base, the aggregate of step %d, is not kept here (newest step %d); send a full "
                           "payload",
                           what, base_step, rounds_last_completed_step(r));
    size_t largest = 1;
    int sends = 0;
    for (int t = 0; t < spec->count; t++)
        if (model_spec_peer_sends(spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, t)) {
            sends++;
            if (spec->tensors[t].numel > largest) largest = spec->tensors[t].numel;
        }
    float *out = spes_malloc(largest * sizeof(float)), *scales = spes_malloc(delta_blocks(largest) * sizeof(float));
    int8_t *codes = spes_malloc(largest);
    RoundsResult code = out && scales && codes ? ROUNDS_OK : ROUNDS_NO_ROOM;
    if (code == ROUNDS_OK && st->count != 2 * sends)
        code = rounds_fail(ROUNDS_BAD_REQUEST,
                           "%s: %d tensors, expected %d (each of the %d tensors it trains and its '%s')", what,
                           st->count, 2 * sends, sends, DELTA_SCALE_SUFFIX);
    if (code == ROUNDS_OK && acc && aggregate_acc_begin_peer(acc, peer) != SPES_OK) code = ROUNDS_INTERNAL;
    for (int t = 0; code == ROUNDS_OK && t < spec->count; t++) {
        if (!model_spec_peer_sends(spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, t)) continue;
        const SpecTensor *x = &spec->tensors[t];
        const float *b = (const float *)rounds_blob_tensor(r, base, t);
        if (delta_payload_decode(r->delta, st, what, x->name, x->ndim, x->shape, x->numel, b, out, scales, codes) !=
            SPES_OK) {
            code = ROUNDS_BAD_REQUEST;
            break;
        }
        if (!acc) continue;
        StTensor u = {.name = x->name, .dtype = DTYPE_F32, .ndim = x->ndim, .numel = x->numel,
                      .nbytes = x->numel * sizeof(float), .data = (const uint8_t *)out};
        memcpy(u.shape, x->shape, sizeof u.shape);
        if (aggregate_acc_add_tensor(acc, peer, t, &u) != SPES_OK) code = ROUNDS_INTERNAL;
    }
    if (code == ROUNDS_OK && acc && aggregate_acc_end_peer(acc, peer) != SPES_OK) code = ROUNDS_INTERNAL;
    free(out);
    free(scales);
    free(codes);
    rounds_release(r, base);
    return code;
}

// Whether an upload is a delta; refuses one in a run that is not a delta run of its codec (and a
// bad header).
RoundsResult rounds_upload_kind(Rounds *r, int peer, int step, const SafeTensors *st, bool *is_int8, int *base) {
    char what[64];
    snprintf(what, sizeof what, "upload from peer %d for step %d", peer, step);
    const DeltaCodec *codec;
    if (delta_payload_kind(st, what, &codec, base) != SPES_OK) return ROUNDS_BAD_REQUEST;
    *is_int8 = codec != NULL;
    if (codec && codec != r->delta)
        return rounds_fail(ROUNDS_BAD_REQUEST, "%s: an %s delta, but this run's payload dtype is %s", what, codec->name,
                           r->delta ? r->delta->wire : dtype_name(r->wire_dtype));
    return ROUNDS_OK;
}

// Adds peer's upload of round, mapped back from upload_dir, to the accumulator tensor by
// tensor, letting go of each tensor's pages once added: reading an upload back costs about one
// tensor of memory, not the upload. (Its values were checked when it arrived; the structure is
// checked again, the disk may have damaged it.)
static int add_upload(Rounds *r, OpenRound *round, int peer, AggregateAcc *acc, const StTensor **row) {
    char name[64];
    snprintf(name, sizeof name, "upload_s%d_p%d.safetensors", round->step, peer);
    char *path = path_join(r->upload_dir, name);
    MappedFile mf = {0};
    int rc = path ? file_map(path, &mf) : SPES_ERR;
    free(path);
    SafeTensors st;
    if (rc == SPES_OK) rc = safetensors_parse(mf.data, mf.size, name, &st);
    if (rc != SPES_OK) {
        file_unmap(&mf);
        return rc;
    }
    bool is_int8 = false;
    int base = -1;
    if (rounds_upload_kind(r, peer, round->step, &st, &is_int8, &base) != ROUNDS_OK) rc = SPES_ERR;
    else if (is_int8) {
        rc = rounds_int8_upload_walk(r, peer, round->step, &st, base, acc) == ROUNDS_OK ? SPES_OK : SPES_ERR;
        safetensors_close(&st);
        file_unmap(&mf);
        return rc;
    }
    if (rc == SPES_OK) rc = upload_rows(&r->spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, &st, row);
    if (rc == SPES_OK) rc = aggregate_acc_begin_peer(acc, peer);
    for (int t = 0; rc == SPES_OK && t < r->spec.count; t++) {
        if (!row[t]) continue;
        rc = aggregate_acc_add_tensor(acc, peer, t, row[t]);
        rounds_drop_pages(&mf, row[t]->data, row[t]->nbytes);
    }
    if (rc == SPES_OK) rc = aggregate_acc_end_peer(acc, peer);
    safetensors_close(&st);
    file_unmap(&mf);
    return rc;
}

// Delta runs: the aggregate goes down as its change against the previous aggregate prev, which
// every peer that took part holds. Each tensor's change is encoded (delta_encode_change, the run's
// codec) and the
// blob's F32 image is replaced by prev + decoded change, exactly what those peers reconstruct;
// blob->delta gets the encoded change (delta_payload.h) against prev->step, stating `step`.
static int delta_downlink(Rounds *r, AggregateBlob *blob, int step, const AggregateBlob *prev) {
    const ModelSpec *spec = &r->spec;
    size_t largest = 1, blocks = 0;
    for (int t = 0; t < spec->count; t++) {
        if (spec->tensors[t].numel > largest) largest = spec->tensors[t].numel;
        blocks += delta_blocks(spec->tensors[t].numel);
    }
    int8_t *q = spes_malloc(spec->total_numel ? spec->total_numel : 1);
    float *scales = spes_malloc(blocks * sizeof(float) + 1), *scratch = spes_malloc(largest * sizeof(float));
    DeltaTensor *w = spes_calloc((size_t)spec->count + 1, sizeof *w);
    int rc = q && scales && scratch && w ? SPES_OK : SPES_ERR;
    size_t at = 0, block_at = 0;
    for (int t = 0; rc == SPES_OK && t < spec->count; t++) {
        const SpecTensor *x = &spec->tensors[t];
        float *a = (float *)rounds_blob_tensor(r, blob, t);
        const float *b = (const float *)rounds_blob_tensor(r, prev, t);
        delta_encode_change(r->delta, a, b, x->numel, q + at, scales + block_at, scratch);
        delta_reconstruct(b, q + at, scales + block_at, x->numel, a);
        w[t] = (DeltaTensor){.name = x->name, .ndim = x->ndim, .numel = x->numel, .q = q + at, .scale = scales + block_at};
        memcpy(w[t].shape, x->shape, sizeof w[t].shape);
        at += x->numel;
        block_at += delta_blocks(x->numel);
    }
    if (rc == SPES_OK)
        rc = delta_payload_serialize_aggregate(r->delta, w, spec->count, prev->step, step, &blob->delta, &blob->delta_len);
    if (rc == SPES_OK) blob->delta_base = prev->step;
    free(q);
    free(scales);
    free(scratch);
    free(w);
    return rc;
}

// Aggregates a frozen round (outside the lock) into a new blob: every peer's uploads, or for
// a partial round those present with the latest aggregate standing in for missing owners.
// Uploads are read back one at a time, in peer order, into the accumulator (which is the
// blob itself for F32 payloads): memory is the blob plus one upload, whatever P.
// With the outer optimizer on, *next gets a copy of r->outer stepped by this round (r->outer
// itself changes only when the aggregate is published) and *next_bytes its serialised form;
// the previous aggregate (theta) must be the one r->outer last stepped to. Under aggregate_mu.
static AggregateBlob *compute_aggregate(Rounds *r, OpenRound *round, OuterOptState *next, uint8_t **next_bytes,
                                        size_t *next_len) {
    int P = r->cfg.agg.num_peers, count = r->spec.count;
    bool partial = round->num_uploaded < P;
    AggregateBlob *blob = spes_calloc(1, sizeof *blob);
    uint8_t **out = spes_calloc((size_t)count, sizeof(uint8_t *));
    bool *present = partial ? spes_calloc((size_t)P, sizeof(bool)) : NULL;
    StTensor *prev_tensors = NULL;
    const StTensor **prev_rows = NULL, **row = NULL;
    AggregateAcc *acc = NULL;
    pthread_mutex_lock(&r->mu);
    AggregateBlob *prev = partial || r->delta_run || r->outer_on ? latest_before(r, round->step) : NULL;
    int outer_from = (int)r->outer.last_step;
    uint8_t *state_bytes = NULL;
    size_t state_len = 0;
    bool outer_ok = !r->outer_on || outer_state_copy(r, &r->outer, next, &state_bytes, &state_len) == SPES_OK;
    free(state_bytes);
    if (blob) blob->bytes = r->spare;
    if (blob) r->spare = NULL;
    pthread_mutex_unlock(&r->mu);
    if (blob && !blob->bytes) blob->bytes = spes_malloc(r->aggregate_cap);
    if (!blob || !blob->bytes || !out || (partial && !present) || !outer_ok) goto fail;
    if (r->outer_on && (prev ? prev->step : -1) != outer_from) {
        spes_fail("outer optimizer: step %d would step from the aggregate of step %d, but its state is that of step %d "
                  "(rounds out of order)",
                  round->step, prev ? prev->step : -1, outer_from);
        goto fail;
    }
    if (prev) {
        prev_tensors = blob_tensors(r, prev);
        prev_rows = spes_calloc((size_t)count, sizeof *prev_rows);
        if (!prev_tensors || !prev_rows) goto fail;
        for (int t = 0; t < count; t++) prev_rows[t] = &prev_tensors[t];
    }
    for (int p = 0; partial && p < P; p++) present[p] = round->uploaded[p];
    if (rounds_aggregate_header(r, round->step, blob->bytes, &blob->header_len) != SPES_OK) goto fail;
    for (int t = 0; t < count; t++) out[t] = rounds_blob_tensor(r, blob, t);
    row = spes_calloc((size_t)count, sizeof *row);
    if (!row || aggregate_acc_begin(&r->spec, &r->cfg.agg, round->step, present, out, r->payload_dtype, &acc) != SPES_OK)
        goto fail;
    if (r->outer_on) aggregate_acc_set_outer(acc, &r->cfg.outer, next, prev_rows);
    for (int p = 0; p < P; p++)
        if (round->uploaded[p] && add_upload(r, round, p, acc, row) != SPES_OK) goto fail;
    if (aggregate_acc_finish(acc, partial ? prev_rows : NULL) != SPES_OK) goto fail;
    if (r->outer_on) {
        outer_opt_end_round(next, round->step);
        *next_len = outer_opt_state_size(next);
        if (!(*next_bytes = spes_malloc(*next_len))) goto fail;
        outer_opt_state_serialise(next, *next_bytes);
    }
    // A rotated aggregate goes down whole: as a delta its moved experts would be rounded.
    bool rotated = expert_rotation_due(r->cfg.agg.rotation_steps, round->step);
    if (r->delta_run && prev && !rotated && delta_downlink(r, blob, round->step, prev) != SPES_OK) goto fail;
    blob->step = round->step;
    blob->len = blob->header_len + r->data_len;
    blob->refs = 1;
    blob->included = present;
    present = NULL;
    goto done;
fail:
    if (blob) free(blob->bytes);
    if (blob) free(blob->delta);
    free(blob);
    blob = NULL;
done:
    aggregate_acc_free(acc);
    free(row);
    free(out);
    free(present);
    free(prev_tensors);
    free(prev_rows);
    if (prev) rounds_release(r, prev);
    return blob;
}

// Puts blob in the kept list (dropping the oldest when full) and frees the round (NULL: a
// reloaded aggregate). Returns the step of the dropped aggregate, -1 if none. Under r->mu.
int rounds_publish(Rounds *r, OpenRound *round, AggregateBlob *blob, double seconds) {
    int slot = 0;
    for (int i = 0; i < r->cfg.keep_steps; i++) {
        if (!r->kept[i]) {
            slot = i;
            break;
        }
        if (r->kept[i]->step < r->kept[slot]->step) slot = i;
    }
    int dropped = r->kept[slot] ? r->kept[slot]->step : -1;
    if (r->kept[slot]) rounds_blob_unref(r, r->kept[slot]);
    r->kept[slot] = blob;
    if (blob->step > r->last_completed_step) {
        r->prev_completed_step = r->last_completed_step;
        r->last_completed_step = blob->step;
    }
    r->stats.rounds_completed++;
    r->stats.aggregate_problem[0] = '\0';   // written at last
    r->stats.last_aggregate_step = r->last_completed_step;
    r->stats.last_aggregate_seconds = seconds;
    r->stats.last_round_peers = r->cfg.agg.num_peers;
    if (blob->included) {
        r->rounds_partial++;
        r->stats.last_round_peers = 0;
        for (int p = 0; p < r->cfg.agg.num_peers; p++) r->stats.last_round_peers += blob->included[p];
    } else if (round) {   // a full round: its duration feeds the adaptive deadline
        r->recent[r->n_recent++ % ROUNDS_RECENT] = now_seconds() - round->opened_at;
    }
    r->stats.rounds_partial = r->rounds_partial;
    if (round) {   // a fresh round (not one reloaded at start): into the status page's history
        RoundRecord rec = {.step = blob->step,
                           .started_unix = round->opened_unix,
                           .duration_s = now_seconds() - round->opened_at,
                           .partial = blob->included != NULL,
                           .peers = r->stats.last_round_peers,
                           .bytes_in = round->bytes_in,
                           .merge_alpha = aggregate_merge_alpha(&r->cfg.agg, blob->step)};
        peer_watch_round(r->watch, &rec, blob->included);
    }
    if (round) rounds_free_round(r, round);
    if (round) rounds_sweep_rounds(r, r->last_completed_step + 1);
    pthread_cond_broadcast(&r->changed);
    return dropped;
}

// The kept aggregates once blob is published (rounds_publish drops the oldest when the list is
// full), newest first, with their checksums: what rounds.json records. Under r->mu.
static void book_record_kept(const Rounds *r, const AggregateBlob *blob, StateBook *book) {
    const AggregateBlob *all[STATE_MAX_KEPT + 1];
    int n = 0, oldest = -1;
    bool full = true;
    for (int i = 0; i < r->cfg.keep_steps && n < STATE_MAX_KEPT; i++) {
        full &= r->kept[i] != NULL;
        if (!r->kept[i]) continue;
        if (oldest < 0 || r->kept[i]->step < all[oldest]->step) oldest = n;
        all[n++] = r->kept[i];
    }
    if (full && oldest >= 0) all[oldest] = all[--n];   // the slot blob takes
    all[n++] = blob;
    for (int i = 1; i < n; i++)   // insertion sort by step, newest first (a handful of entries)
        for (int j = i; j > 0 && all[j]->step > all[j - 1]->step; j--) {
            const AggregateBlob *t = all[j];
            all[j] = all[j - 1];
            all[j - 1] = t;
        }
    book->n_kept = n;
    for (int i = 0; i < book->n_kept; i++)
        book->kept[i] = (StateKept){.step = all[i]->step, .bytes = all[i]->len, .crc32c = all[i]->crc32c,
                                    .has_delta = all[i]->delta != NULL, .delta_bytes = all[i]->delta_len,
                                    .delta_crc32c = all[i]->delta_crc32c};
}

// Writes the aggregate and then the bookkeeping to the state dir (when there is one) and
// publishes the aggregate: downloads only ever see durable aggregates. Afterwards the round's
// uploads and the aggregate that dropped out of the kept list are removed from disk.
// With the outer optimizer on, its state after this round (outer, serialised as outer_bytes)
// is written before the aggregate and becomes r->outer as the aggregate is published.
static int persist_and_publish(Rounds *r, OpenRound *round, AggregateBlob *blob, double seconds, OuterOptState *outer,
                               const uint8_t *outer_bytes, size_t outer_len) {
    const char *dir = r->cfg.state_dir;
    int step = blob->step, P = r->cfg.agg.num_peers;
    pthread_mutex_lock(&r->persist_mu);
    if (dir) {
        blob->crc32c = crc32c(blob->bytes, blob->len);
        if (blob->delta) blob->delta_crc32c = crc32c(blob->delta, blob->delta_len);
        StateBook *book = spes_calloc(1, sizeof *book);   // large (STATE_MAX_KEPT entries): not on a call's stack
        if (book) {
            pthread_mutex_lock(&r->mu);
            book->last_completed_step = r->last_completed_step > step ? r->last_completed_step : step;
            book->rounds_completed = r->stats.rounds_completed + 1;
            book->rounds_partial = r->rounds_partial + (blob->included != NULL);
            book_record_kept(r, blob, book);
            pthread_mutex_unlock(&r->mu);
        }
        if (!book || (outer_bytes && state_save_blob(dir, STATE_BLOB_OUTER, step, outer_bytes, outer_len) != SPES_OK) ||
            (blob->included ? state_save_included(dir, step, blob->included, P)
                            : state_remove_included(dir, step)) != SPES_OK ||
            (blob->delta && state_save_blob(dir, STATE_BLOB_DELTA, step, blob->delta, blob->delta_len) != SPES_OK) ||
            state_save_aggregate(dir, step, blob->bytes, blob->len) != SPES_OK || state_save_book(dir, book) != SPES_OK) {
            free(book);
            pthread_mutex_unlock(&r->persist_mu);
            return SPES_ERR;
        }
        free(book);
    }
    pthread_mutex_lock(&r->mu);
    int dropped = rounds_publish(r, round, blob, seconds);
    if (outer_bytes) {
        OuterOptState old = r->outer;
        r->outer = *outer;
        *outer = old;   // the caller frees the previous state
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->persist_mu);
    for (int p = 0; p < P; p++) state_remove_upload(r->upload_dir, step, p);
    if (dir && dropped >= 0) state_remove_aggregate(dir, dropped);
    return SPES_OK;
}

// Aggregates a frozen round and publishes it: a complete one (`peer`'s upload completed it) or
// a partial one closed by the round timeout (peer -1).
RoundsResult rounds_complete_round(Rounds *r, OpenRound *round, int peer) {
    int step = round->step, P = r->cfg.agg.num_peers, arrived = round->num_uploaded;
    pthread_mutex_lock(&r->aggregate_mu);
    double start = now_seconds();
    OuterOptState outer = {0};
    uint8_t *outer_bytes = NULL;
    size_t outer_len = 0;
    AggregateBlob *blob = compute_aggregate(r, round, &outer, &outer_bytes, &outer_len);
    double seconds = now_seconds() - start;
    // The outer optimizer's state is sequential: the next round may only aggregate once this
    // one's state is published (without it, rounds aggregate while others persist).
    if (!r->outer_on) pthread_mutex_unlock(&r->aggregate_mu);
    RoundsResult code = ROUNDS_NO_ROOM;
    int persisted = blob ? persist_and_publish(r, round, blob, seconds, &outer, outer_bytes, outer_len) : SPES_ERR;
    if (r->outer_on) pthread_mutex_unlock(&r->aggregate_mu);
    outer_opt_state_free(&outer);
    free(outer_bytes);
    if (persisted == SPES_OK) {
        if (arrived == P) {
            log_info("server: step %d: aggregated %d peers in %.3f s (%zu bytes)", step, P, seconds, blob->len);
        } else {
            char missing[256] = "";
            for (int p = 0, at = 0; p < P && at < (int)sizeof missing - 12; p++)
                if (!blob->included[p]) at += snprintf(missing + at, sizeof missing - (size_t)at, " %d", p);
            log_warn("server: step %d: PARTIAL round: aggregated %d of %d peers after the round timeout in %.3f s "
                     "(missing:%s; an expert with no owner present keeps the previous aggregate's values)",
                     step, arrived, P, seconds, missing);
        }
        if (expert_rotation_due(r->cfg.agg.rotation_steps, step))
            log_info("server: step %d: experts rotated: each layer's expert e is now at e + %d (peer p trains what peer "
                     "p-1 did)", step, r->cfg.agg.experts_per_node);
        return ROUNDS_OK;
    }
    if (blob) {   // not durable: not published either
        free(blob->bytes);
        free(blob->included);
        free(blob->delta);
        free(blob);
        // Every upload of the round is on disk: keep them and write the aggregate again once a
        // waiter's retry is due (stalled_round, overdue_round), so the run goes on by itself once
        // space is back. The uploader heard nothing wrong: its upload is taken.
        pthread_mutex_lock(&r->mu);
        round->aggregating = false;
        round->retry_at = now_seconds() + ROUNDS_PERSIST_RETRY_S;
        // Said by Status too: the peers that wait on this round log it (client.c: note_waiting).
        snprintf(r->stats.aggregate_problem, sizeof r->stats.aggregate_problem,
                 "step %d: cannot write the aggregate to the state dir %s: %s", step,
                 r->cfg.state_dir ? r->cfg.state_dir : "(none)", spes_last_error());
        pthread_mutex_unlock(&r->mu);
        log_error("server: step %d: cannot write the aggregate to the state dir %s: %s; the round keeps its %d "
                  "uploads and is written again every %.0f s while peers wait (free space there); the kept aggregates "
                  "are still served",
                  step, r->cfg.state_dir ? r->cfg.state_dir : "(none)", spes_last_error(), arrived,
                  ROUNDS_PERSIST_RETRY_S);
        return ROUNDS_OK;
    }
    // Drop this peer's upload so that its retry completes the round again (a partial round
    // is simply reopened: the next waiter tries again). Its file goes too: the peer hears its
    // upload refused, so a restart must not take it (as for every upload refused after its commit).
    pthread_mutex_lock(&r->mu);
    if (peer >= 0) {
        round->uploaded[peer] = false;
        round->num_uploaded--;
        state_remove_upload(r->upload_dir, step, peer);
    }
    round->aggregating = false;
    pthread_mutex_unlock(&r->mu);
    spes_fail_context("aggregating step %d (retry the upload)", step);
    return code;
}

