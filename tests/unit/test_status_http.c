// status_http.h: the status server on an ephemeral port, serving the fixture run
// (tests/unit/status_fixture.h): GET and HEAD of / and /status.json, 404, 405, request bodies,
// URLs over the limit, garbage, 200 connections at once, a half-sent request closed by the
// timeout, the token (header and query, and where it shows up on the page), a failing fill, the
// default 127.0.0.1 binding (other addresses refuse), 0.0.0.0 and IPv6 ::1, bad configurations;
// after every hostile request it still serves.
//
// Run as `test_status_http serve [--token_file F] [--max_connections N] [--timeout_s S]` it
// serves the fixture until SIGTERM or SIGINT, printing "listening on 127.0.0.1:PORT" first: the
// integration tests (tests/integration/status_*.sh) drive it with curl, Python and Chromium.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "status/status_http.h"
#include "status_fixture.h"
#include "sync/auth.h"

// ---- the server ----

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

// Sends raw bytes, reads the answer until the server closes (Connection: close) or 10 s pass.
// Returns the status code (0: no answer) and the answer in *reply (caller frees).
static int exchange(int port, const char *raw, size_t len, char **reply) {
    int fd = connect_to(port);
    for (size_t sent = 0; sent < len;) {
        ssize_t n = send(fd, raw + sent, len - sent, MSG_NOSIGNAL);
        if (n <= 0)
            break;   // the server may refuse before reading everything
        sent += (size_t)n;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (got + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t n = recv(fd, buf + got, cap - got - 1, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    close(fd);
    int code = 0;
    sscanf(buf, "HTTP/1.%*d %d", &code);
    if (reply)
        *reply = buf;
    else
        free(buf);
    return code;
}

static int get(int port, const char *path, const char *extra_headers, char **reply) {
    char *req;
    int len = asprintf(&req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", path,
                       extra_headers ? extra_headers : "");
    assert_true(len > 0);
    int code = exchange(port, req, (size_t)len, reply);
    free(req);
    return code;
}

static const char *body_of(const char *reply) {
    const char *b = strstr(reply, "\r\n\r\n");
    return b ? b + 4 : "";
}

static StatusHttp *start(const char *token, unsigned timeout_s) {
    StatusHttpConfig cfg = {.port = 0, .token = token, .timeout_s = timeout_s, .max_connections = 256};
    StatusHttp *h = NULL;
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_OK);
    assert_true(status_http_port(h) > 0);
    return h;
}

static void test_http_serves(void **state) {
    (void)state;
    StatusHttp *h = start(NULL, 0);
    int port = status_http_port(h);
    char *reply;
    assert_int_equal(get(port, "/status.json", NULL, &reply), 200);
    assert_non_null(strstr(reply, "Content-Type: application/json"));
    json_t *doc = json_loads(body_of(reply), 0, NULL);
    assert_non_null(doc);
    assert_int_equal(json_array_size(json_object_get(doc, "peers")), 4);
    json_decref(doc);
    free(reply);
    assert_int_equal(get(port, "/", NULL, &reply), 200);
    assert_non_null(strstr(reply, "text/html"));
    assert_non_null(strstr(reply, "Content-Security-Policy: default-src 'none'"));
    assert_non_null(strstr(body_of(reply), "<table id=\"peers\">"));
    free(reply);
    const char head[] = "HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_int_equal(exchange(port, head, sizeof head - 1, &reply), 200);
    assert_string_equal(body_of(reply), "");
    free(reply);
    assert_int_equal(get(port, "/nothing", NULL, NULL), 404);
    assert_int_equal(get(port, "/../etc/passwd", NULL, NULL), 404);
    // ?points=N&rounds=M trim the document; anything but a whole number in range is a 400
    assert_int_equal(get(port, "/status.json?points=1&rounds=0", NULL, &reply), 200);
    doc = json_loads(body_of(reply), 0, NULL);
    assert_non_null(doc);
    json_t *peers = json_object_get(doc, "peers");
    size_t with_points = 0;
    for (size_t p = 0; p < json_array_size(peers); p++) {
        size_t n = json_array_size(json_object_get(json_array_get(peers, p), "points"));
        assert_true(n <= 1);
        with_points += n;
    }
    assert_true(with_points > 0);
    assert_int_equal(json_array_size(json_object_get(doc, "rounds")), 0);
    json_decref(doc);
    free(reply);
    const char *bad[] = {"?points=abc", "?points=-1", "?points=513", "?rounds=257", "?points=", "?rounds=1e3",
                         "?points=99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "/status.json%s", bad[i]);
        assert_int_equal(get(port, path, NULL, &reply), 400);
        assert_non_null(strstr(body_of(reply), "points and rounds must be whole numbers"));
        free(reply);
    }
    assert_int_equal(get(port, "/?points=abc", NULL, NULL), 200);   // the page has no such limits
    status_http_stop(h);
}

static void test_http_hostile(void **state) {
    (void)state;
    StatusHttp *h = start(NULL, 1);
    int port = status_http_port(h);
    char *reply;
    // Other methods, and bodies.
    const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH", "XYZZY"};
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        char req[256];
        snprintf(req, sizeof req, "%s / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", methods[i]);
        int code = exchange(port, req, strlen(req), NULL);
        assert_true(code == 405 || code == 400);
    }
    const char post[] = "POST /status.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello";
    assert_int_equal(exchange(port, post, sizeof post - 1, NULL), 405);
    const char get_body[] = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello";
    assert_int_equal(exchange(port, get_body, sizeof get_body - 1, NULL), 413);
    const char chunked[] = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "5\r\nhello\r\n0\r\n\r\n";
    assert_int_equal(exchange(port, chunked, sizeof chunked - 1, NULL), 413);
    // A URL over STATUS_HTTP_URL_BYTES (8 KiB, on a path that exists): 414; one far beyond the
    // request limit: refused by libmicrohttpd (or the connection closed) before it reaches us.
    size_t sizes[2] = {8 * 1024 + 1, 64 * 1024};
    for (int i = 0; i < 2; i++) {
        char *long_url = malloc(sizes[i] + 1);
        memcpy(long_url, "/status.json?x=", 15);
        memset(long_url + 15, 'a', sizes[i] - 15);
        long_url[sizes[i]] = '\0';
        int code = get(port, long_url, NULL, NULL);
        if (i == 0)
            assert_int_equal(code, 414);
        else
            assert_true(code == 414 || code == 431 || code == 400 || code == 0);
        free(long_url);
    }
    char edge[STATUS_HTTP_URL_BYTES + 1];   // exactly at the limit: served
    memcpy(edge, "/status.json?x=", 15);
    memset(edge + 15, 'b', STATUS_HTTP_URL_BYTES - 15);
    edge[STATUS_HTTP_URL_BYTES] = '\0';
    assert_int_equal(get(port, edge, NULL, NULL), 200);
    // Garbage bytes, and a bare newline.
    unsigned char junk[2048];
    srand(7);
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)rand();
    int code = exchange(port, (const char *)junk, sizeof junk, NULL);
    assert_true(code == 400 || code == 0);
    exchange(port, "\r\n\r\n", 4, NULL);
    // A half-sent request is closed after the timeout (1 s here), not held forever.
    int slow = connect_to(port);
    const char half[] = "GET / HTTP/1.1\r\nHost:";
    assert_int_equal(send(slow, half, sizeof half - 1, MSG_NOSIGNAL), (ssize_t)(sizeof half - 1));
    char one;
    struct pollfd pfd = {.fd = slow, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 8000), 1);   // readable: the server closed it (recv returns 0)
    assert_true(recv(slow, &one, 1, 0) <= 0);
    close(slow);
    // 200 connections at once, each sending a request: answered or refused, then still serving.
    enum { MANY = 200 };
    int fds[MANY];
    const char req[] = "GET /status.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for (int i = 0; i < MANY; i++) {
        fds[i] = connect_to(port);
        send(fds[i], req, sizeof req - 1, MSG_NOSIGNAL);
    }
    int answered = 0;
    for (int i = 0; i < MANY; i++) {
        char buf[64] = {0};
        if (recv(fds[i], buf, sizeof buf - 1, 0) > 0 && strncmp(buf, "HTTP/1.1 200", 12) == 0)
            answered++;
        close(fds[i]);
    }
    assert_true(answered > 0);
    // After all of it the server answers normally.
    assert_int_equal(get(port, "/status.json", NULL, &reply), 200);
    json_t *doc = json_loads(body_of(reply), 0, NULL);
    assert_non_null(doc);
    json_decref(doc);
    free(reply);
    status_http_stop(h);
}

static void test_http_token(void **state) {
    (void)state;
    StatusHttp *h = start("s3cret-token", 0);
    int port = status_http_port(h);
    char *reply;
    assert_int_equal(get(port, "/status.json", NULL, &reply), 401);
    assert_non_null(strstr(reply, "WWW-Authenticate: Bearer"));
    assert_null(strstr(body_of(reply), "peers"));
    free(reply);
    assert_int_equal(get(port, "/", "Authorization: Bearer wrong\r\n", NULL), 401);
    assert_int_equal(get(port, "/?token=s3cret-toke", NULL, NULL), 401);
    assert_int_equal(get(port, "/?token=s3cret-token-and-more", NULL, NULL), 401);
    assert_int_equal(get(port, "/status.json", "Authorization: Bearer s3cret-token\r\n", NULL), 200);
    assert_int_equal(get(port, "/status.json", "Authorization: bearer s3cret-token\r\n", NULL), 200);
    assert_int_equal(get(port, "/status.json", "Authorization: Basic s3cret-token\r\n", NULL), 401);
    assert_int_equal(get(port, "/?token=s3cret-token", NULL, NULL), 200);
    assert_int_equal(get(port, "/nothing?token=s3cret-token", NULL, NULL), 404);
    // A NUL cuts a decoded value short: the token or the path with junk after %00 is not them.
    assert_int_equal(get(port, "/status.json?token=s3cret-token%00junk", NULL, NULL), 400);
    assert_int_equal(get(port, "/status.json%00?token=s3cret-token", NULL, NULL), 400);
    assert_int_equal(get(port, "/status.json%00junk", "Authorization: Bearer s3cret-token\r\n", NULL), 400);
    status_http_stop(h);
}

// Several tokens (the parameter server's per-peer tokens, issue 29): each one lets a request in,
// nothing else does, and the page links with the one that came in the query.
static void test_http_several_tokens(void **state) {
    (void)state;
    const char *peers[] = {"peer-zero-token", "peer-one-token"};
    StatusHttpConfig cfg = {.port = 0, .tokens = peers, .n_tokens = 2};
    StatusHttp *h = NULL;
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_OK);
    int port = status_http_port(h);
    char *reply;
    assert_int_equal(get(port, "/status.json", NULL, NULL), 401);
    assert_int_equal(get(port, "/status.json", "Authorization: Bearer peer-zero-token\r\n", NULL), 200);
    assert_int_equal(get(port, "/status.json", "Authorization: Bearer peer-one-token\r\n", NULL), 200);
    assert_int_equal(get(port, "/status.json", "Authorization: Bearer peer-two-token\r\n", NULL), 401);
    assert_int_equal(get(port, "/?token=peer-one-token", NULL, &reply), 200);
    assert_non_null(strstr(body_of(reply), "href=\"status.json?token=peer-one-token\""));
    free(reply);
    status_http_stop(h);
    const char *empty[] = {"ok", ""};
    cfg.tokens = empty;
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "token is empty"));
}

// The page keeps a token that came in the query on its JSON link, and never shows one that came
// as a header.
static void test_http_token_on_page(void **state) {
    (void)state;
    StatusHttp *h = start("s3cr/et", 0);
    int port = status_http_port(h);
    char *reply;
    assert_int_equal(get(port, "/?token=s3cr%2Fet", NULL, &reply), 200);
    assert_non_null(strstr(body_of(reply), "href=\"status.json?token=s3cr%2Fet\""));
    free(reply);
    assert_int_equal(get(port, "/", "Authorization: Bearer s3cr/et\r\n", &reply), 200);
    assert_non_null(strstr(body_of(reply), "href=\"status.json\""));
    assert_null(strstr(body_of(reply), "s3cr"));
    free(reply);
    status_http_stop(h);
}

static int fill_fails(void *ctx, RunStatus *out) {
    (void)out;
    int *calls = ctx;
    ++*calls;
    return spes_fail("server status: out of memory");
}

// A snapshot that cannot be taken is a 503 for that request, and every request asks afresh.
static void test_http_fill_fails(void **state) {
    (void)state;
    int calls = 0;
    StatusHttpConfig cfg = {.port = 0};
    StatusHttp *h = NULL;
    assert_int_equal(status_http_start(&cfg, fill_fails, &calls, &h), SPES_OK);
    assert_int_equal(get(status_http_port(h), "/status.json", NULL, NULL), 503);
    assert_int_equal(get(status_http_port(h), "/", NULL, NULL), 503);
    assert_int_equal(calls, 2);
    status_http_stop(h);
}

// By default it listens on 127.0.0.1 only: the machine's other IPv4 addresses refuse (skipped on
// a machine with none), while an explicit 0.0.0.0 accepts there.
static void test_http_default_bind_loopback(void **state) {
    (void)state;
    struct ifaddrs *ifs = NULL;
    assert_int_equal(getifaddrs(&ifs), 0);
    struct sockaddr_in other = {0};
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr != htonl(INADDR_LOOPBACK)) {
            other = *(struct sockaddr_in *)i->ifa_addr;
            break;
        }
    freeifaddrs(ifs);
    if (other.sin_family != AF_INET)
        skip();
    StatusHttp *h = start(NULL, 0);
    other.sin_port = htons((uint16_t)status_http_port(h));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_not_equal(connect(fd, (struct sockaddr *)&other, sizeof other), 0);
    close(fd);
    status_http_stop(h);
    StatusHttpConfig cfg = {.port = 0, .bind_addr = "0.0.0.0"};
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_OK);
    other.sin_port = htons((uint16_t)status_http_port(h));
    fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&other, sizeof other), 0);
    close(fd);
    status_http_stop(h);
}

// An IPv6 address binds too (skipped where the machine has no IPv6 loopback).
static void test_http_ipv6(void **state) {
    (void)state;
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have_v6 = probe >= 0 && bind(probe, (struct sockaddr *)&a, sizeof a) == 0;
    if (probe >= 0)
        close(probe);
    if (!have_v6)
        skip();
    StatusHttpConfig cfg = {.port = 0, .bind_addr = "::1"};
    StatusHttp *h = NULL;
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_OK);
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    a.sin6_port = htons((uint16_t)status_http_port(h));
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char req[] = "GET /status.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)(sizeof req - 1));
    char buf[16] = {0};
    assert_true(recv(fd, buf, 12, MSG_WAITALL) == 12);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    close(fd);
    // Not on the IPv4 loopback: bound to ::1 only.
    int v4 = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)status_http_port(h))};
    inet_pton(AF_INET, "127.0.0.1", &a4.sin_addr);
    assert_int_not_equal(connect(v4, (struct sockaddr *)&a4, sizeof a4), 0);
    close(v4);
    status_http_stop(h);
}

static void test_http_bad_config(void **state) {
    (void)state;
    StatusHttp *h = NULL;
    StatusHttpConfig cfg = {.port = 0, .bind_addr = "localhost"};   // names are not resolved
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "localhost"));
    cfg = (StatusHttpConfig){.port = 0, .token = ""};
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "token is empty"));
    cfg = (StatusHttpConfig){.port = 70000};
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_ERR);
    StatusHttp *first = start(NULL, 0);   // a port in use
    cfg = (StatusHttpConfig){.port = status_http_port(first)};
    assert_int_equal(status_http_start(&cfg, status_fixture_fill, NULL, &h), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "cannot listen"));
    assert_null(h);
    status_http_stop(first);
}


// ---- serve mode, for the integration tests ----

static int serve(int argc, char **argv) {
    StatusHttpConfig cfg = {.port = 0};
    char *token = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--token_file") == 0) {
            if (auth_read_token_file(argv[i + 1], &token) != SPES_OK) {
                fprintf(stderr, "%s\n", spes_last_error());
                return 2;
            }
        } else if (strcmp(argv[i], "--max_connections") == 0) {
            cfg.max_connections = (unsigned)atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--timeout_s") == 0) {
            cfg.timeout_s = (unsigned)atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "serve: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    cfg.token = token;
    // SIGTERM and SIGINT blocked before the server thread starts (it inherits the mask), then
    // waited for here.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    StatusHttp *h = NULL;
    if (status_http_start(&cfg, status_fixture_fill, NULL, &h) != SPES_OK) {
        fprintf(stderr, "%s\n", spes_last_error());
        free(token);
        return 1;
    }
    printf("listening on 127.0.0.1:%d\n", status_http_port(h));
    fflush(stdout);
    int sig;
    sigwait(&stop, &sig);
    status_http_stop(h);
    free(token);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "serve") == 0)
        return serve(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_serves),     cmocka_unit_test(test_http_hostile),
        cmocka_unit_test(test_http_several_tokens),
        cmocka_unit_test(test_http_token),      cmocka_unit_test(test_http_token_on_page),
        cmocka_unit_test(test_http_fill_fails), cmocka_unit_test(test_http_default_bind_loopback),
        cmocka_unit_test(test_http_ipv6),
        cmocka_unit_test(test_http_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
