// The NCCL half of src/parallel/comm.h: collectives over device buffers of the cuda backend.
// Compiled for real only in CUDA builds (SPES_WITH_CUDA); a CPU-only build answers every
// device collective with a message (a CPU-only build has no device buffers to begin with).
//
// Ordering. The backend queues its kernels on its own stream; NCCL runs on a stream of ours.
// Each collective first waits for the backend's queued work (backend_sync: the kernels that
// wrote the buffer are done). A blocking call then waits for itself; a started one (the
// gradient buckets) is left running on NCCL's stream while the host goes on queueing the rest
// of the backward on the backend's stream, and comm_nccl_wait waits for all of them. No
// cross-stream event is needed: the host sync orders the two streams.
//
// The NCCL that scripts/gpu_bundle.sh builds (for lent one-GPU machines) holds only the
// collectives called here and what NCCL turns them into (its ONLY_FUNCS list): a new call
// here goes into that list too, or that NCCL runs it as a no-op.
#include "parallel/comm.h"

#include "base/error.h"

#ifdef SPES_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>

#include "base/alloc.h"

struct CommNccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    int rank, size;
};

#define NCCL_TRY(call)                                                                                    \
    do {                                                                                                  \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess) return spes_fail("%s failed: %s", #call, ncclGetErrorString(r_));          \
    } while (0)

int comm_nccl_open(Comm *c, Backend *be, CommNccl **out) {
    *out = NULL;
    if (be->device < 0) return spes_fail("dist: NCCL needs a cuda backend, got %s", be->description);
    CommNccl *n = spes_calloc(1, sizeof *n);
    if (!n) return SPES_ERR;
    n->device = be->device;
    n->rank = comm_rank(c);
    n->size = comm_size(c);
    ncclUniqueId id;
    int rc = SPES_OK;
    if (n->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) rc = spes_fail("ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    }
    // Rank 0's id reaches the others over MPI (host), the bootstrap NCCL asks for.
    if (rc == SPES_OK) rc = comm_broadcast(c, NULL, &id, sizeof id, 0);
    if (rc == SPES_OK && cudaSetDevice(n->device) != cudaSuccess)
        rc = spes_fail("cudaSetDevice(%d) failed", n->device);
    if (rc == SPES_OK && cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess)
        rc = spes_fail("cudaStreamCreate failed on cuda:%d", n->device);
    if (rc == SPES_OK) {
        ncclResult_t r = ncclCommInitRank(&n->comm, n->size, id, n->rank);
        if (r != ncclSuccess)
            rc = spes_fail("ncclCommInitRank (rank %d of %d on cuda:%d) failed: %s%s", n->rank, n->size, n->device,
                           ncclGetErrorString(r),
                           r == ncclInvalidUsage ? " (two ranks on one GPU? NCCL wants one GPU per rank)" : "");
    }
    if (rc != SPES_OK) {
        if (n->stream) cudaStreamDestroy(n->stream);
        free(n);
        return SPES_ERR;
    }
    *out = n;
    return SPES_OK;
}

void comm_nccl_close(CommNccl *n) {
    if (!n) return;
    if (n->comm) ncclCommDestroy(n->comm);
    cudaStreamDestroy(n->stream);
    free(n);
}

static ncclDataType_t nccl_type(CommType t) {
    switch (t) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

static int begin(CommNccl *n, Backend *be) {
    if (!n->comm) return spes_fail("NCCL on cuda:%d: the communicator was aborted after an error", n->device);
    SPES_TRY(backend_sync(be));   // the backend's kernels that wrote the buffer are done
    if (cudaSetDevice(n->device) != cudaSuccess) return spes_fail("cudaSetDevice(%d) failed", n->device);
    return SPES_OK;
}

// Waits for NCCL's stream by polling it together with the communicator's asynchronous error:
// a NCCL failure with every rank alive (a transport error) leaves its kernel spinning, so a
// plain cudaStreamSynchronize would wait forever; the communicator is aborted instead, which
// ends the kernels, and the error ends the job. (A rank that dies is mpirun's or the
// rendezvous watchdog's to handle.) NCCL's own advice for error handling.
static int finish(CommNccl *n, const char *what) {
    if (!n->comm) return spes_fail("NCCL %s on cuda:%d: the communicator was aborted after an error", what, n->device);
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e != cudaSuccess && e != cudaErrorNotReady)
            return spes_fail("NCCL %s on cuda:%d: %s", what, n->device, cudaGetErrorString(e));
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
        if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            ncclCommAbort(n->comm);
            n->comm = NULL;
            return spes_fail("NCCL %s on cuda:%d failed: %s (communicator aborted)", what, n->device,
                             ncclGetErrorString(r != ncclSuccess ? r : async));
        }
        if (e == cudaSuccess) return SPES_OK;   // done, and no error raised on the way
        sched_yield();
    }
}

int comm_nccl_allreduce_sum(CommNccl *n, Backend *be, void *buf, size_t count, CommType t) {
    SPES_TRY(begin(n, be));
    NCCL_TRY(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, n->comm, n->stream));
    return finish(n, "all-reduce");
}

int comm_nccl_start_allreduce_sum(CommNccl *n, Backend *be, float *buf, size_t count) {
    SPES_TRY(begin(n, be));
    NCCL_TRY(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, n->stream));
    return SPES_OK;
}

int comm_nccl_start_reduce_scatter_sum(CommNccl *n, Backend *be, float *buf, const int *counts) {
    SPES_TRY(begin(n, be));
    size_t at = 0;
    NCCL_TRY(ncclGroupStart());
    for (int r = 0; r < n->size; r++) {
        // Block r reduced onto rank r, in place; the other ranks' recvbuff is unused by that call.
        NCCL_TRY(ncclReduce(buf + at, n->rank == r ? buf + at : NULL, (size_t)counts[r], ncclFloat32, ncclSum, r,
                            n->comm, n->stream));
        at += (size_t)counts[r];
    }
    NCCL_TRY(ncclGroupEnd());
    return SPES_OK;
}

int comm_nccl_wait(CommNccl *n) { return finish(n, "queued collectives"); }

int comm_nccl_start_allgather(CommNccl *n, Backend *be, float *buf, const int *counts) {
    SPES_TRY(begin(n, be));
    size_t at = 0;
    NCCL_TRY(ncclGroupStart());
    for (int r = 0; r < n->size; r++) {
        NCCL_TRY(ncclBroadcast(buf + at, buf + at, (size_t)counts[r], ncclFloat32, r, n->comm, n->stream));
        at += (size_t)counts[r];
    }
    NCCL_TRY(ncclGroupEnd());
    return SPES_OK;
}

int comm_nccl_allgather(CommNccl *n, Backend *be, float *buf, const int *counts) {
    SPES_TRY(comm_nccl_start_allgather(n, be, buf, counts));
    return finish(n, "all-gather");
}

int comm_nccl_broadcast(CommNccl *n, Backend *be, void *buf, size_t bytes, int root) {
    SPES_TRY(begin(n, be));
    NCCL_TRY(ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->comm, n->stream));
    return finish(n, "broadcast");
}

int comm_nccl_version(void) {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

#else   // CPU-only build

struct CommNccl {
    int unused;
};

static int no_nccl(void) {
    return spes_fail("dist: device buffers need NCCL, and this spes was built without CUDA (build with nvcc "
                     "found, or train with device: cpu)");
}
int comm_nccl_open(Comm *c, Backend *be, CommNccl **out) {
    *out = NULL;
    return no_nccl();
}
void comm_nccl_close(CommNccl *n) { (void)n; }
int comm_nccl_version(void) { return 0; }
int comm_nccl_allreduce_sum(CommNccl *n, Backend *be, void *buf, size_t count, CommType t) { return no_nccl(); }
int comm_nccl_start_allreduce_sum(CommNccl *n, Backend *be, float *buf, size_t count) { return no_nccl(); }
int comm_nccl_start_reduce_scatter_sum(CommNccl *n, Backend *be, float *buf, const int *counts) { return no_nccl(); }
int comm_nccl_start_allgather(CommNccl *n, Backend *be, float *buf, const int *counts) { return no_nccl(); }
int comm_nccl_wait(CommNccl *n) { return no_nccl(); }
int comm_nccl_allgather(CommNccl *n, Backend *be, float *buf, const int *counts) { return no_nccl(); }
int comm_nccl_broadcast(CommNccl *n, Backend *be, void *buf, size_t bytes, int root) { return no_nccl(); }
#endif
