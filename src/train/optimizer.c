// AdamW + global-norm clipping. See optimizer.h for the contract.
#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

int adamw_create(AdamW *opt, const ParamTable *table, const AdamWConfig *cfg) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    opt->numel = table->trainable_numel;
    if (opt->numel == 0) return SPES_OK;   // nothing trainable: no state
    opt->m = spes_alloc_aligned(opt->numel * sizeof(float));
    opt->v = spes_alloc_aligned(opt->numel * sizeof(float));
    if (!opt->m || !opt->v) {
        adamw_free(opt);
        return spes_fail_context("AdamW moments for %zu trainable values", table->trainable_numel);
    }
    return SPES_OK;
}

void adamw_free(AdamW *opt) {
    spes_free_aligned(opt->m);
    spes_free_aligned(opt->v);
    opt->m = opt->v = NULL;
    opt->numel = 0;
}

bool adamw_param_decays(const AdamWConfig *cfg, ParamKind kind) {
    if (kind == PARAM_EMBED) return cfg->decay_embeddings;          // nn.Embedding
    if (param_kind_is_norm(kind)) return cfg->decay_norm_and_bias;  // LayerNormBase
    return true;                                                    // nn.Linear
}

// torch's _single_tensor_adamw on one tensor, every scalar rounded to float as the CPU
// kernels do (an orphaned `omp for`: called inside adamw_step's parallel region, so a model
// with thousands of small tensors pays one fork/join per step, not one per tensor):
//   p  *= 1 - lr*wd
//   m   = m + (1-beta1) * (g - m)                   (lerp_)
//   v   = v*beta2 + (1-beta2) * g * g               (mul_, addcmul_)
//   p  += -lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)   (addcdiv_)
static void adamw_update(float *p, const float *g, float *m, float *v, size_t n, float decay_mul, float w1,
                         float beta2, float w2, float bc2_sqrt, float eps, float neg_step_size) {
#pragma omp for schedule(static) nowait
    for (size_t i = 0; i < n; i++) {
        float pi = p[i] * decay_mul;
        float gi = g[i];
        float mi = m[i] + w1 * (gi - m[i]);
        float vi = v[i] * beta2;
        vi = vi + w2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi + neg_step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

void adamw_step(AdamW *opt, const ParamTable *table, float *params, const float *grads, double lr) {
    const AdamWConfig *c = &opt->cfg;
    opt->step++;
    double t = (double)opt->step;
    double bc1 = 1.0 - pow(c->beta1, t);
    double bc2 = 1.0 - pow(c->beta2, t);
    float w1 = (float)(1.0 - c->beta1), beta2 = (float)c->beta2, w2 = (float)(1.0 - c->beta2);
    float bc2_sqrt = (float)sqrt(bc2), eps = (float)c->eps, neg_step_size = (float)(-(lr / bc1));
    float decay_mul = (float)(1.0 - lr * c->weight_decay);
#pragma omp parallel
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        if (!pi->trainable || pi->grad_offset < 0) continue;
        size_t go = (size_t)pi->grad_offset;
        float mul = adamw_param_decays(c, pi->kind) ? decay_mul : 1.0f;
        adamw_update(params + pi->offset, grads + go, opt->m + go, opt->v + go, pi->numel, mul, w1, beta2, w2,
                     bc2_sqrt, eps, neg_step_size);
    }
}

// Sum of squares over fixed blocks: each block summed in order by one thread, the block
// sums added in order afterwards. Independent of the thread count by construction.
#define NORM_BLOCK 16384
#define NORM_BLOCKS_PER_ROUND 64
double grad_global_norm(const float *grads, size_t n) {
    double total = 0.0;
    for (size_t start = 0; start < n; start += (size_t)NORM_BLOCK * NORM_BLOCKS_PER_ROUND) {
        double sums[NORM_BLOCKS_PER_ROUND] = {0};
#pragma omp parallel for schedule(static)
        for (int b = 0; b < NORM_BLOCKS_PER_ROUND; b++) {
            size_t lo = start + (size_t)b * NORM_BLOCK;
            size_t hi = lo + NORM_BLOCK < n ? lo + NORM_BLOCK : n;
            double s = 0.0;
            for (size_t i = lo; i < hi; i++) s += (double)grads[i] * grads[i];
            sums[b] = s;
        }
        for (int b = 0; b < NORM_BLOCKS_PER_ROUND; b++) total += sums[b];
    }
    return sqrt(total);
}

double grad_clip_global_norm(float *grads, size_t n, double max_norm) {
    double norm = grad_global_norm(grads, n);
    if (max_norm <= 0) return norm;
    // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, multiplied always.
    float coef = (float)max_norm / ((float)norm + 1e-6f);
    if (coef >= 1.0f) return norm;   // multiplying by 1 changes nothing
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) grads[i] *= coef;
    return norm;
}
