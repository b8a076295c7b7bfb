#include "train/spes_peer.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/timer.h"
#include "io/safetensors.h"
#include "sync/auth.h"
#include "sync/client.h"
#include "sync/model_spec.h"

struct SpesPeer {
    const TrainConfig *cfg;
    SyncClient *client;
    float *lb_factor;           // [L*E]
    int64_t total_steps;
    StWriteTensor *upload;      // trainable tensors, pointing into the model's parameters
    int n_upload;
};

float spes_decayed_factor(int64_t step, int64_t total_steps) {
    double ramp = 0.2 * (double)total_steps;
    if (ramp <= 0 || (double)step >= ramp) return 1.0f;
    return (float)(0.7 + 0.3 * (double)step / ramp);
}

// Own experts of this peer get c(t); every other expert counts fully.
static void update_lb_factor(SpesPeer *p, int64_t step) {
    const ModelConfig *mc = &p->cfg->model;
    int m = p->cfg->num_train_experts_per_node, first = p->cfg->peer_id * m;
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
    cc.payload_dtype = cfg->payload_dtype == PAYLOAD_BF16 ? DTYPE_BF16 : DTYPE_F32;
    cc.connect_timeout_s = cfg->retry_timeout_s;
    cc.tls_ca = cfg->tls_ca;
    cc.tls_cert = cfg->tls_cert;
    cc.tls_key = cfg->tls_key;
    char *token = NULL;
    if (cfg->auth_token_file && auth_read_token_file(cfg->auth_token_file, &token) != SPES_OK) {
        spes_peer_free(p);
        return spes_fail_context("spes_config.auth_token_file");
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

void spes_peer_free(SpesPeer *p) {
    if (!p) return;
    if (p->client) sync_client_destroy(p->client);
    free(p->lb_factor);
    free(p->upload);
    free(p);
}

const float *spes_peer_lb_count_factor(const SpesPeer *p) { return p->lb_factor; }

// Downloads the server's newest aggregate into the model's weights; *newest: its step.
static int load_newest(SpesPeer *p, Model *m, int *newest) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    SPES_TRY(sync_client_download_latest(p->client, newest, &bytes, &len));
    char what[64];
    snprintf(what, sizeof what, "aggregate of step %d", *newest);
    int rc = spes_load_aggregate(m, bytes, len, what);
    free(bytes);
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

int spes_peer_connect(SpesPeer *p, Model *m, int64_t start_step, int64_t total_steps) {
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
    p->upload = spes_calloc((size_t)table->count, sizeof(StWriteTensor));
    if (!p->upload) return SPES_ERR;
    p->n_upload = 0;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *e = &table->entries[i];
        if (!e->trainable) continue;
        StWriteTensor *t = &p->upload[p->n_upload++];
        t->name = e->name;
        t->dtype = DTYPE_F32;
        t->ndim = e->ndim;
        for (int d = 0; d < e->ndim; d++) t->shape[d] = e->shape[d];
        t->data = m->params + e->offset;
    }
    log_info("spes peer %d/%d: connected to %s, uploading %d trainable tensors every %" PRId64 " steps (%s)",
             p->cfg->peer_id, p->cfg->num_peers, p->cfg->server_addr, p->n_upload, p->cfg->sync_steps,
             p->cfg->using_dilico ? "fedavg" : "spes");
    if (p->cfg->take_over_peer_id >= 0 && start_step == 0) return take_over(p, m);
    return start_step > 0 ? rejoin(p, m, start_step) : SPES_OK;
}

int spes_load_aggregate(Model *m, const uint8_t *bytes, size_t len, const char *what) {
    SafeTensors st;
    SPES_TRY(safetensors_parse(bytes, len, what, &st));
    int rc = SPES_OK;
    for (int i = 0; i < m->table.count && rc == SPES_OK; i++) {
        const ParamInfo *e = &m->table.entries[i];
        const StTensor *t = safetensors_find(&st, e->name);
        if (!t) {
            rc = spes_fail("%s lacks tensor %s", what, e->name);
            break;
        }
        if (t->numel != e->numel || t->ndim != e->ndim || t->shape[0] != e->shape[0] ||
            (e->ndim == 2 && t->shape[1] != e->shape[1])) {
            rc = spes_fail("%s: tensor %s has the wrong shape", what, e->name);
            break;
        }
        rc = safetensors_to_f32(t, m->params + e->offset);
    }
    if (rc == SPES_OK && st.count != m->table.count)
        rc = spes_fail("%s has %d tensors, the model %d", what, st.count, m->table.count);
    safetensors_close(&st);
    if (rc == SPES_OK) rc = model_params_to_device(m);
    return rc;
}

// With SPES_SYNC_LOG_DIR set, every upload and downloaded aggregate is also written there as
// {up,down}_s<step>_p<peer>.safetensors: an audit trail an independent checker can replay.
static int audit_log(const SpesPeer *p, const char *kind, int64_t step, const uint8_t *bytes, size_t len) {
    const char *dir = getenv("SPES_SYNC_LOG_DIR");
    if (!dir || !*dir) return SPES_OK;
    char name[96];
    snprintf(name, sizeof name, "%s_s%" PRId64 "_p%d.safetensors", kind, step, p->cfg->peer_id);
    char *path = path_join(dir, name);
    if (!path) return SPES_ERR;
    int rc = file_write_atomic(path, bytes, len);
    free(path);
    return rc;
}

int spes_peer_after_step(void *ctx, Model *m, int64_t step) {
    SpesPeer *p = ctx;
    const TrainConfig *cfg = p->cfg;
    int64_t every = cfg->decayed_factor_update_steps > 0 ? cfg->decayed_factor_update_steps : 1;
    if (step % every == 0) update_lb_factor(p, step);
    if (cfg->sync_steps <= 0 || step % cfg->sync_steps != 0) return SPES_OK;
    if (step > INT32_MAX) return spes_fail("step %" PRId64 " does not fit the wire protocol's int32", step);

    double start = now_seconds();
    uint8_t *payload = NULL, *bytes = NULL;
    size_t payload_len = 0, len = 0;
    int rc = model_params_to_host(m);   // the upload points into the host parameters
    if (rc == SPES_OK) rc = sync_client_serialize(p->client, p->upload, p->n_upload, &payload, &payload_len);
    if (rc == SPES_OK) rc = audit_log(p, "up", step, payload, payload_len);
    if (rc == SPES_OK) rc = sync_client_upload_bytes(p->client, (int)step, payload, payload_len);
    free(payload);
    int64_t loaded = step;
    if (rc == SPES_OK) {
        rc = sync_client_wait_and_download(p->client, (int)step, &bytes, &len);
    } else if (sync_client_last_status(p->client) == GRPC_STATUS_ABORTED) {
        // Too late: the round closed without us (round timeout). Take the newest aggregate and carry on.
        log_warn("sync step %" PRId64 ": %s", step, spes_last_error());
        int newest = -1;
        rc = sync_client_download_latest(p->client, &newest, &bytes, &len);
        loaded = newest;
    }
    if (rc == SPES_OK) rc = audit_log(p, "down", step, bytes, len);
    char what[64];
    snprintf(what, sizeof what, "aggregate of step %" PRId64, loaded);
    if (rc == SPES_OK) rc = spes_load_aggregate(m, bytes, len, what);
    free(bytes);
    SPES_TRY(rc);
    const SyncStats *s = sync_client_stats(p->client);
    log_info("sync step %" PRId64 ": %.2fs total (upload %.2fs, wait %.2fs, download %.2fs), up %.2f MB, down %.2f MB",
             step, now_seconds() - start, s->upload_s, s->wait_s, s->download_s, (double)s->bytes_up / 1e6,
             (double)s->bytes_down / 1e6);
    return SPES_OK;
}
