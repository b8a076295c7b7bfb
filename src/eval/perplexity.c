#include "eval/perplexity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/progress.h"
#include "base/timer.h"

// Decoded byte length of every id below the embedding size (ids the tokenizer does not
// know count 0 bytes; they cannot come from text it encoded).
static int token_byte_lengths(const Tokenizer *tok, int V, uint32_t **out) {
    uint32_t *lens = spes_calloc((size_t)V, sizeof(uint32_t));
    if (!lens) return SPES_ERR;
    uint32_t known = tokenizer_vocab_size(tok);
    for (int id = 0; id < V && (uint32_t)id < known; id++) {
        char *text = NULL;
        size_t len = 0;
        uint32_t u = (uint32_t)id;
        if (tokenizer_decode(tok, &u, 1, &text, &len) == SPES_OK) lens[id] = (uint32_t)len;
        free(text);
    }
    *out = lens;
    return SPES_OK;
}

static int read_token_file(void *ctx, uint64_t start, size_t n, uint32_t *dst) {
    return token_file_read_u32(ctx, start, n, dst);
}

TokenStream token_stream_of_file(const TokenFile *tf) {
    return (TokenStream){.count = tf->count, .read = read_token_file, .ctx = (void *)tf};
}

int eval_perplexity(Model *m, const TokenStream *stream, const PerplexityOptions *opt, PerplexityResult *out) {
    memset(out, 0, sizeof *out);
    const int seq = opt->seq, batch = opt->batch > 0 ? opt->batch : 1;
    if (seq < 1 || seq > m->cfg.max_seq_len)
        return spes_fail("--seq %d must be in 1..%d (the model's max_seq_len)", seq, m->cfg.max_seq_len);
    uint64_t count = stream->count;
    if (opt->max_tokens > 0 && opt->max_tokens < count) count = opt->max_tokens;
    if (count < 2) return spes_fail("perplexity needs at least 2 tokens (got %llu)", (unsigned long long)count);
    const uint64_t windows = (count - 1 + (uint64_t)seq - 1) / (uint64_t)seq;
    const int V = m->cfg.vocab_size;

    uint32_t *byte_len = NULL;
    if (opt->tok) SPES_TRY(token_byte_lengths(opt->tok, m->cfg.embedding_size, &byte_len));
    uint32_t *raw = spes_malloc((size_t)(seq + 1) * sizeof(uint32_t));
    int32_t *inputs = spes_malloc((size_t)batch * seq * sizeof(int32_t));
    int32_t *targets = spes_malloc((size_t)batch * seq * sizeof(int32_t));
    int status = raw && inputs && targets ? SPES_OK : SPES_ERR;
    double nats = 0.0, start = now_seconds();
    uint64_t predicted = 0, bytes = 0;
    Progress progress;
    if (opt->show_progress) progress_start(&progress, "perplexity", "windows", windows);
    LossWeights no_aux;
    memset(&no_aux, 0, sizeof no_aux);
    for (uint64_t w = 0; w < windows && status == SPES_OK;) {
        // A batch of full windows; the final short window runs alone with its own T.
        uint64_t first = w * (uint64_t)seq;
        int T = (int)((count - 1 - first) < (uint64_t)seq ? count - 1 - first : (uint64_t)seq);
        int B = 0;
        while (B < batch && w < windows) {
            uint64_t pos = w * (uint64_t)seq;
            int t = (int)((count - 1 - pos) < (uint64_t)seq ? count - 1 - pos : (uint64_t)seq);
            if (t != T) break;
            status = stream->read(stream->ctx, pos, (size_t)t + 1, raw);
            if (status != SPES_OK) break;
            for (int i = 0; i < t; i++) {
                if (raw[i + 1] >= (uint32_t)V || raw[i] >= (uint32_t)V) {
                    status = spes_fail("token id %u at stream position %llu is >= the model's vocab_size %d",
                                       raw[i + 1] >= (uint32_t)V ? raw[i + 1] : raw[i],
                                       (unsigned long long)(pos + i + (raw[i + 1] >= (uint32_t)V)), V);
                    break;
                }
                inputs[(size_t)B * T + i] = (int32_t)raw[i];
                targets[(size_t)B * T + i] = (int32_t)raw[i + 1];
                if (byte_len) bytes += byte_len[raw[i + 1]];
            }
            B++;
            w++;
        }
        if (status != SPES_OK) break;
        LossValues loss;
        status = model_forward(m, inputs, targets, B, T, &no_aux, &loss, NULL);
        if (status != SPES_OK) break;
        nats += loss.ce * (double)loss.num_targets;
        predicted += (uint64_t)loss.num_targets;
        if (opt->show_progress) {
            char extra[64];
            snprintf(extra, sizeof extra, "loss %.4f", nats / (double)predicted);
            progress_update(&progress, w, extra);
        }
    }
    if (opt->show_progress) progress_finish(&progress, NULL);
    free(raw);
    free(inputs);
    free(targets);
    free(byte_len);
    SPES_TRY(status);
    out->tokens = predicted;
    out->loss = nats / (double)predicted;
    out->perplexity = exp(out->loss);
    out->bytes = bytes;
    out->bits_per_byte = opt->tok && bytes > 0 ? nats / log(2.0) / (double)bytes : NAN;
    out->seconds = now_seconds() - start;
    return SPES_OK;
}
