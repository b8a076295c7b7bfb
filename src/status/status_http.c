#include "status/status_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/printable.h"
#include "base/timer.h"
#include "status/status_json.h"
#include "status/status_page.h"
#include "sync/auth.h"

// One open connection, for the slowloris defence (guard_new_connection). pending_since: when it
// began waiting for a complete request (accepted, or its previous request answered); 0 while a
// request is being answered or once it was shut down.
typedef struct {
    bool used;
    int fd;
    struct sockaddr_storage peer;
    double pending_since;
} Conn;

struct StatusHttp {
    struct MHD_Daemon *daemon;
    Conn *conns;                // [conn_cap], touched only by libmicrohttpd's one thread
    unsigned conn_cap;          // libmicrohttpd's connection limit: max_connections + STATUS_HTTP_SPARE_CONNECTIONS
    unsigned max_pending;       // max_connections
    StatusFill fill;
    void *ctx;
    char **tokens;              // [n_tokens] each one lets a request in; none: open
    int n_tokens;
    int port;
    // libmicrohttpd's messages (mhd_log), touched only by its one thread once it runs.
    double log_window_start;    // now_seconds() when the current minute began
    int log_lines;              // lines logged in it
};

// A client sending malformed requests in a loop must not flood the server's log.
#define STATUS_HTTP_LOG_LINES_PER_MINUTE 20

// No scripts, nothing from elsewhere: the page is self-contained (inline style and SVG).
#define SECURITY_POLICY "default-src 'none'; style-src 'unsafe-inline'"

static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

// Ends a connection that holds a slot without finishing its request: the socket is shut down
// here and libmicrohttpd closes it at its next look (it sees the end of the stream).
static void evict(Conn *x) {
    shutdown(x->fd, SHUT_RDWR);
    x->pending_since = 0;
}

// The oldest connection waiting for a request (of host, when not NULL), or NULL.
static Conn *oldest_pending(StatusHttp *h, const struct sockaddr_storage *host, unsigned *count) {
    Conn *oldest = NULL;
    *count = 0;
    for (unsigned i = 0; i < h->conn_cap; i++) {
        Conn *x = &h->conns[i];
        if (!x->used || x->pending_since <= 0 || (host && !same_host(&x->peer, host))) continue;
        ++*count;
        if (!oldest || x->pending_since < oldest->pending_since) oldest = x;
    }
    return oldest;
}

// A slowloris (connections that trickle header lines, never idle for the timeout, never done)
// must not lock out a client that sends its request at once (issue 29). Each new connection
// first ends the waiting ones past STATUS_HTTP_REQUEST_DEADLINE_S, then its host's oldest waiting
// one beyond STATUS_HTTP_PER_HOST_PENDING, then the oldest waiting one beyond max_connections:
// a newcomer always gets a slot, and a request sent at once is answered long before it could be
// the oldest. Everything runs on libmicrohttpd's one thread, so no socket is shut down after
// libmicrohttpd closed it.
static void guard_new_connection(StatusHttp *h, const Conn *fresh) {
    double now = now_seconds();
    for (unsigned i = 0; i < h->conn_cap; i++) {
        Conn *x = &h->conns[i];
        if (x->used && x != fresh && x->pending_since > 0 && now - x->pending_since > STATUS_HTTP_REQUEST_DEADLINE_S)
            evict(x);
    }
    unsigned count;
    Conn *oldest = oldest_pending(h, &fresh->peer, &count);
    if (count > STATUS_HTTP_PER_HOST_PENDING && oldest) evict(oldest);
    oldest = oldest_pending(h, NULL, &count);
    if (count > h->max_pending && oldest) evict(oldest);
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
    StatusHttp *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        Conn *x = *socket_context;
        if (x) memset(x, 0, sizeof *x);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *addr = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    Conn *x = NULL;
    for (unsigned i = 0; i < h->conn_cap && !x; i++)
        if (!h->conns[i].used) x = &h->conns[i];
    *socket_context = x;
    if (!x || !fd) return;   // never: libmicrohttpd's limit is conn_cap
    *x = (Conn){.used = true, .fd = fd->connect_fd, .pending_since = now_seconds()};
    if (addr && addr->client_addr) {
        socklen_t len = addr->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        memcpy(&x->peer, addr->client_addr, len);
    }
    guard_new_connection(h, x);
}

// The connection's slot (notify_connection), or NULL.
static Conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

// A request was answered: its connection waits for the next one (keep-alive) from now.
static void request_completed(void *cls, struct MHD_Connection *c, void **request_state,
                              enum MHD_RequestTerminationCode toe) {
    Conn *x = conn_of(c);
    if (x && x->used) x->pending_since = now_seconds();
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy", SECURITY_POLICY);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (code == MHD_HTTP_UNAUTHORIZED) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"spes status\"");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");   // no slot kept for a caller without the token
    }
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *message) {
    char *body = spes_strdup(message);
    return body ? send_text(c, code, "text/plain; charset=utf-8", body, strlen(body)) : MHD_NO;
}

// Whether value[len] (NULs included: "T%00junk" is not "T") is one of the tokens; every token
// is compared, in constant time, whichever matches. *which: the one that matched.
static bool known_token(const StatusHttp *h, const char *value, size_t len, const char **which) {
    bool found = false;
    for (int i = 0; i < h->n_tokens; i++)
        if (auth_equal(value, len, h->tokens[i], strlen(h->tokens[i])) && !found) {
            found = true;
            *which = h->tokens[i];
        }
    return found;
}

// *query_token: the token when it came as ?token= (the page then keeps it on its link), else NULL.
static bool authorised(const StatusHttp *h, struct MHD_Connection *c, const char **query_token) {
    *query_token = NULL;
    if (h->n_tokens == 0)
        return true;
    const char *value, *which = NULL;
    size_t len;
    if (MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, "token", 5, &value, &len) == MHD_YES && value &&
        known_token(h, value, len, &which)) {
        *query_token = which;
        return true;
    }
    static const char bearer[] = "Bearer ";
    size_t skip = sizeof bearer - 1;
    return MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION,
                                         strlen(MHD_HTTP_HEADER_AUTHORIZATION), &value, &len) == MHD_YES &&
           value && len >= skip && strncasecmp(value, bearer, skip) == 0 &&   // the scheme is case-insensitive
           known_token(h, value + skip, len - skip, &which);
}

// The whole URL of each request, path and query, as libmicrohttpd received it (before it splits
// off the query): what it returns becomes the request's *request_state, one of these two marks.
// ?NAME=N of /status.json (status_json.h): *out -1 when absent; false when it is not a whole
// number in [0, limit].
static bool query_count(struct MHD_Connection *c, const char *name, int limit, int *out) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    *out = -1;
    if (!v) return true;
    long n = 0;
    if (!*v || strlen(v) > 6) return false;
    for (const char *d = v; *d; d++) {
        if (*d < '0' || *d > '9') return false;
        n = n * 10 + (*d - '0');
    }
    if (n > limit) return false;
    *out = (int)n;
    return true;
}

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static char url_within_limit, url_too_long, url_with_nul;
static void *check_url(void *cls, const char *uri, struct MHD_Connection *c) {
    if (strlen(uri) > STATUS_HTTP_URL_BYTES) return &url_too_long;
    // A %00 would end the decoded path or value early ("/status.json%00junk" read as
    // "/status.json"): no request of ours carries a NUL, so it is refused whole.
    for (const char *p = strchr(uri, '%'); p; p = strchr(p + 1, '%'))
        if (p[1] == '0' && p[2] == '0') return &url_with_nul;
    return &url_within_limit;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size,
                              void **request_state) {
    StatusHttp *h = cls;
    Conn *conn = conn_of(c);
    if (conn && conn->used) conn->pending_since = 0;   // its request is complete: not a slowloris
    bool head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!head && strcmp(method, MHD_HTTP_METHOD_GET) != 0)
        return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    if (*request_state == &url_too_long)
        return send_error(c, MHD_HTTP_URI_TOO_LONG, "URL too long\n");
    if (*request_state == &url_with_nul)
        return send_error(c, MHD_HTTP_BAD_REQUEST, "a NUL byte (%00) in the URL\n");
    if (*upload_data_size != 0)
        return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "no request body accepted\n");
    // A body announced by length, or chunked (Transfer-Encoding, no length): refused either way.
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if ((length && strcmp(length, "0") != 0) ||
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))
        return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "no request body accepted\n");
    bool page = strcmp(url, "/") == 0, json = strcmp(url, "/status.json") == 0;
    if (!page && !json)
        return send_error(c, MHD_HTTP_NOT_FOUND, "not found: the status server has / and /status.json\n");
    const char *query_token;
    if (!authorised(h, c, &query_token))
        return send_error(c, MHD_HTTP_UNAUTHORIZED, "a token is needed: Authorization: Bearer <token> or ?token=\n");

    StatusJsonLimits limits = STATUS_JSON_ALL;
    if (json && (!query_count(c, "points", RUN_STATUS_POINTS, &limits.points) ||
                 !query_count(c, "rounds", RUN_STATUS_ROUNDS, &limits.rounds)))
        return send_error(c, MHD_HTTP_BAD_REQUEST,
                          "points and rounds must be whole numbers, at most " STRINGIFY(RUN_STATUS_POINTS) " and " STRINGIFY(
                              RUN_STATUS_ROUNDS) "\n");
    RunStatus status;
    if (h->fill(h->ctx, &status) != SPES_OK) {
        log_warn("status: %s", spes_last_error());
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "status unavailable\n");
    }
    size_t len = 0;
    char *body = json ? status_json_render(&status, limits, &len)
                      : status_page_render(&status, query_token, &len);
    run_status_free(&status);
    if (!body)
        return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    // HEAD: libmicrohttpd sends the headers (with the body's length) and leaves the body out.
    return send_text(c, MHD_HTTP_OK, json ? "application/json" : "text/html; charset=utf-8", body, len);
}

// libmicrohttpd's messages (bind failures, refused connections) go to the server's log.
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    StatusHttp *h = cls;
    double now = now_seconds();
    if (now - h->log_window_start >= 60) {
        h->log_window_start = now;
        h->log_lines = 0;
    }
    if (++h->log_lines > STATUS_HTTP_LOG_LINES_PER_MINUTE) {
        if (h->log_lines == STATUS_HTTP_LOG_LINES_PER_MINUTE + 1)
            log_warn("status http: more than %d messages this minute; the rest of the minute's are dropped",
                     STATUS_HTTP_LOG_LINES_PER_MINUTE);
        return;
    }
    char text[512], shown[1024];
    vsnprintf(text, sizeof text, fmt, ap);
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = '\0';
    log_warn("status http: %s", escape_printable(text, n, shown, sizeof shown));   // may quote a client's bytes
}

int status_http_start(const StatusHttpConfig *cfg, StatusFill fill, void *ctx, StatusHttp **out) {
    *out = NULL;
    const char *addr = cfg->bind_addr ? cfg->bind_addr : "127.0.0.1";
    for (int i = -1; i < cfg->n_tokens; i++)
        if (i < 0 ? cfg->token && !*cfg->token : !cfg->tokens[i] || !*cfg->tokens[i])   // "?token=" would let anyone in
            return spes_fail("status http: a token is empty (leave it out to serve without one)");
    if (cfg->port < 0 || cfg->port > 65535)
        return spes_fail("status http: port %d is not in 0..65535", cfg->port);
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&sa;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, addr, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)cfg->port);
    } else if (inet_pton(AF_INET6, addr, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)cfg->port);
        flags |= MHD_USE_IPv6;
    } else {
        return spes_fail("status http: bind address '%s' is not a numeric IPv4 or IPv6 address", addr);
    }
    StatusHttp *h = spes_calloc(1, sizeof *h);
    if (!h)
        return SPES_ERR;
    h->fill = fill;
    h->ctx = ctx;
    h->log_window_start = now_seconds();
    h->tokens = spes_calloc((size_t)cfg->n_tokens + 2, sizeof *h->tokens);
    if (!h->tokens) {
        free(h);
        return SPES_ERR;
    }
    for (int i = -1; i < cfg->n_tokens; i++) {
        const char *t = i < 0 ? cfg->token : cfg->tokens[i];
        if (t && !(h->tokens[h->n_tokens++] = spes_strdup(t))) {
            status_http_stop(h);
            return SPES_ERR;
        }
    }
    unsigned connections = cfg->max_connections ? cfg->max_connections : STATUS_HTTP_DEFAULT_CONNECTIONS;
    unsigned timeout = cfg->timeout_s ? cfg->timeout_s : STATUS_HTTP_DEFAULT_TIMEOUT_S;
    h->max_pending = connections;
    h->conn_cap = connections + STATUS_HTTP_SPARE_CONNECTIONS;
    if (!(h->conns = spes_calloc(h->conn_cap, sizeof *h->conns))) {
        status_http_stop(h);
        return SPES_ERR;
    }
    h->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER,
                                 mhd_log, h, MHD_OPTION_URI_LOG_CALLBACK, check_url, NULL,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                 MHD_OPTION_NOTIFY_CONNECTION, notify_connection, h, MHD_OPTION_NOTIFY_COMPLETED,
                                 request_completed, h, MHD_OPTION_CONNECTION_LIMIT, h->conn_cap,
                                 MHD_OPTION_CONNECTION_TIMEOUT, timeout,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)STATUS_HTTP_REQUEST_BYTES, MHD_OPTION_END);
    if (!h->daemon) {
        status_http_stop(h);
        return spes_fail("status http: cannot listen on %s port %d (in use, or not an address of this machine?)", addr,
                         cfg->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : cfg->port;
    *out = h;
    return SPES_OK;
}

int status_http_port(const StatusHttp *h) { return h->port; }

void status_http_stop(StatusHttp *h) {
    if (!h)
        return;
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    free(h->conns);
    for (int i = 0; i < h->n_tokens; i++) free(h->tokens[i]);
    free(h->tokens);
    free(h);
}
