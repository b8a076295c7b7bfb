// The model a run started from (load_path), as its checkpoints carry it on: its special token
// ids (bos, eos or its list, pad) in their config.json and its generation_config.json. An
// upcycled Qwen3 has eos [151645, 151643] and sampling settings there, where the YAML's model
// section holds OLMo's defaults (50256, GPT-2's ids) unless it sets them. Read once, at the
// start: from load_path, or, where load_path no longer has the file (moved away before a
// resume), from the newest checkpoint of save_folder, which carries it on.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "model/model_config.h"

// Sets model's token ids (the model's own config, which checkpoints write) from the source's
// config.json where the YAML sets none; a YAML value that contradicts the source's wins, with a
// warning naming both when `speak` (an eos among a source's list keeps the list). Nothing
// changes without a source config.json; one that cannot be read leaves the YAML's, said.
void source_model_token_ids(const TrainConfig *cfg, ModelConfig *model, bool speak);

// The source's generation_config.json, its bytes unchanged (*text NULL, *len 0: none). One that
// cannot be read is none, said when `speak` (the checkpoints then lack it; `spes export` builds
// one from config.json). *text is malloc'd.
void source_model_generation_config(const TrainConfig *cfg, uint8_t **text, size_t *len, bool speak);
