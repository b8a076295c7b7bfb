// `spes <command> ...`: dispatch only. Each command lives in src/cli/<command>.c.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "ops/cpu/cpu_ops.h"

static const Command commands[] = {
    {"demo", cmd_demo, "SPES on this machine: server + 4 peers on a built-in corpus, vs centralised"},
    {"tokenize", cmd_tokenize, "text files (jsonl/json/gz/zst/parquet/txt) -> token shards, like SPES tokenize_data.py"},
    {"debug-step", cmd_debug_step, "one forward+backward on an HF model dir; writes logits, losses, grads"},
    {"train", cmd_train, "train from a SPES/OLMo YAML config (checkpoints, resume, metrics.jsonl)"},
    {"plan", cmd_plan, "what a config needs before it trains: memory per GPU, sync bytes per round, time"},
    {"list-files", cmd_list_files, "write the manifest (file_list.txt) of the token files under a directory"},
    {"export", cmd_export, "checkpoint -> Hugging Face OLMoE / Qwen3-MoE directory (sharded, f32/bf16)"},
    {"upcycle", cmd_upcycle, "dense Qwen3 HF model -> MoE with every expert a copy of the dense MLP"},
    {"eval", cmd_eval, "perplexity / bits per byte, and multiple-choice accuracy on oe-eval request files"},
    {"server", cmd_server, "SPES parameter server (gRPC): aggregates peers' uploads every sync round"},
    {"status", cmd_status, "a parameter server's status: peers, rounds, the open round, traffic"},
    {"generate", cmd_generate, "sample text with a KV cache, streaming tokens to stdout"},
    {"version", cmd_version, "the version and the backends compiled in (cpu, cuda)"},
};
static const int num_commands = (int)(sizeof commands / sizeof commands[0]);

static void usage(FILE *out) {
    fprintf(out, "usage: spes <command> [args]\n\ncommands:\n");
    for (int i = 0; i < num_commands; i++) fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`spes <command> --help` describes a command's flags.\n");
}

int main(int argc, char **argv) {
    // Debian's OpenBLAS 0.3.21 misdetects recent CPUs and falls back to SSE3 kernels: re-exec
    // once with OPENBLAS_CORETYPE set (a no-op when detection worked or the user set it).
    op_blas_ensure_fast_kernels(argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 0; i < num_commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "spes: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
