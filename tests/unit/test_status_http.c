// The status server (src/status/): the JSON document parsed back against the RunStatus it came
// from (NaN written as null), the page's structure and escaping, empty runs, the SVG charts;
// then the HTTP server on an ephemeral port: GET/HEAD, 404, 405, request bodies, oversized
// URLs, garbage, 200 connections at once, a half-sent request, the token (header and query),
// and after every hostile request it still serves. Finally the page in headless Chromium (skipped
// without it): the peers table, the curves and the round bars in the rendered DOM, a screenshot
// kept in $SPES_BUILD/artifacts/status_page.png.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/text_buf.h"
#include "status/run_status.h"
#include "status/status_http.h"
#include "status/status_json.h"
#include "status/status_page.h"
#include "status/svg_chart.h"

// ---- a run to show: 4 peers (alive, late, missing, unseen), 6 rounds, one partial ----

#define NOW 1795000000.0

static void fixture(RunStatus *s) {
    assert_int_equal(run_status_alloc(s, 4), 0);
    s->now_unix = NOW;
    s->rounds = (RoundsStatus){.rounds_completed = 6, .open_step = 70, .num_uploaded = 2, .peers_uploaded = {0, 3},
                               .last_aggregate_step = 60, .bytes_received = 123456789, .bytes_sent = 987654321,
                               .uploads_rejected = 2, .fingerprint = 0x0123456789abcdefULL,
                               .last_aggregate_seconds = 0.25, .rounds_partial = 1, .last_round_peers = 3,
                               .total_peers = 4, .mode = SYNC_MODE_SPES};
    PeerLiveness states[4] = {PEER_ALIVE, PEER_LATE, PEER_MISSING, PEER_UNSEEN};
    for (int p = 0; p < 4; p++) {
        PeerStatus *ps = &s->peers[p];
        ps->liveness = states[p];
        if (states[p] == PEER_UNSEEN)
            continue;
        ps->last_seen_unix = NOW - 5 - 60 * p;
        ps->last_upload_step = 60 - 10 * p;
        ps->num_points = 30 - 5 * p;
        for (int i = 0; i < ps->num_points; i++)
            ps->points[i] = (PeerMetricPoint){.step = 2 * i + 1, .loss = 4.0 / (1 + 0.1 * i) + 0.05 * p,
                                              .ce = 3.5, .lb = 0.01, .tokens_per_s = 1000 + p, .mfu = 0.25,
                                              .device_mem_mb = 512, .route_min = 0.5, .route_max = 1.5};
    }
    s->peers[1].points[3].loss = NAN;   // a diverged step: null in JSON, skipped in the curve
    s->num_rounds = 6;
    for (int i = 0; i < 6; i++)
        s->round_history[i] = (RoundRecord){.step = 10 * (i + 1), .started_unix = NOW - 600 + 100 * i,
                                            .duration_s = 1.5 + i, .partial = i == 4, .peers = i == 4 ? 3 : 4,
                                            .bytes_in = 1000000 * (i + 1), .bytes_out = 3000000,
                                            .merge_alpha = i < 2 ? 0.3 : 0};
}

static int fill_fixture(void *ctx, RunStatus *out) {
    (void)ctx;
    fixture(out);
    return SPES_OK;
}

// ---- the documents ----

static void test_text_buf(void **state) {
    (void)state;
    TextBuf b;
    text_buf_init(&b);
    text_buf_puts(&b, "a");
    text_buf_printf(&b, "%d-%s", 42, "x");
    text_buf_html(&b, "<b a=\"1\">'&'</b>");
    for (int i = 0; i < 1000; i++) text_buf_puts(&b, "0123456789");   // grows past the first block
    size_t len;
    char *text = text_buf_take(&b, &len);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    const char want[] = "a42-x&lt;b a=&quot;1&quot;&gt;&#39;&amp;&#39;&lt;/b&gt;";
    assert_int_equal(len, sizeof want - 1 + 10000);
    assert_memory_equal(text, want, sizeof want - 1);
    free(text);
}

static void test_json_matches_status(void **state) {
    (void)state;
    RunStatus s;
    fixture(&s);
    size_t len;
    char *text = status_json_render(&s, &len);
    assert_non_null(text);
    json_error_t err;
    json_t *doc = json_loads(text, 0, &err);
    assert_non_null(doc);
    assert_int_equal(json_integer_value(json_object_get(doc, "rounds_completed")), 6);
    assert_int_equal(json_integer_value(json_object_get(doc, "open_step")), 70);
    assert_int_equal(json_array_size(json_object_get(doc, "peers_uploaded")), 2);
    assert_int_equal(json_integer_value(json_object_get(doc, "bytes_sent")), 987654321);
    assert_string_equal(json_string_value(json_object_get(doc, "fingerprint")), "0123456789abcdef");
    assert_string_equal(json_string_value(json_object_get(doc, "mode")), "spes");
    json_t *peers = json_object_get(doc, "peers");
    assert_int_equal(json_array_size(peers), 4);
    const char *names[4] = {"alive", "late", "missing", "unseen"};
    for (int p = 0; p < 4; p++) {
        json_t *peer = json_array_get(peers, (size_t)p);
        assert_int_equal(json_integer_value(json_object_get(peer, "peer")), p);
        assert_string_equal(json_string_value(json_object_get(peer, "state")), names[p]);
        assert_int_equal(json_array_size(json_object_get(peer, "points")), (size_t)s.peers[p].num_points);
    }
    json_t *late = json_array_get(peers, 1);
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(late, "points"), 3), "loss")));
    assert_true(fabs(json_real_value(json_object_get(late, "seconds_since_seen")) - 65) < 1e-9);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(late, "latest"), "step")), 2 * 24 + 1);
    json_t *unseen = json_array_get(peers, 3);
    assert_true(json_is_null(json_object_get(unseen, "last_seen")));
    assert_true(json_is_null(json_object_get(unseen, "latest")));
    json_t *rounds = json_object_get(doc, "rounds");
    assert_int_equal(json_array_size(rounds), 6);
    json_t *partial = json_array_get(rounds, 4);
    assert_true(json_is_true(json_object_get(partial, "partial")));
    assert_int_equal(json_integer_value(json_object_get(partial, "step")), 50);
    assert_int_equal(json_integer_value(json_object_get(partial, "peers")), 3);
    assert_true(fabs(json_real_value(json_object_get(json_array_get(rounds, 0), "merge_alpha")) - 0.3) < 1e-12);
    json_decref(doc);
    free(text);
    run_status_free(&s);
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

static void test_page_structure(void **state) {
    (void)state;
    RunStatus s;
    fixture(&s);
    char *page = status_page_render(&s, NULL);
    assert_non_null(page);
    assert_int_equal(count(page, "<tr class=\"peer\""), 4);
    assert_non_null(strstr(page, "data-peer=\"1\" data-state=\"late\""));
    assert_non_null(strstr(page, "data-peer=\"2\" data-state=\"missing\""));
    assert_int_equal(count(page, "<polyline class=\"curve\""), 4);
    assert_non_null(strstr(page, "id=\"loss-peer-0\""));
    assert_int_equal(count(page, "<rect class=\"bar\""), 6);
    assert_int_equal(count(page, "<tr class=\"round\""), 6);
    assert_non_null(strstr(page, "data-step=\"50\" data-partial=\"true\""));
    assert_null(strstr(page, "<script"));
    assert_null(strstr(page, "nan"));   // the NaN point is left out, never printed
    assert_null(strstr(page, "inf"));
    free(page);
    run_status_free(&s);
}

static void test_empty_run(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(run_status_alloc(&s, 0), 0);
    s.rounds.open_step = -1;
    s.rounds.last_aggregate_step = -1;
    char *page = status_page_render(&s, NULL);
    char *json = status_json_render(&s, NULL);
    assert_non_null(page);
    assert_non_null(json);
    assert_int_equal(count(page, "<tr class=\"peer\""), 0);
    assert_non_null(strstr(page, "id=\"loss-curves\""));
    json_t *doc = json_loads(json, 0, NULL);
    assert_non_null(doc);
    assert_int_equal(json_array_size(json_object_get(doc, "peers")), 0);
    json_decref(doc);
    free(page);
    free(json);
    run_status_free(&s);
}

static void test_chart_scaling(void **state) {
    (void)state;
    // A flat series and a single point still give finite coordinates inside the plot.
    double x[3] = {5, 6, 7}, y[3] = {2, 2, 2}, one_x = 3, one_y = NAN;
    ChartSeries series[2] = {{"flat", "flat", x, y, 3}, {"single", "single", &one_x, &one_y, 1}};
    ChartFrame f = {"c", "t <&>", "x", "y", 400, 200};
    TextBuf b;
    text_buf_init(&b);
    svg_line_chart(&b, &f, series, 2);
    char *svg = text_buf_take(&b, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "t &lt;&amp;&gt;"));
    assert_null(strstr(svg, "nan"));
    const char *pts = strstr(svg, "id=\"flat\"");
    assert_non_null(pts);
    pts = strstr(pts, "points=\"") + 8;
    for (int i = 0; i < 3; i++) {
        double px, py;
        assert_int_equal(sscanf(pts, "%lf,%lf", &px, &py), 2);
        assert_true(px >= 0 && px <= 400 && py >= 0 && py <= 200);
        pts = strchr(pts, ' ') + 1;
    }
    free(svg);
}

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
    char req[4096];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", path,
             extra_headers ? extra_headers : "");
    return exchange(port, req, strlen(req), reply);
}

static const char *body_of(const char *reply) {
    const char *b = strstr(reply, "\r\n\r\n");
    return b ? b + 4 : "";
}

static StatusHttp *start(const char *token, unsigned timeout_s) {
    StatusHttpConfig cfg = {.port = 0, .token = token, .timeout_s = timeout_s, .max_connections = 256};
    StatusHttp *h = NULL;
    assert_int_equal(status_http_start(&cfg, fill_fixture, NULL, &h), SPES_OK);
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
    // A URL far beyond the request limit.
    size_t long_len = 64 * 1024;
    char *long_url = malloc(long_len + 1);
    long_url[0] = '/';
    memset(long_url + 1, 'a', long_len - 1);
    long_url[long_len] = '\0';
    int code = get(port, long_url, NULL, NULL);
    assert_true(code == 414 || code == 431 || code == 400 || code == 0);
    free(long_url);
    // Garbage bytes, and a bare newline.
    unsigned char junk[2048];
    srand(7);
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)rand();
    code = exchange(port, (const char *)junk, sizeof junk, NULL);
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
    assert_non_null(json_loads(body_of(reply), 0, NULL) ? reply : NULL);
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
    assert_int_equal(get(port, "/?token=s3cret-token", NULL, NULL), 200);
    assert_int_equal(get(port, "/nothing?token=s3cret-token", NULL, NULL), 404);
    status_http_stop(h);
}

static void test_http_bad_config(void **state) {
    (void)state;
    StatusHttp *h = NULL;
    StatusHttpConfig cfg = {.port = 0, .bind_addr = "localhost"};   // names are not resolved
    assert_int_equal(status_http_start(&cfg, fill_fixture, NULL, &h), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "localhost"));
    cfg = (StatusHttpConfig){.port = 70000};
    assert_int_equal(status_http_start(&cfg, fill_fixture, NULL, &h), SPES_ERR);
    StatusHttp *first = start(NULL, 0);   // a port in use
    cfg = (StatusHttpConfig){.port = status_http_port(first)};
    assert_int_equal(status_http_start(&cfg, fill_fixture, NULL, &h), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "cannot listen"));
    assert_null(h);
    status_http_stop(first);
}

// ---- the page in a real browser ----

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(1, (size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static void test_page_in_chromium(void **state) {
    (void)state;
    StatusHttp *h = start("tok", 0);
    const char *build = getenv("SPES_BUILD") ? getenv("SPES_BUILD") : "build";
    char dom[512], shot[512], cmd[2048];
    snprintf(dom, sizeof dom, "%s/artifacts/status_page.dom.html", build);
    snprintf(shot, sizeof shot, "%s/artifacts/status_page.png", build);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/artifacts' && bash tests/integration/lib/chromium_dom.sh "
             "'http://127.0.0.1:%d/?token=tok' '%s' '%s'", build, status_http_port(h), dom, shot);
    int rc = system(cmd);
    status_http_stop(h);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77)
        skip();
    assert_int_equal(rc, 0);
    char *text = read_all(dom);
    assert_non_null(text);
    assert_int_equal(count(text, "class=\"peer\""), 4);
    assert_non_null(strstr(text, "data-state=\"missing\""));
    assert_int_equal(count(text, "class=\"curve\""), 4);
    const char *curve = strstr(text, "id=\"loss-peer-0\"");
    assert_non_null(curve);
    assert_non_null(strstr(curve, "points=\""));
    assert_int_equal(count(text, "class=\"bar\""), 6);
    assert_non_null(strstr(text, "data-partial=\"true\""));
    free(text);
    FILE *png = fopen(shot, "rb");
    assert_non_null(png);
    unsigned char sig[8];
    assert_int_equal(fread(sig, 1, 8, png), 8);
    assert_memory_equal(sig, "\x89PNG\r\n\x1a\n", 8);
    fclose(png);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_buf),        cmocka_unit_test(test_json_matches_status),
        cmocka_unit_test(test_page_structure),  cmocka_unit_test(test_empty_run),
        cmocka_unit_test(test_chart_scaling),   cmocka_unit_test(test_http_serves),
        cmocka_unit_test(test_http_hostile),    cmocka_unit_test(test_http_token),
        cmocka_unit_test(test_http_bad_config), cmocka_unit_test(test_page_in_chromium),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
