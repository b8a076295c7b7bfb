#include "eval/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "eval/kv_forward.h"

// Next-token logits by a full forward over seq[0..n): the last row of model_forward's logits.
static int full_forward_last_logits(Model *m, const int32_t *seq, int n, float *all_logits, float *logits) {
    LossWeights none;
    memset(&none, 0, sizeof none);
    SPES_TRY(model_forward(m, seq, NULL, 1, n, &none, NULL, all_logits));
    memcpy(logits, all_logits + (size_t)(n - 1) * m->cfg.embedding_size, (size_t)m->cfg.embedding_size * sizeof(float));
    return SPES_OK;
}

int generate_tokens(Model *m, const int32_t *prompt, int n_prompt, const GenerateOptions *opt, TokenSinkFn sink,
                    void *user, int32_t *out, int *n_out) {
    *n_out = 0;
    const ModelConfig *c = &m->cfg;
    if (n_prompt < 1) return spes_fail("generate: the prompt is empty (it needs at least one token)");
    if (n_prompt >= c->max_seq_len)
        return spes_fail("generate: the prompt has %d tokens, the model's max_seq_len is %d", n_prompt, c->max_seq_len);
    int budget = opt->max_new_tokens;
    if (budget > c->max_seq_len - n_prompt) budget = c->max_seq_len - n_prompt;
    const int V = c->embedding_size;

    Rng rng;
    rng_seed(&rng, opt->seed);
    float *logits = spes_malloc((size_t)V * sizeof(float));
    float *probs = spes_malloc((size_t)V * sizeof(float));
    int *index = spes_malloc((size_t)V * sizeof(int));
    // The prompt and the tokens so far (what the repetition penalty and the no-cache forward see),
    // and in no-cache mode room for the full logits.
    int32_t *seq = spes_malloc((size_t)(n_prompt + budget) * sizeof(int32_t));
    float *all_logits = opt->use_cache ? NULL : spes_malloc((size_t)c->max_seq_len * V * sizeof(float));
    KvCache cache;
    memset(&cache, 0, sizeof cache);
    int status = logits && probs && index && seq && (opt->use_cache || all_logits) ? SPES_OK : SPES_ERR;
    if (status == SPES_OK) memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (status == SPES_OK && opt->use_cache) {
        status = kv_cache_create(&cache, m, n_prompt + budget);
        if (status == SPES_OK) status = kv_forward(&cache, prompt, n_prompt, logits, 1);
    } else if (status == SPES_OK) {
        status = full_forward_last_logits(m, seq, n_prompt, all_logits, logits);
    }
    for (int step = 0; step < budget && status == SPES_OK; step++) {
        int32_t token =
            (int32_t)sample_token(logits, c->vocab_size, &opt->sampling, seq, n_prompt + step, &rng, probs, index);
        seq[n_prompt + step] = token;
        out[(*n_out)++] = token;
        if (sink) {
            int rc = sink(user, token);
            if (rc != SPES_OK) {
                status = rc;
                break;
            }
        }
        if (opt->stop_at_eos && model_config_is_eos(c, token)) break;
        if (step + 1 == budget) break;   // the last token needs no logits after it
        if (opt->use_cache) status = kv_forward(&cache, &token, 1, logits, 1);
        else status = full_forward_last_logits(m, seq, n_prompt + step + 1, all_logits, logits);
    }
    if (opt->use_cache) kv_cache_free(&cache);
    free(logits);
    free(probs);
    free(index);
    free(seq);
    free(all_logits);
    return status;
}
