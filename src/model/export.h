// Hugging Face export: a model directory that transformers loads with
// AutoModelForCausalLM.from_pretrained, as OlmoeForCausalLM (QK-norm full) or
// Qwen3MoeForCausalLM (QK-norm per head):
//   config.json                     every field from our ModelConfig (hf_config_write)
//   model.safetensors               or model-0000i-of-0000N.safetensors shards plus
//   model.safetensors.index.json    when the tensors exceed max_shard_bytes
//   generation_config.json          the source's, unchanged, when it has one; else
//                                   config.json's bos/eos/pad ids (none forced)
//   tokenizer files                 copied when a tokenizer is given
// Every file is written atomically; stale shards of an earlier export in the same
// directory are removed first so the index never mixes two exports.
#pragma once
#include <stdint.h>

#include "io/safetensors.h"
#include "model/model.h"

typedef enum { HF_FORMAT_AUTO = 0, HF_FORMAT_OLMOE, HF_FORMAT_QWEN3_MOE } HfFormat;

typedef struct {
    HfFormat format;            // AUTO: olmoe for QK-norm full, qwen3_moe for per head
    DType dtype;                // DTYPE_F32 or DTYPE_BF16
    const char *tokenizer;      // tokenizer.json or a directory with tokenizer files; NULL: none
    uint64_t max_shard_bytes;   // 0: 5 GB (HF's default)
    // A directory whose generation_config.json, when it has one, is written unchanged (its
    // eos ids checked against the vocabulary); NULL: built from the model's special token ids.
    const char *generation_config_dir;
} HfExportOptions;

#define HF_DEFAULT_MAX_SHARD_BYTES (5ull * 1000 * 1000 * 1000)

// "olmoe" / "qwen3_moe" / "auto".
int hf_format_parse(const char *name, HfFormat *out);
// The format a model gets under AUTO; an error when the model has no HF MoE equivalent
// (QK-norm none: both OlmoeForCausalLM and Qwen3MoeForCausalLM always apply a QK-norm).
int hf_format_for_model(const ModelConfig *cfg, HfFormat requested, HfFormat *out);
const char *hf_format_name(HfFormat format);
// "f32" / "float32" / "bf16" / "bfloat16" -> the export dtype.
int hf_dtype_parse(const char *name, DType *out);
// "5GB", "500MB", "20KB", "1234" (bytes; decimal units like HF: 1KB = 1000 bytes).
int parse_byte_size(const char *text, uint64_t *out);

int model_export_hf(const Model *m, const char *out_dir, const HfExportOptions *opt);

// The tensor part alone: the parameter table's tensors (fp32 or bf16) as one file or
// shards + index. Used by model_export_hf.
int hf_write_tensors(const Model *m, const char *out_dir, DType dtype, uint64_t max_shard_bytes);
