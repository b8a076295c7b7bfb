// libFuzzer harness: the oe-eval request-file parser (requests.jsonl, optionally gzip'd, plus
// config.json) on arbitrary bytes, then the metrics over made-up scores. The input is the
// requests file; bytes after a first NUL are the task's config.json.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "eval/mc_task.h"

static char dir[64];

static void remove_dir(void) { remove_tree(dir); }

// Plain write (no fsync: file_write_atomic's durability would make each run ~100x slower).
static void write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
}

static int in_unit_range(double x) { return x >= 0.0 && x <= 1.0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        log_set_level(LOG_ERROR);   // truncation warnings would flood the fuzzer output
        snprintf(dir, sizeof dir, "/dev/shm/fuzz_mc_task.XXXXXX");
        if (!mkdtemp(dir)) abort();
        atexit(remove_dir);
    }
    char requests[96], config[96];
    snprintf(requests, sizeof requests, "%s/requests.jsonl", dir);
    snprintf(config, sizeof config, "%s/config.json", dir);
    const uint8_t *nul = memchr(data, '\0', size);
    size_t requests_len = nul ? (size_t)(nul - data) : size;
    write_file(requests, data, requests_len);
    unlink(config);
    if (nul) write_file(config, nul + 1, size - requests_len - 1);

    McTask task;
    if (mc_task_load(dir, (int)(size % 5), &task) != 0) return 0;
    // Every document's choices must point at requests of that document.
    for (int d = 0; d < task.num_docs; d++) {
        const McDoc *doc = &task.docs[d];
        if (doc->num_choices <= 0 || doc->gold < 0 || doc->gold >= doc->num_choices) abort();
        for (int c = 0; c < doc->num_choices; c++) {
            int r = doc->request_of_choice[c];
            if (r < 0 || r >= task.num_requests || task.requests[r].doc_id != doc->doc_id) abort();
        }
    }
    McScore *scores = calloc((size_t)task.num_requests + 1, sizeof *scores);
    if (!scores) abort();
    for (int r = 0; r < task.num_requests; r++) scores[r] = (McScore){.sum_logprob = -(double)(r % 7), .num_tokens = 1 + r % 3};
    McMetrics m;
    if (mc_task_metrics(&task, scores, &m) == 0) {
        if (m.num_docs != task.num_docs || !in_unit_range(m.acc_raw) || !in_unit_range(m.acc_per_token) ||
            !in_unit_range(m.acc_per_char) || !in_unit_range(m.acc_per_byte) ||
            !(isnan(m.acc_uncond) || in_unit_range(m.acc_uncond)))
            abort();
        mc_metrics_free(&m);
    }
    free(scores);
    mc_task_free(&task);
    return 0;
}
