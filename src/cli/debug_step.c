// `spes debug-step`: one forward + backward of an HF model directory on a token file,
// everything the PyTorch comparison needs written to one safetensors file.
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/threads.h"
#include "cli/cli_parse.h"
#include "cli/commands.h"
#include "io/safetensors.h"
#include "model/hf_import.h"
#include "model/model.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes debug-step --model DIR --tokens FILE --out OUT.safetensors [options]\n"
            "\n"
            "Loads an HF model directory (config.json with model_type olmoe or qwen3_moe, plus\n"
            "model.safetensors or shards), runs one forward + backward on the first B*(T+1)\n"
            "tokens (row b = tokens[b*(T+1) .. b*(T+1)+T]: inputs the first T, targets the last T)\n"
            "and writes: logits [B,T,V] F32 (V = the config's vocab_size, padded rows included),\n"
            "loss.ce, loss.lm_z, loss.lb, loss.router_z (unweighted terms) and loss.total (weighted),\n"
            "each F32 of shape [], and grad.<tensor name> (F32, the tensor's shape) for every\n"
            "trainable tensor: the gradient of loss.total.\n"
            "\n"
            "  --dtype uint16|uint32       token file element type (raw little-endian; default uint16)\n"
            "  --batch B                   rows (default 1)\n"
            "  --seq T                     tokens per row (default: max_position_embeddings)\n"
            "  --lm_z_mult W               weight of the LM z-loss (default 0)\n"
            "  --lb_weight W               weight of the load-balancing loss (default 0)\n"
            "  --router_z_weight W         weight of the router z-loss (default 0)\n"
            "  --trainable_experts A-B     only experts A..B (inclusive) trainable; shared tensors\n"
            "                              always are (default: everything trainable)\n"
            "  --threads N                 threads (default: SPES_NUM_THREADS / OMP_NUM_THREADS / all)\n"
            CLI_DEVICE_HELP);
}

static int parse_expert_range(const char *text, int *first, int *last) {
    char *end;
    long a = strtol(text, &end, 10);
    if (end == text || *end != '-') return spes_fail("--trainable_experts: expected A-B, got '%s'", text);
    const char *second = end + 1;
    long b = strtol(second, &end, 10);
    if (end == second || *end || a < 0 || b < a || b > 1000000)
        return spes_fail("--trainable_experts: expected A-B with 0 <= A <= B, got '%s'", text);
    *first = (int)a;
    *last = (int)b;
    return SPES_OK;
}

// inputs/targets [B*T] from the first B*(T+1) tokens of a raw little-endian file.
static int read_tokens(const char *path, int width, int B, int T, int vocab, int32_t *inputs, int32_t *targets) {
    MappedFile f;
    SPES_TRY(file_map(path, &f));
    size_t need = (size_t)B * (T + 1);
    int status = SPES_OK;
    if (f.size / (size_t)width < need) {
        status = spes_fail("%s: holds %zu tokens of %d bytes, --batch %d x (--seq %d + 1) needs %zu", path,
                           f.size / (size_t)width, width, B, T, need);
    }
    for (size_t i = 0; status == SPES_OK && i < need; i++) {
        const uint8_t *p = f.data + i * (size_t)width;
        uint32_t tok = width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                                  : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (tok >= (uint32_t)vocab) {
            status = spes_fail("%s: token %u at index %zu is outside the model's vocabulary (%d)", path, tok, i, vocab);
            break;
        }
        size_t b = i / (size_t)(T + 1), t = i % (size_t)(T + 1);
        if (t < (size_t)T) inputs[b * T + t] = (int32_t)tok;
        if (t > 0) targets[b * T + t - 1] = (int32_t)tok;
    }
    file_unmap(&f);
    return status;
}

// logits, the five losses, and grad.<name> for every trainable tensor.
static int write_outputs(const char *path, Model *m, const float *logits, int B, int T, const LossValues *v) {
    const int n_losses = 5;
    int n = 1 + n_losses;
    for (int i = 0; i < m->table.count; i++) n += m->table.entries[i].trainable;
    StWriteTensor *t = spes_calloc((size_t)n, sizeof *t);
    char **names = spes_calloc((size_t)n, sizeof *names);
    if (!t || !names) {
        free(t);
        free(names);
        return SPES_ERR;
    }
    float losses[5] = {(float)v->ce, (float)v->lm_z, (float)v->lb, (float)v->router_z, (float)v->total};
    const char *loss_names[5] = {"loss.ce", "loss.lm_z", "loss.lb", "loss.router_z", "loss.total"};
    int k = 0;
    t[k++] = (StWriteTensor){.name = "logits", .dtype = DTYPE_F32, .ndim = 3,
                             .shape = {B, T, m->cfg.embedding_size}, .data = logits};
    for (int i = 0; i < n_losses; i++)
        t[k++] = (StWriteTensor){.name = loss_names[i], .dtype = DTYPE_F32, .ndim = 0, .data = &losses[i]};
    int status = SPES_OK;
    // Gradients live in backend memory: one download into a host copy laid out the same way.
    float *grads = m->grads;
    if (!m->be->host_memory && m->grads) {
        grads = spes_malloc(m->table.trainable_numel * sizeof(float));
        status = grads ? m->be->ops->download(m->be, grads, m->grads, m->table.trainable_numel * sizeof(float))
                       : SPES_ERR;
    }
    for (int i = 0; i < m->table.count && status == SPES_OK; i++) {
        const ParamInfo *p = &m->table.entries[i];
        if (!p->trainable) continue;
        size_t len = strlen(p->name) + 6;
        names[k] = spes_malloc(len);
        if (!names[k]) {
            status = SPES_ERR;
            break;
        }
        snprintf(names[k], len, "grad.%s", p->name);
        t[k] = (StWriteTensor){.name = names[k], .dtype = DTYPE_F32, .ndim = p->ndim,
                               .shape = {p->shape[0], p->shape[1]}, .data = grads + p->grad_offset};
        k++;
    }
    if (status == SPES_OK) status = safetensors_write_file(path, t, k, NULL, NULL, 0);
    if (grads != m->grads) free(grads);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(t);
    return status;
}

int cmd_debug_step(int argc, char **argv) {
    static const struct option options[] = {
        {"model", required_argument, 0, 'm'},        {"tokens", required_argument, 0, 't'},
        {"dtype", required_argument, 0, 'd'},        {"batch", required_argument, 0, 'b'},
        {"seq", required_argument, 0, 's'},          {"lm_z_mult", required_argument, 0, 'z'},
        {"lb_weight", required_argument, 0, 'l'},    {"router_z_weight", required_argument, 0, 'r'},
        {"trainable_experts", required_argument, 0, 'e'}, {"out", required_argument, 0, 'o'},
        {"threads", required_argument, 0, 'j'},      {"help", no_argument, 0, 'h'},
        {"device", required_argument, 0, 'D'},       {"precision", required_argument, 0, 'X'},
        {0, 0, 0, 0}};
    const char *model_dir = NULL, *token_path = NULL, *out_path = NULL, *device = NULL, *precision = NULL;
    int width = 2, B = 1, T = 0, first = -1, last = -1, threads = 0;
    LossWeights w = {0};
    int c, status = SPES_OK;
    optind = 1;
    while (status == SPES_OK && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': token_path = optarg; break;
        case 'o': out_path = optarg; break;
        case 'd':
            if (!strcmp(optarg, "uint16")) width = 2;
            else if (!strcmp(optarg, "uint32")) width = 4;
            else status = spes_fail("--dtype: expected uint16 or uint32, got '%s'", optarg);
            break;
        case 'b': status = cli_int("batch", optarg, 1, 1 << 20, &B); break;
        case 's': status = cli_int("seq", optarg, 1, 1 << 24, &T); break;
        case 'z': status = cli_float("lm_z_mult", optarg, 0.0, 1e6, &w.lm_z_mult); break;
        case 'l': status = cli_float("lb_weight", optarg, 0.0, 1e6, &w.lb_weight); break;
        case 'r': status = cli_float("router_z_weight", optarg, 0.0, 1e6, &w.router_z_weight); break;
        case 'e': status = parse_expert_range(optarg, &first, &last); break;
        case 'j': status = cli_int("threads", optarg, 1, 4096, &threads); break;
        case 'D': device = optarg; break;
        case 'X': precision = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (status != SPES_OK) return cli_report_error();
    if (!model_dir || !token_path || !out_path || optind < argc) {
        usage(stderr);
        return 2;
    }
    threads_set(threads);

    Model m;
    if (cli_load_model(model_dir, device, precision, &m) != SPES_OK) return cli_report_error();
    if (T == 0) T = m.cfg.max_seq_len;
    if (first >= 0 && last >= m.cfg.num_experts)
        status = spes_fail("--trainable_experts %d-%d: the model has experts 0-%d", first, last, m.cfg.num_experts - 1);
    else if (first >= 0)
        status = model_set_trainable_experts(&m, first, last);
    else
        status = model_set_trainable_experts(&m, 0, m.cfg.num_experts - 1);
    size_t N = (size_t)B * T;
    int32_t *inputs = status == SPES_OK ? spes_calloc(N, sizeof(int32_t)) : NULL;
    int32_t *targets = inputs ? spes_calloc(N, sizeof(int32_t)) : NULL;
    float *logits = targets ? spes_calloc(N * (size_t)m.cfg.embedding_size, sizeof(float)) : NULL;
    if (!logits) status = SPES_ERR;
    if (status == SPES_OK)
        status = read_tokens(token_path, width, B, T, m.cfg.embedding_size, inputs, targets);
    LossValues v;
    if (status == SPES_OK) {
        model_zero_grad(&m);
        status = model_forward_backward(&m, inputs, targets, B, T, &w, 1.0f, &v, logits);
    }
    if (status == SPES_OK) status = write_outputs(out_path, &m, logits, B, T, &v);
    if (status == SPES_OK)
        printf("debug-step: ce %.6f lm_z %.6f lb %.6f router_z %.6f total %.6f -> %s\n", v.ce, v.lm_z, v.lb,
               v.router_z, v.total, out_path);
    free(inputs);
    free(targets);
    free(logits);
    cli_free_model(&m);
    return status == SPES_OK ? 0 : cli_report_error();
}
