// Token-file dataset: OLMo MemMapDataset instance cutting over memory-mapped token files.
#include "data/dataset.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/printable.h"
#include "data/token_ids_check.h"
#include "io/npy.h"

typedef struct {
    char *path;
    TokenFile tf;
    int64_t first;          // global index of this file's first instance
    int64_t instances;      // floor(tokens / seq_len)
} DatasetFile;

struct TokenDataset {
    DatasetFile *files;
    int n_files, cap_files;
    int seq_len;
    int vocab_size;
    int64_t len;
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// Maps one token file and appends it. A file that cannot hold one instance is an error:
// OLMo would silently contribute nothing from it, which hides a wrong path or dtype.
static int add_file(TokenDataset *ds, const char *path, TokenDtype raw_dtype) {
    if (ds->n_files == ds->cap_files) {
        int cap = ds->cap_files ? ds->cap_files * 2 : 16;
        DatasetFile *files = spes_realloc(ds->files, (size_t)cap * sizeof(DatasetFile));
        if (!files) return SPES_ERR;
        ds->files = files;
        ds->cap_files = cap;
    }
    DatasetFile *f = &ds->files[ds->n_files];
    *f = (DatasetFile){0};
    if (!(f->path = spes_strdup(path))) return SPES_ERR;
    if (token_file_open(path, raw_dtype, &f->tf) != SPES_OK) {
        free(f->path);
        return spes_fail_context("data file");
    }
    ds->n_files++;   // from here on token_dataset_close releases it
    if (f->tf.count == 0) return spes_fail("data file %s is empty", path);
    SPES_TRY(token_ids_check(&f->tf, path, ds->vocab_size));
    f->instances = (int64_t)(f->tf.count / (uint64_t)ds->seq_len);
    if (f->instances == 0)
        return spes_fail("data file %s holds %" PRIu64 " tokens, fewer than one instance of max_sequence_length = %d "
                         "(remove it from data.paths, or check data.memmap_dtype)",
                         path, f->tf.count, ds->seq_len);
    f->first = ds->len;
    ds->len += f->instances;
    return SPES_OK;
}

// A manifest: one token-file path a line; blank lines and # comments skipped.
static int add_manifest(TokenDataset *ds, const char *manifest, TokenDtype raw_dtype) {
    uint8_t *text;
    size_t len;
    if (file_read_all(manifest, &text, &len) != SPES_OK) return spes_fail_context("data manifest");
    int before = ds->n_files, rc = SPES_OK, line_no = 0;
    char *next = (char *)text, *end = (char *)text + len;
    while (next < end && rc == SPES_OK) {
        char *line = next, *nl = memchr(line, '\n', (size_t)(end - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(end - line);
        next = line + n + 1;
        line[n] = '\0';   // the NUL after the buffer (file_read_all) or the newline
        line_no++;
        while (n > 0 && (*line == ' ' || *line == '\t')) line++, n--;
        while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = '\0';
        if (n == 0 || line[0] == '#') continue;
        // A line is echoed in every message about it: control bytes or broken UTF-8 (a binary
        // file given as a manifest, a corrupted one) are refused here, shown escaped.
        if (!is_printable(line, n)) {
            char shown[160];
            rc = spes_fail("data manifest %s:%d: the entry is not a printable path ('%s'); is this really a manifest "
                           "(one token-file path a line)?",
                           manifest, line_no, escape_printable(line, n, shown, sizeof shown));
            break;
        }
        if (ends_with(line, ".txt")) {
            rc = spes_fail("data manifest %s:%d: entry '%s' is itself a manifest; manifests do not nest", manifest,
                           line_no, line);
            break;
        }
        if ((rc = add_file(ds, line, raw_dtype)) != SPES_OK) spes_fail_context("data manifest %s:%d", manifest, line_no);
    }
    free(text);
    if (rc == SPES_OK && ds->n_files == before) rc = spes_fail("data manifest %s lists no token files", manifest);
    return rc;
}

int token_dataset_open(char *const *paths, int n_paths, MemmapDtype dtype, int seq_len, int vocab_size,
                       TokenDataset **out) {
    *out = NULL;
    if (n_paths <= 0) return spes_fail("no token files given (data.paths is empty)");
    if (seq_len < 2) return spes_fail("max_sequence_length must be >= 2 to cut instances, got %d", seq_len);
    TokenDataset *ds = spes_calloc(1, sizeof(TokenDataset));
    if (!ds) return SPES_ERR;
    ds->seq_len = seq_len;
    ds->vocab_size = vocab_size;
    TokenDtype raw = dtype == MEMMAP_UINT32 ? TOKEN_U32 : TOKEN_U16;
    for (int i = 0; i < n_paths; i++) {
        int rc = ends_with(paths[i], ".txt") ? add_manifest(ds, paths[i], raw) : add_file(ds, paths[i], raw);
        if (rc != SPES_OK) {
            token_dataset_close(ds);
            return SPES_ERR;
        }
    }
    *out = ds;
    return SPES_OK;
}

void token_dataset_close(TokenDataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_files; i++) {
        token_file_close(&ds->files[i].tf);
        free(ds->files[i].path);
    }
    free(ds->files);
    free(ds);
}

int64_t token_dataset_len(const TokenDataset *ds) { return ds->len; }
int token_dataset_seq_len(const TokenDataset *ds) { return ds->seq_len; }
int token_dataset_num_files(const TokenDataset *ds) { return ds->n_files; }
const char *token_dataset_file_path(const TokenDataset *ds, int file) { return ds->files[file].path; }
int64_t token_dataset_file_instances(const TokenDataset *ds, int file) { return ds->files[file].instances; }

int token_dataset_get(const TokenDataset *ds, int64_t index, int32_t *tokens) {
    if (index < 0 || index >= ds->len)
        return spes_fail("instance %" PRId64 " is outside the dataset (%" PRId64 " instances)", index, ds->len);
    // binary search for the file holding `index`
    int lo = 0, hi = ds->n_files - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->files[mid].first <= index) lo = mid;
        else hi = mid - 1;
    }
    const DatasetFile *f = &ds->files[lo];
    uint64_t start = (uint64_t)(index - f->first) * (uint64_t)ds->seq_len;
    uint32_t *ids = (uint32_t *)tokens;   // same size; converted in place below
    if (token_file_read_u32(&f->tf, start, (size_t)ds->seq_len, ids) != SPES_OK)
        return spes_fail_context("data file %s", f->path);
    for (int t = 0; t < ds->seq_len; t++) {
        if (ds->vocab_size > 0 && ids[t] >= (uint32_t)ds->vocab_size)
            return spes_fail("data file %s: token id %" PRIu32 " at token %" PRIu64 " is >= model.vocab_size (%d): "
                             "the data was tokenized for a different vocabulary",
                             f->path, ids[t], start + (uint64_t)t, ds->vocab_size);
        tokens[t] = (int32_t)ids[t];
    }
    return SPES_OK;
}
