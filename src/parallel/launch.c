// --nproc_per_node: exec mpirun. See launch.h.
#include "parallel/launch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/rendezvous.h"

// A launcher's count: 0 when unset, -1 when not a number.
static int env_count(const char *name) { return env_int(name, 0, -1); }

bool dist_launched(void) { return env_count("OMPI_COMM_WORLD_SIZE") > 1 || rdv_wanted(); }

int dist_check_env(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE")) return SPES_OK;   // mpirun's rank: its variables win
    const char *ws_text = getenv("WORLD_SIZE"), *lws_text = getenv("LOCAL_WORLD_SIZE");
    int ws = env_count("WORLD_SIZE"), lws = env_count("LOCAL_WORLD_SIZE");
    if (ws_text && *ws_text && ws < 1) return spes_fail("WORLD_SIZE=%s is not a number of ranks >= 1", ws_text);
    if (lws_text && *lws_text && lws < 1)
        return spes_fail("LOCAL_WORLD_SIZE=%s is not a number of ranks >= 1", lws_text);
    // torchrun sets LOCAL_WORLD_SIZE for the processes it starts on a node.
    if (lws > 1 && ws <= 1)
        return spes_fail("LOCAL_WORLD_SIZE=%d is set (a torchrun-style launcher started several processes on this "
                         "node) but WORLD_SIZE is %s: ranks without mpirun join through RANK, WORLD_SIZE, LOCAL_RANK, "
                         "MASTER_ADDR and MASTER_PORT. Or start one process per node with `spes train CONFIG "
                         "--nproc_per_node N` (scripts/run_cluster.sh with NPROC_PER_NODE=N) or `mpirun -np N spes "
                         "train CONFIG`",
                         lws, ws_text && *ws_text ? ws_text : "not set");
    // WORLD_SIZE > 1 says "one rank of several": every variable the rendezvous needs must be
    // there, else this process would train alone, unnoticed, beside the others (each a
    // one-rank job on the same save_folder). LOCAL_WORLD_SIZE=1 is one process per node
    // (WORLD_SIZE counts nodes; dist_check_config decides whether that training may run).
    if (ws > 1 && lws != 1) {
        static const char *const needed[] = {"RANK", "LOCAL_RANK", "MASTER_PORT"};
        for (int i = 0; i < 3; i++) {
            const char *v = getenv(needed[i]);
            if (!v || !*v)
                return spes_fail("WORLD_SIZE=%d asks for torchrun-style ranks, but %s is not set: each rank needs RANK, "
                                 "WORLD_SIZE, LOCAL_RANK and MASTER_PORT (MASTER_ADDR defaults to 127.0.0.1; "
                                 "docs/distributed.md). For one process per node set LOCAL_WORLD_SIZE=1; for a single "
                                 "rank unset WORLD_SIZE",
                                 ws, needed[i]);
        }
    }
    return SPES_OK;
}

// Every rank gets `root`'s "key=value" lines: their length, then the bytes (one call order on
// every rank, whatever the configurations hold, so a difference cannot make ranks disagree
// about the collectives themselves). *text is the caller's to free on every rank.
static int share_lines(Comm *comm, int root, const char *mine, char **text) {
    *text = NULL;
    int64_t len = comm_rank(comm) == root ? (int64_t)strlen(mine) : 0;
    SPES_TRY(comm_broadcast(comm, NULL, &len, sizeof len, root));
    char *buf = spes_calloc((size_t)len + 1, 1);
    // An allocation failure here would leave the others in the broadcast: end the job instead.
    if (!buf) return comm_abort(comm, 1), SPES_ERR;
    if (comm_rank(comm) == root) memcpy(buf, mine, (size_t)len);
    int rc = comm_broadcast(comm, NULL, buf, (size_t)len, root);
    if (rc != SPES_OK) return free(buf), rc;
    *text = buf;
    return SPES_OK;
}

int dist_check_config(Comm *comm, const TrainConfig *cfg, const char *flags) {
    int ws = env_count("WORLD_SIZE");
    if (!comm_is_multi(comm) && !getenv("OMPI_COMM_WORLD_SIZE") && ws > 1 && env_count("LOCAL_WORLD_SIZE") == 1 &&
        !cfg->using_spes && !cfg->using_dilico)
        return spes_fail("LOCAL_WORLD_SIZE=1 with WORLD_SIZE=%d: one process per node, each node its own job. That "
                         "is how SPES peers run (scripts/run_cluster.sh: nodes sync through the parameter server), "
                         "but this configuration is no SPES peer (using_spes and using_dilico are false), so the %d "
                         "processes would train the same model apart, each on its own. For ranks of one node set "
                         "LOCAL_WORLD_SIZE=WORLD_SIZE (torchrun --nnodes 1) or use --nproc_per_node; for one rank "
                         "unset WORLD_SIZE",
                         ws, ws);
    if (!comm_is_multi(comm)) return SPES_OK;
    // Ranks of one job must run one configuration: a different batch size or strategy makes
    // their collectives mismatch (a hang), a different learning rate trains silently wrong.
    // Rank 0's lines reach every rank; the first rank that differs sends its lines too, so
    // every rank fails with the same message naming the keys.
    char *lines = config_job_lines(cfg), *root = NULL, *other = NULL, *mine = NULL;
    if (lines && asprintf(&mine, "%s%s", lines, flags ? flags : "") < 0) mine = NULL;
    free(lines);
    if (!mine) return comm_abort(comm, 1), SPES_ERR;   // as in share_lines
    int size = comm_size(comm), first = -1, n_differ = 0;
    int *differs = spes_calloc((size_t)size, sizeof *differs);
    if (!differs) return free(mine), comm_abort(comm, 1), SPES_ERR;
    int rc = share_lines(comm, 0, mine, &root);
    if (rc == SPES_OK) rc = comm_allgather_int(comm, strcmp(root, mine) != 0, differs);
    for (int k = 0; rc == SPES_OK && k < size; k++)
        if (differs[k]) n_differ++, first = first < 0 ? k : first;
    if (rc == SPES_OK && first > 0) rc = share_lines(comm, first, mine, &other);
    if (rc == SPES_OK && first > 0) {
        char *diff = config_diff_lines(root, other);
        rc = spes_fail("rank %d's configuration differs from rank 0's (%d of %d ranks differ): %s. Every rank of a job "
                       "needs the same configuration and overrides (only threads and device may differ)",
                       first, n_differ, size, diff ? diff : "(out of memory describing it)");
        free(diff);
    }
    free(mine), free(root), free(other), free(differs);
    return rc;
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
