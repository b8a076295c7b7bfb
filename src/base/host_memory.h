// The host memory this process can still allocate, for the memory check at the start of a run
// (train/plan_check.h): the least of the kernel's estimate of what is free (/proc/meminfo's
// MemAvailable), what its cgroup allows beyond what it uses (a container's limit, which
// MemAvailable does not show: v2 memory.max - memory.current, v1 memory.limit_in_bytes -
// memory.usage_in_bytes, the tightest of the process's cgroup and its ancestors), and its
// address-space limit beyond what it has mapped (RLIMIT_AS, `ulimit -v`, less VmSize). Past any
// of them an allocation fails or the kernel kills the process, mid-run.
#pragma once
#include <stddef.h>

typedef struct {
    size_t available;           // the least of the limits below that apply
    size_t total;               // the same for the whole: MemTotal, the cgroup's limit, RLIMIT_AS
    const char *limited_by;     // which one gave `available`: "MemAvailable", "the cgroup's memory
                                // limit" or "the address-space limit (ulimit -v)"
} HostMemory;

// Reads the figures of this process (proc_root "/proc", cgroup_root "/sys/fs/cgroup"; other roots
// in tests). RLIMIT_AS is this process's own. Fails only without a readable meminfo.
int host_memory_read(const char *proc_root, const char *cgroup_root, HostMemory *out);
