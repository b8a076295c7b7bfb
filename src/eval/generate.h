// Autoregressive generation: prefill the prompt into a KV cache, then one token per step
// (no recomputation of the prefix). The no-cache mode re-runs model_forward over the whole
// sequence every step: the reference the cache is tested against and the baseline of the
// benchmark.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "eval/sampling.h"
#include "model/model.h"

// Called with each new token as soon as it is chosen; non-zero return stops generation
// with that status (SPES_ERR propagates as an error).
typedef int (*TokenSinkFn)(void *user, int32_t token);

typedef struct {
    int max_new_tokens;
    SamplingParams sampling;
    uint64_t seed;
    bool stop_at_eos;       // stop after emitting an eos id of the model (model_config_is_eos)
    bool use_cache;         // false: full forward per step (slow reference)
} GenerateOptions;

// Tokens are drawn among the first vocab_size logits (padded embedding rows are never
// produced). out[max_new_tokens] receives the new tokens, *n_out how many. The prompt plus
// the new tokens must fit in the model's max_seq_len (generation stops there).
int generate_tokens(Model *m, const int32_t *prompt, int n_prompt, const GenerateOptions *opt, TokenSinkFn sink,
                    void *user, int32_t *out, int *n_out);
