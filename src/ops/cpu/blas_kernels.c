// Makes sure OpenBLAS runs its AVX2/AVX-512 kernels, not its generic fallback.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "ops/cpu/cpu_ops.h"

char *openblas_get_corename(void);

const char *op_blas_core_name(void) { return openblas_get_corename(); }

void op_blas_ensure_fast_kernels(char **argv) {
    const char *core = openblas_get_corename();
    bool fallback = core && (!strcmp(core, "Prescott") || !strcmp(core, "Core2") || !strcmp(core, "Nehalem") ||
                             !strcasecmp(core, "unknown"));
    if (!fallback || getenv("OPENBLAS_CORETYPE")) return;   // detected fine, or the user chose
    const char *best = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) best = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = "Haswell";
    if (!best) return;
    setenv("OPENBLAS_CORETYPE", best, 1);
    execv("/proc/self/exe", argv);
    log_warn("OpenBLAS uses its slow %s kernels on this CPU and re-executing with OPENBLAS_CORETYPE=%s failed; "
             "set OPENBLAS_CORETYPE=%s yourself for 3-5x faster matrix products",
             core, best, best);
}
