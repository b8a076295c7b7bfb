#include "status/svg_chart.h"

#include <math.h>

// Plot area inside the frame: margins for tick labels (left, bottom) and the legend (top).
enum { MARGIN_LEFT = 64, MARGIN_RIGHT = 16, MARGIN_TOP = 40, MARGIN_BOTTOM = 40, TICKS = 5 };
// Legend entries sit in rows of slots above the plot; each row past the first adds LEGEND_ROW
// pixels to the chart's height (the plot keeps its size).
enum { LEGEND_SLOT = 110, LEGEND_ROW = 14 };

static const char *const PALETTE[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                      "#9467bd", "#8c564b", "#e377c2", "#17becf"};
#define WARNING_COLOUR "#d62728"

#define PALETTE_SIZE ((int)(sizeof PALETTE / sizeof PALETTE[0]))
// Once the colours are used up, the next PALETTE_SIZE series repeat them with another dash.
static const char *const DASHES[] = {"", "6 3", "2 2", "8 3 2 3"};

const char *svg_chart_colour(int i) { return PALETTE[i % PALETTE_SIZE]; }
const char *svg_chart_dash(int i) { return DASHES[(i / PALETTE_SIZE) % (int)(sizeof DASHES / sizeof DASHES[0])]; }

static int legend_per_row(const ChartFrame *f) {
    int n = (f->width - MARGIN_LEFT - MARGIN_RIGHT) / LEGEND_SLOT;
    return n > 0 ? n : 1;
}

// The frame f grown to hold n legend entries; *top: where the plot starts.
static ChartFrame with_legend(const ChartFrame *f, int n, double *top) {
    int rows = n > 0 ? (n + legend_per_row(f) - 1) / legend_per_row(f) : 1;
    ChartFrame g = *f;
    g.height += LEGEND_ROW * (rows - 1);
    *top = MARGIN_TOP + LEGEND_ROW * (rows - 1);
    return g;
}

// Values beyond +-SVG_CHART_MAX_ABS are left out like NaN: the axis range of two such values
// (1.7e308 - -1.7e308) overflows to inf and prints "nan" coordinates, and one of them would
// squash every other series to a flat line.
#define SVG_CHART_MAX_ABS 1e12
static bool drawable(double v) { return fabs(v) <= SVG_CHART_MAX_ABS; }   // false for NaN too

typedef struct {
    double lo, hi;              // data range (hi > lo)
    double px0, px1;            // pixel range it maps to
} Axis;

static double axis_map(const Axis *a, double v) { return a->px0 + (v - a->lo) / (a->hi - a->lo) * (a->px1 - a->px0); }

// A range with room: equal ends get +-1 (or +-|v|/2), so a flat series still draws.
static Axis axis_make(double lo, double hi, double px0, double px1) {
    if (!(lo < hi)) {
        double pad = lo != 0 ? fabs(lo) / 2 : 1;
        lo -= pad;
        hi += pad;
    }
    return (Axis){lo, hi, px0, px1};
}

static void frame_open(TextBuf *b, const ChartFrame *f) {
    text_buf_puts(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"");
    text_buf_html(b, f->id);
    text_buf_printf(b, "\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\"><title>", f->width, f->height,
                    f->width, f->height);
    text_buf_html(b, f->title);
    text_buf_printf(b, "</title><rect width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#ccc\"/>", f->width, f->height);
    text_buf_printf(b, "<text x=\"%d\" y=\"16\" font-size=\"13\" font-weight=\"bold\">", MARGIN_LEFT);
    text_buf_html(b, f->title);
    text_buf_puts(b, "</text>");
}

// Ticks and labels of the y axis (and of the x axis with x_ticks), the axis titles.
static void axes(TextBuf *b, const ChartFrame *f, double top, const Axis *x, const Axis *y, bool x_ticks) {
    double bottom = f->height - MARGIN_BOTTOM;
    text_buf_printf(b, "<g font-size=\"10\" fill=\"#333\"><path d=\"M%d %.1f V%.1f H%d\" stroke=\"#888\" fill=\"none\"/>",
                    MARGIN_LEFT, top, bottom, f->width - MARGIN_RIGHT);
    for (int i = 0; i <= TICKS; i++) {
        double xv = x->lo + (x->hi - x->lo) * i / TICKS, yv = y->lo + (y->hi - y->lo) * i / TICKS;
        double xp = axis_map(x, xv), yp = axis_map(y, yv);
        if (x_ticks)
            text_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.4g</text>", xp, bottom + 14, xv);
        text_buf_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>", MARGIN_LEFT - 4, yp + 3, yv);
        text_buf_printf(b, "<path d=\"M%d %.1f H%d\" stroke=\"#eee\"/>", MARGIN_LEFT, yp, f->width - MARGIN_RIGHT);
    }
    text_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", (MARGIN_LEFT + f->width - MARGIN_RIGHT) / 2.0,
                    f->height - 6);
    text_buf_html(b, f->x_label);
    text_buf_printf(b, "</text><text x=\"12\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 12 %.1f)\">",
                    (top + bottom) / 2, (top + bottom) / 2);
    text_buf_html(b, f->y_label);
    text_buf_puts(b, "</text></g>");
}

// Entry slot of the legend: a filled square (dash NULL: bars) or a line in the series' dash.
static void legend_entry(TextBuf *b, const ChartFrame *f, int slot, const char *colour, const char *dash,
                         const char *label) {
    int x = MARGIN_LEFT + LEGEND_SLOT * (slot % legend_per_row(f)), y = 24 + LEGEND_ROW * (slot / legend_per_row(f));
    if (dash)
        text_buf_printf(b, "<path d=\"M%d %d h12\" stroke=\"%s\" stroke-width=\"3\" stroke-dasharray=\"%s\"/>", x, y + 5,
                        colour, dash);
    else
        text_buf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>", x, y, colour);
    text_buf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\">", x + 14, y + 9);
    text_buf_html(b, label);
    text_buf_puts(b, "</text>");
}

void svg_line_chart(TextBuf *b, const ChartFrame *f, const ChartSeries *series, int n_series) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int s = 0; s < n_series; s++)
        for (int i = 0; i < series[s].n; i++) {
            double xv = series[s].x[i], yv = series[s].y[i];
            if (!drawable(xv) || !drawable(yv))
                continue;
            xlo = fmin(xlo, xv), xhi = fmax(xhi, xv), ylo = fmin(ylo, yv), yhi = fmax(yhi, yv);
        }
    if (!(xlo <= xhi))
        xlo = 0, xhi = 1, ylo = 0, yhi = 1;   // nothing to draw yet: empty axes
    double top;
    ChartFrame g = with_legend(f, n_series, &top);
    f = &g;
    Axis x = axis_make(xlo, xhi, MARGIN_LEFT, f->width - MARGIN_RIGHT);
    Axis y = axis_make(ylo, yhi, f->height - MARGIN_BOTTOM, top);   // up is larger
    frame_open(b, f);
    axes(b, f, top, &x, &y, true);
    for (int s = 0; s < n_series; s++) {
        legend_entry(b, f, s, svg_chart_colour(s), svg_chart_dash(s), series[s].label);
        text_buf_puts(b, "<polyline class=\"curve\" id=\"");
        text_buf_html(b, series[s].id);
        text_buf_printf(b, "\" fill=\"none\" stroke-width=\"1.5\" stroke=\"%s\"", svg_chart_colour(s));
        if (*svg_chart_dash(s))
            text_buf_printf(b, " stroke-dasharray=\"%s\"", svg_chart_dash(s));
        text_buf_puts(b, " points=\"");
        for (int i = 0; i < series[s].n; i++)
            if (drawable(series[s].x[i]) && drawable(series[s].y[i]))
                text_buf_printf(b, "%.1f,%.1f ", axis_map(&x, series[s].x[i]), axis_map(&y, series[s].y[i]));
        text_buf_puts(b, "\"/>");
    }
    text_buf_puts(b, "</svg>");
}

void svg_bar_chart(TextBuf *b, const ChartFrame *f, const double *values, const int *labels, const bool *highlight,
                   int n, const char *highlight_label) {
    double hi = 0;
    for (int i = 0; i < n; i++)
        if (drawable(values[i]))
            hi = fmax(hi, values[i]);
    Axis x = axis_make(0, n > 0 ? n : 1, MARGIN_LEFT, f->width - MARGIN_RIGHT);
    Axis y = axis_make(0, hi > 0 ? hi : 1, f->height - MARGIN_BOTTOM, MARGIN_TOP);
    frame_open(b, f);
    axes(b, f, MARGIN_TOP, &x, &y, false);
    legend_entry(b, f, 0, svg_chart_colour(0), NULL, "full");
    legend_entry(b, f, 1, WARNING_COLOUR, NULL, highlight_label);
    double slot = (x.px1 - x.px0) / (n > 0 ? n : 1), bottom = axis_map(&y, 0);
    int label_every = slot >= 40 ? 1 : (int)ceil(40 / slot);
    for (int i = 0; i < n; i++) {
        double v = drawable(values[i]) && values[i] > 0 ? values[i] : 0, top = axis_map(&y, v);
        text_buf_printf(b, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                           "<title>step %d: %.3g</title></rect>",
                        x.px0 + i * slot + slot * 0.1, top, slot * 0.8, bottom - top,
                        highlight[i] ? WARNING_COLOUR : svg_chart_colour(0), labels[i], v);
        if (i % label_every == 0)   // the step under every few bars, as many as fit
            text_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%d</text>",
                            x.px0 + (i + 0.5) * slot, bottom + 14, labels[i]);
    }
    text_buf_puts(b, "</svg>");
}
