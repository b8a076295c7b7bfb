// Hugging Face model directories in: config.json + model.safetensors, or shards listed by
// model.safetensors.index.json (what save_pretrained writes above max_shard_size). Tensors
// may be F32, BF16, F16 or F64; they are converted to our fp32 parameter buffer by name.
#pragma once
#include "io/safetensors.h"
#include "model/model.h"

// Every safetensors file of a model directory, opened (memory-mapped).
typedef struct {
    SafeTensors *shards;
    char **shard_paths;
    int count;
} HfTensorSet;

int hf_tensors_open(const char *dir, HfTensorSet *out);
void hf_tensors_close(HfTensorSet *set);
// The tensor called `name` in any shard, NULL when absent.
const StTensor *hf_tensors_find(const HfTensorSet *set, const char *name);
// Copies `name` (converted to fp32) into dst after checking its shape is exactly
// [rows] (cols == 0) or [rows, cols]. Errors name the tensor and both shapes.
int hf_tensor_read(const HfTensorSet *set, const char *name, int64_t rows, int64_t cols, float *dst);

// Fills every parameter of m (already created for its config) from the set. All problems
// are collected into one error: missing tensors, mis-shaped ones (with both shapes), and
// non-float dtypes, up to a dozen of each named. lm_head.weight may be absent when
// tie_lm_head is set (tied embeddings): it is then a copy of the embedding.
int hf_tensors_load_model(const HfTensorSet *set, Model *m, bool tie_lm_head);
// Values of x[0..n) that are NaN or +-Inf (no trained model or optimizer state holds one).
size_t count_nonfinite(const float *x, size_t n);

// model_create with every tensor frozen (no gradient memory): for eval, generate, export.
int model_create_frozen(Model *m, const ModelConfig *cfg);

// config.json (hf_config_read) + tensors -> a new model with frozen gradients (eval use;
// call model_set_trainable to train it).
int model_load_hf_dir(const char *dir, Model *m);
