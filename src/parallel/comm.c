// MPI host collectives and the dispatch to NCCL for device buffers. See comm.h.
#include "parallel/comm.h"

#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "parallel/rendezvous.h"

// What a queued MPI collective needs once it completes, or until then: an in-place MPI
// reduce-scatter leaves this rank's sum at the front of its buffer, moved to the block's own
// place afterwards; an all-gather reads its displacements until it completes.
typedef struct {
    float *to, *from;
    size_t n;
    int *displs;   // freed when the collective completes
} Move;

struct Comm {
    int rank, size, local_rank;
    bool mpi;                  // MPI_Init was called by us
    MPI_Comm world;            // every rank: MPI_COMM_WORLD under mpirun, the joined one without
    Rendezvous *rdv;           // torchrun-style ranks (rendezvous.h), else NULL
    CommNccl *nccl;            // opened on the first device collective
    Backend *nccl_be;
    // queued non-blocking collectives (comm_start_*): MPI requests with their moves, and
    // whether NCCL's stream has work to wait for
    MPI_Request *reqs;
    Move *moves;
    int n_reqs, cap_reqs;
    bool nccl_queued;
};

int comm_init(Comm **out) {
    *out = NULL;
    Comm *c = spes_calloc(1, sizeof *c);
    if (!c) return SPES_ERR;
    c->size = 1;
    // OpenMPI's launcher (mpirun, or `spes train --nproc_per_node N`, which execs it).
    int world = env_int("OMPI_COMM_WORLD_SIZE", 1, 1);
    if (world > 1) {
        int provided = 0;
        // FUNNELED: only the training thread calls MPI (OpenMP workers never do).
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            free(c);
            return spes_fail("MPI_Init failed (launched by mpirun with %d ranks)", world);
        }
        c->mpi = true;
        c->world = MPI_COMM_WORLD;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &c->size);
        c->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", c->rank, c->rank);
    } else if (rdv_wanted()) {   // torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR/PORT, no mpirun
        if (rdv_join(&c->rdv, &c->world, &c->rank, &c->size, &c->local_rank) != SPES_OK) {
            free(c);
            return SPES_ERR;
        }
        c->mpi = true;
    }
    *out = c;
    return SPES_OK;
}

void comm_finalize(Comm *c) {
    if (!c) return;
    comm_nccl_close(c->nccl);
    rdv_finish(c->rdv, c->world);
    if (c->mpi) MPI_Finalize();
    rdv_close(c->rdv);
    free(c->reqs);
    free(c->moves);
    free(c);
}

void comm_abort(Comm *c, int code) {
    if (c && c->mpi) MPI_Abort(c->world, code);
}

int comm_rank(const Comm *c) { return c ? c->rank : 0; }
int comm_size(const Comm *c) { return c ? c->size : 1; }
int comm_local_rank(const Comm *c) { return c ? c->local_rank : 0; }
bool comm_is_multi(const Comm *c) { return c && c->size > 1; }

static MPI_Datatype mpi_type(CommType t) {
    switch (t) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F64: return MPI_DOUBLE;
    case COMM_I64: return MPI_INT64_T;
    default: return MPI_BYTE;
    }
}

static size_t type_size(CommType t) { return t == COMM_F32 ? 4 : t == COMM_BYTE ? 1 : 8; }

// Device buffers go to NCCL; the communicator is created on first use for that backend.
static int nccl_for(Comm *c, Backend *be, CommNccl **out) {
    if (!c->nccl) {
        SPES_TRY(comm_nccl_open(c, be, &c->nccl));
        c->nccl_be = be;
    } else if (c->nccl_be != be) {
        return spes_fail("dist: device collectives on two backends (%s and %s); one per job", c->nccl_be->description,
                         be->description);
    }
    *out = c->nccl;
    return SPES_OK;
}

static bool on_host(const Backend *be) { return !be || be->host_memory; }

// MPI counts are int: a large buffer goes in chunks of at most 1 GiB.
#define MPI_CHUNK ((size_t)1 << 28)

int comm_allreduce_sum(Comm *c, Backend *be, void *buf, size_t n, CommType t) {
    if (!comm_is_multi(c) || n == 0) return SPES_OK;
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        return comm_nccl_allreduce_sum(nc, be, buf, n, t);
    }
    for (size_t done = 0; done < n; done += MPI_CHUNK) {
        size_t k = n - done < MPI_CHUNK ? n - done : MPI_CHUNK;
        if (MPI_Allreduce(MPI_IN_PLACE, (char *)buf + done * type_size(t), (int)k, mpi_type(t), MPI_SUM,
                          c->world) != MPI_SUCCESS)
            return spes_fail("MPI_Allreduce of %zu values failed", k);
    }
    return SPES_OK;
}

// A slot for one more MPI request (and its move) in the queue.
static int queue_slot(Comm *c, int *slot) {
    if (c->n_reqs == c->cap_reqs) {
        int cap = c->cap_reqs ? 2 * c->cap_reqs : 16;
        MPI_Request *reqs = realloc(c->reqs, (size_t)cap * sizeof *reqs);
        if (reqs) c->reqs = reqs;
        Move *moves = reqs ? realloc(c->moves, (size_t)cap * sizeof *moves) : NULL;
        if (!moves) return spes_fail("out of memory queueing %d collectives", cap);
        c->moves = moves;
        c->cap_reqs = cap;
    }
    *slot = c->n_reqs++;
    c->moves[*slot] = (Move){0};
    return SPES_OK;
}

int comm_start_allreduce_sum(Comm *c, Backend *be, float *buf, size_t n) {
    if (!comm_is_multi(c) || n == 0) return SPES_OK;
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        c->nccl_queued = true;
        return comm_nccl_start_allreduce_sum(nc, be, buf, n);
    }
    if (n > INT_MAX) return spes_fail("dist: a non-blocking all-reduce of %zu values is more than MPI counts hold", n);
    int slot = 0;
    SPES_TRY(queue_slot(c, &slot));
    if (MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->world, &c->reqs[slot]) != MPI_SUCCESS)
        return spes_fail("MPI_Iallreduce of %zu values failed", n);
    return SPES_OK;
}

int comm_start_reduce_scatter_sum(Comm *c, Backend *be, float *buf, const int *counts) {
    if (!comm_is_multi(c)) return SPES_OK;   // one block: its sum is itself, in its place
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        c->nccl_queued = true;
        return comm_nccl_start_reduce_scatter_sum(nc, be, buf, counts);
    }
    size_t at = 0;   // displacement of this rank's block
    for (int r = 0; r < c->rank; r++) at += (size_t)counts[r];
    int slot = 0;
    SPES_TRY(queue_slot(c, &slot));
    // MPI_IN_PLACE: the input is buf, and this rank's sum lands at buf's front.
    if (at > 0) c->moves[slot] = (Move){.to = buf + at, .from = buf, .n = (size_t)counts[c->rank]};
    if (MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, c->world, &c->reqs[slot]) !=
        MPI_SUCCESS)
        return spes_fail("MPI_Ireduce_scatter failed");
    return SPES_OK;
}

int comm_progress(Comm *c) {
    if (!c || c->n_reqs == 0) return SPES_OK;
    int done = 0;
    if (MPI_Testall(c->n_reqs, c->reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return spes_fail("MPI_Testall on %d queued collectives failed", c->n_reqs);
    return SPES_OK;
}

int comm_wait_all(Comm *c) {
    if (!c) return SPES_OK;
    if (c->nccl_queued) {
        c->nccl_queued = false;
        SPES_TRY(comm_nccl_wait(c->nccl));
    }
    if (c->n_reqs == 0) return SPES_OK;
    int n = c->n_reqs;
    c->n_reqs = 0;
    if (MPI_Waitall(n, c->reqs, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return spes_fail("MPI_Waitall on %d queued collectives failed", n);
    for (int i = 0; i < n; i++) {
        if (c->moves[i].n) memmove(c->moves[i].to, c->moves[i].from, c->moves[i].n * sizeof(float));
        free(c->moves[i].displs);
        c->moves[i].displs = NULL;
    }
    return SPES_OK;
}

// displs[r] = sum(counts[0..r)); NULL with a message when that does not fit an MPI count.
static int *displacements(const Comm *c, const int *counts) {
    int *displs = spes_calloc((size_t)c->size, sizeof(int));
    if (!displs) return NULL;
    long long at = 0;
    for (int r = 0; r < c->size; r++) {
        displs[r] = (int)at;
        at += counts[r];
    }
    if (at <= INT_MAX) return displs;
    free(displs);
    spes_fail("an all-gather of %lld values is more than MPI counts hold", at);
    return NULL;
}

int comm_allgather(Comm *c, Backend *be, float *buf, const int *counts) {
    if (!comm_is_multi(c)) return SPES_OK;
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        return comm_nccl_allgather(nc, be, buf, counts);
    }
    int *displs = displacements(c, counts);
    if (!displs) return SPES_ERR;
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, c->world) ==
                     MPI_SUCCESS
                 ? SPES_OK
                 : spes_fail("MPI_Allgatherv failed");
    free(displs);
    return rc;
}

int comm_start_allgather(Comm *c, Backend *be, float *buf, const int *counts) {
    if (!comm_is_multi(c)) return SPES_OK;
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        c->nccl_queued = true;
        return comm_nccl_start_allgather(nc, be, buf, counts);
    }
    int *displs = displacements(c, counts);
    if (!displs) return SPES_ERR;
    int slot = 0;
    if (queue_slot(c, &slot) != SPES_OK) {
        free(displs);
        return SPES_ERR;
    }
    c->moves[slot].displs = displs;
    if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, c->world,
                        &c->reqs[slot]) != MPI_SUCCESS)
        return spes_fail("MPI_Iallgatherv failed");
    return SPES_OK;
}

int comm_broadcast(Comm *c, Backend *be, void *buf, size_t bytes, int root) {
    if (!comm_is_multi(c) || bytes == 0) return SPES_OK;
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        return comm_nccl_broadcast(nc, be, buf, bytes, root);
    }
    for (size_t done = 0; done < bytes; done += MPI_CHUNK) {
        size_t k = bytes - done < MPI_CHUNK ? bytes - done : MPI_CHUNK;
        if (MPI_Bcast((char *)buf + done, (int)k, MPI_BYTE, root, c->world) != MPI_SUCCESS)
            return spes_fail("MPI_Bcast of %zu bytes failed", k);
    }
    return SPES_OK;
}

int comm_barrier(Comm *c) {
    if (!comm_is_multi(c)) return SPES_OK;
    return MPI_Barrier(c->world) == MPI_SUCCESS ? SPES_OK : spes_fail("MPI_Barrier failed");
}

int comm_allgather_int(Comm *c, int value, int *out) {
    if (!comm_is_multi(c)) {
        out[0] = value;
        return SPES_OK;
    }
    return MPI_Allgather(&value, 1, MPI_INT, out, 1, MPI_INT, c->world) == MPI_SUCCESS
               ? SPES_OK
               : spes_fail("MPI_Allgather failed");
}

int comm_all_ok(Comm *c, int rc, const char *what) {
    int64_t failed = rc != SPES_OK;
    SPES_TRY(comm_allreduce_sum(c, NULL, &failed, 1, COMM_I64));
    if (rc == SPES_OK && failed)
        rc = spes_fail("%" PRId64 " of %d ranks could not %s (their logs say why)", failed, comm_size(c), what);
    return rc;
}
