// A gRPC call's outcome as the transport sends it: a status code plus the message left with
// spes_fail. Used by the server (its answers, rounds.h results mapped in server.c), the client
// (what it reports) and auth.
#pragma once
#include <grpc/status.h>

// Sets the error message (printf-style, like spes_fail) and returns code: the transport
// sends both to the peer as the call's status.
grpc_status_code status_fail(grpc_status_code code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
