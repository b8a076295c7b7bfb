// Checked conversion of command-line values (the export/upcycle/eval/generate commands):
// the whole text must be a number in range, else an error naming the flag.
#pragma once
#include <stdint.h>

#include "model/model.h"

int cli_int(const char *flag, const char *text, long min, long max, int *out);
int cli_u64(const char *flag, const char *text, uint64_t *out);
int cli_float(const char *flag, const char *text, double min, double max, float *out);
// The same, kept as the double the text spells (what a config key of type double reads from it).
int cli_double(const char *flag, const char *text, double min, double max, double *out);
// The --tokenizer default for a model directory: the directory itself when it holds a
// tokenizer.json (exports made with --tokenizer do), else NULL.
const char *cli_default_tokenizer(const char *model_dir);
// Prints "spes: <last error>" to stderr and returns the exit code 1.
int cli_report_error(void);
// An output directory for a model (export, upcycle) that would destroy training state is refused
// before anything is written: a checkpoint step directory or any directory holding a
// train_state.json (its F32 weights would be replaced by the export, and resume would continue
// from them silently), a save_folder holding stepN/ checkpoints, or the source directory
// itself (`source`, given as `source_flag`; may be NULL). A missing out_dir is fine.
int cli_check_model_out_dir(const char *out_dir, const char *source, const char *source_flag);

// --device / --precision of the model commands (eval, generate, debug-step): loads an HF model
// directory on the host, then moves it to the device (auto: a GPU when one is visible and this
// spes has CUDA). Free with cli_free_model, which also closes the device.
#define CLI_DEVICE_HELP                                                                              \
    "  --device D             auto (default: a GPU when one is visible), cpu, cuda or cuda:N\n"      \
    "  --precision P          fp32 (default), amp_bf16 or amp_fp16 (GPU compute type)\n"
int cli_load_model(const char *dir, const char *device, const char *precision, Model *m);
void cli_free_model(Model *m);
