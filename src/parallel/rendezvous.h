// torchrun-style ranks without mpirun: processes started separately on one node, each told
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, join one MPI communicator.
//
// OpenMPI 4.1 lets separately started (singleton) processes connect with MPI_Open_port /
// MPI_Comm_accept / MPI_Comm_connect only through an `ompi-server` that all of them know
// (without one MPI_Comm_connect fails: "requires the support of the ompi-server tool"). So:
//   1. rank 0 starts `ompi-server` (a child that dies with it) and listens on a local socket
//      named after MASTER_ADDR and MASTER_PORT (an abstract Unix socket: the ranks are one
//      node's, and torchrun's own agent listens on MASTER_PORT); every other rank connects
//      there (retrying for up to SPES_RENDEZVOUS_TIMEOUT seconds, 60 by default) and says its
//      RANK and WORLD_SIZE; rank 0 hands each the server's URI. Only processes of this job's
//      user are let in (SO_PEERCRED, both ways), and each connection gets a few seconds to
//      say who it is, read concurrently;
//   2. every rank points OpenMPI at that server (OMPI_MCA_pmix_server_uri) and MPI_Inits as a
//      singleton;
//   3. rank 0 opens an MPI port; in RANK order it sends the port name to rank k over its socket
//      and ranks 0..k-1 MPI_Comm_accept while rank k MPI_Comm_connects; each intercommunicator
//      is merged into the next intracommunicator, so the last one holds every rank in RANK order.
// The sockets stay open as a watchdog: without mpirun nobody ends the job when a rank dies, so
// a thread on each rank waits for its sockets to close (rank 0: every other rank's; the others:
// rank 0's) and ends this process with a message when one closes before comm_finalize; rank 0
// dying closes every socket, a rank dying makes rank 0 exit, which closes the rest. It starts
// after step 1 and also ends the rank when steps 2-3 (MPI_Init, MPI_Comm_accept: no timeouts of
// their own) are not done SPES_RENDEZVOUS_TIMEOUT seconds later.
#pragma once
#include <mpi.h>
#include <stdbool.h>

typedef struct Rendezvous Rendezvous;

// True when the environment asks for torchrun-style ranks: WORLD_SIZE > 1 with LOCAL_RANK and
// MASTER_PORT set, and no OpenMPI launcher (OMPI_COMM_WORLD_SIZE unset). LOCAL_WORLD_SIZE 1
// (one process per node, e.g. run_cluster.sh under a scheduler) is not.
bool rdv_wanted(void);
// Steps 1-3: MPI is initialised (by this call) and *world holds every rank in RANK order.
int rdv_join(Rendezvous **out, MPI_Comm *world, int *rank, int *size, int *local_rank);
// Before MPI_Finalize: every rank has reached the end (a barrier on world), the watchdog stops.
int rdv_finish(Rendezvous *r, MPI_Comm world);
// After MPI_Finalize: sockets closed, ompi-server stopped. NULL is fine.
void rdv_close(Rendezvous *r);
