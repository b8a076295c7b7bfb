// `spes eval`: perplexity / loss / bits per byte on tokens or text, and multiple-choice
// accuracy on OLMo / oe-eval request files; a summary on stdout, JSON with --output.
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/threads.h"
#include "base/timer.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "eval/mc_score.h"
#include "eval/mc_task.h"
#include "eval/perplexity.h"
#include "io/npy.h"
#include "model/hf_import.h"

#define MAX_TASKS 64

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes eval --model DIR [--tokens FILE | --text FILE] [--task PATH ...] [options]\n"
            "\n"
            "Perplexity (windows of --seq tokens, every token but the first predicted once):\n"
            "  --tokens FILE        token file (raw uint16/uint32 as `spes tokenize` writes, or .npy)\n"
            "  --dtype D            uint16 (default) | uint32, for raw token files\n"
            "  --text FILE          raw UTF-8 text, tokenized with --tokenizer\n"
            "  --seq N              window (default: the model's max_position_embeddings, at most 2048)\n"
            "  --batch B            windows per forward (default 4)\n"
            "  --max_tokens N       only the first N tokens\n"
            "Multiple choice (OLMo / oe-eval requests.jsonl.gz; acc, acc_per_token/char/byte, acc_uncond):\n"
            "  --task PATH          a task directory (requests.jsonl.gz + config.json) or a .jsonl[.gz]\n"
            "                       file; repeat for several tasks\n"
            "  --limit N            only the first N documents of each task\n"
            "  --max_seq N          context window for scoring (default as --seq)\n"
            "Common:\n"
            "  --model DIR          model directory (checkpoint step, export, upcycle or HF OLMoE/Qwen3-MoE)\n"
            "  --tokenizer T        tokenizer.json, a directory holding one, or 'bytes' (needed for --text\n"
            "                       and --task; with --tokens it adds bits per byte; default: the model\n"
            "                       directory when it holds a tokenizer.json)\n"
            "  --output FILE        results as JSON\n"
            "  --output_requests F  every scored request as a JSON line: task, doc_id, idx, sum_logprob,\n"
            "                       num_tokens (to compare per-choice log-likelihoods with other tools)\n"
            "  --threads N          CPU threads (default: all cores)\n"
            CLI_DEVICE_HELP
            "  --no_progress        no progress line\n");
}

// TokenStream reader of ids in memory (token files: token_stream_of_file).
static int read_id_buffer(void *ctx, uint64_t start, size_t n, uint32_t *dst) {
    const IdBuffer *b = ctx;
    if (start + n > b->len) return spes_fail("token range %llu+%zu past the end", (unsigned long long)start, n);
    memcpy(dst, b->ids + start, n * sizeof(uint32_t));
    return SPES_OK;
}

static json_t *number_or_null(double v) { return isnan(v) ? json_null() : json_real(v); }

static int run_perplexity(Model *m, const char *tokens_path, TokenDtype dtype, const char *text_path,
                          const Tokenizer *tok, const PerplexityOptions *popt, json_t *results) {
    TokenFile tf;
    IdBuffer ids = {0};
    TokenStream stream;
    int status;
    if (tokens_path) {
        SPES_TRY(token_file_open(tokens_path, dtype, &tf));
        stream = token_stream_of_file(&tf);
    } else {
        uint8_t *text;
        size_t len;
        SPES_TRY(file_read_all(text_path, &text, &len));
        TokenEncoder *enc = NULL;
        status = tokenizer_encoder_new(tok, &enc);
        if (status == SPES_OK) status = tokenizer_encode(enc, (const char *)text, len, &ids);
        tokenizer_encoder_free(enc);
        free(text);
        if (status != SPES_OK) {
            id_buffer_free(&ids);
            return spes_fail_context("tokenizing %s", text_path);
        }
        stream = (TokenStream){.count = ids.len, .read = read_id_buffer, .ctx = &ids};
    }
    PerplexityResult r;
    status = eval_perplexity(m, &stream, popt, &r);
    if (tokens_path) token_file_close(&tf);
    id_buffer_free(&ids);
    SPES_TRY(status);
    printf("perplexity: source=%s tokens=%llu loss=%.6f ppl=%.4f", tokens_path ? tokens_path : text_path,
           (unsigned long long)r.tokens, r.loss, r.perplexity);
    if (!isnan(r.bits_per_byte)) printf(" bits_per_byte=%.6f", r.bits_per_byte);
    printf(" tok_s=%.1f\n", r.tokens / (r.seconds > 0 ? r.seconds : 1e-9));
    json_object_set_new(results, "perplexity",
                        json_pack("{s:s, s:I, s:I, s:f, s:f, s:o, s:i, s:f}", "source",
                                  tokens_path ? tokens_path : text_path, "tokens", (json_int_t)r.tokens, "bytes",
                                  (json_int_t)r.bytes, "loss", r.loss, "perplexity", r.perplexity, "bits_per_byte",
                                  number_or_null(r.bits_per_byte), "seq", popt->seq, "seconds", r.seconds));
    return SPES_OK;
}

// One JSON line per scored request (documents kept by --limit and their unconditional twins).
static int write_request_scores(AtomicFile *out, const McTask *task, const McScore *scores) {
    for (int r = 0; r < task->num_requests; r++) {
        if (scores[r].num_tokens == 0) continue;   // not scored (beyond --limit)
        const McRequest *q = &task->requests[r];
        json_t *line = json_pack("{s:s, s:I, s:i, s:f, s:i}", "task", task->name, "doc_id", (json_int_t)q->doc_id,
                                 "idx", q->idx, "sum_logprob", scores[r].sum_logprob, "num_tokens", scores[r].num_tokens);
        char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
        json_decref(line);
        if (!text) return spes_fail("cannot serialise the request scores of %s", task->name);
        int status = atomic_file_write(out, text, strlen(text));
        if (status == SPES_OK) status = atomic_file_write(out, "\n", 1);
        free(text);
        SPES_TRY(status);
    }
    return SPES_OK;
}

static int run_task(Model *m, const Tokenizer *tok, const char *path, int limit, const McScoreOptions *mopt,
                    AtomicFile *requests_out, json_t *tasks) {
    McTask task;
    SPES_TRY(mc_task_load(path, limit, &task));
    McScore *scores = spes_calloc((size_t)task.num_requests, sizeof(McScore));
    McMetrics mm = {0};
    double start = now_seconds();
    int status = scores ? mc_task_score(m, tok, &task, mopt, scores) : SPES_ERR;
    if (status == SPES_OK) status = mc_task_metrics(&task, scores, &mm);
    if (status == SPES_OK && requests_out) status = write_request_scores(requests_out, &task, scores);
    double seconds = now_seconds() - start;
    if (status == SPES_OK) {
        printf("task %s: docs=%d", task.name, mm.num_docs);
        json_t *t = json_object();
        json_object_set_new(t, "path", json_string(path));
        json_object_set_new(t, "num_docs", json_integer(mm.num_docs));
        for (int i = 0; i < MC_NUM_METRICS; i++) {
            double v = mc_metric(&mm, i);
            if (!isnan(v)) printf(" %s=%.4f", MC_METRIC_NAMES[i], v);
            json_object_set_new(t, MC_METRIC_NAMES[i], number_or_null(v));
        }
        // The task's primary metric (config.json), "acc" and "acc_norm" aliases like lm-eval.
        json_object_set_new(t, "gold_logprob", json_real(mm.gold_logprob));
        json_object_set_new(t, "acc", json_real(mm.acc_raw));
        json_object_set_new(t, "acc_norm", json_real(mm.acc_per_char));
        if (task.primary_metric) {
            json_object_set_new(t, "primary_metric", json_string(task.primary_metric));
            json_t *pv = json_object_get(t, task.primary_metric);
            if (pv) json_object_set(t, "primary_score", pv);
            else log_warn("task %s: primary_metric \"%s\" (config.json) is not a metric spes eval computes: the results "
                          "have no primary_score", task.name, task.primary_metric);
        }
        json_object_set_new(t, "seconds", json_real(seconds));
        printf(" (%.1f s)\n", seconds);
        json_object_set_new(tasks, task.name, t);
    }
    mc_metrics_free(&mm);
    free(scores);
    mc_task_free(&task);
    return status;
}

// Into `out`, opened (and so checked) before the evaluation; committed only when complete.
static int write_results(AtomicFile *out, json_t *results) {
    char *text = json_dumps(results, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) return spes_fail("cannot serialise the results");
    int status = atomic_file_write(out, text, strlen(text));
    free(text);
    return status == SPES_OK ? atomic_file_commit(out) : SPES_ERR;
}

// --output and --output_requests are created before any work, so a bad path fails at once and
// not after a whole evaluation. Both are written atomically (temp + fsync + rename): a failed
// run (a full disk) leaves neither, nor a torn request-scores file that looks whole.
static int open_outputs(const char *output, AtomicFile *out, const char *requests_path, AtomicFile *requests_out) {
    if (output && dir_exists(output)) return spes_fail("--output %s is a directory; give a file name", output);
    if (output && atomic_file_open(out, output) != SPES_OK) return spes_fail_context("--output");
    if (requests_path && atomic_file_open(requests_out, requests_path) != SPES_OK) {
        if (output) atomic_file_abort(out);
        return spes_fail_context("--output_requests");
    }
    return SPES_OK;
}

int cmd_eval(int argc, char **argv) {
    static const struct option options[] = {
        {"model", required_argument, 0, 'm'},      {"tokens", required_argument, 0, 'T'},
        {"dtype", required_argument, 0, 'd'},      {"text", required_argument, 0, 'x'},
        {"seq", required_argument, 0, 's'},        {"batch", required_argument, 0, 'b'},
        {"max_tokens", required_argument, 0, 'n'}, {"task", required_argument, 0, 'k'},
        {"limit", required_argument, 0, 'l'},      {"max_seq", required_argument, 0, 'w'},
        {"tokenizer", required_argument, 0, 't'},  {"output", required_argument, 0, 'o'},
        {"threads", required_argument, 0, 'j'},    {"no_progress", no_argument, 0, 'P'},
        {"device", required_argument, 0, 'D'},     {"precision", required_argument, 0, 'X'},
        {"output_requests", required_argument, 0, 'R'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *model_dir = NULL, *tokens = NULL, *text = NULL, *tok_path = NULL, *output = NULL;
    const char *requests_path = NULL, *device = NULL, *precision = NULL;
    const char *tasks[MAX_TASKS];
    int num_tasks = 0, seq = 0, batch = 4, limit = 0, max_seq = 0, threads = 0, c, status = SPES_OK;
    bool progress = true;
    uint64_t max_tokens = 0;
    TokenDtype dtype = TOKEN_U16;
    optind = 1;
    while (status == SPES_OK && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'T': tokens = optarg; break;
        case 'd': status = token_dtype_parse_raw(optarg, &dtype); break;
        case 'x': text = optarg; break;
        case 's': status = cli_int("seq", optarg, 1, 1 << 24, &seq); break;
        case 'b': status = cli_int("batch", optarg, 1, 1 << 16, &batch); break;
        case 'n': status = cli_u64("max_tokens", optarg, &max_tokens); break;
        case 'k':
            if (num_tasks == MAX_TASKS) status = spes_fail("at most %d --task flags", MAX_TASKS);
            else tasks[num_tasks++] = optarg;
            break;
        case 'l': status = cli_int("limit", optarg, 0, 1 << 30, &limit); break;
        case 'w': status = cli_int("max_seq", optarg, 2, 1 << 24, &max_seq); break;
        case 't': tok_path = optarg; break;
        case 'o': output = optarg; break;
        case 'R': requests_path = optarg; break;
        case 'j': status = cli_int("threads", optarg, 1, 4096, &threads); break;
        case 'D': device = optarg; break;
        case 'X': precision = optarg; break;
        case 'P': progress = false; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (status != SPES_OK) return cli_report_error();
    if (!model_dir || optind < argc || (tokens && text) || (!tokens && !text && num_tasks == 0)) {
        usage(stderr);
        return 2;
    }
    if (!tok_path) tok_path = cli_default_tokenizer(model_dir);
    if ((text || num_tasks > 0) && !tok_path) {
        spes_fail("--text and --task need --tokenizer");
        return cli_report_error();
    }
    threads_set(threads);
    AtomicFile out_file = {0}, requests_file = {0};
    AtomicFile *requests_out = requests_path ? &requests_file : NULL;
    if (open_outputs(output, &out_file, requests_path, &requests_file) != SPES_OK) return cli_report_error();
    Tokenizer *tok = NULL;
    Model m;
    if ((tok_path && tokenizer_load(tok_path, &tok) != SPES_OK) || cli_load_model(model_dir, device, precision, &m) != SPES_OK) {
        tokenizer_free(tok);
        atomic_file_abort(&out_file);
        atomic_file_abort(&requests_file);
        return cli_report_error();
    }
    int window = m.cfg.max_seq_len < 2048 ? m.cfg.max_seq_len : 2048;
    json_t *results = json_object();
    json_object_set_new(results, "model", json_string(model_dir));
    if (tokens || text) {
        PerplexityOptions popt = {.seq = seq > 0 ? seq : window, .batch = batch, .max_tokens = max_tokens,
                                  .tok = tok, .show_progress = progress};
        status = run_perplexity(&m, tokens, dtype, text, tok, &popt, results);
    }
    json_t *task_results = json_object();
    McScoreOptions mopt = {.max_seq = max_seq > 0 ? max_seq : (seq > 0 ? seq : window), .show_progress = progress};
    for (int i = 0; i < num_tasks && status == SPES_OK; i++)
        status = run_task(&m, tok, tasks[i], limit, &mopt, requests_out, task_results);
    if (requests_out && status == SPES_OK) status = atomic_file_commit(requests_out);
    json_object_set_new(results, "tasks", task_results);
    if (status == SPES_OK && output) status = write_results(&out_file, results);
    atomic_file_abort(&out_file);   // a no-op after the commit
    atomic_file_abort(&requests_file);
    json_decref(results);
    cli_free_model(&m);
    tokenizer_free(tok);
    return status == SPES_OK ? 0 : cli_report_error();
}
