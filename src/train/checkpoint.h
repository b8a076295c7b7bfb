// Training checkpoints: save_folder/stepN/ holding
//   model.safetensors        every parameter, F32, Hugging Face names   } loadable by HF
//   config.json              HF OlmoeForCausalLM / Qwen3MoeForCausalLM  } transformers
//   config.yaml              the resolved training config (for humans and reruns)
//   generation_config.json   only when the run's source model had one (TrainState.generation_config:
//                            load_path's, or the newest checkpoint's when load_path's is gone),
//                            which `spes export` writes unchanged
//   train_state.safetensors  AdamW moments of the trainable tensors: exp_avg.<name>, exp_avg_sq.<name>,
//                            and with max_grad_norm_ratio the norm averages grad_norm_exp_avg.<name>
//   train_state.json         step, tokens seen, optimizer step, data-loader position and
//                            seed, config hash, trainable-set summary, schema version, and
//                            "synced": false when a SPES peer saved its local weights after
//                            the step's sync round failed or was interrupted, and
//                            "loss_scale" / "loss_scale_good_steps" under amp_fp16
// Everything is written into save_folder/stepN.tmp/ (each file fsync'd), then the directory
// is renamed to stepN and the folder fsync'd: a stepN directory is always complete.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "data/loader.h"
#include "model/model.h"
#include "train/optimizer.h"

#define CHECKPOINT_SCHEMA_VERSION 1

typedef struct {
    int64_t step;               // optimizer steps done
    int64_t tokens_seen;        // training tokens consumed (inputs, all instances)
    LoaderPosition data;        // where the next training batch starts
    uint64_t data_seed;         // data.seed the loader order derives from
    uint64_t config_hash;       // config_hash() of the run that wrote it
    bool unsynced;              // SPES peer: step's sync round never completed, these are the
                                // local weights (train_state.json "synced": false); resume redoes it
    double loss_scale;          // amp_fp16 dynamic loss scale (0: loss scaling off, not written)
    int64_t loss_scale_good_steps;   // finite steps since the scale last changed
    // More files in the checkpoint (a SPES peer's int8 sync state, spes_peer.h): called with the
    // step directory being written, before it is made durable. NULL: none. Not saved itself.
    int (*save_extra)(void *ctx, const char *dir);
    void *save_extra_ctx;
    // The run's source model's generation_config.json (train/source_model.h), written unchanged
    // into every checkpoint; NULL: none. Owned by the trainer. Not saved in train_state.json.
    const uint8_t *generation_config;
    size_t generation_config_len;
} TrainState;

// Writes save_folder/step<state->step>/ atomically (see above). cfg supplies config.yaml.
// An existing directory of that step is replaced atomically (renameat2 RENAME_EXCHANGE where
// the filesystem has it): a crash leaves the old checkpoint or the new one.
int checkpoint_save(const char *save_folder, const Model *m, const AdamW *opt, const TrainState *state,
                    const TrainConfig *cfg);

// Room for a checkpoint's small files (config.json, config.yaml, train_state.json, a
// generation_config.json): an allowance, not their measure; the .safetensors are exact.
#define CHECKPOINT_SMALL_FILES_BYTES ((size_t)64 << 10)
// Bytes one checkpoint of `table` takes on disk: model.safetensors and train_state.safetensors
// as checkpoint_save writes them (headers included), the small files' allowance, and `extra`
// (what save_extra adds: a SPES peer's sync state, spes_peer_state_bytes).
int checkpoint_disk_bytes(const ParamTable *table, size_t extra, size_t *bytes);
// What max_grad_norm_ratio's norm averages add to train_state.safetensors once every trainable
// tensor has one (from step 2 on): to add to checkpoint_disk_bytes' `extra`.
int checkpoint_norm_avg_bytes(const ParamTable *table, size_t *bytes);

// Restores parameters, AdamW moments + step and the train state from a step directory. The
// model's trainable set must be the one the checkpoint was written with (checked by name).
int checkpoint_load(const char *dir, Model *m, AdamW *opt, TrainState *state);
// Reads only train_state.json (cheap: for the config-hash check before loading).
int checkpoint_read_state(const char *dir, TrainState *state);

// Newest complete save_folder/stepN (has train_state.json). *dir = NULL, *step = -1 when none.
int checkpoint_find_latest(const char *save_folder, char **dir, int64_t *step);
// How many complete step directories save_folder holds (a missing folder: 0).
int checkpoint_count(const char *save_folder, int *count);
// Removes the oldest complete step directories until `keep` remain (keep <= 0: keep all),
// and any leftover stepN.tmp directory from an interrupted save.
int checkpoint_prune(const char *save_folder, int keep);

// Removes every step directory (complete or not) of save_folder (save_overwrite).
int checkpoint_remove_all(const char *save_folder);

// Writes the tensors of `table` as one F32 safetensors file, for each of n_bufs buffers:
// with grad_layout false, every tensor's slice of the buffer (parameter offsets); with true,
// the trainable tensors' slices of a compact gradient-layout buffer (grad offsets). Tensor
// names are "<prefix><HF name>". Serves model.safetensors and the optimizer moments.
int checkpoint_write_table(const char *path, const ParamTable *table, bool grad_layout, int n_bufs,
                           const float *const *bufs, const char *const *prefixes);
// The reverse: every tensor the layout names must be present with the same shape.
int checkpoint_read_table(const char *path, const ParamTable *table, bool grad_layout, int n_bufs,
                          float *const *bufs, const char *const *prefixes);
