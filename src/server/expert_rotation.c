// Expert rotation (see expert_rotation.h).
#include "server/expert_rotation.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

bool expert_rotation_due(int rotation_steps, int step) {
    return rotation_steps > 0 && step > 0 && step % rotation_steps == 0;
}

// Tensor index of MoE layer `layer`'s router, -1 if absent.
static int router_tensor(const ModelSpec *spec, int layer) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", layer);
    return model_spec_find(spec, name);
}

int expert_rotation_check(const ModelSpec *spec, int experts_per_node) {
    int E = spec->num_experts;
    if (E < 1) return spes_fail("expert rotation: the model has no experts");
    if (experts_per_node < 1 || E % experts_per_node != 0)
        return spes_fail("expert rotation: %d experts per peer do not divide the %d experts of a layer", experts_per_node, E);
    for (int s = 0; s < spec->num_moe_layers; s++) {
        int layer = spec->moe_layers[s], t = router_tensor(spec, layer);
        if (t < 0)
            return spes_fail("expert rotation: MoE layer %d has no router 'model.layers.%d.mlp.gate.weight'", layer, layer);
        const SpecTensor *r = &spec->tensors[t];
        if (r->ndim != 2 || r->shape[0] != E)
            return spes_fail("expert rotation: router '%s' is not [%d experts, hidden] (its first dimension is %lld)", r->name,
                             E, (long long)r->shape[0]);
    }
    return SPES_OK;
}

// slot[(i + shift) % n] = old slot[i] for n slots of `size` bytes, following the rotation's
// gcd(n, shift) cycles with one slot of scratch.
static void rotate_slots(uint8_t *const *slot, int n, int shift, size_t size, uint8_t *tmp) {
    int cycles = n, b = shift;   // gcd(n, shift)
    while (b) {
        int r = cycles % b;
        cycles = b;
        b = r;
    }
    for (int c = 0; c < cycles; c++) {
        memcpy(tmp, slot[c], size);
        int j = c;
        for (int from = (j - shift + n) % n; from != c; from = (j - shift + n) % n) {
            memcpy(slot[j], slot[from], size);
            j = from;
        }
        memcpy(slot[j], tmp, size);
    }
}

int expert_rotation_apply(const ModelSpec *spec, int experts_per_node, uint8_t *const *tensors, size_t elem_size) {
    SPES_TRY(expert_rotation_check(spec, experts_per_node));
    int E = spec->num_experts, shift = experts_per_node % E;
    if (shift == 0) return SPES_OK;   // one peer owns every expert: nothing moves
    size_t largest = 0;
    for (int t = 0; t < spec->count; t++)
        if (spec->tensors[t].numel > largest) largest = spec->tensors[t].numel;
    uint8_t *tmp = spes_malloc(largest * elem_size);
    uint8_t **slot = spes_calloc((size_t)E, sizeof *slot);
    int rc = tmp && slot ? SPES_OK : SPES_ERR;
    for (int s = 0; rc == SPES_OK && s < spec->num_moe_layers; s++) {
        for (int p = 0; p < EXPERT_PROJ_COUNT; p++) {
            size_t numel = spec->tensors[model_spec_expert_tensor(spec, s, 0, p)].numel;
            for (int e = 0; e < E; e++) slot[e] = tensors[model_spec_expert_tensor(spec, s, e, p)];
            rotate_slots(slot, E, shift, numel * elem_size, tmp);
        }
        int router = router_tensor(spec, spec->moe_layers[s]);
        size_t row = spec->tensors[router].numel / (size_t)E * elem_size;
        for (int e = 0; e < E; e++) slot[e] = tensors[router] + (size_t)e * row;
        rotate_slots(slot, E, shift, row, tmp);
    }
    free(tmp);
    free(slot);
    return rc;
}
