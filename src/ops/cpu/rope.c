// Rotary position embeddings, HF rotate-half convention (not interleaved).
#include <math.h>

#include "ops/cpu/cpu_ops.h"

// HF: inv_freq = 1 / theta^(arange(0, hd, 2) / hd) in fp32, angle = t * inv_freq in fp32.
void op_rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta) {
    const int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)hd));
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_t[(size_t)t * half + i] = (float)cos((double)angle);
            sin_t[(size_t)t * half + i] = (float)sin((double)angle);
        }
    }
}

// sign = +1: forward rotation by +angle; sign = -1: the transpose (rotation by -angle).
static void rope_apply(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd, float sign) {
    const int half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
            for (int h = 0; h < nh; h++) {
                float *v = x + (((size_t)b * T + t) * nh + h) * hd;
                for (int i = 0; i < half; i++) {
                    float x1 = v[i], x2 = v[i + half], si = sign * s[i];
                    v[i] = x1 * c[i] - x2 * si;
                    v[i + half] = x2 * c[i] + x1 * si;
                }
            }
        }
}

void op_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd) {
    rope_apply(x, cos_t, sin_t, B, T, nh, hd, 1.0f);
}

void op_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd) {
    rope_apply(dx, cos_t, sin_t, B, T, nh, hd, -1.0f);
}
