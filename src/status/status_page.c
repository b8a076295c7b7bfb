#include "status/status_page.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/text_buf.h"
#include "status/svg_chart.h"

static const char STYLE[] =
    "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}"
    ".alive{color:#2ca02c}.late{color:#e69500}.missing{color:#d62728;font-weight:bold}.unseen{color:#888}"
    "svg{display:block;margin:.5em 0 1.5em}";

// A number cell: "-" when it is not finite (a peer that reported nothing yet).
static void number_cell(TextBuf *b, const char *fmt, double v) {
    text_buf_puts(b, "<td>");
    if (isfinite(v))
        text_buf_printf(b, fmt, v);
    else
        text_buf_puts(b, "-");
    text_buf_puts(b, "</td>");
}

static void utc_time(TextBuf *b, double unix_s) {
    time_t t = (time_t)unix_s;
    struct tm tm;
    char text[32];
    if (unix_s > 0 && gmtime_r(&t, &tm) && strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm))
        text_buf_puts(b, text);
    else
        text_buf_puts(b, "-");
}

static void summary(TextBuf *b, const RunStatus *s) {
    const RoundsStatus *r = &s->rounds;
    text_buf_printf(b, "<h1>SPES run: %d peers, %s mode</h1><p id=\"summary\">", r->total_peers,
                    sync_mode_name(r->mode));
    text_buf_printf(b, "rounds completed %" PRId64 " (partial %" PRId64 ") &middot; last aggregate step %d &middot; ",
                    r->rounds_completed, r->rounds_partial, r->last_aggregate_step);
    if (r->open_step >= 0)
        text_buf_printf(b, "open round: step %d, %d of %d uploaded &middot; ", r->open_step, r->num_uploaded,
                        r->total_peers);
    text_buf_printf(b, "received %.1f MB, sent %.1f MB, uploads refused %" PRId64 " &middot; model %016" PRIx64
                       " &middot; as of ", r->bytes_received / 1e6, r->bytes_sent / 1e6, r->uploads_rejected,
                    r->fingerprint);
    utc_time(b, s->now_unix);
    text_buf_puts(b, "</p>");
}

static void peers_table(TextBuf *b, const RunStatus *s) {
    text_buf_puts(b, "<h2>Peers</h2><table id=\"peers\"><tr><th>peer</th><th>state</th><th>last seen</th>"
                     "<th>last upload</th><th>step</th><th>loss</th><th>tokens/s</th><th>MFU</th>"
                     "<th>memory MB</th><th>routing min/max</th></tr>");
    for (int i = 0; i < s->num_peers; i++) {
        const PeerStatus *p = &s->peers[i];
        const char *state = peer_liveness_name(p->liveness);
        const PeerMetricPoint *m = p->num_points ? &p->points[p->num_points - 1] : NULL;
        text_buf_printf(b, "<tr class=\"peer\" data-peer=\"%d\" data-state=\"%s\"><td>%d</td><td class=\"%s\">%s</td>",
                        p->peer, state, p->peer, state, state);
        if (p->last_seen_unix > 0)
            text_buf_printf(b, "<td>%.0f s ago</td>", fmax(0, s->now_unix - p->last_seen_unix));
        else
            text_buf_puts(b, "<td>never</td>");
        if (p->last_upload_step >= 0)
            text_buf_printf(b, "<td>%d</td>", p->last_upload_step);
        else
            text_buf_puts(b, "<td>-</td>");
        if (m) {
            text_buf_printf(b, "<td>%" PRId64 "</td>", m->step);
            number_cell(b, "%.4f", m->loss);
            number_cell(b, "%.0f", m->tokens_per_s);
            number_cell(b, "%.1f%%", m->mfu * 100);
            number_cell(b, "%.0f", m->device_mem_mb);
            text_buf_printf(b, "<td>%.2f / %.2f</td>", m->route_min, m->route_max);
        } else {
            text_buf_puts(b, "<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td><td>-</td>");
        }
        text_buf_puts(b, "</tr>");
    }
    text_buf_puts(b, "</table>");
}

// Every peer's loss against its step, one polyline each.
static void loss_chart(TextBuf *b, const RunStatus *s) {
    int total = 0;
    for (int i = 0; i < s->num_peers; i++) total += s->peers[i].num_points;
    double *xy = spes_calloc((size_t)(2 * total + 2), sizeof *xy);
    ChartSeries *series = spes_calloc((size_t)s->num_peers + 1, sizeof *series);
    char (*names)[2][32] = spes_calloc((size_t)s->num_peers + 1, sizeof *names);
    if (!xy || !series || !names) {
        b->failed = true;
    } else {
        double *next = xy;
        for (int i = 0; i < s->num_peers; i++) {
            const PeerStatus *p = &s->peers[i];
            snprintf(names[i][0], sizeof names[i][0], "loss-peer-%d", p->peer);
            snprintf(names[i][1], sizeof names[i][1], "peer %d", p->peer);
            series[i] = (ChartSeries){names[i][0], names[i][1], next, next + p->num_points, p->num_points};
            for (int k = 0; k < p->num_points; k++) {
                next[k] = (double)p->points[k].step;
                next[p->num_points + k] = p->points[k].loss;
            }
            next += 2 * p->num_points;
        }
        ChartFrame f = {"loss-curves", "Training loss per peer", "step", "loss", 720, 300};
        text_buf_puts(b, "<h2>Loss</h2>");
        svg_line_chart(b, &f, series, s->num_peers);
    }
    free(xy);
    free(series);
    free(names);
}

static void round_chart(TextBuf *b, const RunStatus *s) {
    int n = s->num_rounds;
    double *seconds = spes_calloc((size_t)n + 1, sizeof *seconds);
    int *steps = spes_calloc((size_t)n + 1, sizeof *steps);
    bool *partial = spes_calloc((size_t)n + 1, sizeof *partial);
    if (!seconds || !steps || !partial) {
        b->failed = true;
    } else {
        for (int i = 0; i < n; i++) {
            seconds[i] = s->round_history[i].duration_s;
            steps[i] = s->round_history[i].step;
            partial[i] = s->round_history[i].partial;
        }
        ChartFrame f = {"round-times", "Round duration (first upload to aggregate)", "step", "seconds", 720, 240};
        text_buf_puts(b, "<h2>Rounds</h2>");
        svg_bar_chart(b, &f, seconds, steps, partial, n, "partial");
    }
    free(seconds);
    free(steps);
    free(partial);
}

static void rounds_table(TextBuf *b, const RunStatus *s) {
    text_buf_puts(b, "<table id=\"rounds\"><tr><th>step</th><th>started</th><th>duration s</th><th>kind</th>"
                     "<th>peers</th><th>MB in</th><th>MB out</th><th>merge alpha</th></tr>");
    int oldest_shown = s->num_rounds > STATUS_PAGE_ROUND_ROWS ? s->num_rounds - STATUS_PAGE_ROUND_ROWS : 0;
    for (int i = s->num_rounds - 1; i >= oldest_shown; i--) {
        const RoundRecord *r = &s->round_history[i];
        text_buf_printf(b, "<tr class=\"round\" data-step=\"%d\" data-partial=\"%s\"><td>%d</td><td>", r->step,
                        r->partial ? "true" : "false", r->step);
        utc_time(b, r->started_unix);
        text_buf_puts(b, "</td>");
        number_cell(b, "%.2f", r->duration_s);
        text_buf_printf(b, "<td class=\"%s\">%s</td><td>%d</td><td>%.2f</td><td>%.2f</td>", r->partial ? "late" : "alive",
                        r->partial ? "partial" : "full", r->peers, r->bytes_in / 1e6, r->bytes_out / 1e6);
        if (r->merge_alpha > 0)
            number_cell(b, "%.3g", r->merge_alpha);
        else
            text_buf_puts(b, "<td>-</td>");
        text_buf_puts(b, "</tr>");
    }
    text_buf_puts(b, "</table>");
}

// The link to the JSON document, with the token percent-encoded (RFC 3986: everything but the
// unreserved characters), so the href holds no character HTML or a URL would read specially.
static void json_link(TextBuf *b, const char *query_token) {
    text_buf_puts(b, "<p><a id=\"json-link\" href=\"status.json");
    if (query_token) {
        text_buf_puts(b, "?token=");
        for (const unsigned char *c = (const unsigned char *)query_token; *c; c++) {
            bool unreserved = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
                              (*c && strchr("-._~", *c));
            if (unreserved)
                text_buf_append(b, (const char *)c, 1);
            else
                text_buf_printf(b, "%%%02X", *c);
        }
    }
    text_buf_puts(b, "\">status.json</a></p>");
}

char *status_page_render(const RunStatus *s, const char *query_token, size_t *len) {
    TextBuf b;
    text_buf_init(&b);
    text_buf_printf(&b, "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                        "<meta http-equiv=\"refresh\" content=\"%d\"><title>SPES run status</title><style>%s</style>"
                        "</head><body>", STATUS_PAGE_REFRESH_S, STYLE);
    summary(&b, s);
    peers_table(&b, s);
    loss_chart(&b, s);
    round_chart(&b, s);
    rounds_table(&b, s);
    json_link(&b, query_token);
    text_buf_puts(&b, "</body></html>");
    return text_buf_take(&b, len);
}
