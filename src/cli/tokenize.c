// `spes tokenize`: the C equivalent of SPES's data_process_scripts/tokenize_data.py.
//
// Files = sorted(glob(--file_glob)), cut into --processes contiguous chunks exactly like the
// script's chunk_list (or groups of --files_per_process); chunk i is tokenized by worker process
// i into {output_prefix}{i:03d}_{shard:06d}.npy (raw little-endian ids, no header). Every
// document is stripped and cleaned like the script does (tokenizer_doc_clean.h), encoded without
// special tokens, and followed by EOS unless --no_eos. Unlike the script, documents keep their
// input order (the script shuffles each batch with an unseeded RNG, so no run of it is
// reproducible) and a shard never exceeds --max_shard_bytes unless one document alone does.
//
// A run that fails (a full disk, a bad input, a worker that died, SIGINT/SIGTERM) stops its
// other workers and removes every shard it wrote, committed ones included: each shard is whole
// (temp + fsync + rename), but a partial set would pass for a dataset, and a rerun would refuse
// the prefix for holding shards of an earlier run. The console is only a view: with its reader
// gone (`spes tokenize ... 2>&1 | head -1`) the run goes on (SIGPIPE ignored; lines are lost).
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/progress.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "documents/doc_reader.h"
#include "data/token_writer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_doc_clean.h"

#define MAX_MALFORMED_REPORTS 20

typedef struct {
    const char *file_glob, *tokenizer, *output_prefix, *text_field, *dump_ids, *dump_decoded;
    int processes, files_per_process, batch_size, dtype_bytes, no_eos;
    uint64_t max_shard_bytes;
    uint64_t max_doc_bytes;   // longer documents (records) are skipped, named by file:line
    int64_t eos_id;           // -1: the tokenizer's
} TokenizeArgs;

// Per-worker counters in memory shared with the parent (one writer each, read for progress).
typedef struct {
    uint64_t files_done, docs, tokens, file_bytes, text_bytes, malformed, dropped, shards;
    int failed;
    char error[1024];
} WorkerStats;

#define STAT_SET(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)
#define STAT_GET(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes tokenize --file_glob GLOB --tokenizer_name_or_path PATH|bytes --output_prefix PREFIX\n"
            "                     [--text_field text] [--processes 1] [--files_per_process N] [--batch_size 500]\n"
            "                     [--max_shard_bytes 4294967296] [--dtype uint32|uint16] [--no_eos] [--eos_id N]\n"
            "                     [--max_doc_bytes 33554432]\n"
            "       spes tokenize --dump_ids FILE --tokenizer_name_or_path PATH [--dump_decoded OUT]\n"
            "                     (testing: ids of FILE encoded as one document, one per line on stdout;\n"
            "                     OUT gets decode(ids))\n\n"
            "--batch_size is accepted for command-line compatibility with the script and has no effect (documents\n"
            "stream one at a time, in input order; the script shuffles each batch with an unseeded RNG).\n"
            "Inputs: .jsonl .json .jsonl.gz .json.gz .jsonl.zst .parquet .txt. Output: {prefix}{proc:03d}_{shard:06d}.npy,\n"
            "raw little-endian token ids without header (SPES tokenize_data.py format); a prefix that already has\n"
            "such shards is refused (a rerun would leave stale ones among the new). EOS per document: the\n"
            "tokenizer's eos_token as AutoTokenizer reads it (special_tokens_map.json or tokenizer_config.json;\n"
            "where neither gives the key, <|endoftext|>, </s>, ...); built-in 'bytes' uses 256.\n"
            "--max_doc_bytes bounds memory per document (a worker holds about 5x it): a longer JSON line or entry,\n"
            "parquet value or .txt file is skipped with a warning naming file:line, and counted (at most 256 MiB).\n");
}

static int parse_u64(const char *flag, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-') return spes_fail("%s: \"%s\" is not a non-negative integer", flag, v);
    *out = x;
    return SPES_OK;
}

static int parse_int(const char *flag, const char *v, int min, int *out) {
    uint64_t x = 0;
    SPES_TRY(parse_u64(flag, v, &x));
    if (x < (uint64_t)min || x > 1000000) return spes_fail("%s must be between %d and 1000000, not %s", flag, min, v);
    *out = (int)x;
    return SPES_OK;
}

static int parse_args(int argc, char **argv, TokenizeArgs *a) {
    *a = (TokenizeArgs){.text_field = "text", .processes = 1, .batch_size = 500, .dtype_bytes = 4,
                        .max_shard_bytes = 4ull << 30, .max_doc_bytes = DOC_READER_MAX_DOC_BYTES, .eos_id = -1};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--no_eos")) {
            a->no_eos = 1;
            continue;
        }
        if (strncmp(arg, "--", 2)) return spes_fail("unexpected argument \"%s\" (see --help)", arg);
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return spes_fail("%s needs a value", arg);
#define IS(name) (name_len == strlen(name) && !strncmp(arg, name, name_len))
        if (IS("--file_glob")) a->file_glob = v;
        else if (IS("--tokenizer_name_or_path")) a->tokenizer = v;
        else if (IS("--output_prefix")) a->output_prefix = v;
        else if (IS("--text_field")) a->text_field = v;
        else if (IS("--dump_ids")) a->dump_ids = v;
        else if (IS("--dump_decoded")) a->dump_decoded = v;
        else if (IS("--processes")) SPES_TRY(parse_int("--processes", v, 1, &a->processes));
        else if (IS("--files_per_process")) SPES_TRY(parse_int("--files_per_process", v, 1, &a->files_per_process));
        else if (IS("--batch_size")) SPES_TRY(parse_int("--batch_size", v, 1, &a->batch_size));
        else if (IS("--max_shard_bytes")) SPES_TRY(parse_u64("--max_shard_bytes", v, &a->max_shard_bytes));
        else if (IS("--max_doc_bytes")) {
            SPES_TRY(parse_u64("--max_doc_bytes", v, &a->max_doc_bytes));
            if (a->max_doc_bytes < 1 || a->max_doc_bytes > DOC_READER_MAX_DOC_BYTES_LIMIT)
                return spes_fail("--max_doc_bytes must be between 1 and %zu (256 MiB), not %s",
                                 DOC_READER_MAX_DOC_BYTES_LIMIT, v);
        }
        else if (IS("--eos_id")) {
            uint64_t x = 0;
            SPES_TRY(parse_u64("--eos_id", v, &x));
            if (x >= UINT32_MAX) return spes_fail("--eos_id %s is too large", v);
            a->eos_id = (int64_t)x;
        } else if (IS("--dtype")) {
            if (!strcmp(v, "uint16")) a->dtype_bytes = 2;
            else if (!strcmp(v, "uint32")) a->dtype_bytes = 4;
            else return spes_fail("--dtype must be uint16 or uint32, not \"%s\"", v);
        } else return spes_fail("unknown flag %.*s (see --help)", (int)name_len, arg);
#undef IS
    }
    if (!a->tokenizer) return spes_fail("--tokenizer_name_or_path is required");
    if (a->dump_ids) return SPES_OK;
    if (!a->file_glob || !a->output_prefix) return spes_fail("--file_glob and --output_prefix are required");
    if (a->max_shard_bytes < (uint64_t)a->dtype_bytes) return spes_fail("--max_shard_bytes is smaller than one token");
    return SPES_OK;
}

// ---------------------------------------------------------------------------------------------
// --dump_ids: the parity tests' view of the tokenizer.

static int dump_ids(const TokenizeArgs *a, const Tokenizer *tok) {
    uint8_t *text;
    size_t len;
    SPES_TRY(file_read_all(a->dump_ids, &text, &len));
    TokenEncoder *enc = NULL;
    IdBuffer ids = {0};
    char *decoded = NULL;
    size_t decoded_len = 0;
    int rc = tokenizer_encoder_new(tok, &enc);
    if (rc == SPES_OK) rc = tokenizer_encode(enc, (const char *)text, len, &ids);
    if (rc != SPES_OK) spes_fail_context("%s", a->dump_ids);
    if (rc == SPES_OK && a->dump_decoded) {
        rc = tokenizer_decode(tok, ids.ids, ids.len, &decoded, &decoded_len);
        if (rc == SPES_OK) rc = file_write_atomic(a->dump_decoded, decoded, decoded_len);
    }
    for (size_t i = 0; rc == SPES_OK && i < ids.len; i++) printf("%u\n", ids.ids[i]);
    if (rc == SPES_OK && fflush(stdout) != 0) rc = spes_fail("writing ids to stdout: %s", strerror(errno));
    free(text);
    free(decoded);
    id_buffer_free(&ids);
    tokenizer_encoder_free(enc);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Workers

typedef struct {
    WorkerStats *stats;
    int reported;
} MalformedCtx;

// "path:line: ..." for a record the reader rejected; "path: document n: ..." for the n-th
// document of a file, which the tokenizer rejected (a parquet row or JSON array entry has no line).
static void report_malformed(MalformedCtx *m, const char *path, int is_line, uint64_t n, const char *why) {
    if (m->reported < MAX_MALFORMED_REPORTS) {
        if (is_line) log_warn("%s:%" PRIu64 ": skipped: %s", path, n, why);
        else if (n == 0) log_warn("%s: skipped: %s", path, why);
        else log_warn("%s: document %" PRIu64 ": skipped: %s", path, n, why);
    }
    else if (m->reported == MAX_MALFORMED_REPORTS) log_warn("further malformed records are only counted");
    m->reported++;
}

static void on_malformed(void *user, const char *path, uint64_t line, const char *why) {
    report_malformed(user, path, line > 0, line, why);   // line 0: a parquet value or .txt file (why names it)
}

static int tokenize_file(const TokenizeArgs *a, TokenEncoder *enc, int64_t eos, TokenWriter *w, const char *path,
                         WorkerStats *st, MalformedCtx *mctx, DocCleanScratch *clean, IdBuffer *ids) {
    DocReader *r;
    SPES_TRY(doc_reader_open(path, a->text_field, on_malformed, mctx, &r));
    if (doc_reader_set_max_doc_bytes(r, (size_t)a->max_doc_bytes) != SPES_OK) {
        doc_reader_close(r);
        return SPES_ERR;
    }
    uint64_t bytes_before = STAT_GET(st->file_bytes), doc_index = 0;
    const char *text;
    size_t len;
    int rc;
    while ((rc = doc_reader_next(r, &text, &len)) == 1) {
        doc_index++;
        const char *clean_text;
        size_t clean_len;
        int keep = doc_clean(clean, text, len, &clean_text, &clean_len);
        if (keep == SPES_ERR) {
            rc = SPES_ERR;
            break;
        }
        if (!keep) {
            STAT_SET(st->dropped, st->dropped + 1);
            continue;
        }
        ids->len = 0;
        if (tokenizer_encode(enc, clean_text, clean_len, ids) != SPES_OK) {
            // Text HF could not encode (invalid UTF-8): skipped like the script's tokenize errors.
            report_malformed(mctx, path, 0, doc_index, spes_last_error());
            STAT_SET(st->malformed, st->malformed + 1);
            continue;
        }
        if (eos >= 0 && (rc = id_buffer_push(ids, (uint32_t)eos)) != SPES_OK) break;
        if ((rc = token_writer_add(w, ids->ids, ids->len)) != SPES_OK) break;
        STAT_SET(st->docs, st->docs + 1);
        STAT_SET(st->tokens, st->tokens + ids->len);
        STAT_SET(st->text_bytes, st->text_bytes + len);
        STAT_SET(st->file_bytes, bytes_before + doc_reader_bytes_read(r));
        STAT_SET(st->shards, token_writer_shards(w));
    }
    STAT_SET(st->malformed, st->malformed + doc_reader_malformed(r));
    STAT_SET(st->file_bytes, bytes_before + doc_reader_bytes_read(r));
    doc_reader_close(r);
    if (rc < 0) return spes_fail_context("%s", path);
    return SPES_OK;
}

static int run_worker(const TokenizeArgs *a, const Tokenizer *tok, int64_t eos, char **files, int nfiles, int proc,
                      WorkerStats *st) {
    TokenEncoder *enc = NULL;
    TokenWriter *w = NULL;
    DocCleanScratch clean = {0};
    IdBuffer ids = {0};
    MalformedCtx mctx = {st, 0};
    int rc = tokenizer_encoder_new(tok, &enc);
    if (rc == SPES_OK) rc = token_writer_open(a->output_prefix, proc, a->max_shard_bytes, a->dtype_bytes, &w);
    for (int f = 0; rc == SPES_OK && f < nfiles; f++) {
        rc = tokenize_file(a, enc, eos, w, files[f], st, &mctx, &clean, &ids);
        STAT_SET(st->files_done, st->files_done + 1);
    }
    if (rc == SPES_OK) {
        TokenWriter *done = w;
        w = NULL;
        uint64_t shards;
        rc = token_writer_close(done, &shards);
        if (rc == SPES_OK) STAT_SET(st->shards, shards);
    }
    token_writer_abort(w);
    tokenizer_encoder_free(enc);
    doc_clean_free(&clean);
    id_buffer_free(&ids);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Driver

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Python's sorted(glob.glob(pattern)): byte order (= code point order for UTF-8).
static int find_files(const char *pattern, glob_t *g) {
    int rc = glob(pattern, GLOB_NOSORT, NULL, g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g->gl_pathc == 0)) return spes_fail("--file_glob %s matches no file", pattern);
    if (rc != 0) return spes_fail("--file_glob %s: cannot expand (read error or out of memory)", pattern);
    qsort(g->gl_pathv, g->gl_pathc, sizeof(char *), cmp_str);
    return SPES_OK;
}

// The script's chunk_list(files, n): n contiguous chunks, the first len % n one longer. Or
// groups of files_per_process. Fills start[]/count[] and returns the number of chunks. Chunks
// past the files would be empty and start no worker, so there are at most nfiles chunks.
static int make_chunks(int nfiles, const TokenizeArgs *a, int *start, int *count) {
    if (a->files_per_process) {
        int n = 0;
        for (int i = 0; i < nfiles; i += a->files_per_process, n++) {
            start[n] = i;
            count[n] = nfiles - i < a->files_per_process ? nfiles - i : a->files_per_process;
        }
        return n;
    }
    int n = a->processes < nfiles ? a->processes : nfiles;
    int k = nfiles / n, m = nfiles % n;
    for (int i = 0; i < n; i++) {
        start[i] = i * k + (i < m ? i : m);
        count[i] = k + (i < m ? 1 : 0);
    }
    return n;
}

static void totals(const WorkerStats *ws, int n, WorkerStats *sum) {
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < n; i++) {
        sum->files_done += STAT_GET(ws[i].files_done);
        sum->docs += STAT_GET(ws[i].docs);
        sum->tokens += STAT_GET(ws[i].tokens);
        sum->file_bytes += STAT_GET(ws[i].file_bytes);
        sum->text_bytes += STAT_GET(ws[i].text_bytes);
        sum->malformed += STAT_GET(ws[i].malformed);
        sum->dropped += STAT_GET(ws[i].dropped);
        sum->shards += STAT_GET(ws[i].shards);
    }
}

static void progress_extra(const WorkerStats *sum, size_t nfiles, double elapsed, char *buf, size_t size) {
    snprintf(buf, size, "| files %" PRIu64 "/%zu docs %" PRIu64 " tokens %" PRIu64 " text %.1f MB/s", sum->files_done,
             nfiles, sum->docs, sum->tokens, elapsed > 0 ? (double)sum->text_bytes / 1e6 / elapsed : 0.0);
}

static pid_t start_worker(const TokenizeArgs *a, const Tokenizer *tok, int64_t eos, char **files, int start, int count,
                          int proc, WorkerStats *st) {
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);    // the parent's handlers only set a flag
        signal(SIGTERM, SIG_DFL);
        // A parent killed outright (kill -9, the OOM killer) cannot stop its workers: they went on
        // writing shards for nobody. They end with it (and one that outlived it already ends now).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        int rc = run_worker(a, tok, eos, files + start, count, proc, st);
        if (rc != SPES_OK) {
            snprintf(st->error, sizeof st->error, "%s", spes_last_error());
            STAT_SET(st->failed, 1);
        }
        fflush(NULL);
        _exit(rc == SPES_OK ? 0 : 1);
    }
    return pid;
}

enum { NOT_A_SHARD, SHARD, SHARD_TEMP };

// What name is for the prefix's file part: SHARD for {base}{proc:03d}_{shard:06d}.npy, SHARD_TEMP
// for a shard's temp file ("<shard>.tmp.<pid>", base/file.h) a killed worker left.
static int shard_name_kind(const char *name, const char *base) {
    size_t n = strlen(base);
    if (strncmp(name, base, n)) return NOT_A_SHARD;
    const char *p = name + n, *q = p;
    while (isdigit((unsigned char)*q)) q++;
    if (q - p < 3 || *q != '_') return NOT_A_SHARD;
    p = ++q;
    while (isdigit((unsigned char)*q)) q++;
    if (q - p < 6 || strncmp(q, ".npy", 4)) return NOT_A_SHARD;
    q += 4;
    if (!*q) return SHARD;
    if (strncmp(q, ".tmp.", 5) || !q[5]) return NOT_A_SHARD;
    for (q += 5; isdigit((unsigned char)*q); q++) {}
    return *q ? NOT_A_SHARD : SHARD_TEMP;
}

static int is_shard_name(const char *name, const char *base) { return shard_name_kind(name, base) == SHARD; }

// The prefix's directory ("." for a bare file part) into dir; returns its file part.
static const char *prefix_dir(const char *prefix, char *dir, size_t size) {
    const char *slash = strrchr(prefix, '/');
    if (!slash) snprintf(dir, size, ".");
    else if (slash == prefix) snprintf(dir, size, "/");   // "/name_": the root, not ""
    else snprintf(dir, size, "%.*s", (int)(slash - prefix), prefix);
    return slash ? slash + 1 : prefix;
}

// Shards of an earlier run under the same prefix are refused before any work: this run would
// overwrite some and leave the rest (more shards or more workers than now) to be trained on
// together with the new ones, silently.
static int check_no_earlier_shards(const char *prefix) {
    char dir[4096];
    const char *base = prefix_dir(prefix, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) return SPES_OK;   // not there yet (or unreadable: creating the shards will say so)
    char first[512] = "";
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (is_shard_name(e->d_name, base) && count++ == 0) snprintf(first, sizeof first, "%s", e->d_name);
    closedir(d);
    if (!count) return SPES_OK;
    return spes_fail("--output_prefix %s: %s/%s%s is already there, from an earlier run; a new run would leave its "
                     "shards mixed with this one's: remove them or choose another prefix",
                     prefix, dir, first, count > 1 ? " (and more shards)" : "");
}

// After a failed run: removes the shards it wrote and the temp files of workers it stopped (there
// were none before it: check_no_earlier_shards), so that nothing passes for a dataset and a rerun
// starts clean. What cannot be removed is said by name.
static void remove_run_shards(const char *prefix) {
    char dir[4096];
    const char *base = prefix_dir(prefix, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) return;   // never created
    int removed = 0, kept = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (shard_name_kind(e->d_name, base) == NOT_A_SHARD) continue;
        char *path = path_join(dir, e->d_name);
        if (path && unlink(path) == 0) removed++;
        else if (path && errno != ENOENT && kept++ < 3) log_error("tokenize: cannot remove %s: %s", path, strerror(errno));
        free(path);
    }
    closedir(d);
    if (removed) log_warn("tokenize: removed the %d shard files this failed run wrote under %s", removed, prefix);
    if (kept) log_error("tokenize: %d shard files of this failed run are left under %s: remove them before a rerun", kept,
                        prefix);
}

static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) { stop_signal = sig; }

// The workers still running are told to stop (a run that failed is removed whole).
static void stop_workers(const pid_t *pids, int n) {
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGTERM);
}

// A glob can match a directory, a broken symlink, a FIFO or a socket: refuse each by name before
// any worker starts (a FIFO would block a worker forever, a directory fail mid-way).
static int check_input(const char *path, uint64_t *size) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        struct stat lsb;
        if (errno == ENOENT && lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode))
            return spes_fail("%s is a broken symbolic link", path);
        return spes_fail("cannot stat %s: %s", path, strerror(errno));
    }
    if (S_ISDIR(sb.st_mode)) return spes_fail("%s is a directory, not an input file (narrow the glob)", path);
    if (!S_ISREG(sb.st_mode)) return spes_fail("%s is not a regular file (a FIFO, socket or device)", path);
    *size = (uint64_t)sb.st_size;
    return SPES_OK;
}

static int run_all(const TokenizeArgs *a, const Tokenizer *tok, int64_t eos) {
    glob_t g = {0};
    SPES_TRY(find_files(a->file_glob, &g));
    int nfiles = (int)g.gl_pathc;
    uint64_t total_bytes = 0;
    for (int i = 0; i < nfiles; i++) {
        uint64_t size = 0;
        if (check_input(g.gl_pathv[i], &size) != SPES_OK) {
            globfree(&g);   // the message is formatted already: the path dies with the glob
            return spes_fail_context("--file_glob %s", a->file_glob);
        }
        total_bytes += size;
    }
    int max_chunks = nfiles;   // make_chunks never makes more (--processes 1000000 mapped 1 GB here)
    int *start = calloc((size_t)max_chunks, sizeof(int)), *count = calloc((size_t)max_chunks, sizeof(int));
    pid_t *pids = calloc((size_t)max_chunks, sizeof(pid_t));
    size_t stats_size = sizeof(WorkerStats) * (size_t)max_chunks;
    WorkerStats *ws = mmap(NULL, stats_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!start || !count || !pids || ws == MAP_FAILED) {
        free(start), free(count), free(pids);
        if (ws != MAP_FAILED) munmap(ws, stats_size);
        globfree(&g);
        return spes_fail("out of memory setting up %d workers", max_chunks);
    }
    memset(ws, 0, stats_size);
    int nchunks = make_chunks(nfiles, a, start, count);
    log_info("tokenize: %d files, %d chunks, %d processes; %s", nfiles, nchunks, a->processes, tokenizer_describe(tok));

    Progress p;
    progress_start(&p, "tokenize", "MB", (total_bytes + 999999) / 1000000);
    double t0 = now_seconds();
    int next = 0, running = 0, failed = 0;
    char extra[256];
    WorkerStats sum;
    while (next < nchunks || running > 0) {
        while (!failed && running < a->processes && next < nchunks) {
            if (count[next] > 0) {
                pids[next] = start_worker(a, tok, eos, g.gl_pathv, start[next], count[next], next, &ws[next]);
                if (pids[next] < 0) {
                    failed = 1;
                    spes_fail("cannot start worker process %d: %s", next, strerror(errno));
                    pids[next] = 0;
                    stop_workers(pids, nchunks);
                    break;
                }
                running++;
            }
            next++;
        }
        if (failed && running == 0) break;
        if (stop_signal && !failed) {
            failed = 1;
            spes_fail("stopped by a signal (%s)", strsignal(stop_signal));
            stop_workers(pids, nchunks);
        }
        int status;
        pid_t done = waitpid(-1, &status, WNOHANG);
        if (done > 0) {
            running--;
            for (int i = 0; i < nchunks; i++) {
                if (pids[i] != done) continue;
                pids[i] = 0;   // reaped
                if (failed) continue;   // the first failure is the one said; the others were stopped
                if (STAT_GET(ws[i].failed)) failed = 1, spes_fail("worker %03d: %s", i, ws[i].error);
                else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    failed = 1, spes_fail("worker %03d died (status %d)", i, status);
                if (failed) stop_workers(pids, nchunks);
            }
            continue;
        }
        if (done < 0 && errno != EINTR) break;
        totals(ws, nchunks, &sum);
        progress_extra(&sum, (size_t)nfiles, now_seconds() - t0, extra, sizeof extra);
        progress_update(&p, sum.file_bytes / 1000000, extra);
        usleep(100 * 1000);
    }
    double elapsed = now_seconds() - t0;
    totals(ws, nchunks, &sum);
    progress_extra(&sum, (size_t)nfiles, elapsed, extra, sizeof extra);
    progress_finish(&p, extra);
    if (!failed)
        log_info("tokenize: done: %" PRIu64 " files, %" PRIu64 " documents (%" PRIu64 " empty dropped, %" PRIu64
                 " malformed skipped), %" PRIu64 " tokens in %" PRIu64 " shards; %.1f MB of text in %.1fs (%.1f MB/s)",
                 sum.files_done, sum.docs, sum.dropped, sum.malformed, sum.tokens, sum.shards,
                 (double)sum.text_bytes / 1e6, elapsed, elapsed > 0 ? (double)sum.text_bytes / 1e6 / elapsed : 0.0);
    if (failed) remove_run_shards(a->output_prefix);
    free(start), free(count), free(pids);
    munmap(ws, stats_size);
    globfree(&g);
    return failed ? SPES_ERR : SPES_OK;
}

// The EOS to append, checked against the vocab and the dtype.
static int pick_eos(const TokenizeArgs *a, const Tokenizer *tok, int64_t *eos) {
    *eos = -1;
    if (a->no_eos) return SPES_OK;
    *eos = a->eos_id >= 0 ? a->eos_id : tokenizer_eos_id(tok);
    if (*eos < 0)
        return spes_fail("%s names no EOS token (its special_tokens_map.json / tokenizer_config.json set "
                         "eos_token null or to something not a token's text; where neither gives the key, no "
                         "<|endoftext|>, </s>, <eos>, <|end_of_text|> or <|im_end|> is an added token); pass "
                         "--eos_id N or --no_eos",
                         a->tokenizer);
    if ((uint64_t)*eos >= tokenizer_vocab_size(tok))
        return spes_fail("--eos_id %" PRId64 " is outside the vocabulary (size %u)", *eos, tokenizer_vocab_size(tok));
    return SPES_OK;
}

int cmd_tokenize(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    TokenizeArgs a;
    Tokenizer *tok = NULL;
    int64_t eos;
    signal(SIGPIPE, SIG_IGN);   // a closed stdout/stderr: an error or lost log lines, not death
    int rc = parse_args(argc, argv, &a);
    if (rc == SPES_OK) rc = tokenizer_load(a.tokenizer, &tok);
    if (rc == SPES_OK && a.dump_ids) rc = dump_ids(&a, tok);
    else if (rc == SPES_OK) {
        // uint16 holds ids 0..65535: refuse before any work rather than fail mid-way.
        if (a.dtype_bytes == 2 && tokenizer_vocab_size(tok) > 65536)
            rc = spes_fail("--dtype uint16 cannot hold the ids of %s (vocab size %u > 65536); use --dtype uint32",
                           a.tokenizer, tokenizer_vocab_size(tok));
        if (rc == SPES_OK) rc = pick_eos(&a, tok, &eos);
        if (rc == SPES_OK) rc = check_no_earlier_shards(a.output_prefix);
        if (rc == SPES_OK) {
            signal(SIGINT, on_stop_signal);
            signal(SIGTERM, on_stop_signal);
            rc = run_all(&a, tok, eos);
        }
    }
    tokenizer_free(tok);
    if (rc != SPES_OK) {
        fprintf(stderr, "spes: %s\n", spes_last_error());
        return 1;
    }
    return 0;
}
