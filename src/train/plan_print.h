// The plan's memory table (train/plan.h) as text and as JSON: `spes plan` prints both, and
// `spes train` logs the table when the run cannot fit the device.
#pragma once
#include <stdio.h>

#include "train/plan.h"

// "none", "fine_grained", "whole_layer" for the model's checkpointing modes 0, 1, 2.
const char *plan_checkpointing_name(int mode);
// The table for plan's target: the config's strategy, and every other one at the same number of
// ranks (2 when the target has one), in one unit (GiB or MiB), then the activations by mode.
void plan_print_memory(FILE *out, const TrainConfig *cfg, const Plan *plan);
// The fields of m as one JSON object (bytes).
void plan_print_json_memory(FILE *out, const PlanMemory *m);
