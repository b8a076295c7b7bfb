// Multiple-choice tasks from OLMo / oe-eval request files (requests.jsonl[.gz]): one JSON
// object a line, {"request": {"context", "continuation"}, "doc_id", "idx", "label" or
// "doc": {"gold"}}, one line per (document, choice). Lines with doc_id >= the task's
// uncond_docid_offset (config.json metric_kwargs, default 1000000) are the unconditional
// requests ("Answer:" + choice) that acc_uncond divides out.
//
// Metrics follow oe-eval's MCAccuracy (the argmax takes the first index on ties, as np.argmax):
//   acc_raw        argmax_i sum_logprob_i
//   acc_per_token  argmax_i sum_logprob_i / num_tokens_i
//   acc_per_char   argmax_i sum_logprob_i / len(continuation_i) in Unicode characters
//                  (continuation incl. its leading space: lm-eval's acc_norm with the choice
//                  text = the continuation and target_delimiter "")
//   acc_per_byte   argmax_i sum_logprob_i / UTF-8 bytes of continuation_i
//   acc_uncond     argmax_i sum_logprob_i - sum_logprob_uncond_i (when the file has them)
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char *context;          // UTF-8
    char *continuation;     // UTF-8, usually with a leading space
    int64_t doc_id;
    int idx;                // choice index inside the document
} McRequest;

typedef struct {
    int64_t doc_id;
    int gold;               // index of the right choice
    int num_choices;
    int *request_of_choice; // [num_choices] index into McTask.requests
    int uncond;             // index into McTask.uncond_docs, -1 when absent
} McDoc;

typedef struct {
    char *name;             // task_name from config.json, else the file's directory name
    char *primary_metric;   // from config.json ("acc_per_char", "acc_raw", ...), may be NULL
    McRequest *requests;
    int num_requests;
    McDoc *docs;            // conditional documents, in file order of first appearance
    int num_docs;
    McDoc *uncond_docs;     // unconditional groups (gold copied from the conditional doc)
    int num_uncond_docs;
} McTask;

// path: a requests.jsonl / requests.jsonl.gz file, or a directory holding requests.jsonl.gz
// (and optionally config.json). limit > 0 keeps only the first `limit` documents. Bad lines
// are errors naming file:line and the field.
int mc_task_load(const char *path, int limit, McTask *task);
void mc_task_free(McTask *task);

// Model output for one request: sum of log P(continuation tokens | context) and their count.
typedef struct {
    double sum_logprob;
    int num_tokens;
} McScore;

typedef struct {
    int num_docs;
    double acc_raw, acc_per_token, acc_per_char, acc_per_byte;
    double acc_uncond;      // NaN when the task has no unconditional requests
    double gold_logprob;    // mean over documents of the right choice's sum_logprob: a continuous
                            // figure that moves with every weight (accuracies move in steps)
    int *predictions;       // [num_docs] acc_raw choice per document (owned, may be NULL)
} McMetrics;

// scores[num_requests], indexed like task->requests (unconditional ones included).
int mc_task_metrics(const McTask *task, const McScore *scores, McMetrics *out);
void mc_metrics_free(McMetrics *m);

// The five accuracies by index, for printing and logging them alike: MC_METRIC_NAMES[i] is
// "acc_raw", "acc_per_token", "acc_per_char", "acc_per_byte", "acc_uncond"; mc_metric(m, i)
// its value (acc_uncond NaN when the task has no unconditional requests).
#define MC_NUM_METRICS 5
extern const char *const MC_METRIC_NAMES[MC_NUM_METRICS];
double mc_metric(const McMetrics *m, int i);

// Unicode characters in a UTF-8 string (what Python's len() says).
int64_t utf8_char_count(const char *s);
