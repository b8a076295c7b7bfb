// Deterministic random numbers: xoshiro256** seeded through splitmix64. The whole state is
// four words, so it is saved in checkpoints and resumes bit-exactly.
#pragma once
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *rng, uint64_t seed);
uint64_t rng_next_u64(Rng *rng);
double rng_uniform(Rng *rng);                        // [0, 1)
uint64_t rng_below(Rng *rng, uint64_t n);            // uniform in [0, n), unbiased
double rng_normal(Rng *rng);                         // standard normal (Box-Muller)
// Normal(0, std) truncated to [-cutoff*std, cutoff*std] by rejection (OLMo init).
double rng_truncated_normal(Rng *rng, double std, double cutoff);
