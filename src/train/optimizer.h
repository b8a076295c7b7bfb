// AdamW over the trainable tensors only, exactly as torch.optim.AdamW (decoupled weight
// decay, bias-corrected moments) with OLMo's weight-decay groups, plus global-norm
// gradient clipping as OLMo's "global fixed" clipping / torch.nn.utils.clip_grad_norm_.
//
// Moments live in two compact buffers laid out like the gradient buffer: tensor i of the
// parameter table owns [grad_offset, grad_offset + numel) in m and v. Frozen tensors
// (grad_offset -1) have no optimizer state at all.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/param_table.h"
#include "ops/backend.h"

typedef struct {
    double beta1, beta2;        // optimizer.betas
    double eps;                 // optimizer.eps
    double weight_decay;        // optimizer.weight_decay
    bool decay_norm_and_bias;   // optimizer.decay_norm_and_bias: norm gains decay too
    bool decay_embeddings;      // optimizer.decay_embeddings: the input embedding decays too
    bool cpu_offload;           // optimizer.cpu_offload: moments and update in host memory (ZeRO-Offload)
} AdamWConfig;

typedef struct {
    AdamWConfig cfg;
    Backend *be;
    size_t numel;               // values of state held here: hi - lo
    size_t lo, hi;              // the range of the gradient layout this state covers: [0, trainable_numel)
                                // unsharded; a rank's shard under ZeRO-1/2 (src/parallel/data_parallel.h)
    float *m;                   // host [numel] exp_avg (checkpoints read and write these)
    float *v;                   // host [numel] exp_avg_sq
    float *dm, *dv;             // the moments the update reads (== m, v on cpu and when offloaded)
    bool offload;               // cfg.cpu_offload: the update runs on the host (below)
    float *hg, *hp;             // offload: host staging [numel] of the range's gradients and fp32 parameters
    AdamWTensor *tensors;       // [table.count] per-step work list
    int *entry;                 // [table.count] the table entry of each work-list item
    int64_t step;               // updates done so far (torch's state["step"])
    // Adaptive clipping (max_grad_norm_ratio, train/clip_adaptive.h). Per table entry, on the
    // host, whole on every rank (the norms they come from are all-reduced, so every rank holds
    // the same values: OLMo's every rank tracks every parameter's too), frozen entries unused.
    int count;                  // table entries
    float *norm_avg;            // [count] OLMo's state["grad_norm_exp_avg"] of each tensor
    bool *norm_avg_set;         // [count] whether the tensor has one yet (none before step 2)
    const float *tensor_scale;  // [count] or NULL: the next update's extra factor per tensor on top of
                                // grad_scale (the adaptive clip factors); NULL: grad_scale alone
} AdamW;

// Zeroed moments for the trainable tensors of `table`, on the cpu / on backend be.
int adamw_create(AdamW *opt, const ParamTable *table, const AdamWConfig *cfg);
int adamw_create_on(AdamW *opt, const ParamTable *table, const AdamWConfig *cfg, Backend *be);
// The state of only [lo, hi) of the gradient layout (a ZeRO shard; lo <= hi <= trainable_numel):
// m and v hold hi - lo values, and adamw_step updates only the parameters of that range.
int adamw_create_shard(AdamW *opt, const ParamTable *table, const AdamWConfig *cfg, Backend *be, size_t lo, size_t hi);
void adamw_free(AdamW *opt);
// Host moments -> backend, backend -> host (no-ops on cpu).
int adamw_state_to_device(AdamW *opt);
int adamw_state_to_host(AdamW *opt);

// Zeroes the moments and the update count (bias correction starts over, as for a fresh
// optimizer) in host and backend memory, and forgets the adaptive clipping's norm averages (a
// fresh optimizer has none): spes_config.reset_moments_at_sync.
int adamw_reset(AdamW *opt);
// The adaptive clipping's norm averages of src into dst (both over the same table; the
// shards' states hold all of them): a sharded state's gather and scatter.
void adamw_copy_norm_avg(AdamW *dst, const AdamW *src);

// OLMo's get_param_groups: Linear weights (attention, router, experts, lm_head) always
// decay; norm weights only with decay_norm_and_bias; the embedding only with decay_embeddings.
bool adamw_param_decays(const AdamWConfig *cfg, ParamKind kind);

// One AdamW update of every trainable tensor at learning rate lr (params, grads: backend
// fp32 buffers laid out by the table), on the gradient times grad_scale (grad_clip_coef's
// factor, times 1/loss scale in fp16; 1 for none), and for table entry i times
// opt->tensor_scale[i] when that is set (grad_scale * tensor_scale[i] in float; tensors of one
// factor share a launch): the same bits as scaling the gradient buffer first, without that
// pass; the buffer itself is left as it was. compute: the parameters' low-precision copy, updated
// by the same kernel (.p NULL when there is none). Same float32 operation order as torch's
// single-tensor AdamW, so results agree to rounding. A shard's state updates the values of
// its range only, tensor pieces element by element as the whole tensor would be; `grads`
// then points at the gradient of value `lo` (grads[i - lo] for value i).
//
// Offloaded (cfg.cpu_offload, DeepSpeed's ZeRO-Offload of the optimizer): the moments live in
// (page-locked) host memory and never on the device; each step the range's gradients and fp32
// parameters are downloaded, the cpu backend's AdamW kernel updates them, and the parameters
// go back up (their compute copy converted on the device). On the cpu backend the copies are
// plain memcpy and the result is the same bits as without offload. SPES_ERR when a copy fails.
int adamw_step(AdamW *opt, const ParamTable *table, float *params, const float *grads, float grad_scale, Buf compute,
               double lr);
// The same update (the same bits) as adamw_step, launched part by part: for each hook part of
// the model (model.h: 0 the embedding, 1 + l layer l, n_layers + 1 the head), in that order, the
// part's tensors in one launch, then after_part(ctx, part) (NULL: nothing); an error it returns
// ends the update there. For queueing each part's update where the next forward can wait for
// it (src/train/overlap_step.h). Not with an offloaded optimizer (SPES_ERR).
int adamw_step_parts(AdamW *opt, const ParamTable *table, int n_layers, float *params, const float *grads,
                     float grad_scale, Buf compute, double lr, int (*after_part)(void *ctx, int part), void *ctx);
// The same update on fp32 parameters packed like the state's range: value i of the gradient
// layout at packed[i - lo] (ZeRO-3's shard, parallel/sharded_params.h); no compute copy.
int adamw_step_packed(AdamW *opt, const ParamTable *table, float *packed, const float *grads, float grad_scale,
                      double lr);

// Sum of squares of n gradient values (backend memory), read back to the host; allocates
// nothing (grad_sum_squares in backend.h). Summed in
// double over fixed-size blocks, so the result is the same for every thread count (bit-exact
// resume depends on it). SPES_ERR with a message when the backend fails (on cuda the
// read-back reports any failed op before it). A shard's part of a global norm.
int grad_sum_of_squares(Backend *be, const float *grads, size_t n, double *out);
// L2 norm of all n gradient values: sqrt(grad_sum_of_squares); NAN when that fails.
double grad_global_norm(Backend *be, const float *grads, size_t n);
// torch.nn.utils.clip_grad_norm_'s factor for a gradient of this norm: max_norm / (norm + 1e-6)
// in float, or exactly 1 when max_norm <= 0 or the factor is >= 1 (multiplying changes
// nothing). A NaN norm gives NaN, which torch multiplies by too. adamw_step applies it
// (grad_scale) as it reads the gradient.
float grad_clip_coef(double norm, double max_norm);
