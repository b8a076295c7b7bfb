// AdamW on the cpu: torch's _single_tensor_adamw, every scalar rounded to float as torch's
// CPU kernels do. One parallel region for all tensors (an orphaned `omp for` per tensor), so
// a model with thousands of small tensors pays one fork/join per step, not one per tensor.
#include <math.h>

#include "ops/cpu/cpu_ops.h"

//   g  *= grad_scale                                (clip_grad_norm_'s mul_, not stored)
//   p  *= 1 - lr*wd
//   m   = m + (1-beta1) * (g - m)                   (lerp_)
//   v   = v*beta2 + (1-beta2) * g * g               (mul_, addcmul_)
//   p  += -lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)   (addcdiv_)
static void adamw_update(const AdamWTensor *t, const AdamWScalars *s) {
    float *p = t->p, *m = t->m, *v = t->v;
    const float *g = t->g;
    // Locals: the scalars could alias p/m/v as far as the compiler knows.
    const float decay_mul = t->decay_mul, w1 = s->w1, beta2 = s->beta2, w2 = s->w2, bc2_sqrt = s->bc2_sqrt;
    const float eps = s->eps, neg_step_size = s->neg_step_size, grad_scale = s->grad_scale;
#pragma omp for schedule(static) nowait
    for (size_t i = 0; i < t->n; i++) {
        float pi = p[i] * decay_mul;
        float gi = g[i] * grad_scale;
        float mi = m[i] + w1 * (gi - m[i]);
        float vi = v[i] * beta2;
        vi = vi + w2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi + neg_step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

void op_adamw(const AdamWTensor *t, int count, const AdamWScalars *s) {
#pragma omp parallel
    for (int i = 0; i < count; i++) adamw_update(&t[i], s);
}
