#include "demo/demo_corpus.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "base/rng.h"

#define NUM_CREATURES 48
#define NAME_CAP 16
#define DOC_CAP 2048
#define MAX_ADDEND 30          // additions use a, b in [0, MAX_ADDEND)

static const char *colours[] = {"red", "blue", "green", "yellow", "black", "white", "purple", "orange"};
static const char *towns[] = {"Varn", "Oskel", "Pim", "Trask", "Dolu", "Henbury", "Quall", "Mirro"};
#define NUM_COLOURS 8
#define NUM_TOWNS 8

typedef struct {
    char name[NAME_CAP];
    int colour, town, stones;
} Creature;

typedef struct {
    Creature creatures[NUM_CREATURES];
} World;

// Invented names from consonant-vowel syllables, e.g. "zorbek". Same seed, same world.
static void build_world(uint64_t seed, World *w) {
    static const char consonants[] = "bdfgklmnprstvz", vowels[] = "aeiou";
    Rng rng;
    rng_seed(&rng, seed ^ 0x5be5c0deULL);
    for (int i = 0; i < NUM_CREATURES; i++) {
        Creature *c = &w->creatures[i];
        int syllables = 2 + (int)rng_below(&rng, 2), at = 0;
        for (int s = 0; s < syllables; s++) {
            c->name[at++] = consonants[rng_below(&rng, sizeof consonants - 1)];
            c->name[at++] = vowels[rng_below(&rng, sizeof vowels - 1)];
        }
        c->name[at++] = consonants[rng_below(&rng, sizeof consonants - 1)];
        c->name[at] = '\0';
        c->colour = (int)rng_below(&rng, NUM_COLOURS);
        c->town = (int)rng_below(&rng, NUM_TOWNS);
        c->stones = 1 + (int)rng_below(&rng, 20);
    }
}

// Pairs with (a + 2b) % 7 == 3 never appear in training: the arithmetic task asks those.
static int pair_is_held_out(int a, int b) { return (a + 2 * b) % 7 == 3; }

static int append(char *doc, int at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int append(char *doc, int at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(doc + at, (size_t)(DOC_CAP - at), fmt, ap);
    va_end(ap);
    return (n < 0 || at + n >= DOC_CAP) ? at : at + n;
}

static int write_document(const World *w, Rng *rng, char *doc) {
    int at = 0, sentences = 4 + (int)rng_below(rng, 5);
    for (int s = 0; s < sentences; s++) {
        if (at) at = append(doc, at, " ");
        const Creature *c = &w->creatures[rng_below(rng, NUM_CREATURES)];
        switch (rng_below(rng, 6)) {
        case 0: at = append(doc, at, "The %s is %s.", c->name, colours[c->colour]); break;
        case 1: at = append(doc, at, "Everyone knows the %s is %s.", c->name, colours[c->colour]); break;
        case 2: at = append(doc, at, "The %s lives in %s.", c->name, towns[c->town]); break;
        case 3: at = append(doc, at, "The %s has %d stones.", c->name, c->stones); break;
        case 4: at = append(doc, at, "In %s, the %s is %s.", towns[c->town], c->name, colours[c->colour]); break;
        default: {
            int a, b;
            do {
                a = (int)rng_below(rng, MAX_ADDEND);
                b = (int)rng_below(rng, MAX_ADDEND);
            } while (pair_is_held_out(a, b));
            at = append(doc, at, "%d plus %d is %d.", a, b, a + b);
        }
        }
    }
    return at;
}

int demo_corpus_generate(uint64_t world_seed, uint64_t first, uint64_t count, DemoDocFn on_doc, void *user) {
    World w;
    build_world(world_seed, &w);
    char doc[DOC_CAP];
    for (uint64_t i = first; i < first + count; i++) {
        Rng rng;   // one stream per document: any range is reproducible on its own
        rng_seed(&rng, world_seed * 0x9E3779B97F4A7C15ULL + i + 1);
        int len = write_document(&w, &rng, doc);
        SPES_TRY(on_doc(user, doc, (size_t)len));
    }
    return SPES_OK;
}

// Four distinct choices: the gold answer plus three distractors, gold at a random slot.
static void pick_choices(Rng *rng, int gold, int range, int offset, int choices[4], int *gold_slot) {
    *gold_slot = (int)rng_below(rng, 4);
    for (int k = 0; k < 4; k++) {
        if (k == *gold_slot) {
            choices[k] = gold;
            continue;
        }
        int v, dup;
        do {
            v = offset + (int)rng_below(rng, (uint64_t)range);
            dup = v == gold;
            for (int j = 0; j < k; j++) dup |= choices[j] == v;
        } while (dup);
        choices[k] = v;
    }
}

static int write_request_lines(FILE *fp, const char *task, int doc_id, const char *context, char choices[4][32],
                               int gold) {
    for (int k = 0; k < 4; k++) {
        json_t *jchoices = json_array();
        for (int j = 0; j < 4; j++) json_array_append_new(jchoices, json_string(choices[j]));
        char continuation[40];
        snprintf(continuation, sizeof continuation, " %.31s", choices[k]);
        json_t *line = json_pack("{s:s, s:{s:s, s:o, s:i}, s:{s:s, s:s}, s:i, s:s, s:i, s:i}", "request_type",
                                 "loglikelihood", "doc", "query", context, "choices", jchoices, "gold", gold, "request",
                                 "context", context, "continuation", continuation, "idx", k, "task_name", task,
                                 "doc_id", doc_id, "label", gold);
        if (!line) return spes_fail("out of memory building a demo question");
        int rc = json_dumpf(line, fp, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(line);
        if (rc != 0 || fputc('\n', fp) == EOF) return spes_fail("cannot write demo questions");
    }
    return SPES_OK;
}

int demo_questions_write(uint64_t world_seed, DemoTask task, int num_questions, const char *path) {
    World w;
    build_world(world_seed, &w);
    Rng rng;
    rng_seed(&rng, world_seed ^ (task == DEMO_TASK_RECALL ? 0x7ec411ULL : 0xadd1ULL));
    char *text = NULL;
    size_t text_len = 0;
    FILE *fp = open_memstream(&text, &text_len);
    if (!fp) return spes_fail("cannot allocate demo questions for %s", path);
    int rc = SPES_OK;
    for (int q = 0; q < num_questions && rc == SPES_OK; q++) {
        char context[64], choices[4][32];
        int values[4], gold;
        if (task == DEMO_TASK_RECALL) {
            const Creature *c = &w.creatures[q % NUM_CREATURES];
            snprintf(context, sizeof context, "The %s is", c->name);
            pick_choices(&rng, c->colour, NUM_COLOURS, 0, values, &gold);
            for (int k = 0; k < 4; k++) snprintf(choices[k], sizeof choices[k], "%s", colours[values[k]]);
        } else {
            int a, b;
            do {
                a = (int)rng_below(&rng, MAX_ADDEND);
                b = (int)rng_below(&rng, MAX_ADDEND);
            } while (!pair_is_held_out(a, b));
            snprintf(context, sizeof context, "%d plus %d is", a, b);
            int sum = a + b, low = sum > 5 ? sum - 5 : 0;
            pick_choices(&rng, sum, 11, low, values, &gold);
            for (int k = 0; k < 4; k++) snprintf(choices[k], sizeof choices[k], "%d", values[k]);
        }
        rc = write_request_lines(fp, task == DEMO_TASK_RECALL ? "demo_recall" : "demo_arithmetic", q, context,
                                 choices, gold);
    }
    fclose(fp);
    if (rc == SPES_OK) rc = file_write_atomic(path, text, text_len);
    free(text);
    return rc;
}
