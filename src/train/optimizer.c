// AdamW + global-norm clipping. See optimizer.h for the contract; the arithmetic itself is
// the backend's (ops/cpu/adamw.c on cpu).
#include "train/optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

int adamw_create(AdamW *opt, const ParamTable *table, const AdamWConfig *cfg) {
    return adamw_create_on(opt, table, cfg, backend_cpu());
}

int adamw_create_on(AdamW *opt, const ParamTable *table, const AdamWConfig *cfg, Backend *be) {
    return adamw_create_shard(opt, table, cfg, be, 0, table->trainable_numel);
}

int adamw_create_shard(AdamW *opt, const ParamTable *table, const AdamWConfig *cfg, Backend *be, size_t lo, size_t hi) {
    memset(opt, 0, sizeof *opt);
    if (lo > hi || hi > table->trainable_numel)
        return spes_fail("AdamW shard [%zu, %zu) outside the %zu trainable values", lo, hi, table->trainable_numel);
    opt->cfg = *cfg;
    opt->be = be;
    opt->lo = lo;
    opt->hi = hi;
    opt->numel = hi - lo;
    const size_t count = (size_t)table->count + 1;
    opt->count = table->count;
    if (!(opt->tensors = spes_calloc(count, sizeof *opt->tensors)) || !(opt->entry = spes_calloc(count, sizeof *opt->entry)) ||
        !(opt->norm_avg = spes_calloc(count, sizeof *opt->norm_avg)) ||
        !(opt->norm_avg_set = spes_calloc(count, sizeof *opt->norm_avg_set))) {
        adamw_free(opt);
        return SPES_ERR;
    }
    opt->offload = cfg->cpu_offload;
    if (opt->numel == 0) return SPES_OK;   // nothing trainable: no state
    const size_t bytes = opt->numel * sizeof(float);
    int rc = SPES_OK;
    if (opt->offload) {   // moments and staging in (page-locked) host memory only
        rc = be->ops->host_alloc(be, bytes, (void **)&opt->m);
        if (rc == SPES_OK) rc = be->ops->host_alloc(be, bytes, (void **)&opt->v);
        if (rc == SPES_OK) rc = be->ops->host_alloc(be, bytes, (void **)&opt->hg);
        if (rc == SPES_OK) rc = be->ops->host_alloc(be, bytes, (void **)&opt->hp);
        opt->dm = opt->m;
        opt->dv = opt->v;
    } else {
        rc = backend_alloc(be, bytes, (void **)&opt->dm);
        if (rc == SPES_OK) rc = backend_alloc(be, bytes, (void **)&opt->dv);
        if (rc == SPES_OK && be->host_memory) {
            opt->m = opt->dm;
            opt->v = opt->dv;
        } else if (rc == SPES_OK) {   // page-locked host copies for checkpoints
            rc = be->ops->host_alloc(be, bytes, (void **)&opt->m);
            if (rc == SPES_OK) rc = be->ops->host_alloc(be, bytes, (void **)&opt->v);
        }
    }
    if (rc != SPES_OK) {
        adamw_free(opt);
        return spes_fail_context("AdamW moments for %zu trainable values", table->trainable_numel);
    }
    return SPES_OK;
}

void adamw_free(AdamW *opt) {
    Backend *be = opt->be;
    if (be && (opt->offload || !be->host_memory)) {   // host_alloc'd moments
        float *host[] = {opt->m, opt->v, opt->hg, opt->hp};
        for (int i = 0; i < 4; i++)
            if (host[i]) be->ops->host_free(be, host[i]);
    }
    if (be && !opt->offload) {
        backend_free(be, opt->dm);
        backend_free(be, opt->dv);
    }
    free(opt->tensors);
    free(opt->entry);
    free(opt->norm_avg);
    free(opt->norm_avg_set);
    opt->m = opt->v = opt->dm = opt->dv = opt->hg = opt->hp = NULL;
    opt->tensors = NULL;
    opt->entry = NULL;
    opt->norm_avg = NULL;
    opt->norm_avg_set = NULL;
    opt->tensor_scale = NULL;
    opt->numel = 0;
}

int adamw_state_to_device(AdamW *opt) {
    Backend *be = opt->be;
    if (be->host_memory || opt->offload || opt->numel == 0) return SPES_OK;
    SPES_TRY(be->ops->upload(be, opt->dm, opt->m, opt->numel * sizeof(float)));
    return be->ops->upload(be, opt->dv, opt->v, opt->numel * sizeof(float));
}

int adamw_reset(AdamW *opt) {
    if (opt->numel) {
        memset(opt->m, 0, opt->numel * sizeof(float));
        memset(opt->v, 0, opt->numel * sizeof(float));
    }
    opt->step = 0;
    if (opt->norm_avg_set) memset(opt->norm_avg_set, 0, (size_t)opt->count * sizeof *opt->norm_avg_set);
    return adamw_state_to_device(opt);
}

void adamw_copy_norm_avg(AdamW *dst, const AdamW *src) {
    if (!dst->norm_avg || !src->norm_avg || dst->count != src->count) return;
    memcpy(dst->norm_avg, src->norm_avg, (size_t)src->count * sizeof *src->norm_avg);
    memcpy(dst->norm_avg_set, src->norm_avg_set, (size_t)src->count * sizeof *src->norm_avg_set);
}

int adamw_state_to_host(AdamW *opt) {
    Backend *be = opt->be;
    if (be->host_memory || opt->offload || opt->numel == 0) return SPES_OK;
    SPES_TRY(backend_sync(be));
    SPES_TRY(be->ops->download(be, opt->m, opt->dm, opt->numel * sizeof(float)));
    return be->ops->download(be, opt->v, opt->dv, opt->numel * sizeof(float));
}

bool adamw_param_decays(const AdamWConfig *cfg, ParamKind kind) {
    if (kind == PARAM_EMBED) return cfg->decay_embeddings;          // nn.Embedding
    if (param_kind_is_norm(kind)) return cfg->decay_norm_and_bias;  // LayerNormBase
    return true;                                                    // nn.Linear
}

// The piece [a, b) of the gradient layout that tensor pi has inside the state's range (the
// whole tensor unsharded); false when it has none there.
static bool piece(const AdamW *opt, const ParamInfo *pi, size_t *a, size_t *b) {
    if (!pi->trainable || pi->grad_offset < 0) return false;
    size_t go = (size_t)pi->grad_offset;
    *a = go > opt->lo ? go : opt->lo;
    *b = go + pi->numel < opt->hi ? go + pi->numel : opt->hi;
    return *a < *b;
}

// Where value a of the gradient layout (tensor pi) sits in the parameters the update reads:
// the table's layout, or packed as the state's range (adamw_step_packed).
static size_t param_at(const AdamW *opt, const ParamInfo *pi, size_t a, bool packed) {
    return packed ? a - opt->lo : pi->offset + (a - (size_t)pi->grad_offset);
}

// Offload: every piece's fp32 parameters between the device and the host staging (at the
// range's offsets); after the update also the compute copy.
static int move_params(AdamW *opt, const ParamTable *table, float *params, bool packed, Buf compute, bool up) {
    Backend *be = opt->be;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        size_t a, b;
        if (!piece(opt, pi, &a, &b)) continue;
        size_t at = param_at(opt, pi, a, packed), bytes = (b - a) * sizeof(float);
        float *host = opt->hp + (a - opt->lo);
        if (!up) {
            SPES_TRY(be->ops->download(be, host, params + at, bytes));
            continue;
        }
        SPES_TRY(be->ops->upload(be, params + at, host, bytes));
        if (compute.p) be->ops->convert(be, buf_at(compute, at), buf_f32(params + at), b - a);
    }
    return SPES_OK;
}

// One update begins: the step count, and torch's _single_tensor_adamw scalars for it, each
// rounded to float as the CPU kernels do; *decay_mul is a decaying tensor's factor.
static AdamWScalars begin_update(AdamW *opt, float grad_scale, double lr, float *decay_mul) {
    const AdamWConfig *c = &opt->cfg;
    opt->step++;
    double t = (double)opt->step;
    double bc1 = 1.0 - pow(c->beta1, t);
    double bc2 = 1.0 - pow(c->beta2, t);
    *decay_mul = (float)(1.0 - lr * c->weight_decay);
    return (AdamWScalars){.w1 = (float)(1.0 - c->beta1),
                          .beta2 = (float)c->beta2,
                          .w2 = (float)(1.0 - c->beta2),
                          .bc2_sqrt = (float)sqrt(bc2),
                          .eps = (float)c->eps,
                          .neg_step_size = (float)(-(lr / bc1)),
                          .grad_scale = grad_scale};
}

// Fills opt->tensors with the update's work list: every trainable piece in the state's range,
// or only those of hook part `part` (model.h; part < 0: all). Returns how many.
static int work_list(AdamW *opt, const ParamTable *table, float *params, bool packed, const float *g_base,
                     Buf compute, float decay_mul, int part, int n_layers) {
    int count = 0;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        size_t a, b;
        if (!piece(opt, pi, &a, &b) || (part >= 0 && param_part(pi, n_layers) != part)) continue;
        size_t at = param_at(opt, pi, a, packed);
        bool on_device = !opt->offload;
        opt->entry[count] = i;
        opt->tensors[count++] = (AdamWTensor){
            .p = on_device ? params + at : opt->hp + (a - opt->lo),
            .g = g_base + (a - opt->lo),
            .m = opt->dm + (a - opt->lo),
            .v = opt->dv + (a - opt->lo),
            .compute = on_device && compute.p ? buf_at(compute, at) : (Buf){NULL, NUM_F32},
            .n = b - a,
            .decay_mul = adamw_param_decays(&opt->cfg, pi->kind) ? decay_mul : 1.0f,
        };
    }
    return count;
}

// The work list's `count` items updated by be: in one launch, or with per-tensor factors
// (opt->tensor_scale) in one launch per run of consecutive items of the same factor.
static void launch(AdamW *opt, Backend *be, int count, const AdamWScalars *s) {
    if (!opt->tensor_scale) {
        be->ops->adamw(be, opt->tensors, count, s);
        return;
    }
    for (int a = 0, b; a < count; a = b) {
        const float f = opt->tensor_scale[opt->entry[a]];
        for (b = a + 1; b < count && opt->tensor_scale[opt->entry[b]] == f; b++) {}
        AdamWScalars run = *s;
        run.grad_scale = s->grad_scale * f;
        be->ops->adamw(be, opt->tensors + a, b - a, &run);
    }
}

static int step(AdamW *opt, const ParamTable *table, float *params, bool packed, const float *grads,
                float grad_scale, Buf compute, double lr) {
    float decay_mul;
    const AdamWScalars s = begin_update(opt, grad_scale, lr, &decay_mul);
    if (opt->numel == 0) return SPES_OK;
    // Offloaded, the update reads and writes the host staging instead of backend memory.
    const float *g_base = grads;
    if (opt->offload) {
        SPES_TRY(backend_sync(opt->be));   // the gradients' kernels are done
        SPES_TRY(opt->be->ops->download(opt->be, opt->hg, grads, opt->numel * sizeof(float)));
        SPES_TRY(move_params(opt, table, params, packed, compute, false));
        g_base = opt->hg;
    }
    int count = work_list(opt, table, params, packed, g_base, compute, decay_mul, -1, 0);
    if (!opt->offload) {
        launch(opt, opt->be, count, &s);
        return SPES_OK;
    }
    launch(opt, backend_cpu(), count, &s);
    return move_params(opt, table, params, packed, compute, true);
}

int adamw_step(AdamW *opt, const ParamTable *table, float *params, const float *grads, float grad_scale, Buf compute,
               double lr) {
    return step(opt, table, params, false, grads, grad_scale, compute, lr);
}

int adamw_step_packed(AdamW *opt, const ParamTable *table, float *packed, const float *grads, float grad_scale,
                      double lr) {
    return step(opt, table, packed, true, grads, grad_scale, (Buf){NULL, NUM_F32}, lr);
}

int adamw_step_parts(AdamW *opt, const ParamTable *table, int n_layers, float *params, const float *grads,
                     float grad_scale, Buf compute, double lr, int (*after_part)(void *ctx, int part), void *ctx) {
    if (opt->offload) return spes_fail("adamw_step_parts: the offloaded optimizer updates on the host, in one go");
    float decay_mul;
    const AdamWScalars s = begin_update(opt, grad_scale, lr, &decay_mul);
    for (int part = 0; part < n_layers + 2; part++) {
        int count = work_list(opt, table, params, false, grads, compute, decay_mul, part, n_layers);
        if (count) launch(opt, opt->be, count, &s);
        if (after_part) SPES_TRY(after_part(ctx, part));
    }
    return SPES_OK;
}

int grad_sum_of_squares(Backend *be, const float *grads, size_t n, double *out) {
    *out = 0.0;
    return n == 0 ? SPES_OK : be->ops->grad_sum_squares(be, grads, n, out);
}

double grad_global_norm(Backend *be, const float *grads, size_t n) {
    double sumsq;
    return grad_sum_of_squares(be, grads, n, &sumsq) == SPES_OK ? sqrt(sumsq) : NAN;
}

float grad_clip_coef(double norm, double max_norm) {
    if (max_norm <= 0) return 1.0f;
    // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, multiplied always.
    float coef = (float)max_norm / ((float)norm + 1e-6f);
    return coef >= 1.0f ? 1.0f : coef;
}
