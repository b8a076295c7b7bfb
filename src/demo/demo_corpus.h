// The built-in demo corpus: a deterministic, learnable little world, so `spes demo` needs no
// downloads. A seed fixes the world (invented creatures with a colour, a home town and a
// number of stones); documents state its facts in several phrasings, interleaved with
// small additions. Questions come in two tasks, written as OLMo/oe-eval request files
// (the format of ../shared/data/eval) so `spes eval` scores them like any downstream task:
//   recall      "The <creature> is" -> " <colour>" among 4 colours (facts seen in training)
//   arithmetic  "<a> plus <b> is"   -> " <a+b>" among 4 sums, for pairs held out of training
#pragma once
#include <stddef.h>
#include <stdint.h>

// The world `spes demo` uses.
#define DEMO_WORLD_SEED 2026

// Receives each document (UTF-8, no trailing newline); returns SPES_OK or SPES_ERR to stop.
typedef int (*DemoDocFn)(void *user, const char *text, size_t len);

// Documents number `first` .. `first + count - 1` of the world `world_seed` (documents are
// independent of each other, so train and validation splits are disjoint ranges).
int demo_corpus_generate(uint64_t world_seed, uint64_t first, uint64_t count, DemoDocFn on_doc, void *user);

typedef enum { DEMO_TASK_RECALL = 0, DEMO_TASK_ARITHMETIC } DemoTask;
// Writes `num_questions` questions of a task as requests.jsonl (4 choices each) to path.
int demo_questions_write(uint64_t world_seed, DemoTask task, int num_questions, const char *path);
