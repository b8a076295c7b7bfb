// MPI host collectives and the dispatch to NCCL for device buffers. See comm.h.
#include "dist/comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

struct Comm {
    int rank, size, local_rank;
    bool mpi;                  // MPI_Init was called by us
    CommNccl *nccl;            // opened on the first device collective
    Backend *nccl_be;
};

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    long x = strtol(v, &end, 10);
    return *end == '\0' && x >= 0 && x <= INT_MAX ? (int)x : fallback;
}

int comm_init(Comm **out) {
    *out = NULL;
    Comm *c = spes_calloc(1, sizeof *c);
    if (!c) return SPES_ERR;
    c->size = 1;
    // OpenMPI's launcher (mpirun, or `spes train --nproc_per_node N`, which execs it).
    int world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    if (world > 1) {
        int provided = 0;
        // FUNNELED: only the training thread calls MPI (OpenMP workers never do).
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            free(c);
            return spes_fail("MPI_Init failed (launched by mpirun with %d ranks)", world);
        }
        c->mpi = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &c->size);
        c->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", c->rank);
    }
    *out = c;
    return SPES_OK;
}

void comm_finalize(Comm *c) {
    if (!c) return;
    comm_nccl_close(c->nccl);
    if (c->mpi) MPI_Finalize();
    free(c);
}

void comm_abort(Comm *c, int code) {
    if (c && c->mpi) MPI_Abort(MPI_COMM_WORLD, code);
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
                          MPI_COMM_WORLD) != MPI_SUCCESS)
            return spes_fail("MPI_Allreduce of %zu values failed", k);
    }
    return SPES_OK;
}

int comm_reduce_scatter_sum(Comm *c, Backend *be, const float *send, float *recv, const int *counts) {
    if (!comm_is_multi(c)) {
        size_t bytes = (size_t)counts[0] * sizeof(float);
        if (recv != send && bytes > 0 && on_host(be)) memmove(recv, send, bytes);
        else if (recv != send && bytes > 0) be->ops->copy(be, recv, send, bytes);
        return SPES_OK;
    }
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        return comm_nccl_reduce_scatter_sum(nc, be, send, recv, counts);
    }
    if (MPI_Reduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        return spes_fail("MPI_Reduce_scatter failed");
    return SPES_OK;
}

int comm_allgather(Comm *c, Backend *be, float *buf, const int *counts) {
    if (!comm_is_multi(c)) return SPES_OK;
    if (!on_host(be)) {
        CommNccl *nc = NULL;
        SPES_TRY(nccl_for(c, be, &nc));
        return comm_nccl_allgather(nc, be, buf, counts);
    }
    int *displs = spes_calloc((size_t)c->size, sizeof(int));
    if (!displs) return SPES_ERR;
    long long at = 0;
    for (int r = 0; r < c->size; r++) {
        displs[r] = (int)at;
        at += counts[r];
    }
    int rc = at <= INT_MAX && MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT,
                                             MPI_COMM_WORLD) == MPI_SUCCESS
                 ? SPES_OK
                 : spes_fail("MPI_Allgatherv of %lld values failed", at);
    free(displs);
    return rc;
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
        if (MPI_Bcast((char *)buf + done, (int)k, MPI_BYTE, root, MPI_COMM_WORLD) != MPI_SUCCESS)
            return spes_fail("MPI_Bcast of %zu bytes failed", k);
    }
    return SPES_OK;
}

int comm_barrier(Comm *c) {
    if (!comm_is_multi(c)) return SPES_OK;
    return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? SPES_OK : spes_fail("MPI_Barrier failed");
}

int comm_allgather_int(Comm *c, int value, int *out) {
    if (!comm_is_multi(c)) {
        out[0] = value;
        return SPES_OK;
    }
    return MPI_Allgather(&value, 1, MPI_INT, out, 1, MPI_INT, MPI_COMM_WORLD) == MPI_SUCCESS
               ? SPES_OK
               : spes_fail("MPI_Allgather failed");
}
