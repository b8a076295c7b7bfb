// OLMo's adaptive gradient clipping: see clip_adaptive.h.
#include "train/clip_adaptive.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "train/checkpoint.h"

int clip_adaptive_create(ClipAdaptive *c, Backend *be, const ParamTable *table) {
    memset(c, 0, sizeof *c);
    c->be = be;
    c->count = table->count;
    const size_t n = (size_t)table->count + 1;
    int rc = backend_alloc(be, n * sizeof(double), (void **)&c->dsums);
    if (rc == SPES_OK && be->host_memory) c->sums = c->dsums;
    else if (rc == SPES_OK && !(c->sums = spes_calloc(n, sizeof *c->sums))) rc = SPES_ERR;
    if (rc == SPES_OK && !(c->scale = spes_calloc(n, sizeof *c->scale))) rc = SPES_ERR;
    if (rc != SPES_OK) {
        clip_adaptive_free(c);
        return spes_fail_context("adaptive clipping (max_grad_norm_ratio): per-tensor norms of %d tensors",
                                 table->count);
    }
    for (int i = 0; i < c->count; i++) c->scale[i] = 1.0f;
    return SPES_OK;
}

void clip_adaptive_free(ClipAdaptive *c) {
    if (c->be && c->sums != c->dsums) free(c->sums);
    if (c->be) backend_free(c->be, c->dsums);
    free(c->scale);
    memset(c, 0, sizeof *c);
}

int clip_adaptive_sums(ClipAdaptive *c, const ParamTable *table, const float *grads, size_t lo, size_t hi) {
    Backend *be = c->be;
    be->ops->zero(be, c->dsums, (size_t)c->count * sizeof(double));
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        if (!pi->trainable || pi->grad_offset < 0) continue;
        // the piece [a, b) of the tensor's values inside [lo, hi)
        size_t go = (size_t)pi->grad_offset;
        size_t a = go > lo ? go : lo, b = go + pi->numel < hi ? go + pi->numel : hi;
        if (a < b) be->ops->sum(be, c->dsums + i, grads + (a - lo), b - a, true);
    }
    if (be->host_memory) return SPES_OK;
    int rc = be->ops->download(be, c->sums, c->dsums, (size_t)c->count * sizeof(double));
    return rc == SPES_OK ? SPES_OK : spes_fail_context("adaptive clipping: reading the per-tensor gradient norms back");
}

double clip_adaptive_total(const ClipAdaptive *c) {
    double total = 0.0;
    for (int i = 0; i < c->count; i++) total += c->sums[i];
    return total;
}

float clip_adaptive_coef(float norm, float ratio, float weight, int64_t global_step, float *avg, bool *has_avg) {
    // OLMo: grad_norm_exp_avg = grad_norm.clone() when the state has none, stored in the state
    // only when global_step > 1 (so step 1's average is used for its clipping, then dropped).
    float a = *has_avg ? *avg : norm;
    bool keep = *has_avg || global_step > 1;
    float max_allowed = ratio * a;
    float coef = max_allowed / (norm + 1e-6f);
    if (coef > 1.0f) coef = 1.0f;   // torch.clamp(max=1.0): a NaN stays NaN
    // lerp_(end, weight) with torch's formula for a scalar weight
    float end = norm * coef;
    a = weight < 0.5f ? a + weight * (end - a) : end - (end - a) * (1.0f - weight);
    if (keep) {
        *avg = a;
        *has_avg = true;
    }
    return coef;
}

void clip_adaptive_apply(ClipAdaptive *c, AdamW *opt, const ParamTable *table, double ratio, double unscale,
                         int64_t global_step) {
    const double beta = fmax(opt->cfg.beta1, opt->cfg.beta2);
    const float weight = (float)(1.0 - beta);
    c->clipped = c->eligible = 0;
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        c->scale[i] = 1.0f;
        if (!pi->trainable || pi->grad_offset < 0) continue;
        // torch.linalg.vector_norm(..., dtype=float32): the norm in float
        float norm = (float)(sqrt(c->sums[i]) * unscale);
        float coef = clip_adaptive_coef(norm, (float)ratio, weight, global_step, &opt->norm_avg[i], &opt->norm_avg_set[i]);
        c->scale[i] = coef;
        c->eligible++;
        if (coef < 1.0f) c->clipped++;
    }
}

int clip_adaptive_dump_grads(const char *dir, const ParamTable *table, Backend *be, const float *grads, size_t n,
                             int64_t step) {
    char name[64];
    snprintf(name, sizeof name, "grad.%lld.safetensors", (long long)step);
    char *path = path_join(dir, name);
    float *host = be->host_memory ? (float *)grads : spes_malloc((n ? n : 1) * sizeof(float));
    int rc = path && host ? SPES_OK : SPES_ERR;
    if (rc == SPES_OK && !be->host_memory && n) rc = be->ops->download(be, host, grads, n * sizeof(float));
    const float *bufs[1] = {host};
    const char *prefix[1] = {""};
    if (rc == SPES_OK) rc = checkpoint_write_table(path, table, true, 1, bufs, prefix);
    if (!be->host_memory) free(host);
    free(path);
    return rc == SPES_OK ? SPES_OK : spes_fail_context("writing the gradient of step %lld into %s", (long long)step, dir);
}
