// Perplexity, mean loss and bits per byte of a model on a token stream (a token file or
// tokenized text). The stream is cut into windows of seq+1 tokens overlapping by one
// (window w = tokens[w*seq .. w*seq+seq]), so every token but the first is predicted
// exactly once, from up to seq tokens of context restarted at each window boundary; the
// last, shorter window is included. Windows run in batches through model_forward.
#pragma once
#include <stdint.h>

#include "tokenizer/tokenizer.h"
#include "io/npy.h"
#include "model/model.h"

// Reads tokens [start, start+n) of the stream into dst.
typedef int (*TokenReadFn)(void *ctx, uint64_t start, size_t n, uint32_t *dst);

typedef struct {
    uint64_t count;         // tokens in the stream
    TokenReadFn read;
    void *ctx;
} TokenStream;

// The stream of an open token file (src/io/npy.h); tf must outlive the stream.
TokenStream token_stream_of_file(const TokenFile *tf);

typedef struct {
    int seq;                // window (tokens of context per prediction at most)
    int batch;              // windows per forward
    uint64_t max_tokens;    // 0: the whole stream; else only its first max_tokens tokens
    const Tokenizer *tok;   // for bits per byte (decoded byte length of each target); may be NULL
    int show_progress;
} PerplexityOptions;

typedef struct {
    double loss;            // mean cross-entropy, nats per predicted token
    double perplexity;      // exp(loss)
    double bits_per_byte;   // NaN without a tokenizer
    uint64_t tokens;        // predicted tokens
    uint64_t bytes;         // their decoded bytes (0 without a tokenizer)
    double seconds;
} PerplexityResult;

int eval_perplexity(Model *m, const TokenStream *stream, const PerplexityOptions *opt, PerplexityResult *out);
