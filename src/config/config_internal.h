// Private to src/config: the key table and the state of one load.
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config/config.h"
#include "config/yaml_tree.h"

// A growable list of malloc'd strings (key names for the summary messages).
typedef struct {
    char **items;
    int n, cap;
} StrList;
int strlist_push(StrList *l, char *owned);            // takes ownership (frees on failure)
void strlist_free(StrList *l);
char *strlist_join(const StrList *l, const char *sep);   // malloc'd; "" for an empty list

// One load: raw model keys that derive ModelConfig fields once the whole file is read, and
// the key lists reported once at the end.
typedef struct {
    int mlp_hidden_size;            // 0: unset
    double mlp_ratio;
    bool attention_layer_norm, attention_layer_norm_over_head;
    bool data_seed_set;
    StrList unknown;                // "key (file:line)"
    StrList ignored;                // key names
    StrList downstream;             // evaluator labels skipped
} ParseCtx;

// "origin:line: key: message" (or "command line --key: message") as the error; SPES_ERR.
int key_fail(const YNode *n, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int key_vfail(const YNode *n, const char *key, const char *fmt, va_list ap);
// Where key's value came from (n: its node, NULL for a default), as messages start:
// "origin:line: key", "command line --key" or "key".
void key_where(const YNode *n, const char *key, char *out, size_t cap);

// Fills cfg from the tree (after overrides and interpolation), collecting unknown/ignored keys.
int config_apply_tree(ParseCtx *ctx, const YNode *root, TrainConfig *cfg);
// Derived model fields (expert_hidden, qk_norm, data seed, experts per node) after the walk.
int config_finish(ParseCtx *ctx, const YNode *root, TrainConfig *cfg);
// Whether `path` (dotted) names a known key, or lies inside an ignored/free-form one.
bool config_key_known(const char *path);
typedef enum {
    CONFIG_DUMP_YAML,      // the whole resolved YAML (config_write_yaml)
    CONFIG_LINES_HASHED,   // "key=value" lines of the hashed keys (config_hash, resume)
    CONFIG_LINES_JOB,      // "key=value" lines of every key but the per-rank ones (ranks of a job)
} ConfigOutput;
void config_write_values(const TrainConfig *cfg, FILE *out, ConfigOutput which);
