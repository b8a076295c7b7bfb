// Scores multiple-choice requests: log P(continuation | context) under the model, the way
// lm-evaluation-harness's HF backend does it (so figures agree with it):
//   - trailing whitespace of the context moves to the front of the continuation;
//   - context_enc = encode(context), whole = encode(context + continuation),
//     continuation_enc = whole[len(context_enc):];
//   - an empty context becomes lm-eval's prefix token: the tokenizer's BOS, else its EOS (not
//     the model's eos_token_id); a continuation starting with that token has it as context;
//   - the model sees at most `window` tokens: (context + continuation)[-(window + 1):],
//     scoring the continuation tokens inside it (all, unless the continuation alone is
//     longer than the window: then its first tokens are dropped, with a warning).
// The prefix before the scored tokens (the context: shared by a document's choices) runs
// once into a KV cache; each choice continues from there (kv_cache_truncate between them).
#pragma once
#include <stdint.h>

#include "tokenizer/tokenizer.h"
#include "eval/mc_task.h"
#include "model/model.h"

typedef struct {
    int max_seq;            // window in tokens; <= 0: the model's max_seq_len
    int show_progress;      // progress line on stderr
} McScoreOptions;

// Fills scores[task->num_requests] for every request of the kept documents (and of their
// unconditional partners); the others get sum_logprob 0, num_tokens 0.
int mc_task_score(Model *m, const Tokenizer *tok, const McTask *task, const McScoreOptions *opt,
                  McScore *scores);
