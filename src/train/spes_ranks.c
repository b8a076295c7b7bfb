// Rank 0 syncs, everyone receives. See spes_ranks.h.
#include "train/spes_ranks.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "train/spes_peer.h"

struct SpesRanks {
    const TrainConfig *cfg;
    Comm *comm;
    SpesPeer *peer;            // rank 0 only
    float *lb_factor;          // ranks > 0: rank 0's factors, received every step
    size_t n_lb;
    int64_t unsynced_step;     // ranks > 0: rank 0's, received with each round's result
    int64_t touch_step;        // the step spes_ranks_step_touches_model answered for (-1: none)
    bool touches;              // its answer (rank 0's, on every rank)
};

static bool root(const SpesRanks *r) { return comm_rank(r->comm) == 0; }

int spes_ranks_create(const TrainConfig *cfg, Comm *comm, SpesRanks **out) {
    *out = NULL;
    SpesRanks *r = spes_calloc(1, sizeof *r);
    if (!r) return SPES_ERR;
    r->cfg = cfg;
    r->comm = comm;
    r->unsynced_step = -1;
    r->touch_step = -1;
    r->n_lb = (size_t)cfg->model.n_layers * (size_t)cfg->model.num_experts;
    int rc = root(r) ? spes_peer_create(cfg, &r->peer) : SPES_OK;
    if (rc == SPES_OK && !root(r) && !(r->lb_factor = spes_calloc(r->n_lb, sizeof(float)))) rc = SPES_ERR;
    if (rc == SPES_OK && !root(r))
        for (size_t i = 0; i < r->n_lb; i++) r->lb_factor[i] = 1.0f;
    if (rc != SPES_OK) {
        spes_ranks_free(r);
        return SPES_ERR;
    }
    *out = r;
    return SPES_OK;
}

void spes_ranks_free(SpesRanks *r) {
    if (!r) return;
    spes_peer_free(r->peer);
    free(r->lb_factor);
    free(r);
}

const float *spes_ranks_lb_count_factor(const SpesRanks *r) {
    return r->peer ? spes_peer_lb_count_factor(r->peer) : r->lb_factor;
}

void spes_ranks_set_stop_flag(SpesRanks *r, volatile sig_atomic_t *stop) {
    if (r->peer) spes_peer_set_stop_flag(r->peer, stop);
}

int spes_ranks_save_state(void *ctx, const char *dir) {
    SpesRanks *r = ctx;
    return r->peer ? spes_peer_save_state(r->peer, dir) : SPES_OK;
}

int64_t spes_ranks_unsynced_step(const SpesRanks *r) {
    return r->peer ? spes_peer_unsynced_step(r->peer) : r->unsynced_step;
}

// Rank 0's outcome (and unsynced step), then on success its factors and, when `params`, its
// parameters: the same on every rank afterwards.
static int share(SpesRanks *r, Model *m, int rc, bool params, const char *what) {
    int64_t info[2] = {rc, spes_ranks_unsynced_step(r)};
    SPES_TRY(comm_broadcast(r->comm, NULL, info, sizeof info, 0));
    if (!root(r)) {
        r->unsynced_step = info[1];
        if (info[0] != SPES_OK) return spes_fail("%s failed on rank 0, which talks to the parameter server (its log "
                                                 "says why)", what);
    }
    if (info[0] != SPES_OK) return SPES_ERR;   // rank 0: its own message stands
    float *lb = (float *)spes_ranks_lb_count_factor(r);
    SPES_TRY(comm_broadcast(r->comm, NULL, lb, r->n_lb * sizeof(float), 0));
    if (!params) return SPES_OK;
    if (root(r)) SPES_TRY(model_params_to_host(m));
    SPES_TRY(comm_broadcast(r->comm, NULL, m->params, m->table.total_numel * sizeof(float), 0));
    return root(r) ? SPES_OK : model_params_to_device(m);
}

int spes_ranks_connect(SpesRanks *r, Model *m, int64_t start_step, int64_t total_steps, bool unsynced) {
    if (!comm_is_multi(r->comm)) return spes_peer_connect(r->peer, m, start_step, total_steps, unsynced);
    int rc = root(r) ? spes_peer_connect(r->peer, m, start_step, total_steps, unsynced) : SPES_OK;
    return share(r, m, rc, true, "the handshake with the parameter server");
}

void spes_ranks_note_metrics(void *ctx, const StepMetrics *m) {
    SpesRanks *r = ctx;
    if (r->peer) spes_peer_note_metrics(r->peer, m);
}

int spes_ranks_step_touches_model(void *ctx, int64_t step, bool *touches) {
    SpesRanks *r = ctx;
    int64_t answer = root(r) ? spes_peer_step_touches_model(r->peer, step) : 0;
    if (comm_is_multi(r->comm)) SPES_TRY(comm_broadcast(r->comm, NULL, &answer, sizeof answer, 0));
    r->touch_step = step;
    r->touches = answer != 0;
    *touches = r->touches;
    return SPES_OK;
}

int spes_ranks_after_step(void *ctx, Model *m, int64_t step) {
    SpesRanks *r = ctx;
    bool touches = r->touches;
    if (r->touch_step != step) SPES_TRY(spes_ranks_step_touches_model(r, step, &touches));
    r->touch_step = -1;
    if (!comm_is_multi(r->comm)) return spes_peer_after_step(r->peer, m, step);
    int rc = root(r) ? spes_peer_after_step(r->peer, m, step) : SPES_OK;
    char what[64];
    snprintf(what, sizeof what, "sync step %" PRId64, step);
    // The parameters go out whenever rank 0's changed: at a sync step, and at the step end that
    // applies an overlapped round (which need not be a sync step).
    return share(r, m, rc, touches, what);
}
