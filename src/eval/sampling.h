// Picking the next token from a row of logits: greedy (temperature 0), or sampling from
// softmax(logits / temperature) restricted to the top_k most likely tokens and then to the
// smallest set whose probability reaches top_p (nucleus). Deterministic for an Rng state.
#pragma once
#include <stdint.h>

#include "base/rng.h"

typedef struct {
    float temperature;   // <= 0: greedy argmax
    int top_k;           // <= 0: no top-k cut
    float top_p;         // >= 1 (or <= 0): no nucleus cut
} SamplingParams;

// Index of the largest logit (the first one on ties, like torch.argmax).
int sample_argmax(const float *logits, int V);

// Samples one token from logits[V]. scratch_probs/scratch_index hold V entries each
// (the caller owns them so a generation loop allocates once).
int sample_token(const float *logits, int V, const SamplingParams *params, Rng *rng, float *scratch_probs,
                 int *scratch_index);
