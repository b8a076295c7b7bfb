// cuDNN's fused flash attention (cudnn_attention.cu) behind the CUDA backend's attention ops,
// and the run-time loading of cuDNN (cudnn_loader.cu). Callable from C (the tests) and C++.
// Same contract as cuda_attention.h for the shapes it takes: q[B,T,nh,hd], k,v[B,T,nkv,hd],
// out[B,T,nh,hd], lse[B,nh,T] fp32 (natural-log logsumexp of the scaled scores), causal,
// Tq == Tk == T.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "ops/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Loads libcudnn.so.9 on first call (search order in cudnn_loader.cu). NULL when loaded,
// else why not (a sentence naming what was tried).
const char *cuda_cudnn_load(void);
// The file that was loaded ("" when none).
const char *cuda_cudnn_library_path(void);
bool cuda_cudnn_has_symbol(const char *name);

// One line describing cuDNN as this process sees it, for logs and the facts stage:
// "cuDNN 9.19.0 (cudart 13000) from /usr/local/cuda/lib/libcudnn.so.9" or the reason it is
// not usable. Loads it.
void cuda_cudnn_describe(char *buf, size_t cap);

// Run the op through cuDNN when it can take it. True: it was enqueued (or its failure was
// recorded on the backend). False: it cannot take this call (no cuDNN, old version, type,
// shape, alignment, a graph cuDNN does not support, an execution that failed to launch) and
// the caller runs our kernel; the first time a reason comes up it is logged (one line).
bool cuda_cudnn_attention_forward(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int T, int nh,
                                  int nkv, int hd);
bool cuda_cudnn_attention_backward(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, const float *lse, Buf q,
                                   Buf k, Buf v, int B, int T, int nh, int nkv, int hd);

// Why the last cuda_cudnn_attention_forward (backward=false) / _backward call returned
// false (NULL when it ran on cuDNN), and whether that was a cuDNN call failing (*failed,
// a bug or an environment problem) rather than a documented limit (type, shape, version).
// For the tests, which must fail loudly when cuDNN was there and failed.
const char *cuda_cudnn_attention_last_fallback(bool backward, bool *failed);

// The dispatch did not offer this call to cuDNN (`why`: the KV-cache forward, SPES_ATTENTION=ours,
// forced SIMT): what cuda_cudnn_attention_last_fallback reports for it (not a failure).
void cuda_cudnn_attention_not_offered(bool backward, const char *why);

// SPES_CUDNN_NONDETERMINISTIC=1 (read once) or this call: the backward may use cuDNN's
// faster non-deterministic algorithm (dQ accumulated in fp32 with atomics). Default off:
// runs are bit-reproducible. Process-wide; affects graphs built afterwards.
void cuda_cudnn_attention_set_deterministic(bool on);
bool cuda_cudnn_attention_deterministic(void);

// A check that needs no GPU: builds and finalizes the tensors and operations of the forward or
// backward graph (not the operation graph itself, which needs a handle, hence a GPU) and says
// which cuDNN call refused, if one did. Run by test_cuda_attention's test_cudnn_graph_descriptors.
// style: 0 the cudnn-frontend 1.10+ graph, 1 the 1.8 one (the fallback form).
bool cuda_cudnn_check_graph(bool backward, int B, int T, int nh, int nkv, int hd, bool f16, bool deterministic,
                            int style, char *msg, size_t cap);

// The backend's cuDNN state (handle, plan cache): created on first use, freed at close.
typedef struct CudaCudnn CudaCudnn;
void cuda_cudnn_free(CudaCudnn *c);

#ifdef __cplusplus
}
#endif
