// Dropless experts on the cpu: each expert's SwiGLU MLP as GEMMs on its block of rows.
//
// Experts are independent (own rows, own weights, own gradients), so with enough of them
// (E >= 2 x threads) threads take whole experts, largest first, each running its GEMMs
// single-threaded: one fork/join per layer and direction instead of several per expert,
// and bits that do not depend on which thread ran what. With few experts the GEMMs run
// one after another, each multi-threaded inside OpenBLAS.
#include <omp.h>

#include "ops/cpu/cpu_ops.h"

// order[E]: experts by descending row count (ties: lower index first), for dynamic
// scheduling that starts the long jobs first. Insertion sort: E is small.
static void experts_largest_first(const int32_t *offsets, int E, int *order) {
    for (int i = 0; i < E; i++) {
        int e = i, j = i;
        int32_t count = offsets[e + 1] - offsets[e];
        while (j > 0 && offsets[order[j - 1] + 1] - offsets[order[j - 1]] < count) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = e;
    }
}

static bool parallel_over_experts(int E) { return E >= 2 * omp_get_max_threads(); }

static float *f32(Buf b) { return (float *)b.p; }

// Runs fn(a, e, first row, rows) for every expert with rows, largest first: in parallel over
// experts when there are enough of them, else one after another.
typedef void (*ExpertFn)(const ExpertsArgs *a, int e, int r0, int cnt);
static void for_each_expert(const ExpertsArgs *a, ExpertFn fn) {
    const int E = a->E;
    int order[E];
    experts_largest_first(a->offsets, E, order);
#pragma omp parallel for schedule(dynamic, 1) if (parallel_over_experts(E))
    for (int i = 0; i < E; i++) {
        int e = order[i], r0 = a->offsets[e], cnt = a->offsets[e + 1] - r0;
        if (cnt > 0) fn(a, e, r0, cnt);
    }
}

static void expert_forward(const ExpertsArgs *a, int e, int r0, int cnt) {
    const int H = a->H, I = a->hidden;
    float *gu = f32(a->gu) + (size_t)r0 * 2 * I, *act = f32(a->act) + (size_t)r0 * I;
    op_linear_forward(gu, f32(a->xe) + (size_t)r0 * H, f32(a->gate_up[e]), cnt, H, 2 * I, false);
    op_swiglu_forward(act, gu, cnt, I);
    op_linear_forward(f32(a->y) + (size_t)r0 * H, act, f32(a->down[e]), cnt, I, H, false);
}

void op_experts_forward(const ExpertsArgs *a) { for_each_expert(a, expert_forward); }

// dW[gate; up] += dgu^T xe for whichever of the two is trainable (one GEMM when both are,
// their gradients then being adjacent).
static void gate_up_grad(const ExpertsArgs *a, int e, const float *dgu, const float *xe, int cnt) {
    const int H = a->H, I = a->hidden;
    if (a->dgate_up && a->dgate_up[e]) {
        op_linear_backward_weight(a->dgate_up[e], dgu, xe, cnt, H, 2 * I);
        return;
    }
    float *dg = a->dgate ? a->dgate[e] : NULL, *du = a->dup ? a->dup[e] : NULL;
    if (dg) op_gemm(true, false, I, H, cnt, 1.0f, dgu, 2 * I, xe, H, 1.0f, dg, H);
    if (du) op_gemm(true, false, I, H, cnt, 1.0f, dgu + I, 2 * I, xe, H, 1.0f, du, H);
}

// Frozen experts (NULL gradients) still pass dX back, but skip their dW GEMMs.
static void expert_backward(const ExpertsArgs *a, int e, int r0, int cnt) {
    const int H = a->H, I = a->hidden;
    float *dy = f32(a->dy) + (size_t)r0 * H, *da = f32(a->da) + (size_t)r0 * I;
    float *gu = f32(a->gu) + (size_t)r0 * 2 * I;
    const float *xe = f32(a->xe) + (size_t)r0 * H;
    op_linear_backward_input(da, dy, f32(a->down[e]), cnt, I, H, false);
    float *ddown = a->ddown ? a->ddown[e] : NULL;
    if (ddown) op_linear_backward_weight(ddown, dy, f32(a->act) + (size_t)r0 * I, cnt, I, H);
    op_swiglu_backward(gu, da, gu, cnt, I);   // gu now holds dL/d(gate|up)
    gate_up_grad(a, e, gu, xe, cnt);
    op_linear_backward_input(dy, gu, f32(a->gate_up[e]), cnt, H, 2 * I, false);   // dy now holds dxe
}

void op_experts_backward(const ExpertsArgs *a) { for_each_expert(a, expert_backward); }
