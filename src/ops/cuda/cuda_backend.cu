// The CUDA backend: opening a GPU, the BackendOps table, memory, copies, type conversion,
// error recording and scratch memory. The ops themselves live in one file per family
// (gemm.cu, experts.cu, reduce.cu, adamw.cu: engineer A; cuda_pointwise.h: B;
// cuda_attention.h: C).
//
// Streams: every op of a backend runs on its one stream (CudaState.stream, non-blocking), so
// ops are ordered among themselves and the host only waits in sync / upload / download.
// Host buffers passed to upload/download may be pageable (plain malloc): the copies are
// cudaMemcpyAsync on the stream followed by a stream sync, so they are correct either way,
// but a pageable copy goes through the driver's staging buffer (roughly half the bandwidth
// of pinned memory). The per-step read-backs are a few bytes; bulk transfers (checkpoints)
// happen rarely.
#include "ops/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unordered_map>

#include "ops/cuda/cuda_attention.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/cudnn_attention.h"
extern "C" {
#include "base/env.h"
}

#ifndef SPES_CUDA_ARCHS
#define SPES_CUDA_ARCHS "?"
#endif

// Sizes of the live allocations (cudaFree does not say how much it released).
typedef std::unordered_map<void *, size_t> AllocSizes;

typedef struct {
    CudaState st;              // first: be->impl points here
    AllocSizes *sizes;
} CudaImpl;

static CudaImpl *cuda_impl(Backend *be) { return (CudaImpl *)be->impl; }

// ---- device discovery -----------------------------------------------------------------------
extern "C" int cuda_device_count(void) {
    int n = 0;
    // No driver (libcuda.so absent): cudaErrorInsufficientDriver; driver but no GPU:
    // cudaErrorNoDevice. Both mean "none", silently. The error is not sticky; clear it anyway
    // so no later cudaGetLastError() reports it.
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0 ? n : 0;
}

extern "C" const char *cuda_archs(void) { return SPES_CUDA_ARCHS; }

extern "C" int cuda_device_memory(int device, size_t *free_bytes, size_t *total_bytes) {
    cudaError_t err = cudaSetDevice(device);
    if (err == cudaSuccess) err = cudaMemGetInfo(free_bytes, total_bytes);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return spes_fail("cuda:%d: cannot read the free GPU memory (%s)", device, cudaGetErrorString(err));
    }
    return SPES_OK;
}

// ---- failures ---------------------------------------------------------------------------------
void cuda_record_failure(Backend *be, const char *what, const char *detail, const char *file, int line) {
    CudaState *st = cuda_state(be);
    if (st->failed) return;   // the first failure is the cause; later ones are consequences
    st->failed = 1;
    snprintf(st->message, sizeof st->message, "%s failed at %s:%d: %s", what, file, line, detail ? detail : "?");
}

// The recorded failure as the thread's error (and cleared): SPES_ERR. A device fault in a
// kernel surfaces at the next synchronising call, so its message may name a later call than
// the kernel at fault; SPES_CUDA_DEBUG_SYNC=1 syncs after every launch to pin it down.
static int cuda_report_failure(Backend *be) {
    CudaState *st = cuda_state(be);
    st->failed = 0;
    return spes_fail("cuda:%d: %s%s", st->device, st->message,
                     st->debug_sync ? "" : " (kernel faults surface at the next sync: rerun with "
                                           "SPES_CUDA_DEBUG_SYNC=1 or under compute-sanitizer to find the op)");
}

// ---- scratch ----------------------------------------------------------------------------------
void *cuda_scratch_slot(Backend *be, int slot, size_t bytes) {
    CudaState *st = cuda_state(be);
    if (slot < 0 || slot >= CUDA_SCRATCH_SLOTS) {
        cuda_record_failure(be, "cuda_scratch_slot", "no such scratch slot", __FILE__, __LINE__);
        return NULL;
    }
    CudaScratch *s = &st->scratch[slot];
    if (bytes == 0) bytes = 1;
    if (s->p && s->bytes >= bytes) return s->p;
    const size_t granule = (size_t)2 << 20;
    size_t want = bytes + bytes / 2;
    want = (want + granule - 1) / granule * granule;
    if (s->p) {
        // Kernels queued earlier may still read the old buffer.
        CUDA_CHECK(be, cudaStreamSynchronize(st->stream));
        CUDA_CHECK(be, cudaFree(s->p));
        st->in_use -= s->bytes;
        s->p = NULL;
        s->bytes = 0;
    }
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, want);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        char detail[160];
        snprintf(detail, sizeof detail, "out of GPU memory for %zu bytes of scratch (%s)", want,
                 cudaGetErrorString(err));
        cuda_record_failure(be, "cuda_scratch", detail, __FILE__, __LINE__);
        return NULL;
    }
    s->p = p;
    s->bytes = want;
    st->in_use += want;
    if (st->in_use > st->peak) st->peak = st->in_use;
    return p;
}

// ---- side streams -----------------------------------------------------------------------------
int cuda_side_fork(Backend *be, int count) {
    CudaState *st = cuda_state(be);
    if (count > CUDA_SIDE_STREAMS) count = CUDA_SIDE_STREAMS;
    if (!st->fork && cudaEventCreateWithFlags(&st->fork, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        st->fork = NULL;
        cuda_record_failure(be, "cuda_side_fork", "cannot create an event", __FILE__, __LINE__);
        return 0;
    }
    for (; st->sides < count; st->sides++) {
        int i = st->sides;
        cudaError_t err = cudaStreamCreateWithFlags(&st->side[i], cudaStreamNonBlocking);
        if (err == cudaSuccess) err = cudaEventCreateWithFlags(&st->side_done[i], cudaEventDisableTiming);
        if (err == cudaSuccess) err = cudaMalloc(&st->side_workspace[i], st->workspace_bytes);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            cuda_record_failure(be, "cuda_side_fork", cudaGetErrorString(err), __FILE__, __LINE__);
            break;   // side i is released at close (its fields are set or NULL)
        }
        st->in_use += st->workspace_bytes;
        if (st->in_use > st->peak) st->peak = st->in_use;
    }
    if (count > st->sides) count = st->sides;
    CUDA_CHECK(be, cudaEventRecord(st->fork, st->stream));
    for (int i = 0; i < count; i++) CUDA_CHECK(be, cudaStreamWaitEvent(st->side[i], st->fork, 0));
    return count;
}

void cuda_side_select(Backend *be, int i) {
    CudaState *st = cuda_state(be);
    st->stream = st->side[i];
    st->workspace = st->side_workspace[i];
}

void cuda_side_join(Backend *be, int count) {
    CudaState *st = cuda_state(be);
    st->stream = st->main_stream;
    st->workspace = st->main_workspace;
    for (int i = 0; i < count; i++) {
        CUDA_CHECK(be, cudaEventRecord(st->side_done[i], st->side[i]));
        CUDA_CHECK(be, cudaStreamWaitEvent(st->stream, st->side_done[i], 0));
    }
}

// ---- the aux queue (BackendOps.aux_*) ---------------------------------------------------------
// Test aid: SPES_CUDA_AUX_DELAY_US=N holds the aux queue N microseconds of GPU time at the start
// of each section and after each marked point, so a forward that skips a wait reads the part's
// old weights for certain, not by chance (test_cuda_core's test_overlap_step).
__global__ void aux_delay_kernel(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static void aux_delay(Backend *be) {
    const int us = env_int("SPES_CUDA_AUX_DELAY_US", 0, 0);
    if (us <= 0) return;
    aux_delay_kernel<<<1, 1, 0, cuda_state(be)->aux>>>(1000ull * (unsigned long long)us);
    CUDA_LAUNCHED(be);
}

static void cuda_aux_begin(Backend *be) {
    CudaState *st = cuda_state(be);
    if (st->stream != st->main_stream) {
        cuda_record_failure(be, "aux_begin", "not on the main stream (inside a side or aux section)", __FILE__, __LINE__);
        return;
    }
    // Stream and fork event come as a pair; the section switches to the aux stream only once it
    // waits for the main one. Any failure leaves the work on the main stream: in order, slower.
    cudaError_t err = cudaSuccess;
    if (!st->aux) {
        err = cudaStreamCreateWithFlags(&st->aux, cudaStreamNonBlocking);
        if (err == cudaSuccess) err = cudaEventCreateWithFlags(&st->aux_fork, cudaEventDisableTiming);
        if (err != cudaSuccess) {
            if (st->aux) (void)cudaStreamDestroy(st->aux);
            st->aux = nullptr;
            st->aux_fork = nullptr;
        }
    }
    if (err == cudaSuccess) err = cudaEventRecord(st->aux_fork, st->main_stream);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(st->aux, st->aux_fork, 0);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        cuda_record_failure(be, "aux_begin", cudaGetErrorString(err), __FILE__, __LINE__);
        return;
    }
    aux_delay(be);
    st->stream = st->aux;
}

static void cuda_aux_end(Backend *be) {
    CudaState *st = cuda_state(be);
    if (st->aux && st->stream == st->aux) st->stream = st->main_stream;   // only the section aux_begin opened
}

static bool aux_point_ok(Backend *be, int point, const char *what) {
    if (point >= 0 && point < BACKEND_AUX_POINTS) return true;
    char detail[64];
    snprintf(detail, sizeof detail, "point %d outside 0..%d", point, BACKEND_AUX_POINTS - 1);
    cuda_record_failure(be, what, detail, __FILE__, __LINE__);
    return false;
}

static void cuda_aux_mark(Backend *be, int point) {
    CudaState *st = cuda_state(be);
    if (!aux_point_ok(be, point, "aux_mark")) return;
    if (!st->aux) {
        cuda_record_failure(be, "aux_mark", "no aux_begin before it", __FILE__, __LINE__);
        return;
    }
    cudaEvent_t *ev = &st->aux_point[point];
    if (!*ev && cudaEventCreateWithFlags(ev, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        *ev = NULL;
        cuda_record_failure(be, "aux_mark", "cannot create an event", __FILE__, __LINE__);
        return;
    }
    CUDA_CHECK(be, cudaEventRecord(*ev, st->aux));
    aux_delay(be);
}

static void cuda_aux_wait(Backend *be, int point) {
    CudaState *st = cuda_state(be);
    if (!aux_point_ok(be, point, "aux_wait") || !st->aux_point[point]) return;   // never marked: nothing to wait for
    CUDA_CHECK(be, cudaStreamWaitEvent(st->main_stream, st->aux_point[point], 0));
}

// ---- memory -----------------------------------------------------------------------------------
static int cuda_alloc(Backend *be, size_t bytes, void **out) {
    CudaImpl *impl = cuda_impl(be);
    CudaState *st = &impl->st;
    *out = NULL;
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        return spes_fail("cuda:%d: cannot allocate %.3f GiB of GPU memory (%s); %.2f GiB in use through the backend, "
                         "%.2f of %.2f GiB free on the device: use a smaller micro-batch or sequence length",
                         st->device, bytes / 1073741824.0, cudaGetErrorString(err), st->in_use / 1073741824.0,
                         free_b / 1073741824.0, total_b / 1073741824.0);
    }
    // Zeroed, in stream order: every later use of p is on the same stream.
    err = cudaMemsetAsync(p, 0, bytes, st->stream);
    if (err != cudaSuccess) {
        (void)cudaFree(p);
        return spes_fail("cuda:%d: zeroing a new allocation: %s", st->device, cudaGetErrorString(err));
    }
    (*impl->sizes)[p] = bytes ? bytes : 1;
    st->in_use += bytes ? bytes : 1;
    if (st->in_use > st->peak) st->peak = st->in_use;
    *out = p;
    return SPES_OK;
}

static void cuda_free_mem(Backend *be, void *p) {
    if (!p) return;
    CudaImpl *impl = cuda_impl(be);
    auto it = impl->sizes->find(p);
    if (it == impl->sizes->end()) {
        cuda_record_failure(be, "cuda free", "pointer was not allocated by this backend", __FILE__, __LINE__);
        return;
    }
    impl->st.in_use -= it->second;
    impl->sizes->erase(it);
    // cudaFree waits for the device to finish using p (implicit synchronisation).
    CUDA_CHECK(be, cudaFree(p));
}

// Page-locked host memory: copies from/to it are true DMA at bus speed (pageable memory is
// staged through a driver buffer first).
static int cuda_host_alloc(Backend *be, size_t bytes, void **out) {
    *out = NULL;
    cudaError_t err = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return spes_fail("cannot allocate %.3f GiB of page-locked host memory (%s)", bytes / 1073741824.0,
                         cudaGetErrorString(err));
    }
    memset(*out, 0, bytes);
    return SPES_OK;
}

static void cuda_host_free(Backend *be, void *p) {
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

static int cuda_upload(Backend *be, void *dst, const void *host_src, size_t bytes) {
    CudaState *st = cuda_state(be);
    if (bytes == 0) return st->failed ? cuda_report_failure(be) : SPES_OK;
    CUDA_CHECK(be, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, st->stream));
    CUDA_CHECK(be, cudaStreamSynchronize(st->stream));
    return st->failed ? cuda_report_failure(be) : SPES_OK;
}

static int cuda_download(Backend *be, void *host_dst, const void *src, size_t bytes) {
    CudaState *st = cuda_state(be);
    if (bytes == 0) return st->failed ? cuda_report_failure(be) : SPES_OK;
    CUDA_CHECK(be, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, st->stream));
    CUDA_CHECK(be, cudaStreamSynchronize(st->stream));
    return st->failed ? cuda_report_failure(be) : SPES_OK;
}

static void cuda_copy(Backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    CUDA_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_state(be)->stream));
}

static void cuda_zero(Backend *be, void *dst, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(be, cudaMemsetAsync(dst, 0, bytes, cuda_state(be)->stream));
}

// ---- conversion -------------------------------------------------------------------------------
template <typename T> struct NumTraits;
template <> struct NumTraits<float> {
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float x) { return x; }
};
template <> struct NumTraits<__nv_bfloat16> {
    static __device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 store(float x) { return __float2bfloat16(x); }   // RNE
};
template <> struct NumTraits<__half> {
    static __device__ __forceinline__ float load(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half store(float x) { return __float2half(x); }               // RNE
};

template <typename D, typename S>
__global__ void convert_kernel(D *__restrict__ dst, const S *__restrict__ src, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = NumTraits<D>::store(NumTraits<S>::load(src[i]));
}

template <typename D, typename S> static void launch_convert(Backend *be, void *dst, const void *src, size_t n) {
    const unsigned threads = 256;
    unsigned blocks = cuda_blocks(n, threads);
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;   // grid-stride beyond this
    convert_kernel<D, S><<<blocks, threads, 0, cuda_state(be)->stream>>>((D *)dst, (const S *)src, n);
    CUDA_LAUNCHED(be);
}

template <typename D> static void convert_to(Backend *be, void *dst, Buf src, size_t n) {
    switch (src.t) {
    case NUM_BF16: launch_convert<D, __nv_bfloat16>(be, dst, src.p, n); break;
    case NUM_F16: launch_convert<D, __half>(be, dst, src.p, n); break;
    default: launch_convert<D, float>(be, dst, src.p, n); break;
    }
}

extern "C" void cuda_convert(Backend *be, Buf dst, Buf src, size_t n) {
    if (n == 0) return;
    if (dst.t == src.t) {
        cuda_copy(be, dst.p, src.p, n * num_type_size(dst.t));
        return;
    }
    switch (dst.t) {
    case NUM_BF16: convert_to<__nv_bfloat16>(be, dst.p, src, n); break;
    case NUM_F16: convert_to<__half>(be, dst.p, src, n); break;
    default: convert_to<float>(be, dst.p, src, n); break;
    }
}

// ---- sync, memory figures, close --------------------------------------------------------------
static int cuda_sync(Backend *be) {
    CudaState *st = cuda_state(be);
    CUDA_CHECK(be, cudaStreamSynchronize(st->main_stream));
    if (st->aux) CUDA_CHECK(be, cudaStreamSynchronize(st->aux));
    return st->failed ? cuda_report_failure(be) : SPES_OK;
}

static void cuda_memory(Backend *be, size_t *in_use, size_t *peak) {
    if (in_use) *in_use = cuda_state(be)->in_use;
    if (peak) *peak = cuda_state(be)->peak;
}

// Releases everything the backend holds (also after a failed open: every field may be 0).
static void cuda_release(CudaImpl *impl) {
    CudaState *st = &impl->st;
    if (st->main_stream) (void)cudaStreamSynchronize(st->main_stream);
    if (st->aux) (void)cudaStreamSynchronize(st->aux);   // before the buffers it may still write go
    if (impl->sizes) {
        for (auto &kv : *impl->sizes) (void)cudaFree(kv.first);   // buffers the caller did not free
        delete impl->sizes;
    }
    for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++)
        if (st->scratch[i].p) (void)cudaFree(st->scratch[i].p);
    if (st->gemm_cache) cuda_gemm_cache_free(st->gemm_cache);
    if (st->cudnn) cuda_cudnn_free(st->cudnn);
    if (st->workspace) (void)cudaFree(st->workspace);
    for (int i = 0; i < CUDA_SIDE_STREAMS; i++) {
        if (st->side[i]) (void)cudaStreamDestroy(st->side[i]);
        if (st->side_done[i]) (void)cudaEventDestroy(st->side_done[i]);
        if (st->side_workspace[i]) (void)cudaFree(st->side_workspace[i]);
    }
    if (st->fork) (void)cudaEventDestroy(st->fork);
    for (int i = 0; i < BACKEND_AUX_POINTS; i++)
        if (st->aux_point[i]) (void)cudaEventDestroy(st->aux_point[i]);
    if (st->aux_fork) (void)cudaEventDestroy(st->aux_fork);
    if (st->aux) (void)cudaStreamDestroy(st->aux);
    if (st->blas) (void)cublasDestroy(st->blas);
    if (st->lt) (void)cublasLtDestroy(st->lt);
    if (st->stream) (void)cudaStreamDestroy(st->stream);
    (void)cudaGetLastError();
    free(impl);
}

static void cuda_close(Backend *be) {
    cuda_release(cuda_impl(be));
    free(be);
}

// ---- the table --------------------------------------------------------------------------------
static const BackendOps cuda_ops = {
    // memory
    cuda_alloc,
    cuda_free_mem,
    cuda_host_alloc,
    cuda_host_free,
    cuda_upload,
    cuda_download,
    cuda_copy,
    cuda_zero,
    cuda_convert,
    cuda_sync,
    cuda_memory,
    cuda_close,
    // GEMMs (gemm.cu, experts.cu)
    cuda_gemm,
    cuda_gemm_residual,
    cuda_experts_forward,
    cuda_experts_backward,
    // pointwise family (engineer B: cuda_pointwise.h)
    cuda_add_inplace,
    cuda_copy_2d,
    cuda_embedding_forward,
    cuda_embedding_backward,
    cuda_rmsnorm_forward,
    cuda_rmsnorm_backward,
    cuda_rope_tables,
    cuda_rope_forward,
    cuda_rope_backward,
    cuda_qk_norm_rope_forward,
    cuda_qk_norm_rope_backward,
    // attention (engineer C: cuda_attention.h)
    cuda_attention_forward,
    cuda_attention_backward,
    // router, dispatch, loss (engineer B)
    cuda_router_forward,
    cuda_router_backward,
    cuda_moe_plan,
    cuda_gather_rows,
    cuda_moe_combine,
    cuda_moe_combine_backward,
    cuda_moe_uncombine_add,
    cuda_cross_entropy_rows,
    // reductions, AdamW (reduce.cu, adamw.cu)
    cuda_sum,
    cuda_column_means,
    cuda_grad_sum_squares,
    cuda_adamw,
    // the aux queue
    cuda_aux_begin,
    cuda_aux_end,
    cuda_aux_mark,
    cuda_aux_wait,
};

// ---- opening ----------------------------------------------------------------------------------
#define OPEN_CHECK(call, what)                                                                       \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            (void)cudaGetLastError();                                                                \
            spes_fail("cuda:%d: %s: %s", device, what, cudaGetErrorString(e_));                       \
            goto fail;                                                                               \
        }                                                                                            \
    } while (0)
#define OPEN_CHECK_BLAS(call, what)                                                                  \
    do {                                                                                             \
        cublasStatus_t s_ = (call);                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
            spes_fail("cuda:%d: %s: %s", device, what, cublasGetStatusString(s_));                    \
            goto fail;                                                                               \
        }                                                                                            \
    } while (0)

extern "C" int cuda_backend_open(int device, Precision precision, Backend **out) {
    *out = NULL;
    int count = cuda_device_count();
    if (device < 0 || device >= count)
        return spes_fail("cuda:%d: %s", device,
                         count == 0 ? "no NVIDIA GPU is visible (driver missing, or CUDA_VISIBLE_DEVICES empty)"
                                    : "no such GPU (fewer are visible)");
    Backend *be = NULL;
    CudaImpl *impl = NULL;
    CudaState *st = NULL;
    cudaDeviceProp prop;
    double gib = 0.0;
    const char *debug = NULL, *qk = NULL;

    OPEN_CHECK(cudaSetDevice(device), "selecting the GPU");
    OPEN_CHECK(cudaGetDeviceProperties(&prop, device), "reading the GPU's properties");
    if (prop.major < 8) {
        return spes_fail("cuda:%d: %s has compute capability %d.%d; the CUDA backend needs 8.0 or newer "
                         "(bf16 tensor cores: A100, L40, H100, ...); this binary has %s. Use device: cpu",
                         device, prop.name, prop.major, prop.minor, cuda_archs());
    }
    impl = (CudaImpl *)calloc(1, sizeof *impl);
    be = (Backend *)calloc(1, sizeof *be);
    if (!impl || !be) {
        spes_fail("cuda:%d: out of host memory", device);
        goto fail;
    }
    impl->sizes = new AllocSizes();
    st = &impl->st;
    st->device = device;
    st->sm = prop.major * 10 + prop.minor;
    st->num_sms = prop.multiProcessorCount;
    debug = getenv("SPES_CUDA_DEBUG_SYNC");
    st->debug_sync = debug && debug[0] && strcmp(debug, "0") != 0;
    qk = getenv("SPES_CUDA_QK_NORM_ROPE");   // read once, here (rmsnorm.cu)
    st->qk_norm_rope_separate = qk && strcmp(qk, "separate") == 0;

    if (const char *why = cuda_blas_load()) {
        spes_fail("cuda:%d: %s", device, why);
        goto fail;
    }
    OPEN_CHECK(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "creating a stream");
    OPEN_CHECK_BLAS(cublasLtCreate(&st->lt), "cublasLtCreate");
    OPEN_CHECK_BLAS(cublasCreate(&st->blas), "cublasCreate");
    OPEN_CHECK_BLAS(cublasSetStream(st->blas, st->stream), "cublasSetStream");
    // Reproducibility: no atomics in cuBLAS routines (the default, stated), no TF32 in fp32.
    OPEN_CHECK_BLAS(cublasSetAtomicsMode(st->blas, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
    OPEN_CHECK_BLAS(cublasSetMathMode(st->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    st->workspace_bytes = (size_t)32 << 20;
    OPEN_CHECK(cudaMalloc(&st->workspace, st->workspace_bytes), "allocating the cuBLAS workspace");
    // cuBLAS (grouped GEMMs) shares the workspace with cuBLASLt: both run on the one stream.
    OPEN_CHECK_BLAS(cublasSetWorkspace(st->blas, st->workspace, st->workspace_bytes), "cublasSetWorkspace");
    st->in_use = st->peak = st->workspace_bytes;
    st->main_stream = st->stream;
    st->main_workspace = st->workspace;

    backend_plan_traits(true, precision, be);   // name, compute type, the logits block's layout
    be->ops = &cuda_ops;
    be->device = device;
    be->impl = impl;
    gib = (double)prop.totalGlobalMem / 1073741824.0;
    snprintf(be->description, sizeof be->description, "cuda:%d %.100s (sm_%d%d, %.0f GiB, %s)", device, prop.name,
             prop.major, prop.minor, gib, num_type_name(be->compute));
    *out = be;
    return SPES_OK;

fail:
    if (impl) cuda_release(impl);
    free(be);
    return SPES_ERR;
}
