// The status server behind `spes server --status_port`: HTTP over libmicrohttpd (one internal
// polling thread), serving
//   GET /             the page (status_page.h)
//   GET /status.json  the document (status_json.h)
// HEAD is answered like GET without the body; any other method 405, any other path 404, a
// request body 413, a URL (path and query) longer than STATUS_HTTP_URL_BYTES 414, a request line
// or headers larger than STATUS_HTTP_REQUEST_BYTES 414/431 (libmicrohttpd's own answer, before
// the URL is looked at), a connection idle for timeout_s closed. Slowloris (connections that
// trickle header lines, never idle, never done): a connection that has not sent a complete request
// within STATUS_HTTP_REQUEST_DEADLINE_S of opening (or of its previous answer) is closed at the
// next new connection, and a new connection ends the oldest waiting one of its host beyond
// STATUS_HTTP_PER_HOST_PENDING, and the oldest waiting one overall beyond max_connections (a
// newcomer always gets a slot; max_connections + STATUS_HTTP_SPARE_CONNECTIONS sockets at most).
// Every request asks fill() for a fresh
// snapshot (the server fills it under its own lock) and frees it after rendering.
//
// With a token (or several) every request needs one, as `Authorization: Bearer <token>` (curl,
// scripts) or as the query parameter `?token=<token>` (a browser: the page's links and its reload
// keep it); without it: 401 and the connection closed. Compared in constant time, whole (a %00 in
// the URL is refused 400: it would cut a decoded value short).
#pragma once
#include <stdbool.h>

#include "status/run_status.h"

#define STATUS_HTTP_URL_BYTES 4096
#define STATUS_HTTP_REQUEST_BYTES (16 * 1024)
#define STATUS_HTTP_DEFAULT_CONNECTIONS 64
#define STATUS_HTTP_DEFAULT_TIMEOUT_S 10
#define STATUS_HTTP_REQUEST_DEADLINE_S 5.0
#define STATUS_HTTP_PER_HOST_PENDING 16
#define STATUS_HTTP_SPARE_CONNECTIONS 16

typedef struct {
    int port;                   // 0: any free port (status_http_port says which)
    const char *bind_addr;      // numeric IPv4 or IPv6 address; NULL: 127.0.0.1
    const char *token;          // NULL: no token needed; "" is refused
    const char *const *tokens;  // [n_tokens] more tokens, each accepted as token is (the parameter
    int n_tokens;               // server's per-peer tokens); none and no token: open
    unsigned max_connections;   // 0: STATUS_HTTP_DEFAULT_CONNECTIONS
    unsigned timeout_s;         // 0: STATUS_HTTP_DEFAULT_TIMEOUT_S
} StatusHttpConfig;

// Allocates *out (run_status_alloc) and fills it; SPES_ERR (nothing to free) on failure.
typedef int (*StatusFill)(void *ctx, RunStatus *out);

typedef struct StatusHttp StatusHttp;

// Listens and serves on its own thread until status_http_stop. Errors (address in use, bad
// address) name the address and port.
int status_http_start(const StatusHttpConfig *cfg, StatusFill fill, void *ctx, StatusHttp **out);
int status_http_port(const StatusHttp *h);
// Stops serving (open connections are closed) and frees h; NULL is fine.
void status_http_stop(StatusHttp *h);
