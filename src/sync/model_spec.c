// Model spec: tensor list, expert classification by HF name, fingerprint, differences.
#include "sync/model_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "sync/expert_owners.h"

const char *sync_mode_name(SyncMode mode) { return mode == SYNC_MODE_FEDAVG ? "fedavg" : "spes"; }

int sync_mode_parse(const char *name, SyncMode *out) {
    if (!strcmp(name, "spes")) *out = SYNC_MODE_SPES;
    else if (!strcmp(name, "fedavg")) *out = SYNC_MODE_FEDAVG;
    else return spes_fail("sync mode '%s' is not one of spes, fedavg", name);
    return SPES_OK;
}

bool outer_opt_is_off(const OuterOptConfig *cfg) { return cfg->lr == 1.0f && cfg->momentum == 0.0f; }

void model_spec_init(ModelSpec *spec) { memset(spec, 0, sizeof *spec); }

void model_spec_free(ModelSpec *spec) {
    for (int i = 0; i < spec->count; i++) free(spec->tensors[i].name);
    free(spec->tensors);
    free(spec->moe_layers);
    free(spec->expert_tensor);
    free(spec->hash_slots);
    model_spec_init(spec);
}

// Parses "model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight"; false for any other name.
static bool parse_expert_name(const char *name, int *layer, int *expert, int *proj) {
    int l, e, used = 0;
    char which[8];
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%7[a-z]_proj.weight%n", &l, &e, which, &used) != 3) return false;
    if (name[used] != '\0' || l < 0 || e < 0) return false;
    // sscanf's %d accepts "+1" or " 1"; only canonical decimal names count as experts.
    char canonical[160];
    snprintf(canonical, sizeof canonical, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, which);
    if (strcmp(canonical, name) != 0) return false;
    if (!strcmp(which, "gate")) *proj = EXPERT_PROJ_GATE;
    else if (!strcmp(which, "up")) *proj = EXPERT_PROJ_UP;
    else if (!strcmp(which, "down")) *proj = EXPERT_PROJ_DOWN;
    else return false;
    *layer = l;
    *expert = e;
    return true;
}

int model_spec_add(ModelSpec *spec, const char *name, DType dtype, int ndim, const int64_t *shape) {
    if (!name || !name[0] || strlen(name) > 1024)
        return spes_fail("model spec: tensor name is empty or longer than 1024 bytes");
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16)
        return spes_fail("model spec: tensor '%s' has dtype %s; only F32 and BF16 models are synchronised", name,
                         dtype_name(dtype));
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return spes_fail("model spec: tensor '%s' has %d dimensions (max %d)", name, ndim, ST_MAX_DIMS);
    if (spec->count == spec->capacity) {
        int cap = spec->capacity ? spec->capacity * 2 : 64;
        SpecTensor *grown = spes_realloc(spec->tensors, (size_t)cap * sizeof *grown);
        if (!grown) return SPES_ERR;
        spec->tensors = grown;
        spec->capacity = cap;
    }
    SpecTensor *t = &spec->tensors[spec->count];
    memset(t, 0, sizeof *t);
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] > 0 && t->numel > ((size_t)1 << 40) / (size_t)shape[d]))
            return spes_fail("model spec: tensor '%s' has an invalid or absurd shape (dimension %d = %lld)", name, d,
                             (long long)shape[d]);
        t->numel *= (size_t)shape[d];
        t->shape[d] = shape[d];
    }
    t->name = spes_strdup(name);
    if (!t->name) return SPES_ERR;
    t->dtype = dtype;
    t->ndim = ndim;
    t->layer = t->expert = t->proj = -1;
    parse_expert_name(name, &t->layer, &t->expert, &t->proj);
    spec->count++;
    return SPES_OK;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t name_hash(const char *name) { return fnv1a(0xcbf29ce484222325ull, name, strlen(name)); }

int model_spec_find(const ModelSpec *spec, const char *name) {
    if (!spec->hash_capacity) return -1;
    size_t mask = (size_t)spec->hash_capacity - 1;
    for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
        int slot = spec->hash_slots[i];
        if (slot == 0) return -1;
        if (!strcmp(spec->tensors[slot - 1].name, name)) return slot - 1;
    }
}

static int build_name_index(ModelSpec *spec) {
    int cap = 16;
    while (cap < 2 * spec->count) cap *= 2;
    spec->hash_slots = spes_calloc((size_t)cap, sizeof(int));
    if (!spec->hash_slots) return SPES_ERR;
    spec->hash_capacity = cap;
    for (int t = 0; t < spec->count; t++) {
        if (model_spec_find(spec, spec->tensors[t].name) >= 0)
            return spes_fail("model spec: tensor '%s' is listed twice", spec->tensors[t].name);
        size_t mask = (size_t)cap - 1, i = name_hash(spec->tensors[t].name) & mask;
        while (spec->hash_slots[i]) i = (i + 1) & mask;
        spec->hash_slots[i] = t + 1;
    }
    return SPES_OK;
}

static void format_shape(const int64_t *shape, int ndim, char *out, size_t cap) {
    size_t at = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && at < cap; d++)
        at += (size_t)snprintf(out + at, cap - at, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (at < cap) snprintf(out + at, cap - at, "]");
}

static bool same_shape(const SpecTensor *a, const SpecTensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

// Finds the MoE layers and E, fills expert_tensor, and checks the expert structure.
static int index_experts(ModelSpec *spec) {
    int max_layer = -1, max_expert = -1;
    for (int t = 0; t < spec->count; t++) {
        const SpecTensor *st = &spec->tensors[t];
        if (st->expert < 0) continue;
        if (st->layer > max_layer) max_layer = st->layer;
        if (st->expert > max_expert) max_expert = st->expert;
    }
    if (max_expert < 0) return SPES_OK;   // a dense model: everything is shared
    if (max_layer > 100000 || max_expert > 100000)
        return spes_fail("model spec: expert tensor names give layer %d / expert %d; that many is not a real model",
                         max_layer, max_expert);
    int E = max_expert + 1;
    int *slot_of_layer = spes_malloc((size_t)(max_layer + 1) * sizeof(int));
    if (!slot_of_layer) return SPES_ERR;
    for (int l = 0; l <= max_layer; l++) slot_of_layer[l] = -1;
    size_t n_expert_tensors = 0;
    for (int t = 0; t < spec->count; t++)
        if (spec->tensors[t].expert >= 0) {
            slot_of_layer[spec->tensors[t].layer] = 0;
            n_expert_tensors++;
        }
    int L = 0;
    for (int l = 0; l <= max_layer; l++)
        if (slot_of_layer[l] == 0) slot_of_layer[l] = L++;
    // Names are unique, so a complete model has exactly L * E * 3 expert tensors. The table
    // below has that many entries: when the names cannot come near filling it (a few names like
    // "...layers.{l}.mlp.experts.99999..." would otherwise cost gigabytes), refuse before
    // allocating, so the work stays proportional to the list we were given. Near misses go on
    // to the check below, which names the first missing tensor.
    size_t box = (size_t)L * (size_t)E * EXPERT_PROJ_COUNT;
    if (box > 2 * n_expert_tensors + 64) {
        free(slot_of_layer);
        return spes_fail("model spec: %zu expert tensors, but their names span %d MoE layers x %d experts x 3 "
                         "projections = %zu; every MoE layer needs experts 0..%d with gate, up and down",
                         n_expert_tensors, L, E, box, E - 1);
    }
    spec->num_experts = E;
    spec->num_moe_layers = L;
    spec->moe_layers = spes_malloc((size_t)L * sizeof(int));
    spec->expert_tensor = spes_malloc((size_t)L * E * EXPERT_PROJ_COUNT * sizeof(int));
    if (!spec->moe_layers || !spec->expert_tensor) {
        free(slot_of_layer);
        return SPES_ERR;
    }
    for (int l = 0; l <= max_layer; l++)
        if (slot_of_layer[l] >= 0) spec->moe_layers[slot_of_layer[l]] = l;
    for (size_t i = 0; i < (size_t)L * E * EXPERT_PROJ_COUNT; i++) spec->expert_tensor[i] = -1;
    for (int t = 0; t < spec->count; t++) {
        const SpecTensor *st = &spec->tensors[t];
        if (st->expert >= 0)
            spec->expert_tensor[((size_t)slot_of_layer[st->layer] * E + st->expert) * EXPERT_PROJ_COUNT + st->proj] = t;
    }
    free(slot_of_layer);
    static const char *proj_names[] = {"gate", "up", "down"};
    for (int s = 0; s < L; s++)
        for (int p = 0; p < EXPERT_PROJ_COUNT; p++)
            for (int e = 0; e < E; e++) {
                int t = model_spec_expert_tensor(spec, s, e, p);
                if (t < 0)
                    return spes_fail(
                        "model spec: layer %d has %d experts but no model.layers.%d.mlp.experts.%d.%s_proj.weight",
                        spec->moe_layers[s], E, spec->moe_layers[s], e, proj_names[p]);
                const SpecTensor *first = &spec->tensors[model_spec_expert_tensor(spec, s, 0, p)];
                if (!same_shape(&spec->tensors[t], first))
                    return spes_fail("model spec: '%s' and '%s' differ in shape; experts of one layer must be alike",
                                     spec->tensors[t].name, first->name);
            }
    return SPES_OK;
}

int model_spec_finish(ModelSpec *spec) {
    if (spec->count == 0) return spes_fail("model spec: no tensors");
    SPES_TRY(build_name_index(spec));
    SPES_TRY(index_experts(spec));
    uint64_t h = 0xcbf29ce484222325ull;
    spec->total_numel = 0;
    for (int t = 0; t < spec->count; t++) {
        const SpecTensor *st = &spec->tensors[t];
        char line[1200], shape[256];
        format_shape(st->shape, st->ndim, shape, sizeof shape);
        int n = snprintf(line, sizeof line, "%s %s %s\n", st->name, dtype_name(st->dtype), shape);
        h = fnv1a(h, line, (size_t)n);
        spec->total_numel += st->numel;
    }
    spec->fingerprint = h;
    return SPES_OK;
}

bool model_spec_peer_sends(const ModelSpec *spec, SyncMode mode, int experts_per_node, int peer, int t) {
    if (mode == SYNC_MODE_FEDAVG) return true;
    int e = spec->tensors[t].expert;
    return e < 0 || expert_owned_by(e, peer, experts_per_node, spec->num_experts);
}

void model_spec_describe_difference(const ModelSpec *a, const ModelSpec *b, char *msg, size_t cap) {
    char sa[256], sb[256];
    for (int t = 0; t < a->count; t++) {
        const SpecTensor *x = &a->tensors[t];
        int j = model_spec_find(b, x->name);
        if (j < 0) {
            snprintf(msg, cap, "tensor '%s' exists here but not in the peer's model", x->name);
            return;
        }
        const SpecTensor *y = &b->tensors[j];
        if (!same_shape(x, y)) {
            format_shape(x->shape, x->ndim, sa, sizeof sa);
            format_shape(y->shape, y->ndim, sb, sizeof sb);
            snprintf(msg, cap, "tensor '%s': shape %s here, %s from the peer", x->name, sa, sb);
            return;
        }
        if (x->dtype != y->dtype) {
            snprintf(msg, cap, "tensor '%s': dtype %s here, %s from the peer", x->name, dtype_name(x->dtype),
                     dtype_name(y->dtype));
            return;
        }
    }
    for (int t = 0; t < b->count; t++)
        if (model_spec_find(a, b->tensors[t].name) < 0) {
            snprintf(msg, cap, "tensor '%s' is in the peer's model but not here", b->tensors[t].name);
            return;
        }
    for (int t = 0; t < a->count; t++)
        if (strcmp(a->tensors[t].name, b->tensors[t].name) != 0) {
            snprintf(msg, cap, "same tensors in a different order (position %d: '%s' here, '%s' from the peer)", t,
                     a->tensors[t].name, b->tensors[t].name);
            return;
        }
    snprintf(msg, cap, "no difference in the tensor lists");
}

// A layer's expert count: its router's rows ([E, H], a shared tensor every spes upload carries),
// else `fallback`. With expert replicas E is less than peers x experts per peer, so the
// router, not the server's topology, says how many experts a layer has.
static int layer_experts(const SafeTensors *upload, int layer, int fallback) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", layer);
    const StTensor *router = safetensors_find(upload, name);
    if (!router || router->ndim != 2 || router->shape[0] < 1 || router->shape[0] > fallback) return fallback;
    return (int)router->shape[0];
}

int model_spec_infer_from_upload(const SafeTensors *upload, SyncMode mode, int num_experts, ModelSpec *out) {
    model_spec_init(out);
    // Which layers already had their experts emitted.
    int emitted_cap = 0, *emitted = NULL, n_emitted = 0;
    int rc = SPES_OK;
    for (int i = 0; i < upload->count && rc == SPES_OK; i++) {
        const StTensor *u = &upload->tensors[i];
        int layer, expert, proj;
        if (mode == SYNC_MODE_FEDAVG || !parse_expert_name(u->name, &layer, &expert, &proj)) {
            rc = model_spec_add(out, u->name, DTYPE_F32, u->ndim, u->shape);
            continue;
        }
        bool done = false;
        for (int k = 0; k < n_emitted; k++) done |= emitted[k] == layer;
        if (done) continue;
        if (n_emitted == emitted_cap) {
            emitted_cap = emitted_cap ? 2 * emitted_cap : 16;
            int *grown = spes_realloc(emitted, (size_t)emitted_cap * sizeof(int));
            if (!grown) {
                rc = SPES_ERR;
                break;
            }
            emitted = grown;
        }
        emitted[n_emitted++] = layer;
        // Shapes of this layer's three projections, from the first uploaded expert of each.
        const StTensor *proj_shape[EXPERT_PROJ_COUNT] = {NULL, NULL, NULL};
        for (int j = i; j < upload->count; j++) {
            int l2, e2, p2;
            if (parse_expert_name(upload->tensors[j].name, &l2, &e2, &p2) && l2 == layer && !proj_shape[p2])
                proj_shape[p2] = &upload->tensors[j];
        }
        static const char *proj_names[] = {"gate", "up", "down"};
        int experts = layer_experts(upload, layer, num_experts);
        for (int e = 0; e < experts && rc == SPES_OK; e++)
            for (int p = 0; p < EXPERT_PROJ_COUNT && rc == SPES_OK; p++) {
                if (!proj_shape[p]) {
                    rc =
                        spes_fail("cannot infer the model from the first upload: layer %d has no %s_proj expert tensor",
                                  layer, proj_names[p]);
                    break;
                }
                char name[160];
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", layer, e, proj_names[p]);
                rc = model_spec_add(out, name, DTYPE_F32, proj_shape[p]->ndim, proj_shape[p]->shape);
            }
    }
    free(emitted);
    if (rc == SPES_OK) rc = model_spec_finish(out);
    if (rc != SPES_OK) {
        model_spec_free(out);
        return spes_fail_context("inferring the model spec from the first upload");
    }
    return SPES_OK;
}
