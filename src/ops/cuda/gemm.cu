// GEMM on the CUDA backend through cuBLASLt, fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32,
// no reduced-precision reductions), fp32 alpha/beta.
//
// Row-major to column-major. cuBLASLt is column-major; a row-major matrix X[r, c] with row
// stride ld, read column-major, is X^T [c, r] with leading dimension ld. So the row-major
// product C[M,N] = op(A)[M,K] op(B)[K,N] is computed as the column-major product
//   C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M]
// with cuBLASLt's "A" = our B and "B" = our A, each keeping its own transpose flag: B stored
// untransposed ([K,N] row-major) reads as B^T = op(B)^T, so OP_N; stored transposed ([N,K]
// row-major, op(B) = B^T) it reads as B^T while op(B)^T = B, so OP_T. Likewise for A. In
// cuBLASLt terms m = N, n = M, k = K, and the layouts describe the stored matrices:
//   lt.A = B: rows (N if !trans_b else K), cols (K if !trans_b else N), ld = ldb
//   lt.B = A: rows (K if !trans_a else M), cols (M if !trans_a else K), ld = lda
//   lt.C = lt.D = C: rows N, cols M, ld = ldc
//
// Types cuBLASLt takes with COMPUTE_32F: A = B in {bf16, f16} with C in {same, f32}; A = B =
// C = f32. Other combinations are made into those here, through scratch (CUDA_SCRATCH_GEMM):
//   - A and B of different types: the fp32 one is converted to the other's type (backend.h).
//   - C of a third type (f32 operands with a bf16 C, ...): the product goes to an fp32
//     scratch copy of C (converted in when beta != 0) and is converted back.
//   - a bf16/f16 C with beta != 0, likewise: cuBLASLt (13.0, on an H200) rounded alpha*AB to
//     C's type before adding beta*C, two roundings (0.73 ulp off in test_cuda_core's 64^3
//     case); through the fp32 copy the sum is rounded once. The model never asks for this
//     (its accumulating GEMMs write fp32), so no hot path pays for the copy.
//   - no algorithm for the operands' alignment or strides (cuBLASLt is told the actual pointer
//     alignment): every operand is repacked into aligned, padded scratch and the call retried.
// beta == 0 never reads C (cuBLASLt does not read C then, so NaN in C is harmless).
// gemm_residual (D = alpha*AB + R): cuBLASLt reads its C and writes its D through separate
// pointers, so R is passed as C and D as D (one layout for both) when C goes direct and R starts
// at D's alignment (pointer_alignment): then the plan is the one the in-place GEMM on D gets, the
// same algorithm and so the same bits (backend.h's contract: R copied into D, then gemm). Every
// other path, an R aligned unlike D included, copies R into D first and runs the in-place GEMM.
// K == 0: C = beta * R, R first copied into C when apart (beta == 0: zeros), as the cpu kernel.
//
// Plans (matmul descriptor, layouts, the heuristic's algorithm) are cached per shape, types
// and pointer alignment: the heuristic query costs tens of microseconds, more than a small
// GEMM. The cache is bounded (cleared when full). GEMMs whose sizes change from call to call
// (the experts', with data-dependent row counts: cuda_gemm_varying) are keyed by their sizes
// rounded up to buckets (gemm_bucket): one heuristic query per bucket, then the bucket's
// algorithm runs every size in it, the layouts set to the actual sizes before each call. On
// an H200 the exact-shape queries had cost ~20 ms of host time per step of the 1B model (the
// per-expert dW GEMMs of 12 layers; docs/gpu_perf_notes.md). An algorithm cuBLASLt refuses
// for the actual sizes falls back to an exact-shape plan for that call.
// Reproducibility: the same plan runs for the same shape, and every cuBLASLt reduction scheme
// for split-K is ordered (in-place with sequencing counters, or a separate reduction pass),
// so the same inputs give the same bits on the same GPU and library version.
#include "ops/cuda/cuda_common.cuh"

#include <stdio.h>
#include <string.h>

#include <unordered_map>

#include "ops/cuda/cuda_ops.h"

// ---- plan cache -------------------------------------------------------------------------------
struct GemmKey {
    int ta, tb, m, n, k, lda, ldb, ldc;
    int bucketed;                   // a bucket's plan (its layouts resized at every call), never an exact one
    int type_a, type_b, type_c;     // NumType of cuBLASLt's A (our B), B (our A), C
    int align_a, align_b, align_c, align_d;   // pointer alignment in bytes (1..256)
    bool operator==(const GemmKey &o) const { return memcmp(this, &o, sizeof *this) == 0; }
};
struct GemmKeyHash {
    size_t operator()(const GemmKey &k) const {
        const unsigned char *p = (const unsigned char *)&k;
        size_t h = 1469598103934665603ull;   // FNV-1a
        for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 1099511628211ull;
        return h;
    }
};
struct GemmPlan {
    bool ok;                        // false: cuBLASLt has no algorithm for this key (cached too)
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};
struct CudaGemmCache {
    std::unordered_map<GemmKey, GemmPlan, GemmKeyHash> plans;
};
static const size_t GEMM_CACHE_MAX = 4096;

static void plan_destroy(GemmPlan *p) {
    if (p->c) (void)cublasLtMatrixLayoutDestroy(p->c);
    if (p->b) (void)cublasLtMatrixLayoutDestroy(p->b);
    if (p->a) (void)cublasLtMatrixLayoutDestroy(p->a);
    if (p->op) (void)cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

void cuda_gemm_cache_free(CudaGemmCache *cache) {
    if (!cache) return;
    for (auto &kv : cache->plans) plan_destroy(&kv.second);
    delete cache;
}

// Largest power of two (<= 256) dividing the address.
static int pointer_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int align = 1;
    while (align < 256 && (a & (uintptr_t)(2 * align - 1)) == 0) align *= 2;
    return align;
}

// The stored (column-major) shapes of cuBLASLt's A [m x k] and B [k x n] before their
// transposes: rows are the contiguous dimension, at most the leading dimension.
struct LayoutDims {
    uint64_t a_rows, a_cols, b_rows, b_cols;
};
static LayoutDims layout_dims(int ta, int tb, int m, int n, int k) {
    return {(uint64_t)(ta ? k : m), (uint64_t)(ta ? m : k), (uint64_t)(tb ? n : k), (uint64_t)(tb ? k : n)};
}

// Builds the plan for `key` (descriptors + heuristic). false: a failure was recorded; true
// with plan->ok false: no algorithm for these shapes/alignments (not recorded: the caller
// repacks the operands and tries again).
static bool plan_build(Backend *be, const GemmKey &key, GemmPlan *plan) {
    CudaState *st = cuda_state(be);
    memset(plan, 0, sizeof *plan);
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasOperation_t ta = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t ws = st->workspace_bytes;
    uint32_t aa = (uint32_t)key.align_a, ab = (uint32_t)key.align_b, ac = (uint32_t)key.align_c,
             ad = (uint32_t)key.align_d;
    const LayoutDims d = layout_dims(key.ta, key.tb, key.m, key.n, key.k);
    cublasStatus_t s;
#define LT(call)                                                                                      \
    do {                                                                                              \
        s = (call);                                                                                   \
        if (s != CUBLAS_STATUS_SUCCESS) {                                                             \
            cuda_record_failure(be, #call, cublasGetStatusString(s), __FILE__, __LINE__);              \
            goto fail;                                                                                \
        }                                                                                             \
    } while (0)
    LT(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatrixLayoutCreate(&plan->a, cuda_data_type((NumType)key.type_a), d.a_rows, d.a_cols, key.lda));
    LT(cublasLtMatrixLayoutCreate(&plan->b, cuda_data_type((NumType)key.type_b), d.b_rows, d.b_cols, key.ldb));
    LT(cublasLtMatrixLayoutCreate(&plan->c, cuda_data_type((NumType)key.type_c), key.m, key.n, key.ldc));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
    if (key.type_c != NUM_F32) {
        // fp32 accumulation (the contract): a split-K algorithm may add its partial sums in
        // fp32 only, not in the bf16/fp16 output (the INPLACE and OUTPUT_TYPE schemes).
        uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                sizeof reductions));
    }
#undef LT
    // NOT_SUPPORTED is cuBLASLt's "no algorithm for this configuration" (as is 0 found): the
    // caller repacks; any other failure is recorded.
    s = cublasLtMatmulAlgoGetHeuristic(st->lt, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result,
                                       &found);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
        cuda_record_failure(be, "cublasLtMatmulAlgoGetHeuristic", cublasGetStatusString(s), __FILE__, __LINE__);
        goto fail;
    }
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
        (void)cublasLtMatmulPreferenceDestroy(pref);
        plan_destroy(plan);   // ok stays false
        return true;
    }
    plan->algo = result.algo;
    plan->ok = true;
    (void)cublasLtMatmulPreferenceDestroy(pref);
    return true;
fail:
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    plan_destroy(plan);
    return false;
}

static const GemmPlan *plan_get(Backend *be, const GemmKey &key) {
    CudaState *st = cuda_state(be);
    if (!st->gemm_cache) st->gemm_cache = new CudaGemmCache();
    CudaGemmCache *cache = st->gemm_cache;
    auto it = cache->plans.find(key);
    if (it != cache->plans.end()) return &it->second;
    if (cache->plans.size() >= GEMM_CACHE_MAX) {
        for (auto &kv : cache->plans) plan_destroy(&kv.second);
        cache->plans.clear();
    }
    GemmPlan plan;
    if (!plan_build(be, key, &plan)) return NULL;
    return &cache->plans.emplace(key, plan).first->second;
}

// ---- the cuBLASLt call (types already ones cuBLASLt takes) ------------------------------------
enum { LT_DONE, LT_NO_ALGO, LT_FAILED };

// A size rounded up to its bucket: 1..64 to a power of two, then to multiples of 64 up to
// 1024, of 256 up to 8192, of 2048 beyond (every bucket within 25% of its smallest member
// past 64, so the bucket's algorithm suits its sizes).
static int gemm_bucket(int x) {
    if (x <= 64) {
        int b = 1;
        while (b < x) b *= 2;
        return b;
    }
    int step = x <= 1024 ? 64 : x <= 8192 ? 256 : 2048;
    return (int)(((long long)x + step - 1) / step * step);
}

// Sets a plan's layouts to the actual sizes (a bucketed plan was built for its bucket's).
static bool plan_resize(Backend *be, const GemmPlan *plan, const GemmKey &key, int m, int n, int k) {
    const LayoutDims d = layout_dims(key.ta, key.tb, m, n, k);
    const struct {
        cublasLtMatrixLayout_t l;
        uint64_t rows, cols;
    } set[3] = {{plan->a, d.a_rows, d.a_cols}, {plan->b, d.b_rows, d.b_cols}, {plan->c, (uint64_t)m, (uint64_t)n}};
    for (int i = 0; i < 3; i++) {
        cublasStatus_t s = cublasLtMatrixLayoutSetAttribute(set[i].l, CUBLASLT_MATRIX_LAYOUT_ROWS, &set[i].rows,
                                                            sizeof set[i].rows);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatrixLayoutSetAttribute(set[i].l, CUBLASLT_MATRIX_LAYOUT_COLS, &set[i].cols,
                                                 sizeof set[i].cols);
        if (s != CUBLAS_STATUS_SUCCESS) {
            cuda_record_failure(be, "cublasLtMatrixLayoutSetAttribute", cublasGetStatusString(s), __FILE__, __LINE__);
            return false;
        }
    }
    return true;
}

// Row-major arguments, as cuda_gemm's; A and B of one type; C of that type or f32. The sum
// is read from C_in and written to C (C_in == C: in place; C_in is read only when beta != 0).
// With `bucketed`, the plan is the one of the sizes' bucket (the header says why).
static int lt_matmul(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void *A,
                     int lda, const void *B, int ldb, NumType op_type, float beta, const void *C_in, void *C,
                     NumType c_type, int ldc, bool bucketed) {
    CudaState *st = cuda_state(be);
    GemmKey key;
    memset(&key, 0, sizeof key);   // padding too: the key is hashed and compared bytewise
    key.ta = trans_b;
    key.tb = trans_a;
    key.m = bucketed ? gemm_bucket(N) : N;
    key.n = bucketed ? gemm_bucket(M) : M;
    key.k = bucketed ? gemm_bucket(K) : K;
    key.bucketed = bucketed;
    if (bucketed) {   // a bucket may not outgrow a leading dimension (the stored rows of a layout)
        const LayoutDims d = layout_dims(key.ta, key.tb, key.m, key.n, key.k);
        if (d.a_rows > (uint64_t)ldb || d.b_rows > (uint64_t)lda || (uint64_t)key.m > (uint64_t)ldc)
            return lt_matmul(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, op_type, beta, C_in, C, c_type,
                             ldc, false);
    }
    key.lda = ldb;
    key.ldb = lda;
    key.ldc = ldc;
    key.type_a = op_type;
    key.type_b = op_type;
    key.type_c = c_type;
    key.align_a = pointer_alignment(B);
    key.align_b = pointer_alignment(A);
    key.align_c = pointer_alignment(C_in);
    key.align_d = pointer_alignment(C);
    const GemmPlan *plan = plan_get(be, key);
    if (!plan) return LT_FAILED;
    if (!plan->ok) {   // no algorithm for the bucket's sizes: perhaps for the actual ones
        return bucketed ? lt_matmul(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, op_type, beta, C_in, C,
                                    c_type, ldc, false)
                        : LT_NO_ALGO;
    }
    if (bucketed && !plan_resize(be, plan, key, N, M, K)) return LT_FAILED;
    cublasStatus_t s = cublasLtMatmul(st->lt, plan->op, &alpha, B, plan->a, A, plan->b, &beta, C_in, plan->c, C,
                                      plan->c, &plan->algo, st->workspace, st->workspace_bytes, st->stream);
    if (bucketed && s == CUBLAS_STATUS_NOT_SUPPORTED)   // the bucket's algorithm refuses these sizes
        return lt_matmul(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, op_type, beta, C_in, C, c_type, ldc,
                         false);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cuda_record_failure(be, "cublasLtMatmul", cublasGetStatusString(s), __FILE__, __LINE__);
        return LT_FAILED;
    }
    return LT_DONE;
}

// ---- helper kernels ---------------------------------------------------------------------------
// dst[r, c] (dense, ld = cols) = src[r, c] (row stride src_ld), converting types.
__global__ void convert_2d_kernel(void *dst, NumType dt, int dst_ld, const void *src, NumType stype, int src_ld,
                                  int rows, int cols) {
    size_t n = (size_t)rows * cols, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        size_t r = i / (size_t)cols, c = i % (size_t)cols;
        store_num(dst, dt, r * (size_t)dst_ld + c, load_num(src, stype, r * (size_t)src_ld + c));
    }
}

static void convert_2d(Backend *be, void *dst, NumType dt, int dst_ld, const void *src, NumType stype, int src_ld,
                       int rows, int cols) {
    size_t n = (size_t)rows * cols;
    if (n == 0) return;
    unsigned blocks = cuda_blocks(n, 256);
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    convert_2d_kernel<<<blocks, 256, 0, cuda_state(be)->stream>>>(dst, dt, dst_ld, src, stype, src_ld, rows, cols);
    CUDA_LAUNCHED(be);
}

// C[M, N] (row stride ldc) = beta * C; beta == 0 writes zeros (NaN in C ignored).
__global__ void scale_matrix_kernel(void *C, NumType t, int ldc, int M, int N, float beta) {
    size_t n = (size_t)M * N, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        size_t idx = (i / (size_t)N) * (size_t)ldc + i % (size_t)N;
        store_num(C, t, idx, beta == 0.0f ? 0.0f : beta * load_num(C, t, idx));
    }
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The slow path: operands that need converting (or every operand, when cuBLASLt had no
// algorithm for their alignment) are copied into 256-byte aligned dense scratch with row
// strides padded to 16 bytes; C likewise when it needs another type (an f32 copy) or repacking.
static int padded_ld(int cols, size_t es) {
    size_t per16 = 16 / es;
    return (int)(((size_t)cols + per16 - 1) / per16 * per16);
}

// cuBLASLt writes C itself when C is f32, or of the operands' type and not read (beta == 0);
// otherwise C goes through an fp32 copy (the header says why).
bool cuda_gemm_c_direct(NumType c_type, NumType op_type, float beta) {
    return c_type == NUM_F32 || (c_type == op_type && beta == 0.0f);
}

static void gemm_repacked(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda,
                          bool pack_a, Buf B, int ldb, bool pack_b, NumType op_type, float beta, Buf C, int ldc,
                          bool pack_c) {
    int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    size_t es = num_type_size(op_type);
    // C's copy: f32 unless C already has a type cuBLASLt writes in one rounding (then it keeps it).
    NumType c_type = cuda_gemm_c_direct(C.t, op_type, beta) ? C.t : NUM_F32;
    int lda2 = padded_ld(a_cols, es), ldb2 = padded_ld(b_cols, es), ldc2 = padded_ld(N, num_type_size(c_type));
    size_t a_bytes = pack_a ? align_up((size_t)a_rows * lda2 * es, 256) : 0;
    size_t b_bytes = pack_b ? align_up((size_t)b_rows * ldb2 * es, 256) : 0;
    size_t c_bytes = pack_c ? align_up((size_t)M * ldc2 * num_type_size(c_type), 256) : 0;
    char *scratch = (char *)cuda_scratch_slot(be, CUDA_SCRATCH_GEMM, a_bytes + b_bytes + c_bytes);
    if (!scratch) return;
    // What cuBLASLt reads: the packed copy (in scratch, padded strides) or the operand as given.
    const void *a_ptr = A.p, *b_ptr = B.p;
    void *c_ptr = C.p;
    int a_ld = lda, b_ld = ldb, c_ld = ldc;
    if (pack_a) {
        convert_2d(be, scratch, op_type, lda2, A.p, A.t, lda, a_rows, a_cols);
        a_ptr = scratch;
        a_ld = lda2;
    }
    if (pack_b) {
        convert_2d(be, scratch + a_bytes, op_type, ldb2, B.p, B.t, ldb, b_rows, b_cols);
        b_ptr = scratch + a_bytes;
        b_ld = ldb2;
    }
    if (pack_c) {
        c_ptr = scratch + a_bytes + b_bytes;
        c_ld = ldc2;
        if (beta != 0.0f) convert_2d(be, c_ptr, c_type, ldc2, C.p, C.t, ldc, M, N);
    }
    int r = lt_matmul(be, trans_a, trans_b, M, N, K, alpha, a_ptr, a_ld, b_ptr, b_ld, op_type, beta, c_ptr, c_ptr,
                      c_type, c_ld, false);
    if (r == LT_NO_ALGO && !(pack_a && pack_b && pack_c)) {   // a mixed-type call packed one operand only
        gemm_repacked(be, trans_a, trans_b, M, N, K, alpha, A, lda, true, B, ldb, true, op_type, beta, C, ldc, true);
        return;
    }
    if (r == LT_NO_ALGO) {
        char detail[200];
        snprintf(detail, sizeof detail, "no cuBLASLt algorithm for M=%d N=%d K=%d ta=%d tb=%d %s operands -> %s, "
                 "even repacked", M, N, K, trans_a, trans_b, num_type_name(op_type), num_type_name(c_type));
        cuda_record_failure(be, "cublasLtMatmulAlgoGetHeuristic", detail, __FILE__, __LINE__);
        return;
    }
    if (r == LT_DONE && pack_c) convert_2d(be, C.p, C.t, ldc, c_ptr, c_type, ldc2, M, N);
}

// ---- the op -----------------------------------------------------------------------------------
// C = alpha*AB + beta*R, R of C's type and stride: R == C (in place, every GEMM but
// gemm_residual's) or its own buffer, which goes to cuBLASLt as its C beside C as its D when it
// can, and is copied into C first otherwise.
static void gemm(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda, Buf B,
                 int ldb, float beta, Buf R, Buf C, int ldc, bool bucketed) {
    if (M <= 0 || N <= 0) return;
    // Row-major stored shapes: A is [M,K] ([K,M] when trans_a), B is [K,N] ([N,K] when trans_b).
    int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if (K < 0 || ldc < N || (K > 0 && (lda < a_cols || ldb < b_cols)) || R.t != C.t) {
        char detail[160];
        snprintf(detail, sizeof detail, "bad shape M=%d N=%d K=%d lda=%d ldb=%d ldc=%d ta=%d tb=%d (or addend type)",
                 M, N, K, lda, ldb, ldc, trans_a, trans_b);
        cuda_record_failure(be, "cuda_gemm", detail, __FILE__, __LINE__);
        return;
    }
    CudaState *st = cuda_state(be);
    bool apart = R.p != C.p && beta != 0.0f;   // R still to be read from its own buffer
    auto take_r = [&] {                         // R copied into C: the in-place GEMM from here on
        if (apart) convert_2d(be, C.p, C.t, ldc, R.p, R.t, ldc, M, N);
        apart = false;
    };
    if (K == 0) {   // an empty sum: C = beta * R
        take_r();
        unsigned blocks = cuda_blocks((size_t)M * N, 256);
        if (blocks > 65535u * 8u) blocks = 65535u * 8u;
        scale_matrix_kernel<<<blocks, 256, 0, st->stream>>>(C.p, C.t, ldc, M, N, beta);
        CUDA_LAUNCHED(be);
        return;
    }

    // Operand types: make A and B the same type.
    NumType op_type = A.t;
    bool conv_a = false, conv_b = false;
    if (A.t != B.t) {
        if (A.t == NUM_F32) op_type = B.t, conv_a = true;
        else op_type = A.t, conv_b = true;   // B is f32, or (bf16 vs f16) B follows A
    }
    bool c_via_copy = !cuda_gemm_c_direct(C.t, op_type, beta);
    // R as cuBLASLt's C, aligned unlike C, would key another plan than the in-place GEMM's (the header)
    if (pointer_alignment(R.p) != pointer_alignment(C.p)) take_r();
    if (!conv_a && !conv_b && !c_via_copy) {
        int r = lt_matmul(be, trans_a, trans_b, M, N, K, alpha, A.p, lda, B.p, ldb, op_type, beta,
                          apart ? R.p : C.p, C.p, C.t, ldc, bucketed);
        if (r != LT_NO_ALGO) return;
        // No algorithm for these alignments / strides: repack everything below.
        conv_a = conv_b = c_via_copy = true;
    }
    take_r();
    gemm_repacked(be, trans_a, trans_b, M, N, K, alpha, A, lda, conv_a, B, ldb, conv_b, op_type, beta, C, ldc,
                  c_via_copy);
}

extern "C" void cuda_gemm(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda,
                          Buf B, int ldb, float beta, Buf C, int ldc) {
    gemm(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, C, ldc, false);
}

extern "C" void cuda_gemm_residual(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A,
                                   int lda, Buf B, int ldb, Buf R, Buf D, int ldd) {
    gemm(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 1.0f, R, D, ldd, false);
}

void cuda_gemm_varying(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda,
                       Buf B, int ldb, float beta, Buf C, int ldc) {
    gemm(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, C, ldc, true);
}
