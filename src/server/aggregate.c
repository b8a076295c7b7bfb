// Aggregation maths (see aggregate.h). Memory-bound: every tensor is processed in chunks of
// CHUNK values that stay in L1, in one pass over the uploads, OpenMP over the chunks of a
// tensor; the result is written straight to its final place (the download payload).
#include "server/aggregate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX__
#include <immintrin.h>
#endif

#include "base/alloc.h"
#include "base/error.h"
#include "server/expert_rotation.h"
#include "sync/expert_owners.h"

#define CHUNK 1024               // values per work item: 4 KiB of fp32, four buffers fit in L1
#define COSINE_BLOCKS 64         // fixed split of the gate vectors, so sums do not depend on threads

int aggregate_config_check(const AggregateConfig *cfg, const ModelSpec *spec) {
    if (cfg->num_peers < 1) return spes_fail("aggregate: total_peers must be >= 1 (got %d)", cfg->num_peers);
    if (cfg->mode == SYNC_MODE_SPES) {
        if (cfg->experts_per_node < 1)
            return spes_fail("aggregate: num_train_experts_per_node must be >= 1 (got %d)", cfg->experts_per_node);
        // Every expert the same number of owners (sync/expert_owners.h): one in the reference's
        // topology, r when total_peers is r times the groups of experts_per_node.
        if (spec && !expert_owners_even(cfg->num_peers, cfg->experts_per_node, spec->num_experts))
            return spes_fail(
                "aggregate: the model has %d experts per layer but total_peers * num_train_experts_per_node = "
                "%d * %d = %d; in spes mode every expert needs the same number of owners (total_peers x "
                "num_train_experts_per_node a multiple of the experts, which num_train_experts_per_node divides)",
                spec->num_experts, cfg->num_peers, cfg->experts_per_node, cfg->num_peers * cfg->experts_per_node);
    }
    if (cfg->rotation_steps < 0)
        return spes_fail("aggregate: expert_rotation_steps must be >= 0 (got %d)", cfg->rotation_steps);
    if (cfg->rotation_steps > 0 && cfg->mode != SYNC_MODE_SPES)
        return spes_fail("aggregate: expert rotation moves experts between their owners; %s mode has none",
                         sync_mode_name(cfg->mode));
    if (cfg->rotation_steps > 0 && spec) SPES_TRY(expert_rotation_check(spec, cfg->experts_per_node));
    if (cfg->merge_topk < 1) return spes_fail("aggregate: merge_topk must be >= 1 (got %d)", cfg->merge_topk);
    if (!(cfg->merge_alpha_start >= 0.0f && cfg->merge_alpha_start <= 1.0f))
        return spes_fail("aggregate: merge_alpha_start must be in [0, 1] (got %g)", (double)cfg->merge_alpha_start);
    return SPES_OK;
}

float aggregate_merge_alpha(const AggregateConfig *cfg, int step) {
    if (cfg->merge_interval <= 0 || cfg->merge_alpha_start <= 0.0f || step % cfg->merge_interval != 0) return 0.0f;
    double progress = cfg->merge_decay_steps > 0 ? fmin((double)step / cfg->merge_decay_steps, 1.0) : 0.0;
    return (float)(cfg->merge_alpha_start * (1.0 - progress));
}

// bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32 (same as bf16_to_f32,
// inlined here because it runs once per uploaded value).
static inline float widen_bf16(const uint8_t *p) {
    uint32_t bits = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Values [start, start+n) of t as fp32: a pointer into t's data when it is aligned F32,
// otherwise converted into tmp[n].
static const float *read_chunk(const StTensor *t, size_t start, size_t n, float *tmp) {
    if (t->dtype == DTYPE_F32) {
        const uint8_t *p = t->data + start * 4;
        if (((uintptr_t)p & 3) == 0) return (const float *)(const void *)p;
        memcpy(tmp, p, n * 4);
        return tmp;
    }
    const uint8_t *p = t->data + start * 2;
    for (size_t i = 0; i < n; i++) tmp[i] = widen_bf16(p + 2 * i);
    return tmp;
}

typedef struct {
    const ModelSpec *spec;
    const AggregateConfig *cfg;
    const StTensor *const *uploads;   // [P][spec->count]
    const bool *present;              // [P] peers in this round; NULL: all
    const StTensor *const *previous;  // [spec->count] latest aggregate, for a missing owner's experts
    int first, num_present;           // lowest present peer, how many are present
    const float *const *premerged;    // [spec->count] pre-merge values already computed (AggregateAcc); NULL
} Inputs;

static bool is_present(const Inputs *in, int p) { return !in->present || in->present[p]; }

// The owners of expert tensor t (spes mode) in this round: peers g, g + G, ... of its group g
// (sync/expert_owners.h), the lowest present one and how many are present.
typedef struct {
    int first, count, stride;
} Owners;

static Owners present_owners(const ModelSpec *spec, const AggregateConfig *cfg, const bool *present, int t) {
    int G = expert_groups(spec->num_experts, cfg->experts_per_node);
    Owners o = {-1, 0, G};
    for (int p = spec->tensors[t].expert / cfg->experts_per_node; p < cfg->num_peers; p += G)
        if (!present || present[p]) {
            if (o.first < 0) o.first = p;
            o.count++;
        }
    return o;
}

// The one tensor expert tensor t's pre-merge value is in spes mode: its only present owner's
// upload, or the latest aggregate when no owner is present; NULL when several owners are
// present (their mean, premerge_chunk).
static const StTensor *expert_source(const Inputs *in, int t) {
    Owners o = present_owners(in->spec, in->cfg, in->present, t);
    if (o.count == 1) return in->uploads[(size_t)o.first * in->spec->count + t];
    return o.count == 0 && in->previous ? in->previous[t] : NULL;
}

// The mean of tensor t's values [start, start+n) over the present peers among first, first +
// stride, ... (count of them; fp32, peers in order: the first copied, the others added, then one
// division) into acc[n]. tmp[n] scratch.
static void mean_chunk(const Inputs *in, int t, int first, int stride, int count, size_t start, size_t n, float *acc,
                       float *tmp) {
    int tensors = in->spec->count, P = in->cfg->num_peers;
    const float *x0 = read_chunk(in->uploads[(size_t)first * tensors + t], start, n, acc);
    if (x0 != acc) memcpy(acc, x0, n * sizeof(float));
    for (int p = first + stride; p < P; p += stride) {
        if (!is_present(in, p)) continue;
        const float *x = read_chunk(in->uploads[(size_t)p * tensors + t], start, n, tmp);
        for (size_t i = 0; i < n; i++) acc[i] += x[i];
    }
    if (count > 1)
        for (size_t i = 0; i < n; i++) acc[i] /= (float)count;
}

// Pre-merge value of tensor t, values [start, start+n), into acc[n]: for an expert in spes mode
// the mean of its present owners' uploads (one owner: its upload; none: the previous value),
// otherwise the mean over the present peers. tmp[n] scratch.
static void premerge_chunk(const Inputs *in, int t, size_t start, size_t n, float *acc, float *tmp) {
    const SpecTensor *st = &in->spec->tensors[t];
    if (in->premerged && in->premerged[t]) {   // the same values, computed peer by peer beforehand
        memcpy(acc, in->premerged[t] + start, n * sizeof(float));
        return;
    }
    if (in->cfg->mode == SYNC_MODE_SPES && st->expert >= 0) {
        Owners o = present_owners(in->spec, in->cfg, in->present, t);
        if (o.count > 0) {
            mean_chunk(in, t, o.first, o.stride, o.count, start, n, acc, tmp);
        } else {
            const float *x = read_chunk(in->previous[t], start, n, acc);
            if (x != acc) memcpy(acc, x, n * sizeof(float));
        }
        return;
    }
    mean_chunk(in, t, in->first, 1, in->num_present, start, n, acc, tmp);
}

// theta_i + alpha * mean_{j in nbr}(theta_j - theta_i) for values [start, start+n) of the
// tensors ti (expert i) and nbr_tensors[k] (its neighbours, same projection), into acc[n].
static void merged_chunk(const Inputs *in, int ti, const int *nbr_tensors, int k, float alpha, size_t start, size_t n,
                         float *acc, float *sum, float *other, float *tmp) {
    premerge_chunk(in, ti, start, n, acc, tmp);
    memset(sum, 0, n * sizeof(float));
    for (int r = 0; r < k; r++) {
        premerge_chunk(in, nbr_tensors[r], start, n, other, tmp);
        for (size_t i = 0; i < n; i++) sum[i] += other[i] - acc[i];
    }
    for (size_t i = 0; i < n; i++) acc[i] += alpha * (sum[i] / (float)k);
}

// Copies n bytes to dst with non-temporal stores where possible: the aggregate is written
// once and not read back by this pass, so skipping the read-for-ownership of every output
// line saves a third of the memory traffic. Callers end with stream_fence().
static void stream_bytes(uint8_t *dst, const uint8_t *src, size_t n) {
#ifdef __AVX__
    size_t head = (32 - ((uintptr_t)dst & 31)) & 31;
    if (head > n) head = n;
    memcpy(dst, src, head);
    size_t i = head;
    for (; i + 32 <= n; i += 32)
        _mm256_stream_si256((__m256i *)(void *)(dst + i), _mm256_loadu_si256((const __m256i *)(const void *)(src + i)));
    memcpy(dst + i, src + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}

static void stream_fence(void) {
#ifdef __AVX__
    _mm_sfence();
#endif
}

static void store_chunk(const float *acc, size_t start, size_t n, uint8_t *out, DType out_dtype) {
    if (out_dtype == DTYPE_F32) {
        stream_bytes(out + start * 4, (const uint8_t *)acc, n * 4);
        return;
    }
    uint8_t *p = out + start * 2;
    for (size_t i = 0; i < n; i++) {
        uint16_t v = f32_to_bf16(acc[i]);
        p[2 * i] = (uint8_t)v;
        p[2 * i + 1] = (uint8_t)(v >> 8);
    }
}

// sum_i a[i]*b[i] in double (products of large finite weights must not overflow).
static double dot(const float *a, const float *b, size_t n) {
    double lane[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++) lane[l] += (double)a[i + l] * (double)b[i + l];
    for (; i < n; i++) lane[0] += (double)a[i] * (double)b[i];
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

static int expert_cosines(const Inputs *inputs, int slot, double *cos) {
    const Inputs in = *inputs;
    const ModelSpec *spec = in.spec;
    int E = spec->num_experts;
    size_t n = spec->tensors[model_spec_expert_tensor(spec, slot, 0, EXPERT_PROJ_GATE)].numel;
    size_t EE = (size_t)E * E;
    double *partial = spes_calloc(COSINE_BLOCKS * EE, sizeof(double));   // [block][E][E], upper triangle
    if (!partial) return SPES_ERR;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *vals = spes_malloc(((size_t)E + 1) * CHUNK * sizeof(float));   // [E][CHUNK] + tmp
        if (!vals) failed = 1;
#pragma omp for schedule(static)
        for (int b = 0; b < COSINE_BLOCKS; b++) {
            if (!vals) continue;
            size_t lo = n * (size_t)b / COSINE_BLOCKS, hi = n * (size_t)(b + 1) / COSINE_BLOCKS;
            double *G = partial + (size_t)b * EE;
            for (size_t start = lo; start < hi; start += CHUNK) {
                size_t len = hi - start < CHUNK ? hi - start : CHUNK;
                for (int e = 0; e < E; e++)
                    premerge_chunk(&in, model_spec_expert_tensor(spec, slot, e, EXPERT_PROJ_GATE), start, len,
                                   vals + (size_t)e * CHUNK, vals + (size_t)E * CHUNK);
                for (int a = 0; a < E; a++)
                    for (int c = a; c < E; c++)
                        G[a * E + c] += dot(vals + (size_t)a * CHUNK, vals + (size_t)c * CHUNK, len);
            }
        }
        free(vals);
    }
    if (failed) {
        free(partial);
        return spes_fail_context("computing expert cosine similarities");
    }
    for (size_t i = 0; i < EE; i++) {
        double s = 0;
        for (int b = 0; b < COSINE_BLOCKS; b++) s += partial[(size_t)b * EE + i];
        cos[i] = s;
    }
    free(partial);
    // Gram -> cosine (0 against a zero vector), mirrored to the lower triangle.
    for (int a = 0; a < E; a++)
        for (int c = a + 1; c < E; c++) {
            double norms = sqrt(cos[a * E + a]) * sqrt(cos[c * E + c]);
            double v = norms > 0 ? cos[a * E + c] / norms : 0.0;
            cos[a * E + c] = cos[c * E + a] = v;
        }
    for (int a = 0; a < E; a++) cos[a * E + a] = 1.0;
    return SPES_OK;
}

int aggregate_expert_cosines(const ModelSpec *spec, const AggregateConfig *cfg, const StTensor *const *uploads,
                             int slot, double *cos) {
    const Inputs in = {spec, cfg, uploads, NULL, NULL, 0, cfg->num_peers, NULL};
    return expert_cosines(&in, slot, cos);
}

void aggregate_expert_neighbours(const double *cos, int num_experts, int k, int *nbr) {
    int E = num_experts;
    for (int i = 0; i < E; i++) {
        // Insertion into a sorted top-k list: higher cosine first; equal cosines keep the
        // lower index first because candidates arrive in index order and ties do not move up.
        int *top = nbr + (size_t)i * k, have = 0;
        for (int j = 0; j < E; j++) {
            if (j == i) continue;
            double v = cos[i * E + j];
            int pos = have;
            while (pos > 0 && cos[i * E + top[pos - 1]] < v) pos--;
            if (pos >= k) continue;
            int last = have < k ? have : k - 1;
            for (int r = last; r > pos; r--) top[r] = top[r - 1];
            top[pos] = j;
            if (have < k) have++;
        }
    }
}

// For merge steps: nbr_tensor[t*k + r] = tensor of the r-th neighbour of expert tensor t
// (same layer, same projection); -1 rows for shared tensors.
static int plan_merge(const Inputs *in, int k, int **out) {
    const ModelSpec *spec = in->spec;
    int E = spec->num_experts;
    int *nbr_tensor = spes_malloc((size_t)spec->count * k * sizeof(int));
    double *cos = spes_malloc((size_t)E * E * sizeof(double));
    int *nbr = spes_malloc((size_t)E * k * sizeof(int));
    int rc = nbr_tensor && cos && nbr ? SPES_OK : SPES_ERR;
    for (size_t i = 0; rc == SPES_OK && i < (size_t)spec->count * k; i++) nbr_tensor[i] = -1;
    for (int s = 0; rc == SPES_OK && s < spec->num_moe_layers; s++) {
        rc = expert_cosines(in, s, cos);
        if (rc != SPES_OK) break;
        aggregate_expert_neighbours(cos, E, k, nbr);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < EXPERT_PROJ_COUNT; p++) {
                int t = model_spec_expert_tensor(spec, s, e, p);
                for (int r = 0; r < k; r++)
                    nbr_tensor[(size_t)t * k + r] = model_spec_expert_tensor(spec, s, nbr[e * k + r], p);
            }
    }
    free(cos);
    free(nbr);
    if (rc != SPES_OK) {
        free(nbr_tensor);
        return SPES_ERR;
    }
    *out = nbr_tensor;
    return SPES_OK;
}

static bool usable(const StTensor *u, const SpecTensor *t) {
    return u && u->numel == t->numel && (u->dtype == DTYPE_F32 || u->dtype == DTYPE_BF16);
}

// An expert none of whose owners is in the round keeps the latest aggregate's value `prev`:
// refused when there is none to keep (both aggregate forms).
static int check_ownerless_expert(const StTensor *prev, const SpecTensor *st, int step) {
    if (usable(prev, st)) return SPES_OK;
    return spes_fail("aggregate: step %d: the owner of '%s' is missing and there is no usable previous value "
                     "(a partial round needs an earlier aggregate)",
                     step, st->name);
}

int aggregate_compute(const ModelSpec *spec, const AggregateConfig *cfg, int step, const StTensor *const *uploads,
                      uint8_t *const *out, DType out_dtype) {
    return aggregate_compute_partial(spec, cfg, step, uploads, NULL, NULL, out, out_dtype);
}

int aggregate_compute_partial(const ModelSpec *spec, const AggregateConfig *cfg, int step,
                              const StTensor *const *uploads, const bool *present, const StTensor *const *previous,
                              uint8_t *const *out, DType out_dtype) {
    SPES_TRY(aggregate_config_check(cfg, spec));
    if (out_dtype != DTYPE_F32 && out_dtype != DTYPE_BF16)
        return spes_fail("aggregate: output dtype %s is not F32 or BF16", dtype_name(out_dtype));
    Inputs in = {spec, cfg, uploads, present, previous, -1, 0, NULL};
    for (int p = 0; p < cfg->num_peers; p++)
        if (is_present(&in, p)) {
            if (in.first < 0) in.first = p;
            in.num_present++;
        }
    if (in.num_present == 0) return spes_fail("aggregate: step %d has no uploads at all", step);
    for (int t = 0; t < spec->count; t++) {
        for (int p = 0; p < cfg->num_peers; p++)
            if (is_present(&in, p) && model_spec_peer_sends(spec, cfg->mode, cfg->experts_per_node, p, t) &&
                !usable(uploads[(size_t)p * spec->count + t], &spec->tensors[t]))
                return spes_fail("aggregate: peer %d's '%s' is missing or not a %zu-value F32/BF16 tensor", p,
                                 spec->tensors[t].name, spec->tensors[t].numel);
        if (cfg->mode == SYNC_MODE_SPES && spec->tensors[t].expert >= 0 && present_owners(spec, cfg, present, t).count == 0)
            SPES_TRY(check_ownerless_expert(previous ? previous[t] : NULL, &spec->tensors[t], step));
    }
    float alpha = aggregate_merge_alpha(cfg, step);
    int k = spec->num_experts - 1 < cfg->merge_topk ? spec->num_experts - 1 : cfg->merge_topk;
    bool merging = alpha > 0.0f && k >= 1;
    int *nbr_tensor = NULL;
    if (merging) SPES_TRY(plan_merge(&in, k, &nbr_tensor));

    // One parallel loop over every chunk of every tensor (chunk g of the model lies in tensor t
    // with first_chunk[t] <= g < first_chunk[t+1]): one barrier per aggregate, and dynamic
    // scheduling keeps both cores busy even when one is shared with other processes.
    size_t *first_chunk = spes_malloc(((size_t)spec->count + 1) * sizeof(size_t));
    if (!first_chunk) {
        free(nbr_tensor);
        return SPES_ERR;
    }
    first_chunk[0] = 0;
    for (int t = 0; t < spec->count; t++)
        first_chunk[t + 1] = first_chunk[t] + (spec->tensors[t].numel + CHUNK - 1) / CHUNK;
    size_t elem = dtype_size(out_dtype);
    long total_chunks = (long)first_chunk[spec->count];
#pragma omp parallel for schedule(dynamic, 64)
    for (long g = 0; g < total_chunks; g++) {
        int lo = 0, hi = spec->count - 1;   // binary search: the tensor holding chunk g
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (first_chunk[mid] <= (size_t)g) lo = mid;
            else hi = mid - 1;
        }
        int t = lo;
        const SpecTensor *st = &spec->tensors[t];
        size_t start = ((size_t)g - first_chunk[t]) * CHUNK, n = st->numel - start < CHUNK ? st->numel - start : CHUNK;
        const int *nbr = merging && st->expert >= 0 ? nbr_tensor + (size_t)t * k : NULL;
        if (!nbr && cfg->mode == SYNC_MODE_SPES && st->expert >= 0) {
            // The common case, an owner's expert kept as uploaded, is a plain copy of its bytes.
            const StTensor *u = expert_source(&in, t);
            if (u && u->dtype == out_dtype) {
                stream_bytes(out[t] + start * elem, u->data + start * elem, n * elem);
                continue;
            }
        }
        float acc[CHUNK], sum[CHUNK], other[CHUNK], tmp[CHUNK];
        if (nbr) merged_chunk(&in, t, nbr, k, alpha, start, n, acc, sum, other, tmp);
        else premerge_chunk(&in, t, start, n, acc, tmp);
        store_chunk(acc, start, n, out[t], out_dtype);
    }
    free(first_chunk);
    stream_fence();
    free(nbr_tensor);
    return expert_rotation_due(cfg->rotation_steps, step) ? expert_rotation_apply(spec, cfg->experts_per_node, out, elem)
                                                          : SPES_OK;
}

// ---- incremental form (aggregate.h: AggregateAcc) ----

struct AggregateAcc {
    const ModelSpec *spec;
    const AggregateConfig *cfg;
    int step;
    bool *present;                  // [P] copy
    int first, num_present, next_peer;
    uint8_t *const *out;
    DType out_dtype;
    float **acc;                    // [count] fp32 pre-merge values: out[t] itself for aligned F32 output
    float *own;                     // the fp32 buffer when acc is not the output (BF16 out)
    const OuterOptConfig *outer;    // aggregate_acc_set_outer; NULL: no outer step
    OuterOptState *outer_state;
    const StTensor *const *theta;
};

static bool acc_is_out(const AggregateAcc *a, int t) { return (const void *)a->acc[t] == (const void *)a->out[t]; }

int aggregate_acc_begin(const ModelSpec *spec, const AggregateConfig *cfg, int step, const bool *present,
                        uint8_t *const *out, DType out_dtype, AggregateAcc **out_acc) {
    *out_acc = NULL;
    SPES_TRY(aggregate_config_check(cfg, spec));
    if (out_dtype != DTYPE_F32 && out_dtype != DTYPE_BF16)
        return spes_fail("aggregate: output dtype %s is not F32 or BF16", dtype_name(out_dtype));
    AggregateAcc *a = spes_calloc(1, sizeof *a);
    if (!a) return SPES_ERR;
    int P = cfg->num_peers;
    a->spec = spec;
    a->cfg = cfg;
    a->step = step;
    a->out = out;
    a->out_dtype = out_dtype;
    a->first = -1;
    a->present = spes_calloc((size_t)P, sizeof(bool));
    a->acc = spes_calloc((size_t)spec->count, sizeof(float *));
    if (!a->present || !a->acc) {
        aggregate_acc_free(a);
        return SPES_ERR;
    }
    for (int p = 0; p < P; p++) {
        a->present[p] = !present || present[p];
        if (a->present[p] && a->first < 0) a->first = p;
        a->num_present += a->present[p];
    }
    size_t own = 0;
    for (int t = 0; t < spec->count; t++)
        if (out_dtype != DTYPE_F32 || ((uintptr_t)out[t] & 3) != 0) own += spec->tensors[t].numel;
    if (own && !(a->own = spes_malloc(own * sizeof(float)))) {
        aggregate_acc_free(a);
        return SPES_ERR;
    }
    // F32 output is accumulated in place; BF16 (or misaligned) output gets an fp32 buffer.
    size_t at = 0;
    for (int t = 0; t < spec->count; t++) {
        if (out_dtype == DTYPE_F32 && ((uintptr_t)out[t] & 3) == 0) {
            a->acc[t] = (float *)(void *)out[t];
        } else {
            a->acc[t] = a->own + at;
            at += spec->tensors[t].numel;
        }
    }
    if (a->num_present == 0) {
        aggregate_acc_free(a);
        return spes_fail("aggregate: step %d has no uploads at all", step);
    }
    *out_acc = a;
    return SPES_OK;
}

// x[0..n) of tensor u as fp32 into dst (+= when add), in CHUNKs as premerge_chunk reads them.
static void acc_tensor(float *dst, const StTensor *u, size_t n, bool add) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long c = 0; c < (long)((n + CHUNK - 1) / CHUNK); c++) {
        size_t start = (size_t)c * CHUNK, len = n - start < CHUNK ? n - start : CHUNK;
        float tmp[CHUNK];
        const float *x = read_chunk(u, start, len, tmp);
        float *d = dst + start;
        if (add)
            for (size_t i = 0; i < len; i++) d[i] += x[i];
        else
            memcpy(d, x, len * sizeof(float));
    }
}

int aggregate_acc_add_tensor(AggregateAcc *a, int peer, int t, const StTensor *u) {
    const ModelSpec *spec = a->spec;
    const AggregateConfig *cfg = a->cfg;
    if (peer != a->next_peer)
        return spes_fail("aggregate: peer %d added while peer %d was expected (peers go in increasing order)", peer,
                         a->next_peer);
    const SpecTensor *st = &spec->tensors[t];
    if (!model_spec_peer_sends(spec, cfg->mode, cfg->experts_per_node, peer, t) || !usable(u, st))
        return spes_fail("aggregate: peer %d's '%s' is not its to send, or not a %zu-value F32/BF16 tensor", peer,
                         st->name, st->numel);
    // Peers come in increasing order: the running sums are the ones premerge_chunk forms (an
    // expert's over its present owners).
    bool expert = cfg->mode == SYNC_MODE_SPES && st->expert >= 0;
    int first = expert ? present_owners(spec, cfg, a->present, t).first : a->first;
    acc_tensor(a->acc[t], u, st->numel, peer != first);
    return SPES_OK;
}

int aggregate_acc_begin_peer(AggregateAcc *a, int peer) {
    if (peer < a->next_peer || peer >= a->cfg->num_peers || !a->present[peer])
        return spes_fail("aggregate: peer %d is out of order or not in the round", peer);
    for (int p = a->next_peer; p < peer; p++)
        if (a->present[p]) return spes_fail("aggregate: peer %d added before peer %d", peer, p);
    a->next_peer = peer;
    return SPES_OK;
}

int aggregate_acc_end_peer(AggregateAcc *a, int peer) {
    if (peer != a->next_peer) return spes_fail("aggregate: peer %d ended while peer %d was open", peer, a->next_peer);
    a->next_peer = peer + 1;
    return SPES_OK;
}

int aggregate_acc_add(AggregateAcc *a, int peer, const StTensor *const *row) {
    const ModelSpec *spec = a->spec;
    SPES_TRY(aggregate_acc_begin_peer(a, peer));
    for (int t = 0; t < spec->count; t++)
        if (model_spec_peer_sends(spec, a->cfg->mode, a->cfg->experts_per_node, peer, t))
            SPES_TRY(aggregate_acc_add_tensor(a, peer, t, row[t]));
    return aggregate_acc_end_peer(a, peer);
}

// Writes acc (fp32) of tensor t into the output where it is not the output itself.
static void acc_store(const AggregateAcc *a, int t) {
    if (acc_is_out(a, t)) return;
    size_t n = a->spec->tensors[t].numel;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long c = 0; c < (long)((n + CHUNK - 1) / CHUNK); c++) {
        size_t start = (size_t)c * CHUNK, len = n - start < CHUNK ? n - start : CHUNK;
        store_chunk(a->acc[t] + start, start, len, a->out[t], a->out_dtype);
    }
}

void aggregate_acc_set_outer(AggregateAcc *a, const OuterOptConfig *cfg, OuterOptState *state,
                             const StTensor *const *theta) {
    a->outer = cfg;
    a->outer_state = state;
    a->theta = theta;
}

// The outer step on every covered slot, in slot order, in place on the fp32 means.
static int acc_outer_step(AggregateAcc *a) {
    const OuterOptState *s = a->outer_state;
    size_t largest = 0;
    for (int t = 0; t < s->num_tensors; t++)
        if ((size_t)s->numel[t] > largest) largest = (size_t)s->numel[t];
    float *theta = spes_malloc((largest ? largest : 1) * sizeof(float));
    if (!theta) return SPES_ERR;
    int rc = SPES_OK;
    for (int t = 0; rc == SPES_OK && t < s->num_tensors && t < a->spec->count; t++) {
        if (s->numel[t] == 0) continue;
        const StTensor *prev = a->theta ? a->theta[t] : NULL;
        if (prev && !usable(prev, &a->spec->tensors[t])) {
            rc = spes_fail("aggregate: step %d: the previous aggregate's '%s' is not usable for the outer step", a->step,
                           a->spec->tensors[t].name);
            break;
        }
        if (prev) acc_tensor(theta, prev, a->spec->tensors[t].numel, false);
        rc = outer_opt_step(a->outer, a->outer_state, t, prev ? theta : NULL, a->acc[t], a->acc[t]);
    }
    free(theta);
    return rc;
}

// aggregate_acc_finish up to the rotation: the values of every tensor written out.
static int acc_finish_values(AggregateAcc *a, const StTensor *const *previous) {
    const ModelSpec *spec = a->spec;
    const AggregateConfig *cfg = a->cfg;
    int rc = SPES_OK;
    for (int p = a->next_peer; p < cfg->num_peers; p++)
        if (a->present[p]) return spes_fail("aggregate: step %d: peer %d's upload was never added", a->step, p);
    Inputs in = {spec, cfg, NULL, a->present, previous, a->first, a->num_present, NULL};
    for (int t = 0; t < spec->count; t++) {
        const SpecTensor *st = &spec->tensors[t];
        size_t n = st->numel;
        int count = a->num_present;
        if (cfg->mode == SYNC_MODE_SPES && st->expert >= 0) {
            count = present_owners(spec, cfg, a->present, t).count;
            if (count == 0) {
                const StTensor *prev = previous ? previous[t] : NULL;
                SPES_TRY(check_ownerless_expert(prev, st, a->step));
                acc_tensor(a->acc[t], prev, n, false);
            }
        }
        if (count > 1) {
            float *x = a->acc[t], d = (float)count;
#pragma omp parallel for schedule(static) if (n > 65536)
            for (long i = 0; i < (long)n; i++) x[i] /= d;
        }
    }
    // The outer step runs on the plain means (pre-merge values), before anything is rounded.
    if (a->outer && acc_outer_step(a) != SPES_OK) return SPES_ERR;
    float alpha = aggregate_merge_alpha(cfg, a->step);
    int E = spec->num_experts, k = E - 1 < cfg->merge_topk ? E - 1 : cfg->merge_topk;
    bool merging = alpha > 0.0f && k >= 1;
    for (int t = 0; t < spec->count; t++)
        if (!merging || spec->tensors[t].expert < 0) acc_store(a, t);
    if (!merging) {
        stream_fence();
        return SPES_OK;
    }
    // Merging, one MoE layer at a time: its experts' pre-merge values are copied aside (the
    // output may be the accumulator itself), then merged_chunk runs on them exactly as
    // aggregate_compute does. Scratch: one layer's experts.
    size_t layer_values = 0;
    for (int e = 0; e < E; e++)
        for (int p = 0; p < EXPERT_PROJ_COUNT; p++) layer_values += spec->tensors[model_spec_expert_tensor(spec, 0, e, p)].numel;
    float *scratch = spes_malloc((layer_values ? layer_values : 1) * sizeof(float));
    const float **premerged = spes_calloc((size_t)spec->count, sizeof *premerged);
    double *cos = spes_malloc((size_t)E * E * sizeof(double));
    int *nbr = spes_malloc((size_t)E * k * sizeof(int));
    int *nbr_tensors = spes_malloc((size_t)k * sizeof(int));
    if (!scratch || !premerged || !cos || !nbr || !nbr_tensors) rc = SPES_ERR;
    in.premerged = premerged;
    for (int slot = 0; rc == SPES_OK && slot < spec->num_moe_layers; slot++) {
        size_t at = 0, need = 0;
        for (int e = 0; e < E; e++)
            for (int p = 0; p < EXPERT_PROJ_COUNT; p++) need += spec->tensors[model_spec_expert_tensor(spec, slot, e, p)].numel;
        if (need > layer_values) {   // layers may differ in expert size
            float *grown = spes_realloc(scratch, need * sizeof(float));
            if (!grown) {
                rc = SPES_ERR;
                break;
            }
            scratch = grown;
            layer_values = need;
        }
        for (int t = 0; t < spec->count; t++) premerged[t] = NULL;
        for (int e = 0; e < E; e++)
            for (int p = 0; p < EXPERT_PROJ_COUNT; p++) {
                int t = model_spec_expert_tensor(spec, slot, e, p);
                memcpy(scratch + at, a->acc[t], spec->tensors[t].numel * sizeof(float));
                premerged[t] = scratch + at;
                at += spec->tensors[t].numel;
            }
        rc = expert_cosines(&in, slot, cos);
        if (rc != SPES_OK) break;
        aggregate_expert_neighbours(cos, E, k, nbr);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < EXPERT_PROJ_COUNT; p++) {
                int t = model_spec_expert_tensor(spec, slot, e, p);
                for (int r = 0; r < k; r++) nbr_tensors[r] = model_spec_expert_tensor(spec, slot, nbr[e * k + r], p);
                size_t n = spec->tensors[t].numel;
#pragma omp parallel for schedule(dynamic, 64)
                for (long c = 0; c < (long)((n + CHUNK - 1) / CHUNK); c++) {
                    size_t start = (size_t)c * CHUNK, len = n - start < CHUNK ? n - start : CHUNK;
                    float acc[CHUNK], sum[CHUNK], other[CHUNK], tmp[CHUNK];
                    merged_chunk(&in, t, nbr_tensors, k, alpha, start, len, acc, sum, other, tmp);
                    store_chunk(acc, start, len, a->out[t], a->out_dtype);
                }
            }
    }
    stream_fence();
    free(scratch);
    free(premerged);
    free(cos);
    free(nbr);
    free(nbr_tensors);
    return rc;
}

int aggregate_acc_finish(AggregateAcc *a, const StTensor *const *previous) {
    SPES_TRY(acc_finish_values(a, previous));
    if (!expert_rotation_due(a->cfg->rotation_steps, a->step)) return SPES_OK;
    return expert_rotation_apply(a->spec, a->cfg->experts_per_node, a->out, dtype_size(a->out_dtype));
}

void aggregate_acc_free(AggregateAcc *a) {
    if (!a) return;
    free(a->present);
    free(a->acc);
    free(a->own);
    free(a);
}
