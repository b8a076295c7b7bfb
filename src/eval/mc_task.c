#include "eval/mc_task.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <zlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"

#define DEFAULT_UNCOND_OFFSET 1000000

// Whole file through zlib: gzread passes plain (non-gzip) files through unchanged.
static int read_maybe_gzip(const char *path, char **out, size_t *out_len) {
    gzFile gz = gzopen(path, "rb");
    if (!gz) return spes_fail("cannot open task file %s", path);
    size_t cap = 1 << 20, len = 0;
    char *buf = spes_malloc(cap);
    if (!buf) {
        gzclose(gz);
        return SPES_ERR;
    }
    for (;;) {
        if (cap - len < (1 << 16)) {
            char *bigger = spes_realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                gzclose(gz);
                return SPES_ERR;
            }
            buf = bigger;
            cap *= 2;
        }
        int n = gzread(gz, buf + len, (unsigned)(cap - len - 1));
        if (n < 0) {
            int errnum;
            const char *msg = gzerror(gz, &errnum);
            spes_fail("%s: read error (%s): is it a truncated or corrupt .gz file?", path, msg);
            free(buf);
            gzclose(gz);
            return SPES_ERR;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    gzclose(gz);
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return SPES_OK;
}

// Optional config.json beside the requests: task_name, primary_metric, uncond_docid_offset.
static int read_task_config(const char *dir, McTask *task, int64_t *uncond_offset) {
    char *path = path_join(dir, "config.json");
    if (!path) return SPES_ERR;
    if (!file_exists(path)) {
        free(path);
        return SPES_OK;
    }
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root || !json_is_object(root)) {
        spes_fail("%s:%d: not a JSON object (%s)", path, jerr.line, root ? "wrong type" : jerr.text);
        json_decref(root);
        free(path);
        return SPES_ERR;
    }
    // A key that is there with another type was silently ignored (an uncond_docid_offset of
    // "2000000" left the default 1000000): refused by name.
    json_t *name = json_object_get(root, "task_name"), *tc = json_object_get(root, "task_config");
    json_t *pm = json_object_get(tc, "primary_metric"), *mk = json_object_get(tc, "metric_kwargs");
    json_t *off = json_object_get(mk, "uncond_docid_offset");
    const char *wrong = name && !json_is_string(name) ? "task_name must be a string"
                        : tc && !json_is_object(tc)   ? "task_config must be an object"
                        : pm && !json_is_string(pm)   ? "task_config.primary_metric must be a string"
                        : mk && !json_is_object(mk)   ? "task_config.metric_kwargs must be an object"
                        : off && !json_is_integer(off) ? "task_config.metric_kwargs.uncond_docid_offset must be an integer"
                                                       : NULL;
    if (wrong) {
        spes_fail("%s: %s", path, wrong);
        json_decref(root);
        free(path);
        return SPES_ERR;
    }
    if (json_is_string(name)) {
        free(task->name);
        task->name = spes_strdup(json_string_value(name));
    }
    if (pm) task->primary_metric = spes_strdup(json_string_value(pm));
    int status = SPES_OK;
    if (off) *uncond_offset = json_integer_value(off);
    // doc_id - offset pairs unconditional requests with their documents: a positive offset
    // keeps that difference in range.
    if (*uncond_offset <= 0)
        status = spes_fail("%s: task_config.metric_kwargs.uncond_docid_offset must be positive (got %lld)", path,
                           (long long)*uncond_offset);
    json_decref(root);
    free(path);
    return status;
}

// One request line into *r; *gold gets label / doc.gold (-1 when neither is there).
static int parse_request_line(const char *line, size_t len, const char *path, int lineno, McRequest *r, int *gold) {
    json_error_t jerr;
    json_t *root = json_loadb(line, len, 0, &jerr);
    if (!root || !json_is_object(root)) {
        spes_fail("%s:%d: not a JSON object (%s)", path, lineno, root ? "wrong type" : jerr.text);
        json_decref(root);
        return SPES_ERR;
    }
    json_t *req = json_object_get(root, "request");
    json_t *ctx = req ? json_object_get(req, "context") : NULL;
    json_t *cont = req ? json_object_get(req, "continuation") : NULL;
    json_t *doc_id = json_object_get(root, "doc_id");
    json_t *idx = json_object_get(root, "idx");
    const char *missing = !json_is_string(ctx)        ? "request.context (string)"
                          : !json_is_string(cont)     ? "request.continuation (string)"
                          : !json_is_integer(doc_id)  ? "doc_id (integer)"
                          : !json_is_integer(idx)     ? "idx (integer)"
                                                      : NULL;
    json_t *rt = json_object_get(root, "request_type");
    if (!missing && rt && (!json_is_string(rt) || strcmp(json_string_value(rt), "loglikelihood") != 0))
        missing = "request_type \"loglikelihood\" (only multiple-choice log-likelihood requests are supported)";
    if (missing) {
        json_decref(root);
        return spes_fail("%s:%d: missing or malformed field %s", path, lineno, missing);
    }
    json_int_t idx_value = json_integer_value(idx);
    if (idx_value < 0 || idx_value > 1000000) {
        json_decref(root);
        return spes_fail("%s:%d: idx %lld out of range", path, lineno, (long long)idx_value);
    }
    *gold = -1;
    json_t *label = json_object_get(root, "label");
    json_t *doc = json_object_get(root, "doc");
    json_t *doc_gold = json_is_object(doc) ? json_object_get(doc, "gold") : NULL;
    // A label of another type (true, 0.0, "1") is an error here, not a missing label.
    const char *bad_label = label && !json_is_null(label) && !json_is_integer(label)             ? "label"
                            : doc_gold && !json_is_null(doc_gold) && !json_is_integer(doc_gold) ? "doc.gold"
                                                                                                 : NULL;
    if (bad_label) {
        json_decref(root);
        return spes_fail("%s:%d: %s must be an integer (the gold choice's idx)", path, lineno, bad_label);
    }
    json_t *gold_value = json_is_integer(label) ? label : json_is_integer(doc_gold) ? doc_gold : NULL;
    if (gold_value) {
        json_int_t g = json_integer_value(gold_value);
        if (g < -1 || g > 1000000) {   // would not fit the int (and no document has that many choices)
            json_decref(root);
            return spes_fail("%s:%d: gold label %lld out of range", path, lineno, (long long)g);
        }
        *gold = (int)g;
    }
    r->context = spes_strdup(json_string_value(ctx));
    r->continuation = spes_strdup(json_string_value(cont));
    r->doc_id = json_integer_value(doc_id);
    r->idx = (int)idx_value;
    json_decref(root);
    if (!r->context || !r->continuation) return SPES_ERR;
    return SPES_OK;
}

// doc_id -> index into the grouping's documents, open addressing (a scan back per request
// made a million-document file hours of work).
typedef struct {
    int64_t *keys;
    int *vals;    // -1: free slot
    size_t mask;
} DocIds;

static int doc_ids_init(DocIds *m, int n) {
    size_t size = 16;
    while (size < 2 * (size_t)n) size <<= 1;
    m->keys = spes_malloc(size * sizeof(int64_t));
    m->vals = spes_malloc(size * sizeof(int));
    m->mask = size - 1;
    if (!m->keys || !m->vals) return SPES_ERR;
    for (size_t i = 0; i < size; i++) m->vals[i] = -1;
    return SPES_OK;
}

// The slot holding key, or the free slot where it belongs.
static size_t doc_ids_slot(const DocIds *m, int64_t key) {
    size_t i = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    while (m->vals[i] >= 0 && m->keys[i] != key) i = (i + 1) & m->mask;
    return i;
}

// Groups requests by doc_id (in order of first appearance) into conditional / unconditional
// documents, checks every document has choices 0..n-1 exactly once and a gold index in range.
static int group_documents(McTask *task, const int *gold_of_request, int64_t uncond_offset, const char *path) {
    int n = task->num_requests;
    McDoc *docs = spes_calloc((size_t)n, sizeof(McDoc));
    int *doc_of_request = spes_calloc((size_t)n, sizeof(int));
    if (!docs || !doc_of_request) {
        free(docs);
        free(doc_of_request);
        return SPES_ERR;
    }
    int num_docs = 0;
    DocIds ids = {0};
    if (doc_ids_init(&ids, n) != SPES_OK) {
        free(ids.keys), free(ids.vals), free(docs), free(doc_of_request);
        return SPES_ERR;
    }
    for (int i = 0; i < n; i++) {
        size_t slot = doc_ids_slot(&ids, task->requests[i].doc_id);
        int d = ids.vals[slot];
        if (d < 0) {
            d = ids.vals[slot] = num_docs++;
            ids.keys[slot] = task->requests[i].doc_id;
            docs[d].doc_id = task->requests[i].doc_id;
            docs[d].gold = gold_of_request[i];
            docs[d].uncond = -1;
        }
        docs[d].num_choices++;
        doc_of_request[i] = d;
    }
    int status = SPES_OK;
    for (int d = 0; d < num_docs && status == SPES_OK; d++) {
        docs[d].request_of_choice = spes_malloc((size_t)docs[d].num_choices * sizeof(int));
        if (!docs[d].request_of_choice) status = SPES_ERR;
        else
            for (int c = 0; c < docs[d].num_choices; c++) docs[d].request_of_choice[c] = -1;
    }
    for (int i = 0; i < n && status == SPES_OK; i++) {
        McDoc *doc = &docs[doc_of_request[i]];
        int c = task->requests[i].idx;
        if (c >= doc->num_choices || doc->request_of_choice[c] >= 0)
            status = spes_fail("%s: doc_id %lld: choice idx %d is %s (the document has %d requests, idx must be "
                               "0..%d once each)", path, (long long)doc->doc_id, c,
                               c >= doc->num_choices ? "out of range" : "repeated", doc->num_choices,
                               doc->num_choices - 1);
        else
            doc->request_of_choice[c] = i;
        if (status == SPES_OK && gold_of_request[i] != doc->gold)
            status = spes_fail("%s: doc_id %lld: requests disagree on the gold label (%d vs %d)", path,
                               (long long)doc->doc_id, gold_of_request[i], doc->gold);
    }
    // Split conditional / unconditional documents.
    int num_cond = 0, num_uncond = 0;
    for (int d = 0; d < num_docs; d++) {
        if (docs[d].doc_id >= uncond_offset) num_uncond++;
        else num_cond++;
    }
    task->docs = spes_calloc((size_t)num_cond + 1, sizeof(McDoc));
    task->uncond_docs = spes_calloc((size_t)num_uncond + 1, sizeof(McDoc));
    if (!task->docs || !task->uncond_docs) status = SPES_ERR;
    // doc_of_request is reused as the index of each document in its new array.
    int *split_index = doc_of_request;
    for (int d = 0; d < num_docs; d++) {
        if (status != SPES_OK) {
            free(docs[d].request_of_choice);
            continue;
        }
        if (docs[d].doc_id >= uncond_offset) task->uncond_docs[split_index[d] = task->num_uncond_docs++] = docs[d];
        else task->docs[split_index[d] = task->num_docs++] = docs[d];
    }
    for (int d = 0; d < task->num_docs && status == SPES_OK; d++) {
        McDoc *doc = &task->docs[d];
        if (doc->gold < 0 || doc->gold >= doc->num_choices)
            status = spes_fail("%s: doc_id %lld: gold label %d is not one of its %d choices (need \"label\" or "
                               "\"doc\": {\"gold\"})", path, (long long)doc->doc_id, doc->gold, doc->num_choices);
    }
    // Every unconditional document must have its document: one without (e.g. real doc ids at or
    // above the offset) was silently dropped, down to a task scored over 0 documents.
    for (int u = 0; u < task->num_uncond_docs && status == SPES_OK; u++) {
        McDoc *ud = &task->uncond_docs[u];
        int j = ids.vals[doc_ids_slot(&ids, ud->doc_id - uncond_offset)];   // >= 0: no overflow
        if (j < 0 || docs[j].doc_id >= uncond_offset) {
            status = spes_fail("%s: doc_id %lld is at or above the unconditional doc_id offset %lld, but its document "
                               "(doc_id %lld) is not in the file; set task_config.metric_kwargs.uncond_docid_offset in "
                               "config.json if the doc ids are that large", path, (long long)ud->doc_id,
                               (long long)uncond_offset, (long long)(ud->doc_id - uncond_offset));
            break;
        }
        McDoc *doc = &task->docs[split_index[j]];
        if (ud->num_choices != doc->num_choices)
            status = spes_fail("%s: unconditional doc_id %lld has %d choices, its document %lld has %d", path,
                               (long long)ud->doc_id, ud->num_choices, (long long)doc->doc_id, doc->num_choices);
        doc->uncond = u;
        ud->gold = doc->gold;
    }
    free(ids.keys);
    free(ids.vals);
    free(docs);
    free(doc_of_request);
    return status;
}

// Keeps the first `limit` conditional documents and their unconditional partners; the
// requests array is left whole (unused entries are simply not scored).
static void apply_limit(McTask *task, int limit) {
    if (limit <= 0 || limit >= task->num_docs) return;
    for (int d = limit; d < task->num_docs; d++) free(task->docs[d].request_of_choice);
    task->num_docs = limit;
}

int mc_task_load(const char *path, int limit, McTask *task) {
    memset(task, 0, sizeof *task);
    char *file = NULL, *dir = NULL;
    if (dir_exists(path)) {
        dir = spes_strdup(path);
        file = path_join(path, "requests.jsonl.gz");
        if (file && !file_exists(file)) {
            free(file);
            file = path_join(path, "requests.jsonl");
        }
    } else {
        file = spes_strdup(path);
        dir = spes_strdup(path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash) *slash = '\0';
        else if (dir) strcpy(dir, ".");
    }
    if (!file || !dir) {
        free(file);
        free(dir);
        return SPES_ERR;
    }
    // Default name: the directory's last component.
    const char *base = strrchr(dir, '/');
    task->name = spes_strdup(base ? base + 1 : dir);
    int64_t uncond_offset = DEFAULT_UNCOND_OFFSET;
    char *text = NULL;
    size_t text_len = 0;
    int *gold = NULL;
    int status = read_task_config(dir, task, &uncond_offset);
    if (status == SPES_OK) status = read_maybe_gzip(file, &text, &text_len);
    if (status == SPES_OK) {
        size_t lines = 1;
        for (size_t i = 0; i < text_len; i++) lines += text[i] == '\n';
        task->requests = spes_calloc(lines, sizeof(McRequest));
        gold = spes_calloc(lines, sizeof(int));
        if (!task->requests || !gold) status = SPES_ERR;
    }
    int lineno = 0;
    for (size_t pos = 0; status == SPES_OK && pos < text_len;) {
        char *nl = memchr(text + pos, '\n', text_len - pos);
        size_t end = nl ? (size_t)(nl - text) : text_len;
        lineno++;
        size_t start = pos;
        pos = end + 1;
        while (start < end && (text[start] == ' ' || text[start] == '\t' || text[start] == '\r')) start++;
        if (start == end) continue;   // blank line
        int i = task->num_requests;
        status = parse_request_line(text + start, end - start, file, lineno, &task->requests[i], &gold[i]);
        if (status == SPES_OK) task->num_requests++;
        else {
            free(task->requests[i].context);
            free(task->requests[i].continuation);
        }
    }
    if (status == SPES_OK && task->num_requests == 0) status = spes_fail("%s: no requests in the file", file);
    if (status == SPES_OK) status = group_documents(task, gold, uncond_offset, file);
    if (status == SPES_OK) apply_limit(task, limit);
    free(text);
    free(gold);
    free(file);
    free(dir);
    if (status != SPES_OK) mc_task_free(task);
    return status;
}

void mc_task_free(McTask *task) {
    for (int i = 0; i < task->num_requests; i++) {
        free(task->requests[i].context);
        free(task->requests[i].continuation);
    }
    for (int d = 0; d < task->num_docs; d++) free(task->docs[d].request_of_choice);
    for (int d = 0; d < task->num_uncond_docs; d++) free(task->uncond_docs[d].request_of_choice);
    free(task->requests);
    free(task->docs);
    free(task->uncond_docs);
    free(task->name);
    free(task->primary_metric);
    memset(task, 0, sizeof *task);
}

int64_t utf8_char_count(const char *s) {
    int64_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (*p & 0xC0) != 0x80;
    return n;
}

// Normalisations of a choice's log-likelihood, one per accuracy variant.
typedef enum { NORM_RAW = 0, NORM_TOKEN, NORM_CHAR, NORM_BYTE, NORM_UNCOND, NORM_COUNT } Norm;

static double normalised_score(const McTask *task, const McScore *scores, const McDoc *doc, int c, Norm norm) {
    int r = doc->request_of_choice[c];
    double ll = scores[r].sum_logprob;
    const char *cont = task->requests[r].continuation;
    switch (norm) {
    case NORM_TOKEN: return ll / (scores[r].num_tokens > 0 ? scores[r].num_tokens : 1);
    case NORM_CHAR: {
        int64_t chars = utf8_char_count(cont);
        return ll / (double)(chars > 0 ? chars : 1);
    }
    case NORM_BYTE: {
        size_t bytes = strlen(cont);
        return ll / (double)(bytes > 0 ? bytes : 1);
    }
    case NORM_UNCOND: return ll - scores[task->uncond_docs[doc->uncond].request_of_choice[c]].sum_logprob;
    default: return ll;
    }
}

int mc_task_metrics(const McTask *task, const McScore *scores, McMetrics *out) {
    memset(out, 0, sizeof *out);
    out->num_docs = task->num_docs;
    out->predictions = spes_calloc((size_t)task->num_docs + 1, sizeof(int));
    if (!out->predictions) return SPES_ERR;
    int correct[NORM_COUNT] = {0};
    bool all_uncond = task->num_docs > 0;
    double gold_sum = 0;
    for (int d = 0; d < task->num_docs; d++) {
        const McDoc *doc = &task->docs[d];
        if (doc->uncond < 0) all_uncond = false;
        gold_sum += scores[doc->request_of_choice[doc->gold]].sum_logprob;
        for (int norm = 0; norm < NORM_COUNT; norm++) {
            if (norm == NORM_UNCOND && doc->uncond < 0) continue;
            int best = 0;
            double best_score = normalised_score(task, scores, doc, 0, (Norm)norm);
            for (int c = 1; c < doc->num_choices; c++) {
                double s = normalised_score(task, scores, doc, c, (Norm)norm);
                if (s > best_score) best = c, best_score = s;
            }
            correct[norm] += best == doc->gold;
            if (norm == NORM_RAW) out->predictions[d] = best;
        }
    }
    double n = task->num_docs > 0 ? task->num_docs : 1;
    out->acc_raw = correct[NORM_RAW] / n;
    out->acc_per_token = correct[NORM_TOKEN] / n;
    out->acc_per_char = correct[NORM_CHAR] / n;
    out->acc_per_byte = correct[NORM_BYTE] / n;
    out->acc_uncond = all_uncond ? correct[NORM_UNCOND] / n : NAN;
    out->gold_logprob = gold_sum / n;
    return SPES_OK;
}

const char *const MC_METRIC_NAMES[MC_NUM_METRICS] = {"acc_raw", "acc_per_token", "acc_per_char", "acc_per_byte",
                                                      "acc_uncond"};

double mc_metric(const McMetrics *m, int i) {
    const double v[MC_NUM_METRICS] = {m->acc_raw, m->acc_per_token, m->acc_per_char, m->acc_per_byte, m->acc_uncond};
    return v[i];
}

void mc_metrics_free(McMetrics *m) {
    free(m->predictions);
    m->predictions = NULL;
}
