// wire_count_field (src/sync/wire.c): the server counts a Hello's tensor entries from the bytes
// on the wire before unpacking them (each ~8-byte entry unpacks to ~140 bytes). The count must be
// the unpacked one for real messages, and malformed bytes must be refused, not miscounted.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "federated.pb-c.h"
#include "sync/wire.h"

static uint32_t tensors_field(void) {
    return protobuf_c_message_descriptor_get_field_by_name(&hello_request__descriptor, "tensors")->id;
}

// A HelloRequest with n tensors (and the other fields set, so they are skipped), packed.
static uint8_t *hello_bytes(size_t n, size_t *len) {
    HelloRequest req = HELLO_REQUEST__INIT;
    req.peer_id = -1;   // a 10-byte varint
    req.mode = "spes";
    req.fingerprint = UINT64_MAX;   // fixed64
    req.payload_dtype = "F32";
    req.outer_lr = 0.5f;            // fixed32
    TensorInfo *infos = calloc(n ? n : 1, sizeof *infos);
    TensorInfo **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    int64_t shape[2] = {3, 4};
    for (size_t i = 0; i < n; i++) {
        infos[i] = (TensorInfo)TENSOR_INFO__INIT;
        infos[i].name = "w";
        infos[i].n_shape = 2;
        infos[i].shape = shape;
        infos[i].dtype = "F32";
        ptrs[i] = &infos[i];
    }
    req.n_tensors = n;
    req.tensors = ptrs;
    *len = hello_request__get_packed_size(&req);
    uint8_t *out = malloc(*len ? *len : 1);
    hello_request__pack(&req, out);
    free(infos);
    free(ptrs);
    return out;
}

static void test_counts_what_unpacking_gives(void **state) {
    (void)state;
    for (size_t n = 0; n < 40; n += 13) {
        size_t len, count = 99;
        uint8_t *bytes = hello_bytes(n, &len);
        assert_true(wire_count_field(bytes, len, tensors_field(), &count));
        assert_int_equal(count, n);
        HelloRequest *req = hello_request__unpack(NULL, len, bytes);
        assert_non_null(req);
        assert_int_equal(req->n_tensors, count);
        hello_request__free_unpacked(req, NULL);
        free(bytes);
    }
}

static void test_malformed_refused(void **state) {
    (void)state;
    size_t len, count;
    uint8_t *bytes = hello_bytes(5, &len);
    // every truncation that cuts a field short is refused (a cut between fields is a shorter message)
    int refused = 0;
    for (size_t cut = 1; cut < len; cut++) refused += !wire_count_field(bytes, cut, tensors_field(), &count);
    assert_true(refused > 0);
    free(bytes);
    const uint8_t group[] = {(1 << 3) | 3};                                     // a group start: not proto3
    const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    const uint8_t past_end[] = {(6 << 3) | 2, 0x7f, 0x00};                      // 127 bytes announced, 1 there
    const uint8_t huge_len[] = {(6 << 3) | 2, 0xff, 0xff, 0xff, 0xff, 0x0f};   // 2^32-1 bytes announced
    assert_false(wire_count_field(group, sizeof group, tensors_field(), &count));
    assert_false(wire_count_field(long_varint, sizeof long_varint, tensors_field(), &count));
    assert_false(wire_count_field(past_end, sizeof past_end, tensors_field(), &count));
    assert_false(wire_count_field(huge_len, sizeof huge_len, tensors_field(), &count));
    // empty: a message with no fields
    assert_true(wire_count_field(NULL, 0, tensors_field(), &count));
    assert_int_equal(count, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_what_unpacking_gives),
        cmocka_unit_test(test_malformed_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
