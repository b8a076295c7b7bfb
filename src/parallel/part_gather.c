// ZeRO-3's part gather (part_gather.h): one all-gather of the part's range of the gradient
// layout, straight into the working buffer when the part has no frozen tensor (the range is
// then laid out as the part's span), else into a staging buffer and a copy per tensor.
#include "parallel/part_gather.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "parallel/data_parallel.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

// The part's range [glo, ghi) of the gradient layout (its trainable tensors).
static void part_grad_range(const PartGather *g, int part, size_t *glo, size_t *ghi) {
    size_t numel;
    param_part_grad_span(g->table, part, g->n_layers, glo, &numel);
    *ghi = *glo + numel;
}

// Every tensor of the part trainable: its range of the gradient layout is its span, value for value.
static bool all_trainable(const PartGather *g, int part) {
    size_t glo, ghi, offset, numel;
    part_grad_range(g, part, &glo, &ghi);
    param_part_span(g->table, part, g->n_layers, &offset, &numel);
    return ghi - glo == numel;
}

size_t part_gather_staging_values(const ParamTable *table, int n_layers) {
    PartGather g = {.table = table, .n_layers = n_layers};
    size_t staged = 0;
    for (int p = 0; p <= n_layers + 1; p++) {
        size_t glo, ghi;
        part_grad_range(&g, p, &glo, &ghi);
        if (!all_trainable(&g, p)) staged = max_sz(staged, ghi - glo);   // a part with frozen tensors
    }
    return staged;
}

int part_gather_create(PartGather *g, Comm *comm, Backend *be, const ParamTable *table, int n_layers,
                       const size_t *lo, int slots) {
    memset(g, 0, sizeof *g);
    if (slots < 1 || slots > 2) return spes_fail("part_gather: %d slots (1 or 2)", slots);
    g->comm = comm, g->be = be, g->table = table, g->n_layers = n_layers, g->lo = lo, g->slots = slots;
    g->rank = comm_rank(comm), g->size = comm_size(comm);
    if (!(g->frozen_at = spes_calloc((size_t)table->count, sizeof *g->frozen_at))) return SPES_ERR;
    for (int i = 0; i < table->count; i++) {
        if (table->entries[i].trainable) continue;
        g->frozen_at[i] = g->frozen_numel;
        g->frozen_numel += table->entries[i].numel;
    }
    size_t largest = 0;
    for (int p = 0; p <= n_layers + 1; p++) {
        size_t glo, ghi;
        part_grad_range(g, p, &glo, &ghi);
        largest = max_sz(largest, ghi - glo);
    }
    g->gathered_n = part_gather_staging_values(table, n_layers);
    if (largest > INT_MAX) return spes_fail("part_gather: a part of %zu trainable values exceeds one collective's count", largest);
    for (int s = 0; s < slots; s++) {
        if (g->gathered_n && backend_alloc(be, g->gathered_n * sizeof(float), (void **)&g->gathered[s]) != SPES_OK)
            return spes_fail_context("part_gather: staging for %zu values", g->gathered_n);
        if (!(g->counts[s] = spes_calloc((size_t)g->size, sizeof *g->counts[s]))) return SPES_ERR;
    }
    return SPES_OK;
}

void part_gather_free(PartGather *g) {
    free(g->frozen_at);
    for (int s = 0; s < 2; s++) {
        if (g->be) backend_free(g->be, g->gathered[s]);
        free(g->counts[s]);
    }
    memset(g, 0, sizeof *g);
}

void part_pack_frozen(const PartGather *g, const float *params, float *store) {
    for (int i = 0; i < g->table->count; i++) {
        const ParamInfo *pi = &g->table->entries[i];
        if (!pi->trainable)
            g->be->ops->copy(g->be, store + g->frozen_at[i], params + pi->offset, pi->numel * sizeof(float));
    }
}

int part_gather_start(PartGather *g, int slot, int part, const float *shard, float *work) {
    if (part < 0 || part > g->n_layers + 1)
        return spes_fail("part_gather: part %d out of range [0, %d]", part, g->n_layers + 1);
    if (slot < 0 || slot >= g->slots) return spes_fail("part_gather: slot %d of %d", slot, g->slots);
    size_t glo, ghi;
    part_grad_range(g, part, &glo, &ghi);
    float *dst = all_trainable(g, part) ? work : g->gathered[slot];
    // Block r: the range's overlap with rank r's shard, at its place in the range.
    int *counts = g->counts[slot];
    dp_range_counts(g->lo, g->size, glo, ghi, counts);
    size_t mine, n = dp_shard_overlap(g->lo, g->rank, glo, ghi, &mine);
    if (n) g->be->ops->copy(g->be, dst + (mine - glo), shard + (mine - g->lo[g->rank]), n * sizeof(float));
    return ghi > glo ? comm_start_allgather(g->comm, g->be, dst, counts) : SPES_OK;
}

void part_gather_finish(PartGather *g, int slot, int part, const float *frozen, float *work) {
    if (all_trainable(g, part)) return;   // gathered in place
    size_t glo, ghi, offset, numel;
    part_grad_range(g, part, &glo, &ghi);
    param_part_span(g->table, part, g->n_layers, &offset, &numel);
    for (int i = 0; i < g->table->count; i++) {
        const ParamInfo *pi = &g->table->entries[i];
        if (param_part(pi, g->n_layers) != part) continue;
        const float *src = pi->trainable ? g->gathered[slot] + ((size_t)pi->grad_offset - glo) : frozen + g->frozen_at[i];
        g->be->ops->copy(g->be, work + (pi->offset - offset), src, pi->numel * sizeof(float));
    }
}

int part_gather(PartGather *g, int part, const float *shard, const float *frozen, float *work) {
    SPES_TRY(part_gather_start(g, 0, part, shard, work));
    SPES_TRY(comm_wait_all(g->comm));
    part_gather_finish(g, 0, part, frozen, work);
    return SPES_OK;
}
