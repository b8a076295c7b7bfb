// OLMo's adaptive gradient clipping (max_grad_norm_ratio): olmo/optim.py at 59a53e3f,
// Optimizer.clip_grads_and_collect_metrics -> _do_adaptive_clipping. Per trainable tensor p,
// with g its (reduced, unscaled) gradient and avg its running norm average:
//
//   norm  = ||g||_2                                  (float32; sharded: sqrt of the sum over
//                                                     ranks of each shard piece's squares)
//   avg   = state avg, or norm when p has none yet   (the state gets it from global step 2 on:
//                                                     step 1's value is used, then dropped)
//   coef  = min(ratio * avg / (norm + 1e-6), 1)      g *= coef
//   avg   = lerp(avg, norm * coef, 1 - max(beta1, beta2))
//
// Where a group has max_grad_norm_ratio, OLMo clips it this way and never reads its
// max_grad_norm. `ratio` follows the clipping warm-up exactly as max_grad_norm does
// (schedule_clip_max_norm). The factors reach the gradient through AdamW (opt->tensor_scale):
// no pass of their own. The averages are optimizer state (AdamW.norm_avg, checkpointed as
// grad_norm_exp_avg.<name> in train_state.safetensors).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/param_table.h"
#include "ops/backend.h"
#include "train/optimizer.h"

typedef struct {
    Backend *be;
    int count;        // table entries
    double *dsums;    // backend [count]: each entry's sum of squares of its gradient values here
    double *sums;     // host [count]: the same, read back (== dsums when the backend is host memory)
    float *scale;     // host [count]: the step's clip factor per entry (1: not clipped, frozen ones too)
    int clipped;      // tensors whose factor was below 1 at the last clip_adaptive_apply
    int eligible;     // trainable tensors
} ClipAdaptive;

int clip_adaptive_create(ClipAdaptive *c, Backend *be, const ParamTable *table);
void clip_adaptive_free(ClipAdaptive *c);

// c->sums[i] = the sum of squares of entry i's gradient values inside [lo, hi) of the gradient
// layout, which `grads` holds from value lo (grads[v - lo] for value v): whole tensors with the
// whole gradient, a ZeRO-2/3 rank's pieces of them with its shard; 0 for entries with none
// there. One backend sum per piece (summed in double, in order), one read-back. SPES_ERR with
// a message when the backend fails. Under ZeRO-2/3 the caller all-reduces c->sums (one
// collective of c->count doubles).
int clip_adaptive_sums(ClipAdaptive *c, const ParamTable *table, const float *grads, size_t lo, size_t hi);

// The squared L2 norm of the whole gradient: the sum of c->sums (after the all-reduce).
double clip_adaptive_total(const ClipAdaptive *c);

// One tensor's clipping, the policy alone: the factor for a gradient of this norm (float32 as
// torch computes it; NaN for a NaN norm), and the running average updated in *avg / *has_avg
// (kept only from global step 2 on, as OLMo does). weight: 1 - max(beta1, beta2) in float.
float clip_adaptive_coef(float norm, float ratio, float weight, int64_t global_step, float *avg, bool *has_avg);

// The step's clipping from c->sums (reduced): each trainable entry's norm sqrt(sums[i]) *
// unscale (1/loss scale; 1 for none), its factor into c->scale and opt's averages updated
// (clip_adaptive_coef, beta from opt->cfg); c->clipped and c->eligible counted. The caller then
// sets opt->tensor_scale = c->scale for the update.
void clip_adaptive_apply(ClipAdaptive *c, AdamW *opt, const ParamTable *table, double ratio, double unscale,
                         int64_t global_step);

// Tests: the step's gradient before clipping (whole, `n` values of the gradient layout in
// backend memory) into dir/grad.<step>.safetensors, one tensor per trainable entry under its
// name (the reference in tests/ref/clip_adaptive_ref.py reads these).
int clip_adaptive_dump_grads(const char *dir, const ParamTable *table, Backend *be, const float *grads, size_t n,
                             int64_t step);
