// The cpu backend's kernels (and the reference every other backend is tested against). Row-major fp32 throughout; shapes in comments.
// The interface the model calls is src/ops/backend.h; src/ops/cpu/cpu_backend.c puts these kernels behind it.
//
// Each op has a fast CPU version (OpenMP over independent rows/heads, OpenBLAS for GEMMs)
// and, where the fast version works differently from the textbook formula, a plain `_ref`
// version that tests compare against. Ops never allocate large buffers and never fail:
// the model validates shapes and token ids before calling them. Ops that need scratch
// memory proportional to the input (attention) allocate it and return SPES_OK/SPES_ERR.
//
// Determinism: our own kernels produce the same bits for the same inputs whatever the
// thread count (each output has one owner; reductions run in fixed chunks summed in a fixed
// order). GEMMs are OpenBLAS's, deterministic for a fixed thread count.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- GEMM ------------------------------------------------------------------------------
// C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, op(X) = X^T when trans_x.
// lda/ldb/ldc are row strides as stored. beta == 0 ignores C's old contents (even NaN).
// Called outside an OpenMP region, OpenBLAS uses all threads; inside one, a single thread.
void op_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc);
void op_gemm_ref(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);

// Linear layer helpers on dense matrices (x [N,in], W [out,in] as in torch.nn.Linear):
// y[N,out] = x @ W^T (+ y when accumulate)
void op_linear_forward(float *y, const float *x, const float *W, int N, int in, int out, bool accumulate);
// dx[N,in] (+)= dy[N,out] @ W[out,in]
void op_linear_backward_input(float *dx, const float *dy, const float *W, int N, int in, int out, bool accumulate);
// dW[out,in] += dy[N,out]^T @ x[N,in]
void op_linear_backward_weight(float *dW, const float *dy, const float *x, int N, int in, int out);

// ---- elementwise ------------------------------------------------------------------------
// y[n] += x[n]
void op_add_inplace(float *y, const float *x, size_t n);

// dst[r, 0:cols] = src[r, 0:cols] for r < rows, rows strided (to split or join column blocks)
void op_copy_2d(float *dst, int dst_stride, const float *src, int src_stride, int rows, int cols);

// ---- embedding --------------------------------------------------------------------------
// out[N,H] = table[tokens[n], :]
void op_embedding_forward(float *out, const float *table, const int32_t *tokens, int N, int H);
// dtable[tokens[n], :] += dout[n, :]   (tokens in order: deterministic)
void op_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int H);

// ---- RMSNorm ----------------------------------------------------------------------------
// For each of R rows of width C: rstd[r] = 1/sqrt(mean(x[r]^2) + eps), y[r] = x[r]*rstd[r]*w.
// The weight w[C] is shared by all rows (QK-norm per head: rows = tokens*heads, C = hd).
void op_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int R, int C, float eps);
// dx[R,C] (+= when accumulate) from dy; dw[C] += sum_r dy*x*rstd when dw != NULL.
// dx may alias dy when !accumulate.
void op_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                         int R, int C, bool accumulate);
void op_rmsnorm_backward_ref(float *dx, float *dw, const float *dy, const float *x, const float *w,
                             const float *rstd, int R, int C, bool accumulate);

// ---- rotary embeddings (HF rotate-half) -------------------------------------------------
// cos/sin tables [T, hd/2]: inv_freq[i] = theta^(-2i/hd), angle = t*inv_freq[i] (fp32, as HF).
void op_rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta);
// x[B,T,nh,hd] in place: x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin (x1, x2: halves).
void op_rope_forward(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);
// dx from dy (the transposed rotation), in place.
void op_rope_backward(float *dx, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);

// ---- causal attention (GQA) -------------------------------------------------------------
// q[B,T,nh,hd], k,v[B,T,nkv,hd] -> out[B,T,nh,hd], lse[B,nh,T] (logsumexp of the scaled
// scores, saved for the backward). Query head h reads kv head h / (nh/nkv).
// Tiled over query blocks: scratch is O(block*T) per thread, never O(T^2) per head.
int op_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                          int nh, int nkv, int hd);
// dq[B,T,nh,hd], dk, dv[B,T,nkv,hd] (overwritten) from dout; recomputes the scores from lse.
int op_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                           const float *q, const float *k, const float *v, int B, int T, int nh, int nkv, int hd);
// Tq new queries (positions Tk-Tq .. Tk-1) against Tk cached keys/values [B,Tk,nkv,hd]:
// out[B,Tq,nh,hd], lse[B,nh,Tq]. One scores row of Tk floats per thread.
int op_attention_forward_kv(float *out, float *lse, const float *q, const float *k, const float *v, int B, int Tq,
                            int Tk, int nh, int nkv, int hd);
// Textbook versions: the full [T,T] score matrix per head.
int op_attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                              int nh, int nkv, int hd);
int op_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *out,
                               const float *lse, const float *q, const float *k, const float *v, int B, int T,
                               int nh, int nkv, int hd);

// ---- router -----------------------------------------------------------------------------
// logits[N,E] -> probs[N,E] = softmax, lse[N] = logsumexp(logits);
// topk_idx[N,k] / topk_w[N,k]: the k largest probs, descending, ties to the lower index;
// topk_w renormalised to sum 1 when normalize.
void op_router_forward(float *probs, float *lse, int32_t *topk_idx, float *topk_w, const float *logits, int N,
                       int E, int k, bool normalize);
// dlogits[N,E] (overwritten) from dtopk_w[N,k] (through the top-k selection and optional
// renormalisation), plus dprob[E] added to every token's dprobs (load balancing), plus
// z_coef * d(lse^2)/dlogits (router z-loss, z_coef = weight / N).
void op_router_backward(float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                        const int32_t *topk_idx, const float *topk_w, const float *dprob, float z_coef, int N, int E,
                        int k, bool normalize);

// ---- MoE dispatch -----------------------------------------------------------------------
// Groups the N*k (token, slot) pairs by expert, tokens in order inside each expert:
// expert_offsets[E+1] (rows of expert e are [off[e], off[e+1])), row_token[N*k] (token of
// each permuted row), row_of_slot[N*k] (permuted row of pair (n, j)).
void op_moe_plan(int32_t *expert_offsets, int32_t *row_token, int32_t *row_of_slot, const int32_t *topk_idx, int N,
                 int E, int k);
// dst[n, :] = src[rows[n], :], n < count; rows of width H.
void op_gather_rows(float *dst, const float *src, const int32_t *rows, int count, int H);
// out[n] = resid[n] + sum_j w[n,j] * y[row_of_slot[n*k+j]]   (y [N*k, H] in permuted order; resid
// may be out), added j in order onto resid's value
void op_moe_combine(float *out, const float *resid, const float *y, const float *w, const int32_t *row_of_slot, int N,
                    int k, int H);
// dy[row_of_slot[n*k+j]] = w[n,j] * dout[n];  dw[n,j] = dot(dout[n], y[row_of_slot[n*k+j]])
void op_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const float *w,
                             const int32_t *row_of_slot, int N, int k, int H);
// dx[n] += sum_j dxe[row_of_slot[n*k+j]]   (dxe [N*k, H] in permuted order)
void op_moe_uncombine_add(float *dx, const float *dxe, const int32_t *row_of_slot, int N, int k, int H);

// ---- SwiGLU -----------------------------------------------------------------------------
// gu[R, 2*hidden] holds gate(x) | up(x) side by side (one GEMM against the stacked [gate; up]).
// a[R, hidden] = silu(gate) * up
void op_swiglu_forward(float *a, const float *gu, int R, int hidden);
// dgu[R, 2*hidden] (overwritten, may alias gu) from da[R, hidden]
void op_swiglu_backward(float *dgu, const float *da, const float *gu, int R, int hidden);

// ---- cross-entropy + z-loss over logits rows --------------------------------------------
// For each row r with targets[r] != IGNORE_INDEX: lse[r] = logsumexp(logits[r]),
// ce[r] = lse - logits[r, target]. Rows with ignored targets get ce = lse = 0.
// When grad: logits[r] is overwritten with dL/dlogits for
//   L = ce_scale * sum_r ce[r] + z_scale * sum_r lse[r]^2   (ignored rows: zeros).
// Rows are ld >= V floats apart; columns [V, ld) are left alone.
void op_cross_entropy_rows(float *logits, int ld, float *ce, float *lse, const int32_t *targets, int R, int V,
                           float ce_scale, float z_scale, bool grad);

// ---- experts, reductions, AdamW (the cpu backend's entries of the same names) -------------
#include "ops/backend.h"
// Every expert's SwiGLU MLP on its rows / its backward (ExpertsArgs in ops/backend.h). With
// E >= 2 x threads, threads take whole experts (largest first), each GEMM single-threaded.
void op_experts_forward(const ExpertsArgs *a);
void op_experts_backward(const ExpertsArgs *a);
// *out = sum_i x[i] (or x[i]^2), in order, in double.
void op_sum(double *out, const float *x, size_t n, bool squares);
// out[e] = (sum_n x[n,e]) / N in order, in double.
void op_column_means(double *out, const float *x, int N, int E);
// *out = sum_i x[i]^2 in double over fixed blocks summed in order: the same for every thread count.
void op_grad_sum_squares(double *out, const float *x, size_t n);
// AdamW over `count` tensors in one parallel region (torch's single-tensor arithmetic).
void op_adamw(const AdamWTensor *t, int count, const AdamWScalars *s);

// ---- OpenBLAS kernel selection ------------------------------------------------------------
// Older OpenBLAS releases (Debian 12 ships 0.3.21) do not recognise recent CPUs (e.g. Intel
// Sapphire Rapids) and fall back to their Prescott (SSE3) kernels, 3-5x slower. OpenBLAS
// reads OPENBLAS_CORETYPE only when it loads, so a program that finds itself on that
// fallback on an AVX2/AVX-512 CPU re-executes itself once (argv kept) with the matching
// core type. Returns only when nothing needed doing or the re-exec failed (then it warns).
void op_blas_ensure_fast_kernels(char **argv);
const char *op_blas_core_name(void);
