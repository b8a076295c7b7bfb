// Upload validation (see upload_check.h).
#include "server/upload_check.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "sync/expert_owners.h"

// Widened to F32, the bits of value i of t (F32 or BF16).
static uint32_t value_bits(const StTensor *t, size_t i) {
    uint32_t bits;
    if (t->dtype == DTYPE_F32) {
        memcpy(&bits, t->data + 4 * i, 4);
        return bits;
    }
    return (uint32_t)(t->data[2 * i] | t->data[2 * i + 1] << 8) << 16;
}

// Index of the first value of t that is not finite or beyond +-SYNC_MAX_WEIGHT, or t->numel if
// none. On the magnitude bits: NaN and Inf are above every finite bound.
static size_t first_bad_value(const StTensor *t) {
    float bound = SYNC_MAX_WEIGHT;
    uint32_t limit;
    memcpy(&limit, &bound, 4);
    size_t first = t->numel;
    long n = (long)t->numel;
#pragma omp parallel for schedule(static) reduction(min : first) if (n > 65536)
    for (long i = 0; i < n; i++)
        if ((value_bits(t, (size_t)i) & 0x7fffffffu) > limit && (size_t)i < first) first = (size_t)i;
    return first;
}

int upload_check_values(const StTensor *t, size_t first, int peer, const char *name) {
    size_t bad = first_bad_value(t);
    if (bad == t->numel) return SPES_OK;
    uint32_t bits = value_bits(t, bad);
    float v;
    memcpy(&v, &bits, 4);
    if (!isfinite(v))
        return spes_fail("upload from peer %d: tensor '%s' has a non-finite value (NaN or Inf) at flat index %zu", peer,
                         name, first + bad);
    return spes_fail("upload from peer %d: tensor '%s' has the value %g at flat index %zu, beyond +-%g (the largest "
                     "weight a sync payload may carry; no healthy peer sends it)",
                     peer, name, (double)v, first + bad, (double)SYNC_MAX_WEIGHT);
}

static int check_tensor(const ModelSpec *spec, const StTensor *u, int t, int peer) {
    const SpecTensor *st = &spec->tensors[t];
    if (u->dtype != DTYPE_F32 && u->dtype != DTYPE_BF16)
        return spes_fail("upload from peer %d: tensor '%s' has dtype %s; uploads must be F32 or BF16", peer, u->name,
                         dtype_name(u->dtype));
    bool same = u->ndim == st->ndim;
    for (int d = 0; same && d < st->ndim; d++) same = u->shape[d] == st->shape[d];
    if (!same) {
        char got[128] = "", want[128] = "";
        for (int d = 0, at = 0; d < u->ndim && at < 100; d++)
            at += snprintf(got + at, sizeof got - (size_t)at, " %lld", (long long)u->shape[d]);
        for (int d = 0, at = 0; d < st->ndim && at < 100; d++)
            at += snprintf(want + at, sizeof want - (size_t)at, " %lld", (long long)st->shape[d]);
        return spes_fail("upload from peer %d: tensor '%s' has shape [%s ] but the model's is [%s ]", peer, u->name,
                         got, want);
    }
    return SPES_OK;
}

static int check(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, const SafeTensors *upload,
                 const StTensor **row, bool values) {
    for (int t = 0; t < spec->count; t++) row[t] = NULL;
    for (int i = 0; i < upload->count; i++) {
        const StTensor *u = &upload->tensors[i];
        int t = model_spec_find(spec, u->name);
        if (t < 0)
            return spes_fail("upload from peer %d: tensor '%s' is not part of the model agreed at the handshake", peer,
                             u->name);
        if (!model_spec_peer_sends(spec, mode, experts_per_node, peer, t)) {
            int groups = expert_groups(spec->num_experts, experts_per_node), owner = spec->tensors[t].expert / experts_per_node,
                first = expert_first_owned(peer, experts_per_node, spec->num_experts);
            return spes_fail(
                "upload from peer %d: tensor '%s' belongs to expert %d, owned by peer %d (with replicas also peers "
                "%d + k x %d); this peer owns experts %d to %d, and a peer uploads only the shared tensors and its "
                "own experts",
                peer, u->name, spec->tensors[t].expert, owner, owner, groups, first, first + experts_per_node - 1);
        }
        if (row[t]) return spes_fail("upload from peer %d: tensor '%s' appears twice", peer, u->name);
        SPES_TRY(check_tensor(spec, u, t, peer));
        if (values) SPES_TRY(upload_check_values(u, 0, peer, u->name));
        row[t] = u;
    }
    int missing = 0, first_missing = -1;
    for (int t = 0; t < spec->count; t++)
        if (!row[t] && model_spec_peer_sends(spec, mode, experts_per_node, peer, t)) {
            if (first_missing < 0) first_missing = t;
            missing++;
        }
    if (missing)
        return spes_fail(
            "upload from peer %d: tensor '%s' is missing (%d of the tensors this peer must send are missing)", peer,
            spec->tensors[first_missing].name, missing);
    return SPES_OK;
}

int upload_check(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, const SafeTensors *upload,
                 const StTensor **row) {
    return check(spec, mode, experts_per_node, peer, upload, row, true);
}

int upload_rows(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, const SafeTensors *upload,
                const StTensor **row) {
    return check(spec, mode, experts_per_node, peer, upload, row, false);
}

size_t upload_max_bytes(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer) {
    size_t bytes = 64 * 1024;   // header JSON: generous room for names and metadata
    for (int t = 0; t < spec->count; t++)
        if (model_spec_peer_sends(spec, mode, experts_per_node, peer, t)) bytes += spec->tensors[t].numel * 4 + 256;
    return bytes;
}
