// The memory check at the start of `spes train`. See plan_check.h.
#include "train/plan_check.h"

#include "base/error.h"
#include "base/host_memory.h"
#include "base/log.h"
#include "train/plan.h"
#include "train/plan_print.h"

int plan_check_device(const TrainConfig *cfg, Backend *be, int ranks, bool speak, size_t *planned_peak) {
    *planned_peak = 0;
    PlanTarget target;
    Plan plan;
    SPES_TRY(plan_target_from_config(cfg, ranks, !be->host_memory, &target));
    target.layout = *be;            // what the backend opened with decides, not the config's wish
    target.compute = be->compute;
    SPES_TRY(plan_compute(cfg, &target, &plan));
    // The host's figures once (on the cpu backend they are the device's too), a GPU's its own.
    HostMemory host;
    SPES_TRY(host_memory_read("/proc", "/sys/fs/cgroup", &host));
    size_t free_b = host.available, total_b = host.total;
    if (!be->host_memory) SPES_TRY(backend_device_memory(be, &free_b, &total_b));
    const double gib = 1073741824.0;
    // One host holds every cpu rank of the node, with their host-side buffers.
    size_t need = be->host_memory ? (size_t)ranks * (plan.mem.peak + plan.mem.host) : plan.mem.peak;
    *planned_peak = plan.mem.peak;
    // A GPU run's host side (page-locked copies, offloaded moments) on the node's host, every rank's.
    size_t host_need = (size_t)ranks * plan.mem.host;
    if (!be->host_memory && host_need > host.available)
        return spes_fail("out of host memory before the first step: the plan needs %.2f GiB of it (%d rank%s x %.2f "
                         "GiB: page-locked copies%s), and %.2f of %.2f GiB are left (%s)",
                         host_need / gib, ranks, ranks == 1 ? "" : "s", plan.mem.host / gib,
                         target.cpu_offload ? ", the offloaded AdamW moments" : "", host.available / gib,
                         host.total / gib, host.limited_by);
    const char *limit = be->host_memory ? host.limited_by : "the device's free memory";
    if (need <= free_b) {
        if (speak)
            log_info("memory plan: peak %.3f GiB per rank (%s x%d, micro-batch %d x %d, activation_checkpointing %s); "
                     "%.2f of %.2f GiB free on %s",
                     plan.mem.peak / gib, plan_strategy_name(target.strategy), ranks, target.micro_batch,
                     target.seq_len, plan_checkpointing_name(target.checkpointing), free_b / gib, total_b / gib, be->name);
        return SPES_OK;
    }
    if (speak) {
        fprintf(stderr, "spes train: the run does not fit %s. The plan (`spes plan` prints it too):\n", be->description);
        plan_print_memory(stderr, cfg, &plan);
    }
    // The largest micro-batch that would fit, as a hint (per rank: a share of the free memory on cpu).
    int fits = 0;
    size_t budget = be->host_memory ? free_b / (size_t)ranks - (plan.mem.host < free_b / (size_t)ranks ? plan.mem.host : 0)
                                    : free_b;
    if (plan_max_micro_batch(cfg, &target, budget, target.micro_batch, &fits) != SPES_OK) fits = 0;
    char hint[160];
    if (fits > 0)
        snprintf(hint, sizeof hint, "device_train_microbatch_size %d fits", fits);
    else
        snprintf(hint, sizeof hint, "not even micro-batch 1 fits: see `spes plan` for activation_checkpointing, "
                                    "fsdp FULL_SHARD over more ranks or optimizer.cpu_offload");
    char need_text[160];
    if (be->host_memory)
        snprintf(need_text, sizeof need_text, "%.2f GiB of host memory (%d rank%s x (peak %.2f + host %.2f GiB))",
                 need / gib, ranks, ranks == 1 ? "" : "s", plan.mem.peak / gib, plan.mem.host / gib);
    else
        snprintf(need_text, sizeof need_text, "a peak of %.2f GiB on each GPU", need / gib);
    return spes_fail("out of memory before the first step: the plan needs %s, and %.2f of %.2f GiB are free on %s "
                     "(%s); %s",
                     need_text, free_b / gib, total_b / gib, be->description, limit, hint);
}
