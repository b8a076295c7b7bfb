// Which experts a SPES peer owns (trains, uploads, and the server takes from it): one rule for
// the peers, the server and `spes plan`.
//
// Each MoE layer's E experts fall in G = E / m groups of m = num_train_experts_per_node
// consecutive experts; peer p owns group p mod G. With num_peers = G (the reference's topology)
// every expert has one owner, expert e peer e / m. With num_peers = r x G every expert has r
// owners, peers g, g + G, ..., g + (r-1) G: expert replicas, whose uploads the server averages
// like the shared tensors (docs/sync.md). Callers check expert_owners_even (the server's
// aggregate_config_check refuses, the peers' config check warns, `spes demo` refuses); where it
// fails the rule still names experts inside [0, E).
#pragma once
#include <stdbool.h>

static inline int expert_groups(int num_experts, int per_node) {
    int g = per_node > 0 ? num_experts / per_node : 0;
    return g > 0 ? g : 1;
}

// The first expert peer `peer` owns; it owns [first, first + per_node).
static inline int expert_first_owned(int peer, int per_node, int num_experts) {
    return (peer % expert_groups(num_experts, per_node)) * per_node;
}

static inline bool expert_owned_by(int expert, int peer, int per_node, int num_experts) {
    return per_node > 0 && expert / per_node == peer % expert_groups(num_experts, per_node);
}

// Whether every expert has the same number of owners, at least one: m in [1, E], m divides E and
// num_peers is a multiple of the E / m groups.
static inline bool expert_owners_even(int num_peers, int per_node, int num_experts) {
    return per_node >= 1 && per_node <= num_experts && num_experts % per_node == 0 &&
           num_peers % (num_experts / per_node) == 0;
}

// Owners per expert when num_peers is a multiple of the groups (1 in the reference's topology).
static inline int expert_replicas(int num_peers, int per_node, int num_experts) {
    return num_peers / expert_groups(num_experts, per_node);
}
