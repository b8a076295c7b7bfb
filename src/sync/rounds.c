// Parameter-server state: spec, open rounds, kept aggregates (see rounds.h).
#include "sync/rounds.h"
#include "sync/rounds_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/timer.h"
#include "sync/int8_codec.h"
#include "sync/int8_payload.h"
#include "sync/peer_watch.h"
#include "sync/rounds_run_status.h"
#include "sync/server_state.h"
#include "sync/upload_check.h"



// Without a state dir, accepted uploads wait for their round in a private directory (under
// cfg->spool_dir, $TMPDIR or /tmp) instead of memory: the server then holds at most one upload
// per aggregation, whatever the number of peers (aggregate.h: AggregateAcc).
static int open_spool(Rounds *r) {
    const char *parent = r->cfg.spool_dir ? r->cfg.spool_dir : getenv("TMPDIR");
    if (!parent || !parent[0]) parent = "/tmp";
    char *dir = path_join(parent, "spes-server-uploads-XXXXXX");
    if (!dir) return SPES_ERR;
    if (!mkdtemp(dir)) {
        int rc = spes_fail("server: cannot create a spool directory for uploads under %s: %s (set --spool_dir)",
                           parent, strerror(errno));
        free(dir);
        return rc;
    }
    r->upload_dir = dir;
    r->own_upload_dir = true;
    return SPES_OK;
}

RoundsResult rounds_fail(RoundsResult result, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    spes_failv(fmt, ap);
    va_end(ap);
    return result;
}

// Copies text into out[cap] with control bytes written as \xNN (the refusal log's format, which
// differs from base/printable's \n \t style).
static void printable(const char *text, char *out, size_t cap) {
    size_t at = 0;
    for (; *text && at + 5 < cap; text++) {
        unsigned char ch = (unsigned char)*text;
        if (ch < 0x20 || ch == 0x7f) at += (size_t)snprintf(out + at, cap - at, "\\x%02x", ch);
        else out[at++] = (char)ch;
    }
    out[at] = '\0';
}

void log_refusal(const char *what) {
    // Messages quote what peers sent (tensor names, method names): escape control bytes so that
    // a peer cannot write terminal escape sequences or fake log lines into the server's log.
    char safe_what[256], safe[4096];
    printable(what, safe_what, sizeof safe_what);
    printable(spes_last_error(), safe, sizeof safe);
    log_warn("server: %s refused: %s", safe_what, safe);
}

int rounds_create(const RoundsConfig *cfg, Rounds **out) {
    if (cfg->keep_steps < 1) return spes_fail("server: keep_steps must be >= 1 (got %d)", cfg->keep_steps);
    if (cfg->max_open_rounds < 1) return spes_fail("server: max_open_rounds must be >= 1");
    if (cfg->round_timeout_s < 0 || cfg->min_peers < 0 || cfg->min_peers > cfg->agg.num_peers)
        return spes_fail("server: --round_timeout must be >= 0 and --min_peers in [1, total_peers %d] (got %g, %d)",
                         cfg->agg.num_peers, cfg->round_timeout_s, cfg->min_peers);
    SPES_TRY(aggregate_config_check(&cfg->agg, NULL));
    // The server's big buffers (uploads, aggregates, gRPC's 4 MiB messages) come and go in
    // many threads. glibc raises its mmap threshold to the largest block freed (up to 32 MiB),
    // after which such buffers land in per-thread arenas and stay there, fragmented: the
    // server's memory then grew with the number of peers and over rounds. A fixed threshold
    // keeps every block of 1 MiB or more mapped on its own and returned when freed.
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    // The smaller blocks (gRPC's read slices, messages being assembled) were spread over up
    // to 8 arenas per core by the call threads, each keeping its freed memory: at 16 peers the
    // arenas held 70-95 MB free against 10-50 MB in use. One arena reuses what any thread freed.
    mallopt(M_ARENA_MAX, 1);
    Rounds *r = spes_calloc(1, sizeof *r);
    if (!r) return SPES_ERR;
    r->lock_fd = -1;
    r->cfg = *cfg;
    if (r->cfg.min_peers == 0) r->cfg.min_peers = (cfg->agg.num_peers + 1) / 2;   // default: a majority
    if (r->cfg.outer.lr == 0.0f) r->cfg.outer.lr = 1.0f;
    if (outer_opt_config_check(&r->cfg.outer) != SPES_OK) {
        free(r);
        return spes_fail_context("server");
    }
    r->outer_on = !outer_opt_is_off(&r->cfg.outer);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->persist_mu, NULL);
    pthread_mutex_init(&r->aggregate_mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&r->changed, &attr);
    pthread_condattr_destroy(&attr);
    r->open = spes_calloc((size_t)cfg->max_open_rounds, sizeof(OpenRound));
    r->kept = spes_calloc((size_t)cfg->keep_steps, sizeof(AggregateBlob *));
    if (!r->open || !r->kept) {
        rounds_destroy(r);
        return SPES_ERR;
    }
    for (int i = 0; i < cfg->max_open_rounds; i++) r->open[i].step = -1;
    if (peer_watch_create(cfg->agg.num_peers, &r->watch) != SPES_OK) {
        rounds_destroy(r);
        return SPES_ERR;
    }
    r->last_completed_step = r->prev_completed_step = -1;
    r->stats.last_aggregate_step = -1;
    if (r->cfg.max_rounds_ahead <= 0) r->cfg.max_rounds_ahead = ROUNDS_AHEAD;
    if (cfg->state_dir && rounds_restore_state(r) != SPES_OK) {
        rounds_destroy(r);
        return SPES_ERR;
    }
    if (!cfg->state_dir && open_spool(r) != SPES_OK) {
        rounds_destroy(r);
        return SPES_ERR;
    }
    *out = r;
    return SPES_OK;
}

static void free_round(Rounds *r, OpenRound *round) {
    free(round->uploaded);
    memset(round, 0, sizeof *round);
    round->step = -1;
}

// Drops a reference; the last one frees the blob (keeping its bytes as the spare). Under r->mu.
static void blob_unref(Rounds *r, AggregateBlob *blob) {
    if (--blob->refs > 0) return;
    for (int i = 0; blob->views && i < 2 * (r->cfg.agg.num_peers + 1); i++) aggregate_view_free(&blob->views[i]);
    free(blob->views);
    free(blob->delta);
    if (!r->spare && blob->len == r->aggregate_len) r->spare = blob->bytes;
    else free(blob->bytes);
    free(blob->included);
    free(blob);
}

void rounds_close(Rounds *r) {
    pthread_mutex_lock(&r->mu);
    r->closing = true;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->mu);
}

void rounds_destroy(Rounds *r) {
    if (!r) return;
    for (int i = 0; r->open && i < r->cfg.max_open_rounds; i++) free_round(r, &r->open[i]);
    for (int i = 0; r->kept && i < r->cfg.keep_steps; i++)
        if (r->kept[i]) blob_unref(r, r->kept[i]);
    free(r->spare);
    free(r->open);
    free(r->kept);
    free(r->header);
    free(r->tensor_offset);
    model_spec_free(&r->spec);
    outer_opt_state_free(&r->outer);
    peer_watch_free(r->watch);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->persist_mu);
    pthread_mutex_destroy(&r->aggregate_mu);
    if (r->own_upload_dir) remove_tree(r->upload_dir);
    if (r->own_upload_dir) free(r->upload_dir);
    pthread_cond_destroy(&r->changed);
    state_close(r->lock_fd);
    free(r);
}

// Fixes the aggregate's layout once: serialises a zero-filled aggregate (calloc'd source,
// so no real memory is read), keeps its header bytes and each tensor's data offset. Every
// round then writes the header and aggregates straight into the data region.
static int plan_aggregate_layout(Rounds *r) {
    const ModelSpec *spec = &r->spec;
    size_t largest = 0, elem = dtype_size(r->payload_dtype);
    for (int t = 0; t < spec->count; t++)
        if (spec->tensors[t].numel * elem > largest) largest = spec->tensors[t].numel * elem;
    StWriteTensor *w = spes_calloc((size_t)spec->count, sizeof *w);
    void *zeros = spes_calloc(largest ? largest : 1, 1);
    r->tensor_offset = spes_calloc((size_t)spec->count, sizeof(size_t));
    int rc = w && zeros && r->tensor_offset ? SPES_OK : SPES_ERR;
    for (int t = 0; rc == SPES_OK && t < spec->count; t++) {
        w[t].name = spec->tensors[t].name;
        w[t].dtype = r->payload_dtype;
        w[t].ndim = spec->tensors[t].ndim;
        memcpy(w[t].shape, spec->tensors[t].shape, sizeof w[t].shape);
        w[t].data = zeros;
    }
    uint8_t *image = NULL;
    size_t len = 0;
    if (rc == SPES_OK) rc = safetensors_serialize(w, spec->count, NULL, NULL, 0, &image, &len);
    SafeTensors parsed;
    if (rc == SPES_OK) rc = safetensors_parse(image, len, "aggregate layout", &parsed);
    if (rc == SPES_OK) {
        r->header_len = len;
        for (int t = 0; t < spec->count; t++) {
            const StTensor *x = safetensors_find(&parsed, spec->tensors[t].name);
            r->tensor_offset[t] = (size_t)(x->data - image);
            if (r->tensor_offset[t] < r->header_len) r->header_len = r->tensor_offset[t];
        }
        if (spec->count == 0) r->header_len = len;
        safetensors_close(&parsed);
        r->aggregate_len = len;
        r->header = spes_malloc(r->header_len);
        if (r->header) memcpy(r->header, image, r->header_len);
        else rc = SPES_ERR;
    }
    free(image);
    free(zeros);
    free(w);
    return rc;
}

// The slots the outer optimizer covers: numel[t] of every shared tensor in spes mode (experts
// come from their owners and the merge), of every tensor in fedavg mode.
int64_t *rounds_outer_numel(const Rounds *r) {
    int64_t *numel = spes_calloc((size_t)r->spec.count + 1, sizeof *numel);
    for (int t = 0; numel && t < r->spec.count; t++)
        numel[t] = r->cfg.agg.mode == SYNC_MODE_SPES && r->spec.tensors[t].expert >= 0 ? 0 : (int64_t)r->spec.tensors[t].numel;
    return numel;
}

// r->outer := a fresh state (zero velocity, no round yet) for r->spec.
static int outer_state_fresh(Rounds *r) {
    int64_t *numel = rounds_outer_numel(r);
    outer_opt_state_free(&r->outer);
    int rc = numel ? outer_opt_state_init(&r->outer, r->spec.count, numel) : SPES_ERR;
    free(numel);
    return rc;
}

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

// Takes the spec (moving it out of *spec) and plans the aggregate layout; with a state dir and
// `persist`, writes it there first. Under r->mu.
RoundsResult rounds_adopt_spec(Rounds *r, ModelSpec *spec, DType payload_dtype, bool persist) {
    if (aggregate_config_check(&r->cfg.agg, spec) != SPES_OK) return ROUNDS_MISMATCH;
    if (persist && r->cfg.state_dir &&
        state_save_spec(r->cfg.state_dir, &r->cfg.agg, &r->cfg.outer, spec, payload_dtype) != SPES_OK)
        return ROUNDS_INTERNAL;
    r->spec = *spec;
    model_spec_init(spec);
    r->wire_dtype = payload_dtype;
    r->int8 = payload_dtype == DTYPE_I8;
    r->payload_dtype = r->int8 ? DTYPE_F32 : payload_dtype;
    if (plan_aggregate_layout(r) != SPES_OK || (r->outer_on && outer_state_fresh(r) != SPES_OK)) {
        free(r->tensor_offset);
        r->tensor_offset = NULL;
        model_spec_free(&r->spec);
        return ROUNDS_NO_ROOM;
    }
    r->have_spec = true;
    r->stats.fingerprint = r->spec.fingerprint;
    log_info(
        "server: model spec fixed: %d tensors, %zu values, %d experts x %d MoE layers, payload %s, fingerprint %016llx",
        r->spec.count, r->spec.total_numel, r->spec.num_experts, r->spec.num_moe_layers, dtype_name(payload_dtype),
        (unsigned long long)r->spec.fingerprint);
    return ROUNDS_OK;
}

RoundsResult rounds_hello_settings(const Rounds *r, int peer, int num_peers, int experts_per_node, SyncMode mode,
                                       DType payload_dtype) {
    const AggregateConfig *a = &r->cfg.agg;
    if (num_peers != a->num_peers)
        return rounds_fail(ROUNDS_MISMATCH,
                           "hello from peer %d: it runs with %d peers, the server with --total_peers %d", peer,
                           num_peers, a->num_peers);
    if (peer < 0 || peer >= a->num_peers)
        return rounds_fail(ROUNDS_BAD_REQUEST, "hello: peer_id %d is outside [0, %d)", peer, a->num_peers);
    if (mode != a->mode)
        return rounds_fail(ROUNDS_MISMATCH,
                           "hello from peer %d: it runs in %s mode, the server in %s mode", peer, sync_mode_name(mode),
                           sync_mode_name(a->mode));
    if (mode == SYNC_MODE_SPES && experts_per_node != a->experts_per_node)
        return rounds_fail(ROUNDS_MISMATCH,
                           "hello from peer %d: it trains %d experts per node, the server expects "
                           "--num_train_experts_per_node %d",
                           peer, experts_per_node, a->experts_per_node);
    if (payload_dtype != DTYPE_F32 && payload_dtype != DTYPE_BF16 && payload_dtype != DTYPE_I8)
        return rounds_fail(ROUNDS_BAD_REQUEST, "hello from peer %d: payload dtype %s is not F32, BF16 or I8",
                           peer, dtype_name(payload_dtype));
    return ROUNDS_OK;
}

RoundsResult rounds_hello(Rounds *r, int peer, int num_peers, int experts_per_node, SyncMode mode,
                              DType payload_dtype, ModelSpec *spec, int *last_completed_step) {
    RoundsResult code = rounds_hello_settings(r, peer, num_peers, experts_per_node, mode, payload_dtype);
    if (code != ROUNDS_OK) return code;
    pthread_mutex_lock(&r->mu);
    if (!r->have_spec) {
        code = rounds_adopt_spec(r, spec, payload_dtype, true);
        if (code != ROUNDS_OK) spes_fail_context("hello from peer %d", peer);
    } else if (r->spec.fingerprint != spec->fingerprint || r->spec.count != spec->count) {
        char diff[1024];
        model_spec_describe_difference(&r->spec, spec, diff, sizeof diff);
        code =
            rounds_fail(ROUNDS_MISMATCH,
                        "hello from peer %d: its model (fingerprint %016llx) differs from the server's (%016llx): %s",
                        peer, (unsigned long long)spec->fingerprint, (unsigned long long)r->spec.fingerprint, diff);
    } else if (payload_dtype != r->wire_dtype) {
        code = rounds_fail(ROUNDS_MISMATCH,
                           "hello from peer %d: payload dtype %s, but the other peers use %s", peer,
                           dtype_name(payload_dtype), dtype_name(r->wire_dtype));
    }
    *last_completed_step = r->last_completed_step;
    pthread_mutex_unlock(&r->mu);
    return code;
}

// The highest step an upload may have now (see RoundsConfig.max_rounds_ahead): the anchor is
// the newest completed step, or before any round completed the lowest step seen (open rounds
// and `step`); the spacing is the gap between the two newest completed rounds, or while that
// is unknown max(anchor, ROUNDS_DEFAULT_SPACING). 64-bit: steps go up to 2^31-1. Under r->mu.
static int64_t step_limit(const Rounds *r, int step) {
    int64_t anchor = r->last_completed_step;
    if (anchor < 0) {
        anchor = step;
        for (int i = 0; i < r->cfg.max_open_rounds; i++)
            if (r->open[i].step >= 0 && r->open[i].step < anchor) anchor = r->open[i].step;
    }
    int64_t spacing = r->last_completed_step >= 0 && r->prev_completed_step >= 0
                          ? (int64_t)r->last_completed_step - r->prev_completed_step
                          : (anchor > ROUNDS_DEFAULT_SPACING ? anchor : ROUNDS_DEFAULT_SPACING);
    return anchor + (int64_t)r->cfg.max_rounds_ahead * spacing;
}

// Frees an open round that can never complete and removes its uploads from the state dir.
// Under r->mu.
static void drop_round(Rounds *r, OpenRound *round, const char *why) {
    log_warn("server: step %d: dropping the open round (%d uploads): %s", round->step, round->num_uploaded, why);
    for (int p = 0; p < r->cfg.agg.num_peers; p++)
        if (round->uploaded[p]) state_remove_upload(r->upload_dir, round->step, p);
    free_round(r, round);
}

// Drops open rounds that can never become the newest aggregate for honest peers: steps at or
// below the newest completed one (a later round overtook them), and steps beyond step_limit
// (a peer far ahead, or a bogus step, must not hold a slot or poison the run). Rounds being
// aggregated are left alone. `step`: an upload under way (it lowers the anchor). Under r->mu.
static void sweep_rounds(Rounds *r, int step) {
    int64_t limit = step_limit(r, step);
    for (int i = 0; i < r->cfg.max_open_rounds; i++) {
        OpenRound *round = &r->open[i];
        if (round->step < 0 || round->aggregating) continue;
        if (round->step <= r->last_completed_step) drop_round(r, round, "a later round completed first");
        else if (round->step > limit) drop_round(r, round, "too far ahead of the run");
    }
}

// The open round of step, creating it if needed; NULL when all slots are taken. When they are,
// the round with the highest step gives way to a lower one: the lowest rounds are the ones the
// run needs next, so a peer uploading ahead can never lock the others out. Under r->mu.
static OpenRound *open_round(Rounds *r, int step) {
    OpenRound *free_slot = NULL, *highest = NULL;
    for (int i = 0; i < r->cfg.max_open_rounds; i++) {
        if (r->open[i].step == step) return &r->open[i];
        if (r->open[i].step < 0 && !free_slot) free_slot = &r->open[i];
        if (r->open[i].step >= 0 && !r->open[i].aggregating && (!highest || r->open[i].step > highest->step))
            highest = &r->open[i];
    }
    if (!free_slot && highest && highest->step > step) {
        char why[96];
        snprintf(why, sizeof why, "every slot is taken and step %d comes first", step);
        drop_round(r, highest, why);
        free_slot = highest;
    }
    if (!free_slot) return NULL;
    int P = r->cfg.agg.num_peers;
    free_slot->uploaded = spes_calloc((size_t)P, sizeof(bool));
    if (!free_slot->uploaded) {
        free_round(r, free_slot);
        return NULL;
    }
    free_slot->step = step;
    free_slot->opened_at = now_seconds();
    free_slot->opened_unix = peer_watch_now();
    return free_slot;
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
// tensor_offset[t]), as rows for aggregate_compute_partial's `previous`.
static StTensor *blob_tensors(const Rounds *r, const AggregateBlob *blob) {
    StTensor *x = spes_calloc((size_t)r->spec.count, sizeof *x);
    for (int t = 0; x && t < r->spec.count; t++) {
        const SpecTensor *st = &r->spec.tensors[t];
        x[t] = (StTensor){.name = st->name, .dtype = r->payload_dtype, .ndim = st->ndim, .numel = st->numel,
                          .nbytes = st->numel * dtype_size(r->payload_dtype), .data = blob->bytes + r->tensor_offset[t]};
        memcpy(x[t].shape, st->shape, sizeof x[t].shape);
    }
    return x;
}

// Lets go of the pages of a read-only file mapping that hold [p, p + n): clean file pages,
// dropped from the process (and its RSS), not lost; touching them again reads them back.
static void drop_pages(const MappedFile *mf, const uint8_t *p, size_t n) {
    if (!mf->mapping || n == 0) return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t)mf->mapping, limit = base + ((mf->size + page - 1) & ~(page - 1));
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)p + n + page - 1) & ~(uintptr_t)(page - 1);
    if (lo < base) lo = base;
    if (hi > limit) hi = limit;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

// An int8 delta upload (int8_payload.h) of peer for step against the kept aggregate of
// base_step: every tensor the peer sends is decoded against the base and must be finite, and the
// payload holds nothing else. With acc, each reconstructed tensor is also added to the
// aggregate (one tensor of scratch memory at a time). The check on arrival and the read-back at
// aggregation are this one function.
static RoundsResult int8_upload_walk(Rounds *r, int peer, int step, const SafeTensors *st, int base_step,
                                         AggregateAcc *acc) {
    char what[64];
    snprintf(what, sizeof what, "int8 upload from peer %d for step %d", peer, step);
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
    float *out = spes_malloc(largest * sizeof(float)), *scales = spes_malloc(int8_blocks(largest) * sizeof(float));
    RoundsResult code = out && scales ? ROUNDS_OK : ROUNDS_NO_ROOM;
    if (code == ROUNDS_OK && st->count != 2 * sends)
        code = rounds_fail(ROUNDS_BAD_REQUEST,
                           "%s: %d tensors, expected %d (each of the %d tensors it trains and its '%s')", what,
                           st->count, 2 * sends, sends, INT8_SCALE_SUFFIX);
    if (code == ROUNDS_OK && acc && aggregate_acc_begin_peer(acc, peer) != SPES_OK) code = ROUNDS_INTERNAL;
    for (int t = 0; code == ROUNDS_OK && t < spec->count; t++) {
        if (!model_spec_peer_sends(spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, t)) continue;
        const SpecTensor *x = &spec->tensors[t];
        const float *b = (const float *)(base->bytes + r->tensor_offset[t]);
        if (int8_payload_decode(st, what, x->name, x->ndim, x->shape, x->numel, b, out, scales) != SPES_OK) {
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
    rounds_release(r, base);
    return code;
}

// Whether an upload is an int8 delta; refuses one in a run that is not int8 (and a bad header).
static RoundsResult upload_kind(Rounds *r, int peer, int step, const SafeTensors *st, bool *is_int8, int *base) {
    char what[64];
    snprintf(what, sizeof what, "upload from peer %d for step %d", peer, step);
    if (int8_payload_kind(st, what, is_int8, base) != SPES_OK) return ROUNDS_BAD_REQUEST;
    if (*is_int8 && !r->int8)
        return rounds_fail(ROUNDS_BAD_REQUEST, "%s: an int8 delta, but this run's payload dtype is %s", what,
                           dtype_name(r->wire_dtype));
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
    if (upload_kind(r, peer, round->step, &st, &is_int8, &base) != ROUNDS_OK) rc = SPES_ERR;
    else if (is_int8) {
        rc = int8_upload_walk(r, peer, round->step, &st, base, acc) == ROUNDS_OK ? SPES_OK : SPES_ERR;
        safetensors_close(&st);
        file_unmap(&mf);
        return rc;
    }
    if (rc == SPES_OK) rc = upload_rows(&r->spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, &st, row);
    if (rc == SPES_OK) rc = aggregate_acc_begin_peer(acc, peer);
    for (int t = 0; rc == SPES_OK && t < r->spec.count; t++) {
        if (!row[t]) continue;
        rc = aggregate_acc_add_tensor(acc, peer, t, row[t]);
        drop_pages(&mf, row[t]->data, row[t]->nbytes);
    }
    if (rc == SPES_OK) rc = aggregate_acc_end_peer(acc, peer);
    safetensors_close(&st);
    file_unmap(&mf);
    return rc;
}

// int8 runs: the aggregate goes down as its change against the previous aggregate prev, which
// every peer that took part holds. Each tensor's change is encoded (int8_encode_change) and the
// blob's F32 image is replaced by prev + decoded change, exactly what those peers reconstruct;
// blob->delta gets the encoded change (int8_payload.h) against prev->step.
static int int8_downlink(Rounds *r, AggregateBlob *blob, const AggregateBlob *prev) {
    const ModelSpec *spec = &r->spec;
    size_t largest = 1, blocks = 0;
    for (int t = 0; t < spec->count; t++) {
        if (spec->tensors[t].numel > largest) largest = spec->tensors[t].numel;
        blocks += int8_blocks(spec->tensors[t].numel);
    }
    int8_t *q = spes_malloc(spec->total_numel ? spec->total_numel : 1);
    float *scales = spes_malloc(blocks * sizeof(float) + 1), *scratch = spes_malloc(largest * sizeof(float));
    Int8Tensor *w = spes_calloc((size_t)spec->count + 1, sizeof *w);
    int rc = q && scales && scratch && w ? SPES_OK : SPES_ERR;
    size_t at = 0, block_at = 0;
    for (int t = 0; rc == SPES_OK && t < spec->count; t++) {
        const SpecTensor *x = &spec->tensors[t];
        float *a = (float *)(blob->bytes + r->tensor_offset[t]);
        const float *b = (const float *)(prev->bytes + r->tensor_offset[t]);
        int8_encode_change(a, b, x->numel, q + at, scales + block_at, scratch);
        int8_reconstruct(b, q + at, scales + block_at, x->numel, a);
        w[t] = (Int8Tensor){.name = x->name, .ndim = x->ndim, .numel = x->numel, .q = q + at, .scale = scales + block_at};
        memcpy(w[t].shape, x->shape, sizeof w[t].shape);
        at += x->numel;
        block_at += int8_blocks(x->numel);
    }
    if (rc == SPES_OK) rc = int8_payload_serialize(w, spec->count, prev->step, &blob->delta, &blob->delta_len);
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
    AggregateBlob *prev = partial || r->int8 || r->outer_on ? latest_before(r, round->step) : NULL;
    int outer_from = (int)r->outer.last_step;
    uint8_t *state_bytes = NULL;
    size_t state_len = 0;
    bool outer_ok = !r->outer_on || outer_state_copy(r, &r->outer, next, &state_bytes, &state_len) == SPES_OK;
    free(state_bytes);
    if (blob) blob->bytes = r->spare;
    if (blob) r->spare = NULL;
    pthread_mutex_unlock(&r->mu);
    if (blob && !blob->bytes) blob->bytes = spes_malloc(r->aggregate_len);
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
    memcpy(blob->bytes, r->header, r->header_len);
    for (int t = 0; t < count; t++) out[t] = blob->bytes + r->tensor_offset[t];
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
    if (r->int8 && prev && int8_downlink(r, blob, prev) != SPES_OK) goto fail;
    blob->step = round->step;
    blob->len = r->aggregate_len;
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
    if (r->kept[slot]) blob_unref(r, r->kept[slot]);
    r->kept[slot] = blob;
    if (blob->step > r->last_completed_step) {
        r->prev_completed_step = r->last_completed_step;
        r->last_completed_step = blob->step;
    }
    r->stats.rounds_completed++;
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
    if (round) free_round(r, round);
    if (round) sweep_rounds(r, r->last_completed_step + 1);
    pthread_cond_broadcast(&r->changed);
    return dropped;
}

// Parses and validates an upload against the spec into the round's slot for peer.
RoundsResult rounds_check_upload(Rounds *r, int peer, int step, const uint8_t *bytes, size_t len, SafeTensors *st,
                                 const StTensor **row) {
    char what[64];
    snprintf(what, sizeof what, "upload from peer %d for step %d", peer, step);
    if (safetensors_parse(bytes, len, what, st) != SPES_OK) return ROUNDS_BAD_REQUEST;
    bool is_int8 = false;
    int base = -1;
    RoundsResult code = upload_kind(r, peer, step, st, &is_int8, &base);
    if (code == ROUNDS_OK && is_int8) code = int8_upload_walk(r, peer, step, st, base, NULL);
    if (code != ROUNDS_OK || is_int8) {
        if (code != ROUNDS_OK) safetensors_close(st);
        return code;
    }
    if (upload_check(&r->spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, st, row) != SPES_OK) {
        safetensors_close(st);
        spes_fail_context("step %d", step);
        return ROUNDS_BAD_REQUEST;
    }
    return ROUNDS_OK;
}

// Infers the spec from the first upload of a peer that never said Hello. Under r->mu.
static RoundsResult infer_spec(Rounds *r, int peer, const uint8_t *bytes, size_t len) {
    SafeTensors st;
    if (safetensors_parse(bytes, len, "first upload (model spec inferred from it)", &st) != SPES_OK)
        return ROUNDS_BAD_REQUEST;
    ModelSpec spec;
    int E = r->cfg.agg.num_peers * r->cfg.agg.experts_per_node;
    if (model_spec_infer_from_upload(&st, r->cfg.agg.mode, E, &spec) != SPES_OK) {
        safetensors_close(&st);
        return ROUNDS_BAD_REQUEST;
    }
    DType dtype = st.count > 0 ? st.tensors[0].dtype : DTYPE_F32;
    if (dtype != DTYPE_BF16) dtype = DTYPE_F32;
    // Validate the upload against what it implies before adopting anything from it.
    const StTensor **row = spes_calloc((size_t)spec.count, sizeof *row);
    RoundsResult code = ROUNDS_NO_ROOM;
    if (row) {
        code = upload_check(&spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, &st, row) == SPES_OK
                   ? rounds_adopt_spec(r, &spec, dtype, true)
                   : ROUNDS_BAD_REQUEST;
        if (code == ROUNDS_OK)
            log_info("server: no Hello before the first upload; model spec inferred from peer %d's upload", peer);
    }
    free(row);
    model_spec_free(&spec);
    safetensors_close(&st);
    return code;
}

static RoundsResult reject(Rounds *r, RoundsResult code, uint8_t *bytes) {
    free(bytes);
    pthread_mutex_lock(&r->mu);
    r->stats.uploads_rejected++;
    pthread_mutex_unlock(&r->mu);
    log_refusal("upload");
    return code;
}

// The answer to an upload for a step that is already aggregated: ALREADY_EXISTS when the
// aggregate holds this peer's upload (a retry after a lost reply: download it), ABORTED when
// the round closed without it or is no longer kept (fetch the newest aggregate, carry on).
// Under r->mu.
static RoundsResult closed_round(Rounds *r, int peer, int step) {
    for (int i = 0; i < r->cfg.keep_steps; i++) {
        const AggregateBlob *b = r->kept[i];
        if (b && b->step == step && (!b->included || b->included[peer]))
            return rounds_fail(
                ROUNDS_ALREADY_AGGREGATED,
                "upload from peer %d: the round of step %d is already aggregated (last completed step %d); download it",
                peer, step, r->last_completed_step);
    }
    return rounds_fail(ROUNDS_CLOSED_WITHOUT_PEER,
                       "upload from peer %d: the round of step %d closed without it (round timeout) or is no longer "
                       "kept; fetch the newest aggregate (step %d) and carry on",
                       peer, step, r->last_completed_step);
}

// The answer to an upload for a step beyond step_limit. Under r->mu.
static RoundsResult too_far_ahead(Rounds *r, int peer, int step) {
    int64_t limit = step_limit(r, step);
    if (r->last_completed_step >= 0)
        return rounds_fail(ROUNDS_TOO_FAR_AHEAD,
                           "upload from peer %d: step %d is more than %d rounds ahead of the newest completed step %d "
                           "(steps up to %lld are taken; is the peer's step counter or sync_steps right?)",
                           peer, step, r->cfg.max_rounds_ahead, r->last_completed_step, (long long)limit);
    return rounds_fail(ROUNDS_TOO_FAR_AHEAD,
                       "upload from peer %d: step %d is too far ahead of the run's first round (steps up to %lld are "
                       "taken before a round completes; is the peer's step counter right?)",
                       peer, step, (long long)limit);
}

RoundsResult rounds_upload_start(Rounds *r, int peer, int step, size_t *cap) {
    int P = r->cfg.agg.num_peers;
    *cap = 0;
    if (peer < 0 || peer >= P)
        return rounds_fail(ROUNDS_BAD_REQUEST, "upload: peer_id %d is outside [0, %d)", peer, P);
    if (step < 0)
        return rounds_fail(ROUNDS_BAD_REQUEST, "upload from peer %d: step %d is negative", peer, step);
    pthread_mutex_lock(&r->mu);
    RoundsResult code = r->closing                     ? rounds_fail(ROUNDS_CLOSING, "server is shutting down")
                            : step <= r->last_completed_step ? closed_round(r, peer, step)
                            : step > step_limit(r, step)     ? too_far_ahead(r, peer, step)
                                                             : ROUNDS_OK;
    *cap = r->have_spec ? upload_max_bytes(&r->spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer)
                        : r->cfg.max_upload_bytes;
    pthread_mutex_unlock(&r->mu);
    return code;
}

size_t rounds_largest_upload(Rounds *r) {
    pthread_mutex_lock(&r->mu);
    // Every peer sends the shared tensors and m experts of each MoE layer (all alike), or in
    // fedavg everything: peer 0's cap is every peer's.
    size_t largest = r->have_spec ? upload_max_bytes(&r->spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, 0) : 0;
    pthread_mutex_unlock(&r->mu);
    return largest;
}

void rounds_retain(Rounds *r, AggregateBlob *blob) {
    pthread_mutex_lock(&r->mu);
    blob->refs++;
    pthread_mutex_unlock(&r->mu);
}

size_t rounds_model_bytes(Rounds *r) {
    pthread_mutex_lock(&r->mu);
    size_t bytes = r->have_spec ? r->spec.total_numel * 4 : 0;
    pthread_mutex_unlock(&r->mu);
    return bytes;
}

// Whether an upload for step would be taken now (step not yet aggregated). Sets *code and the
// message when not. Takes r->mu.
static bool round_accepts(Rounds *r, int peer, int step, RoundsResult *code) {
    pthread_mutex_lock(&r->mu);
    *code = step <= r->last_completed_step   ? closed_round(r, peer, step)
            : step > step_limit(r, step) ? too_far_ahead(r, peer, step)
                                             : ROUNDS_OK;
    for (int i = 0; *code == ROUNDS_OK && i < r->cfg.max_open_rounds; i++)
        if (r->open[i].step == step && r->open[i].aggregating)   // its files are being read: leave them
            *code = r->open[i].uploaded[peer]
                        ? rounds_fail(ROUNDS_ALREADY_AGGREGATED,
                                      "upload from peer %d: the round of step %d is being aggregated", peer, step)
                        : rounds_fail(ROUNDS_CLOSED_WITHOUT_PEER,
                                      "upload from peer %d: the round of step %d is closing without it (round "
                                      "timeout); fetch the newest aggregate and carry on",
                                      peer, step);
    pthread_mutex_unlock(&r->mu);
    return *code == ROUNDS_OK;
}

// Records a validated upload, already in upload_dir, in its round. *complete: every peer's
// upload is in, the caller aggregates.
RoundsResult rounds_store_upload(Rounds *r, int peer, int step, size_t len, OpenRound **round_out, bool *complete) {
    int P = r->cfg.agg.num_peers;
    RoundsResult code = ROUNDS_OK;
    pthread_mutex_lock(&r->mu);
    OpenRound *round = NULL;
    if (step > r->last_completed_step) sweep_rounds(r, step);
    if (step <= r->last_completed_step) {
        code = closed_round(r, peer, step);
    } else if (step > step_limit(r, step)) {
        code = too_far_ahead(r, peer, step);
    } else if (!(round = open_round(r, step))) {
        code = rounds_fail(ROUNDS_NO_ROOM,
                           "upload from peer %d for step %d: %d rounds are already open (peers far apart in steps?)",
                           peer, step, r->cfg.max_open_rounds);
    } else if (round->aggregating && round->uploaded[peer]) {
        code = rounds_fail(ROUNDS_ALREADY_AGGREGATED, "upload from peer %d: the round of step %d is being aggregated",
                           peer, step);
    } else if (round->aggregating) {
        code = rounds_fail(ROUNDS_CLOSED_WITHOUT_PEER,
                           "upload from peer %d: the round of step %d is closing without it (round timeout); fetch "
                           "the newest aggregate and carry on",
                           peer, step);
    }
    if (code != ROUNDS_OK) {
        pthread_mutex_unlock(&r->mu);
        return code;
    }
    if (!round->uploaded[peer]) round->num_uploaded++;   // else a retry: its file replaced the previous one
    round->uploaded[peer] = true;
    r->stats.bytes_received += (int64_t)len;
    round->bytes_in += (int64_t)len;
    *complete = round->num_uploaded == P;
    if (*complete) round->aggregating = true;
    *round_out = round;
    pthread_mutex_unlock(&r->mu);
    return ROUNDS_OK;
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
        pthread_mutex_lock(&r->mu);
        StateBook book = {r->last_completed_step > step ? r->last_completed_step : step, r->stats.rounds_completed + 1,
                          r->rounds_partial + (blob->included != NULL)};
        pthread_mutex_unlock(&r->mu);
        if ((outer_bytes && state_save_outer(dir, step, outer_bytes, outer_len) != SPES_OK) ||
            (blob->included && state_save_included(dir, step, blob->included, P) != SPES_OK) ||
            (blob->delta && state_save_delta(dir, step, blob->delta, blob->delta_len) != SPES_OK) ||
            state_save_aggregate(dir, step, blob->bytes, blob->len) != SPES_OK || state_save_book(dir, &book) != SPES_OK) {
            pthread_mutex_unlock(&r->persist_mu);
            return SPES_ERR;
        }
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
                     "(missing:%s; their experts keep the previous aggregate's values)",
                     step, arrived, P, seconds, missing);
        }
        return ROUNDS_OK;
    }
    if (blob) {   // not durable: not published either
        code = ROUNDS_INTERNAL;
        free(blob->bytes);
        free(blob);
    }
    // Drop this peer's upload so that its retry completes the round again (a partial round
    // is simply reopened: the next waiter tries again).
    pthread_mutex_lock(&r->mu);
    if (peer >= 0) {
        round->uploaded[peer] = false;
        round->num_uploaded--;
    }
    round->aggregating = false;
    pthread_mutex_unlock(&r->mu);
    spes_fail_context("aggregating step %d (retry the upload)", step);
    return code;
}

RoundsResult rounds_upload_begin(Rounds *r, int peer, int step, RoundsUpload *up) {
    memset(up, 0, sizeof *up);
    up->file.fd = -1;
    up->peer = peer;
    up->step = step;
    if (state_upload_open(r->upload_dir, step, peer, &up->file) != SPES_OK)
        return rounds_fail(ROUNDS_INTERNAL, "upload from peer %d for step %d: %s", peer, step, spes_last_error());
    return ROUNDS_OK;
}

RoundsResult rounds_upload_append(RoundsUpload *up, const void *data, size_t len) {
    if (state_upload_append(&up->file, data, len) != SPES_OK)
        return rounds_fail(ROUNDS_INTERNAL, "upload from peer %d for step %d: %s", up->peer, up->step,
                           spes_last_error());
    return ROUNDS_OK;
}

void rounds_upload_abort(RoundsUpload *up) { state_upload_abort(&up->file); }

// Validates the upload in its (complete) temp file like check_upload, reading the values a
// window at a time and letting go of each window's pages once checked: validating an upload
// costs a window of memory, not the upload.
static RoundsResult check_upload_file(Rounds *r, int peer, int step, const MappedFile *mf) {
    enum { WINDOW = 1 << 20 };
    char what[64];
    snprintf(what, sizeof what, "upload from peer %d for step %d", peer, step);
    SafeTensors st;
    if (safetensors_parse(mf->data, mf->size, what, &st) != SPES_OK) return ROUNDS_BAD_REQUEST;
    bool is_int8 = false;
    int base = -1;
    RoundsResult code = upload_kind(r, peer, step, &st, &is_int8, &base);
    if (code == ROUNDS_OK && is_int8) code = int8_upload_walk(r, peer, step, &st, base, NULL);
    if (code != ROUNDS_OK || is_int8) {   // an int8 delta is a quarter of the F32 size: checked whole
        safetensors_close(&st);
        return code;
    }
    const StTensor **row = spes_calloc((size_t)r->spec.count, sizeof *row);
    if (!row) {
        safetensors_close(&st);
        return ROUNDS_NO_ROOM;
    }
    if (upload_rows(&r->spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, peer, &st, row) != SPES_OK)
        code = ROUNDS_BAD_REQUEST;
    for (int i = 0; code == ROUNDS_OK && i < st.count; i++) {   // upload order: the file is read front to back
        const StTensor *u = &st.tensors[i];
        size_t elem = dtype_size(u->dtype), per = WINDOW / elem;
        for (size_t at = 0; code == ROUNDS_OK && at < u->numel; at += per) {
            StTensor w = *u;
            w.data = u->data + at * elem;
            w.numel = u->numel - at < per ? u->numel - at : per;
            w.nbytes = w.numel * elem;
            size_t bad = upload_first_non_finite(&w);
            if (bad < w.numel) {
                spes_fail("upload from peer %d: tensor '%s' has a non-finite value (NaN or Inf) at flat index %zu",
                          peer, u->name, at + bad);
                code = ROUNDS_BAD_REQUEST;
            }
            drop_pages(mf, w.data, w.nbytes);
        }
    }
    if (code == ROUNDS_BAD_REQUEST) spes_fail_context("step %d", step);
    free(row);
    safetensors_close(&st);
    return code;
}

static RoundsResult reject_upload(Rounds *r, RoundsResult code, RoundsUpload *up) {
    rounds_upload_abort(up);
    return reject(r, code, NULL);
}

RoundsResult rounds_upload_finish(Rounds *r, RoundsUpload *up) {
    int P = r->cfg.agg.num_peers, peer = up->peer, step = up->step;
    if (peer < 0 || peer >= P)
        return reject_upload(
            r, rounds_fail(ROUNDS_BAD_REQUEST, "upload: peer_id %d is outside [0, %d)", peer, P), up);
    if (step < 0)
        return reject_upload(
            r, rounds_fail(ROUNDS_BAD_REQUEST, "upload from peer %d: step %d is negative", peer, step), up);
    size_t len = up->file.len;
    MappedFile mf;
    if (file_map(up->file.temp_path, &mf) != SPES_OK)
        return reject_upload(r,
                             rounds_fail(ROUNDS_INTERNAL, "upload from peer %d for step %d: %s", peer, step,
                                         spes_last_error()),
                             up);

    pthread_mutex_lock(&r->mu);
    RoundsResult code = r->closing ? ROUNDS_CLOSING : ROUNDS_OK;
    if (r->closing) spes_fail("server is shutting down");
    if (code == ROUNDS_OK && !r->have_spec) {
        code = infer_spec(r, peer, mf.data, mf.size);
        drop_pages(&mf, mf.data, mf.size);
    }
    pthread_mutex_unlock(&r->mu);
    // The spec never changes once set, so the (slow) validation runs outside the lock.
    if (code == ROUNDS_OK) code = check_upload_file(r, peer, step, &mf);
    file_unmap(&mf);
    if (code != ROUNDS_OK) return reject_upload(r, code, up);

    // On disk (durably in a state dir) before the peer hears OK; the round reads it back when it
    // aggregates. A file that loses a race with the round's completion below is a leftover of a
    // completed step, removed at the next start (or with the spool).
    if (!round_accepts(r, peer, step, &code) || state_upload_commit(&up->file) != SPES_OK) {
        if (code == ROUNDS_OK)
            code = rounds_fail(ROUNDS_INTERNAL, "upload from peer %d for step %d: %s", peer, step,
                               spes_last_error());
        return reject_upload(r, code, up);
    }
    OpenRound *round;
    bool complete;
    code = rounds_store_upload(r, peer, step, len, &round, &complete);
    if (code != ROUNDS_OK) return reject(r, code, NULL);
    log_info("server: step %d: upload from peer %d accepted (%zu bytes)", step, peer, len);
    peer_watch_uploaded(r->watch, peer, step);
    return complete ? rounds_complete_round(r, round, peer) : ROUNDS_OK;
}

RoundsResult rounds_upload(Rounds *r, int peer, int step, uint8_t *bytes, size_t len) {
    RoundsUpload up;
    RoundsResult code = rounds_upload_begin(r, peer, step, &up);
    if (code == ROUNDS_OK) code = rounds_upload_append(&up, bytes, len);
    free(bytes);
    if (code != ROUNDS_OK) return reject_upload(r, code, &up);
    return rounds_upload_finish(r, &up);
}

// With a round timeout: the open round of step if it is past its deadline and may close
// partially (quorum reached; in spes mode an earlier aggregate exists for the missing owners'
// experts), frozen for the caller to aggregate. Otherwise NULL, and *due (monotonic seconds)
// says when to look again (0: no deadline to wait for). Under r->mu.
static OpenRound *overdue_round(Rounds *r, int step, double *due) {
    *due = 0;
    if (r->cfg.round_timeout_s <= 0) return NULL;
    OpenRound *round = NULL;
    for (int i = 0; i < r->cfg.max_open_rounds; i++)
        if (r->open[i].step == step) round = &r->open[i];
    if (!round || round->aggregating) return NULL;
    bool have_earlier = false;
    for (int i = 0; i < r->cfg.keep_steps; i++) have_earlier |= r->kept[i] && r->kept[i]->step < step;
    RoundWait wait = {.round_timeout_s = r->cfg.round_timeout_s, .opened_at = round->opened_at, .now = now_seconds(),
                      .recent = r->recent, .n_recent = r->n_recent, .uploaded = round->num_uploaded,
                      .min_peers = r->cfg.min_peers, .needs_earlier = r->cfg.agg.mode == SYNC_MODE_SPES,
                      .have_earlier = have_earlier};
    switch (round_wait_decide(&wait, due)) {
    case ROUND_KEEP_WAITING: return NULL;
    case ROUND_PAST_DEADLINE_NO_QUORUM:
        if (!round->warned)
            log_warn("server: step %d: round timeout passed with %d of %d peers (quorum --min_peers %d%s); still waiting",
                     step, round->num_uploaded, r->cfg.agg.num_peers, r->cfg.min_peers,
                     have_earlier || r->cfg.agg.mode != SYNC_MODE_SPES ? "" : "; no earlier aggregate for missing experts");
        round->warned = true;
        return NULL;
    case ROUND_CLOSE_PARTIAL: break;
    }
    round->aggregating = true;
    return round;
}

static struct timespec monotonic_at(double seconds) {
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

// The kept aggregate of step with a reference, or NULL. Under r->mu.
AggregateBlob *rounds_find_kept(Rounds *r, int step) {
    for (int i = 0; i < r->cfg.keep_steps; i++)
        if (r->kept[i] && r->kept[i]->step == step) {
            r->kept[i]->refs++;
            return r->kept[i];
        }
    return NULL;
}

RoundsResult rounds_get(Rounds *r, int step, double timeout_s, AggregateBlob **out) {
    *out = NULL;
    double until = now_seconds() + (timeout_s > 0 ? timeout_s : 0);
    pthread_mutex_lock(&r->mu);
    RoundsResult code = ROUNDS_OK;
    for (;;) {
        if ((*out = rounds_find_kept(r, step))) break;
        if (step <= r->last_completed_step) {
            code = rounds_fail(ROUNDS_NOT_KEPT,
                               "the aggregate of step %d is no longer kept (--keep_steps %d; latest step %d)", step,
                               r->cfg.keep_steps, r->last_completed_step);
            break;
        }
        if (r->closing) {
            code = rounds_fail(ROUNDS_CLOSING, "server is shutting down");
            break;
        }
        double due;
        OpenRound *late = overdue_round(r, step, &due);
        if (late) {   // this waiter closes the round with the peers that arrived
            pthread_mutex_unlock(&r->mu);
            code = rounds_complete_round(r, late, -1);
            pthread_mutex_lock(&r->mu);
            if (code == ROUNDS_OK) continue;
            log_warn("server: step %d: partial aggregation failed: %s", step, spes_last_error());
            break;
        }
        double wake = due > 0 && due < until ? due : until;
        if (timeout_s <= 0) break;
        struct timespec at = monotonic_at(wake);
        if (pthread_cond_timedwait(&r->changed, &r->mu, &at) == ETIMEDOUT && wake >= until) {
            *out = rounds_find_kept(r, step);   // a publish may have raced the timeout
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return code;
}

// Whether tensor `name` of an aggregate image (an I8 delta's "<name>.scale" counts as its
// tensor's) is one of peer's own experts.
static bool own_expert(const Rounds *r, int peer, const char *name) {
    size_t len = strlen(name);
    char base[1024];
    if (len > 6 && len < sizeof base && strcmp(name + len - 6, ".scale") == 0) {
        memcpy(base, name, len - 6);
        base[len - 6] = '\0';
        name = base;
    }
    int t = model_spec_find(&r->spec, name);
    return t >= 0 && r->spec.tensors[t].expert >= 0 && r->spec.tensors[t].expert / r->cfg.agg.experts_per_node == peer;
}

RoundsResult rounds_view(Rounds *r, AggregateBlob *blob, int peer, const RoundsViewRequest *req,
                             const AggregateView **view, const char **name) {
    int P = r->cfg.agg.num_peers;
    bool omit = req->omit_own_experts && r->cfg.agg.mode == SYNC_MODE_SPES && peer >= 0 && peer < P &&
                r->spec.num_experts > 0 && (!blob->included || blob->included[peer]) &&
                aggregate_merge_alpha(&r->cfg.agg, blob->step) == 0.0f;
    bool delta = req->has_delta_base && blob->delta && blob->delta_base == req->delta_base_step;
    // In an int8 run a peer completes its own experts from the previous aggregate and what it
    // uploaded (docs/communication.md): only a peer holding that aggregate (asking for the delta) can.
    omit = omit && (!r->int8 || delta);
    static const char *names[2][2] = {{"", ROUNDS_VIEW_OMIT_OWN}, {ROUNDS_VIEW_INT8, ROUNDS_VIEW_INT8 "+" ROUNDS_VIEW_OMIT_OWN}};
    *name = names[delta][omit];
    int slot = (delta ? P + 1 : 0) + (omit ? peer : P);
    RoundsResult code = ROUNDS_OK;
    pthread_mutex_lock(&r->mu);
    if (!blob->views) blob->views = spes_calloc(2 * ((size_t)P + 1), sizeof *blob->views);
    AggregateView *v = blob->views ? &blob->views[slot] : NULL;
    if (!v) code = rounds_fail(ROUNDS_NO_ROOM, "download of step %d: out of memory", blob->step);
    if (v && !v->pieces && !omit) {
        if (aggregate_view_whole(delta ? blob->delta : blob->bytes, delta ? blob->delta_len : blob->len, v) != SPES_OK)
            code = ROUNDS_NO_ROOM;
    } else if (v && !v->pieces) {
        const uint8_t *image = delta ? blob->delta : blob->bytes;
        size_t image_len = delta ? blob->delta_len : blob->len;
        SafeTensors st;
        bool *keep = NULL;
        int rc = safetensors_parse(image, image_len, "aggregate", &st);
        if (rc == SPES_OK) {
            keep = spes_calloc(st.count > 0 ? (size_t)st.count : 1, sizeof *keep);
            rc = keep ? SPES_OK : SPES_ERR;
            for (int i = 0; keep && i < st.count; i++) keep[i] = !(omit && own_expert(r, peer, st.tensors[i].name));
            if (rc == SPES_OK) rc = aggregate_view_build(&st, keep, *name, v);
            safetensors_close(&st);
        }
        free(keep);
        if (rc != SPES_OK)
            code = rounds_fail(ROUNDS_INTERNAL, "download of step %d for peer %d: %s", blob->step, peer,
                               spes_last_error());
    }
    pthread_mutex_unlock(&r->mu);
    *view = code == ROUNDS_OK ? v : NULL;
    return code;
}

void rounds_release(Rounds *r, AggregateBlob *blob) {
    if (!blob) return;
    pthread_mutex_lock(&r->mu);
    blob_unref(r, blob);
    pthread_mutex_unlock(&r->mu);
}

void rounds_count_rejected(Rounds *r) {
    pthread_mutex_lock(&r->mu);
    r->stats.uploads_rejected++;
    pthread_mutex_unlock(&r->mu);
}

void rounds_count_sent(Rounds *r, int step, size_t bytes) {
    pthread_mutex_lock(&r->mu);
    r->stats.bytes_sent += (int64_t)bytes;
    pthread_mutex_unlock(&r->mu);
    peer_watch_sent(r->watch, step, (int64_t)bytes);
}

PeerWatch *rounds_watch(Rounds *r) { return r->watch; }

void rounds_status(Rounds *r, RoundsStatus *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->stats;
    out->total_peers = r->cfg.agg.num_peers;
    out->mode = r->cfg.agg.mode;
    out->open_step = -1;
    out->num_uploaded = 0;
    const OpenRound *lowest = NULL;
    for (int i = 0; i < r->cfg.max_open_rounds; i++)
        if (r->open[i].step >= 0 && (!lowest || r->open[i].step < lowest->step)) lowest = &r->open[i];
    if (lowest) {
        out->open_step = lowest->step;
        for (int p = 0; p < r->cfg.agg.num_peers && out->num_uploaded < 1024; p++)
            if (lowest->uploaded[p]) out->peers_uploaded[out->num_uploaded++] = p;
    }
    pthread_mutex_unlock(&r->mu);
}

int rounds_run_status(Rounds *r, RunStatus *out) {
    int P = r->cfg.agg.num_peers;
    if (run_status_alloc(out, P) != 0) return spes_fail("server status: out of memory");
    bool *awaited = spes_calloc((size_t)P, sizeof *awaited);
    if (!awaited) {
        run_status_free(out);
        return SPES_ERR;
    }
    out->now_unix = peer_watch_now();
    rounds_status(r, &out->rounds);
    pthread_mutex_lock(&r->mu);
    const OpenRound *lowest = NULL;
    for (int i = 0; i < r->cfg.max_open_rounds; i++)
        if (r->open[i].step >= 0 && (!lowest || r->open[i].step < lowest->step)) lowest = &r->open[i];
    double open_wait_s = lowest ? now_seconds() - lowest->opened_at : 0;
    for (int p = 0; lowest && p < P; p++) awaited[p] = !lowest->uploaded[p];
    double recent[ROUNDS_RECENT];
    int n_recent = r->n_recent < ROUNDS_RECENT ? r->n_recent : ROUNDS_RECENT;
    memcpy(recent, r->recent, sizeof recent);
    double deadline = r->cfg.round_timeout_s > 0 ? rounds_deadline(r->cfg.round_timeout_s, recent, n_recent) : 0;
    pthread_mutex_unlock(&r->mu);
    peer_watch_fill(r->watch, lowest ? awaited : NULL, open_wait_s, recent, n_recent, deadline, out);
    free(awaited);
    return SPES_OK;
}

int rounds_last_completed_step(Rounds *r) {
    pthread_mutex_lock(&r->mu);
    int step = r->last_completed_step;
    pthread_mutex_unlock(&r->mu);
    return step;
}
