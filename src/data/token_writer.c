#include "data/token_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"

struct TokenWriter {
    char *prefix;
    int proc;
    uint64_t max_shard_bytes;
    int dtype_bytes;
    AtomicFile file;
    int open;                 // a shard is being written
    uint64_t shard_bytes;     // bytes in the open shard
    uint64_t shards;          // committed shards
    uint64_t tokens;
    uint8_t buf[1 << 16];     // little-endian conversion buffer
};

int token_writer_open(const char *prefix, int proc, uint64_t max_shard_bytes, int dtype_bytes, TokenWriter **out) {
    *out = NULL;
    if (dtype_bytes != 2 && dtype_bytes != 4) return spes_fail("token dtype must be 2 or 4 bytes, not %d", dtype_bytes);
    if (max_shard_bytes < (uint64_t)dtype_bytes) return spes_fail("max_shard_bytes %llu is smaller than one token",
                                                                  (unsigned long long)max_shard_bytes);
    // Like os.makedirs(os.path.dirname(output_prefix)): everything before the last '/' (the
    // prefix may end in a file-name part, or in '/' when it is a directory).
    const char *slash = strrchr(prefix, '/');
    if (slash && slash > prefix) {
        char *dir = spes_strdup(prefix);
        if (!dir) return SPES_ERR;
        dir[slash - prefix] = 0;
        int rc = mkdir_p(dir);
        free(dir);
        SPES_TRY(rc);
    }
    TokenWriter *w = spes_calloc(1, sizeof *w);
    if (!w || !(w->prefix = spes_strdup(prefix))) {
        free(w);
        return SPES_ERR;
    }
    w->proc = proc;
    w->max_shard_bytes = max_shard_bytes;
    w->dtype_bytes = dtype_bytes;
    *out = w;
    return SPES_OK;
}

static int commit_shard(TokenWriter *w) {
    w->open = 0;
    SPES_TRY(atomic_file_commit(&w->file));
    w->shards++;
    return SPES_OK;
}

static int start_shard(TokenWriter *w) {
    size_t n = strlen(w->prefix) + 32;
    char *path = spes_malloc(n);
    if (!path) return SPES_ERR;
    snprintf(path, n, "%s%03d_%06llu.npy", w->prefix, w->proc, (unsigned long long)(w->shards + 1));
    int rc = atomic_file_open(&w->file, path);
    free(path);
    SPES_TRY(rc);
    w->open = 1;
    w->shard_bytes = 0;
    return SPES_OK;
}

int token_writer_add(TokenWriter *w, const uint32_t *ids, size_t n) {
    uint64_t bytes = (uint64_t)n * (uint64_t)w->dtype_bytes;
    if (w->open && w->shard_bytes > 0 && w->shard_bytes + bytes > w->max_shard_bytes) SPES_TRY(commit_shard(w));
    if (!w->open) SPES_TRY(start_shard(w));
    size_t per_chunk = sizeof w->buf / (size_t)w->dtype_bytes;
    for (size_t i = 0; i < n; i += per_chunk) {
        size_t k = n - i < per_chunk ? n - i : per_chunk;
        for (size_t j = 0; j < k; j++) {
            uint32_t id = ids[i + j];
            if (w->dtype_bytes == 2) {
                if (id > UINT16_MAX) return spes_fail("token id %u does not fit uint16", id);
                w->buf[2 * j] = (uint8_t)id;
                w->buf[2 * j + 1] = (uint8_t)(id >> 8);
            } else {
                for (int b = 0; b < 4; b++) w->buf[4 * j + (size_t)b] = (uint8_t)(id >> (8 * b));
            }
        }
        SPES_TRY(atomic_file_write(&w->file, w->buf, k * (size_t)w->dtype_bytes));
    }
    w->shard_bytes += bytes;
    w->tokens += n;
    return SPES_OK;
}

int token_writer_close(TokenWriter *w, uint64_t *shards) {
    int rc = SPES_OK;
    if (w->open && w->shard_bytes) rc = commit_shard(w);
    else if (w->open) atomic_file_abort(&w->file);
    if (shards) *shards = w->shards;
    free(w->prefix);
    free(w);
    return rc;
}

void token_writer_abort(TokenWriter *w) {
    if (!w) return;
    if (w->open) atomic_file_abort(&w->file);
    free(w->prefix);
    free(w);
}

uint64_t token_writer_shards(const TokenWriter *w) { return w->shards; }
uint64_t token_writer_tokens(const TokenWriter *w) { return w->tokens; }
