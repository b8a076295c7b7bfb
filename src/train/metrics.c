// metrics.jsonl and the console line. See metrics.h.
#include "train/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/progress.h"
#include "train/tfevents.h"

// Step number of a line we wrote ({"step":N,...}); -1 for anything else.
static int64_t line_step(const char *line) {
    static const char key[] = "{\"step\":";
    if (strncmp(line, key, sizeof key - 1) != 0) return -1;
    char *end;
    long long v = strtoll(line + sizeof key - 1, &end, 10);
    return end == line + sizeof key - 1 ? -1 : v;
}

int metrics_open(MetricsLog *log, const char *save_folder, int64_t keep_through_step) {
    memset(log, 0, sizeof *log);
    if (!(log->path = path_join(save_folder, "metrics.jsonl"))) return SPES_ERR;
    // Keep the lines of steps <= keep_through_step, rewritten atomically.
    uint8_t *old = NULL;
    size_t old_len = 0;
    if (file_exists(log->path) && file_read_all(log->path, &old, &old_len) != SPES_OK) goto fail;
    char *kept = spes_malloc(old_len + 1);
    if (!kept) goto fail;
    size_t kept_len = 0;
    for (size_t at = 0; at < old_len;) {
        const char *line = (const char *)old + at;
        const char *nl = memchr(line, '\n', old_len - at);
        size_t len = nl ? (size_t)(nl - line) + 1 : old_len - at;
        int64_t step = line_step(line);
        if (nl && step >= 0 && step <= keep_through_step) {   // a torn last line is dropped too
            memcpy(kept + kept_len, line, len);
            kept_len += len;
        }
        at += len;
    }
    int rc = file_write_atomic(log->path, kept, kept_len);
    free(kept);
    free(old);
    old = NULL;
    if (rc != SPES_OK) goto fail;
    if (append_log_open(&log->file, log->path, "line", false, NULL, 0) != SPES_OK) goto fail;
    if (tfevents_open(&log->events, save_folder, keep_through_step) != SPES_OK) {
        append_log_close(&log->file);
        goto fail;
    }
    log->has_events = true;
    return SPES_OK;
fail:
    free(old);
    free(log->path);
    log->path = NULL;
    return spes_fail_context("metrics log in %s", save_folder);
}

void metrics_close(MetricsLog *log) {
    append_log_close(&log->file);
    if (log->has_events) tfevents_close(&log->events);
    free(log->path);
    memset(log, 0, sizeof *log);
}

// One number of a log line: its JSON key, how it is printed, and its TensorBoard tag. The
// same table writes both files, so every scalar of metrics.jsonl is in the event file.
typedef enum { FIELD_DOUBLE, FIELD_FLOAT, FIELD_FIXED4, FIELD_INT, FIELD_BOOL } FieldKind;
typedef struct {
    const char *key;
    FieldKind kind;
    double value;               // FIELD_INT: exact up to 2^53 (token counts, steps)
    bool perf;                  // inside "perf" (wall-clock), tag "perf/<key>"; else "train/<key>"
} Field;
#define MAX_STEP_FIELDS 24

// The scalars of a step line in their JSON order.
static int step_fields(const StepMetrics *s, Field *f) {
    int n = 0;
    f[n++] = (Field){"loss", FIELD_DOUBLE, s->loss.total, false};
    f[n++] = (Field){"ce", FIELD_DOUBLE, s->loss.ce, false};
    f[n++] = (Field){"lm_z", FIELD_DOUBLE, s->loss.lm_z, false};
    f[n++] = (Field){"lb", FIELD_DOUBLE, s->loss.lb, false};
    f[n++] = (Field){"router_z", FIELD_DOUBLE, s->loss.router_z, false};
    f[n++] = (Field){"lr", FIELD_DOUBLE, s->lr, false};
    f[n++] = (Field){"grad_norm", FIELD_DOUBLE, s->grad_norm, false};
    f[n++] = (Field){"tokens", FIELD_INT, (double)s->tokens_seen, false};
    if (s->instance_filter) f[n++] = (Field){"masked_instances", FIELD_INT, (double)s->masked_instances, false};
    if (s->clip_adaptive) f[n++] = (Field){"clipping_rate", FIELD_DOUBLE, s->clipping_rate, false};
    if (s->loss_scale > 0) {
        f[n++] = (Field){"loss_scale", FIELD_DOUBLE, s->loss_scale, false};
        f[n++] = (Field){"step_skipped", FIELD_BOOL, s->step_skipped, false};
    }
    if (s->expert_counts) {
        double lo, hi;
        metrics_route_balance(s->expert_counts, s->n_layers, s->n_experts, &lo, &hi);
        f[n++] = (Field){"route_min", FIELD_DOUBLE, lo, false};
        f[n++] = (Field){"route_max", FIELD_DOUBLE, hi, false};
    }
    f[n++] = (Field){"step_s", FIELD_FIXED4, s->step_seconds, true};
    f[n++] = (Field){"tokens_per_s", FIELD_FLOAT, s->tokens_per_second, true};
    f[n++] = (Field){"mfu", FIELD_FLOAT, s->mfu, true};
    f[n++] = (Field){"peak_rss_mb", FIELD_FLOAT, s->peak_rss_mb, true};
    if (s->device_peak_mb > 0) {
        f[n++] = (Field){"gpu_mem_mb", FIELD_FLOAT, s->device_mem_mb, true};
        f[n++] = (Field){"gpu_peak_mb", FIELD_FLOAT, s->device_peak_mb, true};
    }
    return n;
}

// ",\"key\":value" (no comma when first). JSON has no NaN/inf: those become null.
static void put_field(FILE *fp, const Field *f, bool first) {
    fprintf(fp, first ? "\"%s\":" : ",\"%s\":", f->key);
    if (f->kind == FIELD_INT)
        fprintf(fp, "%" PRId64, (int64_t)f->value);
    else if (f->kind == FIELD_BOOL)
        fputs(f->value != 0 ? "true" : "false", fp);
    else if (!isfinite(f->value))
        fputs("null", fp);
    else
        fprintf(fp, f->kind == FIELD_FIXED4 ? "%.4f" : f->kind == FIELD_FLOAT ? "%.9g" : "%.17g", f->value);
}

// A line is built in memory (start_line) and appended whole (end_line): a full disk loses it
// whole, counted (base/append_log.h), and never fails the run. NULL (said) when out of memory.
static FILE *start_line(char **buf, size_t *len, int64_t step) {
    *buf = NULL;
    *len = 0;
    FILE *fp = open_memstream(buf, len);
    if (!fp) log_warn("metrics line of step %" PRId64 " not written: %s", step, strerror(errno));
    return fp;
}

// (buf and len are the memory stream's: set by its fclose)
static void end_line(MetricsLog *log, FILE *fp, char **buf, const size_t *len, int64_t step) {
    fputc('\n', fp);
    if (fclose(fp) == 0) append_log_write(&log->file, *buf, *len, step);
    else log_warn("metrics line of step %" PRId64 " not written: %s", step, strerror(errno));
    free(*buf);
}

// The line's fields as one TensorBoard Event at step ("<prefix><key>" tags).
static int write_event(MetricsLog *log, int64_t step, const Field *f, int n, const char *train_prefix) {
    if (!log->has_events) return SPES_OK;
    char tags[MAX_STEP_FIELDS][160];
    TfScalar scalars[MAX_STEP_FIELDS];
    for (int i = 0; i < n; i++) {
        snprintf(tags[i], sizeof tags[i], "%s%s", f[i].perf ? "perf/" : train_prefix, f[i].key);
        scalars[i] = (TfScalar){tags[i], f[i].value};
    }
    return tfevents_write_scalars(&log->events, step, tfevents_wall_clock(), scalars, n);
}

void metrics_route_balance(const int64_t *counts, int n_layers, int n_experts, double *min_ratio,
                           double *max_ratio) {
    *min_ratio = INFINITY;
    *max_ratio = 0;
    for (int l = 0; l < n_layers; l++) {
        int64_t total = 0;
        for (int e = 0; e < n_experts; e++) total += counts[l * n_experts + e];
        if (total == 0) continue;
        for (int e = 0; e < n_experts; e++) {
            double r = (double)counts[l * n_experts + e] * n_experts / (double)total;
            *min_ratio = fmin(*min_ratio, r);
            *max_ratio = fmax(*max_ratio, r);
        }
    }
    if (*min_ratio == INFINITY) *min_ratio = 0;
}

int metrics_write_step(MetricsLog *log, const StepMetrics *s, bool with_expert_counts) {
    Field f[MAX_STEP_FIELDS];
    int n = step_fields(s, f), i = 0;
    char *buf;
    size_t len;
    FILE *fp = start_line(&buf, &len, s->step);
    if (!fp) return SPES_OK;
    fprintf(fp, "{\"step\":%" PRId64, s->step);
    for (; i < n && !f[i].perf; i++) put_field(fp, &f[i], false);
    if (s->expert_counts && with_expert_counts) {
        fputs(",\"expert_tokens\":[", fp);
        for (int l = 0; l < s->n_layers; l++) {
            fputs(l ? ",[" : "[", fp);
            for (int e = 0; e < s->n_experts; e++)
                fprintf(fp, e ? ",%" PRId64 : "%" PRId64, s->expert_counts[l * s->n_experts + e]);
            fputc(']', fp);
        }
        fputc(']', fp);
    }
    fputs(",\"perf\":{", fp);
    for (int first = i; i < n; i++) put_field(fp, &f[i], i == first);
    fputc('}', fp);
    fputc('}', fp);
    end_line(log, fp, &buf, &len, s->step);
    return write_event(log, s->step, f, n, "train/");
}

// One evaluator's line and its event: {"step", "eval": label, fields...}, tags eval/<label>/<key>.
static int write_eval_fields(MetricsLog *log, int64_t step, const char *label, const Field *f, int n) {
    char *buf;
    size_t len;
    FILE *fp = start_line(&buf, &len, step);
    if (!fp) return SPES_OK;
    fprintf(fp, "{\"step\":%" PRId64 ",\"eval\":\"", step);
    for (const char *c = label; *c; c++)   // labels come from the config: escape what JSON needs
        if (*c == '"' || *c == '\\')
            fprintf(fp, "\\%c", *c);
        else if ((unsigned char)*c < 0x20)
            fprintf(fp, "\\u%04x", *c);
        else
            fputc(*c, fp);
    fputc('"', fp);
    for (int i = 0; i < n; i++) put_field(fp, &f[i], false);
    fputc('}', fp);
    end_line(log, fp, &buf, &len, step);
    char prefix[128];   // "eval/<label>/": TensorBoard groups tags by their first part
    snprintf(prefix, sizeof prefix, "eval/%s/", label);
    return write_event(log, step, f, n, prefix);
}

int metrics_write_eval(MetricsLog *log, int64_t step, const char *label, double ce, int64_t tokens) {
    Field f[3] = {{"ce", FIELD_DOUBLE, ce, false},
                  {"perplexity", FIELD_DOUBLE, exp(ce), false},
                  {"tokens", FIELD_INT, (double)tokens, false}};
    return write_eval_fields(log, step, label, f, 3);
}

int metrics_write_downstream(MetricsLog *log, int64_t step, const char *label, const McMetrics *mm) {
    Field f[2 + MC_NUM_METRICS] = {{"docs", FIELD_INT, (double)mm->num_docs, false}};
    int n = 1;
    for (int i = 0; i < MC_NUM_METRICS; i++)   // acc_uncond only where the task has it
        if (!isnan(mc_metric(mm, i))) f[n++] = (Field){MC_METRIC_NAMES[i], FIELD_DOUBLE, mc_metric(mm, i), false};
    f[n++] = (Field){"gold_logprob", FIELD_DOUBLE, mm->gold_logprob, false};
    return write_eval_fields(log, step, label, f, n);
}

static void format_count(double v, char *buf, int n) {
    if (v >= 1e6)
        snprintf(buf, (size_t)n, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, (size_t)n, "%.1fk", v / 1e3);
    else
        snprintf(buf, (size_t)n, "%.0f", v);
}

void metrics_format_console(const StepMetrics *s, char *buf, int bufsize) {
    char tps[32], eta[32], route[48] = "";
    format_count(s->tokens_per_second, tps, sizeof tps);
    format_duration(s->eta_seconds, eta, sizeof eta);
    if (s->expert_counts) {
        double lo, hi;
        metrics_route_balance(s->expert_counts, s->n_layers, s->n_experts, &lo, &hi);
        snprintf(route, sizeof route, " | route %.2f-%.2fx", lo, hi);
    }
    char device[64] = "", scale[48] = "", masked[40] = "";
    if (s->device_peak_mb > 0)
        snprintf(device, sizeof device, " | gpu %.1f/%.1fGB", s->device_mem_mb / 1024, s->device_peak_mb / 1024);
    if (s->loss_scale > 0)
        snprintf(scale, sizeof scale, " | scale %g%s", s->loss_scale, s->step_skipped ? " (skipped)" : "");
    if (s->masked_instances > 0) snprintf(masked, sizeof masked, " | masked %" PRId64, s->masked_instances);
    char unsaved[96] = "";
    if (s->failed_save_step > 0 && s->newest_checkpoint >= 0)
        snprintf(unsaved, sizeof unsaved, " | UNSAVED since step %" PRId64 " (save of %" PRId64 " failed)",
                 s->newest_checkpoint, s->failed_save_step);
    else if (s->failed_save_step > 0)
        snprintf(unsaved, sizeof unsaved, " | UNSAVED: no checkpoint yet (save of %" PRId64 " failed)",
                 s->failed_save_step);
    snprintf(buf, (size_t)bufsize,
             "step %" PRId64 "/%" PRId64 " | loss %.4f (ce %.4f lm_z %.4g lb %.4f rz %.4g) | lr %.2e | gnorm %.3f | "
             "%s tok/s | MFU %.1f%% | ETA %s | rss %.0fMB%s%s%s%s%s",
             s->step, s->max_steps, s->loss.total, s->loss.ce, s->loss.lm_z, s->loss.lb, s->loss.router_z, s->lr,
             s->grad_norm, tps, 100 * s->mfu, eta, s->peak_rss_mb, device, scale, masked, route, unsaved);
}
