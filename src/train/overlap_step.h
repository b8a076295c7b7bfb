// A training step whose optimizer update runs under the next step's forward.
//
// The plain step is: zero the gradients, forward+backward, read back the global gradient norm
// (the clip factor), AdamW. On a GPU the last part is memory-bound (~10 ms of the 1B model's
// ~82 ms step on an H200: 30 bytes a parameter) and the next forward, mostly GEMMs, waits for
// all of it. Here the update goes to the backend's aux queue (backend.h) part by part
// (adamw_step_parts: 0 the embedding, 1 + l layer l, the head), each part's gradients zeroed on
// that queue behind its update and a point marked; the next forward waits, from the model's
// PRE_FORWARD hook, only for the point of the part it is about to read. So the update of layer
// l runs while the forward goes through the layers before it, and no pass of its own zeroes
// the gradients. The arithmetic and its order are the plain step's, so are the bits
// (test_train_overlap_step on the cpu, test_cuda_core on a GPU); on the cpu backend, with one
// queue, it is the plain step in another order of calls.
//
// For one rank, the optimizer on the device (not offloaded), and a model whose hooks are this
// step's while it runs (no data parallelism or sharded parameters, which hook the same events).
// overlap_step runs one micro-batch a step (bench/gpu_train_step --overlap-adamw measures it);
// the trainer, with optimizer.overlap_next_forward, runs its own steps (micro-batches, loss
// scaling, logging) around overlap_queue_update.
#pragma once
#include <stdint.h>

#include "model/model.h"
#include "train/optimizer.h"

typedef struct {
    Model *m;
    AdamW *opt;
    ModelHooks hooks;                // the model's while the steps run
} OverlapStep;

// Fills *o for m and opt; o->hooks (whose context is o itself: it stays where it is while
// they are used) make the forward wait for each part's update. SPES_ERR when the optimizer is
// offloaded or holds less than the whole gradient or another backend's state.
int overlap_step_init(OverlapStep *o, Model *m, AdamW *opt);
// overlap_step_init, then zeroes the gradients once and puts o->hooks on the model (until
// overlap_step_end). SPES_ERR as overlap_step_init, or when the model already has hooks.
int overlap_step_begin(OverlapStep *o, Model *m, AdamW *opt);
// Queues AdamW at lr on the gradient times grad_scale (the clip factor, and any loss scale's
// inverse) on the aux queue, part by part, each part's gradients zeroed behind its update; a
// forward with o->hooks on the model waits for each part before reading it. The trainer's
// optimizer.overlap_next_forward (trainer.c) and overlap_step below use it.
int overlap_queue_update(OverlapStep *o, float grad_scale, double lr);
// One step on one micro-batch: forward+backward (waiting for the previous update part by
// part), the global gradient norm read back into *grad_norm, then AdamW at lr on the gradient
// clipped to max_norm (<= 0: not clipped), queued on the aux queue. Returns with that update
// possibly still running: before the host reads or writes the parameters, the optimizer state
// or the gradients (a checkpoint, an eval, a reload), overlap_step_end or backend_sync. *loss
// as model_forward_backward's. SPES_ERR, with no update queued, when the gradient norm is not
// finite.
int overlap_step(OverlapStep *o, const int32_t *inputs, const int32_t *targets, int B, int T,
                 const LossWeights *weights, double lr, double max_norm, LossValues *loss, double *grad_norm);
// Waits for the last update and takes the hooks off the model.
int overlap_step_end(OverlapStep *o);
