#include "eval/kv_attention.h"

#include <math.h>
#include <omp.h>

size_t kv_attention_scratch_floats(int max_positions) {
    return (size_t)omp_get_max_threads() * (size_t)max_positions;
}

void kv_attention_forward(float *out, const float *q, const float *k, const float *v, int n, int past, int nh,
                          int nkv, int hd, float *scratch) {
    const int S = past + n, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
    {
        float *scores = scratch + (size_t)omp_get_thread_num() * S;
#pragma omp for collapse(2) schedule(static)
        for (int i = 0; i < n; i++) {
            for (int h = 0; h < nh; h++) {
                const float *qi = q + ((size_t)i * nh + h) * hd;
                const int kvh = h / group, visible = past + i + 1;
                float *oi = out + ((size_t)i * nh + h) * hd;
                float max = -INFINITY;
                for (int j = 0; j < visible; j++) {
                    const float *kj = k + ((size_t)j * nkv + kvh) * hd;
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
                const float inv = 1.0f / sum;
                for (int d = 0; d < hd; d++) oi[d] = 0.0f;
                for (int j = 0; j < visible; j++) {
                    const float *vj = v + ((size_t)j * nkv + kvh) * hd;
                    const float p = scores[j] * inv;
                    for (int d = 0; d < hd; d++) oi[d] += p * vj[d];
                }
            }
        }
    }
}
