// The bytes of a SPES run's sync rounds, planned. See plan_sync.h.
#include "train/plan_sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "io/safetensors.h"
#include "model/param_table.h"
#include "sync/aggregate_step.h"
#include "sync/delta_payload.h"
#include "sync/expert_owners.h"
#include "sync/model_spec.h"
#include "train/trainer.h"

const char *plan_payload_name(PayloadDtype d) {
    static const char *const names[] = {"f32", "bf16", "int8", "int4"};
    return (unsigned)d < 4 ? names[d] : "?";
}

// The parameter table with peer `peer`'s trainable mask (cfg's topology).
typedef struct {
    ParamTable table;
    bool **mask;            // [peers][table.count]: each peer's trainable tensors
    int peers;              // num_peers (1 for a plain run)
} Tables;

static void tables_free(Tables *t) {
    for (int p = 0; t->mask && p < t->peers; p++) free(t->mask[p]);
    free(t->mask);
    param_table_free(&t->table);
}

static int tables_build(const TrainConfig *cfg, Tables *t) {
    memset(t, 0, sizeof *t);
    ModelConfig mc = cfg->model;
    SPES_TRY(model_config_validate(&mc));
    SPES_TRY(param_table_build(&mc, &t->table));
    t->peers = cfg->using_spes || cfg->using_dilico ? cfg->num_peers : 1;
    if (t->peers < 1) t->peers = 1;
    if (!(t->mask = spes_calloc((size_t)t->peers, sizeof *t->mask))) return SPES_ERR;
    TrainConfig peer = *cfg;   // read only: its peer_id changed
    for (int p = 0; p < t->peers; p++) {
        int first, last;
        peer.peer_id = p;
        SPES_TRY(trainer_own_experts(&peer, mc.num_experts, &first, &last));
        if (!(t->mask[p] = spes_calloc((size_t)t->table.count, sizeof(bool)))) return SPES_ERR;
        param_table_expert_mask(&t->table, first, last, t->mask[p]);
    }
    return SPES_OK;
}

// Bytes of a safetensors image of the tensors with select[i] (all when NULL) in dtype, with
// metadata "spes_step" = step when >= 0 and "spes_view" = view when not NULL: what
// safetensors_serialize writes (an upload, step -1), or the server serves (the aggregate of step,
// or aggregate_view_build's view of it).
static int plain_bytes(const ParamTable *t, const bool *select, DType dtype, int step, const char *view, size_t *len) {
    StWriteTensor *w = spes_calloc((size_t)t->count + 1, sizeof *w);
    if (!w) return SPES_ERR;
    int n = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *pi = &t->entries[i];
        if (select && !select[i]) continue;
        w[n] = (StWriteTensor){.name = pi->name, .dtype = dtype, .ndim = pi->ndim};
        for (int d = 0; d < pi->ndim; d++) w[n].shape[d] = pi->shape[d];
        n++;
    }
    char step_text[24];
    snprintf(step_text, sizeof step_text, "%d", step);
    const char *keys[2], *values[2];
    int n_meta = 0;
    if (step >= 0) keys[n_meta] = SYNC_META_STEP, values[n_meta++] = step_text;
    if (view) keys[n_meta] = "spes_view", values[n_meta++] = view;
    int rc = safetensors_serialized_size(w, n, keys, values, n_meta, len);
    free(w);
    return rc;
}

// Bytes of a delta payload of the tensors with select[i] (all when NULL), against base_step (the
// server's of the aggregate of step when step >= 0); as a view without the tensors keep[i] false
// when keep (view name `view`).
static int delta_bytes(const ParamTable *t, const DeltaCodec *c, const bool *select, int base_step, int step,
                       const bool *keep, const char *view, size_t *len) {
    DeltaTensor *w = spes_calloc((size_t)t->count + 1, sizeof *w);
    bool *kept = keep ? spes_calloc((size_t)t->count + 1, sizeof(bool)) : NULL;
    if (!w || (keep && !kept)) {
        free(w);
        free(kept);
        return SPES_ERR;
    }
    int n = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *pi = &t->entries[i];
        if (select && !select[i]) continue;
        w[n] = (DeltaTensor){.name = pi->name, .ndim = pi->ndim, .numel = pi->numel};
        for (int d = 0; d < pi->ndim; d++) w[n].shape[d] = pi->shape[d];
        if (kept) kept[n] = keep[i];
        n++;
    }
    int rc = delta_payload_aggregate_bytes(c, w, n, base_step, step, kept, view, len);
    free(w);
    free(kept);
    return rc;
}

// One round's bytes for peer p: first (no aggregate yet) or a later one against base_step; its
// aggregate is of step.
static int peer_round(const TrainConfig *cfg, const Tables *t, int p, PayloadDtype dtype, bool first, int base_step,
                      int step, size_t *up, size_t *down) {
    const ParamTable *tab = &t->table;
    const bool *mine = t->mask[p];
    // The aggregate's view for p leaves out p's own experts (SPES with one owner per expert; with
    // replicas an expert comes down as its owners' mean; fedavg sends every tensor down).
    bool omit_own = cfg->using_spes && !cfg->using_dilico &&
                expert_replicas(cfg->num_peers, cfg->num_train_experts_per_node, cfg->model.num_experts) == 1;
    bool *keep = spes_calloc((size_t)tab->count + 1, sizeof(bool));
    if (!keep) return SPES_ERR;
    for (int i = 0; i < tab->count; i++) keep[i] = !(omit_own && tab->entries[i].expert >= 0 && mine[i]);
    int rc = SPES_OK;
    if (dtype == PAYLOAD_F32 || dtype == PAYLOAD_BF16) {
        DType d = dtype == PAYLOAD_F32 ? DTYPE_F32 : DTYPE_BF16;
        rc = plain_bytes(tab, mine, d, -1, NULL, up);
        if (rc == SPES_OK)
            rc = plain_bytes(tab, omit_own ? keep : NULL, d, step, omit_own ? SYNC_VIEW_OMIT_OWN : NULL, down);
    } else if (first) {   // no base: F32 both ways, the aggregate whole
        rc = plain_bytes(tab, mine, DTYPE_F32, -1, NULL, up);
        if (rc == SPES_OK) rc = plain_bytes(tab, NULL, DTYPE_F32, step, NULL, down);
    } else {
        const DeltaCodec *c = dtype == PAYLOAD_INT8 ? &DELTA_INT8 : &DELTA_INT4;
        rc = delta_bytes(tab, c, mine, base_step, -1, NULL, NULL, up);
        if (rc == SPES_OK)
            rc = delta_bytes(tab, c, NULL, base_step, step, omit_own ? keep : NULL, omit_own ? c->view_omit_own : NULL, down);
    }
    free(keep);
    return rc;
}

int plan_sync(const TrainConfig *cfg, PayloadDtype dtype, int base_step, PlanSync *out) {
    memset(out, 0, sizeof *out);
    out->dtype = dtype;
    out->upper_bound = dtype == PAYLOAD_INT4;
    Tables t;
    int rc = tables_build(cfg, &t);
    out->peers = t.peers;
    for (int p = 0; rc == SPES_OK && p < t.peers; p++) {
        size_t up1, down1, up, down;
        int steps = (int)cfg->sync_steps;
        rc = peer_round(cfg, &t, p, dtype, true, 0, steps, &up1, &down1);
        if (rc == SPES_OK) rc = peer_round(cfg, &t, p, dtype, false, base_step, base_step + steps, &up, &down);
        if (rc != SPES_OK) break;
        out->ingress_first += up1, out->egress_first += down1, out->ingress += up, out->egress += down;
        if (p == (cfg->peer_id < t.peers ? cfg->peer_id : 0))
            out->up_first = up1, out->down_first = down1, out->up = up, out->down = down;
    }
    tables_free(&t);
    return rc;
}

int plan_sync_run(const TrainConfig *cfg, PayloadDtype dtype, int rounds, size_t *bytes_in, size_t *bytes_out) {
    *bytes_in = *bytes_out = 0;
    Tables t;
    int rc = tables_build(cfg, &t);
    // A later round's bytes depend on its base step and its step only through the digits the
    // metadata spells them with: each pair of digit counts is sized once.
    size_t in_by_digits[12][12] = {{0}}, out_by_digits[12][12] = {{0}};
    for (int r = 1; rc == SPES_OK && r <= rounds; r++) {
        int base = (int)((r - 1) * cfg->sync_steps), step = (int)(r * cfg->sync_steps);
        int base_digits = snprintf(NULL, 0, "%d", base), step_digits = snprintf(NULL, 0, "%d", step);
        size_t *in = r == 1 ? NULL : &in_by_digits[base_digits][step_digits];
        size_t *out = r == 1 ? NULL : &out_by_digits[base_digits][step_digits];
        if (in && *in) {
            *bytes_in += *in, *bytes_out += *out;
            continue;
        }
        size_t round_in = 0, round_out = 0;
        for (int p = 0; rc == SPES_OK && p < t.peers; p++) {
            size_t up, down;
            rc = peer_round(cfg, &t, p, dtype, r == 1, base, step, &up, &down);
            round_in += up, round_out += down;
        }
        if (in) *in = round_in, *out = round_out;
        *bytes_in += round_in, *bytes_out += round_out;
    }
    tables_free(&t);
    return rc;
}
