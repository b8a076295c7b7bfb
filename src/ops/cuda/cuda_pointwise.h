// The pointwise / row-wise family of the CUDA backend (engineer B): element-wise ops,
// embeddings, RMSNorm, RoPE, router, MoE dispatch and cross-entropy. Each function has
// exactly the signature of its BackendOps entry (src/ops/backend.h), which states the
// contract; cuda_backend.cu puts them in the table. Every op runs on CudaState.stream,
// computes in fp32, reduces in a fixed order (no float atomics) and records failures
// through CUDA_CHECK / CUDA_LAUNCHED.
//
// Files: elementwise.cu (add_inplace, copy_2d, embedding_*), rmsnorm.cu, rope.cu, router.cu,
// moe_dispatch.cu (moe_plan, gather_rows, moe_combine*, moe_uncombine_add),
// cross_entropy.cu. C linkage (as cuda_ops.h), so C tests may call them directly too.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/backend.h"

// elementwise.cu
void cuda_add_inplace(Backend *be, Buf y, Buf x, size_t n);
void cuda_copy_2d(Backend *be, Buf dst, int dst_stride, Buf src, int src_stride, int rows, int cols);
void cuda_embedding_forward(Backend *be, Buf out, const float *table, const int32_t *tokens, int N, int H);
void cuda_embedding_backward(Backend *be, float *dtable, Buf dout, const int32_t *tokens, int N, int H);

// rmsnorm.cu
void cuda_rmsnorm_forward(Backend *be, Buf y, float *rstd, Buf x, const float *w, int R, int C, float eps);
void cuda_rmsnorm_backward(Backend *be, Buf dx, float *dw, Buf dy, Buf x, const float *w, const float *rstd, int R,
                           int C, bool accumulate);

// rope.cu
void cuda_rope_tables(Backend *be, float *cos_t, float *sin_t, int T, int hd, float theta);
void cuda_rope_forward(Backend *be, Buf x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);
void cuda_rope_backward(Backend *be, Buf dx, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);

// rmsnorm.cu: QK-norm with RoPE (RMSNorm's kernels with the rotation folded in)
void cuda_qk_norm_rope_forward(Backend *be, Buf y, Buf x_copy, float *rstd, Buf x, int ldx, const float *w,
                               const float *cos_t, const float *sin_t, int B, int T, int nh, int hd, bool per_head,
                               float eps);
void cuda_qk_norm_rope_backward(Backend *be, Buf dx, int lddx, float *dw, Buf dy, Buf x, const float *w,
                                const float *rstd, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd,
                                bool per_head);
// How many of this backend's qk_norm_rope_forward / _backward calls ran the fused kernels (the
// others took the separate ops: a shape or layout the fusion does not take, or the backend was
// opened with SPES_CUDA_QK_NORM_ROPE=separate), so tests and benches can assert which path ran.
// Either pointer may be NULL.
void cuda_qk_norm_rope_fused_calls(Backend *be, uint64_t *forward, uint64_t *backward);

// router.cu
void cuda_router_forward(Backend *be, float *probs, float *lse, int32_t *topk_idx, float *topk_w,
                         const float *logits, int N, int E, int k, bool normalize);
void cuda_router_backward(Backend *be, float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                          const int32_t *topk_idx, const float *topk_w, const float *dprob, float z_coef, int N,
                          int E, int k, bool normalize);

// moe_dispatch.cu
void cuda_moe_plan(Backend *be, int32_t *offsets, int32_t *row_token, int32_t *row_of_slot, const int32_t *topk_idx,
                   int N, int E, int k);
void cuda_gather_rows(Backend *be, Buf dst, Buf src, const int32_t *rows, int count, int H);
void cuda_moe_combine(Backend *be, Buf out, Buf resid, Buf y, const float *w, const int32_t *row_of_slot, int N, int k,
                      int H);
void cuda_moe_combine_backward(Backend *be, Buf dy, float *dw, Buf dout, Buf y, const float *w,
                               const int32_t *row_of_slot, int N, int k, int H);
void cuda_moe_uncombine_add(Backend *be, Buf dx, Buf dxe, const int32_t *row_of_slot, int N, int k, int H);

// cross_entropy.cu
void cuda_cross_entropy_rows(Backend *be, Buf logits, int ld, float *ce, float *lse, const int32_t *targets, int R,
                             int V, float ce_scale, float z_scale, bool grad);

#ifdef __cplusplus
}
#endif
