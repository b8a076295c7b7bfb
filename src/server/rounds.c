// The round state machine of the parameter server (rounds.h): the handshake, uploads taken into
// open rounds, rounds closed when complete or past their deadline (round_deadline.h), the kept
// aggregates and the views peers download. Aggregating a closed round: rounds_aggregate.c;
// reloading a state dir at start: rounds_restore.c; what they share: rounds_internal.h.
#include "server/rounds.h"

#include <errno.h>
#include <stdarg.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/timer.h"
#include "server/expert_rotation.h"
#include "server/peer_watch.h"
#include "server/rounds_internal.h"
#include "server/server_state.h"
#include "server/state_space.h"
#include "server/upload_check.h"
#include "sync/aggregate_step.h"
#include "sync/expert_owners.h"



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
    if (cfg->keep_steps < 1 || cfg->keep_steps > STATE_MAX_KEPT)
        return spes_fail("server: keep_steps must be in [1, %d] (got %d)", STATE_MAX_KEPT, cfg->keep_steps);
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
    if (r->outer_on && r->cfg.agg.rotation_steps > 0) {
        spes_fail("server: --expert_rotation_steps with an outer optimizer (--outer_lr %g --outer_momentum %g) is not "
                  "supported: its state of the router rows would stay where the experts left",
                  (double)r->cfg.outer.lr, (double)r->cfg.outer.momentum);
        free(r);
        return SPES_ERR;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->persist_mu, NULL);
    pthread_mutex_init(&r->aggregate_mu, NULL);
    pthread_mutex_init(&r->commit_mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&r->changed, &attr);
    pthread_condattr_destroy(&attr);
    r->open = spes_calloc((size_t)cfg->max_open_rounds, sizeof(OpenRound));
    r->kept = spes_calloc((size_t)cfg->keep_steps, sizeof(AggregateBlob *));
    r->instance = spes_calloc((size_t)cfg->agg.num_peers + 1, sizeof *r->instance);
    r->newest_attempt = spes_calloc((size_t)cfg->agg.num_peers + 1, sizeof *r->newest_attempt);
    if (!r->open || !r->kept || !r->instance || !r->newest_attempt) {
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

void rounds_free_round(Rounds *r, OpenRound *round) {
    free(round->uploaded);
    memset(round, 0, sizeof *round);
    round->step = -1;
}

// Drops a reference; the last one frees the blob (keeping its bytes as the spare). Under r->mu.
void rounds_blob_unref(Rounds *r, AggregateBlob *blob) {
    if (--blob->refs > 0) return;
    for (int i = 0; blob->views && i < 2 * (r->cfg.agg.num_peers + 1); i++) aggregate_view_free(&blob->views[i]);
    free(blob->views);
    free(blob->delta);
    if (!r->spare) r->spare = blob->bytes;   // every blob's bytes hold aggregate_cap
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
    for (int i = 0; r->open && i < r->cfg.max_open_rounds; i++) rounds_free_round(r, &r->open[i]);
    for (int i = 0; r->kept && i < r->cfg.keep_steps; i++)
        if (r->kept[i]) rounds_blob_unref(r, r->kept[i]);
    free(r->spare);
    free(r->open);
    free(r->kept);
    free(r->instance);
    free(r->newest_attempt);
    free(r->tensor_offset);
    model_spec_free(&r->spec);
    outer_opt_state_free(&r->outer);
    peer_watch_free(r->watch);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->persist_mu);
    pthread_mutex_destroy(&r->aggregate_mu);
    pthread_mutex_destroy(&r->commit_mu);
    if (r->own_upload_dir) remove_tree(r->upload_dir);
    if (r->own_upload_dir) free(r->upload_dir);
    pthread_cond_destroy(&r->changed);
    state_close(r->lock_fd);
    free(r);
}

// The safetensors header of an aggregate stating step_text as its spes_step (aggregate_step.h):
// every tensor of the spec in spec order, in the payload dtype; *data_len: the bytes they take.
// From the header alone: a Hello of a few hundred bytes may declare any size, so nothing
// model-sized is allocated here (issue 29).
static int build_aggregate_header(const Rounds *r, const char *step_text, char **header, size_t *header_len,
                                  size_t *data_len) {
    const ModelSpec *spec = &r->spec;
    StWriteTensor *w = spes_calloc((size_t)spec->count + 1, sizeof *w);
    if (!w) return SPES_ERR;
    for (int t = 0; t < spec->count; t++) {
        w[t].name = spec->tensors[t].name;
        w[t].dtype = r->payload_dtype;
        w[t].ndim = spec->tensors[t].ndim;
        memcpy(w[t].shape, spec->tensors[t].shape, sizeof w[t].shape);
    }
    const char *keys[] = {SYNC_META_STEP}, *values[] = {step_text};
    int rc = safetensors_build_header(w, spec->count, keys, values, 1, header, header_len, data_len);
    free(w);
    return rc;
}

// Fixes the aggregate's layout once: each tensor's offset in the data, and room for the header
// of the widest step (10 digits). Every round then writes its header (rounds_aggregate_header)
// and aggregates straight into the data behind it.
static int plan_aggregate_layout(Rounds *r) {
    char *header = NULL;
    size_t header_len = 0, data_len = 0, elem = dtype_size(r->payload_dtype);
    r->tensor_offset = spes_calloc((size_t)r->spec.count + 1, sizeof(size_t));
    int rc = r->tensor_offset ? build_aggregate_header(r, "2147483647", &header, &header_len, &data_len) : SPES_ERR;
    if (rc == SPES_OK) {
        size_t at = 0;
        for (int t = 0; t < r->spec.count; t++) {
            r->tensor_offset[t] = at;
            at += r->spec.tensors[t].numel * elem;
        }
        r->header_cap = header_len;
        r->data_len = data_len;
        r->aggregate_cap = header_len + data_len;
    }
    free(header);
    return rc;
}

int rounds_aggregate_header(const Rounds *r, int step, uint8_t *out, size_t *header_len) {
    char step_text[16], *header = NULL;
    snprintf(step_text, sizeof step_text, "%d", step);
    size_t data_len = 0;
    SPES_TRY(build_aggregate_header(r, step_text, &header, header_len, &data_len));
    int rc = *header_len <= r->header_cap ? SPES_OK   // the widest step's was planned for
                                          : spes_fail("aggregate of step %d: a header of %zu bytes, room for %zu",
                                                      step, *header_len, r->header_cap);
    if (rc == SPES_OK) memcpy(out, header, *header_len);
    free(header);
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

// What the upload dir needs for a round of this run (state_space.h): uploads in the peers'
// payload dtype (F32 in delta runs: a peer without a base uploads whole), aggregates as planned,
// and beside each its delta (codes and block scales) and the outer optimizer's state.
void rounds_check_space(Rounds *r, int kept_now) {
    const ModelSpec *spec = &r->spec;
    StateSpace s = {.peers = r->cfg.agg.num_peers, .upload = 64 * 1024, .keep_steps = r->cfg.keep_steps};
    size_t elem = r->wire_dtype == DTYPE_BF16 ? 2 : 4;
    for (int t = 0; t < spec->count; t++)
        if (model_spec_peer_sends(spec, r->cfg.agg.mode, r->cfg.agg.experts_per_node, 0, t))
            s.upload += spec->tensors[t].numel * elem + 256;
    if (r->cfg.state_dir) {
        s.aggregate = r->aggregate_cap;
        if (r->delta_run) s.beside += spec->total_numel + 4 * delta_blocks(spec->total_numel) + 64 * 1024;
        if (r->outer_on) s.beside += outer_opt_state_size(&r->outer);
    }
    state_space_check(r->upload_dir, r->cfg.state_dir ? "--state_dir" : "--spool_dir", &s, kept_now);
}

// Takes the spec (moving it out of *spec) and plans the aggregate layout; with a state dir and
// `persist`, writes it there first. Under r->mu.
RoundsResult rounds_adopt_spec(Rounds *r, ModelSpec *spec, DType payload_dtype, const DeltaCodec *delta, bool persist) {
    delta = payload_dtype != DTYPE_I8 ? NULL : delta ? delta : &DELTA_INT8;
    const char *payload_name = delta ? delta->wire : dtype_name(payload_dtype);
    if (aggregate_config_check(&r->cfg.agg, spec) != SPES_OK) return ROUNDS_MISMATCH;
    if (persist && r->cfg.state_dir &&
        state_save_spec(r->cfg.state_dir, &r->cfg.agg, &r->cfg.outer, spec, payload_name) != SPES_OK) {
        log_error("server: cannot write the model spec to the state dir: %s", spes_last_error());
        spes_fail_context("the server cannot store the run's spec now (retry later)");
        return ROUNDS_STORAGE;   // peers retry the Hello
    }
    r->spec = *spec;
    model_spec_init(spec);
    r->wire_dtype = payload_dtype;
    r->delta_run = payload_dtype == DTYPE_I8;
    r->delta = delta;
    r->payload_dtype = r->delta_run ? DTYPE_F32 : payload_dtype;
    if (plan_aggregate_layout(r) != SPES_OK || (r->outer_on && outer_state_fresh(r) != SPES_OK)) {
        free(r->tensor_offset);
        r->tensor_offset = NULL;
        model_spec_free(&r->spec);
        return ROUNDS_NO_ROOM;
    }
    r->have_spec = true;
    r->stats.fingerprint = r->spec.fingerprint;
    if (persist) rounds_check_space(r, 0);   // a new run (a restored one is checked once its aggregates are in)
    log_info(
        "server: model spec fixed: %d tensors, %zu values, %d experts x %d MoE layers, payload %s, fingerprint %016llx",
        r->spec.count, r->spec.total_numel, r->spec.num_experts, r->spec.num_moe_layers, payload_name,
        (unsigned long long)r->spec.fingerprint);
    return ROUNDS_OK;
}

RoundsResult rounds_peer_instance(Rounds *r, int peer, uint64_t instance, bool hello, const char *what) {
    if (instance == 0 || peer < 0 || peer >= r->cfg.agg.num_peers) return ROUNDS_OK;   // not stated; bad ids: refused elsewhere
    pthread_mutex_lock(&r->mu);
    uint64_t holder = r->instance[peer];
    RoundsResult code = ROUNDS_OK;
    if (holder == 0 || holder == instance) {
        r->instance[peer] = instance;
    } else if (hello) {
        r->instance[peer] = instance;
        log_warn("server: peer %d: a new process (instance %016llx) said Hello and now holds the peer_id; the calls of "
                 "the previous one (instance %016llx) are refused from now on (a restarted peer, or two processes "
                 "sharing a peer_id)",
                 peer, (unsigned long long)instance, (unsigned long long)holder);
    } else {
        code = rounds_fail(ROUNDS_MISMATCH,
                           "%s from peer %d refused: another process (instance %016llx) said Hello as peer %d after this "
                           "one (instance %016llx) and holds the peer_id now; two live processes must not share a "
                           "peer_id (give each its own spes_config.peer_id)",
                           what, peer, (unsigned long long)holder, peer, (unsigned long long)instance);
    }
    pthread_mutex_unlock(&r->mu);
    return code;
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

RoundsResult rounds_hello_outer(const Rounds *r, int peer, const OuterOptConfig *stated) {
    if (!stated || stated->lr == 0.0f) return ROUNDS_OK;   // not stated: an older peer
    const OuterOptConfig *own = &r->cfg.outer;   // fixed at creation (and by a restored --state_dir)
    if (stated->lr != own->lr || stated->momentum != own->momentum)
        return rounds_fail(ROUNDS_MISMATCH,
                           "hello from peer %d: its config expects the outer optimizer with outer_lr %g, "
                           "outer_momentum %g, but this server runs --outer_lr %g --outer_momentum %g; set "
                           "spes_config.outer_lr / spes_config.outer_momentum to the server's, or start the server "
                           "with --outer_lr %g --outer_momentum %g",
                           peer, (double)stated->lr, (double)stated->momentum, (double)own->lr, (double)own->momentum,
                           (double)stated->lr, (double)stated->momentum);
    return ROUNDS_OK;
}

OuterOptConfig rounds_outer_config(const Rounds *r) { return r->cfg.outer; }

RoundsResult rounds_hello(Rounds *r, int peer, int num_peers, int experts_per_node, SyncMode mode,
                              DType payload_dtype, ModelSpec *spec, int *last_completed_step) {
    return rounds_hello_delta(r, peer, num_peers, experts_per_node, mode, payload_dtype, NULL, spec, last_completed_step);
}

RoundsResult rounds_hello_delta(Rounds *r, int peer, int num_peers, int experts_per_node, SyncMode mode,
                                DType payload_dtype, const DeltaCodec *delta, ModelSpec *spec, int *last_completed_step) {
    delta = payload_dtype != DTYPE_I8 ? NULL : delta ? delta : &DELTA_INT8;
    RoundsResult code = rounds_hello_settings(r, peer, num_peers, experts_per_node, mode, payload_dtype);
    if (code != ROUNDS_OK) return code;
    pthread_mutex_lock(&r->mu);
    if (!r->have_spec) {
        code = rounds_adopt_spec(r, spec, payload_dtype, delta, true);
        if (code != ROUNDS_OK) spes_fail_context("hello from peer %d", peer);
    } else if (r->spec.fingerprint != spec->fingerprint || r->spec.count != spec->count) {
        char diff[1024];
        model_spec_describe_difference(&r->spec, spec, diff, sizeof diff);
        code =
            rounds_fail(ROUNDS_MISMATCH,
                        "hello from peer %d: its model (fingerprint %016llx) differs from the server's (%016llx): %s",
                        peer, (unsigned long long)spec->fingerprint, (unsigned long long)r->spec.fingerprint, diff);
    } else if (payload_dtype != r->wire_dtype || delta != r->delta) {
        code = rounds_fail(ROUNDS_MISMATCH,
                           "hello from peer %d: payload dtype %s, but the other peers use %s", peer,
                           delta ? delta->wire : dtype_name(payload_dtype),
                           r->delta ? r->delta->wire : dtype_name(r->wire_dtype));
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
    log_warn("server: step %d: dropping the open round (%d uploads; their files %s/upload_s%d_p*.safetensors are "
             "removed): %s",
             round->step, round->num_uploaded, r->upload_dir, round->step, why);
    for (int p = 0; p < r->cfg.agg.num_peers; p++)
        if (round->uploaded[p]) state_remove_upload(r->upload_dir, round->step, p);
    rounds_free_round(r, round);
}

// Drops open rounds that can never become the newest aggregate for honest peers: steps at or
// below the newest completed one (a later round overtook them), and steps beyond step_limit
// (a peer far ahead, or a bogus step, must not hold a slot or poison the run). Rounds being
// aggregated are left alone. `step`: an upload under way (it lowers the anchor). Under r->mu.
void rounds_sweep_rounds(Rounds *r, int step) {
    int64_t limit = step_limit(r, step);
    for (int i = 0; i < r->cfg.max_open_rounds; i++) {
        OpenRound *round = &r->open[i];
        if (round->step < 0 || round->aggregating) continue;
        if (round->step <= r->last_completed_step) drop_round(r, round, "a later round completed first");
        else if (round->step > limit) drop_round(r, round, "too far ahead of the run");
    }
}

// Where an upload for step goes: its open round, else a free slot, else (every slot taken) the
// open round with the highest step, if that is above step (*evict: it gives way; the lowest
// rounds are the ones the run needs next, so a peer uploading ahead can never lock the others
// out); NULL when there is no room. Decides only; under r->mu.
static OpenRound *slot_for(Rounds *r, int step, bool *evict) {
    OpenRound *free_slot = NULL, *highest = NULL;
    *evict = false;
    for (int i = 0; i < r->cfg.max_open_rounds; i++) {
        if (r->open[i].step == step) return &r->open[i];
        if (r->open[i].step < 0 && !free_slot) free_slot = &r->open[i];
        if (r->open[i].step >= 0 && !r->open[i].aggregating && (!highest || r->open[i].step > highest->step))
            highest = &r->open[i];
    }
    if (free_slot) return free_slot;
    *evict = highest && highest->step > step;
    return *evict ? highest : NULL;
}

// The refusal of an upload for which slot_for finds no room.
static RoundsResult no_room(const Rounds *r, int peer, int step) {
    return rounds_fail(ROUNDS_NO_ROOM,
                       "upload from peer %d for step %d: %d rounds are already open (peers far apart in steps?)", peer,
                       step, r->cfg.max_open_rounds);
}

// The open round of step, creating it if needed (slot_for); NULL when there is no room. Under r->mu.
static OpenRound *open_round(Rounds *r, int step) {
    bool evict;
    OpenRound *slot = slot_for(r, step, &evict);
    if (!slot || slot->step == step) return slot;
    if (evict) {
        char why[96];
        snprintf(why, sizeof why, "every slot is taken and step %d comes first", step);
        drop_round(r, slot, why);
    }
    int P = r->cfg.agg.num_peers;
    slot->uploaded = spes_calloc((size_t)P, sizeof(bool));
    if (!slot->uploaded) {
        rounds_free_round(r, slot);
        return NULL;
    }
    slot->step = step;
    slot->opened_at = now_seconds();
    slot->opened_unix = unix_seconds();
    return slot;
}

// Parses and validates an upload against the spec into the round's slot for peer.
RoundsResult rounds_check_upload(Rounds *r, int peer, int step, const uint8_t *bytes, size_t len, SafeTensors *st,
                                 const StTensor **row) {
    char what[64];
    snprintf(what, sizeof what, "upload from peer %d for step %d", peer, step);
    if (safetensors_parse(bytes, len, what, st) != SPES_OK) return ROUNDS_BAD_REQUEST;
    bool is_int8 = false;
    int base = -1;
    RoundsResult code = rounds_upload_kind(r, peer, step, st, &is_int8, &base);
    if (code == ROUNDS_OK && is_int8) code = rounds_int8_upload_walk(r, peer, step, st, base, NULL);
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
    // The most experts a layer can have (no replicas); the upload's routers say how many it has.
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
                   ? rounds_adopt_spec(r, &spec, dtype, NULL, true)
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

int64_t rounds_step_limit(Rounds *r, int step) {
    pthread_mutex_lock(&r->mu);
    int64_t limit = step_limit(r, step);
    pthread_mutex_unlock(&r->mu);
    return limit;
}

RoundsResult rounds_upload_start(Rounds *r, int peer, int step, size_t *cap) {
    int P = r->cfg.agg.num_peers;
    *cap = 0;
    if (peer < 0 || peer >= P)
        return rounds_fail(ROUNDS_BAD_REQUEST, "upload: peer_id %d is outside [0, %d)", peer, P);
    if (step < 0)
        return rounds_fail(ROUNDS_BAD_REQUEST, "upload from peer %d: step %d is negative", peer, step);
    // A round slot is looked for now too, before the peer sends its (maybe gigabytes of) upload;
    // the slots may change meanwhile, so storing it looks again (rounds_store_upload).
    bool evict;
    pthread_mutex_lock(&r->mu);
    RoundsResult code = r->closing                     ? rounds_fail(ROUNDS_CLOSING, "server is shutting down")
                            : step <= r->last_completed_step ? closed_round(r, peer, step)
                            : step > step_limit(r, step)     ? too_far_ahead(r, peer, step)
                            : !slot_for(r, step, &evict)     ? no_room(r, peer, step)
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
    if (step > r->last_completed_step) rounds_sweep_rounds(r, step);
    if (step <= r->last_completed_step) {
        code = closed_round(r, peer, step);
    } else if (step > step_limit(r, step)) {
        code = too_far_ahead(r, peer, step);
    } else if (!(round = open_round(r, step))) {
        code = no_room(r, peer, step);
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

// An upload the upload dir cannot take now (its file could not be written: a full disk):
// ROUNDS_STORAGE, which peers retry; the message keeps the system's reason.
static RoundsResult storage_failed(const char *dir, int peer, int step) {
    spes_fail_context("upload from peer %d for step %d: the server cannot store it now: the server's disk under %s "
                      "took no more (full? nothing of it was kept; retry later)",
                      peer, step, dir);
    return ROUNDS_STORAGE;
}

RoundsResult rounds_upload_begin(Rounds *r, int peer, int step, RoundsUpload *up) {
    memset(up, 0, sizeof *up);
    up->file.fd = -1;
    up->peer = peer;
    up->step = step;
    if (state_upload_open(r->upload_dir, step, peer, &up->file) != SPES_OK)
        return storage_failed(r->upload_dir, peer, step);
    pthread_mutex_lock(&r->mu);
    up->attempt = ++r->attempts;
    if (peer >= 0 && peer < r->cfg.agg.num_peers) r->newest_attempt[peer] = up->attempt;   // else refused at finish
    pthread_mutex_unlock(&r->mu);
    return ROUNDS_OK;
}

RoundsResult rounds_upload_current(Rounds *r, const RoundsUpload *up) {
    if (up->peer < 0 || up->peer >= r->cfg.agg.num_peers) return ROUNDS_OK;   // refused by its peer id
    pthread_mutex_lock(&r->mu);
    bool newest = r->newest_attempt[up->peer] == up->attempt;
    pthread_mutex_unlock(&r->mu);
    if (newest) return ROUNDS_OK;
    return rounds_fail(ROUNDS_SUPERSEDED,
                       "upload from peer %d for step %d superseded: a newer upload of peer %d began while this one was "
                       "in flight (a retry); the newest one is taken, this one dropped",
                       up->peer, up->step, up->peer);
}

RoundsResult rounds_upload_append(RoundsUpload *up, const void *data, size_t len) {
    if (state_upload_append(&up->file, data, len) != SPES_OK) return storage_failed(up->file.dir, up->peer, up->step);
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
    RoundsResult code = rounds_upload_kind(r, peer, step, &st, &is_int8, &base);
    if (code == ROUNDS_OK && is_int8) code = rounds_int8_upload_walk(r, peer, step, &st, base, NULL);
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
            if (upload_check_values(&w, at, peer, u->name) != SPES_OK) code = ROUNDS_BAD_REQUEST;
            rounds_drop_pages(mf, w.data, w.nbytes);
        }
    }
    if (code == ROUNDS_BAD_REQUEST) spes_fail_context("step %d", step);
    free(row);
    safetensors_close(&st);
    return code;
}

// Removes peer's committed upload file of step after its refusal, unless an open round records
// that upload (a retry's file replaced the accepted one; the round reads it). Refused after the
// commit (the round completed, closed without the peer, or found no slot in the meantime), the
// file is in no round: left, a restart would take it as accepted, or refuse to start on it.
// Takes r->mu, so that no upload of the same file is recorded meanwhile.
static void drop_unrecorded_upload(Rounds *r, int peer, int step) {
    pthread_mutex_lock(&r->mu);
    bool recorded = false;
    for (int i = 0; i < r->cfg.max_open_rounds; i++)
        recorded |= r->open[i].step == step && r->open[i].uploaded[peer];
    if (!recorded) state_remove_upload(r->upload_dir, step, peer);
    pthread_mutex_unlock(&r->mu);
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
    if (file_map(up->file.temp_path, &mf) != SPES_OK) {
        // spes_fail_context, not rounds_fail("%s", spes_last_error()): that formats the message into itself
        spes_fail_context("upload from peer %d for step %d", peer, step);
        return reject_upload(r, ROUNDS_INTERNAL, up);
    }

    pthread_mutex_lock(&r->mu);
    RoundsResult code = r->closing ? ROUNDS_CLOSING : ROUNDS_OK;
    if (r->closing) spes_fail("server is shutting down");
    if (code == ROUNDS_OK && !r->have_spec) {
        code = infer_spec(r, peer, mf.data, mf.size);
        rounds_drop_pages(&mf, mf.data, mf.size);
    }
    pthread_mutex_unlock(&r->mu);
    // The spec never changes once set, so the (slow) validation runs outside the lock.
    if (code == ROUNDS_OK) code = check_upload_file(r, peer, step, &mf);
    file_unmap(&mf);
    if (code != ROUNDS_OK) return reject_upload(r, code, up);

    // On disk (durably in a state dir) before the peer hears OK; the round reads it back when it
    // aggregates. Outside r->mu (a large fsync), so the round can change before the upload is
    // recorded: a refusal then removes the file again (drop_unrecorded_upload). Only the newest
    // attempt of the peer is renamed into place: checked and renamed under commit_mu, an older
    // attempt never replaces a newer one's file (RoundsUpload).
    if (!round_accepts(r, peer, step, &code)) return reject_upload(r, code, up);
    if (state_upload_flush(&up->file) != SPES_OK) return reject_upload(r, storage_failed(r->upload_dir, peer, step), up);
    pthread_mutex_lock(&r->commit_mu);
    code = rounds_upload_current(r, up);
    int committed = code == ROUNDS_OK ? state_upload_commit(&up->file) : SPES_ERR;
    pthread_mutex_unlock(&r->commit_mu);
    if (code != ROUNDS_OK) return reject_upload(r, code, up);
    if (committed != SPES_OK) {
        code = storage_failed(r->upload_dir, peer, step);
        drop_unrecorded_upload(r, peer, step);   // renamed, then the directory's fsync failed
        return reject_upload(r, code, up);
    }
    OpenRound *round;
    bool complete;
    code = rounds_store_upload(r, peer, step, len, &round, &complete);
    if (code != ROUNDS_OK) {
        drop_unrecorded_upload(r, peer, step);
        return reject(r, code, NULL);
    }
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
    if (round->retry_at > 0 && now_seconds() < round->retry_at) {   // its aggregate failed to persist
        *due = round->retry_at;
        return NULL;
    }
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

// The open round of step if every peer's upload is in but its aggregate failed to persist and
// the retry is due, frozen for the caller to aggregate again; else NULL, and *due says when to
// look again (0: nothing to retry). Under r->mu.
static OpenRound *stalled_round(Rounds *r, int step, double *due) {
    *due = 0;
    for (int i = 0; i < r->cfg.max_open_rounds; i++) {
        OpenRound *round = &r->open[i];
        if (round->step != step || round->aggregating || round->retry_at <= 0 ||
            round->num_uploaded != r->cfg.agg.num_peers)
            continue;
        if (now_seconds() < round->retry_at) {
            *due = round->retry_at;
            return NULL;
        }
        round->aggregating = true;
        return round;
    }
    return NULL;
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
        double due, retry_due;
        OpenRound *stalled = stalled_round(r, step, &retry_due);
        OpenRound *late = stalled ? stalled : overdue_round(r, step, &due);
        if (late) {   // this waiter closes the round (with the peers that arrived), or retries its write
            pthread_mutex_unlock(&r->mu);
            code = rounds_complete_round(r, late, -1);
            pthread_mutex_lock(&r->mu);
            if (code == ROUNDS_OK) continue;
            log_warn("server: step %d: aggregation failed: %s", step, spes_last_error());
            break;
        }
        if (retry_due > 0 && (due <= 0 || retry_due < due)) due = retry_due;
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
    return t >= 0 && r->spec.tensors[t].expert >= 0 &&
           expert_owned_by(r->spec.tensors[t].expert, peer, r->cfg.agg.experts_per_node, r->spec.num_experts);
}

RoundsResult rounds_view(Rounds *r, AggregateBlob *blob, int peer, const RoundsViewRequest *req,
                             const AggregateView **view, const char **name) {
    int P = r->cfg.agg.num_peers;
    bool omit = req->omit_own_experts && r->cfg.agg.mode == SYNC_MODE_SPES && peer >= 0 && peer < P &&
                r->spec.num_experts > 0 && (!blob->included || blob->included[peer]) &&
                aggregate_merge_alpha(&r->cfg.agg, blob->step) == 0.0f &&
                !expert_rotation_due(r->cfg.agg.rotation_steps, blob->step) &&
                // with replicas an expert is its owners' mean, not what this peer sent
                expert_replicas(P, r->cfg.agg.experts_per_node, r->spec.num_experts) == 1;
    bool delta = req->has_delta_base && blob->delta && blob->delta_base == req->delta_base_step;
    // In a delta run a peer completes its own experts from the previous aggregate and what it
    // uploaded (docs/communication.md): only a peer holding that aggregate (asking for the delta) can.
    omit = omit && (!r->delta_run || delta);
    *name = delta ? (omit ? r->delta->view_omit_own : r->delta->encoding) : omit ? SYNC_VIEW_OMIT_OWN : "";
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
        if (rc != SPES_OK) {
            spes_fail_context("download of step %d for peer %d", blob->step, peer);
            code = ROUNDS_INTERNAL;
        }
    }
    pthread_mutex_unlock(&r->mu);
    *view = code == ROUNDS_OK ? v : NULL;
    return code;
}

void rounds_release(Rounds *r, AggregateBlob *blob) {
    if (!blob) return;
    pthread_mutex_lock(&r->mu);
    rounds_blob_unref(r, blob);
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
    out->now_unix = unix_seconds();
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
