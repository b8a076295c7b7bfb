// Ranks inside a node and the collectives between them: one interface, two transports.
//
//   host buffers (cpu backend, checkpoint gathers, small values): MPI (OpenMPI)
//   device buffers (cuda backend): NCCL, bootstrapped over MPI (rank 0's ncclUniqueId is
//   broadcast with MPI_Bcast), compiled only in CUDA builds (src/parallel/nccl.c)
//
// Which one a call uses follows the buffer's backend: `be->host_memory` -> MPI, otherwise
// NCCL. No collective algorithm is written here: MPI and NCCL do the reductions.
//
// A job of one rank (no launcher, or a launcher with one process) never initialises MPI:
// every collective is then the identity, so single-rank training is exactly what it was.
//
// Failure. Every MPI call runs under MPI_ERRORS_ARE_FATAL: a rank that dies makes mpirun end
// the whole job (it kills the other ranks and names the one that died), so no collective can
// wait for a dead rank forever. A rank that fails cleanly (an error message) calls
// comm_abort, which ends the job the same way after the message is printed.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/backend.h"

typedef enum { COMM_F32 = 0, COMM_F64, COMM_I64, COMM_BYTE } CommType;

typedef struct Comm Comm;

// The job this process belongs to, from the launcher's environment: OpenMPI's mpirun
// (OMPI_COMM_WORLD_*), torchrun-style variables without mpirun (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT: the ranks join through parallel/rendezvous.h), or a single rank.
// Initialises MPI only for a job of more than one rank. `*out` is never NULL on success.
int comm_init(Comm **out);
// MPI_Finalize (multi-rank) and frees. NULL is fine.
void comm_finalize(Comm *c);
// Ends every rank of the job with `code` (MPI_Abort); a single rank just returns.
void comm_abort(Comm *c, int code);

int comm_rank(const Comm *c);
int comm_size(const Comm *c);
int comm_local_rank(const Comm *c);     // rank on this node: the GPU this rank uses
bool comm_is_multi(const Comm *c);      // size > 1

// buf[0..n) summed over ranks, in place, every rank gets the result.
int comm_allreduce_sum(Comm *c, Backend *be, void *buf, size_t n, CommType t);

// Non-blocking collectives: gradient reductions and ZeRO-3's part prefetch, started while the
// backward goes on. Each
// call starts one collective and queues it on the Comm; comm_wait_all waits for every queued
// one. As for any collective, every rank must start them in the same order. Buffers and
// `counts` must stay untouched until comm_wait_all returns. MPI (host) runs them as
// MPI_Iallreduce / MPI_Ireduce_scatter, NCCL (device) on its own stream after the backend's
// queued work. With one rank they are identities.
//
// buf[0..n) summed over ranks, in place (f32).
int comm_start_allreduce_sum(Comm *c, Backend *be, float *buf, size_t n);
// In place: block r of buf (counts[r] values at displacement sum(counts[0..r))) summed over
// ranks; after comm_wait_all this rank's block holds its sum (the other blocks are undefined).
int comm_start_reduce_scatter_sum(Comm *c, Backend *be, float *buf, const int *counts);
// In place, as comm_allgather below (ZeRO-3's prefetch of the next part).
int comm_start_allgather(Comm *c, Backend *be, float *buf, const int *counts);
// Lets queued MPI collectives advance (MPI moves them on only inside MPI calls); cheap.
int comm_progress(Comm *c);
// Waits for every queued collective; the queue is then empty.
int comm_wait_all(Comm *c);
// In place: block r of buf (counts[r] values at displacement sum(counts[0..r))) comes from
// rank r; afterwards every rank holds every block. f32.
int comm_allgather(Comm *c, Backend *be, float *buf, const int *counts);
// buf[0..bytes) of root to every rank.
int comm_broadcast(Comm *c, Backend *be, void *buf, size_t bytes, int root);
int comm_barrier(Comm *c);
// All ranks' values of one int in rank order (out[size]); a host collective.
int comm_allgather_int(Comm *c, int value, int *out);
// Whether every rank arrives with rc == SPES_OK (one all-reduce): then SPES_OK everywhere, else
// SPES_ERR everywhere (a failed rank keeps its own message; the others say how many ranks could
// not `what`). Before collectives that a rank-local failure would leave the others waiting in.
int comm_all_ok(Comm *c, int rc, const char *what);

// The NCCL half (nccl.c). Device collectives in a build without CUDA, or on a backend
// without NCCL, fail with a message naming the missing piece.
typedef struct CommNccl CommNccl;
int comm_nccl_open(Comm *c, Backend *be, CommNccl **out);
void comm_nccl_close(CommNccl *n);
// The NCCL library's version code (ncclGetVersion: 22809 is 2.28.9); 0 without NCCL.
int comm_nccl_version(void);
int comm_nccl_allreduce_sum(CommNccl *n, Backend *be, void *buf, size_t count, CommType t);
int comm_nccl_allgather(CommNccl *n, Backend *be, float *buf, const int *counts);
int comm_nccl_broadcast(CommNccl *n, Backend *be, void *buf, size_t bytes, int root);
// The non-blocking pair: started on NCCL's stream once the backend's queued work is done,
// waited for by comm_nccl_wait. Blocks of different sizes (shards of a gradient buffer) go as
// one NCCL group of per-block ncclReduce / ncclBroadcast calls (NCCL's own ReduceScatter and
// AllGather need equal blocks).
int comm_nccl_start_allreduce_sum(CommNccl *n, Backend *be, float *buf, size_t count);
int comm_nccl_start_reduce_scatter_sum(CommNccl *n, Backend *be, float *buf, const int *counts);
int comm_nccl_start_allgather(CommNccl *n, Backend *be, float *buf, const int *counts);
int comm_nccl_wait(CommNccl *n);
