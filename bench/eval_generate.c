// Inference throughput on bench-small: `spes eval`'s forward (loss over B x T tokens) and
// `spes generate`'s decoding (greedy, new tokens per second) with the KV cache and without
// it (a full forward over the whole sequence per new token). fp32, random OLMo init.
//
// usage: eval_generate [--threads N] [--batch B] [--seq T] [--prompt P] [--new N] [--reps R]
// Prints detail and machine-readable lines: ours_eval_tok_s=, ours_gen_tok_s=,
// nocache_gen_tok_s= (bench/run_all.sh assembles the final lines).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/threads.h"
#include "base/timer.h"
#include "eval/generate.h"
#include "model/hf_import.h"
#include "ops/cpu/cpu_ops.h"

static int arg_int(int argc, char **argv, const char *flag, int fallback) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], flag)) return atoi(argv[i + 1]);
    return fallback;
}

// Tokens per second of the eval forward (model_forward with targets: loss over B*T).
static double bench_eval(Model *m, int B, int T, int reps) {
    int32_t *inputs = spes_malloc((size_t)B * T * sizeof(int32_t)), *targets = spes_malloc((size_t)B * T * sizeof(int32_t));
    if (!inputs || !targets) return 0.0;
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)((i * 7919u + 13) % (unsigned)m->cfg.vocab_size);
        targets[i] = (int32_t)((i * 104729u + 5) % (unsigned)m->cfg.vocab_size);
    }
    LossValues loss;
    model_forward(m, inputs, targets, B, T, NULL, &loss, NULL);   // warm-up (plans activations)
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_seconds();
        if (model_forward(m, inputs, targets, B, T, NULL, &loss, NULL) != SPES_OK) return 0.0;
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
        printf("  eval rep %d: %.3f s for %d tokens (loss %.4f)\n", r, dt, B * T, loss.ce);
    }
    free(inputs);
    free(targets);
    return (double)B * T / best;
}

// New tokens per second of greedy generation (prefill included in the time, as a user sees it).
static double bench_generate(Model *m, int prompt_len, int n_new, bool use_cache, int reps) {
    int32_t *prompt = spes_malloc((size_t)prompt_len * sizeof(int32_t)), *out = spes_malloc((size_t)n_new * sizeof(int32_t));
    if (!prompt || !out) return 0.0;
    for (int i = 0; i < prompt_len; i++) prompt[i] = (int32_t)((i * 31u + 7) % (unsigned)m->cfg.vocab_size);
    GenerateOptions opt = {.max_new_tokens = n_new, .sampling = {.temperature = 0.0f}, .stop_at_eos = false,
                           .use_cache = use_cache};
    double best = 1e30;
    int n_out = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_seconds();
        if (generate_tokens(m, prompt, prompt_len, &opt, NULL, NULL, out, &n_out) != SPES_OK) return 0.0;
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
        printf("  generate (%s) rep %d: %d new tokens after a %d-token prompt in %.3f s\n",
               use_cache ? "KV cache" : "no cache", r, n_out, prompt_len, dt);
    }
    free(prompt);
    free(out);
    return n_out / best;
}

int main(int argc, char **argv) {
    op_blas_ensure_fast_kernels(argv);
    setvbuf(stdout, NULL, _IOLBF, 0);   // detail lines appear as they happen, also in a pipe
    const int threads = arg_int(argc, argv, "--threads", 2), B = arg_int(argc, argv, "--batch", 8);
    const int T = arg_int(argc, argv, "--seq", 256), prompt_len = arg_int(argc, argv, "--prompt", 32);
    const int n_new = arg_int(argc, argv, "--new", 64), reps = arg_int(argc, argv, "--reps", 3);
    threads_set(threads);
    ModelConfig cfg;
    Model m;
    if (model_config_preset("bench-small", &cfg) != SPES_OK || model_create_frozen(&m, &cfg) != SPES_OK) {
        fprintf(stderr, "eval_generate: %s\n", spes_last_error());
        return 1;
    }
    model_init_weights(&m, 1234);
    printf("bench-small: d_model %d, %d layers, %d experts top-%d, vocab %d; %d threads\n", cfg.d_model,
           cfg.n_layers, cfg.num_experts, cfg.top_k, cfg.vocab_size, threads_get());
    double eval_tok_s = bench_eval(&m, B, T, reps);
    double gen_tok_s = bench_generate(&m, prompt_len, n_new, true, reps);
    double nocache_tok_s = bench_generate(&m, prompt_len, n_new, false, 1);
    model_free(&m);
    if (eval_tok_s <= 0 || gen_tok_s <= 0 || nocache_tok_s <= 0) {
        fprintf(stderr, "eval_generate: %s\n", spes_last_error());
        return 1;
    }
    printf("ours_eval_tok_s=%.1f\nours_gen_tok_s=%.1f\nnocache_gen_tok_s=%.1f\n", eval_tok_s, gen_tok_s, nocache_tok_s);
    return 0;
}
