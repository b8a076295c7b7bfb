// demo.yaml from one table of (key, value) rows. Keys are dotted paths ("model.d_model");
// the writer opens a YAML mapping for each new section, so rows of one section stay together.
#include "demo/demo_config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"

typedef enum {
    VAL_YAML,           // text written as it is: a number, true/false, a flow list
    VAL_INT,            // num
    VAL_STR,            // text as a double-quoted YAML string (any bytes a path may hold)
    VAL_STR_LIST,       // [text], text quoted
    VAL_LM_EVALUATOR,   // a one-entry `evaluators:` list: label, type lm, data.paths [text]
} ValueKind;

typedef struct {
    const char *key;
    ValueKind kind;
    const char *text;
    long long num;
    const char *label;  // VAL_LM_EVALUATOR
} Row;

#define YAML(k, t) {.key = (k), .kind = VAL_YAML, .text = (t)}
#define INT(k, n) {.key = (k), .kind = VAL_INT, .num = (n)}
#define STR(k, s) {.key = (k), .kind = VAL_STR, .text = (s)}
#define STR_LIST(k, s) {.key = (k), .kind = VAL_STR_LIST, .text = (s)}
#define LM_EVALUATOR(k, l, s) {.key = (k), .kind = VAL_LM_EVALUATOR, .text = (s), .label = (l)}

static void write_quoted(FILE *fp, const char *s) {
    fputc('"', fp);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(fp, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", fp);
        else if (*p == '\t') fputs("\\t", fp);
        else if (*p < 0x20 || *p == 0x7f) fprintf(fp, "\\x%02x", *p);
        else fputc(*p, fp);
    }
    fputc('"', fp);
}

#define MAX_DEPTH 4

typedef struct {
    const char *part[MAX_DEPTH];
    int len[MAX_DEPTH];
    int n;
} KeyPath;

static int split_key(const char *key, KeyPath *k) {
    k->n = 0;
    for (const char *p = key;;) {
        if (k->n == MAX_DEPTH) return spes_fail("demo config: key '%s' nests deeper than %d", key, MAX_DEPTH);
        const char *dot = strchr(p, '.');
        k->part[k->n] = p;
        k->len[k->n] = dot ? (int)(dot - p) : (int)strlen(p);
        k->n++;
        if (!dot) return SPES_OK;
        p = dot + 1;
    }
}

// One row: the section headers the previous row did not open, then `key: value`.
static int write_row(FILE *fp, const Row *r, const KeyPath *prev, KeyPath *k) {
    SPES_TRY(split_key(r->key, k));
    int common = 0;
    while (common < k->n - 1 && common < prev->n - 1 && k->len[common] == prev->len[common] &&
           memcmp(k->part[common], prev->part[common], (size_t)k->len[common]) == 0)
        common++;
    for (int i = common; i < k->n - 1; i++) fprintf(fp, "%*s%.*s:\n", 2 * i, "", k->len[i], k->part[i]);
    int indent = 2 * (k->n - 1);
    fprintf(fp, "%*s%.*s:", indent, "", k->len[k->n - 1], k->part[k->n - 1]);
    switch (r->kind) {
    case VAL_YAML: fprintf(fp, " %s\n", r->text); break;
    case VAL_INT: fprintf(fp, " %lld\n", r->num); break;
    case VAL_STR:
        fputc(' ', fp);
        write_quoted(fp, r->text);
        fputc('\n', fp);
        break;
    case VAL_STR_LIST:
        fputs(" [", fp);
        write_quoted(fp, r->text);
        fputs("]\n", fp);
        break;
    case VAL_LM_EVALUATOR:
        fprintf(fp, "\n%*s- label: %s\n%*s  type: lm\n%*s  data:\n%*s    paths: [", indent + 2, "", r->label,
                indent + 2, "", indent + 2, "", indent + 2, "");
        write_quoted(fp, r->text);
        fputs("]\n", fp);
        break;
    }
    return SPES_OK;
}

static int write_rows(FILE *fp, const Row *rows, int n) {
    KeyPath prev = {.n = 0}, k;
    for (int i = 0; i < n; i++, prev = k) SPES_TRY(write_row(fp, &rows[i], &prev, &k));
    return SPES_OK;
}

// The shortest decimal text that reads back as exactly `v` (as a double, or as a float when
// `as_float`): 0.7 is written "0.7", not "0.69999998807907104" (the float 0.7f printed as a
// double), which a config key of type double reads as another number than the
// `--spes_config.lr_scale=0.7` a user or bench-quality types; that difference of 1.7e-8 made
// the demo and the benchmark's seed 0 two different runs (docs/quality.md).
static void exact_number(char *buf, size_t size, double v, bool as_float) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        double back = strtod(buf, NULL);
        if (as_float ? (float)back == (float)v : back == v) return;
    }
}

int demo_config_write(const DemoRunShape *s, const char *dir, const char *path) {
    char *train = path_join(dir, "train.bin"), *val = path_join(dir, "val.bin"),
         *save = path_join(dir, "peer${spes_config.peer_id}");
    // Each reads back as the value the demo holds (the server gets the outer pair from this file: --config).
    char outer_lr[32], outer_momentum[32];
    exact_number(outer_lr, sizeof outer_lr, s->outer_lr != 0.0f ? (double)s->outer_lr : 1.0, true);
    exact_number(outer_momentum, sizeof outer_momentum, (double)s->outer_momentum, true);
    char lr_scale[32];
    exact_number(lr_scale, sizeof lr_scale, s->lr_scale > 0 ? s->lr_scale : 1.0, false);
    char peer_beta1[32] = "null";
    if (s->peer_beta1 > 0) exact_number(peer_beta1, sizeof peer_beta1, s->peer_beta1, false);
    const Row rows[] = {
        YAML("run_name", "spes-demo"),
        YAML("seed", "6198"),
        // A small byte-level MoE: 256 bytes + EOS, embeddings padded to a multiple of 8.
        YAML("model.d_model", "128"),
        YAML("model.n_heads", "4"),
        YAML("model.n_layers", "2"),
        YAML("model.mlp_hidden_size", "256"),
        YAML("model.max_sequence_length", "128"),
        YAML("model.vocab_size", "257"),
        YAML("model.embedding_size", "264"),
        YAML("model.eos_token_id", "256"),
        YAML("model.pad_token_id", "256"),
        YAML("model.rope_theta", "10000"),
        YAML("model.layer_norm_eps", "1.0e-6"),
        YAML("model.attention_layer_norm", "true"),
        INT("model.moe_num_experts", demo_experts(s)),
        YAML("model.moe_top_k", "2"),
        YAML("model.moe_loss_weight", "0.01"),
        YAML("model.moe_zloss_weight", "0.001"),
        YAML("model.init_std", "0.02"),
        YAML("model.init_cutoff_factor", "3"),
        YAML("softmax_auxiliary_loss", "true"),
        YAML("auxiliary_loss_multiplier", "1.0e-4"),
        YAML("optimizer.name", "adamw"),
        YAML("optimizer.learning_rate", "3.0e-3"),
        YAML("optimizer.betas", "[0.9, 0.95]"),
        YAML("optimizer.eps", "1.0e-8"),
        YAML("optimizer.weight_decay", "0.1"),
        YAML("scheduler.name", "cosine_with_warmup"),
        INT("scheduler.t_warmup", s->steps / 10 > 1 ? s->steps / 10 : 1),
        YAML("scheduler.alpha_f", "0.1"),
        STR_LIST("data.paths", train),
        YAML("data.memmap_dtype", "uint16"),
        YAML("data.seed", "6198"),
        YAML("data.drop_last", "true"),
        LM_EVALUATOR("evaluators", "val", val),
        INT("max_duration", s->steps),
        INT("global_train_batch_size", s->batch),
        INT("device_train_microbatch_size", s->batch),
        YAML("max_grad_norm", "1.0"),
        STR("save_folder", save),
        INT("save_interval_unsharded", s->steps),
        YAML("save_num_unsharded_checkpoints_to_keep", "1"),
        YAML("try_load_latest_save", "false"),
        YAML("console_log_interval", "10"),
        INT("eval_interval", s->steps),
        INT("threads", s->threads_per_peer),
        YAML("using_spes", "true"),
        INT("spes_config.num_peers", s->peers),
        YAML("spes_config.peer_id", "0"),
        INT("spes_config.num_train_experts_per_node", s->experts_per_peer),
        INT("spes_config.sync_steps", s->sync_steps),
        YAML("spes_config.server_addr", "127.0.0.1:50051"),
        YAML("spes_config.using_decayed_aux_loss", "true"),
        YAML("spes_config.outer_lr", outer_lr),
        YAML("spes_config.outer_momentum", outer_momentum),
        INT("spes_config.sync_warmup_steps", s->sync_warmup_steps),
        INT("spes_config.sync_warmup_every", s->sync_warmup_every > 0 ? s->sync_warmup_every : 1),
        // Peers only: the centralised baseline reads the same file with using_spes=false.
        YAML("spes_config.lr_scale", lr_scale),
        YAML("spes_config.beta1", peer_beta1),
        YAML("spes_config.payload_dtype", s->payload ? s->payload : "f32"),
    };
    char *text = NULL;
    size_t len = 0;
    FILE *fp = train && val && save ? open_memstream(&text, &len) : NULL;
    int rc = fp ? SPES_OK : spes_fail("demo: out of memory writing %s", path);
    if (rc == SPES_OK) {
        fprintf(fp, "# Written by `spes demo`; run a peer by hand with\n#   spes train %s --spes_config.peer_id=0\n", path);
        rc = write_rows(fp, rows, (int)(sizeof rows / sizeof rows[0]));
    }
    if (fp) fclose(fp);
    if (rc == SPES_OK) rc = file_write_atomic(path, text, len);
    free(text), free(train), free(val), free(save);
    return rc;
}
