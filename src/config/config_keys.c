// The key table: every SPES/OLMo config key we know, how it is read into TrainConfig, how it
// is printed back, and why it is ignored when it is. The loader, the resolved-YAML dump, the
// config hash and docs/config-keys.md all come from this one table.
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "config/config_internal.h"

// ---------------------------------------------------------------------------------------
// Small helpers

int strlist_push(StrList *l, char *owned) {
    if (!owned) return SPES_ERR;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **items = spes_realloc(l->items, (size_t)cap * sizeof(char *));
        if (!items) {
            free(owned);
            return SPES_ERR;
        }
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = owned;
    return SPES_OK;
}

void strlist_free(StrList *l) {
    for (int i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    *l = (StrList){0};
}

char *strlist_join(const StrList *l, const char *sep) {
    size_t len = 1;
    for (int i = 0; i < l->n; i++) len += strlen(l->items[i]) + strlen(sep);
    char *s = spes_malloc(len);
    if (!s) return NULL;
    size_t at = 0, sep_len = strlen(sep);   // appended at an offset: strcat from the start is quadratic
    for (int i = 0; i < l->n; i++) {
        if (i) memcpy(s + at, sep, sep_len), at += sep_len;
        size_t n = strlen(l->items[i]);
        memcpy(s + at, l->items[i], n);
        at += n;
    }
    s[at] = '\0';
    return s;
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int rc = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (rc < 0) {
        spes_fail("out of memory formatting a message");
        return NULL;
    }
    return s;
}

void key_where(const YNode *n, const char *key, char *out, size_t cap) {
    if (!n) snprintf(out, cap, "%s", key);   // a default or derived value
    else if (n->line > 0) snprintf(out, cap, "%s:%d: %s", n->origin, n->line, key);
    else snprintf(out, cap, "command line --%s", key);
}

int key_vfail(const YNode *n, const char *key, const char *fmt, va_list ap) {
    char msg[512], where[600];
    vsnprintf(msg, sizeof msg, fmt, ap);
    key_where(n, key, where, sizeof where);
    return spes_fail("%s: %s", where, msg);
}

int key_fail(const YNode *n, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = key_vfail(n, key, fmt, ap);
    va_end(ap);
    return rc;
}

static const char *kind_word(const YNode *n) {
    return n->kind == YNODE_MAP ? "a mapping" : n->kind == YNODE_SEQ ? "a list" : "a value";
}

static int scalar_of(const YNode *n, const char *key, const char *expected, const char **text) {
    if (n->kind != YNODE_SCALAR) return key_fail(n, key, "expected %s, got %s", expected, kind_word(n));
    *text = n->value;
    return SPES_OK;
}

// "040", "-007": YAML 1.1 (PyYAML, so OmegaConf and the reference) reads a leading 0 as octal
// (040 is 32; 08 is a string), strtoll as decimal. Refused, naming both readings, rather
// than silently training with another value than the reference would.
static int refuse_leading_zero(const YNode *n, const char *key, const char *s) {
    const char *d = s + (*s == '-' || *s == '+');
    if (d[0] != '0' || d[1] == '\0' || strspn(d, "0123456789") != strlen(d)) return SPES_OK;
    return key_fail(n, key, "'%s' has a leading 0, which YAML 1.1 (OmegaConf, as the reference reads its configs) "
                            "takes for octal; write the number without it",
                    s);
}

// Whole-string integer (decimal, optional sign; "1_000" is not accepted).
static int parse_i64(const YNode *n, const char *key, int64_t *out) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "an integer", &s));
    SPES_TRY(refuse_leading_zero(n, key, s));
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (s[0] == '\0' || *end != '\0' || errno == ERANGE) {
        // "5000.0" / "1e4": accept when the number is exactly integral (OmegaConf would not,
        // but it is what the user meant); anything else is a type error.
        double d = strtod(s, &end);
        if (s[0] != '\0' && *end == '\0' && isfinite(d) && d == floor(d) && fabs(d) < 9.0e15) {
            *out = (int64_t)d;
            return SPES_OK;
        }
        return key_fail(n, key, "expected an integer, got '%s'", s);
    }
    *out = v;
    return SPES_OK;
}

static int parse_f64(const YNode *n, const char *key, double *out) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "a number", &s));
    SPES_TRY(refuse_leading_zero(n, key, s));
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (s[0] == '\0' || *end != '\0' || !isfinite(v) || errno == ERANGE)
        return key_fail(n, key, "expected a number, got '%s'", s);
    *out = v;
    return SPES_OK;
}

// YAML 1.1 booleans, as PyYAML/OmegaConf read them.
static int bool_word(const char *s, bool *out) {
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        if (strcmp(s, yes[i]) == 0) return *out = true, SPES_OK;
        if (strcmp(s, no[i]) == 0) return *out = false, SPES_OK;
    }
    return SPES_ERR;
}

static int parse_bool(const YNode *n, const char *key, bool *out) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "true or false", &s));
    if (bool_word(s, out) != SPES_OK) return key_fail(n, key, "expected true or false, got '%s'", s);
    return SPES_OK;
}

static void free_strings(char **list, int n) {
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}

// A list of strings; a single scalar counts as a one-element list.
static int parse_strlist(const YNode *n, const char *key, char ***list, int *count) {
    int len = n->kind == YNODE_SEQ ? n->n : 1;
    if (n->kind == YNODE_MAP) return key_fail(n, key, "expected a list of strings, got a mapping");
    char **out = spes_calloc((size_t)(len ? len : 1), sizeof(char *));
    if (!out) return SPES_ERR;
    for (int i = 0; i < len; i++) {
        const YNode *item = n->kind == YNODE_SEQ ? n->items[i] : n;
        if (item->kind != YNODE_SCALAR || ytree_is_null(item)) {
            free_strings(out, i);
            return key_fail(item, key, "entry %d: expected a string, got %s", i,
                            item->kind == YNODE_SCALAR ? "null" : kind_word(item));
        }
        if (!(out[i] = spes_strdup(item->value))) {
            free_strings(out, i);
            return SPES_ERR;
        }
    }
    free_strings(*list, *count);
    *list = out;
    *count = len;
    return SPES_OK;
}

// ---------------------------------------------------------------------------------------
// The table

typedef enum {
    K_SECTION,  // a mapping whose keys have their own entries
    K_INT,      // int field
    K_I64,      // int64_t field
    K_F32,      // float field
    K_F64,      // double field
    K_BOOL,     // bool field
    K_STR,      // char * field (owned)
    K_STRLIST,  // char ** + int count right after it (DataConfig/EvaluatorConfig layout)
    K_FIXED,    // no field: only `fixed` (or null) is accepted, it is what we implement
    K_IGNORED,  // no field: GPU/cluster-only, reason in `meaning`; subtree not read
    K_SPECIAL,  // parse/format functions below
} KeyKind;

typedef enum { MIN_NONE = 0, MIN_POSITIVE, MIN_NONNEG } KeyMin;

typedef struct ConfigKey ConfigKey;
struct ConfigKey {
    const char *path;
    KeyKind kind;
    size_t offset;
    KeyMin min;
    bool nullable;          // null accepted: numbers store null_value, strings NULL
    double null_value;
    bool hashed;            // part of config_hash
    bool per_rank;          // may differ between the ranks of one job (config_job_lines leaves it out)
    bool (*unset)(const TrainConfig *);   // hashed keys added later: left out of the hash while
                                          // unset, so configs without them keep their hash
    bool fp32;              // K_F64 read into a double but computed with as a float (as K_F32 is)
    const char *fixed;      // K_FIXED: the accepted value
    int (*parse)(ParseCtx *, const YNode *, const char *key, TrainConfig *);
    void (*format)(const TrainConfig *, FILE *);   // K_SPECIAL; NULL: not printed
    const char *meaning;    // docs text; for K_IGNORED the reason
};

#define F(field) offsetof(TrainConfig, field)

// ---- special keys

static int parse_mlp_hidden_size(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    if (ytree_is_null(n)) return c->mlp_hidden_size = 0, SPES_OK;
    int64_t v = 0;
    SPES_TRY(parse_i64(n, key, &v));
    if (v <= 0 || v > INT_MAX || v % 2 != 0)
        return key_fail(n, key, "must be a positive even number (SwiGLU splits it in two halves), got %" PRId64, v);
    c->mlp_hidden_size = (int)v;
    return SPES_OK;
}
static void format_mlp_hidden_size(const TrainConfig *cfg, FILE *out) { fprintf(out, "%d", 2 * cfg->model.expert_hidden); }

static int parse_mlp_ratio(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    double v = 0;
    SPES_TRY(parse_f64(n, key, &v));
    if (!(v > 0)) return key_fail(n, key, "must be > 0, got %g", v);
    c->mlp_ratio = v;
    return SPES_OK;
}

static int parse_attention_layer_norm(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    return parse_bool(n, key, &c->attention_layer_norm);
}
static void format_attention_layer_norm(const TrainConfig *cfg, FILE *out) {
    fputs(cfg->model.qk_norm != QK_NORM_NONE ? "true" : "false", out);
}
static int parse_attention_layer_norm_over_head(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    if (ytree_is_null(n)) return c->attention_layer_norm_over_head = false, SPES_OK;
    return parse_bool(n, key, &c->attention_layer_norm_over_head);
}
static void format_attention_layer_norm_over_head(const TrainConfig *cfg, FILE *out) {
    fputs(cfg->model.qk_norm == QK_NORM_HEAD ? "true" : "false", out);
}

// OLMoE passes this to MegaBlocks as the p of a p-norm; the SPES configs write `true` (= 1).
static int parse_normalize_expert_weights(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    if (ytree_is_null(n)) return cfg->model.normalize_expert_weights = false, SPES_OK;
    bool b;
    if (n->kind == YNODE_SCALAR && bool_word(n->value, &b) == SPES_OK) return cfg->model.normalize_expert_weights = b, SPES_OK;
    double p = 0;
    SPES_TRY(parse_f64(n, key, &p));
    if (p != 1.0) return key_fail(n, key, "only true/1 (L1 renormalisation of the top-k weights) is supported, got '%s'", n->value);
    cfg->model.normalize_expert_weights = true;
    return SPES_OK;
}
static void format_normalize_expert_weights(const TrainConfig *cfg, FILE *out) {
    fputs(cfg->model.normalize_expert_weights ? "true" : "false", out);
}

static int parse_betas(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    if (n->kind != YNODE_SEQ || n->n != 2)
        return key_fail(n, key, "expected a list of two numbers [beta1, beta2], got %s",
                        n->kind == YNODE_SEQ ? "a list of another length" : kind_word(n));
    double b[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        SPES_TRY(parse_f64(n->items[i], key, &b[i]));
        if (!(b[i] >= 0.0 && b[i] < 1.0)) return key_fail(n->items[i], key, "each beta must be in [0, 1), got %g", b[i]);
    }
    cfg->adamw.beta1 = b[0];
    cfg->adamw.beta2 = b[1];
    return SPES_OK;
}

static void print_number(FILE *out, double v);
static void format_betas(const TrainConfig *cfg, FILE *out) {
    fputc('[', out);
    print_number(out, cfg->adamw.beta1);
    fputs(", ", out);
    print_number(out, cfg->adamw.beta2);
    fputc(']', out);
}

static int parse_scheduler_name(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "a scheduler name", &s));
    if (schedule_kind_from_name(s, &cfg->schedule.kind) != SPES_OK)
        return key_fail(n, key, "expected %s, got '%s'", schedule_kind_names(), s);
    return SPES_OK;
}
static void format_scheduler_name(const TrainConfig *cfg, FILE *out) { fputs(schedule_kind_name(cfg->schedule.kind), out); }

static int parse_scheduler_units(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "steps or tokens", &s));
    if (schedule_units_from_name(s, &cfg->schedule.units) != SPES_OK)
        return key_fail(n, key, "expected steps or tokens, got '%s'", s);
    return SPES_OK;
}
static void format_scheduler_units(const TrainConfig *cfg, FILE *out) { fputs(schedule_units_name(cfg->schedule.units), out); }

static int parse_memmap_dtype(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "a dtype name", &s));
    if (strcmp(s, "uint16") == 0) cfg->data.memmap_dtype = MEMMAP_UINT16;
    else if (strcmp(s, "uint32") == 0) cfg->data.memmap_dtype = MEMMAP_UINT32;
    else return key_fail(n, key, "expected uint16 or uint32 (what tokenize_data.py writes), got '%s'", s);
    return SPES_OK;
}
static void format_memmap_dtype(const TrainConfig *cfg, FILE *out) {
    fputs(cfg->data.memmap_dtype == MEMMAP_UINT32 ? "uint32" : "uint16", out);
}

static int parse_payload_dtype(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "f32, bf16, int8 or int4", &s));
    if (strcmp(s, "f32") == 0 || strcmp(s, "float32") == 0) cfg->payload_dtype = PAYLOAD_F32;
    else if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0) cfg->payload_dtype = PAYLOAD_BF16;
    else if (strcmp(s, "int8") == 0) cfg->payload_dtype = PAYLOAD_INT8;
    else if (strcmp(s, "int4") == 0) cfg->payload_dtype = PAYLOAD_INT4;
    else return key_fail(n, key, "expected f32, bf16, int8 or int4, got '%s'", s);
    return SPES_OK;
}
static void format_payload_dtype(const TrainConfig *cfg, FILE *out) {
    static const char *names[] = {[PAYLOAD_F32] = "f32", [PAYLOAD_BF16] = "bf16", [PAYLOAD_INT8] = "int8", [PAYLOAD_INT4] = "int4"};
    fputs(names[cfg->payload_dtype], out);
}

static int parse_data_seed(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    if (ytree_is_null(n)) return c->data_seed_set = false, SPES_OK;
    int64_t v = 0;
    SPES_TRY(parse_i64(n, key, &v));
    if (v < 0) return key_fail(n, key, "must be >= 0, got %" PRId64, v);
    cfg->data.seed = v;
    c->data_seed_set = true;
    return SPES_OK;
}
static void format_data_seed(const TrainConfig *cfg, FILE *out) { fprintf(out, "%" PRId64, cfg->data.seed); }

// data.instance_filter: null (off) or a mapping of OLMo's three InstanceFilterConfig fields;
// a field left out keeps OLMo's default (13, 1, 32). A misspelt field is an error: it would
// silently filter with a default.
static const InstanceFilterConfig INSTANCE_FILTER_OFF = {.enabled = false, .max_period = 13, .min_period = 1,
                                                          .max_count = 32};
static int parse_instance_filter(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    InstanceFilterConfig *f = &cfg->data.instance_filter;
    *f = INSTANCE_FILTER_OFF;
    if (ytree_is_null(n)) return SPES_OK;
    if (n->kind != YNODE_MAP) return key_fail(n, key, "expected a mapping (or null), got %s", kind_word(n));
    static const char *const names[] = {"repetition_max_period", "repetition_min_period", "repetition_max_count"};
    int *fields[] = {&f->max_period, &f->min_period, &f->max_count};
    for (int i = 0; i < n->n; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s.%s", key, n->keys[i]);
        int which = -1;
        for (int j = 0; j < 3; j++)
            if (strcmp(n->keys[i], names[j]) == 0) which = j;
        if (which < 0)
            return key_fail(n->items[i], path, "unknown field (expected repetition_max_period, repetition_min_period "
                                               "or repetition_max_count)");
        int64_t v = 0;
        SPES_TRY(parse_i64(n->items[i], path, &v));
        if (v < 1 || v > INT_MAX) return key_fail(n->items[i], path, "must be a whole number >= 1, got %s", n->items[i]->value);
        *fields[which] = (int)v;
    }
    if (f->max_period < f->min_period)
        return key_fail(n, key, "repetition_max_period (%d) must be >= repetition_min_period (%d)", f->max_period,
                        f->min_period);
    f->enabled = true;
    return SPES_OK;
}
static void format_instance_filter(const TrainConfig *cfg, FILE *out) {
    const InstanceFilterConfig *f = &cfg->data.instance_filter;
    if (!f->enabled) fputs("null", out);
    else fprintf(out, "{repetition_max_period: %d, repetition_min_period: %d, repetition_max_count: %d}", f->max_period,
                 f->min_period, f->max_count);
}
static bool instance_filter_unset(const TrainConfig *cfg) { return !cfg->data.instance_filter.enabled; }
// Keys added after configs were hashed: at their defaults (off) they leave the hash as it was.
static bool sync_warmup_unset(const TrainConfig *cfg) { return cfg->sync_warmup_steps == 0; }
static bool lr_scale_unset(const TrainConfig *cfg) { return cfg->lr_scale == 1.0; }
static bool peer_beta1_unset(const TrainConfig *cfg) { return cfg->peer_beta1 < 0; }
static bool reset_moments_unset(const TrainConfig *cfg) { return !cfg->reset_moments_at_sync; }
// One clipping warm-up key without the other changes nothing (OLMo's get_max_grad_norm).
static bool clip_warmup_unset(const TrainConfig *cfg) { return !schedule_clip_warmup_on(&cfg->schedule); }
static bool clip_ratio_unset(const TrainConfig *cfg) { return cfg->max_grad_norm_ratio <= 0; }
static bool scheduler_units_unset(const TrainConfig *cfg) { return cfg->schedule.units == SCHEDULE_UNITS_STEPS; }

// "50000" steps, "1e9T" / "1000000000T" tokens, "2ep" epochs (OLMo's forms).
static int parse_max_duration(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    const char *s = NULL;
    SPES_TRY(scalar_of(n, key, "a duration (steps, <N>T tokens or <N>ep epochs)", &s));
    size_t len = strlen(s);
    DurationUnit unit = DURATION_STEPS;
    if (len > 1 && s[len - 1] == 'T') unit = DURATION_TOKENS, len -= 1;
    else if (len > 2 && strcmp(s + len - 2, "ep") == 0) unit = DURATION_EPOCHS, len -= 2;
    char num[64];
    if (len == 0 || len >= sizeof num) return key_fail(n, key, "expected steps, <N>T or <N>ep, got '%s'", s);
    memcpy(num, s, len);
    num[len] = '\0';
    char *end;
    errno = 0;
    long long whole = strtoll(num, &end, 10);   // exact (a double keeps 53 bits); "1e9" takes the strtod path
    if (*end == '\0' && errno == 0 && whole > 0) {
        cfg->max_duration = whole;
        cfg->max_duration_unit = unit;
        return SPES_OK;
    }
    errno = 0;
    double v = strtod(num, &end);
    if (*end != '\0' || !isfinite(v) || v != floor(v) || v <= 0 || v > 9.0e18)
        return key_fail(n, key, "expected a positive whole number of steps, <N>T tokens or <N>ep epochs, got '%s'", s);
    cfg->max_duration = (int64_t)v;
    cfg->max_duration_unit = unit;
    return SPES_OK;
}
static void format_max_duration(const TrainConfig *cfg, FILE *out) {
    static const char *const suffix[] = {"", "T", "ep"};
    fprintf(out, "%" PRId64 "%s", cfg->max_duration, suffix[cfg->max_duration_unit]);
}

static void evaluator_free(EvaluatorConfig *ev) {
    free(ev->label);
    free_strings(ev->paths, ev->n_paths);
    free(ev->requests);
    *ev = (EvaluatorConfig){0};
}

// Keys of an `evaluators:` entry that OLMo has and we skip (reported as ignored).
static bool evaluator_key_ignored(const char *k) {
    return strcmp(k, "subset_num_batches") == 0 || strcmp(k, "device_eval_batch_size") == 0;
}

// A downstream entry with our `requests:` key (and optional `limit:`) is kept; without it, it is
// recorded and skipped (OLMo's built-in tasks: `spes eval` runs oe-eval request files).
static int parse_downstream_evaluator(ParseCtx *c, const YNode *n, const char *where, const char *label,
                                      EvaluatorConfig *ev, bool *keep) {
    const YNode *requests = ytree_map_get(n, "requests");
    if (!requests || ytree_is_null(requests)) {
        *keep = false;
        return strlist_push(&c->downstream, spes_strdup(label));
    }
    *keep = true;
    const char *path = NULL;
    char key[96];
    snprintf(key, sizeof key, "%s.requests", where);
    SPES_TRY(scalar_of(requests, key, "a request file or folder", &path));
    if (!(ev->label = spes_strdup(label)) || !(ev->requests = spes_strdup(path))) return SPES_ERR;
    for (int i = 0; i < n->n; i++) {
        const char *k = n->keys[i];
        snprintf(key, sizeof key, "%s.%s", where, k);
        if (strcmp(k, "label") == 0 || strcmp(k, "type") == 0 || strcmp(k, "requests") == 0) continue;
        if (strcmp(k, "limit") == 0) {
            int64_t v = 0;
            if (!ytree_is_null(n->items[i])) SPES_TRY(parse_i64(n->items[i], key, &v));
            if (v < 0 || v > INT_MAX) return key_fail(n->items[i], key, "must be a document count >= 0 (0: all)");
            ev->limit = (int)v;
        } else if (evaluator_key_ignored(k)) {
            SPES_TRY(strlist_push(&c->ignored, spes_strdup(key)));
        } else {
            SPES_TRY(strlist_push(&c->unknown, str_printf("%s (%s:%d)", key, n->items[i]->origin, n->items[i]->line)));
        }
    }
    return SPES_OK;
}

// One `evaluators:` entry. type lm (OLMo's default) needs data.paths; downstream: above.
static int parse_one_evaluator(ParseCtx *c, const YNode *n, int index, EvaluatorConfig *ev, bool *keep) {
    char where[64];
    snprintf(where, sizeof where, "evaluators[%d]", index);
    if (n->kind != YNODE_MAP) return key_fail(n, where, "expected a mapping with label/type/data, got %s", kind_word(n));
    const YNode *label = ytree_map_get(n, "label");
    const YNode *type = ytree_map_get(n, "type");
    if (!label || label->kind != YNODE_SCALAR || ytree_is_null(label))
        return key_fail(n, where, "every evaluator needs a label");
    const char *type_name = "lm";
    if (type && !ytree_is_null(type)) SPES_TRY(scalar_of(type, where, "lm or downstream", &type_name));
    if (strcmp(type_name, "downstream") == 0) return parse_downstream_evaluator(c, n, where, label->value, ev, keep);
    if (strcmp(type_name, "lm") != 0) return key_fail(type, where, "type must be lm or downstream, got '%s'", type_name);
    *keep = true;
    if (!(ev->label = spes_strdup(label->value))) return SPES_ERR;
    for (int i = 0; i < n->n; i++) {
        const char *k = n->keys[i];
        if (strcmp(k, "label") == 0 || strcmp(k, "type") == 0) continue;
        if (evaluator_key_ignored(k)) {
            SPES_TRY(strlist_push(&c->ignored, str_printf("%s.%s", where, k)));
            continue;
        }
        if (strcmp(k, "data") == 0 && n->items[i]->kind == YNODE_MAP) {
            const YNode *data = n->items[i];
            for (int j = 0; j < data->n; j++) {
                char key[128];
                snprintf(key, sizeof key, "%s.data.%s", where, data->keys[j]);
                if (strcmp(data->keys[j], "paths") == 0) {
                    SPES_TRY(parse_strlist(data->items[j], key, &ev->paths, &ev->n_paths));
                } else if (strcmp(data->keys[j], "memmap_dtype") == 0 || strcmp(data->keys[j], "num_workers") == 0 ||
                           strcmp(data->keys[j], "drop_last") == 0 || strcmp(data->keys[j], "pin_memory") == 0 ||
                           strcmp(data->keys[j], "persistent_workers") == 0 || strcmp(data->keys[j], "prefetch_factor") == 0) {
                    // the evaluator reads with the training data's dtype and loader
                    SPES_TRY(strlist_push(&c->ignored, spes_strdup(key)));
                } else {
                    SPES_TRY(strlist_push(&c->unknown, str_printf("%s (%s:%d)", key, data->items[j]->origin, data->items[j]->line)));
                }
            }
            continue;
        }
        SPES_TRY(strlist_push(&c->unknown, str_printf("%s.%s (%s:%d)", where, k, n->items[i]->origin, n->items[i]->line)));
    }
    if (ev->n_paths == 0)
        return key_fail(n, where, "lm evaluator '%s' needs data.paths (token files for the validation loss)", ev->label);
    return SPES_OK;
}

static void free_evaluators(TrainConfig *cfg) {
    for (int i = 0; i < cfg->n_evaluators; i++) evaluator_free(&cfg->evaluators[i]);
    free(cfg->evaluators);
    cfg->evaluators = NULL;
    cfg->n_evaluators = 0;
}

static int parse_evaluators(ParseCtx *c, const YNode *n, const char *key, TrainConfig *cfg) {
    free_evaluators(cfg);
    if (ytree_is_null(n)) return SPES_OK;
    if (n->kind != YNODE_SEQ) return key_fail(n, key, "expected a list of evaluators, got %s", kind_word(n));
    cfg->evaluators = spes_calloc((size_t)(n->n ? n->n : 1), sizeof(EvaluatorConfig));
    if (!cfg->evaluators) return SPES_ERR;
    for (int i = 0; i < n->n; i++) {
        EvaluatorConfig ev = {0};
        bool keep = false;
        if (parse_one_evaluator(c, n->items[i], i, &ev, &keep) != SPES_OK) {
            evaluator_free(&ev);
            return SPES_ERR;
        }
        // metrics.jsonl and the console tell evaluators apart by label only
        for (int j = 0; keep && j < cfg->n_evaluators; j++)
            if (strcmp(cfg->evaluators[j].label, ev.label) == 0) {
                char where[64];
                snprintf(where, sizeof where, "%s[%d]", key, i);
                evaluator_free(&ev);
                return key_fail(n->items[i], where, "label '%.100s' is taken by an earlier evaluator: their results "
                                "would be indistinguishable in metrics.jsonl", cfg->evaluators[j].label);
            }
        if (keep) cfg->evaluators[cfg->n_evaluators++] = ev;
    }
    return SPES_OK;
}

static void print_string(FILE *out, const char *s);
static void format_evaluators(const TrainConfig *cfg, FILE *out) {
    fputc('[', out);   // flow style: [{label: "val", type: lm, data: {paths: ["a.npy"]}}]
    for (int i = 0; i < cfg->n_evaluators; i++) {
        const EvaluatorConfig *ev = &cfg->evaluators[i];
        fputs(i ? ", {label: " : "{label: ", out);
        print_string(out, ev->label);
        if (ev->requests) {
            fputs(", type: downstream, requests: ", out);
            print_string(out, ev->requests);
            fprintf(out, ", limit: %d}", ev->limit);
            continue;
        }
        fputs(", type: lm, data: {paths: [", out);
        for (int j = 0; j < ev->n_paths; j++) {
            if (j) fputs(", ", out);
            print_string(out, ev->paths[j]);
        }
        fputs("]}}", out);
    }
    fputc(']', out);
}

// ---- the table itself. Each section's keys are contiguous (the YAML dump relies on it).

static const ConfigKey KEYS[] = {
    {"run_name", K_STR, F(run_name), .nullable = true, .meaning = "Name of the run; used in `${run_name}` interpolation and logs."},
    {"seed", K_I64, F(seed), MIN_NONNEG, .hashed = true, .meaning = "Seed of weight initialisation, and of the data order when `data.seed` is unset."},
    {"threads", K_INT, F(threads), MIN_NONNEG, .per_rank = true, .meaning = "CPU threads (0: all cores). Our extension."},
    {"dry_run", K_IGNORED, .meaning = "OLMo debugging switch."},
    {"no_pre_train_checkpoint", K_IGNORED, .meaning = "We never write a step-0 checkpoint."},
    {"wandb", K_IGNORED, .meaning = "Weights & Biases is not built in; metrics go to `save_folder/metrics.jsonl`."},
    {"compile", K_IGNORED, .meaning = "torch.compile settings."},
    {"fused_loss", K_IGNORED, .meaning = "GPU fused cross-entropy kernel (flash-attn's); the gradient is the same. With it the reference logs CrossEntropyLoss with 1e-4 x the z-loss term folded in (the kernel's lse_square_scale); our `ce` is the cross-entropy alone."},
    {"precision", K_STR, F(precision), .meaning = "fp32, amp_bf16 or amp_fp16 (dynamic loss scaling). On the cpu backend everything runs fp32."},
    {"device", K_STR, F(device), .per_rank = true, .meaning = "auto (a GPU when one is visible and spes has CUDA), cpu, cuda or cuda:N. Our extension."},
    {"distributed_strategy", K_STR, F(distributed_strategy), .meaning = "Data parallelism over the ranks of a node (`spes train --nproc_per_node N`, mpirun): `ddp`, `fsdp` (see `fsdp.sharding_strategy`) or `single` (one rank only). Ignored with one rank. docs/distributed.md."},
    {"fsdp", K_SECTION, .meaning = "FSDP settings: how `distributed_strategy: fsdp` shards."},
    {"fsdp.sharding_strategy", K_STR, F(fsdp_sharding_strategy), .meaning = "NO_SHARD (= DDP), SHARD_OPTIM (ZeRO-1: optimizer state sharded; our extension), SHARD_GRAD_OP (ZeRO-2: + gradients, each layer's reduce-scattered right after its backward), FULL_SHARD (ZeRO-3: + parameters, each layer gathered right before it runs). docs/distributed.md."},
    {"fsdp.prefetch", K_BOOL, F(fsdp_prefetch), .meaning = "FULL_SHARD: all-gather the next layer while the current one computes (FSDP's forward_prefetch and backward_prefetch BACKWARD_PRE), into a second layer-sized parameter buffer; false: gather each layer when it runs. The same bits either way. Our extension."},
    {"fsdp.wrapping_strategy", K_IGNORED, .meaning = "Shards are contiguous ranges of the flat gradient buffer, not wrapped modules."},
    {"fsdp.precision", K_IGNORED, .meaning = "The `precision` key decides compute types; collectives run on the fp32 gradients."},
    {"fsdp.use_orig_params", K_IGNORED, .meaning = "Parameters are always addressed by their HF names."},
    {"fsdp.hybrid_sharding_num_model_replicas", K_IGNORED, .meaning = "Hybrid sharding across nodes: nodes sync through the SPES server instead."},
    {"ddp", K_SECTION, .meaning = "DDP settings."},
    {"ddp.bucket_cap_mb", K_F64, F(ddp_bucket_cap_mb), MIN_POSITIVE, .meaning = "Bucket size in MB of the gradient all-reduce of ddp and SHARD_OPTIM (torch DDP's bucket_cap_mb) and of the parameter all-gather of SHARD_OPTIM and SHARD_GRAD_OP (SHARD_GRAD_OP and FULL_SHARD reduce gradients per layer instead). Our extension."},
    {"ddp.overlap_grad_reduce", K_BOOL, F(ddp_overlap_grad_reduce), .meaning = "ddp and SHARD_OPTIM: start each gradient bucket's collective as soon as the last micro-batch's backward has finished its gradients, overlapping communication with the rest of the backward (Megatron-LM's overlap_grad_reduce; torch DDP always overlaps); false: reduce every bucket after the backward. SHARD_GRAD_OP and FULL_SHARD: each layer's reduce-scatter runs while the layer below computes its backward (a second layer-sized gradient buffer); false: each waited for at once. The results are the same bits either way. Our extension."},
    {"ddp.grad_sync_mode", K_IGNORED, .meaning = "Gradients are reduced once per optimizer step, during the last micro-batch's backward."},
    {"ddp.find_unused_params", K_IGNORED, .meaning = "Frozen tensors have no gradient and take part in no collective."},
    {"activation_checkpointing", K_STR, F(activation_checkpointing), .nullable = true, .meaning = "null: every layer keeps its activations; fine_grained: the experts' SwiGLU intermediates are recomputed in the backward; whole_layer: each layer's forward is recomputed before its backward. Same gradients, bit for bit."},
    {"speed_monitor", K_IGNORED, .meaning = "Tokens/s is always on the console line."},
    {"tokenizer", K_SECTION, .meaning = "Token files already hold ids (the tokenizer is chosen at `spes tokenize` time); this one serves downstream evaluators."},
    {"tokenizer.identifier", K_STR, F(tokenizer_identifier), .nullable = true, .meaning = "A tokenizer.json, or a folder holding one, for `type: downstream` evaluators with `requests` (OLMo: a HF hub name, which is not downloaded here: unused unless such an evaluator exists)."},
    {"tokenizer.truncate_direction", K_IGNORED, .meaning = "Instances are cut from token files, never truncated."},
    {"softmax_auxiliary_loss", K_BOOL, F(softmax_auxiliary_loss), .hashed = true, .meaning = "Add the LM z-loss `mean(logsumexp(logits)^2)`."},
    {"auxiliary_loss_multiplier", K_F32, F(auxiliary_loss_multiplier), MIN_NONNEG, .hashed = true, .meaning = "Weight of the LM z-loss. Applied as written; note that OLMo's trainer never reads this key (its z-loss weight is fixed at 1e-4), so a reference run trains with 1e-4 whatever the config says."},
    {"using_spes", K_BOOL, F(using_spes), .hashed = true, .meaning = "SPES: train shared tensors + own experts, sync through the parameter server."},
    {"using_dilico", K_BOOL, F(using_dilico), .hashed = true, .meaning = "FedAvg baseline: every tensor trainable on every peer, all averaged."},
    {"max_duration", K_SPECIAL, .hashed = false, .parse = parse_max_duration, .format = format_max_duration, .meaning = "Training length: steps, `<N>T` tokens or `<N>ep` epochs."},
    {"stop_at", K_I64, F(stop_at), MIN_POSITIVE, .nullable = true, .null_value = -1, .meaning = "Stop at this step even if max_duration is later (null: no)."},
    {"global_train_batch_size", K_INT, F(global_train_batch_size), MIN_POSITIVE, .hashed = true, .meaning = "Instances per optimizer step."},
    {"device_train_microbatch_size", K_INT, F(device_train_microbatch_size), MIN_POSITIVE, .meaning = "Instances per forward/backward; gradients accumulate over global/micro of them."},
    {"max_grad_norm", K_F64, F(max_grad_norm), MIN_NONNEG, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Global gradient-norm clipping threshold (null: no clipping)."},
    {"max_grad_norm_ratio", K_F64, F(max_grad_norm_ratio), MIN_POSITIVE, .nullable = true, .null_value = 0, .hashed = true, .unset = clip_ratio_unset, .meaning = "Adaptive clipping (OLMo's _do_adaptive_clipping): each trainable tensor's gradient is clipped to this ratio times the running average of its own clipped gradient norm (`grad_norm_exp_avg`, beta max(betas), started from the tensor's norm at step 2, kept in train_state.safetensors), instead of the global max_grad_norm, which is then ignored. The clipping warm-up multiplies it as it does max_grad_norm. null: off."},
    {"save_folder", K_STR, F(save_folder), .meaning = "Checkpoints (`stepN/`) and metrics.jsonl go here."},
    {"save_overwrite", K_BOOL, F(save_overwrite), .meaning = "Allow writing into a save_folder that already holds checkpoints of another run."},
    {"save_interval", K_I64, F(save_interval_sharded), MIN_NONNEG, .nullable = true, .null_value = 0, .meaning = "OLMo's sharded (FSDP) checkpoint interval. Checkpoints here are of one kind (`stepN/`, resumable and HF-loadable): when save_interval_unsharded is null they are saved every save_interval steps instead, keeping save_num_checkpoints_to_keep (a config line says so); when both are set, every save_interval_unsharded steps, with a warning if save_interval is the shorter."},
    {"save_interval_ephemeral", K_IGNORED, .meaning = "Sharded (FSDP) checkpoints are not written."},
    {"save_num_checkpoints_to_keep", K_INT, F(save_num_sharded_checkpoints_to_keep), .meaning = "Newest checkpoints kept when save_interval sets the interval (see save_interval; -1: all)."},
    {"sharded_checkpointer", K_IGNORED, .meaning = "Sharded (FSDP) checkpoints are not written."},
    {"save_interval_unsharded", K_I64, F(save_interval_unsharded), MIN_NONNEG, .nullable = true, .null_value = 0, .meaning = "Save `save_folder/stepN/` every N steps (null: only at the end)."},
    {"save_num_unsharded_checkpoints_to_keep", K_INT, F(save_num_unsharded_checkpoints_to_keep), .meaning = "Newest checkpoints kept (-1: all)."},
    {"load_path", K_STR, F(load_path), .nullable = true, .meaning = "Initial weights only: a checkpoint step directory or an HF OLMoE directory."},
    {"try_load_latest_save", K_BOOL, F(try_load_latest_save), .meaning = "Resume from the newest complete checkpoint in save_folder, if any."},
    {"console_log_interval", K_I64, F(console_log_interval), MIN_POSITIVE, .meaning = "Console line every N steps."},
    {"eval_interval", K_I64, F(eval_interval), MIN_POSITIVE, .meaning = "Run the evaluators every N steps (and at the end): validation loss (lm), accuracies (downstream with requests)."},
    {"eval_subset_num_batches", K_IGNORED, .meaning = "Validation always covers the whole evaluator dataset."},
    {"device_eval_batch_size", K_INT, F(device_eval_batch_size), MIN_POSITIVE, .meaning = "Instances per validation forward."},
    {"evaluators", K_SPECIAL, .parse = parse_evaluators, .format = format_evaluators, .meaning = "`type: lm` entries (label + data.paths): validation loss. `type: downstream` entries with `requests:` (our extension: an oe-eval request file or folder, as `spes eval --task` reads; optional `limit:` documents) report the multiple-choice accuracies every eval_interval, tokenised with `tokenizer.identifier`; downstream entries without it (OLMo's built-in tasks) are skipped with a warning (run `spes eval`)."},

    {"model", K_SECTION, .meaning = "Model architecture (OLMoE)."},
    {"model.d_model", K_INT, F(model.d_model), MIN_POSITIVE, .hashed = true, .meaning = "Hidden size H."},
    {"model.n_heads", K_INT, F(model.n_heads), MIN_POSITIVE, .hashed = true, .meaning = "Attention heads."},
    {"model.n_kv_heads", K_INT, F(model.n_kv_heads), MIN_POSITIVE, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Key/value heads (GQA); null: n_heads."},
    {"model.head_dim", K_INT, F(model.head_dim), MIN_POSITIVE, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Per-head size; null: d_model / n_heads. Our extension."},
    {"model.n_layers", K_INT, F(model.n_layers), MIN_POSITIVE, .hashed = true, .meaning = "Transformer blocks L."},
    {"model.mlp_hidden_size", K_SPECIAL, .hashed = true, .parse = parse_mlp_hidden_size, .format = format_mlp_hidden_size, .meaning = "SwiGLU input width; each expert's hidden size is half of it."},
    {"model.mlp_ratio", K_SPECIAL, .parse = parse_mlp_ratio, .meaning = "When mlp_hidden_size is null: mlp_hidden_size = mlp_ratio * d_model."},
    {"model.vocab_size", K_INT, F(model.vocab_size), MIN_POSITIVE, .hashed = true, .meaning = "Token ids the data may contain (ids >= vocab_size are an error)."},
    {"model.embedding_size", K_INT, F(model.embedding_size), MIN_POSITIVE, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Rows of embed_tokens / lm_head (>= vocab_size); null: vocab_size."},
    {"model.max_sequence_length", K_INT, F(model.max_seq_len), MIN_POSITIVE, .hashed = true, .meaning = "Tokens per training instance T."},
    {"model.rope_theta", K_F32, F(model.rope_theta), MIN_POSITIVE, .hashed = true, .meaning = "RoPE base."},
    {"model.layer_norm_eps", K_F32, F(model.norm_eps), MIN_POSITIVE, .hashed = true, .meaning = "RMSNorm epsilon."},
    {"model.attention_layer_norm", K_SPECIAL, .hashed = true, .parse = parse_attention_layer_norm, .format = format_attention_layer_norm, .meaning = "QK-norm on queries and keys."},
    {"model.attention_layer_norm_over_head", K_SPECIAL, .hashed = true, .parse = parse_attention_layer_norm_over_head, .format = format_attention_layer_norm_over_head, .meaning = "QK-norm per head (Qwen3 style) instead of over the whole projection (OLMoE)."},
    {"model.moe_num_experts", K_INT, F(model.num_experts), MIN_POSITIVE, .hashed = true, .meaning = "Experts per layer E."},
    {"model.moe_top_k", K_INT, F(model.top_k), MIN_POSITIVE, .hashed = true, .meaning = "Experts per token k."},
    {"model.moe_normalize_expert_weights", K_SPECIAL, .hashed = true, .parse = parse_normalize_expert_weights, .format = format_normalize_expert_weights, .meaning = "Renormalise the top-k router probabilities to sum to 1 (true/1; null: no)."},
    {"model.moe_loss_weight", K_F32, F(moe_loss_weight), MIN_NONNEG, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Load-balancing loss weight."},
    {"model.moe_zloss_weight", K_F32, F(moe_zloss_weight), MIN_NONNEG, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Router z-loss weight (null: 0)."},
    {"model.init_std", K_F32, F(model.init_std), MIN_POSITIVE, .hashed = true, .meaning = "Std of the normal weight init."},
    {"model.init_cutoff_factor", K_F32, F(model.init_cutoff_factor), MIN_POSITIVE, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Truncate the init at +-factor*std (null: no truncation)."},
    {"model.eos_token_id", K_INT, F(model.eos_token_id), MIN_NONNEG, .hashed = true, .meaning = "End-of-document token id."},
    {"model.pad_token_id", K_INT, F(model.pad_token_id), MIN_NONNEG, .hashed = true, .meaning = "Padding token id."},
    {"model.block_type", K_FIXED, .fixed = "moe", .meaning = "Only MoE blocks are implemented."},
    {"model.activation_type", K_FIXED, .fixed = "swiglu", .meaning = "Experts are SwiGLU."},
    {"model.layer_norm_type", K_FIXED, .fixed = "rms", .meaning = "RMSNorm."},
    {"model.layer_norm_with_affine", K_FIXED, .fixed = "true", .meaning = "Norms have a gain."},
    {"model.attention_layer_norm_with_affine", K_FIXED, .fixed = "true", .meaning = "QK-norms have a gain."},
    {"model.bias_for_layer_norm", K_FIXED, .fixed = "false", .meaning = "No norm biases."},
    {"model.include_bias", K_FIXED, .fixed = "false", .meaning = "No linear biases."},
    {"model.weight_tying", K_FIXED, .fixed = "false", .meaning = "Untied lm_head (OLMoE)."},
    {"model.rope", K_FIXED, .fixed = "true", .meaning = "Rotary embeddings."},
    {"model.alibi", K_FIXED, .fixed = "false", .meaning = "No ALiBi."},
    {"model.init_fn", K_FIXED, .fixed = "normal", .meaning = "Truncated-normal init with init_std."},
    {"model.moe_dropless", K_FIXED, .fixed = "true", .meaning = "Dropless MoE: every routed token is computed."},
    {"model.attention_dropout", K_FIXED, .fixed = "0", .meaning = "No dropout."},
    {"model.residual_dropout", K_FIXED, .fixed = "0", .meaning = "No dropout."},
    {"model.embedding_dropout", K_FIXED, .fixed = "0", .meaning = "No dropout."},
    {"model.clip_qkv", K_FIXED, .fixed = "null", .meaning = "QKV clipping is not implemented."},
    {"model.moe_shared_expert", K_FIXED, .fixed = "false", .meaning = "No shared expert."},
    {"model.flash_attention", K_IGNORED, .meaning = "Attention kernel choice (GPU); same maths."},
    {"model.init_device", K_IGNORED, .meaning = "GPU placement of the init."},
    {"model.using_custom_moe_impl", K_IGNORED, .meaning = "MegaBlocks switch; the MoE here is always dropless."},
    {"model.moe_mlp_impl", K_IGNORED, .meaning = "MegaBlocks kernel choice (sparse/grouped); same maths."},
    {"model.moe_log_expert_assignment", K_IGNORED, .meaning = "Per-expert token counts are always logged."},
    {"model.moe_lbl_in_fp32", K_IGNORED, .meaning = "Losses are always fp32."},
    {"model.moe_capacity_factor", K_IGNORED, .meaning = "Dropless: no capacity limit."},

    {"optimizer", K_SECTION, .meaning = "AdamW."},
    {"optimizer.name", K_FIXED, .fixed = "adamw", .meaning = "Only AdamW is implemented (OLMo's default is lionw)."},
    {"optimizer.learning_rate", K_F64, F(learning_rate), MIN_NONNEG, .hashed = true, .meaning = "Peak learning rate."},
    {"optimizer.betas", K_SPECIAL, .hashed = true, .parse = parse_betas, .format = format_betas, .meaning = "[beta1, beta2]."},
    {"optimizer.eps", K_F64, F(adamw.eps), MIN_POSITIVE, .hashed = true, .fp32 = true, .meaning = "AdamW epsilon."},
    {"optimizer.weight_decay", K_F64, F(adamw.weight_decay), MIN_NONNEG, .hashed = true, .meaning = "Decoupled weight decay."},
    {"optimizer.decay_norm_and_bias", K_BOOL, F(adamw.decay_norm_and_bias), .hashed = true, .meaning = "Norm gains decay too."},
    {"optimizer.decay_embeddings", K_BOOL, F(adamw.decay_embeddings), .hashed = true, .meaning = "The input embedding decays too."},
    {"optimizer.cpu_offload", K_BOOL, F(adamw.cpu_offload), .meaning = "Optimizer-state offload (DeepSpeed's ZeRO-Offload of the optimizer): the AdamW moments live in page-locked host memory and the update runs on the CPU; each step the gradients and fp32 parameters of this rank's range go down and the parameters come back. Frees 8 bytes per trainable value of GPU memory. On the cpu backend the moments are host memory already: accepted, the same bits, copies only. Our extension."},
    {"optimizer.overlap_next_forward", K_BOOL, F(optimizer_overlap), .meaning = "Run each step's AdamW update on a second queue of the device, layer by layer, under the next step's forward: the forward waits for each layer's update just before it reads that layer, and each layer's gradients are zeroed behind its update (src/train/overlap_step.h). The same bits either way; on a GPU the update's memory-bound pass (~10 of the 1B peer's ~82 ms a step on an H200) goes under the forward's GEMMs. One process per node (ignored, with a warning, with data parallelism or sharding, which hook the same events) and the optimizer on the device (ignored with cpu_offload). Off by default until a GPU run measures it (bench-gpu's --overlap-adamw). Our extension."},
    {"optimizer.metrics_log_interval", K_IGNORED, .meaning = "Per-parameter optimizer metrics are not logged."},

    {"scheduler", K_SECTION, .meaning = "Learning-rate schedule."},
    {"scheduler.name", K_SPECIAL, .hashed = true, .parse = parse_scheduler_name, .format = format_scheduler_name, .meaning = "OLMo's schedulers: cosine_with_warmup, linear_with_warmup, inverse_sqrt_with_warmup (`lr * sqrt(t_warmup / step)` after the warm-up), max_scheduler (the larger of cosine_with_warmup and inverse_sqrt_with_warmup, both from these keys), constant (no warm-up), cosine_linear_envelope (the cosine decay times `1 - progress`) or constant_with_warmup."},
    {"scheduler.units", K_SPECIAL, .hashed = true, .unset = scheduler_units_unset, .parse = parse_scheduler_units, .format = format_scheduler_units, .meaning = "What the schedule counts (OLMo's SchedulerUnits): `steps`, optimizer steps from 1 over the run's max steps; or `tokens`, the tokens seen including the step's batch (global batch x sequence length a step) over the run's max tokens (max_duration in tokens; for one in steps, the tokens seen plus the steps left x tokens a step; for epochs, their steps x tokens a step). t_warmup, t_max and grad_clip_warmup_steps are then in tokens too, as OLMo reads them."},
    {"scheduler.t_warmup", K_I64, F(schedule.t_warmup), MIN_NONNEG, .hashed = true, .meaning = "Warm-up length in scheduler.units (steps, or tokens): the rate rises linearly from warmup_min_lr to learning_rate (every scheduler but constant)."},
    {"scheduler.t_max", K_I64, F(schedule.t_max), MIN_POSITIVE, .nullable = true, .null_value = 0, .hashed = true, .meaning = "Where the decay ends, in scheduler.units (null: the run's max steps, or max tokens); read by cosine_with_warmup, linear_with_warmup, max_scheduler and cosine_linear_envelope."},
    {"scheduler.alpha_f", K_F64, F(schedule.alpha_f), MIN_NONNEG, .hashed = true, .meaning = "Final lr = alpha_f * learning_rate; read by the schedulers that read t_max."},
    {"scheduler.warmup_min_lr", K_F64, F(schedule.warmup_min_lr), MIN_NONNEG, .nullable = true, .null_value = -1, .hashed = true, .meaning = "lr at step 0 of the warm-up (null: 0.1 * learning_rate, OLMo)."},
    {"scheduler.grad_clip_warmup_steps", K_I64, F(schedule.grad_clip_warmup_steps), MIN_NONNEG, .nullable = true, .null_value = -1, .hashed = true, .unset = clip_warmup_unset, .meaning = "Clipping warm-up, with grad_clip_warmup_factor (OLMo's get_max_grad_norm): up to this step the clipping threshold is max_grad_norm * grad_clip_warmup_factor. As OLMo's trainer sets it after clipping, step 1 clips at max_grad_norm and steps 2 to this one + 1 at the product. With scheduler.units tokens it counts tokens seen, as OLMo compares it with scheduler_current: a step after one that ended at or below this many tokens clips at the product. null (or factor null): off."},
    {"scheduler.grad_clip_warmup_factor", K_F64, F(schedule.grad_clip_warmup_factor), MIN_POSITIVE, .nullable = true, .null_value = -1, .hashed = true, .unset = clip_warmup_unset, .meaning = "The clipping warm-up's multiplier of max_grad_norm, or of max_grad_norm_ratio when that is set (see grad_clip_warmup_steps). null: off."},

    {"data", K_SECTION, .meaning = "Training token files."},
    {"data.paths", K_STRLIST, F(data.paths), .hashed = true, .meaning = "Token files; an entry ending in `.txt` is a manifest (one path a line). Relative paths resolve against the current directory."},
    {"data.memmap_dtype", K_SPECIAL, .hashed = true, .parse = parse_memmap_dtype, .format = format_memmap_dtype, .meaning = "uint16 or uint32: element type of headerless token files (.npy headers win)."},
    {"data.seed", K_SPECIAL, .hashed = true, .parse = parse_data_seed, .format = format_data_seed, .meaning = "Shuffle seed (epoch e uses seed + e); null: the top-level seed."},
    {"data.drop_last", K_BOOL, F(data.drop_last), .hashed = true, .meaning = "Skip an epoch's last incomplete global batch."},
    {"data.pad_direction", K_IGNORED, .meaning = "Instances are full length: nothing to pad."},
    {"data.num_workers", K_IGNORED, .meaning = "The loader reads memory-mapped files inline."},
    {"data.pin_memory", K_IGNORED, .meaning = "The loader reads memory-mapped files inline."},
    {"data.prefetch_factor", K_IGNORED, .meaning = "The loader reads memory-mapped files inline."},
    {"data.persistent_workers", K_IGNORED, .meaning = "The loader reads memory-mapped files inline."},
    {"data.timeout", K_IGNORED, .meaning = "The loader reads memory-mapped files inline."},
    {"data.instance_filter", K_SPECIAL, .hashed = true, .unset = instance_filter_unset, .parse = parse_instance_filter, .format = format_instance_filter, .meaning = "OLMo's repetition filter: a mapping `{repetition_max_period: 13, repetition_min_period: 1, repetition_max_count: 32}` (fields left out take these defaults) masks the loss of every training instance in which a pattern of 1..max_period tokens repeats max_count times or more in a row (OLMo's find_periodic_sequences); the instance still runs through the model. `train/masked_instances` counts them per step. null: every instance trains. Evaluators are never filtered."},

    {"spes_config", K_SECTION, .meaning = "SPES topology."},
    {"spes_config.num_peers", K_INT, F(num_peers), MIN_POSITIVE, .hashed = true, .meaning = "Training nodes."},
    {"spes_config.peer_id", K_INT, F(peer_id), MIN_NONNEG, .hashed = true, .meaning = "This node (0-based); owns experts [peer_id*m, (peer_id+1)*m), or with replicas those of group peer_id mod E/m."},
    {"spes_config.num_train_experts_per_node", K_INT, F(num_train_experts_per_node), MIN_POSITIVE, .nullable = true, .null_value = 0, .hashed = true, .meaning = "m; with using_spes num_peers*m is moe_num_experts, or a multiple of it: every expert then has num_peers*m/E owners (replicas) (null: E / num_peers)."},
    {"spes_config.sync_steps", K_I64, F(sync_steps), MIN_POSITIVE, .hashed = true, .meaning = "Steps between synchronisations."},
    {"spes_config.server_addr", K_STR, F(server_addr), .meaning = "Parameter server host:port."},
    {"spes_config.using_decayed_aux_loss", K_BOOL, F(using_decayed_aux_loss), .hashed = true, .meaning = "Decayed load-balancing counts for own experts (DESIGN.md)."},
    {"spes_config.decayed_factor_update_steps", K_I64, F(decayed_factor_update_steps), MIN_POSITIVE, .hashed = true, .meaning = "Recompute the decay factor every N steps (after step N, 2N, ...). Deviation: the reference's default is 500, and its factor is 1.0 (not c(0) = 0.7) until its first update; ours starts at c(start step) and updates every step by default, the ramp DESIGN.md describes."},
    {"spes_config.auth_token_file", K_STR, F(auth_token_file), .nullable = true, .meaning = "File holding the parameter server's token (sent as `authorization: Bearer ...`). Our extension."},
    {"spes_config.tls_ca", K_STR, F(tls_ca), .nullable = true, .meaning = "PEM CA file: connect to the parameter server with TLS, trusting it. Our extension."},
    {"spes_config.tls_cert", K_STR, F(tls_cert), .nullable = true, .meaning = "PEM client certificate for a server that requires one (with tls_key). Our extension."},
    {"spes_config.tls_key", K_STR, F(tls_key), .nullable = true, .meaning = "PEM key of tls_cert. Our extension."},
    {"spes_config.take_over_peer_id", K_INT, F(take_over_peer_id), MIN_NONNEG, .nullable = true, .null_value = -1, .meaning = "Ownership failover: act as lost peer N (its peer_id and experts), starting from the server's newest aggregate. Our extension."},
    {"spes_config.retry_timeout_s", K_F64, F(retry_timeout_s), MIN_POSITIVE, .meaning = "How long every sync call retries an unreachable or restarting parameter server (exponential backoff with jitter). Our extension."},
    {"spes_config.sync_overlap", K_BOOL, F(sync_overlap), .meaning = "Train on while a sync round is in flight; its aggregate is applied at the first step end after it arrived (at the latest the next sync step) as aggregate + (current - uploaded) weights (docs/communication.md). Not part of the config hash. Our extension."},
    // Not hashed: the outer step runs on the server, not in this peer's training; a checkpoint
    // resumes under other values, and the server refuses values that differ from its own at Hello.
    {"spes_config.outer_lr", K_F32, F(outer_lr), MIN_POSITIVE, .meaning = "The server's outer optimizer (DiLoCo Nesterov on the shared tensors) this peer expects: its step size, as `spes server --outer_lr` (1 with outer_momentum 0: the plain mean). Stated in the handshake; a server running other values refuses the peer, naming both (docs/sync.md). Not part of the config hash. Our extension."},
    {"spes_config.outer_momentum", K_F32, F(outer_momentum), MIN_NONNEG, .meaning = "Its Nesterov momentum in [0, 1), as `spes server --outer_momentum`; checked at the handshake like outer_lr. Not part of the config hash. Our extension."},
    {"spes_config.sync_warmup_steps", K_I64, F(sync_warmup_steps), MIN_NONNEG, .hashed = true, .unset = sync_warmup_unset, .meaning = "Synchronous warm-up: up to this step the peers sync every `sync_warmup_every` steps; over the next sync_steps steps the interval doubles (a few ramp rounds, so the server's look-ahead window follows) and from then on it is sync_steps. A multiple of sync_steps and of sync_warmup_every; 0: off (the reference). Costs one round per sync_warmup_every steps of the warm-up (docs/quality.md). Our extension."},
    {"spes_config.sync_warmup_every", K_I64, F(sync_warmup_every), MIN_POSITIVE, .hashed = true, .unset = sync_warmup_unset, .meaning = "The warm-up's sync interval in steps (default 1: every step); at most sync_steps. Our extension."},
    {"spes_config.lr_scale", K_F64, F(lr_scale), MIN_POSITIVE, .hashed = true, .unset = lr_scale_unset, .meaning = "A peer's learning rate is lr_scale times the schedule's (only with using_spes or using_dilico; a centralised run of the same config keeps the schedule's). Averaging P peers' AdamW steps, each on 1/P of the batch, moves the weights about as far as one step at a smaller rate (docs/quality.md); 1: off (the reference). Our extension."},
    {"spes_config.beta1", K_F64, F(peer_beta1), .nullable = true, .null_value = -1, .hashed = true, .unset = peer_beta1_unset, .meaning = "A peer's AdamW beta1 (only with using_spes or using_dilico; a centralised run of the same config keeps optimizer.betas'). A peer's gradient comes from 1/P of the batch and its momentum is averaged away at every round: a shorter memory (0.8) measured better at the demo's settings (docs/quality.md). null: optimizer.betas' (the reference). Our extension."},
    {"spes_config.reset_moments_at_sync", K_BOOL, F(reset_moments_at_sync), .hashed = true, .unset = reset_moments_unset, .meaning = "Zero a peer's AdamW moments (and its bias-correction count) after every sync round, so it starts each round from the aggregate with no memory of its own earlier gradients; false: each peer keeps its own moments across rounds (the reference). Measured in docs/quality.md. Our extension."},
    {"spes_config.payload_dtype", K_SPECIAL, .hashed = true, .parse = parse_payload_dtype, .format = format_payload_dtype, .meaning = "f32, bf16, int8 or int4 (deltas against the last aggregate with error feedback, docs/communication.md) sync payloads. Our extension."},
};
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static const ConfigKey *find_key(const char *path) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].path, path) == 0) return &KEYS[i];
    return NULL;
}

bool config_key_known(const char *path) {
    const ConfigKey *k = find_key(path);
    if (k) return true;
    // inside an ignored or free-form key ("fsdp.precision", "evaluators.0")?
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *dot = strrchr(buf, '.'); dot; dot = strrchr(buf, '.')) {
        *dot = '\0';
        k = find_key(buf);
        if (k) return k->kind == K_IGNORED || k->kind == K_SPECIAL;
    }
    return false;
}

// ---------------------------------------------------------------------------------------
// Reading the tree

static bool fixed_matches(const ConfigKey *k, const YNode *n) {
    if (ytree_is_null(n)) return true;   // null means "OLMo default", which is what we do
    if (n->kind != YNODE_SCALAR) return false;
    bool want, got;
    if (bool_word(k->fixed, &want) == SPES_OK) return bool_word(n->value, &got) == SPES_OK && got == want;
    char *end;
    double fixed_num = strtod(k->fixed, &end);
    if (*end == '\0') {
        double v = strtod(n->value, &end);
        return n->value[0] != '\0' && *end == '\0' && v == fixed_num;
    }
    return strcmp(n->value, k->fixed) == 0;
}

static int check_min(const ConfigKey *k, const YNode *n, const char *path, double v) {
    if (k->min == MIN_POSITIVE && !(v > 0)) return key_fail(n, path, "must be > 0, got %s", n->value);
    if (k->min == MIN_NONNEG && !(v >= 0)) return key_fail(n, path, "must be >= 0, got %s", n->value);
    return SPES_OK;
}

static int apply_key(ParseCtx *c, const ConfigKey *k, const YNode *n, const char *path, TrainConfig *cfg) {
    char *field = (char *)cfg + k->offset;
    if (k->kind == K_SPECIAL) return k->parse(c, n, path, cfg);
    if (k->kind == K_FIXED) {
        if (!fixed_matches(k, n))
            return key_fail(n, path, "only %s is supported here (%s), got %s", k->fixed, k->meaning,
                            n->kind == YNODE_SCALAR ? n->value : kind_word(n));
        return SPES_OK;
    }
    if (ytree_is_null(n) && k->kind != K_BOOL) {
        if (!k->nullable) return key_fail(n, path, "must not be null");
        switch (k->kind) {
        case K_INT: *(int *)field = (int)k->null_value; break;
        case K_I64: *(int64_t *)field = (int64_t)k->null_value; break;
        case K_F32: *(float *)field = (float)k->null_value; break;
        case K_F64: *(double *)field = k->null_value; break;
        case K_STR: free(*(char **)field), *(char **)field = NULL; break;
        default: return key_fail(n, path, "must not be null");
        }
        return SPES_OK;
    }
    switch (k->kind) {
    case K_INT:
    case K_I64: {
        int64_t v = 0;
        SPES_TRY(parse_i64(n, path, &v));
        SPES_TRY(check_min(k, n, path, (double)v));
        if (k->kind == K_INT) {
            if (v < INT_MIN || v > INT_MAX) return key_fail(n, path, "%s does not fit in 32 bits", n->value);
            *(int *)field = (int)v;
        } else {
            *(int64_t *)field = v;
        }
        return SPES_OK;
    }
    case K_F32:
    case K_F64: {
        double v = 0;
        SPES_TRY(parse_f64(n, path, &v));
        SPES_TRY(check_min(k, n, path, v));
        if (k->kind == K_F32 || k->fp32) {
            if (fabs(v) > 3.0e38) return key_fail(n, path, "%s is out of float range", n->value);
            // 1e-50 passes "must be > 0" and is 0 once a float: an eps of 0 divides by zero
            if (v != 0 && (float)v == 0)
                return key_fail(n, path, "%s is too small for the 32-bit float it is computed in (it would be 0; "
                                "the smallest is 1.4e-45)", n->value);
        }
        if (k->kind == K_F32) {
            *(float *)field = (float)v;
        } else {
            *(double *)field = v;
        }
        return SPES_OK;
    }
    case K_BOOL: return parse_bool(n, path, (bool *)field);
    case K_STR: {
        const char *s = NULL;
        SPES_TRY(scalar_of(n, path, "a string", &s));
        char *copy = spes_strdup(s);
        if (!copy) return SPES_ERR;
        free(*(char **)field);
        *(char **)field = copy;
        return SPES_OK;
    }
    case K_STRLIST: {
        char ***list = (char ***)field;
        int *count = (int *)(field + sizeof(char **));
        if (ytree_is_null(n)) {
            free_strings(*list, *count);
            *list = NULL;
            *count = 0;
            return SPES_OK;
        }
        return parse_strlist(n, path, list, count);
    }
    default: return key_fail(n, path, "internal error: key kind %d", (int)k->kind);
    }
}

static int walk_map(ParseCtx *c, const YNode *map, const char *prefix, TrainConfig *cfg) {
    for (int i = 0; i < map->n; i++) {
        const YNode *n = map->items[i];
        char *path = prefix ? str_printf("%s.%s", prefix, map->keys[i]) : spes_strdup(map->keys[i]);
        if (!path) return SPES_ERR;
        const ConfigKey *k = find_key(path);
        int rc = SPES_OK;
        if (!k) {
            rc = strlist_push(&c->unknown, str_printf("%s (%s:%d)", path, n->origin, n->line));
        } else if (k->kind == K_IGNORED) {
            rc = strlist_push(&c->ignored, spes_strdup(path));
        } else if (k->kind == K_SECTION) {
            if (n->kind == YNODE_MAP) rc = walk_map(c, n, path, cfg);
            else if (!ytree_is_null(n)) rc = key_fail(n, path, "expected a mapping, got %s", kind_word(n));
        } else {
            rc = apply_key(c, k, n, path, cfg);
        }
        free(path);
        SPES_TRY(rc);
    }
    return SPES_OK;
}

int config_apply_tree(ParseCtx *ctx, const YNode *root, TrainConfig *cfg) {
    if (root->kind != YNODE_MAP) return key_fail(root, "(top level)", "a config must be a mapping of keys");
    return walk_map(ctx, root, NULL, cfg);
}

// Error location of a key for cross-field checks: its node when the file set it.
static const YNode *node_of(const YNode *root, const char *path) { return root ? ytree_get_path(root, path) : NULL; }

int config_finish(ParseCtx *ctx, const YNode *root, TrainConfig *cfg) {
    ModelConfig *m = &cfg->model;
    if (ctx->mlp_hidden_size > 0) {
        m->expert_hidden = ctx->mlp_hidden_size / 2;
    } else {
        double hidden = ctx->mlp_ratio * m->d_model;
        if (hidden > INT_MAX || hidden != floor(hidden) || (int64_t)hidden % 2 != 0)   // range first: the cast
            return key_fail(node_of(root, "model.mlp_ratio"), "model.mlp_ratio",
                            "mlp_ratio * d_model = %g must be an even whole number", hidden);
        m->expert_hidden = (int)(hidden / 2);
    }
    m->qk_norm = !ctx->attention_layer_norm ? QK_NORM_NONE
                 : ctx->attention_layer_norm_over_head ? QK_NORM_HEAD
                                                       : QK_NORM_FULL;
    if (ctx->attention_layer_norm_over_head && !ctx->attention_layer_norm)
        return key_fail(node_of(root, "model.attention_layer_norm_over_head"), "model.attention_layer_norm_over_head",
                        "needs model.attention_layer_norm: true");
    if (!ctx->data_seed_set) cfg->data.seed = cfg->seed;
    return SPES_OK;
}

// ---------------------------------------------------------------------------------------
// Printing values (resolved YAML, hash input, docs defaults)

// Shortest text that reads back as the same double.
static void print_number(FILE *out, double v) {
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    // YAML 1.1 readers (PyYAML) want a dot in floats: 1e-05 -> 1.0e-05
    if (!strpbrk(buf, ".ni")) {
        char *e = strchr(buf, 'e');
        if (e) {
            char tail[32];
            snprintf(tail, sizeof tail, "%s", e);
            snprintf(e, sizeof buf - (size_t)(e - buf), ".0%s", tail);
        }
    }
    fputs(buf, out);
}

static void print_float(FILE *out, float v) {
    char buf[64];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    print_number(out, strtod(buf, NULL));
}

static void print_string(FILE *out, const char *s) {
    if (!s) {
        fputs("null", out);
        return;
    }
    fputc('"', out);
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', out);
        fputc(*p, out);
    }
    fputc('"', out);
}

// The value text of one key; false when the key has nothing to print.
static bool print_value(const ConfigKey *k, const TrainConfig *cfg, FILE *out) {
    const char *field = (const char *)cfg + k->offset;
    switch (k->kind) {
    case K_INT: {
        int v = *(const int *)field;
        if (k->nullable && v == (int)k->null_value) fputs("null", out);
        else fprintf(out, "%d", v);
        return true;
    }
    case K_I64: {
        int64_t v = *(const int64_t *)field;
        if (k->nullable && v == (int64_t)k->null_value) fputs("null", out);
        else fprintf(out, "%" PRId64, v);
        return true;
    }
    case K_F32: {
        float v = *(const float *)field;
        if (k->nullable && v == (float)k->null_value) fputs("null", out);
        else print_float(out, v);
        return true;
    }
    case K_F64: {
        double v = *(const double *)field;
        if (k->nullable && v == k->null_value) fputs("null", out);
        else print_number(out, v);
        return true;
    }
    case K_BOOL: fputs(*(const bool *)field ? "true" : "false", out); return true;
    case K_STR: print_string(out, *(char *const *)field); return true;
    case K_STRLIST: {
        char *const *list = *(char **const *)field;
        int count = *(const int *)(field + sizeof(char **));
        fputc('[', out);
        for (int i = 0; i < count; i++) {
            if (i) fputs(", ", out);
            print_string(out, list[i]);
        }
        fputc(']', out);
        return true;
    }
    case K_FIXED: fputs(k->fixed, out); return true;
    case K_SPECIAL:
        if (!k->format) return false;
        k->format(cfg, out);
        return true;
    default: return false;
    }
}

void config_write_values(const TrainConfig *cfg, FILE *out, ConfigOutput which) {
    const char *section = NULL;   // open section ("model"), NULL at top level
    for (int i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &KEYS[i];
        if (k->kind == K_SECTION || k->kind == K_IGNORED) continue;
        if (which != CONFIG_DUMP_YAML) {
            if (which == CONFIG_LINES_HASHED && (!k->hashed || (k->unset && k->unset(cfg)))) continue;
            if (which == CONFIG_LINES_JOB && (k->per_rank || k->kind == K_FIXED || (k->kind == K_SPECIAL && !k->format)))
                continue;
            fprintf(out, "%s=", k->path);
            print_value(k, cfg, out);
            fputc('\n', out);
            continue;
        }
        if (k->kind == K_SPECIAL && !k->format) continue;
        const char *dot = strchr(k->path, '.');
        if (dot) {
            size_t len = (size_t)(dot - k->path);
            if (!section || strncmp(section, k->path, len) != 0 || section[len] != '.') {
                fprintf(out, "%.*s:\n", (int)len, k->path);
            }
            section = k->path;
            fprintf(out, "  %s:", dot + 1);
        } else {
            section = NULL;
            fprintf(out, "%s:", k->path);
        }
        if (k->kind == K_STRLIST) {   // block style: a real config lists hundreds of files
            const char *field = (const char *)cfg + k->offset;
            char *const *list = *(char **const *)field;
            int count = *(const int *)(field + sizeof(char **));
            if (count > 0) {
                for (int j = 0; j < count; j++) {
                    fputs(dot ? "\n    - " : "\n  - ", out);
                    print_string(out, list[j]);
                }
                fputc('\n', out);
                continue;
            }
        }
        fputc(' ', out);
        print_value(k, cfg, out);
        fputc('\n', out);
    }
}

// ---------------------------------------------------------------------------------------
// docs/config-keys.md

static void print_cell(FILE *out, const char *s) {
    for (const char *p = s; *p; p++) {
        if (*p == '|') fputs("\\|", out);
        else if (*p == '\n') fputc(' ', out);
        else fputc(*p, out);
    }
}

void config_write_keys_markdown(FILE *out) {
    TrainConfig defaults;
    config_defaults(&defaults);
    fputs("# Config keys\n\n"
          "Generated from the key table in `src/config/config_keys.c` (`build/tests/test_config_keys "
          "--write-docs docs/config-keys.md`); a unit test fails when this file and the table disagree.\n\n"
          "- **supported**: read and used.\n"
          "- **fixed**: only the value shown is implemented; `null` or that value is accepted, anything "
          "else is an error naming the file and line.\n"
          "- **ignored**: recognised and skipped (GPU/cluster-only), listed once at start-up. A whole "
          "ignored section (e.g. `compile`) is skipped with everything under it.\n"
          "- Keys that are in no row get ONE warning listing them all (typos show up there).\n\n"
          "Defaults are OLMo's, except: `optimizer.name` defaults to adamw (OLMo: lionw), "
          "`model.embedding_size` defaults to vocab_size (OLMo: 50304), `model.block_type` is moe.\n\n"
          "## Loading rules\n\n"
          "- Overrides: `--a.b=value` or `--a.b value` after the config path; the value is YAML "
          "(`3`, `1e-4`, `[0.9, 0.95]`, `null`); a mapping (`--data.instance_filter={repetition_max_count: 8}`) "
          "merges into the file's mapping, as OmegaConf merges. An override of an unknown key is an error.\n"
          "- `${a.b}` interpolation runs after the overrides, so `--spes_config.peer_id=2` changes "
          "`save_folder: output/${run_name}/node${spes_config.peer_id}`. Only keys written in the file or "
          "given as overrides can be referenced (not defaults); a value that is exactly `${x}` takes x's type. "
          "References nest up to 16 levels; an interpolated value over 1 MiB, or interpolated values adding up to over "
          "16 MiB (references that double at every level can ask for gigabytes), is an error naming the key.\n"
          "- Loading never opens data files. Relative data paths (in `data.paths`, evaluators and in "
          "`.txt` manifests) resolve against the current directory, as in OLMo; a manifest lists one "
          "token file a line (blank lines and `#` comments skipped; `spes list-files` writes absolute paths).\n"
          "- `using_spes: true` with `using_dilico: true` (as the seeds' dilico config has it) is the "
          "FedAvg baseline: every expert trainable, `num_train_experts_per_node` is not an ownership. With "
          "SPES, peer p owns experts [p*m, (p+1)*m) when the peers partition the experts; with `num_peers * m` "
          "a multiple of `moe_num_experts` (the seeds' 3B config: 8 peers x 2 of 8 experts) peer p owns the "
          "group p mod E/m and every expert has several owners, averaged by the server (replicas, docs/sync.md); "
          "a topology giving experts unequal owners is warned about here and refused by the server.\n"
          "- Data order is OLMo's: per file floor(tokens / max_sequence_length) instances (the tail is "
          "dropped), files concatenated in order, epoch e shuffled with numpy's "
          "`Generator(PCG64(data.seed + e)).permutation` (reproduced bit for bit). Deviation: a token file "
          "shorter than one instance is an error (OLMo silently skips it).\n\n"
          "| key | default | status | meaning |\n|---|---|---|---|\n",
          out);
    for (int i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &KEYS[i];
        fprintf(out, "| `%s` | ", k->path);
        if (k->kind == K_SECTION || k->kind == K_IGNORED) {
            fputs("", out);
        } else {
            char *text = NULL;
            size_t len = 0;
            FILE *mem = open_memstream(&text, &len);
            if (mem) {
                if (k->kind == K_SPECIAL && k->parse == parse_mlp_ratio) fputs("4", mem);
                else print_value(k, &defaults, mem);
                fclose(mem);
                fputc('`', out);
                print_cell(out, text);
                fputc('`', out);
                free(text);
            }
        }
        const char *status = k->kind == K_SECTION ? "section" : k->kind == K_IGNORED ? "ignored" : k->kind == K_FIXED ? "fixed" : "supported";
        fprintf(out, " | %s | ", status);
        print_cell(out, k->meaning);
        fputs(" |\n", out);
    }
    config_free(&defaults);
}

// ---------------------------------------------------------------------------------------
// Defaults and ownership

void config_defaults(TrainConfig *cfg) {
    *cfg = (TrainConfig){0};
    cfg->model = (ModelConfig){
        .d_model = 768, .n_heads = 12, .n_layers = 12, .vocab_size = 50257, .num_experts = 8, .top_k = 2,
        .expert_hidden = 4 * 768 / 2, .max_seq_len = 1024, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
        .qk_norm = QK_NORM_NONE, .init_std = 0.02f, .eos_token_id = 50256, .pad_token_id = 50256,
    };
    cfg->moe_loss_weight = 0.1f;
    cfg->auxiliary_loss_multiplier = 1e-4f;
    cfg->learning_rate = 1e-4;
    cfg->adamw = (AdamWConfig){.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5};
    cfg->schedule = (ScheduleConfig){.kind = SCHEDULE_COSINE_WITH_WARMUP, .t_warmup = 100, .t_max = 0,
                                     .alpha_f = 0.1, .warmup_min_lr = -1, .grad_clip_warmup_steps = -1,
                                     .grad_clip_warmup_factor = -1};
    cfg->data.memmap_dtype = MEMMAP_UINT16;
    cfg->data.instance_filter = INSTANCE_FILTER_OFF;
    cfg->seed = 6198;
    cfg->data.seed = 6198;
    cfg->eval_interval = 1000;
    cfg->device_eval_batch_size = 16;
    cfg->max_duration = 10000;
    cfg->max_duration_unit = DURATION_STEPS;
    cfg->stop_at = -1;
    cfg->global_train_batch_size = 512;
    cfg->device_train_microbatch_size = 16;
    cfg->save_folder = spes_strdup("./");
    cfg->save_num_unsharded_checkpoints_to_keep = -1;
    cfg->save_num_sharded_checkpoints_to_keep = -1;
    cfg->console_log_interval = 1;
    cfg->num_peers = 1;
    cfg->sync_steps = 100;
    cfg->server_addr = spes_strdup("127.0.0.1:50051");
    cfg->device = spes_strdup("auto");
    cfg->precision = spes_strdup("fp32");
    cfg->distributed_strategy = spes_strdup("fsdp");
    cfg->fsdp_sharding_strategy = spes_strdup("FULL_SHARD");
    cfg->ddp_bucket_cap_mb = 25.0;
    cfg->ddp_overlap_grad_reduce = true;
    cfg->fsdp_prefetch = true;
    cfg->decayed_factor_update_steps = 1;
    cfg->take_over_peer_id = -1;
    cfg->retry_timeout_s = 60;
    cfg->outer_lr = 1.0f;   // with outer_momentum 0: no outer optimizer (the plain mean)
    cfg->outer_momentum = 0.0f;
    cfg->sync_warmup_steps = 0;   // no synchronous warm-up: every round sync_steps apart (the reference)
    cfg->sync_warmup_every = 1;
    cfg->lr_scale = 1.0;          // peers at the configured learning rate (the reference)
    cfg->peer_beta1 = -1;         // peers with optimizer.betas' beta1 (the reference)
}

void config_free(TrainConfig *cfg) {
    free_evaluators(cfg);
    free_strings(cfg->data.paths, cfg->data.n_paths);
    free(cfg->save_folder);
    free(cfg->load_path);
    free(cfg->run_name);
    free(cfg->server_addr);
    free(cfg->device);
    free(cfg->precision);
    free(cfg->activation_checkpointing);
    free(cfg->distributed_strategy);
    free(cfg->fsdp_sharding_strategy);
    free(cfg->auth_token_file);
    free(cfg->tls_ca);
    free(cfg->tls_cert);
    free(cfg->tls_key);
    free(cfg->tokenizer_identifier);
    free(cfg->source_path);
    free(cfg->unknown_keys);
    ytree_free(cfg->tree);
    *cfg = (TrainConfig){0};
}
