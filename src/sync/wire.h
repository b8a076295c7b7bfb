// What the gRPC server and client share: protobuf-c messages <-> grpc_byte_buffer, deadlines,
// channel arguments, and running one batch of operations on a call's own completion queue.
#pragma once
#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>

#include "federated.pb-c.h"
#include "status/run_status.h"

// Default payload bytes per chunk: just under 4 MiB, so that a whole message (payload plus a
// few bytes of framing) fits gRPC's default 4 MiB limit on clients that never raise it.
#define SYNC_DEFAULT_CHUNK_SIZE ((size_t)4 * 1024 * 1024 - 4096)
#define SYNC_DEFAULT_MAX_MESSAGE ((size_t)64 * 1024 * 1024)

gpr_timespec wire_deadline(double seconds_from_now);   // <= 0 or huge: infinite
// Packs msg into a new byte buffer (NULL when out of memory).
grpc_byte_buffer *wire_pack(const ProtobufCMessage *msg);
// Unpacks a byte buffer (NULL when it is not a valid message of that type).
ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb);
// Counts the entries of top-level field `field` in a serialized message by reading its tags only:
// what unpacking a repeated field would allocate, known before it is. False when the bytes are
// not a well-formed message (a truncated field, a group, an over-long varint).
bool wire_count_field(const uint8_t *data, size_t len, uint32_t field, size_t *count);
// Channel args for a message-size limit; args[] must have room for 2.
void wire_channel_args(size_t max_message_size, grpc_arg *args, grpc_channel_args *out);
// Starts ops on call and waits (on the call's pluck queue) until they complete or timeout_s
// passes; on timeout the call is cancelled. Returns whether the batch succeeded.
bool wire_run_batch(grpc_call *call, grpc_completion_queue *cq, const grpc_op *ops, size_t n, double timeout_s);
// gRPC's name of a status code, e.g. "INVALID_ARGUMENT".
const char *wire_status_name(grpc_status_code code);
// A reported training step between its wire form (proto PeerMetrics) and the server's.
void wire_metrics_to_proto(const PeerMetricPoint *pt, PeerMetrics *out);   // initialises *out
PeerMetricPoint wire_metrics_from_proto(const PeerMetrics *m);
