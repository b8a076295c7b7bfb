// Starting the ranks of a node: `spes train CONFIG --nproc_per_node N` re-executes itself
// under OpenMPI's mpirun with N processes (as the reference's torchrun --nproc_per_node does).
// A process already started by mpirun (OMPI_COMM_WORLD_SIZE set), or torchrun-style with
// RANK/WORLD_SIZE/LOCAL_RANK/MASTER_PORT (rendezvous.h), is a rank and runs as is.
#pragma once
#include <stdbool.h>

#include "config/config.h"
#include "parallel/comm.h"

// True when this process was started by a launcher as one rank of several.
bool dist_launched(void);
// Half a torchrun environment without mpirun: WORLD_SIZE > 1 (LOCAL_WORLD_SIZE not 1) without
// RANK, LOCAL_RANK or MASTER_PORT, or LOCAL_WORLD_SIZE > 1 without WORLD_SIZE: an error naming
// the missing variable (such a process would otherwise train alone as one rank).
int dist_check_env(void);
// After the configuration is loaded, on every rank: refuses ranks whose configurations differ
// (every key but threads and device, plus `flags`: "name=value" lines of the command-line
// options that change what a rank does, e.g. --resume; the message names the keys, the same
// on every rank), and a one-process-per-node environment (LOCAL_WORLD_SIZE=1, WORLD_SIZE > 1)
// for a training that is not a SPES peer.
int dist_check_config(Comm *comm, const TrainConfig *cfg, const char *flags);
// Replaces this process by `mpirun -np nproc <this binary> argv[0..argc)`. Returns only on
// failure (SPES_ERR, message set): mpirun missing or not executable.
int dist_exec_mpirun(int nproc, int argc, char **argv);
