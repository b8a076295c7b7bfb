// gRPC plumbing shared by server and client (see wire.h).
#include "sync/wire.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <stdlib.h>

#include "base/alloc.h"

gpr_timespec wire_deadline(double seconds_from_now) {
    if (seconds_from_now <= 0 || seconds_from_now > 1e8) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(seconds_from_now * 1e6), GPR_TIMESPAN));
}

grpc_byte_buffer *wire_pack(const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = spes_malloc(len ? len : 1);
    if (!buf) return NULL;
    protobuf_c_message_pack(msg, buf);
    grpc_slice slice = grpc_slice_new(buf, len, free);   // the slice owns buf: no copy
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb)) return NULL;
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    return msg;
}

// Reads a varint at data[*at..len); false when it runs past the end or beyond 10 bytes.
static bool read_varint(const uint8_t *data, size_t len, size_t *at, uint64_t *value) {
    *value = 0;
    for (int shift = 0; shift < 70 && *at < len; shift += 7) {
        uint8_t b = data[(*at)++];
        *value |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

bool wire_count_field(const uint8_t *data, size_t len, uint32_t field, size_t *count) {
    *count = 0;
    size_t at = 0;
    while (at < len) {
        uint64_t tag, n;
        if (!read_varint(data, len, &at, &tag)) return false;
        size_t skip;
        switch (tag & 7) {
        case 0:   // varint
            if (!read_varint(data, len, &at, &n)) return false;
            skip = 0;
            break;
        case 1: skip = 8; break;   // fixed64
        case 2:                    // length-delimited
            if (!read_varint(data, len, &at, &n) || n > len) return false;
            skip = (size_t)n;
            break;
        case 5: skip = 4; break;   // fixed32
        default: return false;     // groups (proto2 only) and invalid wire types
        }
        if (skip > len - at) return false;
        at += skip;
        if (tag >> 3 == field) (*count)++;
    }
    return true;
}

void wire_channel_args(size_t max_message_size, grpc_arg *args, grpc_channel_args *out) {
    int limit = max_message_size > (size_t)0x7fffffff ? 0x7fffffff : (int)max_message_size;
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = limit;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = limit;
    out->num_args = 2;
    out->args = args;
}

bool wire_run_batch(grpc_call *call, grpc_completion_queue *cq, const grpc_op *ops, size_t n, double timeout_s) {
    int tag;   // any unique address: each batch is plucked before the next starts
    if (grpc_call_start_batch(call, ops, n, &tag, NULL) != GRPC_CALL_OK) return false;
    grpc_event ev = grpc_completion_queue_pluck(cq, &tag, wire_deadline(timeout_s), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        // The peer went quiet: cancel, after which the batch completes (unsuccessfully).
        grpc_call_cancel_with_status(call, GRPC_STATUS_DEADLINE_EXCEEDED, "no progress within the idle timeout", NULL);
        ev = grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        return false;
    }
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

const char *wire_status_name(grpc_status_code code) {
    static const char *names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                  "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                  "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                  "UNAUTHENTICATED"};
    return code >= 0 && code <= GRPC_STATUS_UNAUTHENTICATED ? names[code] : "UNKNOWN";
}

void wire_metrics_to_proto(const PeerMetricPoint *pt, PeerMetrics *out) {
    peer_metrics__init(out);
    out->step = pt->step;
    out->loss = pt->loss;
    out->ce = pt->ce;
    out->lb = pt->lb;
    out->tokens_per_s = pt->tokens_per_s;
    out->mfu = pt->mfu;
    out->device_mem_mb = pt->device_mem_mb;
    out->route_min = pt->route_min;
    out->route_max = pt->route_max;
}

PeerMetricPoint wire_metrics_from_proto(const PeerMetrics *m) {
    return (PeerMetricPoint){.step = m->step, .loss = m->loss, .ce = m->ce, .lb = m->lb, .tokens_per_s = m->tokens_per_s,
                             .mfu = m->mfu, .device_mem_mb = m->device_mem_mb, .route_min = m->route_min,
                             .route_max = m->route_max};
}
