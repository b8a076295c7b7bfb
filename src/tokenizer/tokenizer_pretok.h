// Pre-tokenizers of a HF tokenizer.json: Split (regex via PCRE2 with UTF + Unicode properties,
// or a literal string; behaviours Removed / Isolated / MergedWithPrevious / MergedWithNext /
// Contiguous; invert), Digits, ByteLevel (add_prefix_space, use_regex with GPT-2's pattern) and
// Sequence. ByteLevel must come last (BPE then works on raw bytes; see tokenizer_bytelevel.h).
//
// Steps stream: each piece a step produces goes straight into the next step, and the last
// step's pieces go to a callback, so nothing is collected in lists.
#pragma once
#include <stddef.h>

#include <jansson.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_WITH_PREVIOUS, SPLIT_MERGED_WITH_NEXT, SPLIT_CONTIGUOUS } SplitBehavior;

typedef struct {
    pcre2_code *re;          // NULL for a step that only prepends a space (ByteLevel, use_regex false)
    int jit;                 // JIT-compiled
    SplitBehavior behavior;
    int invert;              // the regex matches the pieces to keep, not the delimiters
    int add_prefix_space;    // ByteLevel: prepend ' ' to a piece that does not start with one
} PreTokStep;

typedef struct {
    PreTokStep *steps;
    int num_steps;
    int has_byte_level;
    char *description;       // e.g. "Split(Removed,invert)+ByteLevel"
} PreTokenizer;

// Per-encoder matching state.
typedef struct {
    pcre2_match_data *match;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    char *prefixed;          // the piece with a prepended space (ByteLevel add_prefix_space)
    size_t prefixed_cap;
} PreTokScratch;

typedef int (*PreTokEmitFn)(void *ctx, const char *piece, size_t len);

// j: the "pre_tokenizer" value.
int pretok_parse(const json_t *j, PreTokenizer *out);
void pretok_free(PreTokenizer *pt);
int pretok_scratch_init(PreTokScratch *s);
void pretok_scratch_free(PreTokScratch *s);
// Splits text[0..len) (valid UTF-8) and calls emit for every non-empty piece, in order.
int pretok_run(const PreTokenizer *pt, PreTokScratch *s, const char *text, size_t len, PreTokEmitFn emit, void *ctx);
