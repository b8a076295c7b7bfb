// Activation memory: one arena per (B, T), carved into the buffers of model_internal.h.
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timer.h"
#include "model/model_internal.h"

// Rows of the LM-head block on a backend without a byte budget for it (the cpu): logits exist
// for this many tokens at a time.
#define LOGIT_BLOCK_ROWS 512
// Rows of the fp32 staging the host's logits go through (eval, debug-step, generation) when
// the block is low precision or padded.
#define LOGIT_STAGE_ROWS 256

int logits_row_stride(int V, int align) { return align > 1 ? (V + align - 1) / align * align : V; }

int logits_block_rows(size_t N, int ld, NumType ct, size_t block_bytes) {
    size_t rows = LOGIT_BLOCK_ROWS;
    if (block_bytes > 0) {   // as many rows as the budget holds, a multiple of 64 (GEMM tiles)
        rows = block_bytes / ((size_t)ld * num_type_size(ct)) / 64 * 64;
        if (rows < 64) rows = 64;
    }
    return (int)(N < rows ? N : rows);
}

typedef struct {
    char *base;     // NULL while measuring
    size_t used;    // bytes
    bool overflow;
} Carver;

static void *carve(Carver *c, size_t count, size_t elem) {
    size_t bytes;
    if (!spes_mul_size(count, elem, &bytes) || c->used + bytes + 64 < c->used) {
        c->overflow = true;
        return NULL;
    }
    void *p = c->base ? c->base + c->used : NULL;
    c->used += (bytes + 63) & ~(size_t)63;
    return p;
}

#define CARVE_F(c, n) ((float *)carve((c), (n), sizeof(float)))
#define CARVE_I(c, n) ((int32_t *)carve((c), (n), sizeof(int32_t)))
#define CARVE_D(c, n) ((double *)carve((c), (n), sizeof(double)))
// Compute-typed buffers (GEMM operands and outputs): fp32 on cpu, bf16/f16 on a device.
#define CARVE_C(c, n, t) ((Buf){carve((c), (n), num_type_size(t)), (t)})

// Layers other than 0 share layer 0's buffers as `keep` allows (ActKeep).
static void layout(const ModelConfig *cfg, const Backend *be, ActKeep keep, ModelActivations *a, LayerActs *layers,
                   Carver *c) {
    const NumType ct = be->compute;
    const size_t N = (size_t)a->B * a->T, H = cfg->d_model, hd = cfg->head_dim, E = cfg->num_experts;
    const size_t qd = (size_t)cfg->n_heads * hd, kd = (size_t)cfg->n_kv_heads * hd, I = cfg->expert_hidden;
    const size_t NK = N * cfg->top_k, V = cfg->embedding_size;
    const size_t q_rows = cfg->qk_norm == QK_NORM_HEAD ? N * cfg->n_heads : N;
    const size_t k_rows = cfg->qk_norm == QK_NORM_HEAD ? N * cfg->n_kv_heads : N;
    for (int l = 0; l < cfg->n_layers; l++) {
        LayerActs *la = &layers[l];
        if (l > 0 && keep == ACT_KEEP_INPUTS) {
            *la = layers[0];
            la->x_in = CARVE_F(c, N * H);
            // Small, and every layer's routing stays inspectable after a forward.
            la->probs = CARVE_F(c, N * E);
            la->topk_idx = CARVE_I(c, NK);
            la->offsets_host = a->offsets_host ? a->offsets_host + (size_t)l * (E + 1) : NULL;
            continue;
        }
        la->x_in = CARVE_F(c, N * H);
        la->h1 = CARVE_C(c, N * H, ct);
        la->rstd1 = CARVE_F(c, N);
        if (cfg->qk_norm != QK_NORM_NONE) {
            la->q_raw = CARVE_C(c, N * qd, ct);
            la->k_raw = CARVE_C(c, N * kd, ct);
            la->q_rstd = CARVE_F(c, q_rows);
            la->k_rstd = CARVE_F(c, k_rows);
        }
        la->q = CARVE_C(c, N * qd, ct);
        la->k = CARVE_C(c, N * kd, ct);
        la->v = CARVE_C(c, N * kd, ct);
        la->att = CARVE_C(c, N * qd, ct);
        la->att_lse = CARVE_F(c, N * cfg->n_heads);
        la->x_mid = CARVE_F(c, N * H);
        la->h2 = CARVE_C(c, N * H, ct);
        la->rstd2 = CARVE_F(c, N);
        la->probs = CARVE_F(c, N * E);
        la->router_lse = CARVE_F(c, N);
        la->topk_idx = CARVE_I(c, NK);
        la->topk_w = CARVE_F(c, NK);
        la->expert_offsets = CARVE_I(c, E + 1);
        la->row_token = CARVE_I(c, NK);
        la->row_of_slot = CARVE_I(c, NK);
        if (l > 0 && keep == ACT_KEEP_NO_EXPERTS) {
            la->gu = layers[0].gu;
            la->a = layers[0].a;
            la->y = layers[0].y;
        } else {
            la->gu = CARVE_C(c, NK * 2 * I, ct);
            la->a = CARVE_C(c, NK * I, ct);
            la->y = CARVE_C(c, NK * H, ct);
        }
        la->offsets_host = a->offsets_host ? a->offsets_host + (size_t)l * (E + 1) : NULL;
    }
    a->tokens = CARVE_I(c, N);
    a->targets = CARVE_I(c, N);
    a->x_final = CARVE_F(c, N * H);
    a->hf = CARVE_C(c, N * H, ct);
    a->rstd_f = CARVE_F(c, N);
    a->rope_cos = CARVE_F(c, (size_t)a->T * hd / 2);
    a->rope_sin = CARVE_F(c, (size_t)a->T * hd / 2);
    a->xe = CARVE_C(c, NK * H, ct);
    a->dxe = CARVE_C(c, NK * H, ct);
    a->da = CARVE_C(c, NK * I, ct);
    a->router_logits = CARVE_F(c, N * E);
    a->dtopk_w = CARVE_F(c, NK);
    a->dresid = CARVE_F(c, N * H);
    a->dh = CARVE_C(c, N * H, ct);
    a->dq = CARVE_C(c, N * qd, ct);
    a->dk = CARVE_C(c, N * kd, ct);
    a->dv = CARVE_C(c, N * kd, ct);
    a->datt = CARVE_C(c, N * qd, ct);
    a->qkv = CARVE_C(c, N * (qd + 2 * kd), ct);
    const size_t logits_at = c->used;
    a->logit_ld = logits_row_stride((int)V, be->logits_align);
    a->logit_rows = logits_block_rows(N, a->logit_ld, ct, be->logits_block_bytes);
    a->logits = CARVE_C(c, (size_t)a->logit_rows * a->logit_ld, ct);
    if (a->logit_ld != (int)V) {   // the head's GEMMs over ld columns: lm_head padded with zero rows, its dW too
        a->lm_head_padded = CARVE_C(c, (size_t)a->logit_ld * H, ct);
        a->d_lm_head_padded = CARVE_F(c, (size_t)a->logit_ld * H);
    } else {
        a->lm_head_padded = (Buf){NULL, ct};
        a->d_lm_head_padded = NULL;
    }
    a->logit_stage_rows = a->logit_rows < LOGIT_STAGE_ROWS ? a->logit_rows : LOGIT_STAGE_ROWS;
    const bool staged = ct != NUM_F32 || a->logit_ld != (int)V;
    a->logits_f32 = staged ? CARVE_F(c, (size_t)a->logit_stage_rows * V) : NULL;
    a->logits_bytes = c->used - logits_at;
    a->row_ce = CARVE_F(c, N);
    a->row_lse = CARVE_F(c, N);
    a->stats = CARVE_D(c, (size_t)cfg->n_layers * STATS_PER_LAYER(E) + 2);
}

// Host arrays read back from the backend: expert offsets per layer and the statistics.
static int alloc_host_side(const ModelConfig *cfg, ModelActivations *a) {
    const size_t L = cfg->n_layers, E = cfg->num_experts;
    a->offsets_host = spes_calloc(L * (E + 1), sizeof(int32_t));
    a->stats_host = spes_calloc(L * STATS_PER_LAYER(E) + 2, sizeof(double));
    return a->offsets_host && a->stats_host ? SPES_OK : SPES_ERR;
}

size_t model_acts_bytes(const ModelConfig *cfg, const Backend *traits, int B, int T, ActKeep keep,
                        size_t *logits_bytes) {
    // The same layout() model_acts_plan allocates from, carved with a measuring Carver over a
    // scratch descriptor: the arena's bytes without the arena (src/train/plan.c reads them).
    ModelActivations probe = {.B = B, .T = T};
    LayerActs *layers = spes_calloc((size_t)cfg->n_layers, sizeof *layers);
    if (!layers) return 0;
    Carver measure = {0};
    layout(cfg, traits, keep, &probe, layers, &measure);
    free(layers);
    if (logits_bytes) *logits_bytes = probe.logits_bytes;
    return measure.overflow ? 0 : measure.used;
}

int model_acts_plan(Model *m, int B, int T, ActKeep keep) {
    ModelActivations *a = m->acts;
    if (a && a->B == B && a->T == T && a->keep == keep) return SPES_OK;
    // Measure the layout for (B, T) with a scratch descriptor first.
    ModelActivations probe = {.B = B, .T = T};
    LayerActs *layers = spes_calloc((size_t)m->cfg.n_layers, sizeof *layers);
    if (!layers) return spes_fail_context("activation plan");
    Carver measure = {0};
    layout(&m->cfg, m->be, keep, &probe, layers, &measure);
    if (measure.overflow) {
        free(layers);
        return spes_fail("activation memory for batch %d x seq %d overflows size_t", B, T);
    }
    if (a && measure.used <= a->arena_bytes) {   // fits the current arena: carve it anew
        Carver fill = {.base = a->arena};
        a->B = B;
        a->T = T;
        a->keep = keep;
        layout(&m->cfg, m->be, keep, a, a->layers, &fill);
        free(layers);
        return SPES_OK;
    }
    model_acts_free(m);
    a = spes_calloc(1, sizeof *a);
    void *arena = NULL;
    if (!a || alloc_host_side(&m->cfg, a) != SPES_OK || backend_alloc(m->be, measure.used, &arena) != SPES_OK) {
        if (a) {
            free(a->offsets_host);
            free(a->stats_host);
        }
        free(a);
        free(layers);
        return spes_fail_context("activation memory for batch %d x seq %d (%.1f MiB on %s)", B, T,
                                 measure.used / 1048576.0, m->be->name);
    }
    Carver fill = {.base = arena};
    a->B = B;
    a->T = T;
    a->keep = keep;
    layout(&m->cfg, m->be, keep, a, layers, &fill);
    a->arena = fill.base;
    a->arena_bytes = measure.used;
    a->layers = layers;
    m->acts = a;
    return SPES_OK;
}

void model_acts_free(Model *m) {
    if (!m->acts) return;
    backend_free(m->be, m->acts->arena);
    free(m->acts->layers);
    free(m->acts->offsets_host);
    free(m->acts->stats_host);
    free(m->acts);
    m->acts = NULL;
}

// With m->phase_sync the work queued before a boundary is finished there, so the clock reads
// device time. A sync error is left for the pass's next checked call to report.
static double phase_clock(const Model *m) {
    if (m->phase_sync) (void)backend_sync(m->be);
    return now_seconds();
}

double phase_begin(const Model *m) { return phase_clock(m); }

void phase_end(Model *m, ModelPhase phase, double t0) { m->acts->phase_seconds[phase] += phase_clock(m) - t0; }

const char *model_phase_name(ModelPhase phase) {
    static const char *const names[MODEL_PHASE_COUNT] = {
        "embedding", "norms", "attention fwd", "attention bwd", "router", "moe dispatch", "experts fwd",
        "experts bwd", "lm_head+loss"};
    return (unsigned)phase < MODEL_PHASE_COUNT ? names[phase] : "?";
}

void model_phase_seconds(const Model *m, double *seconds) {
    for (int i = 0; i < MODEL_PHASE_COUNT; i++) seconds[i] = m->acts ? m->acts->phase_seconds[i] : 0.0;
}

void model_phase_reset(Model *m) {
    if (m->acts) memset(m->acts->phase_seconds, 0, sizeof m->acts->phase_seconds);
}
