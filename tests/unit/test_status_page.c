// status_page.h and svg_chart.h: the page a person reads, rendered from the fixture run
// (tests/unit/status_fixture.h): the peers table with each peer's state, the rounds table
// (newest first, the partial one marked), one loss curve per peer and one bar per round as inline
// SVG, no script and no outside resource, values that are not finite never printed, the token
// percent-encoded on the JSON link, chart labels escaped; a run with no peers and no rounds; the
// text buffer the page is built in.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text_buf.h"
#include "status/status_page.h"
#include "status/svg_chart.h"
#include "status_fixture.h"

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

// The text of the row that starts at the first occurrence of marker (up to its </tr>).
static char *row_of(const char *page, const char *marker) {
    const char *start = strstr(page, marker);
    assert_non_null(start);
    const char *end = strstr(start, "</tr>");
    assert_non_null(end);
    return strndup(start, (size_t)(end - start));
}

static void test_page_structure(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(status_fixture(&s), SPES_OK);
    size_t len;
    char *page = status_page_render(&s, NULL, &len);
    assert_non_null(page);
    assert_int_equal(len, strlen(page));
    assert_true(strncmp(page, "<!DOCTYPE html>", 15) == 0);
    assert_non_null(strstr(page, "</html>"));
    // Peers: one row each, state as class and data attribute, last seen as seconds ago.
    assert_int_equal(count_in(page, "<tr class=\"peer\""), 4);
    char *late = row_of(page, "data-peer=\"1\" data-state=\"late\"");
    assert_non_null(strstr(late, "65 s ago"));
    assert_non_null(strstr(late, "<td>50</td>"));          // last upload step
    assert_non_null(strstr(late, "<td>49</td>"));          // newest reported step (2 * 24 + 1)
    assert_non_null(strstr(late, "<td>1001</td>"));        // tokens/s
    free(late);
    char *alive = row_of(page, "data-peer=\"0\" data-state=\"alive\"");
    assert_non_null(strstr(alive, "<td>-</td>"));          // its infinite MFU
    free(alive);
    assert_non_null(strstr(page, "data-peer=\"2\" data-state=\"missing\""));
    char *unseen = row_of(page, "data-peer=\"3\" data-state=\"unseen\"");
    assert_non_null(strstr(unseen, "never"));
    free(unseen);
    // Curves: one polyline per peer, the unseen one empty.
    assert_int_equal(count_in(page, "<polyline class=\"curve\""), 4);
    assert_non_null(strstr(page, "id=\"loss-peer-3\" fill=\"none\" stroke-width=\"1.5\" stroke=\"#d62728\" points=\"\""));
    const char *curve0 = strstr(page, "id=\"loss-peer-0\"");
    assert_non_null(curve0);
    const char *pts = strstr(curve0, "points=\"") + 8;
    int n_points = 0;
    for (double x, y; sscanf(pts, "%lf,%lf", &x, &y) == 2; n_points++) pts = strchr(pts, ' ') + 1;
    assert_int_equal(n_points, 30);
    // Rounds: a bar and a row each, newest row first, the partial one marked.
    assert_int_equal(count_in(page, "<rect class=\"bar\""), 6);
    assert_int_equal(count_in(page, "<tr class=\"round\""), 6);
    assert_true(strstr(page, "data-step=\"60\"") < strstr(page, "data-step=\"10\""));
    char *partial = row_of(page, "data-step=\"50\" data-partial=\"true\"");
    assert_non_null(strstr(partial, "partial"));
    free(partial);
    assert_non_null(strstr(page, "href=\"status.json\""));
    // Offline and clean: no script, nothing fetched from elsewhere, no NaN or inf printed.
    assert_null(strstr(page, "<script"));
    assert_null(strstr(page, "src="));
    assert_int_equal(count_in(page, "://"), count_in(page, "xmlns=\"http://www.w3.org/2000/svg\""));   // no URL but the SVG namespace
    assert_null(strstr(page, "nan"));
    assert_null(strstr(page, "inf"));
    free(page);
    run_status_free(&s);
}

static void test_token_link_escaped(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(status_fixture(&s), SPES_OK);
    char *page = status_page_render(&s, "a&b<\"c> d/é", NULL);
    assert_non_null(page);
    assert_non_null(strstr(page, "href=\"status.json?token=a%26b%3C%22c%3E%20d%2F%C3%A9\""));
    assert_null(strstr(page, "a&b"));
    free(page);
    run_status_free(&s);
}

static void test_empty_run(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(run_status_alloc(&s, 0), 0);
    s.rounds.open_step = -1;
    s.rounds.last_aggregate_step = -1;
    char *page = status_page_render(&s, NULL, NULL);
    assert_non_null(page);
    assert_int_equal(count_in(page, "<tr class=\"peer\""), 0);
    assert_int_equal(count_in(page, "<tr class=\"round\""), 0);
    assert_non_null(strstr(page, "<table id=\"peers\">"));
    assert_non_null(strstr(page, "id=\"loss-curves\""));
    assert_non_null(strstr(page, "id=\"round-times\""));
    assert_null(strstr(page, "nan"));
    assert_non_null(strstr(page, "</html>"));
    free(page);
    run_status_free(&s);
}

static void test_chart_scaling(void **state) {
    (void)state;
    // A flat series and a single point still give finite coordinates inside the plot.
    double x[3] = {5, 6, 7}, y[3] = {2, 2, 2}, one_x = 3, one_y = NAN;
    ChartSeries series[2] = {{"flat", "flat <i>", x, y, 3}, {"single", "single", &one_x, &one_y, 1}};
    ChartFrame f = {"c\"", "t <&>", "x", "y", 400, 200};
    TextBuf b;
    text_buf_init(&b);
    svg_line_chart(&b, &f, series, 2);
    char *svg = text_buf_take(&b, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "t &lt;&amp;&gt;"));
    assert_non_null(strstr(svg, "flat &lt;i&gt;"));
    assert_non_null(strstr(svg, "id=\"c&quot;\""));
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

// Huge finite values (a hostile peer's loss of +-1.7e308, issue 29) printed "-nan"/"inf" into the
// SVG (the axis range overflowed) and flattened every other curve: they are left out like NaN.
static void test_chart_huge_values(void **state) {
    (void)state;
    double x[3] = {1, 2, 3}, y[3] = {3.0, 2.5, 2.0}, hx[2] = {1, 2}, hy[2] = {1.7e308, -1.7e308};
    ChartSeries series[2] = {{"sane", "sane", x, y, 3}, {"huge", "huge", hx, hy, 2}};
    ChartFrame f = {"c", "loss", "step", "loss", 400, 200};
    TextBuf b;
    text_buf_init(&b);
    svg_line_chart(&b, &f, series, 2);
    double bars[3] = {1.0, 1.7e308, 2.0};
    int labels[3] = {1, 2, 3};
    bool partial[3] = {false, false, false};
    svg_bar_chart(&b, &f, bars, labels, partial, 3, "partial");
    char *svg = text_buf_take(&b, NULL);
    assert_non_null(svg);
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    assert_null(strstr(svg, "e+308"));
    const char *pts = strstr(strstr(svg, "id=\"sane\""), "points=\"") + 8;
    double lo = 1e9, hi = -1e9;
    for (int i = 0; i < 3; i++) {
        double px, py;
        assert_int_equal(sscanf(pts, "%lf,%lf", &px, &py), 2);
        lo = py < lo ? py : lo, hi = py > hi ? py : hi;
        pts = strchr(pts, ' ') + 1;
    }
    assert_true(hi - lo > 50);   // the sane curve spans the plot, not a flat line
    free(svg);
}

// 20 series on a 720-pixel chart: the legend wraps into rows inside the frame (which grows by a
// row each), and series 8 and 16 repeat series 0's colour with their own dash.
static void test_chart_many_series(void **state) {
    (void)state;
    enum { N = 20 };
    double x[2] = {0, 1}, y[2] = {1, 2};
    ChartSeries series[N];
    char ids[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "s%d", i);
        series[i] = (ChartSeries){ids[i], ids[i], x, y, 2};
    }
    ChartFrame f = {"many", "many", "x", "y", 720, 300};
    TextBuf b;
    text_buf_init(&b);
    svg_line_chart(&b, &f, series, N);
    char *svg = text_buf_take(&b, NULL);
    assert_non_null(svg);
    int per_row = (720 - 64 - 16) / 110, rows = (N + per_row - 1) / per_row;
    char want[64];
    snprintf(want, sizeof want, "width=\"720\" height=\"%d\"", 300 + 14 * (rows - 1));
    assert_non_null(strstr(svg, want));
    int entries = 0;
    for (const char *t = svg; (t = strstr(t, "<text x=\"")); t++) {   // legend labels: every x inside the frame
        double tx;
        if (sscanf(t, "<text x=\"%lf\" y=\"%*d\" font-size=\"11\">", &tx) == 1 && strstr(t, "font-size=\"11\"") - t < 40) {
            assert_true(tx + 96 <= 720);
            entries++;
        }
    }
    assert_int_equal(entries, N);
    assert_string_equal(svg_chart_colour(8), svg_chart_colour(0));
    assert_string_not_equal(svg_chart_dash(8), svg_chart_dash(0));
    assert_string_not_equal(svg_chart_dash(16), svg_chart_dash(8));
    assert_non_null(strstr(svg, "id=\"s8\" fill=\"none\" stroke-width=\"1.5\" stroke=\"#1f77b4\" stroke-dasharray=\"6 3\""));
    assert_non_null(strstr(svg, "id=\"s0\" fill=\"none\" stroke-width=\"1.5\" stroke=\"#1f77b4\" points="));
    free(svg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_buf),
        cmocka_unit_test(test_chart_huge_values),
        cmocka_unit_test(test_page_structure),
        cmocka_unit_test(test_token_link_escaped),
        cmocka_unit_test(test_empty_run),
        cmocka_unit_test(test_chart_scaling),
        cmocka_unit_test(test_chart_many_series),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
