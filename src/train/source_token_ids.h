// The special token ids (bos, eos or its list, pad) a run's checkpoints write in config.json.
// The model a run starts from has them in load_path's config.json (an upcycled Qwen3: eos
// [151645, 151643], bos none); the YAML's model section holds OLMo's defaults (50256, GPT-2's
// ids) unless it sets them. So the source's ids are taken where the YAML sets none, and a YAML
// value that contradicts them wins with a warning naming both. Decided once, at the start.
#pragma once
#include <stdbool.h>

#include "config/config.h"
#include "model/model_config.h"

// Sets model's token ids (the model's own config, which checkpoints write) from load_path's
// config.json, or, where load_path has none any more (moved away before a resume), from the
// newest checkpoint of save_folder, which carries them on. Nothing to do without load_path or
// such a file. A source that cannot be read leaves the YAML's ids, said once when `speak`.
void source_token_ids_apply(const TrainConfig *cfg, ModelConfig *model, bool speak);
