// `spes train`'s memory check at start: the plan (train/plan.h) of this run against what the
// device can still allocate, so a run that cannot fit stops before its first step, with the
// plan's table, instead of running out of memory in the middle of one.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "ops/backend.h"

// The plan of cfg on backend `be` (its compute type) with `ranks` ranks on this node. Fails, the
// table printed to stderr when `speak`, when the planned peak exceeds the free memory (on the
// cpu backend the node's ranks share the host: ranks x (peak + host memory) must fit). On
// success *planned_peak is the plan's peak for this rank (bytes).
int plan_check_device(const TrainConfig *cfg, Backend *be, int ranks, bool speak, size_t *planned_peak);
