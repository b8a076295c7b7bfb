// Small inline SVG charts for the status page, drawn by the server so the page needs no
// JavaScript and no network: a line chart (one polyline per series, shared axes, a legend) and
// a bar chart. Values that are not finite or beyond +-1e12 (SVG_CHART_MAX_ABS in svg_chart.c:
// their range would overflow) are left out. Every id and label is HTML-escaped.
#pragma once
#include <stdbool.h>

#include "base/text_buf.h"

typedef struct {
    const char *id;             // the polyline's id attribute
    const char *label;          // legend text
    const double *x, *y;        // [n]
    int n;
} ChartSeries;

typedef struct {
    const char *id;             // the <svg> element's id
    const char *title, *x_label, *y_label;
    int width, height;          // pixels
} ChartFrame;

// Series colours cycle through a fixed palette of 8 (series i: svg_chart_colour(i)); each further
// cycle draws them with another dash (svg_chart_dash(i): an SVG stroke-dasharray, "" for solid),
// so series 0 and 8 stay apart. The legend wraps into as many rows as it needs; the chart grows
// taller by a row's height for each row past the first.
const char *svg_chart_colour(int i);
const char *svg_chart_dash(int i);
void svg_line_chart(TextBuf *b, const ChartFrame *f, const ChartSeries *series, int n_series);
// One bar per value, oldest left, its step (labels[i]) under it (under every few bars when they
// are narrow) and in its tooltip. Highlighted bars (partial rounds) are drawn in a warning colour, with a legend
// entry named highlight_label.
void svg_bar_chart(TextBuf *b, const ChartFrame *f, const double *values, const int *labels, const bool *highlight,
                   int n, const char *highlight_label);
