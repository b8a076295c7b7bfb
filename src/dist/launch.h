// Starting the ranks of a node: `spes train CONFIG --nproc_per_node N` re-executes itself
// under OpenMPI's mpirun with N processes (as the reference's torchrun --nproc_per_node does).
// A process already started by mpirun (OMPI_COMM_WORLD_SIZE set), or torchrun-style with
// RANK/WORLD_SIZE/LOCAL_RANK/MASTER_PORT (rendezvous.h), is a rank and runs as is.
#pragma once
#include <stdbool.h>

// True when this process was started by a launcher as one rank of several.
bool dist_launched(void);
// torchrun-started ranks (LOCAL_WORLD_SIZE > 1) without mpirun and without the variables the
// rendezvous needs (rendezvous.h): an error naming what to set or use.
int dist_check_env(void);
// Replaces this process by `mpirun -np nproc <this binary> argv[0..argc)`. Returns only on
// failure (SPES_ERR, message set): mpirun missing or not executable.
int dist_exec_mpirun(int nproc, int argc, char **argv);
