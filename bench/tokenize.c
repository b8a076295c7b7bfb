// Tokenizer throughput: documents of FILE (separated by blank lines, "\n\n", as
// bench/tokenize_hf.py splits them) encoded without special tokens, in N worker processes
// (each its own encoder, contiguous shares of the documents). Prints MB/s of input text.
//
// usage: tokenize TOKENIZER FILE [PROCESSES]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/timer.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *text;
    size_t len;
} Doc;

// Splits on "\n\n" and drops empty pieces, like [d for d in text.split("\n\n") if d].
static size_t split_docs(const char *text, size_t len, Doc *docs) {
    size_t n = 0, start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || (i + 1 < len && text[i] == '\n' && text[i + 1] == '\n')) {
            if (i > start) docs[n++] = (Doc){text + start, i - start};
            if (i == len) break;
            start = i + 2;
            i++;
        }
    }
    return n;
}

static int encode_share(const Tokenizer *tok, const Doc *docs, size_t n, uint64_t *tokens) {
    TokenEncoder *enc;
    SPES_TRY(tokenizer_encoder_new(tok, &enc));
    IdBuffer ids = {0};
    int rc = SPES_OK;
    for (size_t i = 0; i < n && rc == SPES_OK; i++) {
        ids.len = 0;
        rc = tokenizer_encode(enc, docs[i].text, docs[i].len, &ids);
        *tokens += ids.len;
    }
    id_buffer_free(&ids);
    tokenizer_encoder_free(enc);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER FILE [PROCESSES]\n", argv[0]);
        return 2;
    }
    int procs = argc > 3 ? atoi(argv[3]) : 1;
    if (procs < 1 || procs > 64) procs = 1;
    Tokenizer *tok;
    uint8_t *text;
    size_t len;
    if (tokenizer_load(argv[1], &tok) != SPES_OK || file_read_all(argv[2], &text, &len) != SPES_OK) {
        fprintf(stderr, "tokenize bench: %s\n", spes_last_error());
        return 1;
    }
    Doc *docs = malloc(sizeof(Doc) * (len / 2 + 2));
    size_t ndocs = split_docs((const char *)text, len, docs);
    size_t text_bytes = 0;
    for (size_t i = 0; i < ndocs; i++) text_bytes += docs[i].len;
    // Per-process token counts come back through shared memory.
    uint64_t *tokens = mmap(NULL, sizeof(uint64_t) * (size_t)procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(tokens, 0, sizeof(uint64_t) * (size_t)procs);
    double t0 = now_seconds();
    size_t per = (ndocs + (size_t)procs - 1) / (size_t)procs;
    for (int p = 0; p < procs; p++) {
        size_t lo = (size_t)p * per < ndocs ? (size_t)p * per : ndocs, hi = lo + per < ndocs ? lo + per : ndocs;
        if (fork() == 0) _exit(encode_share(tok, docs + lo, hi - lo, &tokens[p]) == SPES_OK ? 0 : 1);
    }
    int ok = 1, status;
    while (wait(&status) > 0) ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    double secs = now_seconds() - t0;
    // CPU seconds of the workers: the per-core figure even when other jobs share the machine.
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
                 (double)ru.ru_stime.tv_usec * 1e-6;
    uint64_t total = 0;
    for (int p = 0; p < procs; p++) total += tokens[p];
    if (!ok) {
        fprintf(stderr, "tokenize bench: a worker failed\n");
        return 1;
    }
    printf("ours: %.1f MB in %zu docs, %llu tokens, %d process(es), %.2fs (%.2f CPU s): mb_s=%.2f mb_cpu_s=%.2f "
           "tokens=%llu\n", text_bytes / 1e6, ndocs, (unsigned long long)total, procs, secs, cpu, text_bytes / 1e6 / secs,
           text_bytes / 1e6 / cpu, (unsigned long long)total);
    tokenizer_free(tok);
    free(docs);
    free(text);
    return 0;
}
