// --nproc_per_node: exec mpirun. See launch.h.
#include "dist/launch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "dist/rendezvous.h"

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : 0;
}

bool dist_launched(void) { return env_int("OMPI_COMM_WORLD_SIZE") > 1 || rdv_wanted(); }

int dist_check_env(void) {
    // torchrun sets LOCAL_WORLD_SIZE for the processes it starts on a node; they join without
    // mpirun when WORLD_SIZE, LOCAL_RANK and MASTER_PORT are set too (rendezvous.h). (RANK and
    // WORLD_SIZE alone are not checked: scripts/run_cluster.sh reads RANK as the node's peer id.)
    if (env_int("LOCAL_WORLD_SIZE") > 1 && !getenv("OMPI_COMM_WORLD_SIZE") && !rdv_wanted())
        return spes_fail("LOCAL_WORLD_SIZE=%d is set (a torchrun-style launcher started several processes on this "
                         "node) but WORLD_SIZE, LOCAL_RANK or MASTER_PORT is missing: ranks without mpirun join "
                         "through RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Or start one process "
                         "per node with `spes train CONFIG --nproc_per_node N` (scripts/run_cluster.sh with "
                         "NPROC_PER_NODE=N) or `mpirun -np N spes train CONFIG`",
                         env_int("LOCAL_WORLD_SIZE"));
    return SPES_OK;
}

int dist_exec_mpirun(int nproc, int argc, char **argv) {
    const char *mpirun = getenv("SPES_MPIRUN");   // another launcher binary (tests, clusters)
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    char np[16];
    snprintf(np, sizeof np, "%d", nproc);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return spes_fail("cannot find this program's path (/proc/self/exe): %s", strerror(errno));
    self[len] = '\0';
    // mpirun refuses root unless told; CI runs as root in a container, where that is the norm.
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    const char *fixed[] = {
        mpirun, "-np", np,
        "--oversubscribe",     // more ranks than cores is allowed (tests; ranks of few threads)
        "--bind-to", "none",   // each rank runs an OpenMP pool of `threads`: no pinning to one core
        // Containers often forbid the cross-process memory attach (CMA) shared-memory copies use.
        "--mca", "btl_vader_single_copy_mechanism", "none",
        self,
    };
    int n_fixed = (int)(sizeof fixed / sizeof fixed[0]);
    char **args = spes_calloc((size_t)(n_fixed + argc + 1), sizeof(char *));
    if (!args) return SPES_ERR;
    for (int i = 0; i < n_fixed; i++) args[i] = (char *)fixed[i];
    for (int i = 0; i < argc; i++) args[n_fixed + i] = argv[i];
    fflush(NULL);
    execvp(mpirun, args);
    int err = errno;
    free(args);
    return spes_fail("--nproc_per_node %d: cannot run %s: %s (install OpenMPI: scripts/install-deps.sh, or apt-get "
                     "install openmpi-bin)",
                     nproc, mpirun, strerror(err));
}
