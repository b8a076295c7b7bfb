// Which failed calls a peer repeats (src/sync/call_retry.c): status + message -> retry or not.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sync/call_retry.h"

// The error a failed call leaves on the peer (client.c: call_failed), quoting the server's details.
#define FAILED(method, status, details) "server 127.0.0.1:50051: /FederatedServer/" method " failed (" status "): " details

static void test_unreachable_and_busy_are_retried(void **state) {
    (void)state;
    assert_int_equal(sync_call_retry(GRPC_STATUS_UNAVAILABLE, FAILED("Hello", "UNAVAILABLE", "failed to connect to all addresses")),
                     SYNC_RETRY_UNREACHABLE);
    assert_int_equal(sync_call_retry(GRPC_STATUS_UNAVAILABLE, NULL), SYNC_RETRY_UNREACHABLE);
    // A full disk on the server (rounds.c: storage_failed) is UNAVAILABLE too.
    assert_int_equal(sync_call_retry(GRPC_STATUS_UNAVAILABLE,
                                     FAILED("UploadChunk", "UNAVAILABLE", "upload from peer 0 for step 2: the server cannot store it now")),
                     SYNC_RETRY_UNREACHABLE);
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED,
                                     FAILED("UploadChunk", "RESOURCE_EXHAUSTED", "server busy: more than 80 calls in progress")),
                     SYNC_RETRY_BUSY);
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED,
                                     FAILED("UploadChunk", "RESOURCE_EXHAUSTED",
                                            "server busy: upload from peer 1 step 4 needs 12 bytes of buffer, 10 of the "
                                            "20-byte upload budget are in use (retry later)")),
                     SYNC_RETRY_BUSY);
}

// What the peer's gRPC (1.51) reports for a stream the server's receive quota reset (HTTP/2
// RST_STREAM ENHANCE_YOUR_CALM; seen for real in tests/integration/server_hostile_peers.sh,
// quota_reset). Before, only "server busy" was retried: such a reset of an honest upload made
// the peer save its step unsynced and exit.
static void test_quota_reset_is_retried(void **state) {
    (void)state;
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED,
                                     FAILED("UploadChunk", "RESOURCE_EXHAUSTED", "Received RST_STREAM with error code 11")),
                     SYNC_RETRY_QUOTA_RESET);
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED, "Received RST_STREAM with error code 11"),
                     SYNC_RETRY_QUOTA_RESET);
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED,
                                     FAILED("WaitAggregate", "RESOURCE_EXHAUSTED", "Received RST_STREAM with error code 11")),
                     SYNC_RETRY_QUOTA_RESET);
    // Another HTTP/2 error code, or the same words under another status, is not this.
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED, "Received RST_STREAM with error code 110"),
                     SYNC_RETRY_NO);
    assert_int_equal(sync_call_retry(GRPC_STATUS_INTERNAL, "Received RST_STREAM with error code 2"), SYNC_RETRY_NO);
    assert_int_equal(sync_call_retry(GRPC_STATUS_INTERNAL, "Received RST_STREAM with error code 11"), SYNC_RETRY_NO);
}

// The round an upload completed failed to aggregate (rounds_aggregate.c: the server dropped the
// upload and reopened the round, and says "retry the upload"): the peer did not, and saved its
// step unsynced and exited on a server short of memory for a moment.
static void test_failed_aggregation_is_retried(void **state) {
    (void)state;
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED,
                                     FAILED("UploadChunk", "RESOURCE_EXHAUSTED",
                                            "aggregating step 4 (retry the upload): out of memory")),
                     SYNC_RETRY_AGGREGATION);
    assert_int_equal(sync_call_retry(GRPC_STATUS_INTERNAL, "aggregating step 4 (retry the upload)"), SYNC_RETRY_NO);
}

// RESOURCE_EXHAUSTED that a retry would meet again: final.
static void test_permanent_exhaustion_is_not_retried(void **state) {
    (void)state;
    const char *permanent[] = {
        // server.c take_chunk: an upload larger than its tensors can take
        FAILED("UploadChunk", "RESOURCE_EXHAUSTED",
               "upload from peer 0 step 2: more than 2464 bytes, the most its tensors can take (F32 + header)"),
        // server.c reserve: chunks larger than the whole upload budget
        FAILED("UploadChunk", "RESOURCE_EXHAUSTED",
               "upload from peer 0 step 2 needs 50331648 bytes of buffer (chunks of that size), more than the server's "
               "whole upload budget of 25165824 bytes (--max_upload_buffer)"),
        // server.c recv_request_bytes: a request larger than its RPC needs
        FAILED("Hello", "RESOURCE_EXHAUSTED", "HelloRequest request of 20000000 bytes refused: at most 16777216 bytes"),
        // gRPC's own message size limits
        FAILED("DownloadChunk", "RESOURCE_EXHAUSTED", "Received message larger than max (8388613 vs. 4194304)"),
        // rounds.c no_room: every open-round slot taken by lower steps
        FAILED("UploadChunk", "RESOURCE_EXHAUSTED",
               "upload from peer 0 for step 6: 4 rounds are already open (peers far apart in steps?)"),
        // client.c unary_finish: out of memory packing the request
        "out of memory packing a /FederatedServer/Hello request",
    };
    for (size_t i = 0; i < sizeof permanent / sizeof *permanent; i++)
        if (sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED, permanent[i]) != SYNC_RETRY_NO)
            fail_msg("retried, but a retry meets it again: %s", permanent[i]);
    assert_int_equal(sync_call_retry(GRPC_STATUS_RESOURCE_EXHAUSTED, NULL), SYNC_RETRY_NO);
    // Other statuses are final, whatever their words.
    assert_int_equal(sync_call_retry(GRPC_STATUS_INVALID_ARGUMENT, "tensor 'server busy' is unknown"), SYNC_RETRY_NO);
    assert_int_equal(sync_call_retry(GRPC_STATUS_OK, NULL), SYNC_RETRY_NO);
    assert_int_equal(sync_call_retry(GRPC_STATUS_DEADLINE_EXCEEDED, "Deadline Exceeded"), SYNC_RETRY_NO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unreachable_and_busy_are_retried),
        cmocka_unit_test(test_quota_reset_is_retried),
        cmocka_unit_test(test_failed_aggregation_is_retried),
        cmocka_unit_test(test_permanent_exhaustion_is_not_retried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
