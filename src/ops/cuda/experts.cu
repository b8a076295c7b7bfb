// Every expert's SwiGLU MLP on its block of rows (dropless MoE), forward and backward, as
// grouped GEMMs plus one SwiGLU kernel over all NK rows. Same maths as
// src/ops/cpu/experts.c; shapes per expert e with rows [r0, r0+cnt) (offsets on the HOST):
//   forward   gu[cnt,2I] = xe[cnt,H] @ gate_up[e]^T        gate_up[e] [2I,H]
//             act[cnt,I] = silu(gu[:, :I]) * gu[:, I:]       (all rows at once)
//             y[cnt,H]   = act @ down[e]^T                   down[e] [H,I]
//   backward  da         = dy @ down[e]                      (dy still dL/dy)
//             ddown[e]  += dy^T @ act                        (trainable experts, fp32)
//             gu         = dL/d(gate|up) from da, gu          (in place, all rows at once)
//             dgate_up[e] += gu^T @ xe   (or dgate / dup separately: the two column halves)
//             dy         = gu @ gate_up[e]                   (dy becomes dL/dxe)
// Stream order makes the in-place steps safe: dy is last read by the ddown GEMM, enqueued
// before the GEMM that overwrites it.
//
// The GEMMs of the experts run one per expert through cuBLASLt (cuda_gemm_varying: plans per
// size bucket, as the row counts change every step). cuBLAS's grouped GEMM
// (cublasGemmGroupedBatchedEx, one call for all experts) is the alternative, with
// SPES_CUDA_GROUPED=1 in the environment: on an H200 at the 1B model's shape (16 experts of
// 2048 rows, H 768, I 2048; test_cuda_core's timing case) the per-expert loop ran the forward
// in 0.68 ms against the grouped call's 1.13, the backward in 1.41 against 1.81. The grouped
// call takes, with CUBLAS_COMPUTE_32F, only A = B = C in {bf16, f16, f32} (cuBLAS docs: no
// bf16/f16 operands with an f32 C), so when chosen it serves the forward and dX GEMMs (and
// every GEMM in fp32 mode), the weight-gradient GEMMs (bf16/f16 into fp32 gradients, beta =
// 1) staying in the loop; it also needs 16-byte aligned matrices with 16-byte-multiple row
// strides (H and I multiples of 8), else the loop runs. Same results up to the algorithm
// cuBLAS picks; both paths are tested. Empty experts are skipped; frozen experts (NULL
// gradient pointers) get no dW GEMMs but still pass dX.
// The pointer arrays the grouped call reads from device memory are uploaded into scratch
// (CUDA_SCRATCH_EXPERTS) with cudaMemcpyAsync from a host array: for pageable memory the
// driver stages the bytes before returning, so the host array may go out of scope at once.
#include "ops/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/pointwise_common.cuh"

// ---- SwiGLU -----------------------------------------------------------------------------------
// a[r, i] = silu(g) * u, g = gu[r, i], u = gu[r, I + i]; the cpu's float expression order:
// g * sigmoid(g) * u with sigmoid(g) = 1 / (1 + exp(-g)). Typed kernels over W consecutive
// columns of a row (16-byte accesses when I is a multiple of PW_VEC and the buffers aligned;
// one element otherwise): the same values either way, one index division per W elements.
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

template <int W, typename Ta, typename Tg>
__global__ void swiglu_forward_kernel(Ta *a, const Tg *gu, size_t rows, int I) {
    const size_t per_row = (size_t)(I / W), n = rows * per_row, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += stride) {
        const size_t r = idx / per_row, i = (idx % per_row) * W;
        float g[W], u[W], y[W];
        load_vec<W>(gu + r * 2 * (size_t)I + i, g);
        load_vec<W>(gu + r * 2 * (size_t)I + I + i, u);
#pragma unroll
        for (int j = 0; j < W; j++) y[j] = g[j] * sigmoid_f(g[j]) * u[j];
        store_vec<W>(a + r * (size_t)I + i, y);
    }
}

// dgu (may alias gu: each thread reads its g, u before writing them) from da:
//   du = da * g * s;  dg = da * u * s * (1 + g * (1 - s)),  s = sigmoid(g).
template <int W, typename Td, typename Ta, typename Tg>
__global__ void swiglu_backward_kernel(Td *dgu, const Ta *da, const Tg *gu, size_t rows, int I) {
    const size_t per_row = (size_t)(I / W), n = rows * per_row, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += stride) {
        const size_t r = idx / per_row, i = (idx % per_row) * W;
        const size_t gi_at = r * 2 * (size_t)I + i, ui_at = gi_at + (size_t)I;
        float g[W], u[W], d[W], dg[W], du[W];
        load_vec<W>(gu + gi_at, g);
        load_vec<W>(gu + ui_at, u);
        load_vec<W>(da + r * (size_t)I + i, d);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float s = sigmoid_f(g[j]);
            du[j] = d[j] * g[j] * s;
            dg[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        }
        store_vec<W>(dgu + ui_at, du);
        store_vec<W>(dgu + gi_at, dg);
    }
}

static void swiglu_forward(Backend *be, Buf act, Buf gu, size_t rows, int I) {
    const bool vec = pw_vec_ok({act.p, gu.p}, {I});
    const int W = vec ? PW_VEC : 1;
    const unsigned grid = pw_grid(be, rows * (size_t)(I / W), PW_THREADS);
    cudaStream_t st = cuda_state(be)->stream;
    with_num_type(act.t, [&](auto ta) {
        with_num_type(gu.t, [&](auto tg) {
            with_vec_width(vec, [&](auto w) {
                using Ta = decltype(ta);
                using Tg = decltype(tg);
                swiglu_forward_kernel<decltype(w)::value>
                    <<<grid, PW_THREADS, 0, st>>>((Ta *)act.p, (const Tg *)gu.p, rows, I);
            });
        });
    });
    CUDA_LAUNCHED(be);
}

// In place: gu (gate | up) becomes its gradient.
static void swiglu_backward(Backend *be, Buf gu, Buf da, size_t rows, int I) {
    const bool vec = pw_vec_ok({gu.p, da.p}, {I});
    const int W = vec ? PW_VEC : 1;
    const unsigned grid = pw_grid(be, rows * (size_t)(I / W), PW_THREADS);
    cudaStream_t st = cuda_state(be)->stream;
    with_num_type(gu.t, [&](auto tg) {
        with_num_type(da.t, [&](auto ta) {
            with_vec_width(vec, [&](auto w) {
                using Tg = decltype(tg);
                using Ta = decltype(ta);
                swiglu_backward_kernel<decltype(w)::value>
                    <<<grid, PW_THREADS, 0, st>>>((Tg *)gu.p, (const Ta *)da.p, (const Tg *)gu.p, rows, I);
            });
        });
    });
    CUDA_LAUNCHED(be);
}

// ---- a batch of per-expert GEMMs --------------------------------------------------------------
// Row-major, as cuda_gemm: C = alpha * op(A) @ op(B) + beta * C, one problem per expert.
struct Problem {
    int M, N, K;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    void *C;
    int ldc;
};

static bool grouped_enabled(void) {
    const char *v = getenv("SPES_CUDA_GROUPED");
    return v && strcmp(v, "1") == 0;
}

// Side streams for the per-expert loop: the GEMMs run round-robin on N (at most
// CUDA_SIDE_STREAMS) side streams, SPES_CUDA_EXPERT_STREAMS=N; 1 keeps them all on the main
// stream. The results are the same bits either way: each GEMM writes its own output with the
// plan its sizes pick, whichever stream runs it. 4 by default: on an H200 the 1B step ran 1.02-1.03x
// faster with 2, 4 or 8 than with 1 (docs/gpu_perf_notes.md, change 5).
#define EXPERT_STREAMS_DEFAULT 4
static int expert_streams(void) {
    const char *v = getenv("SPES_CUDA_EXPERT_STREAMS");
    int n = v && *v ? atoi(v) : EXPERT_STREAMS_DEFAULT;
    return n < 1 ? 1 : n > CUDA_SIDE_STREAMS ? CUDA_SIDE_STREAMS : n;
}

// Every operand 16-byte aligned with rows a multiple of 16 bytes (es: A's and B's element
// size, ec: C's), as cuBLAS's grouped GEMM and cuBLASLt's fast kernels want them.
static bool rows_aligned16(const std::vector<Problem> &probs, size_t es, size_t ec) {
    for (const Problem &p : probs)
        if (!cuda_aligned16(p.A) || !cuda_aligned16(p.B) || !cuda_aligned16(p.C) || (p.lda * es) % 16 || (p.ldb * es) % 16 ||
            (p.ldc * ec) % 16)
            return false;
    return true;
}

// Every operand as cuBLASLt takes it directly (aligned rows, one operand type, C written in
// one rounding), so gemm.cu neither converts nor repacks through its scratch slot, which
// GEMMs on two streams would share.
static bool all_direct(NumType at, NumType bt, NumType ct, float beta, const std::vector<Problem> &probs) {
    return at == bt && cuda_gemm_c_direct(ct, at, beta) && rows_aligned16(probs, num_type_size(at), num_type_size(ct));
}

static void gemm_many(Backend *be, bool ta, bool tb, float alpha, float beta, NumType at, NumType bt, NumType ct,
                      const std::vector<Problem> &probs) {
    if (probs.empty() || cuda_failed(be)) return;
    const bool grouped = grouped_enabled() && at == bt && bt == ct &&
                         rows_aligned16(probs, num_type_size(at), num_type_size(at));
    if (!grouped) {
        // One GEMM per expert, round-robin over the side streams when they may run side by side.
        int want = expert_streams(), sides = 0;
        if (want > 1 && probs.size() > 1 && all_direct(at, bt, ct, beta, probs))
            sides = cuda_side_fork(be, want < (int)probs.size() ? want : (int)probs.size());
        for (size_t i = 0; i < probs.size(); i++) {
            const Problem &p = probs[i];
            if (sides > 1) cuda_side_select(be, (int)(i % (size_t)sides));
            cuda_gemm_varying(be, ta, tb, p.M, p.N, p.K, alpha, buf_of((void *)p.A, at), p.lda, buf_of((void *)p.B, bt),
                              p.ldb, beta, buf_of(p.C, ct), p.ldc);
        }
        if (sides > 0) cuda_side_join(be, sides);
        return;
    }
    // Column-major view (see gemm.cu): cuBLAS's A = our B, B = our A, m = N, n = M.
    CudaState *st = cuda_state(be);
    const int count = (int)probs.size();
    std::vector<cublasOperation_t> trans_a(count, tb ? CUBLAS_OP_T : CUBLAS_OP_N),
        trans_b(count, ta ? CUBLAS_OP_T : CUBLAS_OP_N);
    std::vector<int> m(count), n(count), k(count), lda(count), ldb(count), ldc(count), group_size(count, 1);
    std::vector<float> alphas(count, alpha), betas(count, beta);
    std::vector<const void *> ptrs(3 * (size_t)count);   // [A ptrs | B ptrs | C ptrs] in cuBLAS's naming
    for (int i = 0; i < count; i++) {
        const Problem &p = probs[i];
        m[i] = p.N;
        n[i] = p.M;
        k[i] = p.K;
        lda[i] = p.ldb;
        ldb[i] = p.lda;
        ldc[i] = p.ldc;
        ptrs[i] = p.B;
        ptrs[count + i] = p.A;
        ptrs[2 * (size_t)count + i] = p.C;
    }
    size_t bytes = ptrs.size() * sizeof(void *);
    void **dev = (void **)cuda_scratch_slot(be, CUDA_SCRATCH_EXPERTS, bytes);
    if (!dev) return;
    CUDA_CHECK(be, cudaMemcpyAsync(dev, ptrs.data(), bytes, cudaMemcpyHostToDevice, st->stream));
    CUBLAS_CHECK(be, cublasGemmGroupedBatchedEx(st->blas, trans_a.data(), trans_b.data(), m.data(), n.data(),
                                                k.data(), alphas.data(), (const void *const *)dev, cuda_data_type(bt),
                                                lda.data(), (const void *const *)(dev + count), cuda_data_type(at),
                                                ldb.data(), betas.data(), (void *const *)(dev + 2 * (size_t)count),
                                                cuda_data_type(ct), ldc.data(), count, group_size.data(),
                                                CUBLAS_COMPUTE_32F));
}

// The row pointer of row r of a [*, width] buffer.
static const void *row_ptr(Buf b, int32_t r, int width) { return buf_at(b, (size_t)r * width).p; }

static bool check_args(Backend *be, const ExpertsArgs *a) {
    for (int e = 0; e < a->E; e++) {
        int32_t lo = a->offsets[e], hi = a->offsets[e + 1];
        bool types_ok = a->gate_up[e].t == a->gate_up[0].t && a->down[e].t == a->down[0].t;
        if (lo < 0 || hi < lo || !types_ok) {
            char detail[128];
            snprintf(detail, sizeof detail, "expert %d: rows [%d, %d) or weight types inconsistent", e, (int)lo,
                     (int)hi);
            cuda_record_failure(be, "cuda_experts", detail, __FILE__, __LINE__);
            return false;
        }
    }
    return true;
}

extern "C" void cuda_experts_forward(Backend *be, const ExpertsArgs *a) {
    const int E = a->E, H = a->H, I = a->hidden;
    if (E <= 0 || !check_args(be, a)) return;
    const int32_t *off = a->offsets;
    std::vector<Problem> up, down;
    for (int e = 0; e < E; e++) {
        int r0 = off[e], cnt = off[e + 1] - r0;
        if (cnt == 0) continue;
        // gu[cnt, 2I] = xe[cnt, H] @ gate_up[e]^T
        up.push_back({cnt, 2 * I, H, row_ptr(a->xe, r0, H), H, a->gate_up[e].p, H, (void *)row_ptr(a->gu, r0, 2 * I),
                      2 * I});
        // y[cnt, H] = act[cnt, I] @ down[e]^T
        down.push_back({cnt, H, I, row_ptr(a->act, r0, I), I, a->down[e].p, I, (void *)row_ptr(a->y, r0, H), H});
    }
    if (up.empty()) return;
    gemm_many(be, false, true, 1.0f, 0.0f, a->xe.t, a->gate_up[0].t, a->gu.t, up);
    size_t rows = (size_t)(off[E] - off[0]);
    swiglu_forward(be, buf_at(a->act, (size_t)off[0] * I), buf_at(a->gu, (size_t)off[0] * 2 * I), rows, I);
    gemm_many(be, false, true, 1.0f, 0.0f, a->act.t, a->down[0].t, a->y.t, down);
}

extern "C" void cuda_experts_backward(Backend *be, const ExpertsArgs *a) {
    const int E = a->E, H = a->H, I = a->hidden;
    if (E <= 0 || !check_args(be, a)) return;
    const int32_t *off = a->offsets;
    std::vector<Problem> da, ddown, dgate_up, dgate, dup, dx;
    for (int e = 0; e < E; e++) {
        int r0 = off[e], cnt = off[e + 1] - r0;
        if (cnt == 0) continue;
        const void *dy = row_ptr(a->dy, r0, H), *act = row_ptr(a->act, r0, I), *xe = row_ptr(a->xe, r0, H);
        void *gu = (void *)row_ptr(a->gu, r0, 2 * I);
        // da[cnt, I] = dy[cnt, H] @ down[e][H, I]
        da.push_back({cnt, I, H, dy, H, a->down[e].p, I, (void *)row_ptr(a->da, r0, I), I});
        // ddown[e][H, I] += dy^T @ act
        if (a->ddown && a->ddown[e]) ddown.push_back({H, I, cnt, dy, H, act, I, a->ddown[e], I});
        // d[gate; up][2I, H] += dgu^T @ xe, or each half on its own
        if (a->dgate_up && a->dgate_up[e]) {
            dgate_up.push_back({2 * I, H, cnt, gu, 2 * I, xe, H, a->dgate_up[e], H});
        } else {
            if (a->dgate && a->dgate[e]) dgate.push_back({I, H, cnt, gu, 2 * I, xe, H, a->dgate[e], H});
            if (a->dup && a->dup[e])
                dup.push_back({I, H, cnt, buf_at(buf_of(gu, a->gu.t), (size_t)I).p, 2 * I, xe, H, a->dup[e], H});
        }
        // dxe[cnt, H] = dgu[cnt, 2I] @ gate_up[e][2I, H], into dy
        dx.push_back({cnt, H, 2 * I, gu, 2 * I, a->gate_up[e].p, H, (void *)dy, H});
    }
    if (dx.empty()) return;
    gemm_many(be, false, false, 1.0f, 0.0f, a->dy.t, a->down[0].t, a->da.t, da);
    gemm_many(be, true, false, 1.0f, 1.0f, a->dy.t, a->act.t, NUM_F32, ddown);
    size_t rows = (size_t)(off[E] - off[0]);
    swiglu_backward(be, buf_at(a->gu, (size_t)off[0] * 2 * I), buf_at(a->da, (size_t)off[0] * I), rows, I);
    gemm_many(be, true, false, 1.0f, 1.0f, a->gu.t, a->xe.t, NUM_F32, dgate_up);
    gemm_many(be, true, false, 1.0f, 1.0f, a->gu.t, a->xe.t, NUM_F32, dgate);
    gemm_many(be, true, false, 1.0f, 1.0f, a->gu.t, a->xe.t, NUM_F32, dup);
    gemm_many(be, false, false, 1.0f, 0.0f, a->gu.t, a->gate_up[0].t, a->dy.t, dx);
}
