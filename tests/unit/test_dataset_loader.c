// Token-file dataset and batch loader: OLMo's instance cutting, numpy's PCG64 permutation
// (known answers always; against live numpy when the test venv exists), drop_last, resume
// from a saved position, and every data error path.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/printable.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/pcg64.h"
#include "io/npy.h"
#include "model/model_config.h"

static char g_dir[] = "/tmp/spes_dataset_XXXXXX";

static char *tmp_path(const char *name) { return path_join(g_dir, name); }

// Raw little-endian uint16 file with tokens base, base+1, ... (mod 250).
static char *write_u16(const char *name, int count, int base) {
    char *path = tmp_path(name);
    uint16_t *buf = malloc((size_t)(count ? count : 1) * sizeof(uint16_t));
    for (int i = 0; i < count; i++) buf[i] = (uint16_t)((base + i) % 250);
    assert_int_equal(file_write_atomic(path, buf, (size_t)count * sizeof(uint16_t)), SPES_OK);
    free(buf);
    return path;
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return remove_tree(g_dir) == SPES_OK ? 0 : -1;
}

// ---- PCG64 / permutation

static void test_pcg64_known_answers(void **state) {
    (void)state;
    // numpy 2.x: np.random.PCG64(0).random_raw(2), Generator(PCG64(s)).permutation(20)
    Pcg64 rng;
    pcg64_seed(&rng, 0);
    uint64_t a = pcg64_next64(&rng), b = pcg64_next64(&rng);
    assert_true(a == 11749869230777074271ULL);
    assert_true(b == 4976686463289251617ULL);
    const uint32_t perm0[20] = {4, 19, 6, 2, 13, 16, 3, 11, 10, 8, 0, 12, 7, 5, 18, 17, 14, 9, 1, 15};
    const uint32_t perm6198[20] = {17, 4, 14, 3, 5, 12, 6, 15, 18, 13, 10, 11, 2, 19, 0, 16, 7, 9, 8, 1};
    uint32_t out[20];
    pcg64_permutation(0, out, 20);
    assert_memory_equal(out, perm0, sizeof out);
    pcg64_permutation(6198, out, 20);
    assert_memory_equal(out, perm6198, sizeof out);
}

static FILE *open_python(const char *script_body, char *script_path, size_t cap) {
    const char *py = getenv("SPES_VENV_PY");
    if (!py || access(py, X_OK) != 0) return NULL;
    snprintf(script_path, cap, "%s/check.py", g_dir);
    FILE *f = fopen(script_path, "w");
    if (!f) return NULL;
    fputs(script_body, f);
    fclose(f);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", py, script_path, g_dir);
    return popen(cmd, "r");
}

// Large permutations (both 32-bit draw halves, many rejection rounds) against numpy itself.
static void test_permutation_matches_numpy(void **state) {
    (void)state;
    static const char script[] =
        "import numpy as np\n"
        "for seed, n in [(6198, 100003), (6199, 65537), (2**40 + 5, 1000), (7, 1), (3, 2)]:\n"
        "    p = np.random.Generator(np.random.PCG64(seed)).permutation(n)\n"
        "    print(seed, n, ' '.join(map(str, p.tolist())))\n";
    char script_path[4200];
    FILE *py = open_python(script, script_path, sizeof script_path);
    if (!py) skip();
    size_t cap = 1 << 21;
    char *line = malloc(cap);
    int cases = 0;
    while (fgets(line, (int)cap, py)) {
        char *p = line;
        uint64_t seed = strtoull(p, &p, 10), n = strtoull(p, &p, 10);
        uint32_t *perm = malloc(n * sizeof(uint32_t));
        pcg64_permutation(seed, perm, n);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t want = strtoull(p, &p, 10);
            if (perm[i] != want) fail_msg("seed %llu n %llu: index %llu is %u, numpy %llu", (unsigned long long)seed,
                                          (unsigned long long)n, (unsigned long long)i, perm[i], (unsigned long long)want);
        }
        free(perm);
        cases++;
    }
    free(line);
    int rc = pclose(py);
    if (rc != 0 && cases == 0) skip();   // venv without numpy
    assert_int_equal(cases, 5);
}

// ---- dataset

static void test_instances_cut_like_olmo(void **state) {
    (void)state;
    char *f1 = write_u16("a.npy", 10, 0);     // 2 instances of 4, 2 tokens dropped
    char *f2 = write_u16("b.npy", 9, 100);    // 2 instances, 1 dropped
    char *paths[] = {f1, f2};
    TokenDataset *ds;
    assert_int_equal(token_dataset_open(paths, 2, MEMMAP_UINT16, 4, 257, &ds), SPES_OK);
    assert_int_equal(token_dataset_len(ds), 4);
    assert_int_equal(token_dataset_file_instances(ds, 0), 2);
    int32_t x[4];
    assert_int_equal(token_dataset_get(ds, 1, x), SPES_OK);
    assert_int_equal(x[0], 4);
    assert_int_equal(x[3], 7);
    assert_int_equal(token_dataset_get(ds, 2, x), SPES_OK);
    assert_int_equal(x[0], 100);
    assert_int_equal(token_dataset_get(ds, 3, x), SPES_OK);
    assert_int_equal(x[3], 107);
    assert_int_equal(token_dataset_get(ds, 4, x), SPES_ERR);
    token_dataset_close(ds);
    free(f1);
    free(f2);
}

static void test_npy_and_manifest(void **state) {
    (void)state;
    char *raw = write_u16("r.npy", 8, 0);
    char *npy = tmp_path("real.npy");
    uint32_t vals[6] = {200, 201, 202, 203, 204, 205};
    assert_int_equal(npy_write(npy, TOKEN_U32, vals, 6), SPES_OK);
    char *manifest = tmp_path("file_list.txt");
    char text[2048];
    snprintf(text, sizeof text, "# tokenized shards\n%s\n\n  %s  \r\n", raw, npy);
    assert_int_equal(file_write_atomic(manifest, text, strlen(text)), SPES_OK);
    char *paths[] = {manifest};
    TokenDataset *ds;
    assert_int_equal(token_dataset_open(paths, 1, MEMMAP_UINT16, 3, 257, &ds), SPES_OK);
    assert_int_equal(token_dataset_num_files(ds), 2);
    assert_int_equal(token_dataset_len(ds), 2 + 2);
    int32_t x[3];
    assert_int_equal(token_dataset_get(ds, 3, x), SPES_OK);
    assert_int_equal(x[0], 203);
    assert_int_equal(x[2], 205);
    token_dataset_close(ds);
    free(raw);
    free(npy);
    free(manifest);
}

static void expect_open_error(char *path, MemmapDtype dt, int T, const char *needle1, const char *needle2) {
    char *paths[] = {path};
    TokenDataset *ds = NULL;
    assert_int_equal(token_dataset_open(paths, 1, dt, T, 257, &ds), SPES_ERR);
    assert_null(ds);
    const char *msg = spes_last_error();
    if (!strstr(msg, needle1) || (needle2 && !strstr(msg, needle2)))
        fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", msg, needle1, needle2 ? needle2 : "");
}

static void test_data_errors(void **state) {
    (void)state;
    char *missing = tmp_path("missing.npy");
    expect_open_error(missing, MEMMAP_UINT16, 4, "missing.npy", NULL);
    char *empty = write_u16("empty.npy", 0, 0);
    expect_open_error(empty, MEMMAP_UINT16, 4, "empty.npy", "empty");
    char *odd = tmp_path("odd.npy");
    assert_int_equal(file_write_atomic(odd, "abc", 3), SPES_OK);   // 3 bytes: not whole uint16s
    expect_open_error(odd, MEMMAP_UINT16, 2, "odd.npy", "memmap_dtype");
    char *six = write_u16("six.npy", 3, 0);                         // 6 bytes: not whole uint32s
    expect_open_error(six, MEMMAP_UINT32, 2, "six.npy", "uint32");
    char *shorty = write_u16("short.npy", 3, 0);
    expect_open_error(shorty, MEMMAP_UINT16, 4, "short.npy", "fewer than one instance");
    char *empty_list = tmp_path("empty_list.txt");
    assert_int_equal(file_write_atomic(empty_list, "# nothing\n\n", 11), SPES_OK);
    expect_open_error(empty_list, MEMMAP_UINT16, 4, "empty_list.txt", "lists no token files");
    char *nested = tmp_path("nested.txt");
    assert_int_equal(file_write_atomic(nested, "other.txt\n", 10), SPES_OK);
    expect_open_error(nested, MEMMAP_UINT16, 4, "nested.txt", "do not nest");
    char *bad_line = tmp_path("bad_line.txt");
    assert_int_equal(file_write_atomic(bad_line, "/nonexistent/x.npy\n", 19), SPES_OK);
    expect_open_error(bad_line, MEMMAP_UINT16, 4, "bad_line.txt", "/nonexistent/x.npy");
    TokenDataset *ds = NULL;
    assert_int_equal(token_dataset_open(NULL, 0, MEMMAP_UINT16, 4, 257, &ds), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "data.paths is empty"));

    // token ids >= vocab_size: caught when the file is opened (not at the step that reaches
    // it), naming file, token and byte offset
    char *big = tmp_path("big.npy");
    uint16_t toks[8] = {1, 2, 3, 4, 5, 300, 7, 8};
    assert_int_equal(file_write_atomic(big, toks, sizeof toks), SPES_OK);
    expect_open_error(big, MEMMAP_UINT16, 4, "big.npy: token 5 (byte offset 10) has id 300", "vocab_size 257");
    free(missing), free(empty), free(odd), free(six), free(shorty), free(empty_list), free(nested), free(bad_line), free(big);
}

// A bad id deep in a large file (uint32 raw, and a real .npy whose header shifts the byte offset)
// is found at open; a good file of the same size opens. Vocab sizes above 65535 skip uint16 files.
static void test_bad_token_deep_in_data(void **state) {
    (void)state;
    const uint64_t n = 3000000, bad_at = 2999999 - 17;
    uint32_t *ids = malloc(n * sizeof *ids);
    for (uint64_t i = 0; i < n; i++) ids[i] = (uint32_t)(i % 257);
    char *good = tmp_path("good32.npy"), *bad = tmp_path("bad32.npy"), *bad_npy = tmp_path("bad_real.npy");
    assert_int_equal(file_write_atomic(good, ids, n * sizeof *ids), SPES_OK);
    ids[bad_at] = 257;
    assert_int_equal(file_write_atomic(bad, ids, n * sizeof *ids), SPES_OK);
    assert_int_equal(npy_write(bad_npy, TOKEN_U32, ids, n), SPES_OK);
    free(ids);
    TokenDataset *ds = NULL;
    char *paths[] = {good};
    assert_int_equal(token_dataset_open(paths, 1, MEMMAP_UINT32, 128, 257, &ds), SPES_OK);
    token_dataset_close(ds);
    char want[128];
    snprintf(want, sizeof want, "bad32.npy: token %llu (byte offset %llu) has id 257", (unsigned long long)bad_at,
             (unsigned long long)bad_at * 4);
    expect_open_error(bad, MEMMAP_UINT32, 128, want, NULL);
    snprintf(want, sizeof want, "bad_real.npy: token %llu (byte offset %llu) has id 257", (unsigned long long)bad_at,
             (unsigned long long)(bad_at * 4 + 128));
    expect_open_error(bad_npy, MEMMAP_UINT32, 128, want, NULL);
    free(good), free(bad), free(bad_npy);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "opening a FIFO blocked\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(1);
}

// A FIFO (or any non-regular file) in data.paths or in a manifest is refused by name at once;
// opening it used to block forever. alarm() turns a hang into a failure.
static void test_fifo_refused(void **state) {
    (void)state;
    char *fifo = tmp_path("pipe.npy"), *list = tmp_path("pipe_list.txt"), *fifo_list = tmp_path("pipe_manifest.txt");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkfifo(fifo_list, 0600), 0);
    char text[512];
    int len = snprintf(text, sizeof text, "%s\n", fifo);
    assert_int_equal(file_write_atomic(list, text, (size_t)len), SPES_OK);
    signal(SIGALRM, on_alarm);
    alarm(10);
    expect_open_error(fifo, MEMMAP_UINT16, 4, "pipe.npy is not a regular file (a FIFO)", NULL);
    expect_open_error(list, MEMMAP_UINT16, 4, "pipe_list.txt:1", "pipe.npy is not a regular file");
    expect_open_error(fifo_list, MEMMAP_UINT16, 4, "pipe_manifest.txt is not a regular file", NULL);
    alarm(0);
    free(fifo), free(list), free(fifo_list);
}

// Manifest lines are echoed in messages: control bytes (a terminal escape sequence), invalid
// UTF-8 and NUL are refused with the line number and shown escaped; printable UTF-8 is kept.
static void test_manifest_escapes(void **state) {
    (void)state;
    char *list = tmp_path("evil.txt");
    const char evil[] = "# header\n\n/data/ok\x1b]0;owned\x07\x1b[2J\xff.npy\n";
    assert_int_equal(file_write_atomic(list, evil, sizeof evil - 1), SPES_OK);
    expect_open_error(list, MEMMAP_UINT16, 4, "evil.txt:3: the entry is not a printable path",
                      "'/data/ok\\x1b]0;owned\\x07\\x1b[2J\\xff.npy'");
    assert_null(strchr(spes_last_error(), 0x1b));
    const char nul[] = "/data/a\0b.npy\n";
    assert_int_equal(file_write_atomic(list, nul, sizeof nul - 1), SPES_OK);
    expect_open_error(list, MEMMAP_UINT16, 4, "evil.txt:1", "\\x00");
    const char utf8[] = "/nonexistent/d\xc3\xa9j\xc3\xa0.npy\n";   // printable: reaches the open, named as is
    assert_int_equal(file_write_atomic(list, utf8, sizeof utf8 - 1), SPES_OK);
    expect_open_error(list, MEMMAP_UINT16, 4, "evil.txt:1", "/nonexistent/d\xc3\xa9j\xc3\xa0.npy");
    char out[16];
    assert_string_equal(escape_printable("abcdefghijklmnopqrstuvwxyz", 26, out, sizeof out), "abcdefghijkl...");
    assert_string_equal(escape_printable("a\xc2\x9b" "b", 4, out, sizeof out), "a\\xc2\\x9bb");   // C1 CSI
    free(list);
}

// ---- loader

static TokenDataset *open_counting_dataset(int instances, int T) {
    char name[64];
    snprintf(name, sizeof name, "count_%d_%d.npy", instances, T);
    char *path = tmp_path(name);
    uint16_t *buf = malloc((size_t)instances * T * sizeof(uint16_t));
    for (int i = 0; i < instances; i++)
        for (int t = 0; t < T; t++) buf[i * T + t] = (uint16_t)(i * 10 + t);   // instance i starts with 10*i
    assert_int_equal(file_write_atomic(path, buf, (size_t)instances * T * sizeof(uint16_t)), SPES_OK);
    free(buf);
    char *paths[] = {path};
    TokenDataset *ds;
    assert_int_equal(token_dataset_open(paths, 1, MEMMAP_UINT16, T, 0, &ds), SPES_OK);
    free(path);
    return ds;
}

static void test_inputs_and_targets(void **state) {
    (void)state;
    TokenDataset *ds = open_counting_dataset(5, 4);
    LoaderOptions opt = {.batch_size = 2, .shuffle = false, .drop_last = true, .wrap = true};
    DataLoader *dl;
    assert_int_equal(loader_create(ds, &opt, &dl), SPES_OK);
    const Batch *b;
    assert_int_equal(loader_next(dl, &b), SPES_OK);
    assert_int_equal(b->rows, 2);
    const int32_t want_x[8] = {0, 1, 2, 3, 10, 11, 12, 13};
    const int32_t want_y[8] = {1, 2, 3, IGNORE_INDEX, 11, 12, 13, IGNORE_INDEX};
    assert_memory_equal(b->inputs, want_x, sizeof want_x);
    assert_memory_equal(b->targets, want_y, sizeof want_y);
    loader_free(dl);
    token_dataset_close(ds);
}

// data.instance_filter: a row holding a long run of one token keeps its inputs and loses every
// target; the other rows, and loaders without the filter, are untouched. The range reader
// (a rank's rows) filters the rows it reads the same way.
static void test_instance_filter_masks_rows(void **state) {
    (void)state;
    enum { N = 4, T = 40 };
    uint16_t buf[N * T];
    for (int i = 0; i < N * T; i++) buf[i] = (uint16_t)(i % 251);
    for (int t = 3; t < 3 + 33; t++) buf[1 * T + t] = 9;   // instance 1: 33 x one token (OLMo masks >= 32)
    for (int t = 0; t < 31; t++) buf[3 * T + t] = 9;       // instance 3: 31 x, kept
    char *path = tmp_path("repeats.npy");
    assert_int_equal(file_write_atomic(path, buf, sizeof buf), SPES_OK);
    char *paths[] = {path};
    TokenDataset *ds;
    assert_int_equal(token_dataset_open(paths, 1, MEMMAP_UINT16, T, 0, &ds), SPES_OK);
    free(path);
    const InstanceFilterConfig olmo = {.enabled = true, .max_period = 13, .min_period = 1, .max_count = 32};
    for (int filtered = 0; filtered < 2; filtered++) {
        LoaderOptions opt = {.batch_size = N, .shuffle = false, .drop_last = true, .wrap = true};
        if (filtered) opt.filter = olmo;
        DataLoader *dl;
        assert_int_equal(loader_create(ds, &opt, &dl), SPES_OK);
        for (int pass = 0; pass < 2; pass++) {   // the whole batch, then rows [1, 3) only
            const Batch *b;
            if (pass == 0) assert_int_equal(loader_next(dl, &b), SPES_OK);
            else assert_int_equal(loader_next_range(dl, 1, 3, &b), SPES_OK);
            for (int r = pass ? 1 : 0; r < (pass ? 3 : N); r++)
                for (int t = 0; t < T; t++) {
                    assert_int_equal(b->inputs[r * T + t], buf[r * T + t]);
                    bool masked = filtered && r == 1;
                    int want = t + 1 < T && !masked ? buf[r * T + t + 1] : IGNORE_INDEX;
                    assert_int_equal(b->targets[r * T + t], want);
                }
        }
        loader_free(dl);
    }
    token_dataset_close(ds);
}

// N = 5, batch 2: drop_last gives 2 batches an epoch; without it the third has one row.
static void test_drop_last_and_epochs(void **state) {
    (void)state;
    TokenDataset *ds = open_counting_dataset(5, 4);
    LoaderOptions opt = {.batch_size = 2, .shuffle = true, .seed = 11, .drop_last = true, .wrap = true};
    DataLoader *dl;
    assert_int_equal(loader_create(ds, &opt, &dl), SPES_OK);
    assert_int_equal(loader_batches_per_epoch(dl), 2);
    uint32_t perm0[5], perm1[5];
    pcg64_permutation(11, perm0, 5);
    pcg64_permutation(12, perm1, 5);
    const Batch *b;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(loader_next(dl, &b), SPES_OK);
        assert_int_equal(b->position.epoch, 0);
        for (int r = 0; r < 2; r++) assert_int_equal(b->inputs[r * 4], 10 * (int)perm0[2 * k + r]);
    }
    assert_int_equal(loader_next(dl, &b), SPES_OK);   // epoch 1 starts: seed 11 + 1
    assert_int_equal(b->position.epoch, 1);
    assert_int_equal(b->position.index, 0);
    assert_int_equal(b->inputs[0], 10 * (int)perm1[0]);
    loader_free(dl);

    opt.drop_last = false;
    assert_int_equal(loader_create(ds, &opt, &dl), SPES_OK);
    assert_int_equal(loader_batches_per_epoch(dl), 3);
    for (int k = 0; k < 3; k++) assert_int_equal(loader_next(dl, &b), SPES_OK);
    assert_int_equal(b->rows, 1);
    assert_int_equal(b->inputs[0], 10 * (int)perm0[4]);
    loader_free(dl);

    opt = (LoaderOptions){.batch_size = 6, .shuffle = false, .drop_last = true, .wrap = true};
    assert_int_equal(loader_create(ds, &opt, &dl), SPES_ERR);   // every batch would be dropped
    assert_non_null(strstr(spes_last_error(), "fewer than one batch"));
    token_dataset_close(ds);
}

// A rank's share (loader_next_range): the rows it asks for are the whole batch's rows, the
// others are not read, and the position moves as loader_next's, also across an epoch's short
// last batch (N = 5, batch 3, no drop_last: 3 rows, then 2, then the next epoch).
static void test_next_range(void **state) {
    (void)state;
    TokenDataset *ds = open_counting_dataset(5, 4);
    LoaderOptions opt = {.batch_size = 3, .shuffle = true, .seed = 5, .drop_last = false, .wrap = true};
    DataLoader *whole, *part;
    assert_int_equal(loader_create(ds, &opt, &whole), SPES_OK);
    assert_int_equal(loader_create(ds, &opt, &part), SPES_OK);
    const int want_rows[4] = {3, 2, 3, 2};
    for (int k = 0; k < 4; k++) {
        const Batch *a, *b;
        assert_int_equal(loader_peek_rows(part), want_rows[k]);
        assert_int_equal(loader_next(whole, &a), SPES_OK);
        assert_int_equal(loader_next_range(part, 1, 3, &b), SPES_OK);   // rows 1..2 (clipped to the batch)
        assert_int_equal(b->rows, a->rows);
        assert_memory_equal(&b->position, &a->position, sizeof a->position);
        for (int r = 1; r < a->rows; r++) {
            assert_memory_equal(b->inputs + r * 4, a->inputs + r * 4, 4 * sizeof(int32_t));
            assert_memory_equal(b->targets + r * 4, a->targets + r * 4, 4 * sizeof(int32_t));
        }
        assert_int_equal(b->targets[3], 0);   // row 0 never read: still the zeroed buffer
        LoaderPosition pa = loader_get_position(whole), pb = loader_get_position(part);
        assert_memory_equal(&pa, &pb, sizeof pa);
    }
    loader_free(whole);
    loader_free(part);
    token_dataset_close(ds);
}

// A loader set to a saved position hands out exactly the batches the original would have.
static void test_resume_from_position(void **state) {
    (void)state;
    TokenDataset *ds = open_counting_dataset(7, 3);
    LoaderOptions opt = {.batch_size = 3, .shuffle = true, .seed = 5, .drop_last = true, .wrap = true};
    DataLoader *a, *b;
    assert_int_equal(loader_create(ds, &opt, &a), SPES_OK);
    assert_int_equal(loader_create(ds, &opt, &b), SPES_OK);
    const Batch *ba, *bb;
    for (int k = 0; k < 3; k++) assert_int_equal(loader_next(a, &ba), SPES_OK);
    LoaderPosition saved = loader_get_position(a);
    assert_int_equal(saved.epoch, 1);
    assert_int_equal(saved.index, 3);
    assert_int_equal(loader_set_position(b, saved), SPES_OK);
    for (int k = 0; k < 5; k++) {
        assert_int_equal(loader_next(a, &ba), SPES_OK);
        assert_int_equal(loader_next(b, &bb), SPES_OK);
        assert_int_equal(ba->rows, bb->rows);
        assert_memory_equal(ba->inputs, bb->inputs, (size_t)ba->rows * 3 * sizeof(int32_t));
        assert_memory_equal(&ba->position, &bb->position, sizeof(LoaderPosition));
    }
    assert_int_equal(loader_set_position(b, (LoaderPosition){0, 8}), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "did data.paths change"));
    assert_int_equal(loader_set_position(b, (LoaderPosition){-1, 0}), SPES_ERR);
    loader_free(a);
    loader_free(b);
    token_dataset_close(ds);
}

static void test_eval_loader_ends(void **state) {
    (void)state;
    TokenDataset *ds = open_counting_dataset(5, 4);
    LoaderOptions opt = {.batch_size = 2, .shuffle = false, .drop_last = false, .wrap = false};
    DataLoader *dl;
    assert_int_equal(loader_create(ds, &opt, &dl), SPES_OK);
    const Batch *b;
    int rows = 0, batches = 0;
    for (;;) {
        assert_int_equal(loader_next(dl, &b), SPES_OK);
        if (b->rows == 0) break;
        for (int r = 0; r < b->rows; r++) assert_int_equal(b->inputs[r * 4], 10 * (rows + r));
        rows += b->rows;
        batches++;
    }
    assert_int_equal(rows, 5);
    assert_int_equal(batches, 3);
    assert_int_equal(loader_next(dl, &b), SPES_OK);   // stays at the end until reset
    assert_int_equal(b->rows, 0);
    assert_int_equal(loader_set_position(dl, (LoaderPosition){0, 0}), SPES_OK);
    assert_int_equal(loader_next(dl, &b), SPES_OK);
    assert_int_equal(b->inputs[0], 0);
    loader_free(dl);
    token_dataset_close(ds);
}

// From a config: train loader (shuffled by data.seed) and an lm evaluator; errors name the part.
static void test_open_from_config(void **state) {
    (void)state;
    char *f = write_u16("cfg.npy", 64, 0);
    char yaml[4096];
    snprintf(yaml, sizeof yaml,
             "model:\n  max_sequence_length: 8\n  vocab_size: 257\n  eos_token_id: 256\n  pad_token_id: 256\n"
             "data:\n  paths: [%s]\n  seed: 3\n  drop_last: true\n"
             "global_train_batch_size: 4\ndevice_train_microbatch_size: 2\ndevice_eval_batch_size: 3\n"
             "evaluators:\n  - label: val\n    data:\n      paths: [%s]\n",
             f, f);
    TrainConfig cfg;
    assert_int_equal(config_load_string(yaml, "d.yaml", 0, NULL, &cfg), SPES_OK);
    TokenDataset *ds;
    DataLoader *dl;
    assert_int_equal(loader_open_train(&cfg, &ds, &dl), SPES_OK);
    assert_int_equal(token_dataset_len(ds), 8);
    const Batch *b;
    assert_int_equal(loader_next(dl, &b), SPES_OK);
    uint32_t perm[8];
    pcg64_permutation(3, perm, 8);
    assert_int_equal(b->inputs[0], (int)perm[0] * 8);
    loader_free(dl);
    token_dataset_close(ds);
    assert_int_equal(loader_open_eval(&cfg, &cfg.evaluators[0], &ds, &dl), SPES_OK);
    assert_int_equal(loader_next(dl, &b), SPES_OK);
    assert_int_equal(b->rows, 3);
    loader_free(dl);
    token_dataset_close(ds);
    config_free(&cfg);

    assert_int_equal(config_load_string("data:\n  paths: [/nonexistent/t.npy]\n", "d.yaml", 0, NULL, &cfg), SPES_OK);
    assert_int_equal(loader_open_train(&cfg, &ds, &dl), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "training data"));
    assert_non_null(strstr(spes_last_error(), "/nonexistent/t.npy"));
    config_free(&cfg);
    free(f);
}

// The whole order against a numpy re-statement of OLMo's MemMapDataset + IterableDataset
// (instances per file = tokens // T, concatenated; epoch e order =
// Generator(PCG64(seed + e)).permutation(N); drop_last batches), over an epoch boundary.
static void test_order_matches_olmo_numpy(void **state) {
    (void)state;
    static const char script[] =
        "import numpy as np, sys, os\n"
        "d = sys.argv[1]; T = 16; seed = 6198; bs = 6\n"
        "sizes = [333, 16, 1000, 47]\n"
        "files = []\n"
        "for i, n in enumerate(sizes):\n"
        "    a = ((np.arange(n, dtype=np.uint32) * 7 + i * 100003) % 151000).astype(np.uint32)\n"
        "    p = os.path.join(d, 'olmo_%d.npy' % i); a.tofile(p); files.append(p)\n"
        "print(' '.join(files))\n"
        "inst = []\n"
        "for p in files:\n"
        "    m = np.memmap(p, dtype=np.uint32, mode='r')\n"
        "    for k in range(len(m) // T): inst.append(m[k * T:(k + 1) * T])\n"
        "N = len(inst)\n"
        "out = []\n"
        "for epoch in range(2):\n"
        "    idx = np.arange(N, dtype=np.uint32)\n"
        "    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(idx)\n"
        "    for b in range(N // bs):\n"
        "        for j in idx[b * bs:(b + 1) * bs]: out.append(int(inst[j].astype(np.int64).sum()))\n"
        "print(' '.join(map(str, out)))\n";
    char script_path[4200];
    FILE *py = open_python(script, script_path, sizeof script_path);
    if (!py) skip();
    static char files_line[8192], sums_line[1 << 16];
    if (!fgets(files_line, sizeof files_line, py) || !fgets(sums_line, sizeof sums_line, py)) {
        pclose(py);
        skip();   // venv without numpy
    }
    pclose(py);
    char *paths[8];
    int n_paths = 0;
    for (char *tok = strtok(files_line, " \n"); tok && n_paths < 8; tok = strtok(NULL, " \n")) paths[n_paths++] = tok;
    assert_int_equal(n_paths, 4);
    TokenDataset *ds;
    assert_int_equal(token_dataset_open(paths, n_paths, MEMMAP_UINT32, 16, 151665, &ds), SPES_OK);
    assert_int_equal(token_dataset_len(ds), 20 + 1 + 62 + 2);
    LoaderOptions opt = {.batch_size = 6, .shuffle = true, .seed = 6198, .drop_last = true, .wrap = true};
    DataLoader *dl;
    assert_int_equal(loader_create(ds, &opt, &dl), SPES_OK);
    char *p = sums_line;
    int compared = 0;
    for (int k = 0; k < 2 * 14; k++) {   // 85 // 6 = 14 batches an epoch (one instance dropped), two epochs
        const Batch *b;
        assert_int_equal(loader_next(dl, &b), SPES_OK);
        for (int r = 0; r < b->rows; r++) {
            long long sum = 0;
            for (int t = 0; t < 16; t++) sum += b->inputs[r * 16 + t];
            long long want = strtoll(p, &p, 10);
            if (sum != want) fail_msg("batch %d row %d: instance sum %lld, OLMo/numpy %lld", k, r, sum, want);
            compared++;
        }
    }
    assert_int_equal(compared, 2 * 84);
    loader_free(dl);
    token_dataset_close(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pcg64_known_answers),
        cmocka_unit_test(test_permutation_matches_numpy),
        cmocka_unit_test(test_instances_cut_like_olmo),
        cmocka_unit_test(test_npy_and_manifest),
        cmocka_unit_test(test_data_errors),
        cmocka_unit_test(test_bad_token_deep_in_data),
        cmocka_unit_test(test_fifo_refused),
        cmocka_unit_test(test_manifest_escapes),
        cmocka_unit_test(test_inputs_and_targets),
        cmocka_unit_test(test_instance_filter_masks_rows),
        cmocka_unit_test(test_drop_last_and_epochs),
        cmocka_unit_test(test_resume_from_position),
        cmocka_unit_test(test_next_range),
        cmocka_unit_test(test_eval_loader_ends),
        cmocka_unit_test(test_open_from_config),
        cmocka_unit_test(test_order_matches_olmo_numpy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
