// The core ops of the CUDA backend (engineer A): memory ops and the backend itself live in
// cuda_backend.cu; GEMM (gemm.cu, cuBLASLt), grouped expert MLPs (experts.cu), reductions
// (reduce.cu) and AdamW (adamw.cu). Each function has exactly the signature of its
// BackendOps entry (src/ops/backend.h), which states the contract; cuda_backend.cu puts them
// in the table. C linkage, so C tests may call them directly too.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/backend.h"

// cuda_backend.cu
void cuda_convert(Backend *be, Buf dst, Buf src, size_t n);

// gemm.cu
void cuda_gemm(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda, Buf B,
               int ldb, float beta, Buf C, int ldc);
void cuda_gemm_residual(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda,
                        Buf B, int ldb, Buf R, Buf D, int ldd);

// experts.cu
void cuda_experts_forward(Backend *be, const ExpertsArgs *a);
void cuda_experts_backward(Backend *be, const ExpertsArgs *a);

// reduce.cu
void cuda_sum(Backend *be, double *out, const float *x, size_t n, bool squares);
void cuda_column_means(Backend *be, double *out, const float *x, int N, int E);
int cuda_grad_sum_squares(Backend *be, const float *x, size_t n, double *host_out);

// adamw.cu
void cuda_adamw(Backend *be, const AdamWTensor *t, int count, const AdamWScalars *s);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
// Internal to the backend (C++ linkage): gemm.cu's descriptor cache, freed at close.
struct CudaGemmCache;
void cuda_gemm_cache_free(struct CudaGemmCache *cache);
// cuda_gemm for GEMMs whose sizes change from call to call (the experts' row counts): plans
// per size bucket, not per exact size (gemm.cu's header).
void cuda_gemm_varying(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda,
                       Buf B, int ldb, float beta, Buf C, int ldc);
// Whether cuBLASLt writes C itself (C f32, or of the operands' type and not read): otherwise
// gemm.cu passes C through an fp32 copy in its scratch.
bool cuda_gemm_c_direct(NumType c_type, NumType op_type, float beta);
#endif
