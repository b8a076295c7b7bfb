// cuDNN, loaded at run time with dlopen (as cublas_loader.cu loads cuBLAS): a CUDA build
// starts and runs where cuDNN is absent, and attention then runs on our own kernels
// (cudnn_attention.cu says so on the console once).
//
// Where libcudnn.so.9 is looked for, in this order (the first that opens wins):
//   1. SPES_CUDNN_LIB: a file, or a directory holding libcudnn.so.9. When set, ONLY this is
//      tried (SPES_CUDNN_LIB=/nonexistent turns cuDNN off: the tests use it for the fallback).
//   2. libcudnn.so.9 by soname (the executable's RUNPATH, LD_LIBRARY_PATH, ld.so.cache).
//   3. The CUDA toolkit the binary was built against: SPES_CUDA_LIB (lib64) and its sibling
//      lib/ (this machine's cuDNN 9.19 sits in /usr/local/cuda/lib).
//   4. A Python environment's nvidia-cudnn wheel (PyTorch's nvidia-cudnn-cu12/cu13):
//      <prefix>/lib/python3.*/{site,dist}-packages/nvidia/cudnn/lib for the prefixes
//      $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local, /usr/local, /usr, /opt/conda. scripts/gpu_check.sh
//      exports SPES_CUDNN_LIB from the machine's python3 (nvidia.cudnn.__path__), which is
//      exact; the globs are for runs without it.
// libcudnn.so.9 is a small shim that dlopens its sub-libraries (libcudnn_graph, the engines,
// the heuristics) from its own directory ($ORIGIN); the runtime-compiled engines also need
// NVRTC, which the wheel's RUNPATH finds in ../../cu13/lib or ../../cuda_nvrtc/lib and the
// toolkit's copy in its own lib64. A missing sub-library shows later, as a failing
// cudnnCreate or plan finalize, with cuDNN's own message in the console line.
//
// Only the functions below may be called by the backend (definitions with hidden
// visibility, the same names and signatures as cudnn_graph.h declares, forwarding to the
// library's with dlsym); a new cuDNN call needs a line here (the link fails otherwise).
#include <cuda_runtime.h>
#pragma GCC visibility push(hidden)
#include <cudnn_graph.h>
#pragma GCC visibility pop

#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ops/cuda/cudnn_attention.h"

#ifndef SPES_CUDA_LIB
#define SPES_CUDA_LIB "/usr/local/cuda/lib64"
#endif

#define CUDNN_SONAME "libcudnn.so.9"

static void *lib_cudnn;
static char load_message[1600];   // why not loaded ("" when loaded)
static char load_path[600];       // what was loaded
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

// snprintf whose truncation of over-long paths is intended (not a -Wformat-truncation error).
static void fmt(char *buf, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, cap, f, ap);
    va_end(ap);
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

// Tries one path; on failure appends dlerror's words to `tried` (bounded).
static void *try_open(const char *path, char *tried, size_t cap) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h) {
        struct link_map *lm = NULL;   // the file the loader found (a soname gives no directory)
        fmt(load_path, sizeof load_path, "%s", dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name &&
                                                            lm->l_name[0] ? lm->l_name : path);
        return h;
    }
    const char *err = dlerror();
    size_t n = strlen(tried);
    if (n + 8 < cap) fmt(tried + n, cap - n, "%s%.200s", n ? "; " : "", err ? err : path);
    return NULL;
}

static void *try_dir(const char *dir, char *tried, size_t cap) {
    char path[600];
    fmt(path, sizeof path, "%s/%s", dir, CUDNN_SONAME);
    struct stat st;
    if (stat(path, &st) != 0) return NULL;   // not there: not worth a line in the message
    return try_open(path, tried, cap);
}

static void *try_python_dirs(char *tried, size_t cap) {
    const char *home = getenv("HOME");
    const char *prefixes[] = {getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX"), NULL, "/usr/local", "/usr", "/opt/conda"};
    char local[400];
    if (home) {
        fmt(local, sizeof local, "%s/.local", home);
        prefixes[2] = local;
    }
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        if (!prefixes[i] || !prefixes[i][0]) continue;
        char pattern[600];
        fmt(pattern, sizeof pattern, "%s/lib/python3*/*-packages/nvidia/cudnn/lib", prefixes[i]);
        glob_t g;
        if (glob(pattern, 0, NULL, &g) == 0) {
            for (size_t j = 0; j < g.gl_pathc; j++) {
                void *h = try_dir(g.gl_pathv[j], tried, cap);
                if (h) {
                    globfree(&g);
                    return h;
                }
            }
        }
        globfree(&g);
    }
    return NULL;
}

static void load_library(void) {
    char tried[1000] = "";
    const char *env = getenv("SPES_CUDNN_LIB");
    if (env && env[0]) {
        char path[600];
        if (is_dir(env)) fmt(path, sizeof path, "%s/%s", env, CUDNN_SONAME);
        else fmt(path, sizeof path, "%s", env);
        lib_cudnn = try_open(path, tried, sizeof tried);
        if (!lib_cudnn)
            fmt(load_message, sizeof load_message, "cuDNN library not found: SPES_CUDNN_LIB=%s (%s)", env, tried);
        return;
    }
    lib_cudnn = try_open(CUDNN_SONAME, tried, sizeof tried);
    if (!lib_cudnn) lib_cudnn = try_dir(SPES_CUDA_LIB, tried, sizeof tried);
    if (!lib_cudnn) {
        char sibling[600];
        fmt(sibling, sizeof sibling, "%s/../lib", SPES_CUDA_LIB);
        lib_cudnn = try_dir(sibling, tried, sizeof tried);
    }
    if (!lib_cudnn) lib_cudnn = try_python_dirs(tried, sizeof tried);
    if (!lib_cudnn)
        fmt(load_message, sizeof load_message,
                 "cuDNN library not found (%s by soname, in %s and ../lib, in Python's nvidia/cudnn/lib; %s): "
                 "set SPES_CUDNN_LIB to libcudnn.so.9 or its directory",
                 CUDNN_SONAME, SPES_CUDA_LIB, tried[0] ? tried : "no candidate file");
}

extern "C" const char *cuda_cudnn_load(void) {
    pthread_once(&load_once, load_library);
    return lib_cudnn ? NULL : load_message;
}

extern "C" const char *cuda_cudnn_library_path(void) {
    return cuda_cudnn_load() == NULL ? load_path : "";
}

// *lib is read after the load (see cublas_loader.cu).
static void *cudnn_symbol(const char *name) {
    if (cuda_cudnn_load() != NULL) return NULL;
    return dlsym(lib_cudnn, name);
}

extern "C" bool cuda_cudnn_has_symbol(const char *name) { return cudnn_symbol(name) != NULL; }

#define FORWARD(ret, fail, name, params, args)                                                        \
    extern "C" __attribute__((visibility("hidden"))) ret CUDNNWINAPI name params {                    \
        typedef ret (*fn_t) params;                                                                   \
        static fn_t fn = (fn_t)cudnn_symbol(#name);                                                   \
        if (!fn) return fail;                                                                         \
        return fn args;                                                                               \
    }
#define DNN(name, params, args) FORWARD(cudnnStatus_t, CUDNN_STATUS_NOT_INITIALIZED, name, params, args)

FORWARD(size_t, 0, cudnnGetVersion, (void), ())
FORWARD(size_t, 0, cudnnGetCudartVersion, (void), ())
FORWARD(const char *, "cuDNN is not loaded", cudnnGetErrorString, (cudnnStatus_t s), (s))
DNN(cudnnCreate, (cudnnHandle_t * h), (h))
DNN(cudnnDestroy, (cudnnHandle_t h), (h))
DNN(cudnnSetStream, (cudnnHandle_t h, cudaStream_t s), (h, s))
DNN(cudnnBackendCreateDescriptor, (cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t * d), (t, d))
DNN(cudnnBackendDestroyDescriptor, (cudnnBackendDescriptor_t d), (d))
DNN(cudnnBackendFinalize, (cudnnBackendDescriptor_t d), (d))
DNN(cudnnBackendSetAttribute,
    (cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
     const void *x),
    (d, a, t, n, x))
DNN(cudnnBackendGetAttribute,
    (cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t req,
     int64_t *n, void *x),
    (d, a, t, req, n, x))
DNN(cudnnBackendExecute, (cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t vp), (h, plan, vp))

// cudnnGetLastErrorString (cuDNN 9.0+): optional, an empty message where absent.
extern "C" __attribute__((visibility("hidden"))) void CUDNNWINAPI cudnnGetLastErrorString(char *message,
                                                                                          size_t max_size) {
    typedef void (*fn_t)(char *, size_t);
    static fn_t fn = (fn_t)cudnn_symbol("cudnnGetLastErrorString");
    if (max_size) message[0] = 0;
    if (fn) fn(message, max_size);
}
