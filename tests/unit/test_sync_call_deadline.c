// The deadline of one upload / download call (src/sync/call_deadline.c): sizes -> seconds.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sync/call_deadline.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static void test_floor_plus_bytes_at_the_min_rate(void **state) {
    (void)state;
    assert_true(sync_call_deadline(0, 1, 1800) == 60);              // an empty call: the floor
    assert_true(sync_call_deadline(64 * KiB, 1, 1800) == 61);       // one second of bytes at 64 KiB/s
    assert_true(sync_call_deadline(4 * MiB, 1, 1800) == 124);       // a 4 MiB upload chunk
    assert_true(sync_call_deadline(4 * MiB, 4, 1800) == 316);       // a 4 MiB download chunk, 4 in flight
    assert_true(sync_call_deadline(64 * KiB, 4, 1800) == 64);       // the tiny model's 64 KiB chunks
    assert_true(sync_call_deadline(4 * MiB, 0, 1800) == 124);       // sharing below 1 counts as 1
}

static void test_capped_by_call_timeout(void **state) {
    (void)state;
    assert_true(sync_call_deadline(100 * MiB, 1, 1800) == 1660);    // under the cap: 60 + 1600
    assert_true(sync_call_deadline(1024 * MiB, 1, 1800) == 1800);   // a 1B model's 1 GB upload: the cap
    assert_true(sync_call_deadline(1024 * MiB, 1, 30) == 30);       // a cap below the floor wins
    assert_true(sync_call_deadline(1024 * MiB, 1, 0) == 60 + 16384); // no cap
}

static void test_download_chunk_bytes(void **state) {
    (void)state;
    assert_int_equal(sync_download_chunk_bytes(10 * MiB, 3, 4 * MiB), 4 * MiB);   // the server's chunk
    assert_int_equal(sync_download_chunk_bytes(1 * MiB, 1, 4 * MiB), 1 * MiB);    // never past the download
    assert_int_equal(sync_download_chunk_bytes(10, 3, 0), 4);                       // not stated: an even split
    assert_int_equal(sync_download_chunk_bytes(10, 1, 0), 10);
    assert_int_equal(sync_download_chunk_bytes(0, 1, 0), 0);
}

// Who ended a call that failed DEADLINE_EXCEEDED: the peer's own deadline (reached, within the
// slack, or its per-message timer), else the server before it (its idle timeout).
static void test_deadline_side(void **state) {
    (void)state;
    assert_int_equal(sync_deadline_side(64.0, 64.0, false), SYNC_DEADLINE_PEER);     // at the deadline
    assert_int_equal(sync_deadline_side(63.2, 64.0, false), SYNC_DEADLINE_PEER);     // within the slack
    assert_int_equal(sync_deadline_side(300.0, 64.0, false), SYNC_DEADLINE_PEER);    // long past (a slow status)
    assert_int_equal(sync_deadline_side(62.9, 64.0, false), SYNC_DEADLINE_SERVER);   // before it
    assert_int_equal(sync_deadline_side(0.1, 96.0, false), SYNC_DEADLINE_SERVER);    // a server's idle timeout
    assert_int_equal(sync_deadline_side(5.0, 96.0, true), SYNC_DEADLINE_PEER);       // the message timer is ours
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_floor_plus_bytes_at_the_min_rate),
        cmocka_unit_test(test_capped_by_call_timeout),
        cmocka_unit_test(test_download_chunk_bytes),
        cmocka_unit_test(test_deadline_side),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
