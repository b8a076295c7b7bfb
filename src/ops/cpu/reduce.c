// Reductions whose results the host reads back (losses, router statistics, gradient norm),
// each in a fixed order so the bits do not depend on the thread count.
#include "ops/cpu/cpu_ops.h"

void op_sum(double *out, const float *x, size_t n, bool squares) {
    double s = 0.0;
    if (squares)
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    else
        for (size_t i = 0; i < n; i++) s += x[i];
    *out = s;
}

void op_column_means(double *out, const float *x, int N, int E) {
    for (int e = 0; e < E; e++) {
        double s = 0.0;
        for (int n = 0; n < N; n++) s += x[(size_t)n * E + e];
        out[e] = s / N;
    }
}

// Sum of squares over fixed blocks: each block summed in order by one thread, the block
// sums added in order afterwards. Independent of the thread count by construction.
#define NORM_BLOCK 16384
#define NORM_BLOCKS_PER_ROUND 64
void op_grad_sum_squares(double *out, const float *x, size_t n) {
    double total = 0.0;
    for (size_t start = 0; start < n; start += (size_t)NORM_BLOCK * NORM_BLOCKS_PER_ROUND) {
        double sums[NORM_BLOCKS_PER_ROUND] = {0};
#pragma omp parallel for schedule(static)
        for (int b = 0; b < NORM_BLOCKS_PER_ROUND; b++) {
            size_t lo = start + (size_t)b * NORM_BLOCK;
            size_t hi = lo + NORM_BLOCK < n ? lo + NORM_BLOCK : n;
            double s = 0.0;
            for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
            sums[b] = s;
        }
        for (int b = 0; b < NORM_BLOCKS_PER_ROUND; b++) total += sums[b];
    }
    *out = total;
}
