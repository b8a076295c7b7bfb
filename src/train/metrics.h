// Training metrics: the console line, save_folder/metrics.jsonl (one JSON object a line) and
// the same scalars as TensorBoard event files beside it (train/tfevents.h): tags
// "train/<key>" for the run's numbers, "perf/<key>" for those under "perf", and
// "eval/<label>/<key>" for evaluation lines, one Event per line at its step.
//
// A step line:
//   {"step":12,"loss":..,"ce":..,"lm_z":..,"lb":..,"router_z":..,"lr":..,"grad_norm":..,
//    "tokens":..,"route_min":..,"route_max":..[,"expert_tokens":[[layer 0 counts],..]],
//    "perf":{"step_s":..,"tokens_per_s":..,"mfu":..,"peak_rss_mb":..}}
// An evaluation line (lm evaluator; a downstream one has "docs" and its accuracies instead):
//   {"step":12,"eval":"label","ce":..,"perplexity":..,"tokens":..}
// Everything before "perf" is a pure function of the run (bit-exact on resume); "perf" is
// wall-clock. Floats are printed with enough digits to round-trip (%.9g / %.17g).
// route_min/route_max: the least/most loaded expert over all layers, as a multiple of the
// even share (tokens*k/E): 1.0 is perfect balance, 0 is a dead expert.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/append_log.h"
#include "model/model_config.h"
#include "eval/mc_task.h"
#include "train/tfevents.h"

typedef struct {
    int64_t step, max_steps;
    LossValues loss;            // unweighted terms + weighted total, mean over micro-batches
    double lr, grad_norm;       // grad_norm before clipping
    int64_t tokens_seen;
    bool instance_filter;       // data.instance_filter is on, and
    int64_t masked_instances;   // this step trained so many instances with no loss
    const int64_t *expert_counts;   // [L*E] tokens routed to each expert this step
    int n_layers, n_experts;
    // wall-clock (not reproducible)
    double step_seconds, tokens_per_second, mfu, eta_seconds, peak_rss_mb;
    double device_mem_mb, device_peak_mb;   // GPU memory in use / peak (0 on cpu)
    double loss_scale;          // amp_fp16 loss scale (0 when loss scaling is off)
    bool step_skipped;          // amp_fp16: the update was skipped (gradient overflow)
    bool clip_adaptive;         // max_grad_norm_ratio is set, and
    double clipping_rate;       // the share of trainable tensors it clipped (OLMo's optim/clipping_rate)
    int64_t failed_save_step;   // a save that failed since the newest checkpoint (0: none), and
    int64_t newest_checkpoint;  // that checkpoint's step (-1: none): on the console line, not in metrics.jsonl
} StepMetrics;

typedef struct {
    AppendLog file;             // metrics.jsonl
    char *path;
    TfEvents events;
    bool has_events;            // events is open
} MetricsLog;

// Opens save_folder/metrics.jsonl for appending, first dropping every line whose step is
// greater than keep_through_step (a resume from step N forgets what came after N; a fresh
// run passes 0 and starts an empty log); the event files are trimmed the same way and a new
// one is started (tfevents_open). Each line is handed to the kernel whole as it is written, in
// both files. Once open, neither file can fail the run: a line or record the disk does not take
// is lost, counted, and said once with its path and cause, and again when writing works again or
// at metrics_close (base/append_log.h); the write functions fail only when out of memory.
int metrics_open(MetricsLog *log, const char *save_folder, int64_t keep_through_step);
void metrics_close(MetricsLog *log);
// with_expert_counts: add the full [L][E] count table to the line.
int metrics_write_step(MetricsLog *log, const StepMetrics *s, bool with_expert_counts);
int metrics_write_eval(MetricsLog *log, int64_t step, const char *label, double ce, int64_t tokens);
// A downstream evaluator's line: {"step", "eval": label, "docs", "acc_raw", ..., ["acc_uncond"],
// "gold_logprob"}.
int metrics_write_downstream(MetricsLog *log, int64_t step, const char *label, const McMetrics *mm);

// Min and max expert load over all layers relative to the even share (see above).
void metrics_route_balance(const int64_t *counts, int n_layers, int n_experts, double *min_ratio,
                           double *max_ratio);
// The console line:
// "step 12/1000 | loss 3.2140 (ce 3.2010 lm_z 0 lb 1.0120 rz 0) | lr 3.00e-04 | gnorm 0.812 |
//  12.3k tok/s | MFU 3.1% | ETA 5m02s | rss 512MB | route 0.61-1.52x"
// and, after a save that failed until one works, "| UNSAVED since step 10 (save of 15 failed)".
void metrics_format_console(const StepMetrics *s, char *buf, int bufsize);
