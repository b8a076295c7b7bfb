// `spes export`: a checkpoint (or any model directory we load) -> a Hugging Face directory.
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "model/export.h"
#include "model/hf_import.h"
#include "train/checkpoint.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes export --checkpoint DIR --out HF_DIR [options]\n"
            "\n"
            "Writes a Hugging Face model directory (config.json, model.safetensors or shards +\n"
            "model.safetensors.index.json, generation_config.json, tokenizer files) that\n"
            "transformers loads with AutoModelForCausalLM.from_pretrained. generation_config.json\n"
            "is the checkpoint's own when it has one (copied from the run's load_path), unchanged;\n"
            "otherwise it is built from config.json's special token ids.\n"
            "\n"
            "  --checkpoint DIR      a checkpoint step directory (model.safetensors + config.json),\n"
            "                        or a save_folder: its highest stepN/ is used\n"
            "  --out HF_DIR          output directory (created; old weight files in it are replaced; a training\n"
            "                        checkpoint, save_folder or the --checkpoint directory is refused)\n"
            "  --format F            olmoe (QK-norm full) | qwen3_moe (QK-norm per head) | auto (default)\n"
            "  --dtype D             f32 (default) | bf16\n"
            "  --tokenizer PATH      tokenizer.json or a directory of tokenizer files to copy\n"
            "  --max_shard_size S    shard above this size (default 5GB; e.g. 500MB, 20KB)\n");
}

// A directory with config.json is used as is; otherwise (a save_folder) its latest complete
// checkpoint, found as --resume finds it.
static char *resolve_checkpoint(const char *dir) {
    char *config = path_join(dir, "config.json");
    bool direct = config && file_exists(config);
    free(config);
    if (direct) return strdup(dir);
    if (!dir_exists(dir)) {
        spes_fail("checkpoint directory %s cannot be opened", dir);
        return NULL;
    }
    char *latest;
    int64_t step;
    if (checkpoint_find_latest(dir, &latest, &step) != SPES_OK) return NULL;
    if (!latest) {
        spes_fail("%s has no config.json and no stepN/ checkpoint", dir);
        return NULL;
    }
    log_info("export: using the latest checkpoint %s", latest);
    return latest;
}

int cmd_export(int argc, char **argv) {
    static const struct option options[] = {
        {"checkpoint", required_argument, 0, 'c'}, {"out", required_argument, 0, 'o'},
        {"format", required_argument, 0, 'f'},     {"dtype", required_argument, 0, 'd'},
        {"tokenizer", required_argument, 0, 't'},  {"max_shard_size", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0}};
    const char *checkpoint = NULL, *out_dir = NULL;
    HfExportOptions opt = {.format = HF_FORMAT_AUTO, .dtype = DTYPE_F32, .max_shard_bytes = HF_DEFAULT_MAX_SHARD_BYTES};
    int c, status = SPES_OK;
    optind = 1;
    while (status == SPES_OK && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'c': checkpoint = optarg; break;
        case 'o': out_dir = optarg; break;
        case 'f': status = hf_format_parse(optarg, &opt.format); break;
        case 'd': status = hf_dtype_parse(optarg, &opt.dtype); break;
        case 't': opt.tokenizer = optarg; break;
        case 's':
            if ((status = parse_byte_size(optarg, &opt.max_shard_bytes)) != SPES_OK) spes_fail_context("--max_shard_size");
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (status != SPES_OK) return cli_report_error();
    if (!checkpoint || !out_dir || optind < argc) {
        usage(stderr);
        return 2;
    }
    char *dir = resolve_checkpoint(checkpoint);
    if (!dir) return cli_report_error();
    // Both the given --checkpoint (maybe a save_folder) and the step directory it resolved to.
    if (cli_check_model_out_dir(out_dir, checkpoint, "--checkpoint") != SPES_OK ||
        cli_check_model_out_dir(out_dir, dir, "--checkpoint") != SPES_OK) {
        free(dir);
        return cli_report_error();
    }
    Model m;
    status = model_load_hf_dir(dir, &m);
    if (status != SPES_OK) {
        free(dir);
        return cli_report_error();
    }
    opt.generation_config_dir = dir;   // a checkpoint's copy of its load_path's, or an HF dir's own
    status = model_export_hf(&m, out_dir, &opt);
    free(dir);
    model_free(&m);
    if (status != SPES_OK) return cli_report_error();
    log_info("export: wrote %s", out_dir);
    return 0;
}
