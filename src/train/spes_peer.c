#include "train/spes_peer.h"

#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/log_sink.h"
#include "base/timer.h"
#include "io/safetensors.h"
#include "sync/auth.h"
#include "sync/client.h"
#include "sync/delta_peer.h"
#include "sync/expert_owners.h"
#include "sync/model_spec.h"

typedef struct RoundJob RoundJob;

// A round whose job runs on its own thread (round_thread).
typedef struct {
    RoundJob *job;              // NULL: none
    pthread_t thread;
    int64_t step;
    bool delta;                 // its upload is an int8 delta (a missing base is answered by a full resend)
    double started;             // now_seconds() at the upload
} Round;

struct SpesPeer {
    const TrainConfig *cfg;
    SyncClient *client;
    float *lb_factor;           // [L*E]
    int64_t total_steps;
    StWriteTensor *upload;      // trainable tensors (data set per upload: the weights it sends)
    size_t *upload_at;          // [n_upload] each one's offset in the parameter buffer (which ZeRO-3 reallocates)
    int n_upload;
    volatile sig_atomic_t *stop;    // set by SIGINT/SIGTERM: abandon a sync in flight
    int64_t unsynced_step;      // the step whose round did not complete (-1: none)
    bool client_busy;           // an abandoned round still runs on its thread: keep the client alive
    Round pending;              // spes_config.sync_overlap: the round in flight (job NULL: none)
    int64_t plan_step;          // the step spes_peer_step_touches_model decided for (-1: none)
    bool plan_apply;            // its decision: apply the pending round at that step's end
    int64_t apply_after;        // SPES_OVERLAP_APPLY_AFTER (tests): apply a round exactly this many steps after
                                // its upload, waiting for it, instead of when it arrives (0: off)
    float *snapshot;            // [total] the weights it uploaded
    float *local;               // [total] scratch: the trained weights while the aggregate is applied
    double blocked_s;           // training-thread time spent in sync work so far (logged each round)
    bool delta_run;                  // spes_config.payload_dtype: int8 or int4 (a delta run)
    DeltaPeer deltas;                // its base aggregate and error feedback (set up by spes_peer_connect)
    LogSink audit;              // SPES_SYNC_LOG_DIR's copies: one that cannot be written is lost, not the round
    char audit_what[4200];      // "the sync audit copies in DIR"
};

float spes_decayed_factor(int64_t step, int64_t total_steps) {
    double ramp = 0.2 * (double)total_steps;
    if (ramp <= 0 || (double)step >= ramp) return 1.0f;
    return (float)(0.7 + 0.3 * (double)step / ramp);
}

// Own experts of this peer get c(t); every other expert counts fully.
static void update_lb_factor(SpesPeer *p, int64_t step) {
    const ModelConfig *mc = &p->cfg->model;
    int m = p->cfg->num_train_experts_per_node, first = expert_first_owned(p->cfg->peer_id, m, mc->num_experts);
    float own = p->cfg->using_decayed_aux_loss && p->cfg->using_spes ? spes_decayed_factor(step, p->total_steps) : 1.0f;
    for (int l = 0; l < mc->n_layers; l++)
        for (int e = 0; e < mc->num_experts; e++)
            p->lb_factor[(size_t)l * mc->num_experts + e] = (e >= first && e < first + m) ? own : 1.0f;
}

int spes_peer_create(const TrainConfig *cfg, SpesPeer **out) {
    *out = NULL;
    if (!cfg->using_spes && !cfg->using_dilico)
        return spes_fail("spes peer: neither using_spes nor using_dilico is set in %s", cfg->source_path);
    SpesPeer *p = spes_calloc(1, sizeof *p);
    if (!p) return SPES_ERR;
    p->cfg = cfg;
    p->unsynced_step = -1;
    p->plan_step = -1;
    const char *after = getenv("SPES_OVERLAP_APPLY_AFTER");   // a run whose rounds apply at known steps
    p->apply_after = after && *after ? strtoll(after, NULL, 10) : 0;
    p->lb_factor = spes_calloc((size_t)cfg->model.n_layers * (size_t)cfg->model.num_experts, sizeof(float));
    if (!p->lb_factor) {
        spes_peer_free(p);
        return SPES_ERR;
    }
    update_lb_factor(p, 0);
    SyncClientConfig cc;
    sync_client_config_defaults(&cc);
    cc.server_addr = cfg->server_addr;
    cc.peer_id = cfg->peer_id;
    cc.num_peers = cfg->num_peers;
    cc.experts_per_node = cfg->num_train_experts_per_node;
    cc.mode = cfg->using_dilico ? SYNC_MODE_FEDAVG : SYNC_MODE_SPES;
    p->delta_run = cfg->payload_dtype == PAYLOAD_INT8 || cfg->payload_dtype == PAYLOAD_INT4;   // a delta run, int8 or int4 codes
    cc.payload_dtype = cfg->payload_dtype == PAYLOAD_BF16 ? DTYPE_BF16 : p->delta_run ? DTYPE_I8 : DTYPE_F32;
    cc.delta = cfg->payload_dtype == PAYLOAD_INT4 ? &DELTA_INT4 : p->delta_run ? &DELTA_INT8 : NULL;
    p->deltas.base_step = -1;
    cc.connect_timeout_s = cfg->retry_timeout_s;
    cc.tls_ca = cfg->tls_ca;
    cc.tls_cert = cfg->tls_cert;
    cc.tls_key = cfg->tls_key;
    cc.omit_own_experts = !cfg->using_dilico;   // the round gives back our own experts as we sent them
    cc.outer = (OuterOptConfig){.lr = cfg->outer_lr, .momentum = cfg->outer_momentum};   // checked by the server in Hello
    char *token = NULL;
    if (cfg->auth_token_file && auth_read_token_file(cfg->auth_token_file, &token) != SPES_OK) {
        spes_peer_free(p);
        return config_key_fail(cfg, "spes_config.auth_token_file", "%s", spes_last_error());
    }
    cc.auth_token = token;
    int rc = sync_client_create(&cc, &p->client);
    free(token);
    if (rc != SPES_OK) {
        spes_peer_free(p);
        return SPES_ERR;
    }
    *out = p;
    return SPES_OK;
}

static void abandon_pending(SpesPeer *p);

void spes_peer_free(SpesPeer *p) {
    if (!p) return;
    abandon_pending(p);
    // A round abandoned on a signal may still be blocked inside gRPC on its thread; the process is
    // about to exit, so the client is left to it rather than destroyed under its feet.
    if (p->client && !p->client_busy) sync_client_destroy(p->client);
    free(p->lb_factor);
    free(p->upload);
    free(p->upload_at);
    free(p->snapshot);
    free(p->local);
    delta_peer_free(&p->deltas);
    char msg[1024];
    if (p->audit.what && log_sink_final(&p->audit, msg, sizeof msg)) log_warn("%s", msg);
    free(p);
}

const float *spes_peer_lb_count_factor(const SpesPeer *p) { return p->lb_factor; }

void spes_peer_note_metrics(SpesPeer *p, const StepMetrics *m) {
    PeerMetricPoint point = {.step = m->step,
                             .loss = m->loss.total,
                             .ce = m->loss.ce,
                             .lb = m->loss.lb,
                             .tokens_per_s = m->tokens_per_second,
                             .mfu = m->mfu,
                             .device_mem_mb = m->device_mem_mb > 0 ? m->device_mem_mb : m->peak_rss_mb};
    if (m->expert_counts)
        metrics_route_balance(m->expert_counts, m->n_layers, m->n_experts, &point.route_min, &point.route_max);
    sync_client_note_metrics(p->client, &point);
}

void spes_peer_set_stop_flag(SpesPeer *p, volatile sig_atomic_t *stop) { p->stop = stop; }

int64_t spes_peer_unsynced_step(const SpesPeer *p) { return p->unsynced_step; }

// What a download is called in errors: the aggregate, its step (and `extra`) and the server.
static void aggregate_what(const SpesPeer *p, int64_t step, const char *extra, char *out, size_t cap) {
    snprintf(out, cap, "aggregate of step %" PRId64 "%s from server %s", step, extra, p->cfg->server_addr);
}

// Downloads the server's newest aggregate into the model's weights; *newest: its step.
static int load_newest(SpesPeer *p, Model *m, int *newest) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    SPES_TRY(sync_client_download_latest(p->client, newest, &bytes, &len));
    char what[320];
    aggregate_what(p, *newest, "", what, sizeof what);
    int rc = spes_load_aggregate(m, bytes, len, what);
    free(bytes);
    if (rc == SPES_OK && p->delta_run) rc = delta_peer_set_base(&p->deltas, m->params, *newest);
    return rc;
}

// A peer resumed from its checkpoint at start_step rejoins a run that may have moved on while
// it was down: it loads the newest aggregate the server has (its optimizer state stays the
// checkpoint's) and trains on from its own step; uploads for rounds that closed without it are
// answered ABORTED and answered with the newest aggregate again (spes_peer_after_step).
static int rejoin(SpesPeer *p, Model *m, int64_t start_step) {
    RoundsStatus st;
    if (sync_client_status(p->client, &st) != SPES_OK) return spes_fail_context("rejoining the run");
    if (st.last_aggregate_step < 0 || st.last_aggregate_step < start_step) {
        log_info("spes peer %d: resumed at step %" PRId64 "; the server's newest aggregate is step %d, nothing newer to load",
                 p->cfg->peer_id, start_step, st.last_aggregate_step);
        return SPES_OK;
    }
    int newest = -1;
    SPES_TRY(load_newest(p, m, &newest));
    log_info("spes peer %d: resumed at step %" PRId64 ", rejoined with the server's newest aggregate (step %d; %lld rounds "
             "completed, %lld partial)",
             p->cfg->peer_id, start_step, newest, (long long)st.rounds_completed, (long long)st.rounds_partial);
    return SPES_OK;
}

// Ownership failover: a fresh process standing in for lost peer N (its peer_id is N) starts
// from the server's newest aggregate, which holds the latest copy of every expert, N's
// included; it trains from its own step 0, so uploads for rounds the run has passed are
// answered ABORTED (and the newest aggregate loaded again) until it has caught up.
static int take_over(SpesPeer *p, Model *m) {
    int newest = -1;
    RoundsStatus st;
    SPES_TRY(sync_client_status(p->client, &st));
    if (st.last_aggregate_step < 0) {
        log_info("spes peer %d: take over: the server has no aggregate yet; starting from this process's init",
                 p->cfg->peer_id);
        return SPES_OK;
    }
    SPES_TRY(load_newest(p, m, &newest));
    log_info("spes peer %d: took over peer %d's experts from the server's aggregate of step %d", p->cfg->peer_id,
             p->cfg->take_over_peer_id, newest);
    return SPES_OK;
}

static int sync_round(SpesPeer *p, Model *m, int64_t step);
static bool is_sync_step(const SpesPeer *p, int64_t step);

#define SYNC_STATE_FILE "spes_sync_state.safetensors"

// The sync state file's one tensor (the error-feedback residual of the sent values) and its
// metadata value (the base step, as text in base[24]).
static StWriteTensor sync_state_tensor(const float *residual, size_t sent, int base_step, char base[24]) {
    StWriteTensor w = {.name = "error_feedback", .dtype = DTYPE_F32, .ndim = 1, .data = residual};
    w.shape[0] = (int64_t)sent;
    snprintf(base, 24, "%d", base_step);
    return w;
}
static const char *const sync_state_keys[] = {"base_step"};

int spes_peer_save_state(SpesPeer *p, const char *dir) {
    if (!p->delta_run || !p->deltas.residual) return SPES_OK;
    char *path = path_join(dir, SYNC_STATE_FILE);
    if (!path) return SPES_ERR;
    char base[24];
    StWriteTensor w = sync_state_tensor(p->deltas.residual, p->deltas.sent_total, p->deltas.base_step, base);
    const char *values[] = {base};
    int rc = safetensors_write_file(path, &w, 1, sync_state_keys, values, 1);
    free(path);
    return rc;
}

bool spes_peer_saves_sync_state(const TrainConfig *cfg) {
    return (cfg->using_spes || cfg->using_dilico) &&
           (cfg->payload_dtype == PAYLOAD_INT8 || cfg->payload_dtype == PAYLOAD_INT4);
}

int spes_peer_state_bytes(const TrainConfig *cfg, size_t sent, size_t *bytes) {
    *bytes = 0;
    if (!spes_peer_saves_sync_state(cfg)) return SPES_OK;
    char base[24];
    StWriteTensor w = sync_state_tensor(NULL, sent, INT32_MAX, base);   // the longest base step
    const char *values[] = {base};
    return safetensors_serialized_size(&w, 1, sync_state_keys, values, 1, bytes);
}

// "int8" or "int4": the codes of this delta run, for the log.
static const char *delta_name(const SpesPeer *p) { return p->cfg->payload_dtype == PAYLOAD_INT4 ? "int4" : "int8"; }

// A resumed delta peer (int8 or int4): the residual and base step its checkpoint saved (none:
// zero and -1).
static int load_sync_state(SpesPeer *p, int64_t start_step, int *base_step) {
    *base_step = -1;
    char name[64];
    snprintf(name, sizeof name, "step%" PRId64, start_step);
    char *step_dir = path_join(p->cfg->save_folder, name);
    char *path = step_dir ? path_join(step_dir, SYNC_STATE_FILE) : NULL;
    free(step_dir);
    if (!path) return SPES_ERR;
    if (!file_exists(path)) {
        log_info("spes peer %d: %s not found; %s error feedback starts from zero", p->cfg->peer_id, path, delta_name(p));
        free(path);
        return SPES_OK;
    }
    SafeTensors st;
    int rc = safetensors_open(path, &st);
    if (rc == SPES_OK) {
        const StTensor *t = safetensors_find(&st, "error_feedback");
        const char *base = safetensors_meta(&st, "base_step");
        char *end = NULL;
        long b = base ? strtol(base, &end, 10) : -2;
        if (!t || t->dtype != DTYPE_F32 || t->numel != p->deltas.sent_total)
            rc = spes_fail("%s: 'error_feedback' must be F32 with %zu values (this peer's trainable tensors)", path,
                           p->deltas.sent_total);
        else if (!base || *end || b < -1 || b > INT32_MAX)
            rc = spes_fail("%s: __metadata__ base_step must be a step or -1 (got '%s')", path, base ? base : "(none)");
        else
            rc = safetensors_to_f32(t, p->deltas.residual);
        if (rc == SPES_OK) rc = delta_peer_check_residual(&p->deltas, path);
        if (rc == SPES_OK) *base_step = (int)b;
        safetensors_close(&st);
    }
    free(path);
    return rc;
}

// Fetches the server's aggregate of step whole as the delta base, leaving the model's weights as
// they are. A step the server no longer keeps, or has never aggregated (it lost its state dir, or
// restarted on an older copy of it), leaves the peer without a base (its next upload is a full
// payload): the base is an aggregate the server already made, never one to wait for (a wait for
// it waited for ever, as no round of that step would come again).
static int fetch_base(SpesPeer *p, Model *m, int step) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    RoundsStatus st;
    if (sync_client_status(p->client, &st) != SPES_OK) {
        log_warn("spes peer %d: cannot ask the server for the aggregate of step %d as the %s base (%s); the next upload "
                 "is a full payload",
                 p->cfg->peer_id, step, delta_name(p), spes_last_error());
        return SPES_OK;
    }
    if (st.last_aggregate_step < step) {
        log_warn("spes peer %d: the server has no aggregate of step %d, the %s base this peer's checkpoint was saved "
                 "against (its newest aggregate is step %d: it lost its state dir or runs on an older one); the next "
                 "upload is a full payload",
                 p->cfg->peer_id, step, delta_name(p), st.last_aggregate_step);
        return SPES_OK;
    }
    if (sync_client_wait_and_download(p->client, step, &bytes, &len) != SPES_OK) {
        log_warn("spes peer %d: cannot fetch the aggregate of step %d as the %s base (%s); the next upload is a "
                 "full payload",
                 p->cfg->peer_id, step, delta_name(p), spes_last_error());
        return SPES_OK;
    }
    float *own = spes_malloc(m->table.total_numel * sizeof(float) + 1);
    int rc = own ? SPES_OK : SPES_ERR;
    char what[320], extra[32];
    snprintf(extra, sizeof extra, " (%s base)", delta_name(p));
    aggregate_what(p, step, extra, what, sizeof what);
    if (rc == SPES_OK) memcpy(own, m->params, m->table.total_numel * sizeof(float));
    if (rc == SPES_OK) rc = spes_load_aggregate(m, bytes, len, what);
    if (rc == SPES_OK) rc = delta_peer_set_base(&p->deltas, m->params, step);
    if (own) memcpy(m->params, own, m->table.total_numel * sizeof(float));
    if (own) rc = model_params_to_device(m) == SPES_OK ? rc : SPES_ERR;
    free(own);
    free(bytes);
    if (rc == SPES_OK) log_info("spes peer %d: %s base: the aggregate of step %d", p->cfg->peer_id, delta_name(p), step);
    return rc;
}

// int8 runs: the tensor list of the peer's int8 state (uploaded = trainable; own experts).
static int init_int8(SpesPeer *p, const ParamTable *table) {
    DeltaPeerTensor *x = spes_calloc((size_t)table->count + 1, sizeof *x);
    if (!x) return SPES_ERR;
    int m = p->cfg->num_train_experts_per_node;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *e = &table->entries[i];
        x[i] = (DeltaPeerTensor){.name = e->name, .ndim = e->ndim, .numel = e->numel, .offset = e->offset,
                                .sent = e->trainable,
                                .own = !p->cfg->using_dilico && e->expert >= 0 &&
                                       expert_owned_by(e->expert, p->cfg->peer_id, m, p->cfg->model.num_experts)};
        for (int d = 0; d < e->ndim; d++) x[i].shape[d] = e->shape[d];
    }
    delta_peer_free(&p->deltas);
    const DeltaCodec *codec = p->cfg->payload_dtype == PAYLOAD_INT4 ? &DELTA_INT4 : &DELTA_INT8;
    int rc = delta_peer_init(&p->deltas, codec, x, table->count, table->total_numel);
    free(x);
    return rc;
}

int spes_peer_connect(SpesPeer *p, Model *m, int64_t start_step, int64_t total_steps, bool unsynced) {
    p->total_steps = total_steps;
    update_lb_factor(p, start_step);
    const ParamTable *table = &m->table;
    ModelSpec spec;
    model_spec_init(&spec);
    int rc = SPES_OK;
    for (int i = 0; i < table->count && rc == SPES_OK; i++)
        rc = model_spec_add(&spec, table->entries[i].name, DTYPE_F32, table->entries[i].ndim, table->entries[i].shape);
    if (rc == SPES_OK) rc = model_spec_finish(&spec);
    if (rc == SPES_OK) rc = sync_client_hello(p->client, &spec);
    model_spec_free(&spec);
    if (rc != SPES_OK) return spes_fail_context("handshake with parameter server %s", p->cfg->server_addr);

    // The upload list: every trainable tensor (shared + own experts; all in fedavg mode).
    free(p->upload);
    free(p->upload_at);
    p->upload = spes_calloc((size_t)table->count, sizeof(StWriteTensor));
    p->upload_at = spes_calloc((size_t)table->count, sizeof(size_t));
    if (!p->upload || !p->upload_at) return SPES_ERR;
    p->n_upload = 0;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *e = &table->entries[i];
        if (!e->trainable) continue;
        p->upload_at[p->n_upload] = e->offset;
        StWriteTensor *t = &p->upload[p->n_upload++];
        t->name = e->name;
        t->dtype = DTYPE_F32;
        t->ndim = e->ndim;
        for (int d = 0; d < e->ndim; d++) t->shape[d] = e->shape[d];
    }
    int saved_base = -1;
    if (p->delta_run) SPES_TRY(init_int8(p, table));
    if (p->delta_run && start_step > 0) SPES_TRY(load_sync_state(p, start_step, &saved_base));
    log_info("spes peer %d/%d: connected to %s, uploading %d trainable tensors every %" PRId64 " steps (%s)",
             p->cfg->peer_id, p->cfg->num_peers, p->cfg->server_addr, p->n_upload, p->cfg->sync_steps,
             p->cfg->using_dilico ? "fedavg" : "spes");
    if (p->cfg->take_over_peer_id >= 0 && start_step == 0) return take_over(p, m);
    if (unsynced && is_sync_step(p, start_step) && start_step <= INT32_MAX) {
        // The checkpoint holds the local weights of a round that never completed (its sync failed
        // or was interrupted). Redo that round: the server still waiting for our upload gets it;
        // a round that already has it answers ALREADY_EXISTS and we download its aggregate; one
        // that closed without us answers ABORTED and we take the newest aggregate (sync_round).
        log_warn("spes peer %d: resumed at step %" PRId64 " from a checkpoint that was not synced; redoing the sync of "
                 "step %" PRId64,
                 p->cfg->peer_id, start_step, start_step);
        if (saved_base >= 0) SPES_TRY(fetch_base(p, m, saved_base));
        SPES_TRY(sync_round(p, m, start_step));
        log_info("spes peer %d: the sync of step %" PRId64 " is done; rejoined the run", p->cfg->peer_id, start_step);
        return SPES_OK;
    }
    if (start_step > 0) SPES_TRY(rejoin(p, m, start_step));
    // Not moved on by a newer aggregate: the int8 base is the one the checkpoint's state was against.
    if (p->delta_run && start_step > 0 && p->deltas.base_step < 0 && saved_base >= 0) SPES_TRY(fetch_base(p, m, saved_base));
    return SPES_OK;
}

// A value no server aggregates from uploads it checked (NaN, infinite, beyond +-SYNC_MAX_WEIGHT):
// damage or a hostile server; loaded, it would poison the weights and every checkpoint after.
static int check_values(const StTensor *t, const char *name, float *scratch, const char *what) {
    SPES_TRY(safetensors_to_f32(t, scratch));
    for (size_t k = 0; k < t->numel; k++)
        if (!(fabsf(scratch[k]) <= SYNC_MAX_WEIGHT))   // also NaN
            return spes_fail("%s: tensor %s is %g at flat index %zu, not within +-%g (the largest weight a sync "
                             "payload may carry; no healthy server sends it)",
                             what, name, (double)scratch[k], k, (double)SYNC_MAX_WEIGHT);
    return SPES_OK;
}

// Loads an aggregate into the model's parameters. own_peer >= 0: the download left out that
// peer's own experts (the round took them unchanged from its upload, see rounds_view); they keep
// the values uploaded, which are the model's own (no step ran since the upload), rounded to the
// payload dtype as the server's aggregate holds them (round_bf16).
static int load_aggregate(Model *m, const uint8_t *bytes, size_t len, const char *what, int own_peer,
                          int experts_per_node, bool round_bf16) {
    SafeTensors st;
    SPES_TRY(safetensors_parse(bytes, len, what, &st));
    int rc = SPES_OK, own = 0;
    // Every tensor is checked before any is written: a bad aggregate leaves the local weights
    // whole, so they can still be saved as the peer's (not synced) state.
    int E = m->cfg.num_experts;
    size_t largest = 1;
    for (int i = 0; i < m->table.count; i++) {
        if (m->table.entries[i].numel > largest) largest = m->table.entries[i].numel;
        own += own_peer >= 0 && m->table.entries[i].expert >= 0 &&
               expert_owned_by(m->table.entries[i].expert, own_peer, experts_per_node, E);
    }
    float *scratch = spes_malloc(largest * sizeof(float));
    if (!scratch) rc = SPES_ERR;
    if (rc == SPES_OK && st.count != m->table.count && st.count != m->table.count - own)
        rc = spes_fail("%s has %d tensors, the model %d%s", what, st.count, m->table.count,
                       own ? " (or without this peer's own experts)" : "");
    for (int i = 0; i < m->table.count && rc == SPES_OK; i++) {
        const ParamInfo *e = &m->table.entries[i];
        const StTensor *t = safetensors_find(&st, e->name);
        bool is_own = own_peer >= 0 && e->expert >= 0 && expert_owned_by(e->expert, own_peer, experts_per_node, E);
        if (!t && !is_own) rc = spes_fail("%s lacks tensor %s", what, e->name);
        else if (!t) continue;
        else if (t->numel != e->numel || t->ndim != e->ndim || t->shape[0] != e->shape[0] ||
                 (e->ndim == 2 && t->shape[1] != e->shape[1]))
            rc = spes_fail("%s: tensor %s has the wrong shape", what, e->name);
        else if (t->dtype != DTYPE_F32 && t->dtype != DTYPE_BF16 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_F64)
            rc = spes_fail("%s: tensor %s has dtype %s, expected a float type", what, e->name, dtype_name(t->dtype));
        else
            rc = check_values(t, e->name, scratch, what);
    }
    free(scratch);
    for (int i = 0; i < m->table.count && rc == SPES_OK; i++) {
        const ParamInfo *e = &m->table.entries[i];
        const StTensor *t = safetensors_find(&st, e->name);
        float *dst = m->params + e->offset;
        if (t) rc = safetensors_to_f32(t, dst);
        else if (round_bf16)
            for (size_t k = 0; k < e->numel; k++) dst[k] = bf16_to_f32(f32_to_bf16(dst[k]));
    }
    safetensors_close(&st);
    if (rc == SPES_OK) rc = model_params_to_device(m);
    return rc;
}

int spes_load_aggregate(Model *m, const uint8_t *bytes, size_t len, const char *what) {
    return load_aggregate(m, bytes, len, what, -1, 1, false);
}

// With SPES_SYNC_LOG_DIR set, every upload and downloaded aggregate is also written there as
// {up,down}_s<step>_p<peer>.safetensors: an audit trail an independent checker can replay.
// A copy the disk does not take (full, read-only, the directory gone) is a log's loss, not the
// round's: counted and said once (base/log_sink.h), the round and training go on.
static int audit_log(SpesPeer *p, const char *kind, int64_t step, const uint8_t *bytes, size_t len) {
    const char *dir = getenv("SPES_SYNC_LOG_DIR");
    if (!dir || !*dir) return SPES_OK;
    char name[96];
    snprintf(name, sizeof name, "%s_s%" PRId64 "_p%d.safetensors", kind, step, p->cfg->peer_id);
    char *path = path_join(dir, name);
    if (!path) return SPES_ERR;
    bool ok = file_write_atomic(path, bytes, len) == SPES_OK;
    free(path);
    if (!p->audit.what) {
        snprintf(p->audit_what, sizeof p->audit_what, "the sync audit copies in %s (SPES_SYNC_LOG_DIR)", dir);
        log_sink_init(&p->audit, p->audit_what, "file");
    }
    char msg[1024];
    if (log_sink_note(&p->audit, ok, ok ? NULL : spes_last_error(), step, msg, sizeof msg) != SINK_QUIET)
        log_warn("%s", msg);
    if (!ok) spes_clear_error();
    return SPES_OK;
}

// An audit copy of whole-model weights src, in the payload dtype (F32 in int8 runs), tensors in
// table order: an aggregate the peer completed itself (its own experts left out of the download,
// or an int8 delta), which is byte for byte the server's aggregate image when the reconstruction
// is exact; and an overlapped round's weights at the upload, before and after applying.
static int audit_weights(SpesPeer *p, Model *m, const float *src, const char *kind, int64_t step) {
    const char *dir = getenv("SPES_SYNC_LOG_DIR");
    if (!dir || !*dir) return SPES_OK;
    const ParamTable *table = &m->table;
    StWriteTensor *w = spes_calloc((size_t)table->count, sizeof *w);
    if (!w) return SPES_ERR;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *e = &table->entries[i];
        w[i] = (StWriteTensor){.name = e->name, .dtype = DTYPE_F32, .ndim = e->ndim, .data = src + e->offset};
        for (int d = 0; d < e->ndim; d++) w[i].shape[d] = e->shape[d];
    }
    uint8_t *bytes = NULL;
    size_t len = 0;
    int rc = strcmp(kind, "down") == 0 ? sync_client_serialize_aggregate(p->client, w, table->count, (int)step, &bytes, &len)
                                       : sync_client_serialize(p->client, w, table->count, &bytes, &len);
    if (rc == SPES_OK) rc = audit_log(p, kind, step, bytes, len);
    free(bytes);
    free(w);
    return rc;
}

static int audit_model(SpesPeer *p, Model *m, const char *kind, int64_t step) {
    return audit_weights(p, m, m->params, kind, step);
}

// One round's network part, run on a thread of its own so that the training thread can give up
// on it when SIGINT/SIGTERM arrives (a gRPC wait does not return on a signal, and with the
// server gone it would only fail after retry_timeout_s). The job owns its payload and result.
struct RoundJob {
    SyncClient *client;
    int step;
    uint8_t *payload, *bytes;
    size_t payload_len, len;
    int64_t loaded;             // step of the aggregate in bytes
    SyncDownload got;           // which view of it
    int delta_base;             // int8 runs: the aggregate the peer holds (-1: none)
    int rc;
    char error[1024];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, abandoned;
};

static void round_job_free(RoundJob *j) {
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->payload);
    free(j->bytes);
    free(j);
}

static void *round_thread(void *arg) {
    RoundJob *j = arg;
    int rc = sync_client_upload_bytes(j->client, j->step, j->payload, j->payload_len);
    j->loaded = j->step;
    if (rc == SPES_OK) {
        rc = sync_client_wait_and_download_view(j->client, j->step, j->delta_base, &j->bytes, &j->len, &j->got);
    } else if (sync_client_last_status(j->client) == GRPC_STATUS_ABORTED) {
        // Too late: the round closed without us (round timeout). Take the newest aggregate and carry on.
        log_warn("sync step %d: %s", j->step, spes_last_error());
        int newest = -1;
        rc = sync_client_download_latest(j->client, &newest, &j->bytes, &j->len);
        j->loaded = newest;
    }
    if (rc != SPES_OK) snprintf(j->error, sizeof j->error, "%s", spes_last_error());
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    j->done = true;
    bool abandoned = j->abandoned;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (abandoned) round_job_free(j);
    return NULL;
}

static bool stop_requested(const SpesPeer *p) { return p->stop && *p->stop; }

// What a finished round brought: the download (caller frees bytes) and the step it is of.
typedef struct {
    uint8_t *bytes;
    size_t len;
    int64_t loaded;
    SyncDownload got;
} RoundResult;

// Starts the round of `step` on its thread, uploading `payload` (taken).
static int start_round(SpesPeer *p, int64_t step, uint8_t *payload, size_t payload_len, bool delta, Round *out) {
    memset(out, 0, sizeof *out);
    if (stop_requested(p)) {
        free(payload);
        return spes_fail("stopped by a signal before the sync of step %" PRId64, step);
    }
    RoundJob *j = spes_calloc(1, sizeof *j);
    if (!j) {
        free(payload);
        return SPES_ERR;
    }
    *j = (RoundJob){.client = p->client, .step = (int)step, .payload = payload, .payload_len = payload_len,
                    .delta_base = p->delta_run ? p->deltas.base_step : -1};
    pthread_mutex_init(&j->mu, NULL);
    // Waits on the monotonic clock: a wall clock set back (NTP, a VM resumed) would stretch a
    // 50 ms poll by as much as it went back.
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &attr);
    pthread_condattr_destroy(&attr);
    int err = pthread_create(&out->thread, NULL, round_thread, j);
    if (err != 0) {
        round_job_free(j);
        return spes_fail("cannot start the sync thread: %s", strerror(err));
    }
    out->job = j;
    out->step = step;
    out->delta = delta;
    out->started = now_seconds();
    return SPES_OK;
}

static bool round_done(Round *r) {
    pthread_mutex_lock(&r->job->mu);
    bool done = r->job->done;
    pthread_mutex_unlock(&r->job->mu);
    return done;
}

// Waits for a started round (polling the stop flag: a signal abandons it at once) and takes its
// result. The round is over afterwards whatever the outcome.
static int finish_round(SpesPeer *p, Round *r, RoundResult *res) {
    memset(res, 0, sizeof *res);
    RoundJob *j = r->job;
    r->job = NULL;
    pthread_mutex_lock(&j->mu);
    while (!j->done && !stop_requested(p)) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 50 * 1000 * 1000;   // the stop flag is polled: a signal handler cannot signal a condvar
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &until);
    }
    if (!j->done) {
        j->abandoned = true;   // the thread frees the job if it ever finishes
        pthread_mutex_unlock(&j->mu);
        pthread_detach(r->thread);
        p->client_busy = true;
        return spes_fail("stopped by a signal during the sync of step %" PRId64 " (upload or wait for the aggregate)",
                         r->step);
    }
    pthread_mutex_unlock(&j->mu);
    pthread_join(r->thread, NULL);
    int rc = j->rc;
    if (rc == SPES_OK) {
        *res = (RoundResult){.bytes = j->bytes, .len = j->len, .loaded = j->loaded, .got = j->got};
        j->bytes = NULL;
    } else {
        spes_fail("%s", j->error);
    }
    round_job_free(j);
    return rc;
}

// The upload of weights `src` (the model's parameters, or the snapshot of an overlapped round):
// the trainable tensors in the payload dtype, or in an int8 run with a base, their int8 delta
// with error feedback (*delta true).
static int build_payload(SpesPeer *p, Model *m, const float *src, uint8_t **payload, size_t *len, bool *delta) {
    *delta = p->delta_run && p->deltas.base_step >= 0;
    if (*delta) return delta_peer_encode(&p->deltas, src, payload, len);
    StWriteTensor *w = spes_calloc((size_t)p->n_upload + 1, sizeof *w);
    if (!w) return SPES_ERR;
    for (int i = 0; i < p->n_upload; i++) {
        w[i] = p->upload[i];
        w[i].data = src + p->upload_at[i];
    }
    int rc = sync_client_serialize(p->client, w, p->n_upload, payload, len);
    free(w);
    if (rc == SPES_OK && p->delta_run) delta_peer_sent_full(&p->deltas, src);   // full F32: the server holds our values exactly
    return rc;
}

// Builds the upload of `src` for step and starts its round.
static int begin_round(SpesPeer *p, Model *m, int64_t step, const float *src, Round *out) {
    uint8_t *payload = NULL;
    size_t len = 0;
    bool delta = false;
    SPES_TRY(build_payload(p, m, src, &payload, &len, &delta));
    int rc = audit_log(p, "up", step, payload, len);
    if (rc != SPES_OK) {
        free(payload);
        return rc;
    }
    return start_round(p, step, payload, len, delta, out);
}

// Waits for a round begun with `src`; an int8 delta refused because the server no longer keeps
// its base is sent again in full (and waited for).
static int end_round(SpesPeer *p, Model *m, Round *r, const float *src, RoundResult *res) {
    int64_t step = r->step;
    bool delta = r->delta;
    int rc = finish_round(p, r, res);
    if (rc != SPES_OK && delta && sync_client_last_status(p->client) == GRPC_STATUS_FAILED_PRECONDITION) {
        log_warn("sync step %" PRId64 ": %s; uploading a full payload instead", step, spes_last_error());
        p->deltas.base_step = -1;
        rc = begin_round(p, m, step, src, r);
        if (rc == SPES_OK) rc = finish_round(p, r, res);
    }
    return rc;
}

// Loads what came down for the round: a whole aggregate, one without our own experts, or in an
// int8 run an int8 delta against our base. In an int8 run the result becomes the new base.
static int load_download(SpesPeer *p, Model *m, const RoundResult *res) {
    char what[320];
    aggregate_what(p, res->loaded, "", what, sizeof what);
    if (res->got.is_delta) {
        SafeTensors st;
        SPES_TRY(safetensors_parse(res->bytes, res->len, what, &st));
        int rc = delta_peer_apply_delta(&p->deltas, &st, res->got.own_experts_omitted, (int)res->loaded, m->params, what);
        safetensors_close(&st);
        SPES_TRY(rc);
        return model_params_to_device(m);
    }
    SPES_TRY(load_aggregate(m, res->bytes, res->len, what, res->got.own_experts_omitted ? p->cfg->peer_id : -1,
                            p->cfg->num_train_experts_per_node, p->cfg->payload_dtype == PAYLOAD_BF16));
    return p->delta_run ? delta_peer_set_base(&p->deltas, m->params, (int)res->loaded) : SPES_OK;
}

// The end of a round for the model: loads the download (audit copy, int8 bookkeeping). The
// model holds the weights the round uploaded when this is called.
static int apply_result(SpesPeer *p, Model *m, int64_t step, const RoundResult *res) {
    bool whole = !res->got.own_experts_omitted && !res->got.is_delta;
    int rc = whole ? audit_log(p, "down", step, res->bytes, res->len) : SPES_OK;
    if (rc == SPES_OK) rc = load_download(p, m, res);
    if (rc == SPES_OK && !whole) rc = audit_model(p, m, "down", step);
    if (rc == SPES_OK && p->delta_run && res->loaded == step) delta_peer_commit(&p->deltas);   // the round took our upload
    return rc;
}

static void log_round(SpesPeer *p, int64_t step, double seconds, const RoundResult *res, const char *extra) {
    const SyncStats *s = sync_client_stats(p->client);
    log_info("sync step %" PRId64 ": %.2fs total (upload %.2fs, wait %.2fs, download %.2fs), up %.2f MB, down %.2f MB%s%s%s",
             step, seconds, s->upload_s, s->wait_s, s->download_s, (double)s->bytes_up / 1e6,
             (double)s->bytes_down / 1e6, res->got.view[0] ? ", view " : "", res->got.view, extra);
}

// The sync work of a step end, timed: what training waits for (bench/net reads the total).
static int sync_work(SpesPeer *p, Model *m, int64_t step);

int spes_peer_after_step(void *ctx, Model *m, int64_t step) {
    SpesPeer *p = ctx;
    double start = now_seconds();
    int rc = sync_work(p, m, step);
    double spent = now_seconds() - start;
    p->blocked_s += spent;
    if (rc == SPES_OK && spent > 0.001)
        log_info("sync: training blocked %.3fs at step %" PRId64 ", %.3fs in all", spent, step, p->blocked_s);
    return rc;
}

// Upload the trainable tensors for `step`, wait for the aggregate, load it. On failure the model
// still holds the local weights of `step` (the aggregate is validated before it is loaded).
static int sync_round(SpesPeer *p, Model *m, int64_t step) {
    double start = now_seconds();
    // Serialised here, on the training thread: an abandoned round's thread never touches the model.
    SPES_TRY(model_params_to_host(m));   // the upload reads the host parameters
    Round r;
    RoundResult res;
    SPES_TRY(begin_round(p, m, step, m->params, &r));
    SPES_TRY(end_round(p, m, &r, m->params, &res));
    int rc = apply_result(p, m, step, &res);
    free(res.bytes);
    SPES_TRY(rc);
    log_round(p, step, now_seconds() - start, &res, "");
    return SPES_OK;
}

// ---- overlapped sync (spes_config.sync_overlap) ----
//
// At a sync step s the peer snapshots its weights U, uploads them (the network calls run on the
// round's thread) and trains on. At the end of every later step it looks whether the aggregate
// A has arrived; the first step end t that finds it applies it, as
//     W <- A + (W - U)
// i.e. the aggregate's change relative to the weights that were uploaded is applied to the
// current weights, each value computed as A + (W - U) in float32 (own experts left out of the
// download are A = U, as in a blocking round). At the latest the round is waited for at the next
// sync step (before its upload), at a step whose checkpoint is due, and at the last step, so
// every checkpoint holds applied aggregates only and resume works as with blocking rounds. The
// applied step t is logged ("applied at step t"); for a given t the result is deterministic.
// Rounds at a checkpoint step or at the last step are blocking (nothing to overlap with).

// An overlapped round still in flight when the peer goes away (an error elsewhere): its thread
// is left to finish on its own (it frees its job), and the client with it.
static void abandon_pending(SpesPeer *p) {
    RoundJob *j = p->pending.job;
    if (!j) return;
    p->pending.job = NULL;
    pthread_mutex_lock(&j->mu);
    bool done = j->done;
    j->abandoned = !done;
    pthread_mutex_unlock(&j->mu);
    if (done) {
        pthread_join(p->pending.thread, NULL);
        round_job_free(j);
    } else {
        pthread_detach(p->pending.thread);
        p->client_busy = true;
    }
}

static bool checkpoint_due(const SpesPeer *p, int64_t step) {
    int64_t every = p->cfg->save_interval_unsharded;
    return (every > 0 && step % every == 0) || step >= p->total_steps;
}

// Applies the pending round's aggregate (waiting for it if needed) to the weights trained since.
static int apply_pending(SpesPeer *p, Model *m, int64_t step) {
    double start = now_seconds();
    Round *r = &p->pending;
    int64_t round_step = r->step;
    double in_flight = start - r->started;
    RoundResult res;
    int rc = end_round(p, m, r, p->snapshot, &res);
    double waited = now_seconds() - start;
    size_t n = m->table.total_numel;
    if (rc == SPES_OK) rc = model_params_to_host(m);
    if (rc == SPES_OK) rc = audit_model(p, m, "local", round_step);   // the trained weights the rule starts from
    if (rc == SPES_OK) {
        float *w = m->params, *u = p->snapshot, *local = p->local;
        memcpy(local, w, n * sizeof(float));
        memcpy(w, u, n * sizeof(float));   // the model as uploaded: apply_result loads the aggregate onto it
        rc = apply_result(p, m, round_step, &res);
        if (rc == SPES_OK)
            for (size_t i = 0; i < n; i++) w[i] = w[i] + (local[i] - u[i]);
        else   // the aggregate was refused: the trained weights stay
            memcpy(w, local, n * sizeof(float));
        int to_device = model_params_to_device(m);
        if (rc == SPES_OK) rc = to_device;
    }
    free(res.bytes);
    if (rc == SPES_OK) {
        char extra[128];
        snprintf(extra, sizeof extra, "; overlapped: applied at step %" PRId64 " (in flight %.2fs, training waited %.2fs)",
                 step, in_flight, waited);
        log_round(p, round_step, now_seconds() - start + in_flight, &res, extra);
        rc = audit_model(p, m, "applied", round_step);
    }
    return rc;
}

// Starts an overlapped round for step: snapshot of the weights, upload, train on.
static int begin_overlapped(SpesPeer *p, Model *m, int64_t step) {
    size_t n = m->table.total_numel;
    if (!p->snapshot) p->snapshot = spes_malloc(n * sizeof(float) + 1);
    if (!p->local) p->local = spes_malloc(n * sizeof(float) + 1);
    if (!p->snapshot || !p->local) return SPES_ERR;
    SPES_TRY(model_params_to_host(m));
    memcpy(p->snapshot, m->params, n * sizeof(float));
    SPES_TRY(audit_weights(p, m, p->snapshot, "uploaded", step));   // the weights the rule subtracts
    return begin_round(p, m, step, p->snapshot, &p->pending);
}

bool spes_sync_due(int64_t step, int64_t sync_steps, int64_t warmup_steps, int64_t warmup_every) {
    if (sync_steps <= 0) return false;
    if (warmup_every < 1) warmup_every = 1;   // validated; never a division by zero or an endless ramp
    if (warmup_steps <= 0 || step > warmup_steps + sync_steps) return step % sync_steps == 0;
    if (step <= warmup_steps) return step % warmup_every == 0;
    int64_t offset = step - warmup_steps;   // in (0, K]: the ramp, ending on the grid at W + K
    if (offset == sync_steps) return true;
    for (int64_t part = sync_steps / 2; part > 0 && part >= warmup_every; part /= 2)
        if (offset == part) return true;
    return false;
}

static bool is_sync_step(const SpesPeer *p, int64_t step) {
    const TrainConfig *c = p->cfg;
    return spes_sync_due(step, c->sync_steps, c->sync_warmup_steps, c->sync_warmup_every);
}

// Whether the end of `step` applies the round in flight; decided once per step (the round may
// arrive in between, and every rank must agree on what the step end does).
static bool apply_due(SpesPeer *p, int64_t step) {
    if (p->plan_step != step) {
        p->plan_step = step;
        bool in_flight = p->pending.job != NULL;
        bool arrived = in_flight && (p->apply_after > 0 ? step >= p->pending.step + p->apply_after : round_done(&p->pending));
        p->plan_apply = in_flight && (is_sync_step(p, step) || checkpoint_due(p, step) || stop_requested(p) || arrived);
    }
    return p->plan_apply;
}

bool spes_peer_step_touches_model(SpesPeer *p, int64_t step) { return is_sync_step(p, step) || apply_due(p, step); }

static int sync_work(SpesPeer *p, Model *m, int64_t step) {
    const TrainConfig *cfg = p->cfg;
    int64_t every = cfg->decayed_factor_update_steps > 0 ? cfg->decayed_factor_update_steps : 1;
    if (step % every == 0) update_lb_factor(p, step);
    bool sync_step = is_sync_step(p, step), apply = apply_due(p, step);
    p->plan_step = -1;
    if (apply) {
        int64_t round_step = p->pending.step;
        if (apply_pending(p, m, step) != SPES_OK) {
            // The local weights stay (the aggregate never reached them): saved as not synced.
            p->unsynced_step = step;
            return spes_fail_context("sync step %" PRId64 " (overlapped, applying at step %" PRId64 ")", round_step, step);
        }
    }
    if (!sync_step) return SPES_OK;
    if (step > INT32_MAX) return spes_fail("step %" PRId64 " does not fit the wire protocol's int32", step);
    int rc = cfg->sync_overlap && !checkpoint_due(p, step) ? begin_overlapped(p, m, step) : sync_round(p, m, step);
    if (rc != SPES_OK) {
        p->unsynced_step = step;   // the caller saves the local state, marked not synced
        return spes_fail_context("sync step %" PRId64, step);
    }
    return SPES_OK;
}
