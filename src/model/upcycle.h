// Sparse upcycling: a dense Qwen3 (per-head QK-norm) or Llama-style (no QK-norm) Hugging
// Face model becomes an MoE whose every expert starts as a copy of the layer's dense MLP.
//
// - attention, norms, embeddings are copied; lm_head is copied too, or taken from the
//   embedding when the dense model ties them (tie_word_embeddings / no lm_head tensor);
// - expert e of layer l = dense gate/up/down_proj, plus optional noise: each element
//   independently, with probability noise_fraction, gets + Normal(0, noise_std)
//   (deterministic per seed, layer, expert and tensor);
// - router (mlp.gate.weight [E, H]) per router_init:
//     zeros          all zero: uniform routing (ties pick the lowest expert indices)
//     normal         Normal(0, initializer_range) (0.02 by default, OLMo's init)
//     scaled_normal  Normal(0, 1/sqrt(hidden_size)): router logits of O(1) at the start
//     mlp_based      row e = mean of a random 1/E share of the dense gate_proj rows (a
//                    seeded partition of the I rows into E equal groups; needs I >= E):
//                    expert e's score is how strongly the token drives "its" gate neurons
// - norm_topk_prob is set: the top-k weights sum to 1, so with zero noise the MoE output
//   equals the dense MLP output whatever the router does (k identical experts averaged),
//   and the upcycled model computes exactly the dense model's function.
#pragma once
#include <stdint.h>

#include "model/model.h"

typedef enum { ROUTER_INIT_ZEROS = 0, ROUTER_INIT_NORMAL, ROUTER_INIT_SCALED_NORMAL, ROUTER_INIT_MLP_BASED } RouterInit;

typedef struct {
    int num_experts;
    int top_k;
    float noise_std;        // 0: exact copies
    float noise_fraction;   // in [0, 1]
    RouterInit router_init;
    uint64_t seed;
} UpcycleOptions;

int router_init_parse(const char *name, RouterInit *out);

// Reads the dense model in dense_dir (config.json + safetensors, sharded or not) and builds
// the upcycled MoE in *out (gradients frozen; model_free it).
int model_upcycle_dense(const char *dense_dir, const UpcycleOptions *opt, Model *out);
