// Causal GQA attention through cuDNN's fused flash attention (SDPA forward and backward),
// behind cuda_attention_forward / cuda_attention_backward (attention.cu), which try it first
// for bf16/f16, Tq == Tk, hd 64 or 128 and run our own kernels otherwise.
//
// Which cuDNN API. cuDNN 9 offers two ways to its fused attention from C:
//  (a) the operation-graph "pattern" cudnn-frontend (the C++ header library llm.c and
//      PyTorch use) lowers its sdpa()/sdpa_backward() nodes to on cuDNN 9.0-9.20: matmul,
//      pointwise scale, a causal mask of GEN_INDEX + CMP_GE + BINARY_SELECT, softmax spelled
//      as reductions and pointwise ops with the stats output, matmul; the backward likewise.
//      cuDNN's fused-attention engines recognise that graph.
//  (b) the dedicated CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD descriptors of recent cuDNN.
// We build (a): (b) has no causal attribute in 9.19's headers (the frontend expresses causal
// masks there through a score-modifier subgraph that needs cuDNN 9.21), and the GPU machine's
// runtime may be any 9.x. (a) is what every released cudnn-frontend emits for cuDNN 9 on
// Hopper, so it is the graph cuDNN's SDPA engines are tested against. The graphs below follow
// cudnn-frontend 1.10+ (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h,
// utils/attn_score_modifiers.h, node/softmax.h): same operations, order, data types,
// virtual/non-virtual tensors; written from reading it, in plain backend-API C. Should cuDNN
// refuse that graph, the form cudnn-frontend 1.8 emitted (the one cuDNN 9.0-9.5 shipped
// against: int32 index generators, the lowest float as mask value, the backward masking
// before subtracting the stats and multiplying dP by a unit dropout mask) is tried next; the
// plan's console line says when that happened.
//
// Layouts: our BSHD buffers are described to cuDNN by strides, no transposes:
//   Q  [B,nh,T,hd]  strides (T*nh*hd, hd, nh*hd, 1)        (out, dout, dq the same)
//   K^T[B,nkv,hd,T] strides (T*nkv*hd, hd, 1, nkv*hd)      (the backward's V^T the same)
//   V  [B,nkv,T,hd] strides (T*nkv*hd, hd, nkv*hd, 1)      (dk, dv the same)
//   Stats [B,nh,T,1] strides (nh*T, T, 1, 1) fp32 = our lse[B,nh,T].
// GQA: query head h reads kv head h/(nh/nkv) in cuDNN (consecutive heads share, "b (hk g)")
// as in ours; the backward's dK/dV are the full-head products reduced over each group.
// Stats: the softmax node's max + log(sum exp(s - max)) of the scaled, masked scores in
// natural log, which is our lse exactly: the forward writes it and the backward reads ours.
//
// Determinism (backend.h: same inputs, same bits). The backward is built the way
// cudnn-frontend builds it for set_deterministic_algorithm(true) on sm_80-sm_90: dQ is the
// dS.K product itself (no fp32 dQ accumulator that thread blocks add into with atomics), and
// an engine whose numerical notes say NONDETERMINISTIC is never taken. That is the default.
// SPES_CUDNN_NONDETERMINISTIC=1 (or cuda_cudnn_attention_set_deterministic(false)) builds the
// frontend's default graph instead: dQ accumulated in an fp32 workspace tensor, then copied
// out; faster in cuDNN's own figures, not reproducible bit for bit. On Blackwell (sm_100+)
// cuDNN's deterministic backward needs engine knobs we do not set: the backward runs our
// kernel there unless the non-deterministic one is asked for.
//
// Versions (cudnnGetVersion at run time; libcudnn.so.9 means 9.x): 9.0+ for these graphs;
// 9.10.0 and 9.10.1 are skipped (cuDNN's SDPA bugs there, as the frontend does); up to 9.15
// the backward needs T % 128 == 0 (the frontend adds a padding mask for other T; we do not).
//
// Plans: built once per (direction, B, T, nh, nkv, hd, type, determinism) and cached on the
// backend (CudaCudnn, freed at close), as llm.c caches its graphs; at most kMaxPlans (48) of
// them, then new shapes run ours (eval prompts of every length). A shape whose graph cuDNN
// rejects is cached as rejected and runs our kernel, after one console line naming the cuDNN
// call, its status and cuDNN's own last error message. Workspace: the CUDA_SCRATCH_CUDNN slot
// (cuda_scratch_slot), holding the backward's softmax_sum tensor (and dQ accumulator) and the
// engine's workspace (its size is in the plan's console line: the deterministic backward
// keeps dP there, B*nh*T*T*2 bytes on Hopper as cuDNN's own H200 figures show, 768 MiB at the
// 1B config; over half the free memory, the shape runs ours). An execution that fails to launch also falls back (and is logged); a
// sticky CUDA error after it is recorded through cuda_record_failure.
//
// Console: "attention: cuDNN 9.x.y (built for CUDA ..) from PATH" once per backend, then one
// line per plan (shape, engine, workspace, build time); when cuDNN is not used, one line with
// the reason (library not found with what was tried, version, a version/arch limit for this
// shape, or the cuDNN call that refused: call, status, cuDNN's last error message).
#include <cuda_runtime.h>
#pragma GCC visibility push(hidden)
#include <cudnn_graph.h>
#pragma GCC visibility pop

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cudnn_attention.h"
extern "C" {
#include "base/log.h"
}

// Deprecated names in cuDNN 9.19's headers (a device-properties descriptor may replace the
// handle there), still what every 9.x accepts: by number, so -Werror stays quiet.
static const cudnnBackendAttributeName_t kOpGraphHandle = (cudnnBackendAttributeName_t)800;  // OPERATIONGRAPH_HANDLE
static const cudnnBackendAttributeName_t kPlanHandle = (cudnnBackendAttributeName_t)400;     // EXECUTION_PLAN_HANDLE

// Non-virtual tensors' UIDs (the variant pack's keys); virtual tensors count from 100.
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_SCALE, UID_ONE, UID_NEG, UID_SOFTMAX_SUM, UID_DQ_ACCUM,
};

struct CudnnPlan {
    int key[9];
    bool usable;
    cudnnBackendDescriptor_t plan;
    std::vector<cudnnBackendDescriptor_t> owned;   // every descriptor the plan was built from
    int64_t workspace;                             // the engine's, bytes
    int64_t engine;                                // global engine index (for the log)
    int style;                                     // Shape.style of the graph cuDNN took
    char why[1200];                                // when not usable: why (reported again on every call)
    bool failed;                                   // ... and whether a cuDNN call failed
};

struct CudaCudnn {
    cudnnHandle_t handle;
    bool handle_tried;
    size_t version;
    std::vector<CudnnPlan *> plans;
};

namespace {

// snprintf whose truncation of long cuDNN messages is intended (and not a -Wformat-truncation error).
void fmt(char *buf, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
void fmt(char *buf, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, cap, f, ap);
    va_end(ap);
}

// ---- settings and the last decision ---------------------------------------------------------
int g_deterministic = -1;   // -1: not yet read from SPES_CUDNN_NONDETERMINISTIC

bool deterministic_now() {
    if (g_deterministic < 0) {
        const char *e = getenv("SPES_CUDNN_NONDETERMINISTIC");
        g_deterministic = (e && e[0] && strcmp(e, "0") != 0) ? 0 : 1;
    }
    return g_deterministic == 1;
}

struct Fallback {
    char why[1200];
    bool failed;
};
Fallback g_last[2];   // [0] forward, [1] backward

// The call falls back: remembered for cuda_cudnn_attention_last_fallback; logged when `log`.
bool fall_back(bool backward, bool failed, bool log, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
bool fall_back(bool backward, bool failed, bool log, const char *fmt, ...) {
    Fallback *f = &g_last[backward ? 1 : 0];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->why, sizeof f->why, fmt, ap);
    va_end(ap);
    f->failed = failed;
    if (log)
        log_message(failed ? LOG_WARN : LOG_INFO, "attention %s: cuDNN not used, our kernel runs: %s%s",
                    backward ? "backward" : "forward", f->why,
                    failed ? " (CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr shows cuDNN's own log)" : "");
    return false;
}

// "STATUS_NAME (cuDNN: its last error message)"
void status_words(cudnnStatus_t st, char *buf, size_t cap) {
    char last[600];
    cudnnGetLastErrorString(last, sizeof last);
    fmt(buf, cap, "%s%s%.600s%s", cudnnGetErrorString(st), last[0] ? " (cuDNN: " : "", last, last[0] ? ")" : "");
}

// ---- graph building -----------------------------------------------------------------------
// Every call is checked; the first failure stops the build and is kept, naming the call,
// the descriptor and attribute, and cuDNN's status with its message.
struct Builder {
    cudnnHandle_t handle;
    std::vector<cudnnBackendDescriptor_t> owned;
    std::vector<cudnnBackendDescriptor_t> ops;
    int64_t next_uid = 100;
    bool ok = true;
    char err[1100] = "";

    void fail(const char *call, const char *what, cudnnStatus_t st) {
        if (!ok) return;
        ok = false;
        char words[800];
        status_words(st, words, sizeof words);
        fmt(err, sizeof err, "%s(%s): %s", call, what, words);
    }
    cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const char *what) {
        if (!ok) return nullptr;
        cudnnBackendDescriptor_t d = nullptr;
        cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
        if (st != CUDNN_STATUS_SUCCESS) {
            fail("cudnnBackendCreateDescriptor", what, st);
            return nullptr;
        }
        owned.push_back(d);
        return d;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
             const void *x, const char *what, const char *attr) {
        if (!ok) return;
        cudnnStatus_t st = cudnnBackendSetAttribute(d, a, t, n, x);
        if (st != CUDNN_STATUS_SUCCESS) {
            char w[300];
            fmt(w, sizeof w, "%s, %s", what, attr);
            fail("cudnnBackendSetAttribute", w, st);
        }
    }
    void finalize(cudnnBackendDescriptor_t d, const char *what) {
        if (!ok) return;
        cudnnStatus_t st = cudnnBackendFinalize(d);
        if (st != CUDNN_STATUS_SUCCESS) fail("cudnnBackendFinalize", what, st);
    }
};
#define SET(b, d, attr, type, n, x, what) (b).set((d), attr, type, (n), (x), (what), #attr)

struct Tensor {
    cudnnBackendDescriptor_t d = nullptr;
    int64_t uid = 0;
};

Tensor tensor(Builder &b, const char *name, cudnnDataType_t dt, const int64_t dim[4], const int64_t stride[4],
              bool is_virtual, int64_t uid = 0, bool by_value = false) {
    Tensor t;
    t.uid = uid ? uid : b.next_uid++;
    t.d = b.create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    const int64_t alignment = 16;
    const bool yes = true;
    SET(b, t.d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, name);
    SET(b, t.d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, name);
    SET(b, t.d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, name);
    SET(b, t.d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid, name);
    SET(b, t.d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, name);
    if (is_virtual) SET(b, t.d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, name);
    if (by_value) SET(b, t.d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, name);
    b.finalize(t.d, name);
    return t;
}

// A virtual tensor of dims (a, b, c, d) and strides (sa, sb, sc, sd).
Tensor virt(Builder &b, const char *name, cudnnDataType_t dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
            int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    const int64_t dim[4] = {d0, d1, d2, d3}, stride[4] = {s0, s1, s2, s3};
    return tensor(b, name, dt, dim, stride, true);
}

// A float scalar passed by value at execution ([1,1,1,1], a host pointer in the variant pack).
Tensor scalar(Builder &b, const char *name, int64_t uid) {
    const int64_t one[4] = {1, 1, 1, 1};
    return tensor(b, name, CUDNN_DATA_FLOAT, one, one, false, uid, true);
}

// y = op(x [, b [, t]]) elementwise (broadcasting), computed in `prec`.
void pointwise(Builder &b, const char *name, cudnnPointwiseMode_t mode, Tensor x, const Tensor *bt,
               const Tensor *tt, Tensor y, cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = b.create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    SET(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name);
    SET(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, name);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) SET(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, name);
    b.finalize(pw, name);
    cudnnBackendDescriptor_t op = b.create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    const float alpha1 = 1.0f, alpha2 = 1.0f;
    SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, name);
    SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d, name);
    if (bt) SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bt->d, name);
    if (tt) SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tt->d, name);
    SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d, name);
    SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha1, name);
    SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha2, name);
    b.finalize(op, name);
    if (b.ok) b.ops.push_back(op);
}

// c = a @ b over the last two dims (batch dims broadcast: GQA), fp32 accumulation.
void matmul(Builder &b, const char *name, Tensor a, Tensor bb, Tensor c) {
    cudnnBackendDescriptor_t md = b.create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    SET(b, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name);
    b.finalize(md, name);
    cudnnBackendDescriptor_t op = b.create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.d, name);
    SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bb.d, name);
    SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.d, name);
    SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md, name);
    b.finalize(op, name);
    if (b.ok) b.ops.push_back(op);
}

// y = reduce(x) over the dims where y has extent 1 (or a head group, for GQA's dK/dV).
void reduction(Builder &b, const char *name, cudnnReduceTensorOp_t how, Tensor x, Tensor y) {
    cudnnBackendDescriptor_t rd = b.create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    SET(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name);
    SET(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, name);
    b.finalize(rd, name);
    cudnnBackendDescriptor_t op = b.create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, name);
    SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d, name);
    SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d, name);
    b.finalize(op, name);
    if (b.ok) b.ops.push_back(op);
}

// y = x seen with y's dims and strides (a transposed view).
void reshape(Builder &b, const char *name, Tensor x, Tensor y) {
    cudnnBackendDescriptor_t op = b.create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    SET(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d, name);
    SET(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d, name);
    b.finalize(op, name);
    if (b.ok) b.ops.push_back(op);
}

struct Shape {
    int64_t B, T, nh, nkv, hd;
    cudnnDataType_t io;   // bf16 or f16
    int style;            // 0: cudnn-frontend 1.10+'s graph; 1: 1.8's (tried when 0 is refused)
};

// Causal mask of a [B,nh,T,T] score tensor s (strides ss): keeps column <= row, else `neg`.
// The index generators compute in fp32 (frontend 1.10+, its diagonal-band mask) or int32 (1.8).
Tensor causal_mask(Builder &b, const Shape &s, Tensor x, Tensor neg) {
    const cudnnDataType_t index_prec = s.style == 0 ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT32;
    const int64_t B = s.B, T = s.T, nh = s.nh;
    const int64_t ss[4] = {nh * T * T, T * T, T, 1};
    Tensor row = virt(b, "row index", CUDNN_DATA_INT32, B, nh, T, T, ss[0], ss[1], ss[2], ss[3]);
    Tensor col = virt(b, "column index", CUDNN_DATA_INT32, B, nh, T, T, ss[0], ss[1], ss[2], ss[3]);
    Tensor keep = virt(b, "row >= column", CUDNN_DATA_BOOLEAN, B, nh, T, T, ss[0], ss[1], ss[2], ss[3]);
    Tensor y = virt(b, "masked scores", CUDNN_DATA_FLOAT, B, nh, T, T, ss[0], ss[1], ss[2], ss[3]);
    pointwise(b, "gen row index", CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, row, index_prec, 2);
    pointwise(b, "gen column index", CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, col, index_prec, 3);
    pointwise(b, "row >= column", CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
    pointwise(b, "causal select", CUDNN_POINTWISE_BINARY_SELECT, x, &neg, &keep, y);
    return y;
}

// Forward: S = Q K^T * scale, masked; P = softmax(S) with Stats = max + log(sum exp);
// O = P V (P rounded to the io type).
void build_forward(Builder &b, const Shape &s) {
    const int64_t B = s.B, T = s.T, nh = s.nh, nkv = s.nkv, hd = s.hd;
    const int64_t qd[4] = {B, nh, T, hd}, qs[4] = {T * nh * hd, hd, nh * hd, 1};
    const int64_t ktd[4] = {B, nkv, hd, T}, kts[4] = {T * nkv * hd, hd, 1, nkv * hd};
    const int64_t vd[4] = {B, nkv, T, hd}, vs[4] = {T * nkv * hd, hd, nkv * hd, 1};
    const int64_t std_[4] = {B, nh, T, 1}, sts[4] = {nh * T, T, 1, 1};
    Tensor Q = tensor(b, "Q", s.io, qd, qs, false, UID_Q);
    Tensor KT = tensor(b, "K^T", s.io, ktd, kts, false, UID_K);
    Tensor V = tensor(b, "V", s.io, vd, vs, false, UID_V);
    Tensor O = tensor(b, "O", s.io, qd, qs, false, UID_O);
    Tensor Stats = tensor(b, "Stats", CUDNN_DATA_FLOAT, std_, sts, false, UID_STATS);
    Tensor scale = scalar(b, "attn scale", UID_SCALE);
    Tensor neg = scalar(b, "mask value", UID_NEG);

    const int64_t s0 = nh * T * T, s1 = T * T;
    Tensor S = virt(b, "S = Q K^T", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    matmul(b, "bmm1 Q K^T", Q, KT, S);
    Tensor S1 = virt(b, "S * scale", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "attn scale", CUDNN_POINTWISE_MUL, S, &scale, nullptr, S1);
    Tensor S2 = causal_mask(b, s, S1, neg);
    // softmax with stats (node/softmax.h's composite form)
    Tensor M = virt(b, "row max", CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    reduction(b, "softmax max", CUDNN_REDUCE_TENSOR_MAX, S2, M);
    Tensor D = virt(b, "S - max", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "softmax sub", CUDNN_POINTWISE_SUB, S2, &M, nullptr, D);
    Tensor E = virt(b, "exp(S - max)", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "softmax exp", CUDNN_POINTWISE_EXP, D, nullptr, nullptr, E);
    Tensor Z = virt(b, "row sum", CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    reduction(b, "softmax sum", CUDNN_REDUCE_TENSOR_ADD, E, Z);
    Tensor logZ = virt(b, "log(sum)", CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    pointwise(b, "softmax log", CUDNN_POINTWISE_LOG, Z, nullptr, nullptr, logZ);
    pointwise(b, "softmax stats", CUDNN_POINTWISE_ADD, M, &logZ, nullptr, Stats);
    Tensor P = virt(b, "P", s.io, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "softmax div", CUDNN_POINTWISE_DIV, E, &Z, nullptr, P);
    matmul(b, "bmm2 P V", P, V, O);
}

// Backward (FlashAttention-2 as cuDNN spells it): softmax_sum = rowsum(dO*O); P = exp(S*scale
// - Stats) masked; dV = P^T dO; dS = P (dO V^T - softmax_sum) * scale; dK = dS^T Q; dQ = dS K.
// GQA: dK and dV are computed per query head, then summed over each group.
void build_backward(Builder &b, const Shape &s, bool deterministic) {
    const int64_t B = s.B, T = s.T, nh = s.nh, nkv = s.nkv, hd = s.hd;
    const int64_t qd[4] = {B, nh, T, hd}, qs[4] = {T * nh * hd, hd, nh * hd, 1};
    const int64_t ktd[4] = {B, nkv, hd, T}, kts[4] = {T * nkv * hd, hd, 1, nkv * hd};
    const int64_t kd[4] = {B, nkv, T, hd}, ks[4] = {T * nkv * hd, hd, nkv * hd, 1};
    const int64_t std_[4] = {B, nh, T, 1}, sts[4] = {nh * T, T, 1, 1};
    Tensor Q = tensor(b, "Q", s.io, qd, qs, false, UID_Q);
    Tensor KT = tensor(b, "K^T", s.io, ktd, kts, false, UID_K);
    Tensor VT = tensor(b, "V^T", s.io, ktd, kts, false, UID_V);
    Tensor O = tensor(b, "O", s.io, qd, qs, false, UID_O);
    Tensor dO = tensor(b, "dO", s.io, qd, qs, false, UID_DO);
    Tensor Stats = tensor(b, "Stats", CUDNN_DATA_FLOAT, std_, sts, false, UID_STATS);
    Tensor dQ = tensor(b, "dQ", s.io, qd, qs, false, UID_DQ);
    Tensor dK = tensor(b, "dK", s.io, kd, ks, false, UID_DK);
    Tensor dV = tensor(b, "dV", s.io, kd, ks, false, UID_DV);
    Tensor scale = scalar(b, "attn scale", UID_SCALE);
    Tensor one = scalar(b, "one", UID_ONE);
    Tensor neg = scalar(b, "mask value", UID_NEG);
    const int64_t s0 = nh * T * T, s1 = T * T;

    // softmax_sum = rowsum(dO * O) * 1, a non-virtual fp32 tensor in our workspace
    Tensor dOO = virt(b, "dO * O", CUDNN_DATA_FLOAT, B, nh, T, hd, nh * T * hd, T * hd, nh * hd, 1);
    pointwise(b, "mul dO O", CUDNN_POINTWISE_MUL, dO, &O, nullptr, dOO);
    Tensor rs = virt(b, "rowsum(dO * O)", CUDNN_DATA_FLOAT, B, nh, T, 1, nh * T, T, 1, 1);
    reduction(b, "reduce dO O", CUDNN_REDUCE_TENSOR_ADD, dOO, rs);
    Tensor ssum = tensor(b, "softmax_sum", CUDNN_DATA_FLOAT, std_, sts, false, UID_SOFTMAX_SUM);
    pointwise(b, "scale dropout inv", CUDNN_POINTWISE_MUL, rs, &one, nullptr, ssum);

    // P = exp(S * scale - Stats), masked
    Tensor S = virt(b, "S = Q K^T", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    matmul(b, "matmul Q K^T", Q, KT, S);
    Tensor S1 = virt(b, "S * scale", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "mul S attn scale", CUDNN_POINTWISE_MUL, S, &scale, nullptr, S1);
    // style 0: subtract the stats, then mask; style 1 (frontend 1.8): mask, then subtract
    Tensor S3;
    if (s.style == 0) {
        Tensor S2 = virt(b, "S - Stats", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
        pointwise(b, "sub S Stats", CUDNN_POINTWISE_SUB, S1, &Stats, nullptr, S2);
        S3 = causal_mask(b, s, S2, neg);
    } else {
        Tensor S2 = causal_mask(b, s, S1, neg);
        S3 = virt(b, "S - Stats", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
        pointwise(b, "sub S Stats", CUDNN_POINTWISE_SUB, S2, &Stats, nullptr, S3);
    }
    Tensor P = virt(b, "P = exp", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "exp S", CUDNN_POINTWISE_EXP, S3, nullptr, nullptr, P);

    // dV = P^T dO (per query head, then summed over the group for GQA)
    Tensor PT = virt(b, "P^T", s.io, B, nh, T, T, s0, s1, 1, T);
    reshape(b, "reshape P", P, PT);
    if (nh == nkv) {
        matmul(b, "matmul P^T dO", PT, dO, dV);
    } else {
        Tensor dVf = virt(b, "dV full heads", s.io, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
        matmul(b, "matmul P^T dO", PT, dO, dVf);
        reduction(b, "reduce dV heads", CUDNN_REDUCE_TENSOR_ADD, dVf, dV);
    }

    // dS = P * (dO V^T - softmax_sum) * scale
    Tensor dP = virt(b, "dP = dO V^T", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    matmul(b, "matmul dO V^T", dO, VT, dP);
    if (s.style == 1) {   // frontend 1.8 multiplies dP by the (absent) dropout mask: 1
        Tensor dPm = virt(b, "dP * 1", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
        pointwise(b, "dP dropout mask", CUDNN_POINTWISE_MUL, dP, &one, nullptr, dPm);
        dP = dPm;
    }
    Tensor dP1 = virt(b, "dP - softmax_sum", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "sub dP softmax_sum", CUDNN_POINTWISE_SUB, dP, &ssum, nullptr, dP1);
    Tensor dP2 = virt(b, "P (dP - softmax_sum)", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "mul dP P", CUDNN_POINTWISE_MUL, dP1, &P, nullptr, dP2);
    Tensor dS = virt(b, "dS", CUDNN_DATA_FLOAT, B, nh, T, T, s0, s1, T, 1);
    pointwise(b, "mul dS attn scale", CUDNN_POINTWISE_MUL, dP2, &scale, nullptr, dS);

    // dK = dS^T Q
    Tensor dST = virt(b, "dS^T", s.io, B, nh, T, T, s0, s1, 1, T);
    reshape(b, "reshape dS", dS, dST);
    if (nh == nkv) {
        matmul(b, "matmul dS^T Q", dST, Q, dK);
    } else {
        Tensor dKf = virt(b, "dK full heads", s.io, B, nh, T, hd, nh * T * hd, T * hd, hd, 1);
        matmul(b, "matmul dS^T Q", dST, Q, dKf);
        reduction(b, "reduce dK heads", CUDNN_REDUCE_TENSOR_ADD, dKf, dK);
    }

    // dQ = dS K
    Tensor K = virt(b, "K (view of K^T)", CUDNN_DATA_FLOAT, B, nkv, T, hd, ks[0], ks[1], ks[2], ks[3]);
    reshape(b, "reshape K", KT, K);
    if (deterministic) {
        matmul(b, "matmul dS K", dS, K, dQ);
    } else {
        const int64_t ad[4] = {B, nh, T, hd}, as[4] = {nh * T * hd, T * hd, hd, 1};
        Tensor acc = tensor(b, "dQ accumulator", CUDNN_DATA_FLOAT, ad, as, false, UID_DQ_ACCUM);
        matmul(b, "matmul dS K", dS, K, acc);
        pointwise(b, "identity dQ", CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dQ);
    }
}

// ---- plans ----------------------------------------------------------------------------------
void destroy_all(std::vector<cudnnBackendDescriptor_t> &v) {
    for (size_t i = v.size(); i-- > 0;) (void)cudnnBackendDestroyDescriptor(v[i]);
    v.clear();
}

// The engine behind an engine config: its global index and whether its numerical notes say
// NONDETERMINISTIC. Queries that fail leave index -1 / false.
void engine_facts(std::vector<cudnnBackendDescriptor_t> &owned, cudnnBackendDescriptor_t cfg, int64_t *index,
                  bool *nondeterministic) {
    *index = -1;
    *nondeterministic = false;
    cudnnBackendDescriptor_t eng = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return;
    owned.push_back(eng);
    int64_t n = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) !=
        CUDNN_STATUS_SUCCESS)
        return;
    int64_t id = -1;
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &id) ==
        CUDNN_STATUS_SUCCESS)
        *index = id;
    cudnnBackendNumericalNote_t notes[32];
    n = 0;
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, 32, &n, notes) ==
        CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < n && i < 32; i++)
            if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) *nondeterministic = true;
}

// Engine configs for the graph from heuristics mode `mode` (appended to cfgs). False with
// `why` set when the query itself fails.
bool heuristics(Builder &b, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                std::vector<cudnnBackendDescriptor_t> &cfgs, char *why, size_t cap) {
    cudnnBackendDescriptor_t heur = nullptr;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
    const char *call = "cudnnBackendCreateDescriptor(ENGINEHEUR)";
    if (st == CUDNN_STATUS_SUCCESS) {
        b.owned.push_back(heur);
        call = "cudnnBackendSetAttribute(ENGINEHEUR, OPERATION_GRAPH)";
        st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &graph);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(ENGINEHEUR, MODE)";
        st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendFinalize(ENGINEHEUR)";
        st = cudnnBackendFinalize(heur);
    }
    int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS, count)";
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                      nullptr);
    }
    if (st == CUDNN_STATUS_SUCCESS && count > 0) {
        std::vector<cudnnBackendDescriptor_t> got((size_t)count, nullptr);
        for (int64_t i = 0; i < count && st == CUDNN_STATUS_SUCCESS; i++) {
            call = "cudnnBackendCreateDescriptor(ENGINECFG)";
            st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &got[(size_t)i]);
            if (st == CUDNN_STATUS_SUCCESS) b.owned.push_back(got[(size_t)i]);
        }
        int64_t n = 0;
        if (st == CUDNN_STATUS_SUCCESS) {
            call = "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)";
            st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &n,
                                          got.data());
        }
        if (st == CUDNN_STATUS_SUCCESS)
            for (int64_t i = 0; i < n && i < count; i++) cfgs.push_back(got[(size_t)i]);
    }
    if (st == CUDNN_STATUS_SUCCESS) return true;
    char words[800];
    status_words(st, words, sizeof words);
    fmt(why, cap, "%s (heuristics mode %s): %s", call, mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK", words);
    return false;
}

// Builds the graph, asks heuristics (mode A, then FALLBACK) and finalizes the first engine
// config that works (skipping non-deterministic engines when `deterministic`). On failure
// p->usable stays false and `why` names the call that failed.
void build_style(CudaCudnn *c, CudnnPlan *p, const Shape &s, bool backward, bool deterministic, char *why,
                 size_t cap) {
    Builder b;
    b.handle = c->handle;
    if (backward) build_backward(b, s, deterministic);
    else build_forward(b, s);
    cudnnBackendDescriptor_t graph = nullptr;
    if (b.ok) {
        graph = b.create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
        SET(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)b.ops.size(),
            b.ops.data(), "operation graph");
        b.set(graph, kOpGraphHandle, CUDNN_TYPE_HANDLE, 1, &c->handle, "operation graph", "CUDNN_ATTR_OPERATIONGRAPH_HANDLE");
        b.finalize(graph, "operation graph (cuDNN does not take this graph)");
    }
    if (!b.ok) {
        fmt(why, cap, "building the graph: %s", b.err);
        destroy_all(b.owned);
        return;
    }
    std::vector<cudnnBackendDescriptor_t> cfgs;
    char heur_why[1000] = "";
    const bool heur_a = heuristics(b, graph, CUDNN_HEUR_MODE_A, cfgs, heur_why, sizeof heur_why);
    const size_t n_a = cfgs.size();
    char fb_why[1000] = "";
    (void)heuristics(b, graph, CUDNN_HEUR_MODE_FALLBACK, cfgs, fb_why, sizeof fb_why);
    char tried[1000] = "";
    size_t tried_n = 0;
    for (size_t i = 0; i < cfgs.size(); i++) {
        int64_t engine = -1;
        bool nondet = false;
        engine_facts(b.owned, cfgs[i], &engine, &nondet);
        if (deterministic && backward && nondet) {
            fmt(tried + tried_n, sizeof tried - tried_n, "%sengine %lld: non-deterministic, skipped",
                tried_n ? "; " : "", (long long)engine);
            tried_n = strlen(tried);
            continue;
        }
        cudnnBackendDescriptor_t plan = nullptr;
        cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        const char *call = "cudnnBackendCreateDescriptor(EXECUTION_PLAN)";
        if (st == CUDNN_STATUS_SUCCESS) {
            call = "cudnnBackendSetAttribute(EXECUTION_PLAN_HANDLE)";
            st = cudnnBackendSetAttribute(plan, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &c->handle);
        }
        if (st == CUDNN_STATUS_SUCCESS) {
            call = "cudnnBackendSetAttribute(EXECUTION_PLAN_ENGINE_CONFIG)";
            st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          1, &cfgs[i]);
        }
        if (st == CUDNN_STATUS_SUCCESS) {
            call = "cudnnBackendFinalize(EXECUTION_PLAN)";
            st = cudnnBackendFinalize(plan);
        }
        int64_t ws = 0, n = 0;
        if (st == CUDNN_STATUS_SUCCESS) {
            call = "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)";
            st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
        }
        if (st == CUDNN_STATUS_SUCCESS) {
            b.owned.push_back(plan);
            p->plan = plan;
            p->workspace = ws;
            p->engine = engine;
            p->style = s.style;
            p->usable = true;
            p->owned.swap(b.owned);
            return;
        }
        char words[600];
        status_words(st, words, sizeof words);
        fmt(tried + tried_n, sizeof tried - tried_n, "%sengine %lld: %s: %s", tried_n ? "; " : "",
            (long long)engine, call, words);
        tried_n = strlen(tried);
        if (plan) (void)cudnnBackendDestroyDescriptor(plan);
    }
    if (cfgs.empty())
        fmt(why, cap, "no engine for this graph (%s; %s)",
                 heur_a ? "heuristics mode A: 0 configs" : heur_why, fb_why[0] ? fb_why : "FALLBACK: 0 configs");
    else
        fmt(why, cap, "no engine config finalizes (%zu from mode A, %zu from FALLBACK: %s)", n_a,
                 cfgs.size() - n_a, tried);
    destroy_all(b.owned);
}

// The frontend 1.10+ graph first; if cuDNN refuses it, the frontend 1.8 one (the forms cuDNN
// 9.0-9.5 were released against). `why` gets both reasons when neither is taken.
void build_plan(CudaCudnn *c, CudnnPlan *p, Shape s, bool backward, bool deterministic, char *why, size_t cap) {
    char why0[1300] = "", why1[1300] = "";
    s.style = 0;
    build_style(c, p, s, backward, deterministic, why0, sizeof why0);
    if (p->usable) return;
    s.style = 1;
    build_style(c, p, s, backward, deterministic, why1, sizeof why1);
    if (p->usable) {
        log_info("attention %s: cuDNN refused the frontend-1.10 graph (%s); took the frontend-1.8 one",
                 backward ? "backward" : "forward", why0);
        return;
    }
    fmt(why, cap, "graph 1: %s | graph 2 (frontend 1.8 form): %s", why0, why1);
}

// The backend's cuDNN state, created on first use: the library loaded, its version usable,
// a handle on the backend's stream. NULL (and a fallback recorded, logged once per process
// for the library and version, once per backend for the handle) when cuDNN cannot be used.
CudaCudnn *cudnn_state(Backend *be, bool backward) {
    CudaState *st = cuda_state(be);
    static bool logged_load = false;
    if (const char *why = cuda_cudnn_load()) {
        const bool log = !logged_load;
        logged_load = true;
        fall_back(backward, false, log, "%s", why);
        return NULL;
    }
    const size_t v = cudnnGetVersion();
    if (v < 90000) {
        const bool log = !logged_load;
        logged_load = true;
        fall_back(backward, false, log, "cuDNN version %zu at %s is too old (9.0 or newer needed)", v,
                  cuda_cudnn_library_path());
        return NULL;
    }
    if (!st->cudnn) {
        st->cudnn = new CudaCudnn();
        st->cudnn->version = v;
    }
    CudaCudnn *c = st->cudnn;
    if (!c->handle && !c->handle_tried) {
        c->handle_tried = true;
        cudnnStatus_t s = cudnnCreate(&c->handle);
        const char *call = "cudnnCreate";
        if (s == CUDNN_STATUS_SUCCESS) {
            call = "cudnnSetStream";
            s = cudnnSetStream(c->handle, st->stream);
        }
        if (s != CUDNN_STATUS_SUCCESS) {
            char words[800];
            status_words(s, words, sizeof words);
            if (c->handle) (void)cudnnDestroy(c->handle);
            c->handle = nullptr;
            (void)cudaGetLastError();
            fall_back(backward, true, true, "%s failed (cuDNN %zu from %s): %s", call, v, cuda_cudnn_library_path(),
                      words);
            return NULL;
        }
        char d[900];
        cuda_cudnn_describe(d, sizeof d);
        log_info("attention: %s; deterministic backward: %s", d, deterministic_now() ? "yes" : "no (opt-in)");
    }
    if (!c->handle) {
        fall_back(backward, true, false, "cudnnCreate failed earlier (see the first message)");
        return NULL;
    }
    return c;
}

constexpr size_t kMaxPlans = 48;

// The cached plan for this call, built on first use; NULL (fallback recorded) when cuDNN
// cannot take it.
CudnnPlan *plan_for(Backend *be, CudaCudnn *c, const Shape &s, NumType t, bool backward) {
    const bool det = deterministic_now();
    const int key[9] = {backward, (int)s.B, (int)s.T, (int)s.nh, (int)s.nkv, (int)s.hd, (int)t, backward && det, 0};
    for (CudnnPlan *p : c->plans)
        if (memcmp(p->key, key, sizeof key) == 0) {
            if (!p->usable) fall_back(backward, p->failed, false, "%s", p->why);
            return p->usable ? p : NULL;
        }
    // Each plan costs a build (runtime-compiled kernels: ~0.1-1 s) and its memory: a run whose
    // shapes keep changing (prompts of every length in eval) stops adding plans here.
    if (c->plans.size() >= kMaxPlans) {
        static bool logged = false;
        fall_back(backward, false, !logged, "%d cuDNN plans built already (one per shape): further shapes run ours",
                  (int)kMaxPlans);
        logged = true;
        return NULL;
    }
    CudnnPlan *p = new CudnnPlan();
    memcpy(p->key, key, sizeof key);
    p->usable = false;
    c->plans.push_back(p);
    // Declines this shape for good: logged once here, repeated (unlogged) on later calls.
    auto decline = [&](bool failed) {
        const Fallback *f = &g_last[backward ? 1 : 0];
        memcpy(p->why, f->why, sizeof p->why);
        p->failed = failed;
        return (CudnnPlan *)NULL;
    };
    char what[200];
    fmt(what, sizeof what, "B=%d T=%d nh=%d nkv=%d hd=%d %s", (int)s.B, (int)s.T, (int)s.nh, (int)s.nkv,
             (int)s.hd, num_type_name(t));
    const size_t v = c->version;
    const int sm = cuda_state(be)->sm;
    // Limits known from cudnn-frontend's checks (fall back quietly after one line).
    if (v >= 91000 && v < 91002) {
        fall_back(backward, false, true, "%s: cuDNN 9.10.0/9.10.1 have known SDPA bugs (9.10.2+ is fine)", what);
        return decline(false);
    }
    if (backward && v <= 91500 && s.T % 128 != 0) {
        fall_back(backward, false, true, "%s: cuDNN %zu's backward needs T %% 128 == 0 (9.16+ does not)", what, v);
        return decline(false);
    }
    if (backward && det && sm >= 100) {
        fall_back(backward, false, true,
                  "%s: a deterministic cuDNN backward on sm_%d needs engine knobs not set here "
                  "(SPES_CUDNN_NONDETERMINISTIC=1 allows cuDNN's non-deterministic one)",
                  what, sm);
        return decline(false);
    }
    char why[1300];
    struct timespec a, z;
    clock_gettime(CLOCK_MONOTONIC, &a);
    build_plan(c, p, s, backward, det, why, sizeof why);
    clock_gettime(CLOCK_MONOTONIC, &z);
    (void)cudaGetLastError();   // a failed build leaves no CUDA error behind for the next op
    if (!p->usable) {
        fall_back(backward, true, true, "%s: cuDNN %zu does not take this graph: %s", what, v, why);
        return decline(true);
    }
    // The deterministic backward keeps dP in its workspace (B*nh*T*T*2 bytes on Hopper: 768 MiB
    // at B=8 T=2048 nh=12): a shape whose workspace would take over half the free GPU memory
    // runs ours rather than ending the run out of memory.
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    else if ((double)p->workspace > 0.5 * (double)free_b) {
        p->usable = false;
        fall_back(backward, false, true, "%s: cuDNN's workspace would be %.2f GiB of %.2f GiB free", what,
                  (double)p->workspace / 1073741824.0, (double)free_b / 1073741824.0);
        return decline(false);
    }
    log_info("attention %s: cuDNN plan for %s: engine %lld, workspace %.1f MiB, built in %.0f ms%s",
             backward ? "backward" : "forward", what, (long long)p->engine, (double)p->workspace / 1048576.0,
             1e3 * ((double)(z.tv_sec - a.tv_sec) + 1e-9 * (double)(z.tv_nsec - a.tv_nsec)),
             backward ? (det ? " (deterministic)" : " (non-deterministic)") : "");
    return p;
}

// Executes the plan with these (uid, pointer) pairs and workspace. False (fallback recorded
// and logged, the plan dropped) when cuDNN refuses to launch it.
bool execute(Backend *be, CudaCudnn *c, CudnnPlan *p, int n, const int64_t *uids, void **ptrs, void *workspace,
             bool backward) {
    cudnnBackendDescriptor_t vp = nullptr;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    const char *call = "cudnnBackendCreateDescriptor(VARIANT_PACK)";
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(VARIANT_PACK_UNIQUE_IDS)";
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(VARIANT_PACK_DATA_POINTERS)";
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(VARIANT_PACK_WORKSPACE)";
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendFinalize(VARIANT_PACK)";
        st = cudnnBackendFinalize(vp);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendExecute";
        st = cudnnBackendExecute(c->handle, p->plan, vp);
    }
    if (vp) (void)cudnnBackendDestroyDescriptor(vp);
    if (st == CUDNN_STATUS_SUCCESS) {
        CUDA_LAUNCHED(be);
        return true;
    }
    char words[800];
    status_words(st, words, sizeof words);
    p->usable = false;   // later calls of this shape go straight to our kernel
    const cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess) {
        // A CUDA error after the failed launch: recorded (the step fails), not hidden.
        char detail[1200];
        fmt(detail, sizeof detail, "%s (CUDA: %s)", words, cudaGetErrorString(ce));
        cuda_record_failure(be, call, detail, __FILE__, __LINE__);
    }
    fall_back(backward, true, true, "%s failed (engine %lld): %s", call, (long long)p->engine, words);
    memcpy(p->why, g_last[backward ? 1 : 0].why, sizeof p->why);
    p->failed = true;
    return false;
}

// Common checks of both directions; fills s.
bool usable_call(Backend *be, const Buf *bufs, int nbufs, const void *lse, int B, int T, int nh, int nkv, int hd,
                 bool backward, Shape *s) {
    const NumType t = bufs[0].t;
    if (t != NUM_BF16 && t != NUM_F16) return fall_back(backward, false, false, "%s buffers", num_type_name(t));
    for (int i = 0; i < nbufs; i++) {
        if (bufs[i].t != t) return fall_back(backward, false, false, "mixed buffer types");
        if (!cuda_aligned16(bufs[i].p)) return fall_back(backward, false, false, "a buffer not 16-byte aligned");
    }
    if (!cuda_aligned16(lse)) return fall_back(backward, false, false, "lse not 16-byte aligned");
    if (hd != 64 && hd != 128) return fall_back(backward, false, false, "head dim %d (cuDNN path: 64, 128)", hd);
    if (T < 2 || B < 1 || nkv < 1 || nh % nkv != 0) return fall_back(backward, false, false, "shape");
    s->B = B, s->T = T, s->nh = nh, s->nkv = nkv, s->hd = hd;
    s->io = t == NUM_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    s->style = 0;
    return true;
}

float mask_value(const CudaCudnn *c, const CudnnPlan *p) {
    // cudnn-frontend 1.10+: -inf from cuDNN 9.10, the lowest float before ("older cuDNN prefers
    // lowest"); 1.8: always the lowest float.
    return p->style == 0 && c->version >= 91000 ? -INFINITY : -FLT_MAX;
}

} // namespace

// ---- entry points -------------------------------------------------------------------------------
extern "C" void cuda_cudnn_attention_set_deterministic(bool on) { g_deterministic = on ? 1 : 0; }
extern "C" bool cuda_cudnn_attention_deterministic(void) { return deterministic_now(); }

extern "C" void cuda_cudnn_attention_not_offered(bool backward, const char *why) {
    fall_back(backward, false, false, "%s", why);
}

extern "C" const char *cuda_cudnn_attention_last_fallback(bool backward, bool *failed) {
    const Fallback *f = &g_last[backward ? 1 : 0];
    if (failed) *failed = f->why[0] ? f->failed : false;
    return f->why[0] ? f->why : NULL;
}

extern "C" void cuda_cudnn_describe(char *buf, size_t cap) {
    if (const char *why = cuda_cudnn_load()) {
        fmt(buf, cap, "cuDNN: not usable: %s", why);
        return;
    }
    const size_t v = cudnnGetVersion(), rt = cudnnGetCudartVersion();
    fmt(buf, cap, "cuDNN %zu.%zu.%zu (built for CUDA %zu.%zu) from %s", v / 10000, (v / 100) % 100, v % 100,
             rt / 1000, (rt / 10) % 100, cuda_cudnn_library_path());
}

extern "C" bool cuda_cudnn_attention_forward(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int T,
                                             int nh, int nkv, int hd) {
    g_last[0].why[0] = 0;
    Shape s;
    const Buf bufs[4] = {out, q, k, v};
    if (!usable_call(be, bufs, 4, lse, B, T, nh, nkv, hd, false, &s)) return false;
    CudaCudnn *c = cudnn_state(be, false);
    if (!c) return false;
    CudnnPlan *p = plan_for(be, c, s, q.t, false);
    if (!p) return false;
    void *ws = NULL;
    if (p->workspace > 0) {
        ws = cuda_scratch_slot(be, CUDA_SCRATCH_CUDNN, (size_t)p->workspace);
        if (!ws) return true;   // failure recorded by the scratch allocation
    }
    float scale = 1.0f / sqrtf((float)hd), neg = mask_value(c, p);
    const int64_t uids[7] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG};
    void *ptrs[7] = {q.p, k.p, v.p, out.p, lse, &scale, &neg};
    return execute(be, c, p, 7, uids, ptrs, ws, false);
}

extern "C" bool cuda_cudnn_attention_backward(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out,
                                              const float *lse, Buf q, Buf k, Buf v, int B, int T, int nh, int nkv,
                                              int hd) {
    g_last[1].why[0] = 0;
    Shape s;
    const Buf bufs[8] = {dq, dk, dv, dout, out, q, k, v};
    if (!usable_call(be, bufs, 8, lse, B, T, nh, nkv, hd, true, &s)) return false;
    CudaCudnn *c = cudnn_state(be, true);
    if (!c) return false;
    CudnnPlan *p = plan_for(be, c, s, q.t, true);
    if (!p) return false;
    const bool det = p->key[7] != 0;
    // workspace: [softmax_sum fp32 B*nh*T][dQ accumulator fp32 B*nh*T*hd, non-det only][engine]
    const size_t round = 256;
    const size_t sum_bytes = ((size_t)B * nh * T * sizeof(float) + round - 1) / round * round;
    const size_t acc_bytes = det ? 0 : ((size_t)B * nh * T * hd * sizeof(float) + round - 1) / round * round;
    char *ws = (char *)cuda_scratch_slot(be, CUDA_SCRATCH_CUDNN, sum_bytes + acc_bytes + (size_t)p->workspace);
    if (!ws) return true;   // failure recorded
    if (acc_bytes) CUDA_CHECK(be, cudaMemsetAsync(ws + sum_bytes, 0, acc_bytes, cuda_state(be)->stream));
    float scale = 1.0f / sqrtf((float)hd), one = 1.0f, neg = mask_value(c, p);
    const int64_t uids[14] = {UID_Q,  UID_K,     UID_V,   UID_O,   UID_DO,          UID_STATS,   UID_DQ,
                              UID_DK, UID_DV,    UID_SCALE, UID_ONE, UID_NEG, UID_SOFTMAX_SUM, UID_DQ_ACCUM};
    void *ptrs[14] = {q.p,  k.p,  v.p,    out.p, dout.p, (void *)lse, dq.p,
                      dk.p, dv.p, &scale, &one,  &neg,   ws,          ws + sum_bytes};
    return execute(be, c, p, det ? 13 : 14, uids, ptrs, ws + sum_bytes + acc_bytes, true);
}

extern "C" bool cuda_cudnn_check_graph(bool backward, int B, int T, int nh, int nkv, int hd, bool f16,
                                       bool deterministic, int style, char *msg, size_t cap) {
    if (const char *why = cuda_cudnn_load()) {
        fmt(msg, cap, "%s", why);
        return false;
    }
    Builder b;
    b.handle = nullptr;
    const Shape s = {B, T, nh, nkv, hd, f16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16, style};
    if (backward) build_backward(b, s, deterministic);
    else build_forward(b, s);
    if (b.ok) fmt(msg, cap, "%zu operations, %zu descriptors finalized", b.ops.size(), b.owned.size());
    else fmt(msg, cap, "%s", b.err);
    destroy_all(b.owned);
    return b.ok;
}

extern "C" void cuda_cudnn_free(CudaCudnn *c) {
    if (!c) return;
    for (CudnnPlan *p : c->plans) {
        destroy_all(p->owned);
        delete p;
    }
    if (c->handle) (void)cudnnDestroy(c->handle);
    delete c;
}
