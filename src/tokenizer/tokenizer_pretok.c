#include "tokenizer/tokenizer_pretok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

// GPT-2's pattern, what HF's ByteLevel pre-tokenizer applies when use_regex is true.
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---------------------------------------------------------------------------------------------
// Pattern compilation

// HF compiles patterns with Oniguruma, whose \s is exactly Unicode White_Space. PCRE2's \s with
// UCP differs (it lacks U+0085 and includes U+180E), so \s and \S are rewritten as explicit
// classes of White_Space (inside a class, \s becomes the list itself; \S inside a class
// cannot be rewritten and is refused).
// Likewise \h / \H (Oniguruma: hex digit / not one) and \v (the vertical tab); \V has no PCRE2
// equivalent and is refused. The option letter m (Ruby: dot matches newline) becomes s.
#define WHITE_SPACE "\\t\\n\\x{0b}\\f\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define HEX_DIGIT "0-9a-fA-F"
static int onig_to_pcre2(const char *pat, size_t len, char **out) {
    char *o = spes_malloc(len * (sizeof WHITE_SPACE + 3) + 1);
    if (!o) return SPES_ERR;
    size_t k = 0;
    int in_class = 0;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char e = pat[++i];
            const char *rep = NULL;
            // Oniguruma's \h is a hex digit and \v the vertical tab alone, where PCRE2 means
            // horizontal / vertical white space: translated, or split silently elsewhere.
            if (e == 's') rep = in_class ? WHITE_SPACE : "[" WHITE_SPACE "]";
            else if (e == 'S' && !in_class) rep = "[^" WHITE_SPACE "]";
            else if (e == 'h') rep = in_class ? HEX_DIGIT : "[" HEX_DIGIT "]";
            else if (e == 'H' && !in_class) rep = "[^" HEX_DIGIT "]";
            else if (e == 'v') rep = "\\x{0b}";
            else if (e == 'S' || e == 'H' || e == 'V') {
                free(o);
                return spes_fail("tokenizer.json: regex uses \\%c%s, which cannot be matched exactly like Oniguruma; "
                                 "pattern: %.*s", e, e == 'V' ? "" : " inside a character class", (int)len, pat);
            }
            if (rep) {
                size_t n = strlen(rep);
                memcpy(o + k, rep, n);
                k += n;
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
            continue;
        }
        // Ruby-syntax option groups: (?m) is dot-matches-newline there, PCRE2's (?s).
        if (!in_class && c == '(' && i + 2 < len && pat[i + 1] == '?' && pat[i + 2] && strchr("imx-", pat[i + 2])) {
            o[k++] = '(';
            o[k++] = '?';
            for (i += 2; i < len && pat[i] && strchr("imx-", pat[i]); i++) o[k++] = pat[i] == 'm' ? 's' : pat[i];
            i--;
            continue;
        }
        // {,n} is {0,n} in Oniguruma; older PCRE2 reads it as literal text.
        if (!in_class && c == '{' && i + 1 < len && pat[i + 1] == ',') {
            size_t j = i + 2;
            while (j < len && pat[j] >= '0' && pat[j] <= '9') j++;
            if (j > i + 2 && j < len && pat[j] == '}') {
                o[k++] = '{';
                o[k++] = '0';
                continue;
            }
        }
        // Oniguruma's class set operations (a nested [...] is a union, && an intersection): PCRE2
        // would read the brackets and ampersands as literal members, silently.
        if (in_class && ((c == '[' && !(i + 1 < len && pat[i + 1] == ':')) || (c == '&' && i + 1 < len && pat[i + 1] == '&'))) {
            free(o);
            return spes_fail("tokenizer.json: regex uses a character class %s (Oniguruma set operations), which is not "
                             "supported; pattern: %.*s", c == '[' ? "nested in a class" : "intersection &&", (int)len, pat);
        }
        if (!in_class && c == '[') {
            in_class = 1;
            o[k++] = c;
            // A ']' right after '[' or '[^' is a literal.
            if (i + 1 < len && pat[i + 1] == '^') o[k++] = pat[++i];
            if (i + 1 < len && pat[i + 1] == ']') o[k++] = pat[++i];
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') {   // POSIX [:name:]
            const char *end = strstr(pat + i, ":]");
            size_t n = end ? (size_t)(end - (pat + i)) + 2 : 1;
            memcpy(o + k, pat + i, n);
            k += n;
            i += n - 1;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        o[k++] = c;
    }
    o[k] = 0;
    *out = o;
    return SPES_OK;
}

static int compile_step_regex(PreTokStep *step, const char *pattern, size_t len, int literal) {
    char *translated = NULL;
    if (!literal) SPES_TRY(onig_to_pcre2(pattern, len, &translated));
    int err;
    PCRE2_SIZE err_off;
    // Ruby syntax (Oniguruma's default, HF's) makes ^ and $ line anchors, lines ending at LF only.
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);   // LITERAL refuses UCP
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc || pcre2_set_newline(cc, PCRE2_NEWLINE_LF) != 0) {
        pcre2_compile_context_free(cc);
        free(translated);
        return spes_fail("out of memory compiling a split pattern");
    }
    step->re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : translated), literal ? len : PCRE2_ZERO_TERMINATED, opts,
                             &err, &err_off, cc);
    pcre2_compile_context_free(cc);
    free(translated);
    if (!step->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return spes_fail("tokenizer.json: split pattern \"%.*s\" does not compile with PCRE2 at offset %zu: %s", (int)len,
                         pattern, (size_t)err_off, (const char *)msg);
    }
    step->jit = pcre2_jit_compile(step->re, PCRE2_JIT_COMPLETE) == 0;
    return SPES_OK;
}

// ---------------------------------------------------------------------------------------------
// Parsing

static int add_step(PreTokenizer *pt, PreTokStep step) {
    PreTokStep *grown = spes_realloc(pt->steps, sizeof(PreTokStep) * (size_t)(pt->num_steps + 1));
    if (!grown) return SPES_ERR;
    pt->steps = grown;
    pt->steps[pt->num_steps++] = step;
    return SPES_OK;
}

static int append_description(PreTokenizer *pt, const char *what) {
    size_t old = pt->description ? strlen(pt->description) : 0;
    char *grown = spes_realloc(pt->description, old + strlen(what) + 2);
    if (!grown) return SPES_ERR;
    if (old) grown[old++] = '+';
    strcpy(grown + old, what);
    pt->description = grown;
    return SPES_OK;
}

static int parse_behavior(const char *name, SplitBehavior *out) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (name && !strcmp(name, names[i])) {
            *out = (SplitBehavior)i;
            return SPES_OK;
        }
    return spes_fail("tokenizer.json: Split behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, "
                     "MergedWithNext, Contiguous", name ? name : "(missing)");
}

static int parse_split(PreTokenizer *pt, const json_t *j) {
    PreTokStep step = {0};
    SPES_TRY(parse_behavior(json_string_value(json_object_get(j, "behavior")), &step.behavior));
    step.invert = json_is_true(json_object_get(j, "invert"));
    const json_t *pat = json_object_get(j, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    if (json_is_string(re)) SPES_TRY(compile_step_regex(&step, json_string_value(re), json_string_length(re), 0));
    else if (json_is_string(str)) SPES_TRY(compile_step_regex(&step, json_string_value(str), json_string_length(str), 1));
    else return spes_fail("tokenizer.json: Split pre-tokenizer needs pattern {\"Regex\": ...} or {\"String\": ...}");
    if (add_step(pt, step) != SPES_OK) {
        pcre2_code_free(step.re);
        return SPES_ERR;
    }
    char what[64];
    snprintf(what, sizeof what, "Split(%s%s)", json_string_value(json_object_get(j, "behavior")),
             step.invert ? ",invert" : "");
    return append_description(pt, what);
}

static int parse_one(PreTokenizer *pt, const json_t *j) {
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return spes_fail("tokenizer.json: pre_tokenizer without a \"type\"");
    if (pt->has_byte_level)
        return spes_fail("tokenizer.json: pre-tokenizer %s after ByteLevel is not supported (ByteLevel must be last)",
                         type);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(j, "pretokenizers");
        if (!json_is_array(list)) return spes_fail("tokenizer.json: Sequence pre-tokenizer without \"pretokenizers\"");
        size_t i;
        const json_t *item;
        json_array_foreach(list, i, item) SPES_TRY(parse_one(pt, item));
        return SPES_OK;
    }
    if (!strcmp(type, "Split")) return parse_split(pt, j);
    if (!strcmp(type, "Digits")) {
        // HF isolates every char::is_numeric character (Unicode N*), or each run of them.
        int individual = json_is_true(json_object_get(j, "individual_digits"));
        PreTokStep step = {.behavior = SPLIT_ISOLATED};
        const char *pat = individual ? "\\p{N}" : "\\p{N}+";
        SPES_TRY(compile_step_regex(&step, pat, strlen(pat), 0));
        SPES_TRY(add_step(pt, step));
        return append_description(pt, individual ? "Digits(individual)" : "Digits");
    }
    if (!strcmp(type, "ByteLevel")) {
        PreTokStep step = {.behavior = SPLIT_ISOLATED};
        step.add_prefix_space = json_is_true(json_object_get(j, "add_prefix_space"));
        const json_t *use_regex = json_object_get(j, "use_regex");
        if (!use_regex || json_is_true(use_regex))   // HF's default is true
            SPES_TRY(compile_step_regex(&step, GPT2_PATTERN, strlen(GPT2_PATTERN), 0));
        SPES_TRY(add_step(pt, step));
        pt->has_byte_level = 1;
        return append_description(pt, step.re ? "ByteLevel(regex)" : "ByteLevel");
    }
    return spes_fail("tokenizer.json: pre-tokenizer type \"%s\" is not supported (supported: Split, ByteLevel, Digits, "
                     "Sequence)", type);
}

int pretok_parse(const json_t *j, PreTokenizer *out) {
    memset(out, 0, sizeof *out);
    if (!j || json_is_null(j) || parse_one(out, j) != SPES_OK) {
        if (!j || json_is_null(j)) spes_fail("tokenizer.json: no pre_tokenizer; only byte-level BPE models are supported");
        pretok_free(out);
        return SPES_ERR;
    }
    if (!out->has_byte_level) {
        pretok_free(out);
        return spes_fail("tokenizer.json: the pre-tokenizer has no ByteLevel step; only byte-level BPE models are "
                         "supported");
    }
    return SPES_OK;
}

void pretok_free(PreTokenizer *pt) {
    for (int i = 0; i < pt->num_steps; i++) pcre2_code_free(pt->steps[i].re);
    free(pt->steps);
    free(pt->description);
    memset(pt, 0, sizeof *pt);
}

int pretok_scratch_init(PreTokScratch *s) {
    memset(s, 0, sizeof *s);
    s->match = pcre2_match_data_create(1, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    // Deeply backtracking matches (the \s+(?!\S) alternative over a long whitespace run) need
    // more than the default 32 KiB JIT stack.
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
    if (!s->match || !s->mctx || !s->jit_stack) {
        pretok_scratch_free(s);
        return spes_fail("out of memory creating regex match data");
    }
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
    return SPES_OK;
}

void pretok_scratch_free(PreTokScratch *s) {
    pcre2_match_data_free(s->match);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit_stack);
    free(s->prefixed);
    memset(s, 0, sizeof *s);
}

// ---------------------------------------------------------------------------------------------
// Running

typedef struct {
    const PreTokenizer *pt;
    PreTokScratch *s;
    int next_step;
    PreTokEmitFn emit;
    void *ctx;
    SplitBehavior behavior;
    int have_pending, pending_match, previous_match;
    const char *pending;
    size_t pending_len;
} SplitState;

static int run_step(const PreTokenizer *pt, PreTokScratch *s, int k, const char *text, size_t len, PreTokEmitFn emit,
                    void *ctx);

static int pass_on(SplitState *st, const char *p, size_t n) {
    return run_step(st->pt, st->s, st->next_step, p, n, st->emit, st->ctx);
}

// One segment of the step's input, in order: a match (after invert) or the gap between matches.
// Applies HF's SplitDelimiterBehavior as a stream with at most one pending piece.
static int feed(SplitState *st, const char *p, size_t n, int is_match) {
    switch (st->behavior) {
    case SPLIT_REMOVED:
        return is_match ? SPES_OK : pass_on(st, p, n);
    case SPLIT_ISOLATED:
        return pass_on(st, p, n);
    case SPLIT_MERGED_WITH_PREVIOUS:
        // A match joins the piece before it (unless that piece was itself a match).
        if (is_match && !st->previous_match && st->have_pending) st->pending_len = (size_t)(p + n - st->pending);
        else {
            if (st->have_pending) SPES_TRY(pass_on(st, st->pending, st->pending_len));
            st->have_pending = 1, st->pending = p, st->pending_len = n;
        }
        st->previous_match = is_match;
        return SPES_OK;
    case SPLIT_MERGED_WITH_NEXT:
        // A match joins the gap after it; a match followed by a match stands alone.
        if (st->have_pending) {
            st->have_pending = 0;
            if (!is_match) return pass_on(st, st->pending, (size_t)(p + n - st->pending));
            SPES_TRY(pass_on(st, st->pending, st->pending_len));
        }
        if (is_match) st->have_pending = 1, st->pending = p, st->pending_len = n;
        else return pass_on(st, p, n);
        return SPES_OK;
    case SPLIT_CONTIGUOUS:
        // Neighbours with the same flag join.
        if (st->have_pending && is_match == st->pending_match) st->pending_len = (size_t)(p + n - st->pending);
        else {
            if (st->have_pending) SPES_TRY(pass_on(st, st->pending, st->pending_len));
            st->have_pending = 1, st->pending = p, st->pending_len = n, st->pending_match = is_match;
        }
        return SPES_OK;
    }
    return SPES_OK;
}

// Like HF's find_matches: gaps and matches in order. An empty match is a segment too (it can
// separate or join pieces under the merging behaviours); the search then steps one character on.
static int split_with_regex(const PreTokStep *step, SplitState *st, const char *text, size_t len) {
    PreTokScratch *s = st->s;
    size_t off = 0, prev = 0;
    while (off <= len) {
        int rc = step->jit ? pcre2_jit_match(step->re, (PCRE2_SPTR)text, len, off, 0, s->match, s->mctx)
                           : pcre2_match(step->re, (PCRE2_SPTR)text, len, off, PCRE2_NO_UTF_CHECK, s->match, s->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return spes_fail("pre-tokenizer regex failed on a %zu-byte piece: %s", len, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->match);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev) SPES_TRY(feed(st, text + prev, ms - prev, step->invert));
        SPES_TRY(feed(st, text + ms, me - ms, !step->invert));
        prev = me;
        if (me > ms) {
            off = me;
            continue;
        }
        if (ms >= len) break;
        off = ms + 1;   // past the empty match: next character boundary
        while (off < len && ((unsigned char)text[off] & 0xC0) == 0x80) off++;
    }
    if (prev < len) SPES_TRY(feed(st, text + prev, len - prev, step->invert));
    if (st->have_pending) SPES_TRY(pass_on(st, st->pending, st->pending_len));
    return SPES_OK;
}

static int run_step(const PreTokenizer *pt, PreTokScratch *s, int k, const char *text, size_t len, PreTokEmitFn emit,
                    void *ctx) {
    if (len == 0) return SPES_OK;
    if (k == pt->num_steps) return emit(ctx, text, len);
    const PreTokStep *step = &pt->steps[k];
    if (step->add_prefix_space && text[0] != ' ') {
        // Only the last step (ByteLevel) prepends, so the buffer is free again once this returns.
        if (len + 1 > s->prefixed_cap) {
            char *grown = spes_realloc(s->prefixed, 2 * len + 64);
            if (!grown) return SPES_ERR;
            s->prefixed = grown;
            s->prefixed_cap = 2 * len + 64;
        }
        s->prefixed[0] = ' ';
        memcpy(s->prefixed + 1, text, len);
        text = s->prefixed;
        len++;
    }
    if (!step->re) return run_step(pt, s, k + 1, text, len, emit, ctx);
    SplitState st = {.pt = pt, .s = s, .next_step = k + 1, .emit = emit, .ctx = ctx, .behavior = step->behavior};
    return split_with_regex(step, &st, text, len);
}

int pretok_run(const PreTokenizer *pt, PreTokScratch *s, const char *text, size_t len, PreTokEmitFn emit, void *ctx) {
    return run_step(pt, s, 0, text, len, emit, ctx);
}
