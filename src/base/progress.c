#include "base/progress.h"

#include <stdio.h>
#include <unistd.h>

#include "base/timer.h"

void format_duration(double seconds, char *buf, int bufsize) {
    if (seconds < 0 || seconds != seconds) seconds = 0;
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, (size_t)bufsize, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    else if (s >= 60) snprintf(buf, (size_t)bufsize, "%ldm%02lds", s / 60, s % 60);
    else snprintf(buf, (size_t)bufsize, "%lds", s);
}

void progress_start(Progress *p, const char *label, const char *unit, uint64_t total) {
    p->label = label;
    p->unit = unit;
    p->total = total;
    p->done = 0;
    p->start_time = now_seconds();
    p->last_draw = 0;
    p->is_tty = isatty(fileno(stderr));
}

static void draw(Progress *p, const char *extra, int final) {
    double elapsed = now_seconds() - p->start_time;
    double rate = elapsed > 0 ? (double)p->done / elapsed : 0;
    char eta[32] = "?", took[32];
    format_duration(elapsed, took, sizeof took);
    if (p->total && rate > 0) format_duration((double)(p->total - (p->done < p->total ? p->done : p->total)) / rate, eta, sizeof eta);
    const char *lead = p->is_tty ? "\r\033[K" : "";
    if (p->total)
        fprintf(stderr, "%s%s %llu/%llu %s (%.1f%%) %.1f %s/s elapsed %s ETA %s%s%s", lead, p->label,
                (unsigned long long)p->done, (unsigned long long)p->total, p->unit,
                100.0 * (double)p->done / (double)p->total, rate, p->unit, took, final ? "0s" : eta,
                extra ? " " : "", extra ? extra : "");
    else
        fprintf(stderr, "%s%s %llu %s %.1f %s/s elapsed %s%s%s", lead, p->label, (unsigned long long)p->done,
                p->unit, rate, p->unit, took, extra ? " " : "", extra ? extra : "");
    if (!p->is_tty || final) fputc('\n', stderr);
    fflush(stderr);
}

void progress_update(Progress *p, uint64_t done, const char *extra) {
    p->done = done;
    double now = now_seconds();
    double interval = p->is_tty ? 0.1 : 5.0;
    if (now - p->last_draw < interval) return;
    p->last_draw = now;
    draw(p, extra, 0);
}

void progress_finish(Progress *p, const char *extra) { draw(p, extra, 1); }
