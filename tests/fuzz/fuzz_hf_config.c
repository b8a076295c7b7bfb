// libFuzzer harness: the Hugging Face config.json reader on arbitrary bytes. A config it
// accepts must survive a write + read round trip unchanged (the export/import path).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "model/hf_config.h"

static char dir[64];

static void remove_dir(void) { remove_tree(dir); }

// Plain write (no fsync: file_write_atomic's durability would make each run ~100x slower).
static void write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
}

static int same_config(const ModelConfig *a, const ModelConfig *b) {
    return a->d_model == b->d_model && a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->n_layers == b->n_layers && a->vocab_size == b->vocab_size &&
           a->embedding_size == b->embedding_size && a->num_experts == b->num_experts && a->top_k == b->top_k &&
           a->expert_hidden == b->expert_hidden && a->max_seq_len == b->max_seq_len &&
           a->rope_theta == b->rope_theta && a->norm_eps == b->norm_eps && a->qk_norm == b->qk_norm &&
           a->normalize_expert_weights == b->normalize_expert_weights && a->init_std == b->init_std &&
           a->eos_token_id == b->eos_token_id && a->pad_token_id == b->pad_token_id &&
           a->has_bos_token_id == b->has_bos_token_id && a->bos_token_id == b->bos_token_id &&
           a->num_eos_token_ids == b->num_eos_token_ids && a->bos_key_absent == b->bos_key_absent &&
           a->eos_key_absent == b->eos_key_absent && a->pad_key_absent == b->pad_key_absent &&
           !memcmp(a->eos_token_ids, b->eos_token_ids, (size_t)a->num_eos_token_ids * sizeof(int));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/dev/shm/fuzz_hf_config.XXXXXX");
        if (!mkdtemp(dir)) abort();
        atexit(remove_dir);
    }
    char in[96], out[96];
    snprintf(in, sizeof in, "%s/in.json", dir);
    snprintf(out, sizeof out, "%s/config.json", dir);
    write_file(in, data, size);
    ModelConfig cfg, back;
    if (hf_config_read(in, &cfg) != 0) return 0;
    const char *format = cfg.qk_norm == QK_NORM_HEAD ? "qwen3_moe" : "olmoe";
    if (hf_config_write(&cfg, format, "bfloat16", out) != 0) abort();   // an accepted config must export
    if (hf_config_read(dir, &back) != 0 || !same_config(&cfg, &back)) abort();
    return 0;
}
