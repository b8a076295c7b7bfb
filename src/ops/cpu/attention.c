// Causal grouped-query attention, tiled over blocks of queries.
//
// A task handles one block of ATTN_BLOCK queries of one head against the keys it may see
// (causal: keys 0 .. last query of the block). Its scratch is ATTN_BLOCK x T scores, so
// memory per thread is O(block * T), never O(T^2) per head. Scores and the weighted sum
// of values are sgemm calls on strided views of q/k/v (no copies); softmax is exact over
// the strip, and the backward recomputes the probabilities from the saved logsumexp.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "base/alloc.h"
#include "base/error.h"
#include "ops/cpu/vmath.h"
#include "ops/cpu/cpu_ops.h"

#define ATTN_BLOCK 64

// Row i of the strip holds query q0+i against keys [0, kend); keys > q0+i are masked.
// Turns scaled scores s into probabilities; returns logsumexp per row in lse_out.
static void softmax_strip(float *s, float *lse_out, int nq, int kend, int q0) {
    for (int i = 0; i < nq; i++) {
        float *row = s + (size_t)i * kend;
        int valid = q0 + i + 1;
        float mx = vmaxf(row, valid);
        for (int j = 0; j < valid; j++) row[j] = vexpf(row[j] - mx);
        float sum = vsum(row, valid);
        float inv = 1.0f / sum;
        for (int j = 0; j < valid; j++) row[j] *= inv;
        for (int j = valid; j < kend; j++) row[j] = 0.0f;
        lse_out[i] = mx + logf(sum);
    }
}

// Per-thread strips of ATTN_BLOCK x T floats (`per_thread` strips each).
static float *alloc_strips(int T, int per_thread, int *nthreads) {
    *nthreads = omp_get_max_threads();
    size_t n = (size_t)*nthreads * per_thread * ATTN_BLOCK * (size_t)T;
    return spes_malloc(n * sizeof(float));
}

int op_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                         int nh, int nkv, int hd) {
    int nthreads;
    float *strips = alloc_strips(T, 1, &nthreads);
    if (!strips) return spes_fail_context("attention forward scratch");
    const int group = nh / nkv, nblocks = (T + ATTN_BLOCK - 1) / ATTN_BLOCK;
    const int qs = nh * hd, ks = nkv * hd;   // row strides of q/out and k/v
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel num_threads(nthreads)
    {
        float *s = strips + (size_t)omp_get_thread_num() * ATTN_BLOCK * T;
#pragma omp for collapse(3) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < nh; h++)
                for (int qb = nblocks - 1; qb >= 0; qb--) {   // long strips first
                    int q0 = qb * ATTN_BLOCK, nq = T - q0 < ATTN_BLOCK ? T - q0 : ATTN_BLOCK, kend = q0 + nq;
                    const float *qp = q + ((size_t)b * T + q0) * qs + (size_t)h * hd;
                    const float *kp = k + (size_t)b * T * ks + (size_t)(h / group) * hd;
                    const float *vp = v + (size_t)b * T * ks + (size_t)(h / group) * hd;
                    float *op = out + ((size_t)b * T + q0) * qs + (size_t)h * hd;
                    op_gemm(false, true, nq, kend, hd, scale, qp, qs, kp, ks, 0.0f, s, kend);
                    softmax_strip(s, lse + ((size_t)b * nh + h) * T + q0, nq, kend, q0);
                    op_gemm(false, false, nq, hd, kend, 1.0f, s, kend, vp, ks, 0.0f, op, qs);
                }
    }
    free(strips);
    return SPES_OK;
}

// One task per (batch, kv head): it owns dk/dv of that kv head and dq of its query heads,
// so there are no races and the summation order is fixed.
int op_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                          const float *q, const float *k, const float *v, int B, int T, int nh, int nkv, int hd) {
    int nthreads;
    float *strips = alloc_strips(T, 2, &nthreads);
    if (!strips) return spes_fail_context("attention backward scratch");
    const int group = nh / nkv, nblocks = (T + ATTN_BLOCK - 1) / ATTN_BLOCK;
    const int qs = nh * hd, ks = nkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel num_threads(nthreads)
    {
        float *p = strips + (size_t)omp_get_thread_num() * 2 * ATTN_BLOCK * T;
        float *dp = p + (size_t)ATTN_BLOCK * T;
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int g = 0; g < nkv; g++) {
                const float *kp = k + (size_t)b * T * ks + (size_t)g * hd;
                const float *vp = v + (size_t)b * T * ks + (size_t)g * hd;
                float *dkp = dk + (size_t)b * T * ks + (size_t)g * hd;
                float *dvp = dv + (size_t)b * T * ks + (size_t)g * hd;
                for (int t = 0; t < T; t++) {
                    memset(dkp + (size_t)t * ks, 0, (size_t)hd * sizeof(float));
                    memset(dvp + (size_t)t * ks, 0, (size_t)hd * sizeof(float));
                }
                for (int h = g * group; h < (g + 1) * group; h++)
                    for (int qb = 0; qb < nblocks; qb++) {
                        int q0 = qb * ATTN_BLOCK, nq = T - q0 < ATTN_BLOCK ? T - q0 : ATTN_BLOCK, kend = q0 + nq;
                        size_t row0 = ((size_t)b * T + q0) * qs + (size_t)h * hd;
                        const float *qp = q + row0, *op = out + row0, *dop = dout + row0;
                        const float *lp = lse + ((size_t)b * nh + h) * T + q0;
                        // P = exp(scale * Q K^T - lse), causal
                        op_gemm(false, true, nq, kend, hd, scale, qp, qs, kp, ks, 0.0f, p, kend);
                        for (int i = 0; i < nq; i++) {
                            float *row = p + (size_t)i * kend;
                            int valid = q0 + i + 1;
                            float li = lp[i];
                            for (int j = 0; j < valid; j++) row[j] = vexpf(row[j] - li);
                            for (int j = valid; j < kend; j++) row[j] = 0.0f;
                        }
                        // dV += P^T dO ; dP = dO V^T
                        op_gemm(true, false, kend, hd, nq, 1.0f, p, kend, dop, qs, 1.0f, dvp, ks);
                        op_gemm(false, true, nq, kend, hd, 1.0f, dop, qs, vp, ks, 0.0f, dp, kend);
                        // dS = P * (dP - rowsum(dO * O))   (stored in dp)
                        for (int i = 0; i < nq; i++) {
                            const float *o = op + (size_t)i * qs, *d = dop + (size_t)i * qs;
                            float di = vdot(d, o, hd);
                            float *prow = p + (size_t)i * kend, *dprow = dp + (size_t)i * kend;
                            for (int j = 0; j < kend; j++) dprow[j] = prow[j] * (dprow[j] - di);
                        }
                        // dQ = scale * dS K ; dK += scale * dS^T Q
                        op_gemm(false, false, nq, hd, kend, scale, dp, kend, kp, ks, 0.0f, dq + row0, qs);
                        op_gemm(true, false, kend, hd, nq, scale, dp, kend, qp, qs, 1.0f, dkp, ks);
                    }
            }
    }
    free(strips);
    return SPES_OK;
}

// ---- references: full score matrix per head, double accumulation -----------------------

int op_attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                             int nh, int nkv, int hd) {
    const int group = nh / nkv;
    const double scale = 1.0 / sqrt((double)hd);
    double *s = spes_malloc((size_t)T * sizeof(double));
    if (!s) return SPES_ERR;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < T; i++) {
                const float *qi = q + (((size_t)b * T + i) * nh + h) * hd;
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    const float *kj = k + (((size_t)b * T + j) * nkv + h / group) * hd;
                    double acc = 0.0;
                    for (int c = 0; c < hd; c++) acc += (double)qi[c] * kj[c];
                    s[j] = acc * scale;
                    if (s[j] > mx) mx = s[j];
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
                lse[((size_t)b * nh + h) * T + i] = (float)(mx + log(sum));
                float *o = out + (((size_t)b * T + i) * nh + h) * hd;
                for (int c = 0; c < hd; c++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++)
                        acc += exp(s[j] - mx) / sum * v[(((size_t)b * T + j) * nkv + h / group) * hd + c];
                    o[c] = (float)acc;
                }
            }
    free(s);
    return SPES_OK;
}

int op_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *out,
                               const float *lse, const float *q, const float *k, const float *v, int B, int T,
                               int nh, int nkv, int hd) {
    const int group = nh / nkv;
    const double scale = 1.0 / sqrt((double)hd);
    memset(dq, 0, (size_t)B * T * nh * hd * sizeof(float));
    memset(dk, 0, (size_t)B * T * nkv * hd * sizeof(float));
    memset(dv, 0, (size_t)B * T * nkv * hd * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < T; i++) {
                size_t qi = (((size_t)b * T + i) * nh + h) * hd;
                double di = 0.0;
                for (int c = 0; c < hd; c++) di += (double)dout[qi + c] * out[qi + c];
                for (int j = 0; j <= i; j++) {
                    size_t kj = (((size_t)b * T + j) * nkv + h / group) * hd;
                    double sc = 0.0, dpj = 0.0;
                    for (int c = 0; c < hd; c++) {
                        sc += (double)q[qi + c] * k[kj + c];
                        dpj += (double)dout[qi + c] * v[kj + c];
                    }
                    double pj = exp(sc * scale - lse[((size_t)b * nh + h) * T + i]);
                    double ds = pj * (dpj - di) * scale;
                    for (int c = 0; c < hd; c++) {
                        dv[kj + c] += (float)(pj * dout[qi + c]);
                        dq[qi + c] += (float)(ds * k[kj + c]);
                        dk[kj + c] += (float)(ds * q[qi + c]);
                    }
                }
            }
    return SPES_OK;
}
