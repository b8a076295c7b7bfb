// Upload validation (see upload_check.h).
#include "sync/upload_check.h"

#include <stdint.h>
#include <string.h>

#include "base/error.h"

// Index of the first non-finite value of t (exponent bits all ones), or t->numel if none.
size_t upload_first_non_finite(const StTensor *t) {
    size_t first = t->numel;
    long n = (long)t->numel;
    if (t->dtype == DTYPE_F32) {
#pragma omp parallel for schedule(static) reduction(min : first) if (n > 65536)
        for (long i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, t->data + 4 * (size_t)i, 4);
            if ((bits & 0x7f800000u) == 0x7f800000u && (size_t)i < first) first = (size_t)i;
        }
    } else {
#pragma omp parallel for schedule(static) reduction(min : first) if (n > 65536)
        for (long i = 0; i < n; i++) {
            uint16_t bits = (uint16_t)(t->data[2 * i] | t->data[2 * i + 1] << 8);
            if ((bits & 0x7f80u) == 0x7f80u && (size_t)i < first) first = (size_t)i;
        }
    }
    return first;
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

static int check_values(const StTensor *u, int peer) {
    size_t bad = upload_first_non_finite(u);
    if (bad < u->numel)
        return spes_fail("upload from peer %d: tensor '%s' has a non-finite value (NaN or Inf) at flat index %zu", peer,
                         u->name, bad);
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
        if (!model_spec_peer_sends(spec, mode, experts_per_node, peer, t))
            return spes_fail(
                "upload from peer %d: tensor '%s' belongs to expert %d, owned by peer %d; a peer uploads only "
                "the shared tensors and its own experts",
                peer, u->name, spec->tensors[t].expert, spec->tensors[t].expert / experts_per_node);
        if (row[t]) return spes_fail("upload from peer %d: tensor '%s' appears twice", peer, u->name);
        SPES_TRY(check_tensor(spec, u, t, peer));
        if (values) SPES_TRY(check_values(u, peer));
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
