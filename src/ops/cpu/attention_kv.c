// Causal attention of Tq new queries against Tk >= Tq cached keys/values (a KV cache): the
// attention the incremental forward needs. One scores row per thread; same maths as
// op_attention_forward (scores scaled by 1/sqrt(hd), exact softmax with the max subtracted).
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "ops/cpu/cpu_ops.h"

int op_attention_forward_kv(float *out, float *lse, const float *q, const float *k, const float *v, int B, int Tq,
                            int Tk, int nh, int nkv, int hd) {
    const int past = Tk - Tq, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    const int nthreads = omp_get_max_threads();
    float *scratch = spes_malloc((size_t)nthreads * (size_t)Tk * sizeof(float));
    if (!scratch) return spes_fail_context("attention (KV cache) scratch for %d positions", Tk);
#pragma omp parallel num_threads(nthreads)
    {
        float *scores = scratch + (size_t)omp_get_thread_num() * Tk;
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                for (int h = 0; h < nh; h++) {
                    const float *qi = q + (((size_t)b * Tq + i) * nh + h) * hd;
                    const float *kb = k + (size_t)b * Tk * nkv * hd, *vb = v + (size_t)b * Tk * nkv * hd;
                    const int kvh = h / group, visible = past + i + 1;
                    float *oi = out + (((size_t)b * Tq + i) * nh + h) * hd;
                    float max = -INFINITY;
                    for (int j = 0; j < visible; j++) {
                        const float *kj = kb + ((size_t)j * nkv + kvh) * hd;
                        float dot = 0.0f;
                        for (int d = 0; d < hd; d++) dot += qi[d] * kj[d];
                        scores[j] = dot * scale;
                        if (scores[j] > max) max = scores[j];
                    }
                    float sum = 0.0f;
                    for (int j = 0; j < visible; j++) {
                        scores[j] = expf(scores[j] - max);
                        sum += scores[j];
                    }
                    lse[((size_t)b * nh + h) * Tq + i] = max + logf(sum);
                    const float inv = 1.0f / sum;
                    for (int d = 0; d < hd; d++) oi[d] = 0.0f;
                    for (int j = 0; j < visible; j++) {
                        const float *vj = vb + ((size_t)j * nkv + kvh) * hd;
                        const float p = scores[j] * inv;
                        for (int d = 0; d < hd; d++) oi[d] += p * vj[d];
                    }
                }
            }
    }
    free(scratch);
    return SPES_OK;
}
