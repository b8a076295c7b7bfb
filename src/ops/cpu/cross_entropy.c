// Cross-entropy and LM z-loss over rows of logits, with the gradient written in place.
#include <math.h>

#include "model/model_config.h"
#include "ops/cpu/vmath.h"
#include "ops/cpu/cpu_ops.h"

void op_cross_entropy_rows(float *logits, int ld, float *ce, float *lse, const int32_t *targets, int R, int V,
                           float ce_scale, float z_scale, bool grad) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        float *x = logits + (size_t)r * ld;
        if (targets[r] == IGNORE_INDEX) {
            ce[r] = lse[r] = 0.0f;
            if (grad)
                for (int v = 0; v < V; v++) x[v] = 0.0f;
            continue;
        }
        float mx = vmaxf(x, V);
        float l = mx + logf(vsum_exp(x, V, mx));
        lse[r] = l;
        ce[r] = l - x[targets[r]];
        if (grad) {
            // d/dx [ce_scale*(lse - x_t) + z_scale*lse^2] = (ce_scale + 2*z_scale*lse)*softmax - ce_scale*onehot
            float a = ce_scale + 2.0f * z_scale * l;
            for (int v = 0; v < V; v++) x[v] = a * vexpf(x[v] - l);
            x[targets[r]] -= ce_scale;
        }
    }
}
