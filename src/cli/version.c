// `spes version`: the version and the backends this binary was built with.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "parallel/comm.h"
#include "ops/backend.h"

#ifndef SPES_VERSION
#define SPES_VERSION "0.2.0"
#endif

int cmd_version(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: spes version\n\nPrints the version and the backends compiled in (cpu, and cuda with its GPU "
               "architectures when built with nvcc), and the NCCL version in CUDA builds.\n");
        return 0;
    }
    printf("spes %s\nbackends: %s\n", SPES_VERSION, backend_compiled());
    int nccl = comm_nccl_version();   // major*10000 + minor*100 + patch since NCCL 2.9
    if (nccl) printf("nccl: %d.%d.%d\n", nccl / 10000, nccl / 100 % 100, nccl % 100);
    return 0;
}
