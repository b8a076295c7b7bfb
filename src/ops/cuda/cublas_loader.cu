// cuBLAS and cuBLASLt, loaded when a CUDA backend opens instead of when the program starts.
//
// Why: libcublasLt is ~540 MB; linking it (and libcublas) into every binary cost 80-150 ms at
// each process start on the development machine, for every `spes` run and test program,
// GPU or not, and made a CUDA build unable to start where the CUDA libraries are absent.
// With cudart linked statically (it reaches the driver with dlopen itself) and cuBLAS loaded
// here with dlopen, a CUDA build starts as fast as a CPU build and runs anywhere: `device:
// auto` falls back to cpu, `device: cuda` says what is missing.
//
// How: this file defines the cuBLAS entry points the backend calls (same names and
// signatures as the headers declare, so a mismatch does not compile), each forwarding to the
// library's function found with dlsym. The definitions have hidden visibility: the libraries'
// own calls between themselves never land here. Only functions listed below may be called;
// a new cuBLAS call in the backend needs a line here (the link fails otherwise).
#pragma GCC visibility push(hidden)
#include <cublasLt.h>
#include <cublas_v2.h>
#pragma GCC visibility pop
#include "ops/cuda/cuda_common.cuh"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define STR_(x) #x
#define STR(x) STR_(x)

#ifndef SPES_CUDA_LIB
#define SPES_CUDA_LIB "/usr/local/cuda/lib64"
#endif

static void *lib_lt, *lib_blas;
static int load_result;          // 0 ok, else failed (load_message says why)
static char load_message[1200];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

// dlopen by soname (the executable's RUNPATH, LD_LIBRARY_PATH, the system paths), then from
// the toolkit directory the binary was built against.
static void *open_lib(const char *base) {
    char name[256];
    snprintf(name, sizeof name, "lib%s.so.%d", base, CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    const char *err = dlerror();
    char path[400];
    snprintf(path, sizeof path, "%s/%s", SPES_CUDA_LIB, name);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && !load_message[0])
        snprintf(load_message, sizeof load_message, "cannot load %s (%.300s; also tried %s): install the CUDA %d "
                 "libraries or add their directory to LD_LIBRARY_PATH", name, err ? err : "?", path, CUBLAS_VER_MAJOR);
    return h;
}

static void load_libraries(void) {
    lib_lt = open_lib("cublasLt");
    lib_blas = lib_lt ? open_lib("cublas") : NULL;
    load_result = lib_lt && lib_blas ? 0 : -1;
}

const char *cuda_blas_load(void) {
    pthread_once(&load_once, load_libraries);
    return load_result == 0 ? NULL : load_message;
}

// *lib is read after the load: a forwarder called first must not look its symbol up in NULL
// (the global scope, which RTLD_LOCAL libraries are not in) and cache that failure.
static void *lib_symbol(void *const *lib, const char *name) {
    if (cuda_blas_load() != NULL) return NULL;
    return dlsym(*lib, name);
}

// One forwarding definition: RET NAME PARAMS { return real(ARGS); }. NAME may be a macro of
// cublas_v2.h (cublasCreate -> cublasCreate_v2): STR() expands it to the exported name.
#define FORWARD(lib, ret, fail, name, params, args)                                                   \
    extern "C" __attribute__((visibility("hidden"))) ret CUBLASWINAPI name params {                   \
        typedef ret (*fn_t) params;                                                                   \
        static fn_t fn = (fn_t)lib_symbol(&lib, STR(name));                                            \
        if (!fn) return fail;                                                                         \
        return fn args;                                                                               \
    }
#define LT(name, params, args) FORWARD(lib_lt, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, name, params, args)
#define BLAS(name, params, args) FORWARD(lib_blas, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, name, params, args)

LT(cublasLtCreate, (cublasLtHandle_t * h), (h))
LT(cublasLtDestroy, (cublasLtHandle_t h), (h))
LT(cublasLtMatmulDescCreate, (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s), (d, c, s))
LT(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))
LT(cublasLtMatmulDescSetAttribute,
   (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n), (d, a, buf, n))
LT(cublasLtMatrixLayoutCreate, (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),
   (l, t, rows, cols, ld))
LT(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))
LT(cublasLtMatrixLayoutSetAttribute,
   (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *buf, size_t n), (l, a, buf, n))
LT(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p), (p))
LT(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))
LT(cublasLtMatmulPreferenceSetAttribute,
   (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n), (p, a, buf, n))
LT(cublasLtMatmulAlgoGetHeuristic,
   (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
    cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
    cublasLtMatmulHeuristicResult_t results[], int *returned),
   (h, op, a, b, c, d, pref, requested, results, returned))
LT(cublasLtMatmul,
   (cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A, cublasLtMatrixLayout_t a,
    const void *B, cublasLtMatrixLayout_t b, const void *beta, const void *C, cublasLtMatrixLayout_t c, void *D,
    cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream),
   (h, op, alpha, A, a, B, b, beta, C, c, D, d, algo, ws, ws_bytes, stream))

BLAS(cublasCreate, (cublasHandle_t * h), (h))
BLAS(cublasDestroy, (cublasHandle_t h), (h))
BLAS(cublasSetStream, (cublasHandle_t h, cudaStream_t s), (h, s))
BLAS(cublasSetWorkspace, (cublasHandle_t h, void *ws, size_t bytes), (h, ws, bytes))
BLAS(cublasSetAtomicsMode, (cublasHandle_t h, cublasAtomicsMode_t m), (h, m))
BLAS(cublasSetMathMode, (cublasHandle_t h, cublasMath_t m), (h, m))
BLAS(cublasGemmGroupedBatchedEx,
     (cublasHandle_t h, const cublasOperation_t transa[], const cublasOperation_t transb[], const int m[],
      const int n[], const int k[], const void *alpha, const void *const A[], cudaDataType_t at, const int lda[],
      const void *const B[], cudaDataType_t bt, const int ldb[], const void *beta, void *const C[],
      cudaDataType_t ct, const int ldc[], int groups, const int group_size[], cublasComputeType_t compute),
     (h, transa, transb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, groups, group_size, compute))

FORWARD(lib_blas, const char *, "cuBLAS is not loaded", cublasGetStatusString, (cublasStatus_t s), (s))
