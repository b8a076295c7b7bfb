// The model: configuration, parameter table, one parameter buffer, gradients for trainable
// tensors only, and activation memory planned once per (B, T), on one backend (ops/backend.h).
//
// Forward/backward are plain functions over this struct; every numeric loop lives behind the
// backend. Parameters exist twice only on a device backend: `params` is the host copy that
// checkpoints, sync payloads and exports read and write, `dparams` the backend's fp32 master
// (the same buffer on cpu); model_params_to_device / _to_host move them (no-ops on cpu).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model_config.h"
#include "model/param_table.h"
#include "ops/backend.h"

typedef struct ModelActivations ModelActivations;   // private to src/model
typedef struct ModelBinding ModelBinding;           // private: tensors resolved per layer

// Hooks: the model tells one listener where a training or eval pass is, part by part, so
// data parallelism (src/parallel/) can start a gradient bucket's reduction while the backward goes
// on, and a sharded-parameter strategy can fetch a part's parameters right before it runs and
// release them after. Parts are param_part()'s (param_table.h): 0 the embedding, 1 + l layer l,
// n_layers + 1 the head (final norm and lm_head). Per call of model_forward_backward, every
// part sees PRE_FORWARD, POST_FORWARD, then (backward) PRE_BACKWARD and POST_BACKWARD, the
// backward in reverse part order; model_forward sends only the forward events. The head's
// lm_head gradient is computed with its forward (row blocks of logits are never all kept), so
// its PRE_BACKWARD comes after its forward events but before the final norm's backward.
typedef enum {
    MODEL_HOOK_PRE_FORWARD = 0,   // the forward is about to read the part's parameters
    MODEL_HOOK_POST_FORWARD,      // the forward is done with them
    MODEL_HOOK_PRE_BACKWARD,      // the backward (or the recomputed forward before it) is about to read them
    MODEL_HOOK_POST_BACKWARD,     // every gradient of the part from this call is in m->grads
} ModelHookEvent;

typedef struct {
    int (*fn)(void *ctx, ModelHookEvent event, int part);   // an error ends the pass with it
    void *ctx;
} ModelHooks;

typedef struct {
    ModelConfig cfg;
    ParamTable table;
    Backend *be;            // where the model computes
    float *params;          // host [table.total_numel]
    float *dparams;         // backend fp32 master [table.total_numel] (== params on cpu)
    void *cparams;          // backend compute copy in be->compute, NULL when that is fp32
    float *grads;           // backend [table.trainable_numel], NULL when nothing is trainable
    ModelBinding *bind;     // parameter/gradient views per layer, rebuilt when the trainable set changes
    ModelActivations *acts; // planned lazily for the (B, T) of the last call
    int64_t *expert_counts; // [L*E] tokens routed to each expert in the last forward
    int checkpointing;      // activation_checkpointing: 0 none, 1 fine_grained, 2 whole_layer
    const ModelHooks *hooks;   // NULL: none (set by the caller around the passes it listens to)
    bool phase_sync;        // profile in device time: sync the backend at every phase boundary
} Model;

// Allocates parameters (zeroed) and gradients for every tensor (all trainable), on the cpu.
int model_create(Model *m, const ModelConfig *cfg);
// The same on backend `be` (which must outlive the model).
int model_create_on(Model *m, const ModelConfig *cfg, Backend *be);
// The same with every tensor frozen and no gradient buffer, until model_set_trainable says what
// trains: a model most of whose tensors stay frozen (a SPES peer's other experts, evaluation)
// never holds a gradient buffer for all of them, which would set the device's peak memory.
int model_create_frozen_on(Model *m, const ModelConfig *cfg, Backend *be);
// host params -> backend master and compute copy; backend master -> host params. No-ops on cpu.
int model_params_to_device(Model *m);
int model_params_to_host(Model *m);

// Sharded parameters (ZeRO-3, src/parallel/sharded_params.h): release frees the backend's parameter
// buffers (master and compute copy; on cpu the master is the host copy) and leaves every part
// unbound, so a pass runs only with each part bound to a working buffer first (model_bind_part
// from the hooks); restore allocates them again (zeroed) and binds every part to them. A device
// backend keeps the page-locked host copy throughout. Gradients stay.
int model_release_params(Model *m);
int model_restore_params(Model *m);
// The gradient buffer likewise (ZeRO-3's gradients live in shards): released, every part's
// gradient views are NULL until a binding with a gradient buffer (model_bind_part); restore
// allocates it again (zeroed) and, when the model holds its parameters, rebinds.
int model_release_grads(Model *m);
int model_restore_grads(Model *m);

// Moves a model (its parameters and trainable mask; no activations) to backend be: load on
// the host, then move. Gradients start at zero there.
int model_move_to(Model *m, Backend *be);

// The reference's activation_checkpointing key: "none" (null) keeps every layer's activations
// for the backward; "fine_grained" recomputes the experts' SwiGLU intermediates (the largest
// activations of an MoE layer) in the MoE backward; "whole_layer" keeps only each layer's
// input and recomputes the layer's forward right before its backward (one extra forward).
// Gradients are bit-identical either way (the recomputation runs the same deterministic ops).
int model_set_activation_checkpointing(Model *m, const char *mode);
// The mode's number as Model.checkpointing holds it (0 none, 1 fine_grained, 2 whole_layer).
int model_checkpointing_mode(const char *mode, int *out);
void model_free(Model *m);
// OLMo init: every matrix ~ truncated normal(0, init_std, +-cutoff*std); norm weights 1.
// Deterministic for a seed, independent of thread count.
void model_init_weights(Model *m, uint64_t seed);
// Points part `part`'s parameter views (the hooks' numbering) at `master` (fp32) and
// `compute` (the compute copy; NULL when compute is fp32, where GEMMs read the master), both
// laid out as the part's span of the parameter buffer (param_part_span): the working buffer
// a sharded-parameter strategy gathers the part into. master NULL: back to the model's own
// buffers. `grads`: where the part's gradients go, laid out as the part's range of the gradient
// layout (param_part_grad_span; a sharded-gradient strategy's working buffer); NULL: the
// model's own gradient buffer. model_bind (set_trainable, move) rebinds every part to the
// model's own buffers.
int model_bind_part(Model *m, int part, const float *master, void *compute, float *grads);
// Per-entry trainable mask (table order). Frees/reallocates the gradient buffer so frozen
// tensors get no gradient memory. Gradients are zeroed.
int model_set_trainable(Model *m, const bool *mask);
// Convenience: shared tensors trainable, experts trainable only in [first, last] (inclusive).
int model_set_trainable_experts(Model *m, int first, int last);
float *model_param(Model *m, int index);            // pointer to entry `index` in params
float *model_grad(Model *m, int index);             // NULL when the entry is frozen or grads are released
void model_zero_grad(Model *m);

// Forward + backward on one micro-batch. inputs/targets [B*T] (targets IGNORE_INDEX are
// skipped). Gradients of (grad_scale * total loss) are ADDED to m->grads, so calling this
// for several micro-batches accumulates. Fills *out (unscaled loss values) when non-NULL.
// logits_out [B*T*embedding_size] (host memory) receives the logits when non-NULL.
int model_forward_backward(Model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                           const LossWeights *weights, float grad_scale, LossValues *out, float *logits_out);

// The hook events a pass would send (forward only, or forward and backward), in the same order,
// to `hooks`, computing nothing: a rank without a micro-batch of its own still takes part in
// the collectives a sharded-parameter strategy runs from the hooks (parallel/sharded_params.h).
int model_hook_replay(const Model *m, bool backward, const ModelHooks *hooks);

// Forward only (eval): losses when targets != NULL, logits when logits_out != NULL.
int model_forward(Model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                  const LossWeights *weights, LossValues *out, float *logits_out);

// Incremental forward over a key/value cache (eval/kv_forward.h builds on it): tokens[n] at
// positions past..past+n-1 of `cache_k/cache_v` (backend memory, per layer [capacity, n_kv*hd]
// in be->compute, layer l at l*layer_stride elements), rope tables [capacity, hd/2] fp32 on
// the backend. logits (host) receive the last n_logits rows when non-NULL.
typedef struct {
    Buf k, v;               // layer 0's [capacity, n_kv*hd]
    size_t layer_stride;    // elements between layers
    const float *rope_cos, *rope_sin;
    int capacity;
} ModelKvCache;
int model_forward_kv(Model *m, const ModelKvCache *cache, int past, const int32_t *tokens, int n, float *logits,
                     int n_logits);

// Model FLOPs of one training step on B*T tokens (forward + backward, counting the dW
// GEMMs only for trainable tensors), for MFU figures.
double model_train_flops(const Model *m, int B, int T);

// Per-phase wall time of forward/backward calls since the last reset (for the bench's
// profile). Phases are the model's stages; forward and backward of each counted apart. On an
// asynchronous backend a phase's time is the host's time to enqueue it, unless m->phase_sync
// is set: then the backend is synced at every phase boundary, so each phase is its device
// time (and the pass is slower by the lost overlap of host and device).
typedef enum {
    MODEL_PHASE_EMBED = 0,      // embedding lookup + its gradient
    MODEL_PHASE_NORMS,          // RMSNorms (layer, QK, final) forward + backward
    MODEL_PHASE_ATTN_FWD,       // q/k/v/o projections, RoPE, attention
    MODEL_PHASE_ATTN_BWD,
    MODEL_PHASE_ROUTER,         // router logits, softmax/top-k, dispatch plan, aux losses, router backward
    MODEL_PHASE_MOE_DISPATCH,   // rows gathered for the experts, the weighted combine, and their backward
    MODEL_PHASE_EXPERTS_FWD,    // expert GEMMs + SwiGLU (the backend's experts_forward)
    MODEL_PHASE_EXPERTS_BWD,
    MODEL_PHASE_LM_HEAD,        // LM head, cross-entropy/z-loss, their backward
    MODEL_PHASE_COUNT
} ModelPhase;

const char *model_phase_name(ModelPhase phase);
// seconds[MODEL_PHASE_COUNT]; zeros when no pass ran yet.
void model_phase_seconds(const Model *m, double *seconds);
void model_phase_reset(Model *m);
