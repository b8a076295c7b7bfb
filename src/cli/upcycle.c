// `spes upcycle`: a dense Hugging Face model -> an MoE model directory (every expert a copy
// of the dense MLP), written in the export format so `spes train` (load_path), `spes eval`
// and transformers load it.
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "model/export.h"
#include "model/upcycle.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes upcycle --dense HF_DIR --out DIR --num_experts E --top_k K [options]\n"
            "\n"
            "Turns a dense Qwen3 model (config.json + safetensors) into a Qwen3-MoE model whose\n"
            "experts all start as copies of the dense MLP. norm_topk_prob is set, so without noise\n"
            "the MoE computes exactly the dense model's function.\n"
            "\n"
            "  --noise_std S         Normal(0, S) noise on expert weights (default 0)\n"
            "  --noise_fraction F    fraction of elements that get noise (default 1)\n"
            "  --router_init R       zeros | normal (default) | scaled_normal | mlp_based\n"
            "  --seed N              noise / router seed (default 0)\n"
            "  --dtype D             f32 (default) | bf16\n"
            "  --max_shard_size S    shard above this size (default 5GB)\n"
            "  --tokenizer PATH      tokenizer files to copy (e.g. the dense model's directory)\n"
            "\n"
            "The dense model's generation_config.json (eos ids, sampling settings) is carried\n"
            "unchanged; without one it is built from config.json's special token ids.\n");
}

int cmd_upcycle(int argc, char **argv) {
    static const struct option options[] = {
        {"dense", required_argument, 0, 'i'},          {"out", required_argument, 0, 'o'},
        {"num_experts", required_argument, 0, 'E'},    {"top_k", required_argument, 0, 'k'},
        {"noise_std", required_argument, 0, 'n'},      {"noise_fraction", required_argument, 0, 'f'},
        {"router_init", required_argument, 0, 'r'},    {"seed", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 'd'},          {"max_shard_size", required_argument, 0, 'm'},
        {"tokenizer", required_argument, 0, 't'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *dense = NULL, *out_dir = NULL;
    UpcycleOptions up = {.num_experts = 0, .top_k = 0, .noise_std = 0.0f, .noise_fraction = 1.0f,
                         .router_init = ROUTER_INIT_NORMAL, .seed = 0};
    HfExportOptions ex = {.format = HF_FORMAT_AUTO, .dtype = DTYPE_F32, .max_shard_bytes = HF_DEFAULT_MAX_SHARD_BYTES};
    int c, status = SPES_OK;
    optind = 1;
    while (status == SPES_OK && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'i': dense = optarg; break;
        case 'o': out_dir = optarg; break;
        case 'E': status = cli_int("num_experts", optarg, 1, 65536, &up.num_experts); break;
        case 'k': status = cli_int("top_k", optarg, 1, 65536, &up.top_k); break;
        case 'n': status = cli_float("noise_std", optarg, 0.0, 1e3, &up.noise_std); break;
        case 'f': status = cli_float("noise_fraction", optarg, 0.0, 1.0, &up.noise_fraction); break;
        case 'r': status = router_init_parse(optarg, &up.router_init); break;
        case 's': status = cli_u64("seed", optarg, &up.seed); break;
        case 'd': status = hf_dtype_parse(optarg, &ex.dtype); break;
        case 'm':
            if ((status = parse_byte_size(optarg, &ex.max_shard_bytes)) != SPES_OK) spes_fail_context("--max_shard_size");
            break;
        case 't': ex.tokenizer = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (status != SPES_OK) return cli_report_error();
    if (!dense || !out_dir || up.num_experts == 0 || up.top_k == 0 || optind < argc) {
        usage(stderr);
        return 2;
    }
    if (cli_check_model_out_dir(out_dir, dense, "--dense") != SPES_OK) return cli_report_error();
    ex.generation_config_dir = dense;   // its eos list and sampling settings hold for the MoE
    Model m;
    if (model_upcycle_dense(dense, &up, &m) != SPES_OK) return cli_report_error();
    status = model_export_hf(&m, out_dir, &ex);
    model_free(&m);
    if (status != SPES_OK) return cli_report_error();
    log_info("upcycle: wrote %s", out_dir);
    return 0;
}
