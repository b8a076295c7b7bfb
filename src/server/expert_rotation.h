// Expert rotation (spes mode, opt-in: spes server --expert_rotation_steps N; issue #28).
//
// On the aggregates of steps that are multiples of N, each MoE layer's experts move one peer on:
// expert e's gate/up/down tensors and its router row (row e of model.layers.L.mlp.gate.weight,
// [E, H]) go to position (e + m) mod E, m = experts per peer. Peer p always trains positions
// [p*m, (p+1)*m), so the next round it trains what peer p-1 trained, and over P rotations every
// expert is trained by every peer. Positions are only labels (the router's row e scores the
// expert at position e), so a rotated model computes the same function.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sync/model_spec.h"

// rotation_steps > 0 and step one of its multiples (step > 0).
bool expert_rotation_due(int rotation_steps, int step);

// Every MoE layer of spec has a router 'model.layers.L.mlp.gate.weight' of shape [E, H] and
// experts_per_node divides E. Names what is missing.
int expert_rotation_check(const ModelSpec *spec, int experts_per_node);

// Rotates in place: tensors[t] holds tensor t of spec, elem_size bytes per value (4: F32, 2: BF16).
int expert_rotation_apply(const ModelSpec *spec, int experts_per_node, uint8_t *const *tensors, size_t elem_size);
