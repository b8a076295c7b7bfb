// Batches in OLMo's order: numpy permutation per epoch, consecutive slices of it.
#include "data/loader.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "data/instance_filter.h"
#include "data/pcg64.h"
#include "model/model_config.h"

struct DataLoader {
    const TokenDataset *ds;
    LoaderOptions opt;
    int64_t n;              // instances per epoch
    uint32_t *perm;         // [n] order of the epoch perm_epoch (shuffle only)
    int64_t perm_epoch;     // -1: none computed yet
    LoaderPosition pos;     // where the next batch starts
    Batch batch;
};

int loader_create(const TokenDataset *ds, const LoaderOptions *opt, DataLoader **out) {
    *out = NULL;
    int64_t n = token_dataset_len(ds);
    if (opt->batch_size <= 0) return spes_fail("loader: batch size must be > 0, got %d", opt->batch_size);
    if (n <= 0) return spes_fail("loader: the dataset holds no instances");
    if (opt->shuffle && (uint64_t)n >= UINT32_MAX)
        return spes_fail("loader: %" PRId64 " instances is more than OLMo's uint32 shuffle indices hold", n);
    if (opt->drop_last && opt->wrap && n < opt->batch_size)
        return spes_fail("loader: the dataset holds %" PRId64 " instances, fewer than one batch of %d (with "
                         "data.drop_last every batch would be dropped)", n, opt->batch_size);
    DataLoader *dl = spes_calloc(1, sizeof(DataLoader));
    if (!dl) return SPES_ERR;
    dl->ds = ds;
    dl->opt = *opt;
    dl->n = n;
    dl->perm_epoch = -1;
    int T = token_dataset_seq_len(ds);
    size_t count;
    if (!spes_mul_size((size_t)opt->batch_size, (size_t)T, &count) ||
        !(dl->batch.inputs = spes_calloc(count, sizeof(int32_t))) ||
        !(dl->batch.targets = spes_calloc(count, sizeof(int32_t))) ||
        (opt->shuffle && !(dl->perm = spes_calloc((size_t)n, sizeof(uint32_t))))) {
        loader_free(dl);
        return spes_fail_context("loader");
    }
    dl->batch.T = T;
    *out = dl;
    return SPES_OK;
}

void loader_free(DataLoader *dl) {
    if (!dl) return;
    free(dl->batch.inputs);
    free(dl->batch.targets);
    free(dl->perm);
    free(dl);
}

static int64_t instance_at(DataLoader *dl, int64_t i) {
    if (!dl->opt.shuffle) return i;
    if (dl->perm_epoch != dl->pos.epoch) {
        // OLMo: np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(arange(n))
        pcg64_permutation(dl->opt.seed + (uint64_t)dl->pos.epoch, dl->perm, (uint64_t)dl->n);
        dl->perm_epoch = dl->pos.epoch;
    }
    return dl->perm[i];
}

// Where the next batch starts and how many rows it has (an epoch that is over rolls into the
// next when the loader wraps; rows 0: the end of a non-wrapping epoch).
static void next_start(const DataLoader *dl, LoaderPosition *start, int *rows) {
    *start = dl->pos;
    int64_t remaining = dl->n - start->index;
    bool epoch_over = remaining <= 0 || (dl->opt.drop_last && remaining < dl->opt.batch_size);
    if (epoch_over) {
        if (!dl->opt.wrap) {
            *rows = 0;
            return;
        }
        start->epoch++;
        start->index = 0;
        remaining = dl->n;
    }
    *rows = remaining < dl->opt.batch_size ? (int)remaining : dl->opt.batch_size;
}

int loader_peek_rows(const DataLoader *dl) {
    LoaderPosition start;
    int rows;
    next_start(dl, &start, &rows);
    return rows;
}

int loader_next_range(DataLoader *dl, int row_lo, int row_hi, const Batch **batch) {
    int rows;
    next_start(dl, &dl->pos, &rows);
    int T = dl->batch.T, lo = row_lo < 0 ? 0 : row_lo, hi = row_hi < rows ? row_hi : rows;
    for (int r = lo; r < hi; r++) {
        int32_t *x = dl->batch.inputs + (size_t)r * T;
        int32_t *y = dl->batch.targets + (size_t)r * T;
        SPES_TRY(token_dataset_get(dl->ds, instance_at(dl, dl->pos.index + r), x));
        // the loss predicts x[1..T-1] from x[0..T-2]; the last position has no target, and a
        // filtered instance none at all (OLMo's instance_mask)
        bool keep = instance_filter_keeps(&dl->opt.filter, x, T);
        for (int t = 0; t + 1 < T; t++) y[t] = keep ? x[t + 1] : IGNORE_INDEX;
        y[T - 1] = IGNORE_INDEX;
    }
    dl->batch.rows = rows;
    dl->batch.position = dl->pos;
    dl->pos.index += rows;
    *batch = &dl->batch;
    return SPES_OK;
}

int loader_next(DataLoader *dl, const Batch **batch) { return loader_next_range(dl, 0, INT_MAX, batch); }

LoaderPosition loader_get_position(const DataLoader *dl) { return dl->pos; }

int loader_set_position(DataLoader *dl, LoaderPosition pos) {
    if (pos.epoch < 0 || pos.index < 0 || pos.index > dl->n)
        return spes_fail("loader: position (epoch %" PRId64 ", index %" PRId64 ") does not fit a dataset of %" PRId64
                         " instances (did data.paths change since the checkpoint?)",
                         pos.epoch, pos.index, dl->n);
    dl->pos = pos;
    return SPES_OK;
}

int64_t loader_batches_per_epoch(const DataLoader *dl) {
    int64_t bs = dl->opt.batch_size;
    return dl->opt.drop_last ? dl->n / bs : (dl->n + bs - 1) / bs;
}

static int open_loader(const TrainConfig *cfg, char *const *paths, int n_paths, const LoaderOptions *opt,
                       TokenDataset **ds, DataLoader **dl) {
    *ds = NULL;
    *dl = NULL;
    SPES_TRY(token_dataset_open(paths, n_paths, cfg->data.memmap_dtype, cfg->model.max_seq_len, cfg->model.vocab_size, ds));
    if (loader_create(*ds, opt, dl) != SPES_OK) {
        token_dataset_close(*ds);
        *ds = NULL;
        return SPES_ERR;
    }
    return SPES_OK;
}

int loader_open_train(const TrainConfig *cfg, TokenDataset **ds, DataLoader **dl) {
    LoaderOptions opt = {.batch_size = cfg->global_train_batch_size, .shuffle = true, .seed = (uint64_t)cfg->data.seed,
                         .drop_last = cfg->data.drop_last, .wrap = true, .filter = cfg->data.instance_filter};
    if (open_loader(cfg, cfg->data.paths, cfg->data.n_paths, &opt, ds, dl) != SPES_OK)
        return spes_fail_context("training data");
    return SPES_OK;
}

int loader_open_eval(const TrainConfig *cfg, const EvaluatorConfig *ev, TokenDataset **ds, DataLoader **dl) {
    LoaderOptions opt = {.batch_size = cfg->device_eval_batch_size, .shuffle = false, .seed = 0, .drop_last = false,
                         .wrap = false};
    if (open_loader(cfg, ev->paths, ev->n_paths, &opt, ds, dl) != SPES_OK)
        return spes_fail_context("evaluator '%s'", ev->label);
    return SPES_OK;
}
