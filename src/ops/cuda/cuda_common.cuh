// Shared by every file of the CUDA backend: its state, error recording, and element access
// for the number types a Buf can hold. Kernels read and write through load_num/store_num so
// one kernel serves fp32, bf16 and fp16 buffers; arithmetic is always fp32.
#pragma once
#include <stdint.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "base/error.h"
#include "ops/backend.h"
}

// Scratch memory cached in the backend (see cuda_scratch below). One slot per user that can
// be live at the same time: an op's own scratch must survive a gemm it calls, so gemm and the
// expert GEMMs have slots of their own.
enum {
    CUDA_SCRATCH_OP = 0,        // cuda_scratch(): any op's temporary buffer (engineers B, C)
    CUDA_SCRATCH_OP2,           // cuda_scratch2(): a second one for ops that need two at once
    CUDA_SCRATCH_GEMM,          // gemm.cu: operand type conversion
    CUDA_SCRATCH_EXPERTS,       // experts.cu: grouped-GEMM pointer arrays, converted operands
    CUDA_SCRATCH_REDUCE,        // reduce.cu: per-block double partials
    CUDA_SCRATCH_CUDNN,         // cudnn_attention.cu: cuDNN's workspace (+ the backward's softmax_sum)
    CUDA_SCRATCH_SLOTS
};
typedef struct {
    void *p;
    size_t bytes;
} CudaScratch;

// Side streams for independent GEMMs (the experts' per-expert GEMMs run side by side: one of
// them alone does not fill the GPU). At most this many; see cuda_side_fork below.
#define CUDA_SIDE_STREAMS 4

typedef struct CudaGemmCache CudaGemmCache;   // gemm.cu: matmul descriptors per shape
typedef struct CudaCudnn CudaCudnn;           // cudnn_attention.cu: cuDNN handle, attention plans

typedef struct {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    void *workspace;            // cuBLASLt workspace
    size_t workspace_bytes;
    int failed;                 // a failure was recorded since the last backend sync
    char message[512];          // its description
    size_t in_use, peak;        // bytes allocated through the backend
    int sm;                     // compute capability, major*10 + minor
    int num_sms;
    int device;                 // the GPU index (made current by cuda_backend_open; one GPU per process)
    CudaScratch scratch[CUDA_SCRATCH_SLOTS];
    CudaGemmCache *gemm_cache;  // owned by gemm.cu (cuda_gemm_cache_free at close)
    CudaCudnn *cudnn;           // owned by cudnn_attention.cu (cuda_cudnn_free at close); NULL until used
    int debug_sync;             // SPES_CUDA_DEBUG_SYNC=1: sync after every launch (finds the faulting op)
    // rmsnorm.cu's QK-norm with RoPE: SPES_CUDA_QK_NORM_ROPE=separate at open (the separate ops
    // always), and the fused launches so far [forward, backward] (cuda_qk_norm_rope_fused_calls;
    // plain counters: a backend's ops are queued by one host thread at a time).
    int qk_norm_rope_separate;
    uint64_t qk_norm_rope_fused[2];
    // Side streams, created on first use, each with its own cuBLASLt workspace (two GEMMs in
    // flight must not share one); `stream` and `workspace` point at one of them between
    // cuda_side_select and the next select / join, at the main ones otherwise.
    int sides;                                  // side streams created so far
    cudaStream_t side[CUDA_SIDE_STREAMS];
    void *side_workspace[CUDA_SIDE_STREAMS];
    cudaEvent_t side_done[CUDA_SIDE_STREAMS], fork;
    cudaStream_t main_stream;                   // the stream every other op runs on
    void *main_workspace;
    // The aux queue (BackendOps.aux_*): a stream of its own, created on first use, and one event
    // per point, created when first marked.
    cudaStream_t aux;
    cudaEvent_t aux_fork;
    cudaEvent_t aux_point[BACKEND_AUX_POINTS];
} CudaState;

static inline CudaState *cuda_state(Backend *be) { return (CudaState *)be->impl; }

// Loads cuBLAS / cuBLASLt (cublas_loader.cu: dlopen on first use, not at program start).
// NULL when loaded, else why not. cuda_backend_open calls it before any cuBLAS call.
const char *cuda_blas_load(void);

// Records the first failure (what, where, CUDA's words); ops after it still run harmlessly
// and the next backend sync reports it through spes_fail.
void cuda_record_failure(Backend *be, const char *what, const char *detail, const char *file, int line);

// Scratch: a device buffer of at least `bytes`, cached per slot and grown (to 1.5x the
// request, rounded up to 2 MiB) when too small; the old buffer is released after the stream
// drained (growth is rare, so the sync is too). Valid until the next call for the same slot,
// i.e. for the duration of one op; contents undefined. Counted in the backend's memory figures.
// Returns NULL (a failure recorded) when the allocation fails: the caller returns without
// launching. cuda_backend.cu.
void *cuda_scratch_slot(Backend *be, int slot, size_t bytes);
// Side streams (cuda_backend.cu). cuda_side_fork: up to `count` side streams wait for the work
// queued so far on the main stream; returns how many there are (0 when they could not be
// made: a failure is recorded, the caller runs on the main stream). cuda_side_select(be, i)
// queues what follows on side i (with its workspace); cuda_side_join(be, n) returns to the
// main stream, which waits for sides 0..n-1. Only for work that needs no scratch slot (two
// sides would share it): cuBLASLt GEMMs whose operands need no conversion or repacking.
int cuda_side_fork(Backend *be, int count);
void cuda_side_select(Backend *be, int i);
void cuda_side_join(Backend *be, int count);
static inline void *cuda_scratch(Backend *be, size_t bytes) { return cuda_scratch_slot(be, CUDA_SCRATCH_OP, bytes); }
static inline void *cuda_scratch2(Backend *be, size_t bytes) { return cuda_scratch_slot(be, CUDA_SCRATCH_OP2, bytes); }

// True when a failure has been recorded since the last sync (ops may return early: their
// outputs are undefined anyway once the step failed).
static inline bool cuda_failed(Backend *be) { return cuda_state(be)->failed != 0; }

#define CUDA_CHECK(be, call)                                                                   \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        if (err_ != cudaSuccess) cuda_record_failure((be), #call, cudaGetErrorString(err_), __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(be, call)                                                                 \
    do {                                                                                       \
        cublasStatus_t st_ = (call);                                                           \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                      \
            cuda_record_failure((be), #call, cublasGetStatusString(st_), __FILE__, __LINE__);   \
    } while (0)

// After every kernel launch: launch-configuration errors surface here, not later. With
// SPES_CUDA_DEBUG_SYNC=1 the stream is also synchronised, so a kernel that faults is named
// by the failure message (file:line of its launch) instead of surfacing at a later sync.
#define CUDA_LAUNCHED(be)                                                                      \
    do {                                                                                       \
        CUDA_CHECK((be), cudaGetLastError());                                                  \
        if (cuda_state(be)->debug_sync) CUDA_CHECK((be), cudaStreamSynchronize(cuda_state(be)->stream)); \
    } while (0)

// True when p is 16-byte aligned (NULL counts as aligned: an absent buffer): what vector
// loads, cuDNN and the tensor-core paths need.
static inline bool cuda_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// Blocks of `threads` covering n items (at least one block).
static inline unsigned cuda_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b ? b : 1);
}

// ---- element access by NumType ----------------------------------------------------------
__device__ __forceinline__ float load_num(const void *p, NumType t, size_t i) {
    switch (t) {
    case NUM_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case NUM_F16: return __half2float(((const __half *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void store_num(void *p, NumType t, size_t i, float x) {
    switch (t) {
    case NUM_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16(x); break;
    case NUM_F16: ((__half *)p)[i] = __float2half(x); break;
    default: ((float *)p)[i] = x; break;
    }
}

// cuBLASLt / CUDA data type of a NumType.
static inline cudaDataType_t cuda_data_type(NumType t) {
    return t == NUM_BF16 ? CUDA_R_16BF : t == NUM_F16 ? CUDA_R_16F : CUDA_R_32F;
}
