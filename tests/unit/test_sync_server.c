// The gRPC transport's edge cases, with raw gRPC calls against a real server on loopback:
// a stalled upload stream does not block other calls and is cancelled after the idle
// timeout; chunks out of order, malformed messages, unknown methods, chunk ids past the end,
// dropped aggregates each get their status; WaitAggregate returns at its deadline when the
// round is open and at once when it is complete.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "base/timer.h"
#include "sync/client.h"
#include "server/server.h"
#include "sync/wire.h"
#include "sync_test_model.h"

typedef struct {
    SyncServer *srv;
    char addr[64];
    grpc_channel *channel;
    grpc_completion_queue *cq;
    const char *token;              // sent as "authorization: Bearer <token>" when set
} Fixture;

static Fixture *start_fixture_cfg(int max_calls, size_t max_buffered_bytes, AggregateConfig agg,
                                  const char *peer_tokens_file) {
    Fixture *f = calloc(1, sizeof *f);
    SyncServerConfig cfg;
    sync_server_config_defaults(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.chunk_size = 100;
    cfg.idle_timeout_seconds = 3;
    cfg.max_calls = max_calls;
    cfg.max_buffered_bytes = max_buffered_bytes;
    cfg.rounds.keep_steps = 1;
    cfg.rounds.agg = agg;
    cfg.peer_tokens_file = peer_tokens_file;
    assert_int_equal(sync_server_start(&cfg, &f->srv), SPES_OK);
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", sync_server_port(f->srv));
    grpc_init();
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    f->channel = grpc_channel_create(f->addr, creds, NULL);
    grpc_channel_credentials_release(creds);
    f->cq = grpc_completion_queue_create_for_pluck(NULL);
    return f;
}

static Fixture *start_fixture_with(int max_calls, size_t max_buffered_bytes) {
    return start_fixture_cfg(max_calls, max_buffered_bytes,
                             (AggregateConfig){.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4},
                             NULL);
}

static Fixture *start_fixture(int max_calls) { return start_fixture_with(max_calls, 0); }

static int setup(void **state) {
    *state = start_fixture(256);
    return 0;
}

static int setup_small_budget(void **state) {
    *state = start_fixture_with(256, 1000);
    return 0;
}

static int teardown(void **state) {
    Fixture *f = *state;
    grpc_channel_destroy(f->channel);
    grpc_completion_queue_shutdown(f->cq);
    while (grpc_completion_queue_pluck(f->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(f->cq);
    grpc_shutdown();
    sync_server_stop(f->srv);
    free(f);
    return 0;
}

static grpc_call *open_call(Fixture *f, const char *method) {
    grpc_call *call = grpc_channel_create_call(f->channel, NULL, GRPC_PROPAGATE_DEFAULTS, f->cq,
                                               grpc_slice_from_static_string(method), NULL, wire_deadline(20), NULL);
    char bearer[128];
    snprintf(bearer, sizeof bearer, "Bearer %s", f->token ? f->token : "");
    grpc_metadata auth = {.key = grpc_slice_from_static_string("authorization"),
                          .value = grpc_slice_from_copied_string(bearer)};
    grpc_op op = {0};
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    op.data.send_initial_metadata.count = f->token ? 1 : 0;
    op.data.send_initial_metadata.metadata = &auth;
    assert_true(wire_run_batch(call, f->cq, &op, 1, 20));
    grpc_slice_unref(auth.value);
    return call;
}

static bool send_bytes(Fixture *f, grpc_call *call, grpc_byte_buffer *bb) {
    grpc_op op = {0};
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    bool ok = wire_run_batch(call, f->cq, &op, 1, 20);
    grpc_byte_buffer_destroy(bb);
    return ok;
}

// Half-closes (when asked), reads the response and the status; returns the status code and
// unpacks the response into *resp when desc is given and a message came.
static grpc_status_code close_call(Fixture *f, grpc_call *call, bool half_close, const ProtobufCMessageDescriptor *desc,
                                   ProtobufCMessage **resp, char *details, size_t cap) {
    if (half_close) {
        grpc_op op = {0};
        op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        wire_run_batch(call, f->cq, &op, 1, 20);
    }
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_byte_buffer *bb = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice text = grpc_empty_slice();
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &bb;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[2].data.recv_status_on_client.status = &code;
    ops[2].data.recv_status_on_client.status_details = &text;
    wire_run_batch(call, f->cq, ops, 3, 30);
    char *s = grpc_slice_to_c_string(text);
    snprintf(details, cap, "%s", s);
    gpr_free(s);
    if (resp) *resp = bb && desc ? wire_unpack(desc, bb) : NULL;
    if (bb) grpc_byte_buffer_destroy(bb);
    grpc_slice_unref(text);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    grpc_call_unref(call);
    return code;
}

static grpc_status_code unary(Fixture *f, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp, char *details,
                              size_t cap) {
    grpc_call *call = open_call(f, method);
    send_bytes(f, call, wire_pack(req));   // may fail when the server answers before reading it
    return close_call(f, call, true, desc, resp, details, cap);
}

static grpc_byte_buffer *chunk(int peer, int step, int id, int total, const uint8_t *data, size_t len) {
    UploadChunkRequest m = UPLOAD_CHUNK_REQUEST__INIT;
    m.peer_id = peer;
    m.step = step;
    m.chunk_id = id;
    m.total_chunks = total;
    m.chunk_data.data = (uint8_t *)data;
    m.chunk_data.len = len;
    return wire_pack(&m.base);
}

// Gives the server's call threads time to take what was sent: a send completes when gRPC has
// sent the bytes, not when the server has read them.
static void let_server_take(void) {
    struct timespec settle = {0, 500 * 1000 * 1000};
    nanosleep(&settle, NULL);
}

static void test_stalled_upload_blocks_nobody(void **state) {
    Fixture *f = *state;
    uint8_t data[50] = {0};
    grpc_call *stalled = open_call(f, "/FederatedServer/UploadChunk");
    assert_true(send_bytes(f, stalled, chunk(0, 1, 0, 3, data, sizeof data)));
    // Meanwhile the server answers others at once.
    double start = now_seconds();
    StatusRequest sreq = STATUS_REQUEST__INIT;
    StatusResponse *st = NULL;
    char details[512];
    assert_int_equal(unary(f, "/FederatedServer/Status", &sreq.base, &status_response__descriptor,
                           (ProtobufCMessage **)&st, details, sizeof details),
                     GRPC_STATUS_OK);
    assert_int_equal(st->total_peers, 2);
    assert_string_equal(st->mode, "spes");
    status_response__free_unpacked(st, NULL);
    assert_true(now_seconds() - start < 2.5);   // well before the 3 s idle timeout
    // The stalled stream is cancelled by the server's 3 s idle timeout.
    grpc_status_code code = close_call(f, stalled, false, NULL, NULL, details, sizeof details);
    assert_true(code == GRPC_STATUS_DEADLINE_EXCEEDED || code == GRPC_STATUS_CANCELLED);
    assert_true(now_seconds() - start < 10);
}

// A second server on a port in use fails to start (gRPC's default SO_REUSEPORT let it share).
static void test_port_is_exclusive(void **state) {
    Fixture *f = *state;
    SyncServerConfig cfg;
    sync_server_config_defaults(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = sync_server_port(f->srv);
    cfg.rounds.agg = (AggregateConfig){.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 4};
    SyncServer *second = NULL;
    assert_int_equal(sync_server_start(&cfg, &second), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "the port is in use"));
    if (second) sync_server_stop(second);
}

// More concurrent calls than max_calls: the extra call is refused RESOURCE_EXHAUSTED at once.
static void test_call_limit(void **state) {
    (void)state;
    Fixture *f = start_fixture(1);
    uint8_t data[50] = {0};
    grpc_call *stalled = open_call(f, "/FederatedServer/UploadChunk");
    assert_true(send_bytes(f, stalled, chunk(0, 1, 0, 3, data, sizeof data)));
    StatusRequest sreq = STATUS_REQUEST__INIT;
    char details[512];
    // The stalled call counts once the server has accepted it (a moment after the send).
    grpc_status_code code = GRPC_STATUS_OK;
    double start = now_seconds();
    while (code == GRPC_STATUS_OK && now_seconds() - start < 2.5)
        code = unary(f, "/FederatedServer/Status", &sreq.base, NULL, NULL, details, sizeof details);
    assert_int_equal(code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "server busy"));
    // The client library backs off and retries "busy" (within its retry timeout): its Status
    // gets through once the stalled call is cancelled by the 3 s idle timeout.
    SyncClientConfig ccfg;
    sync_client_config_defaults(&ccfg);
    ccfg.server_addr = f->addr;
    ccfg.num_peers = 2;
    ccfg.connect_timeout_s = 15;
    SyncClient *client;
    assert_int_equal(sync_client_create(&ccfg, &client), SPES_OK);
    RoundsStatus st;
    assert_int_equal(sync_client_status(client, &st), SPES_OK);
    assert_true(now_seconds() - start > 1);
    sync_client_destroy(client);
    code = close_call(f, stalled, false, NULL, NULL, details, sizeof details);
    assert_true(code == GRPC_STATUS_DEADLINE_EXCEEDED || code == GRPC_STATUS_CANCELLED);   // not "busy" itself
    void *state_of_f = f;
    teardown(&state_of_f);
}

// A few hundred peers long-polling at once: the call limit follows --total_peers (the fixed
// 256 refused the 257th waiter "server busy"), waiting costs no more than a blocked thread, and
// every waiter gets the aggregate when the last upload completes the round.
static void test_hundreds_of_waiters(void **state) {
    (void)state;
    enum { P = 300 };
    Fixture *f = start_fixture_cfg(0, 0, (AggregateConfig){.mode = SYNC_MODE_FEDAVG, .num_peers = P, .merge_topk = 4}, NULL);
    typedef struct {
        grpc_call *call;
        grpc_byte_buffer *request, *response;
        grpc_metadata_array initial, trailing;
        grpc_status_code code;
        grpc_slice details;
    } Waiter;
    Waiter *w = calloc(P, sizeof *w);
    for (int p = 0; p < P; p++) {
        WaitAggregateRequest req = WAIT_AGGREGATE_REQUEST__INIT;
        req.peer_id = p;
        req.step = 1;
        req.timeout_ms = 60000;
        w[p].request = wire_pack(&req.base);
        w[p].details = grpc_empty_slice();
        grpc_metadata_array_init(&w[p].initial);
        grpc_metadata_array_init(&w[p].trailing);
        w[p].call = grpc_channel_create_call(f->channel, NULL, GRPC_PROPAGATE_DEFAULTS, f->cq,
                                             grpc_slice_from_static_string("/FederatedServer/WaitAggregate"), NULL,
                                             wire_deadline(90), NULL);
        grpc_op ops[6];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = w[p].request;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &w[p].initial;
        ops[4].op = GRPC_OP_RECV_MESSAGE;
        ops[4].data.recv_message.recv_message = &w[p].response;
        ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[5].data.recv_status_on_client.trailing_metadata = &w[p].trailing;
        ops[5].data.recv_status_on_client.status = &w[p].code;
        ops[5].data.recv_status_on_client.status_details = &w[p].details;
        assert_int_equal(grpc_call_start_batch(w[p].call, ops, 6, &w[p], NULL), GRPC_CALL_OK);
    }
    // Every waiter is in the server before the round fills (none was refused).
    char details[512];
    double start = now_seconds();
    for (;;) {
        StatusRequest sreq = STATUS_REQUEST__INIT;
        StatusResponse *st = NULL;
        assert_int_equal(unary(f, "/FederatedServer/Status", &sreq.base, &status_response__descriptor,
                               (ProtobufCMessage **)&st, details, sizeof details),
                         GRPC_STATUS_OK);
        status_response__free_unpacked(st, NULL);
        grpc_event ev = grpc_completion_queue_pluck(f->cq, &w[0], wire_deadline(0.01), NULL);
        assert_int_equal(ev.type, GRPC_QUEUE_TIMEOUT);   // still waiting, not refused
        if (now_seconds() - start > 1.5) break;
    }
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    for (int p = 0; p < P; p++) {
        uint8_t *bytes;
        size_t len;
        assert_int_equal(sync_test_upload(&spec, SYNC_MODE_FEDAVG, 1, p, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
        grpc_call *call = open_call(f, "/FederatedServer/UploadChunk");
        assert_true(send_bytes(f, call, chunk(p, 1, 0, 1, bytes, len)));
        assert_int_equal(close_call(f, call, true, NULL, NULL, details, sizeof details), GRPC_STATUS_OK);
        free(bytes);
    }
    model_spec_free(&spec);
    for (int p = 0; p < P; p++) {
        grpc_event ev = grpc_completion_queue_pluck(f->cq, &w[p], wire_deadline(60), NULL);
        assert_int_equal(ev.type, GRPC_OP_COMPLETE);
        assert_int_equal(w[p].code, GRPC_STATUS_OK);
        WaitAggregateResponse *resp = (WaitAggregateResponse *)wire_unpack(&wait_aggregate_response__descriptor,
                                                                           w[p].response);
        assert_non_null(resp);
        assert_true(resp->ready);
        wait_aggregate_response__free_unpacked(resp, NULL);
        grpc_byte_buffer_destroy(w[p].request);
        grpc_byte_buffer_destroy(w[p].response);
        grpc_metadata_array_destroy(&w[p].initial);
        grpc_metadata_array_destroy(&w[p].trailing);
        grpc_slice_unref(w[p].details);
        grpc_call_unref(w[p].call);
    }
    free(w);
    void *state_of_f = f;
    teardown(&state_of_f);
}

static void test_protocol_errors_get_statuses(void **state) {
    Fixture *f = *state;
    char details[512];
    uint8_t data[10] = {0};
    // Chunks out of order.
    grpc_call *call = open_call(f, "/FederatedServer/UploadChunk");
    send_bytes(f, call, chunk(0, 1, 0, 3, data, sizeof data));
    send_bytes(f, call, chunk(0, 1, 2, 3, data, sizeof data));
    assert_int_equal(close_call(f, call, true, NULL, NULL, details, sizeof details), GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(details, "chunk 2 arrived where chunk 1 was expected"));
    // A duplicated chunk, and a stream that changes its header half way.
    call = open_call(f, "/FederatedServer/UploadChunk");
    send_bytes(f, call, chunk(0, 1, 0, 3, data, sizeof data));
    send_bytes(f, call, chunk(0, 1, 0, 3, data, sizeof data));
    assert_int_equal(close_call(f, call, true, NULL, NULL, details, sizeof details), GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(details, "chunk 0 arrived where chunk 1 was expected"));
    call = open_call(f, "/FederatedServer/UploadChunk");
    send_bytes(f, call, chunk(0, 1, 0, 3, data, sizeof data));
    send_bytes(f, call, chunk(1, 1, 1, 3, data, sizeof data));
    assert_int_equal(close_call(f, call, true, NULL, NULL, details, sizeof details), GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(details, "began as peer 0 step 1 of 3 chunks"));
    // A stream that ends early.
    call = open_call(f, "/FederatedServer/UploadChunk");
    send_bytes(f, call, chunk(0, 1, 0, 3, data, sizeof data));
    assert_int_equal(close_call(f, call, true, NULL, NULL, details, sizeof details), GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(details, "ended after 1 of 3 chunks"));
    // Bytes that are no protobuf message.
    call = open_call(f, "/FederatedServer/DownloadChunk");
    grpc_slice junk = grpc_slice_from_static_string("\xff\xff\xff\xff\xff");
    send_bytes(f, call, grpc_raw_byte_buffer_create(&junk, 1));
    assert_int_equal(close_call(f, call, true, NULL, NULL, details, sizeof details), GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(details, "malformed DownloadChunkRequest"));
    // A method the server does not have.
    StatusRequest sreq = STATUS_REQUEST__INIT;
    assert_int_equal(unary(f, "/FederatedServer/UploadWeights", &sreq.base, NULL, NULL, details, sizeof details),
                     GRPC_STATUS_UNIMPLEMENTED);
    // Not ready yet: ready = false, no data.
    DownloadChunkRequest dreq = DOWNLOAD_CHUNK_REQUEST__INIT;
    dreq.step = 5;
    DownloadChunkResponse *dresp = NULL;
    assert_int_equal(unary(f, "/FederatedServer/DownloadChunk", &dreq.base, &download_chunk_response__descriptor,
                           (ProtobufCMessage **)&dresp, details, sizeof details),
                     GRPC_STATUS_OK);
    assert_false(dresp->ready);
    assert_int_equal(dresp->chunk_data.len, 0);
    download_chunk_response__free_unpacked(dresp, NULL);
    // The four upload streams refused by the transport above count as refused uploads.
    StatusResponse *st = NULL;
    assert_int_equal(unary(f, "/FederatedServer/Status", &sreq.base, &status_response__descriptor,
                           (ProtobufCMessage **)&st, details, sizeof details),
                     GRPC_STATUS_OK);
    assert_int_equal(st->uploads_rejected, 4);
    status_response__free_unpacked(st, NULL);
}

// A Hello from another run is refused for its settings before its tensor list is built: the
// list here is broken (a name twice), yet the answer is about the peers.
static void test_hello_settings_checked_first(void **state) {
    Fixture *f = *state;
    char details[512];
    TensorInfo infos[2];
    TensorInfo *ptrs[2] = {&infos[0], &infos[1]};
    int64_t shape[1] = {4};
    for (int i = 0; i < 2; i++) {
        tensor_info__init(&infos[i]);
        infos[i].name = "lm_head.weight";
        infos[i].dtype = "F32";
        infos[i].n_shape = 1;
        infos[i].shape = shape;
    }
    HelloRequest req = HELLO_REQUEST__INIT;
    req.peer_id = 0;
    req.num_peers = 3;   // the server runs with 2
    req.experts_per_node = 2;
    req.mode = "spes";
    req.payload_dtype = "F32";
    req.n_tensors = 2;
    req.tensors = ptrs;
    assert_int_equal(unary(f, "/FederatedServer/Hello", &req.base, NULL, NULL, details, sizeof details),
                     GRPC_STATUS_FAILED_PRECONDITION);
    assert_non_null(strstr(details, "--total_peers 2"));
    // Other requests than Hello are small: a 100 KiB Status request is refused unread.
    static uint8_t big[100 << 10];
    StatusRequest sreq = STATUS_REQUEST__INIT;
    (void)sreq;
    grpc_call *call = open_call(f, "/FederatedServer/Status");
    grpc_slice slice = grpc_slice_from_static_buffer(big, sizeof big);
    send_bytes(f, call, grpc_raw_byte_buffer_create(&slice, 1));
    assert_int_equal(close_call(f, call, true, NULL, NULL, details, sizeof details), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "at most 65536 bytes"));
}

// An upload is judged at its first message: a peer id out of range, a bad step (also one
// already aggregated or far ahead, see rounds_upload_start), or a claim beyond the server-wide
// upload budget is answered at once, without waiting for (and buffering) the rest of the stream.
static void test_upload_refused_at_first_message(void **state) {
    Fixture *f = *state;
    char details[512];
    uint8_t data[100] = {0};
    struct {
        int peer, step, total;
        grpc_status_code want;
        const char *says;
    } cases[] = {
        {7, 1, 1000000, GRPC_STATUS_INVALID_ARGUMENT, "peer_id 7 is outside [0, 2)"},
        {0, -3, 1000000, GRPC_STATUS_INVALID_ARGUMENT, "step -3 is negative"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double start = now_seconds();
        grpc_call *call = open_call(f, "/FederatedServer/UploadChunk");
        send_bytes(f, call, chunk(cases[i].peer, cases[i].step, 0, cases[i].total, data, sizeof data));
        // No half-close: the answer must not wait for the stream (the idle timeout is 3 s).
        assert_int_equal(close_call(f, call, false, NULL, NULL, details, sizeof details), cases[i].want);
        assert_non_null(strstr(details, cases[i].says));
        assert_true(now_seconds() - start < 2);
    }
    // Budget (1000 bytes here): a call holds 3 chunks' worth (gRPC's message, its flat copy,
    // the unpacked one). Two calls with 100-byte chunks (600) leave no room for 150-byte ones (450).
    grpc_call *first = open_call(f, "/FederatedServer/UploadChunk");
    assert_true(send_bytes(f, first, chunk(0, 1, 0, 5, data, 100)));
    grpc_call *second = open_call(f, "/FederatedServer/UploadChunk");
    send_bytes(f, second, chunk(1, 1, 0, 5, data, 100));
    send_bytes(f, second, chunk(1, 1, 1, 5, data, 100));   // 300 reserved: fits
    let_server_take();   // their call threads take the reservations
    grpc_call *third = open_call(f, "/FederatedServer/UploadChunk");
    uint8_t wide[150] = {0};
    send_bytes(f, third, chunk(1, 2, 0, 5, wide, sizeof wide));   // needs 450
    assert_int_equal(close_call(f, third, false, NULL, NULL, details, sizeof details), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "server busy"));
    assert_non_null(strstr(details, "1000-byte upload budget"));
    grpc_call_cancel(first, NULL);
    close_call(f, first, false, NULL, NULL, details, sizeof details);
    grpc_call_cancel(second, NULL);
    close_call(f, second, false, NULL, NULL, details, sizeof details);
    // Once those calls are gone their reservations are back.
    double start = now_seconds();
    grpc_status_code code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    while (code == GRPC_STATUS_RESOURCE_EXHAUSTED && now_seconds() - start < 5) {
        third = open_call(f, "/FederatedServer/UploadChunk");
        send_bytes(f, third, chunk(1, 2, 0, 2, wide, sizeof wide));
        send_bytes(f, third, chunk(1, 2, 1, 2, wide, sizeof wide));
        code = close_call(f, third, true, NULL, NULL, details, sizeof details);
    }
    assert_int_equal(code, GRPC_STATUS_INVALID_ARGUMENT);   // taken in full, then not safetensors
}

static void test_downloads_and_long_poll(void **state) {
    Fixture *f = *state;
    char details[512];
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = f->addr;
    cfg.num_peers = 2;
    cfg.experts_per_node = 2;
    SyncClient *peers[2];
    for (int p = 0; p < 2; p++) {
        cfg.peer_id = p;
        assert_int_equal(sync_client_create(&cfg, &peers[p]), SPES_OK);
        assert_int_equal(sync_client_hello(peers[p], &spec), SPES_OK);
    }
    for (int step = 1; step <= 2; step++)
        for (int p = 0; p < 2; p++) {
            uint8_t *bytes;
            size_t len;
            assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, p, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
            assert_int_equal(sync_client_upload_bytes(peers[p], step, bytes, len), SPES_OK);
            free(bytes);
        }
    // Step 2 is ready: WaitAggregate answers at once, with the chunk count of 100-byte chunks.
    WaitAggregateRequest wreq = WAIT_AGGREGATE_REQUEST__INIT;
    wreq.step = 2;
    wreq.timeout_ms = 5000;
    WaitAggregateResponse *wresp = NULL;
    double start = now_seconds();
    assert_int_equal(unary(f, "/FederatedServer/WaitAggregate", &wreq.base, &wait_aggregate_response__descriptor,
                           (ProtobufCMessage **)&wresp, details, sizeof details),
                     GRPC_STATUS_OK);
    assert_true(wresp->ready);
    assert_int_equal(wresp->total_chunks, (wresp->total_bytes + 99) / 100);
    int32_t chunks = wresp->total_chunks;
    wait_aggregate_response__free_unpacked(wresp, NULL);
    assert_true(now_seconds() - start < 2);
    // Step 3 is open: the poll returns not ready after its 300 ms.
    wreq.step = 3;
    wreq.timeout_ms = 300;
    start = now_seconds();
    assert_int_equal(unary(f, "/FederatedServer/WaitAggregate", &wreq.base, &wait_aggregate_response__descriptor,
                           (ProtobufCMessage **)&wresp, details, sizeof details),
                     GRPC_STATUS_OK);
    assert_false(wresp->ready);
    assert_int_equal(wresp->last_completed_step, 2);
    wait_aggregate_response__free_unpacked(wresp, NULL);
    double waited = now_seconds() - start;
    assert_true(waited >= 0.29 && waited < 3);
    // Chunk id past the end; a dropped step (keep_steps 1).
    DownloadChunkRequest dreq = DOWNLOAD_CHUNK_REQUEST__INIT;
    dreq.step = 2;
    dreq.chunk_id = chunks;
    assert_int_equal(unary(f, "/FederatedServer/DownloadChunk", &dreq.base, NULL, NULL, details, sizeof details),
                     GRPC_STATUS_OUT_OF_RANGE);
    dreq.step = 1;
    dreq.chunk_id = 0;
    assert_int_equal(unary(f, "/FederatedServer/DownloadChunk", &dreq.base, NULL, NULL, details, sizeof details),
                     GRPC_STATUS_NOT_FOUND);
    assert_non_null(strstr(details, "no longer kept"));
    // The last chunk is flagged and the client reassembles exactly total_bytes.
    uint8_t *agg;
    size_t len;
    assert_int_equal(sync_client_wait_and_download(peers[0], 2, &agg, &len), SPES_OK);
    SafeTensors st;
    assert_int_equal(safetensors_parse(agg, len, "aggregate", &st), SPES_OK);
    assert_int_equal(st.count, spec.count);
    safetensors_close(&st);
    free(agg);
    assert_int_equal(sync_client_wait_and_download(peers[1], 1, &agg, &len), SPES_ERR);   // dropped step
    assert_int_equal(sync_client_last_status(peers[1]), GRPC_STATUS_NOT_FOUND);
    assert_non_null(strstr(spes_last_error(), "no longer kept"));
    for (int p = 0; p < 2; p++) sync_client_destroy(peers[p]);
    model_spec_free(&spec);
}

// Peers with payload_dtype BF16 hand F32 tensors to sync_client_upload; the client converts,
// the server aggregates into a BF16 safetensors file.
static void test_bf16_payload_round_trip(void **state) {
    Fixture *f = *state;
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = f->addr;
    cfg.num_peers = 2;
    cfg.experts_per_node = 2;
    cfg.payload_dtype = DTYPE_BF16;
    SyncClient *peers[2];
    float *values = malloc(spec.total_numel * sizeof(float));
    for (int p = 0; p < 2; p++) {
        cfg.peer_id = p;
        assert_int_equal(sync_client_create(&cfg, &peers[p]), SPES_OK);
        assert_int_equal(sync_client_hello(peers[p], &spec), SPES_OK);
    }
    for (int p = 0; p < 2; p++) {
        StWriteTensor *w = calloc((size_t)spec.count, sizeof *w);
        int n = 0;
        size_t at = 0;
        for (int t = 0; t < spec.count; t++) {
            const SpecTensor *st = &spec.tensors[t];
            for (size_t i = 0; i < st->numel; i++) values[at + i] = (float)(p + 1) * 0.5f + (float)(i % 4) * 0.25f;
            if (model_spec_peer_sends(&spec, SYNC_MODE_SPES, 2, p, t)) {
                w[n] = (StWriteTensor){.name = st->name, .dtype = DTYPE_F32, .ndim = st->ndim, .data = values + at};
                memcpy(w[n].shape, st->shape, sizeof w[n].shape);
                n++;
            }
            at += st->numel;
        }
        assert_int_equal(sync_client_upload(peers[p], 4, w, n), SPES_OK);
        free(w);
    }
    uint8_t *agg;
    size_t len;
    assert_int_equal(sync_client_wait_and_download(peers[0], 4, &agg, &len), SPES_OK);
    SafeTensors st;
    assert_int_equal(safetensors_parse(agg, len, "aggregate", &st), SPES_OK);
    const StTensor *embed = safetensors_find(&st, "model.embed_tokens.weight");
    const StTensor *expert3 = safetensors_find(&st, "model.layers.1.mlp.experts.3.up_proj.weight");
    assert_int_equal(embed->dtype, DTYPE_BF16);
    for (size_t i = 0; i < embed->numel; i++) {
        uint16_t a, b;
        memcpy(&a, embed->data + 2 * i, 2);
        memcpy(&b, expert3->data + 2 * i, 2);
        assert_float_equal(bf16_to_f32(a), 0.75f + (float)(i % 4) * 0.25f, 0);   // mean of 0.5 and 1.0 (+ i%4/4)
        assert_float_equal(bf16_to_f32(b), 1.0f + (float)(i % 4) * 0.25f, 0);    // owner: peer 1
    }
    assert_int_equal(sync_client_stats(peers[0])->bytes_down, len);
    safetensors_close(&st);
    free(agg);
    free(values);
    for (int p = 0; p < 2; p++) sync_client_destroy(peers[p]);
    model_spec_free(&spec);
}

// Waits (up to 20 s) until this process holds a file open whose path contains `name`, then a
// moment more (what the server does right after opening it). False if none appeared.
static bool wait_for_open_file(const char *name) {
    for (int tries = 0; tries < 2000; tries++) {
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        bool found = false;
        while (d && !found && (e = readdir(d))) {
            char link[300], target[4096];
            snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 0) target[n] = '\0';
            found = n > 0 && strstr(target, name) != NULL;
        }
        if (d) closedir(d);
        if (found) {
            usleep(200 * 1000);
            return true;
        }
        usleep(10 * 1000);
    }
    return false;
}

// A peer retrying its upload while the server still takes its first stream (its side gave up):
// the newer stream is taken, and the older one is cancelled ABORTED ("superseded") when the newer
// one begins, instead of the server taking its bytes to the end and renaming them over the newer.
static void test_older_upload_stream_superseded(void **state) {
    Fixture *f = *state;
    char details[512];
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 0, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
    int total = (int)((len + 99) / 100);
    grpc_call *older = open_call(f, "/FederatedServer/UploadChunk");
    for (int i = 0; i < 3; i++) assert_true(send_bytes(f, older, chunk(0, 4, i, total, bytes + 100 * i, 100)));
    // "Newer" is the server's order of first messages: the older attempt must have begun there
    // (its temp file open in this process) before the newer one is sent (a slow handler, under
    // ASan, began after it and was the newer).
    assert_true(wait_for_open_file("upload_s4_p0.safetensors.part"));
    grpc_call *newer = open_call(f, "/FederatedServer/UploadChunk");
    for (int i = 0; i < total; i++) {
        size_t n = len - 100 * (size_t)i < 100 ? len - 100 * (size_t)i : 100;
        assert_true(send_bytes(f, newer, chunk(0, 4, i, total, bytes + 100 * i, n)));
    }
    assert_int_equal(close_call(f, newer, true, NULL, NULL, details, sizeof details), GRPC_STATUS_OK);
    send_bytes(f, older, chunk(0, 4, 3, total, bytes + 300, 100));   // may fail: the server answers at once
    assert_int_equal(close_call(f, older, true, NULL, NULL, details, sizeof details), GRPC_STATUS_ABORTED);
    assert_non_null(strstr(details, "upload from peer 0 superseded: a newer upload of peer 0 (step 4) began"));
    free(bytes);
    model_spec_free(&spec);
}

// A peer's older upload stream that stalls (its connection half-open, its client gone) while a
// newer attempt of the peer begins: it used to keep its call slot and upload budget until the
// idle timeout (it sends no next chunk to be refused at); it is cancelled ABORTED at once, and
// its budget comes back: with room for two calls, two more uploads fit beside the newer one.
static void test_stalled_older_upload_cancelled_at_once(void **state) {
    (void)state;
    Fixture *f = start_fixture_with(256, 600);   // two calls of 100-byte chunks (3 x 100 each)
    char details[512];
    uint8_t data[100] = {0};
    grpc_call *older = open_call(f, "/FederatedServer/UploadChunk");
    assert_true(send_bytes(f, older, chunk(0, 1, 0, 5, data, sizeof data)));
    assert_true(wait_for_open_file("upload_s1_p0.safetensors.part"));   // the older attempt begun first
    grpc_call *newer = open_call(f, "/FederatedServer/UploadChunk");
    double start = now_seconds();
    assert_true(send_bytes(f, newer, chunk(0, 1, 0, 5, data, sizeof data)));
    assert_int_equal(close_call(f, older, false, NULL, NULL, details, sizeof details), GRPC_STATUS_ABORTED);
    assert_true(now_seconds() - start < 2);   // at once, not at the 3 s idle timeout
    assert_non_null(strstr(details, "upload from peer 0 superseded: a newer upload of peer 0 (step 1) began"));
    // The older call's budget came back (once its thread has run): peer 1's upload fits beside
    // the newer one. Its second message is a wrong chunk, to hear at once that it was taken.
    grpc_status_code code;
    do {
        grpc_call *other = open_call(f, "/FederatedServer/UploadChunk");
        send_bytes(f, other, chunk(1, 1, 0, 5, data, sizeof data));   // may fail: refused "busy" at once
        send_bytes(f, other, chunk(1, 1, 2, 5, data, sizeof data));
        code = close_call(f, other, true, NULL, NULL, details, sizeof details);
    } while (code == GRPC_STATUS_RESOURCE_EXHAUSTED && now_seconds() - start < 2);
    assert_int_equal(code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(details, "chunk 2 arrived where chunk 1 was expected"));
    assert_true(now_seconds() - start < 2);
    grpc_call_cancel(newer, NULL);
    close_call(f, newer, false, NULL, NULL, details, sizeof details);
    void *state_of_f = f;
    teardown(&state_of_f);
}

// A per-peer token's holder stalling calls (opened, no request sent) held a call slot each until
// the idle timeout, so one token could take all of them; beyond SYNC_MAX_CALLS_PER_PEER its calls
// are refused "server busy" at once, while another peer's calls are still served.
static void test_calls_per_peer_token_capped(void **state) {
    (void)state;
    char tokens[] = "/tmp/spes-test-peer-tokens-XXXXXX";
    int fd = mkstemp(tokens);
    assert_true(fd >= 0);
    const char lines[] = "0 token-of-peer-0\n1 token-of-peer-1\n";
    assert_int_equal(write(fd, lines, sizeof lines - 1), (ssize_t)(sizeof lines - 1));
    close(fd);
    Fixture *f = start_fixture_cfg(64, 0,
                                   (AggregateConfig){.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2,
                                                     .merge_topk = 4},
                                   tokens);
    f->token = "token-of-peer-0";
    grpc_call *stalled[SYNC_MAX_CALLS_PER_PEER];
    for (int i = 0; i < SYNC_MAX_CALLS_PER_PEER; i++) stalled[i] = open_call(f, "/FederatedServer/Status");
    StatusRequest sreq = STATUS_REQUEST__INIT;
    char details[512];
    grpc_status_code code = GRPC_STATUS_OK;   // the stalled calls count once the server took them
    double start = now_seconds();
    while (code == GRPC_STATUS_OK && now_seconds() - start < 2.5)
        code = unary(f, "/FederatedServer/Status", &sreq.base, NULL, NULL, details, sizeof details);
    assert_int_equal(code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "server busy: peer 0 (by its token) has 16 calls in progress"));
    f->token = "token-of-peer-1";
    assert_int_equal(unary(f, "/FederatedServer/Status", &sreq.base, NULL, NULL, details, sizeof details),
                     GRPC_STATUS_OK);
    for (int i = 0; i < SYNC_MAX_CALLS_PER_PEER; i++) {
        grpc_call_cancel(stalled[i], NULL);
        close_call(f, stalled[i], false, NULL, NULL, details, sizeof details);
    }
    f->token = "token-of-peer-0";   // its calls back: served again
    start = now_seconds();
    do code = unary(f, "/FederatedServer/Status", &sreq.base, NULL, NULL, details, sizeof details);
    while (code == GRPC_STATUS_RESOURCE_EXHAUSTED && now_seconds() - start < 2.5);
    assert_int_equal(code, GRPC_STATUS_OK);
    void *state_of_f = f;
    teardown(&state_of_f);
    unlink(tokens);
}

// Every round slot taken (4 open rounds, steps 1-4, waiting for peer 1): an upload for a later
// step is refused RESOURCE_EXHAUSTED at its first message, before the peer sends the rest; the
// server used to read the whole upload, validate and fsync it, and only then find no slot.
static void test_no_round_slot_refused_at_first_message(void **state) {
    Fixture *f = *state;
    char details[512];
    ModelSpec spec;
    assert_int_equal(sync_test_spec(&spec, 4, 6), SPES_OK);
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = f->addr;
    cfg.num_peers = 2;
    cfg.experts_per_node = 2;
    SyncClient *peer;
    assert_int_equal(sync_client_create(&cfg, &peer), SPES_OK);
    assert_int_equal(sync_client_hello(peer, &spec), SPES_OK);
    uint8_t *bytes;
    size_t len;
    assert_int_equal(sync_test_upload(&spec, SYNC_MODE_SPES, 2, 0, DTYPE_F32, NULL, &bytes, &len), SPES_OK);
    for (int step = 1; step <= 4; step++) assert_int_equal(sync_client_upload_bytes(peer, step, bytes, len), SPES_OK);
    grpc_call *call = open_call(f, "/FederatedServer/UploadChunk");
    int total = (int)((len + 99) / 100);
    double start = now_seconds();
    assert_true(send_bytes(f, call, chunk(0, 5, 0, total, bytes, 100)));   // the first of its chunks only
    assert_int_equal(close_call(f, call, false, NULL, NULL, details, sizeof details), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_true(now_seconds() - start < 2);   // answered at once, not at the 3 s idle timeout
    assert_non_null(strstr(details, "upload from peer 0 for step 5: 4 rounds are already open"));
    // A lower step still takes the highest round's slot (it gives way).
    assert_int_equal(sync_client_upload_bytes(peer, 0, bytes, len), SPES_OK);
    free(bytes);
    sync_client_destroy(peer);
    model_spec_free(&spec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stalled_upload_blocks_nobody, setup, teardown),
        cmocka_unit_test(test_call_limit),
        cmocka_unit_test(test_hundreds_of_waiters),
        cmocka_unit_test_setup_teardown(test_port_is_exclusive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_protocol_errors_get_statuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_settings_checked_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upload_refused_at_first_message, setup_small_budget, teardown),
        cmocka_unit_test_setup_teardown(test_downloads_and_long_poll, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bf16_payload_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_older_upload_stream_superseded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_round_slot_refused_at_first_message, setup, teardown),
        cmocka_unit_test(test_stalled_older_upload_cancelled_at_once),
        cmocka_unit_test(test_calls_per_peer_token_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
