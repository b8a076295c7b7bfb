// PCG64 (XSL-RR 128/64) and numpy's SeedSequence, transcribed from numpy/random
// (_pcg64.pyx, pcg64.h, bit_generator.pyx, distributions.c) so permutations match numpy.
#include "data/pcg64.h"

#define PCG_MULT (((__uint128_t)2549297995355413924ULL << 64) | 4865540595714422341ULL)

// --- SeedSequence(seed).generate_state(4, uint64): 32-bit hash mixing over a 4-word pool.
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_MULT_L 0xca01f9ddu
#define SS_MIX_MULT_R 0x4973f715u
#define SS_XSHIFT 16
#define SS_POOL 4

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t result = SS_MIX_MULT_L * x - SS_MIX_MULT_R * y;
    result ^= result >> SS_XSHIFT;
    return result;
}

static void seed_sequence_state(uint64_t seed, uint64_t out[4]) {
    // the integer seed as little-endian 32-bit words (0 -> one word)
    uint32_t entropy[2];
    int n_entropy = 0;
    do {
        entropy[n_entropy++] = (uint32_t)seed;
        seed >>= 32;
    } while (seed > 0);

    uint32_t pool[SS_POOL];
    uint32_t hash_const = SS_INIT_A;
    for (int i = 0; i < SS_POOL; i++)
        pool[i] = ss_hashmix(i < n_entropy ? entropy[i] : 0, &hash_const);
    for (int src = 0; src < SS_POOL; src++)
        for (int dst = 0; dst < SS_POOL; dst++)
            if (src != dst) pool[dst] = ss_mix(pool[dst], ss_hashmix(pool[src], &hash_const));
    // (entropy never exceeds the pool here, so there is no remaining-entropy pass)

    uint32_t words[8];
    uint32_t hc = SS_INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hc;
        hc *= SS_MULT_B;
        v *= hc;
        v ^= v >> SS_XSHIFT;
        words[i] = v;
    }
    for (int i = 0; i < 4; i++) out[i] = (uint64_t)words[2 * i] | ((uint64_t)words[2 * i + 1] << 32);
}

static void pcg_step(Pcg64 *rng) { rng->state = rng->state * PCG_MULT + rng->inc; }

void pcg64_seed(Pcg64 *rng, uint64_t seed) {
    uint64_t s[4];
    seed_sequence_state(seed, s);
    // pcg64_set_seed: 128-bit constants are (high = word 0, low = word 1)
    __uint128_t initstate = ((__uint128_t)s[0] << 64) | s[1];
    __uint128_t initseq = ((__uint128_t)s[2] << 64) | s[3];
    rng->state = 0;
    rng->inc = (initseq << 1) | 1;
    pcg_step(rng);
    rng->state += initstate;
    pcg_step(rng);
    rng->has_uint32 = 0;
    rng->uinteger = 0;
}

uint64_t pcg64_next64(Pcg64 *rng) {
    pcg_step(rng);
    uint64_t hi = (uint64_t)(rng->state >> 64), lo = (uint64_t)rng->state;
    unsigned rot = (unsigned)(rng->state >> 122);
    uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t pcg64_next32(Pcg64 *rng) {
    if (rng->has_uint32) {
        rng->has_uint32 = 0;
        return rng->uinteger;
    }
    uint64_t next = pcg64_next64(rng);
    rng->has_uint32 = 1;
    rng->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

uint64_t pcg64_interval(Pcg64 *rng, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;   // smallest all-ones mask >= max
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
        while ((value = (pcg64_next32(rng) & mask)) > max) {}
    } else {
        while ((value = (pcg64_next64(rng) & mask)) > max) {}
    }
    return value;
}

void pcg64_permutation(uint64_t seed, uint32_t *out, uint64_t n) {
    Pcg64 rng;
    pcg64_seed(&rng, seed);
    for (uint64_t i = 0; i < n; i++) out[i] = (uint32_t)i;
    // Generator.shuffle on a 1-d array: Fisher-Yates from the end, j = random_interval(i)
    for (uint64_t i = n; i-- > 1;) {
        uint64_t j = pcg64_interval(&rng, i);
        uint32_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}
