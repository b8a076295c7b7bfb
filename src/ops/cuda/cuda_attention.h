// Causal GQA attention on the CUDA backend (src/ops/cuda/attention.cu): the BackendOps
// attention_forward / attention_backward entries, same contract as src/ops/backend.h.
// Callable from C (the tests) and from cuda_backend.cu.
#pragma once
#include "ops/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// q[B,Tq,nh,hd]; k,v[B,Tk,nkv,hd], Tq <= Tk, query i at position Tk-Tq+i (sees keys
// 0..Tk-Tq+i). out[B,Tq,nh,hd], lse[B,nh,Tq] fp32 (logsumexp of the scaled scores).
// hd: a multiple of 8, at most 256 (fast paths for 64 and 128); others record a failure.
void cuda_attention_forward(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int Tq, int Tk, int nh,
                            int nkv, int hd);
// Tq == Tk == T. dq[B,T,nh,hd], dk, dv[B,T,nkv,hd] overwritten from dout; deterministic
// (every output element written by one thread block, in a fixed order; no atomics).
void cuda_attention_backward(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, const float *lse, Buf q, Buf k,
                             Buf v, int B, int T, int nh, int nkv, int hd);
// Tests: route every call to the plain SIMT kernels (the reference-quality path that also
// serves fp32 and odd head dims) instead of the tensor-core kernels. Process-wide.
void cuda_attention_force_simt(bool on);

// cuDNN's fused attention (cudnn_attention.cu) is tried first for bf16/f16, Tq == Tk, hd 64
// or 128, when cuDNN can be loaded; everything else (and whatever cuDNN declines) runs our
// kernels. SPES_ATTENTION=ours|cudnn (read once; default cudnn) or this call (tests, bench)
// picks: false = our kernels only. Process-wide.
void cuda_attention_use_cudnn(bool on);
bool cuda_attention_using_cudnn(void);
// What ran the last forward (backward=false) / backward call: "cudnn", "tensor-core" or
// "simt" (NULL before any).
const char *cuda_attention_last_impl(bool backward);

#ifdef __cplusplus
}
#endif
