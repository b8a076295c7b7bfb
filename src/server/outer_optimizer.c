// DiLoCo-style outer optimizer: the maths of outer_optimizer.h, and its state as bytes.
#include "server/outer_optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

int outer_opt_config_check(const OuterOptConfig *cfg) {
    if (!isfinite(cfg->lr) || cfg->lr <= 0.0f)
        return spes_fail("outer_lr must be a finite number > 0 (1 with outer_momentum 0: the plain mean), got %g",
                         (double)cfg->lr);
    if (!isfinite(cfg->momentum) || cfg->momentum < 0.0f || cfg->momentum >= 1.0f)
        return spes_fail("outer_momentum must be in [0, 1), got %g", (double)cfg->momentum);
    return SPES_OK;
}


int outer_opt_state_init(OuterOptState *s, int num_tensors, const int64_t *numel) {
    memset(s, 0, sizeof *s);
    s->last_step = -1;
    if (num_tensors < 0) return spes_fail("outer optimizer: %d tensors", num_tensors);
    s->num_tensors = num_tensors;
    s->numel = spes_calloc((size_t)(num_tensors ? num_tensors : 1), sizeof *s->numel);
    s->velocity = spes_calloc((size_t)(num_tensors ? num_tensors : 1), sizeof *s->velocity);
    if (!s->numel || !s->velocity) goto fail;
    for (int t = 0; t < num_tensors; t++) {
        if (numel[t] < 0) {
            spes_fail("outer optimizer: tensor %d has %lld elements", t, (long long)numel[t]);
            goto fail;
        }
        s->numel[t] = numel[t];
        if (numel[t] > 0 && !(s->velocity[t] = spes_calloc((size_t)numel[t], sizeof(float)))) goto fail;
    }
    return SPES_OK;
fail:
    outer_opt_state_free(s);
    return SPES_ERR;
}

void outer_opt_state_free(OuterOptState *s) {
    for (int t = 0; s->velocity && t < s->num_tensors; t++) free(s->velocity[t]);
    free(s->velocity);
    free(s->numel);
    memset(s, 0, sizeof *s);
    s->last_step = -1;
}

int outer_opt_step(const OuterOptConfig *cfg, OuterOptState *s, int t, const float *prev, const float *mean,
                   float *out) {
    if (t < 0 || t >= s->num_tensors || s->numel[t] == 0)
        return spes_fail("outer optimizer: tensor %d is not one it covers (%d slots)", t, s->num_tensors);
    int64_t n = s->numel[t];
    if (!prev) {   // the first round: nothing to step from, the mean is the aggregate
        if (out != mean) memmove(out, mean, (size_t)n * sizeof *out);
        return SPES_OK;
    }
    const float lr = cfg->lr, mu = cfg->momentum, keep = 1.0f - lr, lr_mu = lr * mu;
    float *v = s->velocity[t];
    for (int64_t i = 0; i < n; i++) {
        float g = prev[i] - mean[i];
        float vi = mu * v[i] + g;
        v[i] = vi;
        // theta - lr * (g + mu * v) == mean + (1 - lr) * g - lr * mu * v
        float correction = keep * g - lr_mu * vi;
        out[i] = correction == 0.0f ? mean[i] : mean[i] + correction;
    }
    return SPES_OK;
}

void outer_opt_end_round(OuterOptState *s, int64_t step) {
    s->rounds++;
    s->last_step = step;
}

// ---------------------------------------------------------------------------------------
// Bytes: fixed little-endian layout (outer_optimizer.h), FNV-1a checksum at the end.

static const char MAGIC[8] = {'S', 'P', 'E', 'S', 'O', 'O', 'P', 'T'};
#define OUTER_OPT_VERSION 1u
#define HEADER_BYTES (8 + 4 + 4 + 8 + 8)

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + 8;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

size_t outer_opt_state_size(const OuterOptState *s) {
    size_t n = HEADER_BYTES + 8 * (size_t)s->num_tensors + 8;
    for (int t = 0; t < s->num_tensors; t++) n += 4 * (size_t)s->numel[t];
    return n;
}

void outer_opt_state_serialise(const OuterOptState *s, uint8_t *buf) {
    uint8_t *p = buf;
    memcpy(p, MAGIC, 8);
    p += 8;
    p = put_u32(p, OUTER_OPT_VERSION);
    p = put_u32(p, (uint32_t)s->num_tensors);
    p = put_u64(p, (uint64_t)s->rounds);
    p = put_u64(p, (uint64_t)s->last_step);
    for (int t = 0; t < s->num_tensors; t++) p = put_u64(p, (uint64_t)s->numel[t]);
    for (int t = 0; t < s->num_tensors; t++)
        for (int64_t i = 0; i < s->numel[t]; i++) {
            uint32_t bits;
            memcpy(&bits, &s->velocity[t][i], 4);
            p = put_u32(p, bits);
        }
    put_u64(p, fnv1a(buf, (size_t)(p - buf)));
}

int outer_opt_state_restore(OuterOptState *s, const uint8_t *buf, size_t len, int expect_num_tensors,
                            const int64_t *expect_numel, const char *what) {
    memset(s, 0, sizeof *s);
    s->last_step = -1;
    if (len < HEADER_BYTES + 8) return spes_fail("%s: outer optimizer state truncated (%zu bytes)", what, len);
    if (memcmp(buf, MAGIC, 8) != 0) return spes_fail("%s: not an outer optimizer state (bad magic)", what);
    uint32_t version = get_u32(buf + 8), num_tensors = get_u32(buf + 12);
    if (version != OUTER_OPT_VERSION)
        return spes_fail("%s: outer optimizer state version %u, this build reads %u", what, version, OUTER_OPT_VERSION);
    if (get_u64(buf + len - 8) != fnv1a(buf, len - 8))
        return spes_fail("%s: outer optimizer state checksum mismatch (damaged or truncated file)", what);
    // The checksum covers the sizes, but a state from another writer must still fit its bytes.
    if (num_tensors > INT32_MAX || num_tensors > (len - HEADER_BYTES - 8) / 8)
        return spes_fail("%s: outer optimizer state claims %u tensors in %zu bytes", what, num_tensors, len);
    if (expect_numel && (int64_t)num_tensors != expect_num_tensors)
        return spes_fail("%s: outer optimizer state has %u tensors, the model %d", what, num_tensors, expect_num_tensors);
    const uint8_t *sizes = buf + HEADER_BYTES;
    size_t body = len - HEADER_BYTES - 8 - 8 * (size_t)num_tensors, need = 0;
    int64_t *numel = spes_calloc(num_tensors ? num_tensors : 1, sizeof *numel);
    if (!numel) return SPES_ERR;
    for (uint32_t t = 0; t < num_tensors; t++) {
        uint64_t n = get_u64(sizes + 8 * (size_t)t);
        if (n > body / 4 || need + 4 * n > body) {
            free(numel);
            return spes_fail("%s: outer optimizer state tensor %u claims %llu elements, more than the file holds", what,
                             t, (unsigned long long)n);
        }
        if (expect_numel && (int64_t)n != expect_numel[t]) {
            free(numel);
            return spes_fail("%s: outer optimizer state tensor %u has %llu elements, the model %lld", what, t,
                             (unsigned long long)n, (long long)expect_numel[t]);
        }
        numel[t] = (int64_t)n;
        need += 4 * n;
    }
    if (need != body) {
        free(numel);
        return spes_fail("%s: outer optimizer state has %zu bytes of momentum, its sizes say %zu", what, body, need);
    }
    int64_t rounds = (int64_t)get_u64(buf + 16), last_step = (int64_t)get_u64(buf + 24);
    if (rounds < 0 || last_step < -1) {
        free(numel);
        return spes_fail("%s: outer optimizer state has %lld rounds, last step %lld", what, (long long)rounds,
                         (long long)last_step);
    }
    int rc = outer_opt_state_init(s, (int)num_tensors, numel);
    free(numel);
    if (rc != SPES_OK) return spes_fail_context("%s", what);
    s->rounds = rounds;
    s->last_step = last_step;
    const uint8_t *p = sizes + 8 * (size_t)num_tensors;
    for (int t = 0; t < s->num_tensors; t++)
        for (int64_t i = 0; i < s->numel[t]; i++, p += 4) {
            uint32_t bits = get_u32(p);
            memcpy(&s->velocity[t][i], &bits, 4);
        }
    return SPES_OK;
}
