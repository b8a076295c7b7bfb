// The plan's memory table, as `spes plan` prints it and `spes train` shows it when a run cannot
// fit. See plan_print.h.
#include "train/plan_print.h"

#include <string.h>

#include "base/error.h"

static const char *const mode_names[3] = {"none", "fine_grained", "whole_layer"};

const char *plan_checkpointing_name(int mode) { return (unsigned)mode < 3 ? mode_names[mode] : "?"; }

// One unit for a whole table: GiB when its largest figure is a GiB or more, else MiB.
static double unit_of(size_t largest, const char **name) {
    if (largest >= ((size_t)1 << 30)) {
        *name = "GiB";
        return 1073741824.0;
    }
    *name = "MiB";
    return 1048576.0;
}

void plan_print_memory(FILE *out, const TrainConfig *cfg, const Plan *plan) {
    const PlanTarget *g = &plan->target;
    // The config's strategy first, then every other one at the same number of ranks (2 when the
    // target has one: a strategy needs two ranks at least).
    Plan rows[PLAN_STRATEGY_COUNT];
    bool have[PLAN_STRATEGY_COUNT] = {0};
    size_t largest = plan->mem.peak + plan->mem.host;
    for (int s = 0; s < PLAN_STRATEGY_COUNT; s++) {
        PlanTarget t = *g;
        t.strategy = (PlanStrategy)s;
        t.ranks = s == PLAN_SINGLE ? 1 : g->ranks > 1 ? g->ranks : 2;
        if (s == (int)g->strategy && t.ranks == g->ranks) rows[s] = *plan;
        else if (plan_compute(cfg, &t, &rows[s]) != SPES_OK) continue;
        have[s] = true;
        if (rows[s].mem.peak + rows[s].mem.host > largest) largest = rows[s].mem.peak + rows[s].mem.host;
    }
    const char *un;
    const double u = unit_of(largest, &un);
    fprintf(out, "memory per rank (%s), micro-batch %d x %d, activation_checkpointing %s, %s%s:\n", un, g->micro_batch,
            g->seq_len, plan_checkpointing_name(g->checkpointing), g->gpu ? "GPU " : "cpu ",
            g->gpu ? num_type_name(g->compute) : "fp32");
    fprintf(out, "  %-14s %8s %8s %8s %8s %8s %8s %8s %9s %8s | %8s %8s %8s\n", "strategy", "master", "compute", "frozen",
            "grads", "moments", "acts", "work", "boundary", "PEAK", "setup", "step", "host");
    for (int s = 0; s < PLAN_STRATEGY_COUNT; s++) {
        if (!have[s]) continue;
        const PlanMemory *m = &rows[s].mem;
        char name[32];
        snprintf(name, sizeof name, "%s x%d%s", plan_strategy_name((PlanStrategy)s), rows[s].target.ranks,
                 s == (int)g->strategy ? " *" : "");
        fprintf(out, "  %-14s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %8.2f | %8.2f %8.2f %8.2f\n", name,
                m->master / u, m->compute_copy / u, m->frozen_store / u, m->grads / u, m->moments / u, m->acts / u,
                m->work / u, m->boundary_extra / u, m->peak / u, m->peak_setup / u, m->peak_step / u, m->host / u);
    }
    const PlanMemory *m = &plan->mem;
    char compute[64];
    if (g->compute == NUM_F32) snprintf(compute, sizeof compute, "none in fp32 (GEMMs read the master)");
    else snprintf(compute, sizeof compute, "the %s copy GEMMs read", num_type_name(g->compute));
    fprintf(out, "  * the config's strategy. master: fp32 parameters (zero3: its shard); compute: %s;\n"
                 "    frozen: zero3's store of frozen tensors; work: zero3 gather slots, zero2/3 gradient buffers, zero1/2\n"
                 "    all-gather bucket; boundary: added at checkpoints, evaluations and syncs; host: host memory (page-locked\n"
                 "    copies%s); moments %s.\n",
            compute, g->cpu_offload ? ", offloaded moments and staging" : "",
            g->cpu_offload ? "in host memory (optimizer.cpu_offload)" : "on the device");
    fprintf(out, "  activations (%s) by activation_checkpointing: none %.2f, fine_grained %.2f, whole_layer %.2f; "
                 "logits block %.2f\n",
            un, m->acts_mode[0] / u, m->acts_mode[1] / u, m->acts_mode[2] / u, m->logits_chunk / u);
}

void plan_print_json_memory(FILE *out, const PlanMemory *m) {
    fprintf(out,
            "{\"master\": %zu, \"compute_copy\": %zu, \"frozen_store\": %zu, \"grads\": %zu, \"moments\": %zu, "
            "\"acts\": %zu, \"acts_none\": %zu, \"acts_fine_grained\": %zu, \"acts_whole_layer\": %zu, "
            "\"logits_chunk\": %zu, \"work\": %zu, \"boundary_extra\": %zu, \"peak_setup\": %zu, \"peak_step\": %zu, "
            "\"peak_boundary\": %zu, \"peak\": %zu, \"host\": %zu}",
            m->master, m->compute_copy, m->frozen_store, m->grads, m->moments, m->acts, m->acts_mode[0], m->acts_mode[1],
            m->acts_mode[2], m->logits_chunk, m->work, m->boundary_extra, m->peak_setup, m->peak_step, m->peak_boundary,
            m->peak, m->host);
}
