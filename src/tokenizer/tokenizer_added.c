#include "tokenizer/tokenizer_added.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static int by_first_byte_then_longest(const void *a, const void *b, void *tokens) {
    const AddedToken *t = tokens;
    const AddedToken *x = &t[*(const int32_t *)a], *y = &t[*(const int32_t *)b];
    if ((uint8_t)x->content[0] != (uint8_t)y->content[0]) return (uint8_t)x->content[0] - (uint8_t)y->content[0];
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

// Builds a matcher over the tokens of `all` whose normalized flag equals `want_normalized`.
static int matcher_build(AddedMatcher *m, AddedToken *all, const int *normalized_flag, int n, int want_normalized) {
    memset(m, 0, sizeof *m);
    m->tokens = all;
    m->order = spes_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!m->order) return SPES_ERR;
    for (int i = 0; i < n; i++)
        if (normalized_flag[i] == want_normalized) m->order[m->num_tokens++] = i;
    qsort_r(m->order, (size_t)m->num_tokens, sizeof(int32_t), by_first_byte_then_longest, all);
    for (int i = 0; i < m->num_tokens; i++) {
        const AddedToken *t = &all[m->order[i]];
        uint8_t b0 = (uint8_t)t->content[0];
        if (m->begin[b0] == m->end[b0]) m->begin[b0] = i;
        m->end[b0] = i + 1;
        if (t->len == 1) m->single[b0] = 1;
        else m->second[b0][(uint8_t)t->content[1] >> 3] |= (uint8_t)(1u << ((uint8_t)t->content[1] & 7));
    }
    return SPES_OK;
}

int added_match(const AddedMatcher *m, const char *text, size_t len, size_t from, size_t *start, size_t *mlen,
                uint32_t *id) {
    if (!m->num_tokens) return 0;
    const uint8_t *t = (const uint8_t *)text;
    for (size_t i = from; i < len; i++) {
        uint8_t b0 = t[i];
        if (m->begin[b0] == m->end[b0]) continue;
        if (!m->single[b0] && (i + 1 >= len || !(m->second[b0][t[i + 1] >> 3] & (1u << (t[i + 1] & 7))))) continue;
        for (int32_t k = m->begin[b0]; k < m->end[b0]; k++) {   // longest first
            const AddedToken *tok = &m->tokens[m->order[k]];
            if (tok->len <= len - i && !memcmp(text + i, tok->content, tok->len)) {
                *start = i;
                *mlen = tok->len;
                *id = tok->id;
                return 1;
            }
        }
    }
    return 0;
}

static int parse_token(const json_t *j, size_t index, const Normalizer *normalizer, NormalizeScratch *scratch,
                       AddedToken *out, int *normalized) {
    const json_t *content = json_object_get(j, "content"), *id = json_object_get(j, "id");
    if (!json_is_string(content) || json_string_length(content) == 0 || !json_is_integer(id) ||
        json_integer_value(id) < 0 || json_integer_value(id) >= UINT32_MAX - 1)
        return spes_fail("tokenizer.json: added_tokens[%zu] needs a non-empty \"content\" and a valid \"id\"", index);
    const char *flags[] = {"single_word", "lstrip", "rstrip"};
    for (int f = 0; f < 3; f++)
        if (json_is_true(json_object_get(j, flags[f])))
            return spes_fail("tokenizer.json: added token \"%s\" sets %s=true, which is not supported",
                             json_string_value(content), flags[f]);
    // HF's default when the flag is absent: normalized = !special.
    out->special = json_is_true(json_object_get(j, "special"));
    const json_t *norm = json_object_get(j, "normalized");
    *normalized = norm ? json_is_true(norm) : !out->special;
    const char *text = json_string_value(content);
    size_t len = json_string_length(content);
    if (memchr(text, 0, len)) return spes_fail("tokenizer.json: added token %zu contains a NUL character", index);
    if (*normalized) SPES_TRY(normalizer_apply(normalizer, scratch, text, len, &text, &len));
    out->content = spes_malloc(len + 1);
    if (!out->content) return SPES_ERR;
    memcpy(out->content, text, len);
    out->content[len] = 0;
    out->len = len;
    out->id = (uint32_t)json_integer_value(id);
    return SPES_OK;
}

// HF does not take an added token's "id" from the file: each token, in file order, gets the id
// its content already has (an earlier added token's, else the model vocab's), else the next one
// after the model vocab (its entry count) and the added ids so far; it then encodes with that id
// and only logs a warning. A file whose ids disagree would silently give other ids here, so the
// token is refused by name. seen: content -> id of the tokens before, max_added: their largest
// id (-1 for none).
static int check_hf_id(const json_t *token, size_t index, const json_t *model_vocab, json_t *seen, int64_t *max_added) {
    const json_t *content = json_object_get(token, "content");
    const char *text = json_string_value(content);
    size_t len = json_string_length(content);
    int64_t vocab_size = (int64_t)json_object_size(model_vocab), want;
    const json_t *known = json_object_getn(seen, text, len);
    if (!known) known = json_object_getn(model_vocab, text, len);
    if (json_is_integer(known)) want = json_integer_value(known);
    else want = *max_added < 0 ? vocab_size : (*max_added >= vocab_size || vocab_size == 0) ? *max_added + 1 : vocab_size;
    if (json_integer_value(json_object_get(token, "id")) != want)
        return spes_fail("tokenizer.json: added_tokens[%zu] \"%s\" has id %lld, but Hugging Face tokenizers gives it id "
                         "%lld (%s) and encodes with that; fix the id in the file", index, text,
                         (long long)json_integer_value(json_object_get(token, "id")), (long long)want,
                         known ? "the id its content already has" : "the next id after the vocab and earlier added tokens");
    if (want > *max_added) *max_added = want;
    return json_object_setn_new(seen, text, len, json_integer(want)) ? spes_fail("out of memory") : SPES_OK;
}

int added_vocab_parse(const json_t *j, const json_t *model_vocab, const Normalizer *normalizer, AddedVocab *out) {
    memset(out, 0, sizeof *out);
    if (!j || json_is_null(j)) j = NULL;
    else if (!json_is_array(j)) return spes_fail("tokenizer.json: added_tokens is not a list");
    int n = j ? (int)json_array_size(j) : 0;
    out->all = spes_calloc((size_t)(n ? n : 1), sizeof(AddedToken));
    int *normalized = spes_calloc((size_t)(n ? n : 1), sizeof(int));
    NormalizeScratch scratch = {0};
    json_t *seen = json_object();
    int64_t max_added = -1;
    int rc = (out->all && normalized && seen) ? SPES_OK : SPES_ERR;
    for (int i = 0; rc == SPES_OK && i < n; i++) {
        rc = parse_token(json_array_get(j, (size_t)i), (size_t)i, normalizer, &scratch, &out->all[i], &normalized[i]);
        if (rc == SPES_OK) out->num_all++;
        if (rc == SPES_OK) rc = check_hf_id(json_array_get(j, (size_t)i), (size_t)i, model_vocab, seen, &max_added);
    }
    json_decref(seen);
    if (rc == SPES_OK) rc = matcher_build(&out->raw, out->all, normalized, n, 0);
    if (rc == SPES_OK) rc = matcher_build(&out->normalized, out->all, normalized, n, 1);
    normalize_scratch_free(&scratch);
    free(normalized);
    if (rc != SPES_OK) added_vocab_free(out);
    return rc;
}

void added_vocab_free(AddedVocab *v) {
    for (int i = 0; i < v->num_all; i++) free(v->all[i].content);
    free(v->all);
    free(v->raw.order);
    free(v->normalized.order);
    memset(v, 0, sizeof *v);
}

int64_t added_vocab_find(const AddedVocab *v, const char *content) {
    for (int i = 0; i < v->num_all; i++)
        if (!strcmp(v->all[i].content, content)) return v->all[i].id;
    return -1;
}
