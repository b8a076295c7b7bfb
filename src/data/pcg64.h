// numpy's default bit generator, reproduced bit for bit so data order matches OLMo:
// np.random.PCG64(seed) (seeded through numpy's SeedSequence) and Generator.permutation.
#pragma once
#include <stdint.h>

typedef struct {
    __uint128_t state, inc;
    int has_uint32;         // numpy hands out 64-bit draws as two 32-bit halves, low first
    uint32_t uinteger;
} Pcg64;

// np.random.PCG64(seed) for a non-negative integer seed.
void pcg64_seed(Pcg64 *rng, uint64_t seed);
uint64_t pcg64_next64(Pcg64 *rng);
uint32_t pcg64_next32(Pcg64 *rng);
// Generator.integers(0, max + 1) as used by shuffle: numpy's random_interval (mask + reject).
uint64_t pcg64_interval(Pcg64 *rng, uint64_t max);
// np.random.Generator(np.random.PCG64(seed)).permutation(n) into out[n] (n < 2^32).
void pcg64_permutation(uint64_t seed, uint32_t *out, uint64_t n);
