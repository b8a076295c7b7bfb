// Batch loader over a TokenDataset, ordered exactly like OLMo's IterableDataset on one rank:
// epoch e visits the instances in the order np.random.Generator(np.random.PCG64(seed + e))
// .permutation(N) (pcg64.h reproduces numpy bit for bit), batch after batch of batch_size
// consecutive entries. With drop_last, an epoch's last incomplete batch is skipped;
// without it that batch comes out short (rows < batch_size).
//
// Each row is one instance x[0..T-1]: inputs = x[0..T-1], targets = x[1..T-1] followed by
// IGNORE_INDEX, so the loss predicts positions 1..T-1 of every instance (OLMo's labels). An
// instance the instance filter rejects (data/instance_filter.h) has every target IGNORE_INDEX.
//
// The position (epoch, index into the epoch's permutation) of the NEXT batch is all the
// state there is: it goes into checkpoints, and loader_set_position resumes bit-exactly.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/dataset.h"

typedef struct {
    int64_t epoch;      // shuffle seed of this epoch is seed + epoch
    int64_t index;      // instances of this epoch already handed out
} LoaderPosition;

typedef struct {
    int batch_size;     // instances per batch (global_train_batch_size for training)
    bool shuffle;       // false: dataset order (evaluation)
    uint64_t seed;      // data.seed
    bool drop_last;
    bool wrap;          // true: at the end of an epoch go on with the next (training);
                        // false: loader_next reports the end (evaluation)
    InstanceFilterConfig filter;   // data.instance_filter (training); .enabled false: none
} LoaderOptions;

typedef struct {
    int32_t *inputs;    // [batch_size * T]; the first rows*T are valid
    int32_t *targets;   // [batch_size * T]; IGNORE_INDEX at each row's last position (and
                        // everywhere in a row the instance filter rejects)
    int rows;           // instances in this batch (0 at the end of a non-wrapping epoch)
    int T;              // seq_len
    LoaderPosition position;   // where this batch starts
} Batch;

typedef struct DataLoader DataLoader;

// The loader borrows ds (it must outlive the loader).
int loader_create(const TokenDataset *ds, const LoaderOptions *opt, DataLoader **out);
void loader_free(DataLoader *dl);

// The next batch (valid until the next call). rows == 0 only when !wrap and the epoch is over.
int loader_next(DataLoader *dl, const Batch **batch);
// The rows the next batch will have (loader_next's batch->rows), without moving.
int loader_peek_rows(const DataLoader *dl);
// loader_next reading only rows [row_lo, row_hi) of the batch (clipped to its rows; the other
// rows of inputs/targets are left as they were): a rank of a data-parallel job reads just its
// micro-batches. The position moves past the whole batch, as loader_next's does.
int loader_next_range(DataLoader *dl, int row_lo, int row_hi, const Batch **batch);

LoaderPosition loader_get_position(const DataLoader *dl);
// Resume: the next batch starts at pos (validated against the dataset size).
int loader_set_position(DataLoader *dl, LoaderPosition pos);
// Full batches per epoch (plus one short batch when !drop_last and N % batch_size != 0).
int64_t loader_batches_per_epoch(const DataLoader *dl);

// Opens the training dataset and loader from a config (data.*, max_sequence_length,
// vocab_size, global_train_batch_size, shuffle with data.seed, wrap, data.instance_filter).
int loader_open_train(const TrainConfig *cfg, TokenDataset **ds, DataLoader **dl);
// The same for an lm evaluator: dataset order, device_eval_batch_size, no wrap, no drop.
int loader_open_eval(const TrainConfig *cfg, const EvaluatorConfig *ev, TokenDataset **ds, DataLoader **dl);
