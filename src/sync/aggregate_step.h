// Which round an aggregate is of: the "spes_step" key of its safetensors __metadata__. The server
// writes it into every aggregate it keeps and serves (whole, the views without a peer's own
// experts, int8 / int4 deltas); the peer refuses an aggregate stating another step than the one
// it asked for, which it would otherwise load without a sign (a server serving another round's
// aggregate, or a broken one). An aggregate stating no step is taken: the reference Python server
// and state dirs written before the key do not write it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

#define SYNC_META_STEP "spes_step"

// The step st states in *step (-1: no spes_step key). SPES_ERR, naming `what` and the value,
// when the key holds anything but a decimal step in [0, 2^31-1].
int sync_aggregate_stated_step(const SafeTensors *st, const char *what, int *step);

// The peer's check of a downloaded aggregate (bytes[len], safetensors) asked for as `asked` from
// `server`: SPES_OK when it states that step or none; else an error naming the server and both
// steps. Bytes that are not safetensors pass: the loader names what is wrong with them.
int sync_aggregate_check_step(const uint8_t *bytes, size_t len, int asked, const char *server);
