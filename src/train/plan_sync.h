// What a SPES run sends through its parameter server, before it starts (`spes plan`): bytes up
// and down per peer and the server's egress, per round, for each spes_config.payload_dtype.
//
// The sizes come from the writers the peers and the server use: safetensors_build_header (the
// header safetensors_serialize writes) over the tensors each side sends, and delta_payload_bytes
// (delta_payload.h) for int8/int4 deltas; the tensors are the parameter table's, with each
// peer's trainable mask (trainer_own_experts). What goes over the wire, round by round (the
// peer's sync, src/train/spes_peer.c, and the server's views, rounds_view in src/server/rounds.c):
//   f32 / bf16: up, the peer's trainable tensors in that dtype; down, the aggregate (every tensor)
//               without the peer's own experts (view "omit-own-experts").
//   int8/int4:  round 1 (no aggregate to be a delta against yet): up, the trainable tensors in
//               F32; down, the whole aggregate in F32. Later rounds: up, the trainable tensors'
//               delta against the previous round's aggregate; down, the aggregate's delta against
//               it without the peer's own experts.
//   With expert replicas (num_peers x m a multiple of the experts) the own experts come down too.
// Not counted: gRPC/HTTP2/TCP framing (docs/communication.md measured ~5% on top), the Hello and
// status calls, resent uploads, expert-merging rounds (the server's --merge_interval: their
// download includes the own experts), expert-rotation rounds (--expert_rotation_steps: the whole
// aggregate in F32) and rejoining peers (they fetch the whole aggregate).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

typedef struct {
    PayloadDtype dtype;
    size_t up_first, down_first;   // round 1, for peer cfg->peer_id (bytes)
    size_t up, down;               // a later round (its base the round before), same peer
    size_t egress_first, egress;   // the server: every peer's download of such a round
    size_t ingress_first, ingress; // the server: every peer's upload
    bool upper_bound;              // int4: the zstd frames at their worst case (real ones are smaller)
    int peers;                     // peers counted: num_peers
} PlanSync;

const char *plan_payload_name(PayloadDtype d);   // "f32", "bf16", "int8", "int4"

// A round's bytes for cfg's model and SPES topology (num_peers, num_train_experts_per_node) in
// payload dtype `dtype`; later rounds are sized with base step `base_step` (its digits are in
// the delta's metadata).
int plan_sync(const TrainConfig *cfg, PayloadDtype dtype, int base_step, PlanSync *out);
// The server's counters (bytes in: uploads, bytes out: downloads) after `rounds` rounds every
// `sync_steps` steps (round r at step r * sync_steps), every peer in every round.
int plan_sync_run(const TrainConfig *cfg, PayloadDtype dtype, int rounds, size_t *bytes_in, size_t *bytes_out);
