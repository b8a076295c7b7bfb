// An optional outer optimizer for the parameter server (DiLoCo-style Nesterov momentum), as
// pure maths: tensors in, tensors out, no sockets, no files. Off by default; with outer_lr 1
// and outer_momentum 0 it returns the plain mean of the peers bit for bit (today's aggregate).
//
// For every element of a tensor it covers, one round does, with theta the previous aggregate
// (the weights every peer started the round from), mean the average of the peers' uploads
// this round, mu = momentum, lr = outer_lr, v the momentum buffer (zero at the start):
//   g     = theta - mean                   the pseudo-gradient
//   v     = mu * v + g
//   theta = theta - lr * (g + mu * v)      Nesterov: the step looks ahead along the new v
// The last line is computed as  mean + ((1 - lr) * g - lr * mu * v)  (the same value in exact
// arithmetic), so that lr = 1, mu = 0 gives `mean` exactly rather than theta - (theta - mean),
// which fp32 rounds; and when that correction is zero the mean is returned untouched (signed
// zeros included). Every operation is a separate fp32 operation in a fixed order per element
// (no reductions, no contraction under -std=c17), so the result is the same on every run and
// thread count.
//
// Which tensors it covers is the caller's choice: the server's shared tensors in spes mode
// (experts come from their owners and the merge), every tensor in fedavg mode. The state keeps
// one momentum buffer per covered tensor, indexed like the model spec (numel 0: not covered),
// and serialises to bytes that restore bit for bit, for the server's --state_dir.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sync/model_spec.h"

// OuterOptConfig, OUTER_OPT_OFF and outer_opt_is_off: sync/model_spec.h (a peer states the
// settings it expects in its Hello).

// Checks the ranges; names the bad value ("outer_lr", "outer_momentum").
int outer_opt_config_check(const OuterOptConfig *cfg);

typedef struct {
    int num_tensors;      // slots, one per model-spec tensor
    int64_t *numel;       // [num_tensors] elements of each slot's buffer; 0: not covered
    float **velocity;     // [num_tensors][numel] the momentum buffer v (NULL where numel is 0)
    int64_t rounds;       // completed outer steps (outer_opt_end_round)
    int64_t last_step;    // the training step of the last completed outer step; -1 before any
} OuterOptState;

// A state for num_tensors slots, slot t covering numel[t] elements (0: not covered); every
// velocity zero, rounds 0, last_step -1.
int outer_opt_state_init(OuterOptState *s, int num_tensors, const int64_t *numel);
void outer_opt_state_free(OuterOptState *s);

// One outer step on slot t: out[i] from prev[i] (theta, the previous aggregate) and mean[i]
// (this round's mean of the peers), i < s->numel[t], updating the slot's velocity. out may be
// mean (in place); prev must not alias out. prev == NULL (no previous aggregate: the first
// round of a run) copies mean to out and leaves the velocity as it is. Fails on a slot out of
// range or not covered, naming it.
int outer_opt_step(const OuterOptConfig *cfg, OuterOptState *s, int t, const float *prev, const float *mean,
                   float *out);
// Marks the round of training step `step` complete (after every covered slot has stepped).
void outer_opt_end_round(OuterOptState *s, int64_t step);

// Serialised state, little-endian:
//   "SPESOOPT" magic (8 bytes), u32 version (1), u32 num_tensors, i64 rounds, i64 last_step,
//   i64 numel[num_tensors], then every covered slot's velocity as f32 in slot order,
//   then u64 FNV-1a of every byte before it.
size_t outer_opt_state_size(const OuterOptState *s);
// Writes outer_opt_state_size(s) bytes to buf.
void outer_opt_state_serialise(const OuterOptState *s, uint8_t *buf);
// Restores a state from bytes written by outer_opt_state_serialise. When expect_numel is not
// NULL the slots must match it (num_tensors slots, numel for numel): the state belongs to this
// model. Bad bytes (truncated, wrong magic or version, checksum, sizes) fail with a message
// naming `what` (e.g. the file) and the problem; *s is then left empty (free is safe).
int outer_opt_state_restore(OuterOptState *s, const uint8_t *buf, size_t len, int expect_num_tensors,
                            const int64_t *expect_numel, const char *what);
