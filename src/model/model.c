// Model lifecycle: parameter and gradient buffers, OLMo init, trainable masks, FLOP count.
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/rng.h"
#include "model/model_internal.h"

// Backend memory for n floats of type t (zeroed).
static void *alloc_backend(Backend *be, size_t n, NumType t, const char *what) {
    size_t bytes;
    void *p = NULL;
    if (!spes_mul_size(n, num_type_size(t), &bytes)) {
        spes_fail("%s: %zu values overflow size_t", what, n);
        return NULL;
    }
    if (backend_alloc(be, bytes, &p) != SPES_OK) {
        spes_fail_context("%s (%zu %s values on %s)", what, n, num_type_name(t), be->name);
        return NULL;
    }
    return p;
}

static int alloc_grads(Model *m) {
    if (m->table.trainable_numel == 0) return SPES_OK;
    m->grads = alloc_backend(m->be, m->table.trainable_numel, NUM_F32, "model gradients");
    return m->grads ? SPES_OK : SPES_ERR;
}

int model_create(Model *m, const ModelConfig *cfg) { return model_create_on(m, cfg, backend_cpu()); }

// The parameter buffers: host copy, backend fp32 master (the same on cpu), compute copy.
static int alloc_params(Model *m) {
    Backend *be = m->be;
    const size_t n = m->table.total_numel;
    if (be->host_memory) {
        m->params = m->dparams = alloc_backend(be, n, NUM_F32, "model parameters");
    } else {   // the host copy is page-locked: checkpoints and sync payloads move at bus speed
        if (!m->params && be->ops->host_alloc(be, n * sizeof(float), (void **)&m->params) != SPES_OK)
            spes_fail_context("model parameters (host copy)");
        m->dparams = m->params ? alloc_backend(be, n, NUM_F32, "model parameters") : NULL;
    }
    if (!m->dparams) return SPES_ERR;
    if (be->compute != NUM_F32 && !(m->cparams = alloc_backend(be, n, be->compute, "model parameters (compute copy)")))
        return SPES_ERR;
    return SPES_OK;
}

static void free_params(Model *m) {
    if (!m->be->host_memory && m->params) m->be->ops->host_free(m->be, m->params);
    backend_free(m->be, m->dparams);   // on cpu also the host copy (the same buffer)
    backend_free(m->be, m->cparams);
    m->params = m->dparams = NULL;
    m->cparams = NULL;
}

static int create(Model *m, const ModelConfig *cfg, Backend *be, bool trainable) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    SPES_TRY(model_config_validate(&m->cfg));
    SPES_TRY(param_table_build(&m->cfg, &m->table));
    int rc = SPES_OK;
    if (!trainable) {
        bool *none = spes_calloc((size_t)m->table.count, sizeof(bool));
        if (none) param_table_set_trainable(&m->table, none);
        else rc = SPES_ERR;
        free(none);
    }
    if (rc == SPES_OK) rc = alloc_params(m);
    if (rc == SPES_OK) rc = alloc_grads(m);
    if (rc == SPES_OK && !(m->expert_counts = spes_calloc((size_t)m->cfg.n_layers * m->cfg.num_experts, sizeof(int64_t))))
        rc = SPES_ERR;
    if (rc == SPES_OK) rc = model_bind(m);
    if (rc != SPES_OK) {
        model_free(m);
        return SPES_ERR;
    }
    return SPES_OK;
}

int model_create_on(Model *m, const ModelConfig *cfg, Backend *be) { return create(m, cfg, be, true); }
int model_create_frozen_on(Model *m, const ModelConfig *cfg, Backend *be) { return create(m, cfg, be, false); }

void model_free(Model *m) {
    if (!m->be) return;
    model_acts_free(m);
    model_unbind(m);
    free_params(m);
    backend_free(m->be, m->grads);
    free(m->expert_counts);
    param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

int model_release_params(Model *m) {
    if (!m->dparams) return spes_fail("model_release_params: the parameters are released already");
    if (m->be->host_memory) {
        free_params(m);
        return SPES_OK;
    }
    // A device keeps the host copy (host memory; page-locking it again at every restore is slow).
    backend_free(m->be, m->dparams);
    backend_free(m->be, m->cparams);
    m->dparams = NULL;
    m->cparams = NULL;
    return SPES_OK;
}

int model_restore_params(Model *m) {
    if (m->dparams) return spes_fail("model_restore_params: the model holds its parameters");
    if (alloc_params(m) != SPES_OK) {
        free_params(m);
        return spes_fail_context("restoring the model's parameter buffers");
    }
    return model_bind(m);
}

int model_release_grads(Model *m) {
    if (!m->grads) return SPES_OK;   // released already, or nothing trains
    backend_free(m->be, m->grads);
    m->grads = NULL;
    return m->dparams ? model_bind(m) : SPES_OK;   // no view keeps pointing at the freed buffer
}

int model_restore_grads(Model *m) {
    if (m->grads || m->table.trainable_numel == 0) return SPES_OK;
    SPES_TRY(alloc_grads(m));
    return m->dparams ? model_bind(m) : SPES_OK;
}

int model_move_to(Model *m, Backend *be) {
    if (m->be == be) return SPES_OK;
    SPES_TRY(model_params_to_host(m));
    Model moved;
    SPES_TRY(model_create_frozen_on(&moved, &m->cfg, be));
    bool *mask = spes_calloc((size_t)m->table.count, sizeof(bool));
    int rc = mask ? SPES_OK : SPES_ERR;
    for (int i = 0; rc == SPES_OK && i < m->table.count; i++) mask[i] = m->table.entries[i].trainable;
    if (rc == SPES_OK) rc = model_set_trainable(&moved, mask);
    free(mask);
    if (rc == SPES_OK) {
        memcpy(moved.params, m->params, m->table.total_numel * sizeof(float));
        rc = model_params_to_device(&moved);
    }
    if (rc != SPES_OK) {
        model_free(&moved);
        return spes_fail_context("moving the model to %s", be->description);
    }
    moved.checkpointing = m->checkpointing;
    model_free(m);
    *m = moved;
    return SPES_OK;
}

int model_checkpointing_mode(const char *mode, int *out) {
    if (!mode || !strcmp(mode, "none") || !strcmp(mode, "null") || !strcmp(mode, "false"))
        *out = ACT_KEEP_ALL;
    else if (!strcmp(mode, "fine_grained"))
        *out = ACT_KEEP_NO_EXPERTS;
    else if (!strcmp(mode, "whole_layer"))
        *out = ACT_KEEP_INPUTS;
    else
        return spes_fail("activation_checkpointing '%s': supported are whole_layer, fine_grained and none", mode);
    return SPES_OK;
}

int model_set_activation_checkpointing(Model *m, const char *mode) {
    SPES_TRY(model_checkpointing_mode(mode, &m->checkpointing));
    model_acts_free(m);   // planned anew at the next call
    return SPES_OK;
}

int model_params_to_device(Model *m) {
    Backend *be = m->be;
    const size_t n = m->table.total_numel;
    if (!be->host_memory) SPES_TRY(be->ops->upload(be, m->dparams, m->params, n * sizeof(float)));
    if (m->cparams) be->ops->convert(be, buf_of(m->cparams, be->compute), buf_f32(m->dparams), n);
    return backend_sync(be);
}

int model_params_to_host(Model *m) {
    Backend *be = m->be;
    if (be->host_memory) return SPES_OK;
    SPES_TRY(backend_sync(be));
    return be->ops->download(be, m->params, m->dparams, m->table.total_numel * sizeof(float));
}

// Each tensor draws from its own stream (seed, tensor index), so the result does not depend
// on how tensors are spread over threads.
void model_init_weights(Model *m, uint64_t seed) {
    const double std = m->cfg.init_std;
    const double cutoff = m->cfg.init_cutoff_factor > 0 ? m->cfg.init_cutoff_factor : 1e300;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *p = &m->table.entries[i];
        float *w = m->params + p->offset;
        if (param_kind_is_norm(p->kind)) {
            for (size_t j = 0; j < p->numel; j++) w[j] = 1.0f;
            continue;
        }
        Rng rng;
        rng_seed(&rng, seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)));
        for (size_t j = 0; j < p->numel; j++) w[j] = (float)rng_truncated_normal(&rng, std, cutoff);
    }
}

int model_set_trainable(Model *m, const bool *mask) {
    param_table_set_trainable(&m->table, mask);
    backend_free(m->be, m->grads);
    m->grads = NULL;
    SPES_TRY(alloc_grads(m));
    return model_bind(m);
}

int model_set_trainable_experts(Model *m, int first, int last) {
    bool *mask = spes_calloc((size_t)m->table.count, sizeof(bool));
    if (!mask) return SPES_ERR;
    param_table_expert_mask(&m->table, first, last, mask);
    int rc = model_set_trainable(m, mask);
    free(mask);
    return rc;
}

float *model_param(Model *m, int index) { return m->params + m->table.entries[index].offset; }

float *model_grad(Model *m, int index) {
    const ParamInfo *p = &m->table.entries[index];
    return p->trainable && m->grads ? m->grads + p->grad_offset : NULL;
}

void model_zero_grad(Model *m) {
    if (m->grads) m->be->ops->zero(m->be, m->grads, m->table.trainable_numel * sizeof(float));
}

// Matmul FLOPs: forward 2*m*n*k per GEMM, backward 2x that for dX + dW, the dW half only for
// trainable tensors. Experts: each token visits k experts; the trainable share of expert dW
// is estimated as the trainable fraction of experts (uniform routing). Attention scores and
// the weighted sum count the causal half.
double model_train_flops(const Model *m, int B, int T) {
    const ModelConfig *c = &m->cfg;
    const double N = (double)B * T, hd = c->head_dim;
    double fwd = 0.0, dw = 0.0;
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *p = &m->table.entries[i];
        if (p->ndim != 2 || p->kind == PARAM_EMBED) continue;
        double tokens = N;
        if (p->kind == PARAM_EXPERT_GATE || p->kind == PARAM_EXPERT_UP || p->kind == PARAM_EXPERT_DOWN)
            tokens = N * c->top_k / c->num_experts;
        double f = 2.0 * tokens * (double)p->numel;
        fwd += f;
        if (p->trainable) dw += f;
    }
    double attn = c->n_layers * 2.0 * 2.0 * (double)B * c->n_heads * hd * (double)T * (T + 1) / 2.0;
    return fwd + fwd + dw + 3.0 * attn;   // forward, dX, dW; attention fwd + 2x bwd
}
