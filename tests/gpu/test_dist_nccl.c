// The NCCL half of src/parallel/comm.h on one GPU with one rank: a communicator of size 1 over
// the cuda backend, and each device collective (all-reduce, the non-blocking all-reduce,
// in-place reduce-scatter and all-gather of the gradient reductions and ZeRO-3's prefetch,
// all-gather, broadcast) leaves the right values in device memory. Skipped (cmocka skip) without
// a GPU. With one rank every collective is the identity: this checks the calls, not the
// reductions; those are tests/gpu/dist_ranks_gpu.sh's (two ranks on one GPU, NCCL >= 2.30).
#include "gpu_test.h"

#include "parallel/comm.h"

static void test_nccl_one_rank(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_FP32);
    Comm *c = NULL;
    assert_int_equal(comm_init(&c), SPES_OK);
    assert_int_equal(comm_size(c), 1);
    CommNccl *nc = NULL;
    if (comm_nccl_open(c, be, &nc) != SPES_OK) fail_msg("comm_nccl_open: %s", spes_last_error());
    const size_t n = 1000;
    float *x = gt_random(n, 3, 1.0);
    Buf dx = gt_upload(be, x, n, NUM_F32);
    float *d = dx.p;
    assert_int_equal(comm_nccl_allreduce_sum(nc, be, d, n, COMM_F32), SPES_OK);
    float *y = gt_download(be, dx, n);
    assert_memory_equal(x, y, n * sizeof(float));   // a sum over one rank is the value itself
    free(y);
    // The non-blocking collectives: queued on NCCL's stream, then waited for.
    int counts[1] = {(int)n};
    assert_int_equal(comm_nccl_start_allreduce_sum(nc, be, d, n), SPES_OK);
    assert_int_equal(comm_nccl_start_reduce_scatter_sum(nc, be, d, counts), SPES_OK);   // in place
    assert_int_equal(comm_nccl_start_allgather(nc, be, d, counts), SPES_OK);            // ZeRO-3's prefetch
    assert_int_equal(comm_nccl_wait(nc), SPES_OK);
    y = gt_download(be, dx, n);
    assert_memory_equal(x, y, n * sizeof(float));
    free(y);
    Buf dr = gt_upload(be, x, n, NUM_F32);
    assert_int_equal(comm_nccl_allgather(nc, be, dr.p, counts), SPES_OK);
    assert_int_equal(comm_nccl_broadcast(nc, be, dr.p, n * sizeof(float), 0), SPES_OK);
    y = gt_download(be, dr, n);
    assert_memory_equal(x, y, n * sizeof(float));
    free(y);
    // Through the dispatching interface too: a device buffer of a single-rank job is left alone.
    assert_int_equal(comm_allreduce_sum(c, be, dr.p, n, COMM_F32), SPES_OK);
    y = gt_download(be, dr, n);
    assert_memory_equal(x, y, n * sizeof(float));
    free(y);
    gt_free(be, dr);
    gt_free(be, dx);
    free(x);
    comm_nccl_close(nc);
    comm_finalize(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl_one_rank)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
