// The backend interface: every numeric step of the model, the trainer, eval and generation
// goes through one table of functions (BackendOps), chosen at run time (`device: cpu | cuda`).
// The model is written once against this page; to add a backend, fill the table.
//
//   cpu   src/ops/cpu/   fp32, OpenMP + OpenBLAS; bit-exact for a fixed thread count. Its
//                        kernels (src/ops/cpu/cpu_ops.h) are the reference every other
//                        backend is tested against.
//   cuda  src/ops/cuda/  bf16/fp16/fp32 compute, fp32 master weights, cuBLASLt GEMMs.
//
// Memory. A backend owns its buffers: pointers passed to ops are backend memory (device
// memory on cuda, plain host memory on cpu). The host reaches them only through upload /
// download (no-ops when both sides are the same pointer on cpu). Values the host needs
// (losses, router statistics, grad norms) are written by ops into small backend buffers and
// downloaded once per step.
//
// Types. Float data is passed as a Buf: a pointer plus its NumType. Which buffers use the
// compute type is the model's plan (src/model/model_acts.c): GEMM operands and their outputs
// in `be->compute`, the residual stream, norm statistics, router, loss rows and gradients of
// parameters always in fp32. The cpu backend's compute type is fp32, so every Buf there is fp32.
// Index arrays (tokens, top-k ids, dispatch plans) are int32 backend memory.
//
// Errors. Ops return nothing: a backend records the first failure (a CUDA error, a failed
// scratch allocation) and reports it from backend_sync(), with its message set through
// spes_fail (src/base/error.h). The model checks once per forward/backward. Nothing exits.
//
// Determinism. Every reduction runs in a fixed order (no float atomics): the same inputs on
// the same backend and device give the same bits, so training and resume are reproducible.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- types ------------------------------------------------------------------------------
typedef enum { NUM_F32 = 0, NUM_BF16, NUM_F16 } NumType;
size_t num_type_size(NumType t);        // 4, 2, 2
const char *num_type_name(NumType t);   // "f32", "bf16", "f16"

// A typed pointer into backend memory.
typedef struct {
    void *p;
    NumType t;
} Buf;

static inline Buf buf_f32(float *p) { return (Buf){p, NUM_F32}; }
static inline Buf buf_of(void *p, NumType t) { return (Buf){p, t}; }
// The buffer `elems` elements further on (elems may be 0; NULL stays NULL).
static inline Buf buf_at(Buf b, size_t elems) {
    return (Buf){b.p ? (char *)b.p + elems * num_type_size(b.t) : NULL, b.t};
}

// The reference's `precision` key. Mixed precision keeps fp32 master weights and moments;
// amp_fp16 needs dynamic loss scaling (src/train/loss_scale.h).
typedef enum { PRECISION_FP32 = 0, PRECISION_AMP_BF16, PRECISION_AMP_FP16 } Precision;
const char *precision_name(Precision p);          // "fp32", "amp_bf16", "amp_fp16"
int precision_from_name(const char *s, Precision *out);

typedef struct Backend Backend;

// ---- grouped expert GEMMs ----------------------------------------------------------------
// Rows of expert e are [offsets[e], offsets[e+1]) of every [NK, *] buffer (dispatch order,
// see moe_plan). offsets live on the HOST (read back once per MoE layer forward, reused by
// its backward). gate_up[e] is the expert's stacked [gate; up] weight [2I, H], down[e] is
// [H, I] (compute copies). (I is `hidden`: complex.h, pulled in by cblas.h, defines I.)
typedef struct {
    int E, H, hidden;
    const int32_t *offsets;    // [E+1] host
    const Buf *gate_up;        // [E]
    const Buf *down;           // [E]
    Buf xe;                    // [NK, H]  gathered expert inputs
    Buf gu;                    // [NK, 2I] gate | up outputs (overwritten by their gradient in backward)
    Buf act;                   // [NK, I]  silu(gate) * up
    Buf y;                     // [NK, H]  expert outputs
    // backward only:
    Buf dy;                    // [NK, H]  in: dL/dy; out: dL/dxe
    Buf da;                    // [NK, I]  scratch
    float *const *dgate_up;    // [E] fp32 gradient of [gate; up] ([2I, H], gate then up adjacent) or NULL
    float *const *dgate;       // [E] used when dgate_up[e] is NULL: gradient of gate [I, H] or NULL (frozen)
    float *const *dup;         // [E] gradient of up [I, H] or NULL
    float *const *ddown;       // [E] gradient of down [H, I] or NULL
} ExpertsArgs;

// ---- AdamW -------------------------------------------------------------------------------
// One trainable tensor of a multi-tensor AdamW step (torch's single-tensor AdamW arithmetic,
// every scalar in float, see src/train/optimizer.c):
//   g *= grad_scale; p *= decay_mul; m = m + w1*(g - m); v = v*beta2 + w2*g*g;
//   p += neg_step_size * m / (sqrt(v)/bc2_sqrt + eps); compute = (compute type) p
typedef struct {
    float *p;                  // fp32 master
    const float *g;
    float *m, *v;
    Buf compute;               // low-precision copy written from the new p; .p NULL when none
    size_t n;
    float decay_mul;           // 1 - lr*wd for decaying tensors, 1 otherwise
} AdamWTensor;

typedef struct {
    float w1, beta2, w2, bc2_sqrt, eps, neg_step_size;
    // The gradient clipping (and fp16 loss unscaling) factor, applied as the gradient is read:
    // the same float product a separate scaling pass would store, without that pass over the
    // gradients (a read and a write of 4 bytes a parameter). 1 when there is none.
    float grad_scale;
} AdamWScalars;

// ---- QK-norm rows ----------------------------------------------------------------------------
// The RMSNorm rows of qk_norm_rope_forward/backward over B*T tokens of nh heads of hd values:
// a row of nh*hd per token, or (per_head) a row of hd per head.
typedef struct {
    int rows, width;
} QkNormRows;
static inline QkNormRows qk_norm_rows(int B, int T, int nh, int hd, bool per_head) {
    return per_head ? (QkNormRows){B * T * nh, hd} : (QkNormRows){B * T, nh * hd};
}

// ---- the table ---------------------------------------------------------------------------
typedef struct {
    // memory
    int (*alloc)(Backend *be, size_t bytes, void **out);      // zeroed; SPES_ERR with a message
    void (*free)(Backend *be, void *p);
    // Host memory for the host side of uploads/downloads (page-locked on cuda, so copies run
    // at full bus speed; plain aligned memory on cpu). Zeroed.
    int (*host_alloc)(Backend *be, size_t bytes, void **out);
    void (*host_free)(Backend *be, void *p);
    int (*upload)(Backend *be, void *dst, const void *host_src, size_t bytes);
    int (*download)(Backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(Backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(Backend *be, void *dst, size_t bytes);
    // dst[i] = src[i] for i < n, converting types (fp32 master -> bf16 compute copy).
    void (*convert)(Backend *be, Buf dst, Buf src, size_t n);
    // Waits for queued work; SPES_ERR (message set) if any op since the last call failed.
    int (*sync)(Backend *be);
    // Bytes in use now and the peak since open (0 when the backend does not track them).
    void (*memory)(Backend *be, size_t *in_use, size_t *peak);
    void (*close)(Backend *be);

    // GEMM: C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, op(X) = X^T when trans_x;
    // row-major, lda/ldb/ldc row strides as stored; beta == 0 ignores C (even NaN).
    // Accumulation in fp32 whatever the operand types. A and B may differ in type (an fp32
    // gradient against a bf16 weight): the backend then converts the fp32 one to the other's
    // type (through its own scratch) before multiplying. C may be fp32 with bf16/f16 A and B.
    void (*gemm)(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda, Buf B,
                 int ldb, float beta, Buf C, int ldc);
    // D[M,N] = alpha * op(A) @ op(B) + R: a GEMM with beta 1 whose addend R is its own buffer
    // (same type and row stride as D; R may be D), so a residual stream is not copied into D
    // first. The same bits as copying R into D and calling gemm with beta 1.
    void (*gemm_residual)(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha, Buf A, int lda,
                          Buf B, int ldb, Buf R, Buf D, int ldd);
    // Every expert's SwiGLU MLP on its rows: gu = xe @ gate_up^T; act = silu(gate)*up; y = act @ down^T.
    void (*experts_forward)(Backend *be, const ExpertsArgs *a);
    // From dy: dW of trainable experts (added), dy overwritten with dL/dxe; frozen experts pass dX only.
    void (*experts_backward)(Backend *be, const ExpertsArgs *a);

    // y[n] += x[n]
    void (*add_inplace)(Backend *be, Buf y, Buf x, size_t n);
    // dst[r, 0:cols] = src[r, 0:cols], rows strided (types may differ).
    void (*copy_2d)(Backend *be, Buf dst, int dst_stride, Buf src, int src_stride, int rows, int cols);
    // out[N,H] = table[tokens[n], :]
    void (*embedding_forward)(Backend *be, Buf out, const float *table, const int32_t *tokens, int N, int H);
    // dtable[tokens[n], :] += dout[n, :], tokens in order (fixed-order: no atomics)
    void (*embedding_backward)(Backend *be, float *dtable, Buf dout, const int32_t *tokens, int N, int H);
    // R rows of width C: rstd[r] = 1/sqrt(mean(x[r]^2) + eps), y[r] = x[r]*rstd[r]*w (w[C] fp32).
    void (*rmsnorm_forward)(Backend *be, Buf y, float *rstd, Buf x, const float *w, int R, int C, float eps);
    // dx (+= when accumulate) from dy; dw[C] += sum_r dy*x*rstd when dw != NULL (fixed order).
    // dx may alias dy when !accumulate.
    void (*rmsnorm_backward)(Backend *be, Buf dx, float *dw, Buf dy, Buf x, const float *w, const float *rstd, int R,
                             int C, bool accumulate);
    // cos/sin [T, hd/2]: inv_freq[i] = theta^(-2i/hd), angle = t*inv_freq[i] (fp32 as HF).
    void (*rope_tables)(Backend *be, float *cos_t, float *sin_t, int T, int hd, float theta);
    // x[B,T,nh,hd] in place, rotate-half; cos/sin rows 0..T-1 (pass tables offset by the first position).
    void (*rope_forward)(Backend *be, Buf x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);
    void (*rope_backward)(Backend *be, Buf dx, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);
    // QK-norm and RoPE of q (or k) in one op, read straight out of the joined q|k|v projection:
    // x holds B*T tokens of nh*hd values, ldx apart. x_copy [B*T, nh*hd] (dense) keeps x for the
    // backward; y [B*T, nh*hd] = rope(rmsnorm(x) * w). per_head: a norm row per head (rstd
    // [B*T*nh], w [hd]), else per token (rstd [B*T], w [nh*hd]). The same bits as copy_2d into
    // x_copy, rmsnorm_forward from it into y and rope_forward on y (which the cpu runs).
    void (*qk_norm_rope_forward)(Backend *be, Buf y, Buf x_copy, float *rstd, Buf x, int ldx, const float *w,
                                 const float *cos_t, const float *sin_t, int B, int T, int nh, int hd, bool per_head,
                                 float eps);
    // Its backward: dy [B*T, nh*hd] (the gradient of y; clobbered) -> dx, tokens lddx apart (into
    // the joined gradient), dw += (NULL: frozen); x is forward's x_copy. The same bits as
    // rope_backward on dy, rmsnorm_backward in place and copy_2d into dx.
    void (*qk_norm_rope_backward)(Backend *be, Buf dx, int lddx, float *dw, Buf dy, Buf x, const float *w,
                                  const float *rstd, const float *cos_t, const float *sin_t, int B, int T, int nh,
                                  int hd, bool per_head);
    // Causal GQA attention. q[B,Tq,nh,hd]; k,v[B,Tk,nkv,hd] with Tq <= Tk: query i sits at
    // position Tk-Tq+i and sees keys 0..Tk-Tq+i (Tq == Tk in training; Tq < Tk reads a KV
    // cache). out[B,Tq,nh,hd], lse[B,nh,Tq] (logsumexp of the scaled scores, for the backward).
    // No [Tq,Tk] matrix is ever held for a whole head.
    void (*attention_forward)(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int Tq, int Tk, int nh,
                              int nkv, int hd);
    // Tq == Tk == T. dq[B,T,nh,hd], dk, dv[B,T,nkv,hd] (overwritten) from dout.
    void (*attention_backward)(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, const float *lse, Buf q, Buf k,
                               Buf v, int B, int T, int nh, int nkv, int hd);
    // logits[N,E] fp32 -> probs = softmax, lse = logsumexp; top-k (descending, ties to the
    // lower index), topk_w renormalised when normalize.
    void (*router_forward)(Backend *be, float *probs, float *lse, int32_t *topk_idx, float *topk_w,
                           const float *logits, int N, int E, int k, bool normalize);
    // dlogits[N,E] (overwritten) from dtopk_w[N,k], plus dprob[E] (host array: load
    // balancing) added to every token's dprobs, plus z_coef * d(lse^2)/dlogits.
    void (*router_backward)(Backend *be, float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                            const int32_t *topk_idx, const float *topk_w, const float *dprob, float z_coef, int N,
                            int E, int k, bool normalize);
    // Groups the N*k (token, slot) pairs by expert, tokens in order inside each expert:
    // offsets[E+1], row_token[N*k] (token of each permuted row), row_of_slot[N*k].
    void (*moe_plan)(Backend *be, int32_t *offsets, int32_t *row_token, int32_t *row_of_slot, const int32_t *topk_idx,
                     int N, int E, int k);
    // dst[n, :] = src[rows[n], :], n < count; rows of width H.
    void (*gather_rows)(Backend *be, Buf dst, Buf src, const int32_t *rows, int count, int H);
    // out[n] = resid[n] + sum_j w[n,j] * y[row_of_slot[n*k+j]]; resid has out's type and may be out
    // (the MoE block adds its experts to the residual stream without a copy of it first).
    void (*moe_combine)(Backend *be, Buf out, Buf resid, Buf y, const float *w, const int32_t *row_of_slot, int N,
                        int k, int H);
    // dy[row_of_slot[n*k+j]] = w[n,j] * dout[n]; dw[n,j] = dot(dout[n], y[row_of_slot[n*k+j]])
    void (*moe_combine_backward)(Backend *be, Buf dy, float *dw, Buf dout, Buf y, const float *w,
                                 const int32_t *row_of_slot, int N, int k, int H);
    // dx[n] += sum_j dxe[row_of_slot[n*k+j]]
    void (*moe_uncombine_add)(Backend *be, Buf dx, Buf dxe, const int32_t *row_of_slot, int N, int k, int H);
    // Rows of logits[R,V] (row stride ld >= V) with targets[r] != IGNORE_INDEX: lse = logsumexp,
    // ce = lse - logit[target]; ignored rows ce = lse = 0. With grad, logits become dL/dlogits of
    // ce_scale*sum ce + z_scale*sum lse^2 (ignored rows: zeros). Statistics in fp32. Columns
    // [V, ld) of a row (the padding of a padded stride) are never read or written.
    void (*cross_entropy_rows)(Backend *be, Buf logits, int ld, float *ce, float *lse, const int32_t *targets, int R,
                               int V, float ce_scale, float z_scale, bool grad);

    // ---- reductions the host reads back (fixed order; double results in backend memory) ----
    // out[0] = sum_i x[i] (squares: x[i]^2), i in order, accumulated in double.
    void (*sum)(Backend *be, double *out, const float *x, size_t n, bool squares);
    // out[e] = (sum_n x[n,e]) / N, n in order, in double (router: mean probability per expert).
    void (*column_means)(Backend *be, double *out, const float *x, int N, int E);
    // *host_out = sum_i x[i]^2 over a (large) gradient buffer, in fixed blocks, in double, read
    // back to the host (waits for the queued work). No allocation per call (a cudaMalloc a step
    // on a GPU): cuda keeps the sum in its reduction scratch. SPES_ERR with a message when the
    // backend failed (on cuda: any op queued before it).
    int (*grad_sum_squares)(Backend *be, const float *x, size_t n, double *host_out);
    // One AdamW update of `count` tensors (one launch / one parallel region).
    void (*adamw)(Backend *be, const AdamWTensor *t, int count, const AdamWScalars *s);

    // ---- a second queue, beside the main one ----
    // For work that may run while the main queue goes on: one step's AdamW, part by part, under
    // the next step's forward (src/train/overlap_step.h). Between aux_begin and aux_end every op
    // queues on the aux queue, after everything the main queue held at aux_begin. aux_mark(point)
    // records a point on it; aux_wait(point) makes the main queue wait for the last mark of that
    // point (none yet: no wait). Points are 0 .. BACKEND_AUX_POINTS - 1. sync waits for both
    // queues. Only ops that share no scratch with the main queue's may go there: AdamW (a scratch
    // slot of its own on cuda) and zero. cpu: one queue, in order, so all four do nothing.
    void (*aux_begin)(Backend *be);
    void (*aux_end)(Backend *be);
    void (*aux_mark)(Backend *be, int point);
    void (*aux_wait)(Backend *be, int point);
} BackendOps;

#define BACKEND_AUX_POINTS 1024

struct Backend {
    const BackendOps *ops;
    const char *name;          // "cpu", "cuda"
    bool host_memory;          // buffers are host memory: upload/download of the same pointer is free
    Precision precision;
    NumType compute;           // type of GEMM operands and activations (fp32 on cpu)
    int device;                // GPU index, -1 on cpu
    char description[160];     // shown on the console: "cpu (2 threads)", "cuda:0 NVIDIA H100 (sm_90, 79 GiB)"
    // The LM head's logits block (src/model/model_acts.c). Its row stride is the vocabulary
    // rounded up to a multiple of logits_align elements: a GPU wants every row 16-byte aligned
    // for its GEMMs and vector loads (the reference 1B vocabulary, 151665, is odd). It holds
    // as many rows as fit in logits_block_bytes; 0 keeps the fixed 512-row block, whose order
    // of dW sums the cpu's results (and golden checkpoints) are made of.
    int logits_align;          // 1 on cpu, 128 on cuda
    size_t logits_block_bytes; // 0 on cpu
    void *impl;                // the backend's own state
};

// ---- opening a backend ----------------------------------------------------------------
// device: "auto" (cuda:0 when this binary has CUDA and a GPU is visible, else cpu), "cpu",
// "cuda" (= cuda:0) or "cuda:N". Asking for cuda without a GPU or without a CUDA build is an
// error that says which. precision other than fp32 on cpu: a warning, the run is fp32.
int backend_open(const char *device, Precision precision, Backend **out);
// The same for rank `local_rank` of a node: "auto" (with GPUs visible) and "cuda" open GPU
// local_rank instead of GPU 0 (an explicit cuda:N is taken as given). backend_open is rank 0.
int backend_open_for_rank(const char *device, int local_rank, Precision precision, Backend **out);
// Checks a device name without opening anything: *cuda_index is the GPU index of cuda /
// cuda:N, or BACKEND_DEVICE_AUTO / BACKEND_DEVICE_CPU. SPES_ERR (message set) for anything else.
#define BACKEND_DEVICE_AUTO (-2)
#define BACKEND_DEVICE_CPU (-1)
int backend_parse_device(const char *device, int *cuda_index);
void backend_close(Backend *be);
// A backend of this kind as the model's memory plan sees it, without opening one (spes plan
// lays out a GPU's activations on any machine): name, host_memory, precision, compute type and
// the logits block's layout; ops, device and impl stay NULL / -1. The cuda backend opens with
// these same values, and the cpu backend's are these too.
void backend_plan_traits(bool gpu, Precision precision, Backend *out);
// The memory the backend can still allocate and its total, in bytes: the GPU's free and total
// memory on cuda; on cpu what this process may still allocate of the host's and its total
// (base/host_memory.h: MemAvailable, a cgroup's limit, `ulimit -v`, whichever is tightest).
int backend_device_memory(Backend *be, size_t *free_bytes, size_t *total_bytes);
// The backends compiled in, e.g. "cpu cuda(sm_80,sm_89,sm_90)".
const char *backend_compiled(void);
// The process-wide cpu backend (never closed; what code without a device choice uses).
Backend *backend_cpu(void);

// Convenience wrappers over the table (backend.c).
int backend_alloc(Backend *be, size_t bytes, void **out);
void backend_free(Backend *be, void *p);
int backend_sync(Backend *be);
// torch.nn.Linear shapes, x [N,in], W [out,in]: y[N,out] = x @ W^T (+ y when accumulate)
void linear_forward(Backend *be, Buf y, Buf x, Buf W, int N, int in, int out, bool accumulate);
// y[N,out] = resid[N,out] + x @ W^T (resid may be y)
void linear_forward_residual(Backend *be, Buf y, Buf resid, Buf x, Buf W, int N, int in, int out);
// dx[N,in] (+)= dy[N,out] @ W[out,in]
void linear_backward_input(Backend *be, Buf dx, Buf dy, Buf W, int N, int in, int out, bool accumulate);
// dW[out,in] += dy[N,out]^T @ x[N,in]; dy rows have stride ldy
void linear_backward_weight(Backend *be, float *dW, Buf dy, int ldy, Buf x, int N, int in, int out);
