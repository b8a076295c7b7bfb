// The host memory this process can still allocate. See host_memory.h.
#include "base/host_memory.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/error.h"

// A cgroup v1 "no limit" is PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages); any
// limit this large is none.
#define NO_LIMIT ((uint64_t)1 << 60)

// The first number of a file (v2 "max" reads as no limit); false when it has none.
static bool read_number(const char *dir, const char *name, uint64_t *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char text[64] = "";
    bool ok = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    if (!ok) return false;
    if (!strncmp(text, "max", 3)) {
        *out = UINT64_MAX;
        return true;
    }
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text) return false;
    *out = v;
    return true;
}

// The tightest limit - usage of the cgroup at base + path and its ancestors up to base.
static void cgroup_free(const char *base, const char *path, const char *limit_file, const char *usage_file,
                        HostMemory *out) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s", base, strcmp(path, "/") ? path : "");
    size_t base_len = strlen(base);
    for (;;) {
        uint64_t limit, usage;
        if (read_number(dir, limit_file, &limit) && limit < NO_LIMIT && read_number(dir, usage_file, &usage)) {
            size_t free_b = usage < limit ? (size_t)(limit - usage) : 0;
            if (free_b < out->available) out->available = free_b, out->limited_by = "the cgroup's memory limit";
            if ((size_t)limit < out->total) out->total = (size_t)limit;
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= base_len || !slash || (size_t)(slash - dir) < base_len) break;
        *slash = '\0';
    }
}

// The cgroups of this process (<proc_root>/self/cgroup): v1's memory controller where it has one,
// else the v2 hierarchy (at cgroup_root, or cgroup_root/unified on a hybrid machine).
static void apply_cgroup(const char *proc_root, const char *cgroup_root, HostMemory *out) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/self/cgroup", proc_root);
    FILE *f = fopen(path, "r");
    if (!f) return;
    char v1[4096] = "", v2[4096] = "";
    bool have_v1 = false, have_v2 = false;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = '\0';
        const char *controllers = c1 + 1, *where = c2 + 1;
        if (!strcmp(line, "0") && !controllers[0]) {
            snprintf(v2, sizeof v2, "%s", where);
            have_v2 = true;
            continue;
        }
        char list[512];
        snprintf(list, sizeof list, ",%s,", controllers);
        if (strstr(list, ",memory,")) {
            snprintf(v1, sizeof v1, "%s", where);
            have_v1 = true;
        }
    }
    fclose(f);
    char base[4096];
    if (have_v1) {
        snprintf(base, sizeof base, "%s/memory", cgroup_root);
        cgroup_free(base, v1, "memory.limit_in_bytes", "memory.usage_in_bytes", out);
    } else if (have_v2) {
        cgroup_free(cgroup_root, v2, "memory.max", "memory.current", out);
        snprintf(base, sizeof base, "%s/unified", cgroup_root);
        cgroup_free(base, v2, "memory.max", "memory.current", out);
    }
}

// RLIMIT_AS less the process's mapped size (<proc_root>/self/status VmSize).
static void apply_rlimit(const char *proc_root, HostMemory *out) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return;
    char path[4096], line[256];
    snprintf(path, sizeof path, "%s/self/status", proc_root);
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kb) == 1) break;
    fclose(f);
    size_t mapped = kb * 1024, limit = (size_t)lim.rlim_cur;
    size_t free_b = mapped < limit ? limit - mapped : 0;
    if (free_b < out->available) out->available = free_b, out->limited_by = "the address-space limit (ulimit -v)";
    if (limit < out->total) out->total = limit;
}

int host_memory_read(const char *proc_root, const char *cgroup_root, HostMemory *out) {
    *out = (HostMemory){.limited_by = "MemAvailable"};
    char path[4096], line[256];
    snprintf(path, sizeof path, "%s/meminfo", proc_root);
    FILE *f = fopen(path, "r");
    if (!f) return spes_fail("cannot read %s for the host's free memory", path);
    size_t kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) out->available = kb * 1024;
        if (sscanf(line, "MemTotal: %zu kB", &kb) == 1) out->total = kb * 1024;
    }
    fclose(f);
    if (!out->total) return spes_fail("%s has no MemTotal line", path);
    apply_cgroup(proc_root, cgroup_root, out);
    apply_rlimit(proc_root, out);
    return SPES_OK;
}
