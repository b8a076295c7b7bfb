#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "tokenizer/tokenizer_added.h"
#include "tokenizer/tokenizer_bpe.h"
#include "tokenizer/tokenizer_bytelevel.h"
#include "tokenizer/tokenizer_normalize.h"
#include "tokenizer/tokenizer_pretok.h"
#include "tokenizer/tokenizer_utf8.h"

#define BYTES_VOCAB 257
#define BYTES_EOS 256

struct Tokenizer {
    int is_bytes;             // built-in "bytes" tokenizer: nothing below is set
    Normalizer normalizer;
    PreTokenizer pretok;
    BpeModel *model;
    AddedVocab added;
    uint32_t vocab_size;
    int64_t eos_id;
    int64_t bos_id;           // -1: none (AutoTokenizer's bos_token is None)
    // decode table: bytes of id i are decoded[decoded_off[i] .. decoded_off[i+1]); a gap (no
    // token with that id) has decoded_ok[i] = 0.
    uint8_t *decoded;
    uint64_t *decoded_off;
    uint8_t *decoded_ok;
    char description[512];
};

struct TokenEncoder {
    const Tokenizer *tok;
    NormalizeScratch norm;
    PreTokScratch pretok;
    BpeCache *cache;
    IdBuffer *out;            // the call's output, for the pre-tokenizer callback
};

int id_buffer_push(IdBuffer *b, uint32_t id) {
    if (b->len == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        uint32_t *grown = spes_realloc(b->ids, cap * sizeof *grown);
        if (!grown) return SPES_ERR;
        b->ids = grown;
        b->cap = cap;
    }
    b->ids[b->len++] = id;
    return SPES_OK;
}

void id_buffer_free(IdBuffer *b) {
    free(b->ids);
    memset(b, 0, sizeof *b);
}

// ---------------------------------------------------------------------------------------------
// Loading

// Post-processors only add special tokens when asked to (HF encode(add_special_tokens=True));
// the SPES script encodes with add_special_tokens=False, and so does tokenizer_encode. Accept
// the kinds byte-level models ship and refuse the rest so nobody assumes they are applied.
static int check_post_processor(const json_t *j, char *desc, size_t desc_size) {
    if (!j || json_is_null(j)) return SPES_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return spes_fail("tokenizer.json: post_processor without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        size_t i;
        const json_t *item;
        json_array_foreach(json_object_get(j, "processors"), i, item) SPES_TRY(check_post_processor(item, desc, desc_size));
        return SPES_OK;
    }
    if (strcmp(type, "ByteLevel") && strcmp(type, "TemplateProcessing"))
        return spes_fail("tokenizer.json: post_processor type \"%s\" is not supported (supported: ByteLevel, "
                         "TemplateProcessing, Sequence; special tokens are never added, as in the SPES script)", type);
    size_t used = strlen(desc);
    snprintf(desc + used, desc_size - used, ", post_processor %s (not applied: add_special_tokens=False)", type);
    return SPES_OK;
}

static int check_decoder(const json_t *j) {
    if (!j || json_is_null(j)) return SPES_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type && !strcmp(type, "ByteLevel")) return SPES_OK;
    return spes_fail("tokenizer.json: decoder type \"%s\" is not supported (only ByteLevel)", type ? type : "(missing)");
}

// Decoded bytes of every id, HF's ByteLevel decoder: a token made only of alphabet characters
// stands for those bytes; any other token (e.g. an added "   ") for its own UTF-8.
static int build_decode_table(Tokenizer *t) {
    size_t total = 0;
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        size_t len;
        if (bpe_model_token(t->model, id, &len)) total += len;
    }
    for (int i = 0; i < t->added.num_all; i++) total += t->added.all[i].len;
    t->decoded = spes_malloc(total + 1);
    t->decoded_off = spes_malloc(sizeof(uint64_t) * ((size_t)t->vocab_size + 1));
    t->decoded_ok = spes_calloc(t->vocab_size, 1);
    if (!t->decoded || !t->decoded_off || !t->decoded_ok) return SPES_ERR;
    // Added tokens take precedence over model tokens with the same id (HF looks them up first).
    const char **added_text = spes_calloc(t->vocab_size, sizeof(char *));
    size_t *added_len = spes_calloc(t->vocab_size, sizeof(size_t));
    if (!added_text || !added_len) {
        free(added_text), free(added_len);
        return SPES_ERR;
    }
    for (int i = 0; i < t->added.num_all; i++) {
        added_text[t->added.all[i].id] = t->added.all[i].content;
        added_len[t->added.all[i].id] = t->added.all[i].len;
    }
    size_t pos = 0;
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        t->decoded_off[id] = pos;
        size_t len;
        const char *s = added_text[id] ? added_text[id] : bpe_model_token(t->model, id, &len);
        if (added_text[id]) len = added_len[id];
        if (!s) continue;
        t->decoded_ok[id] = 1;
        size_t n;
        if (bytelevel_token_to_bytes(s, len, t->decoded + pos, &n)) pos += n;
        else {
            memcpy(t->decoded + pos, s, len);
            pos += len;
        }
    }
    t->decoded_off[t->vocab_size] = pos;
    free(added_text), free(added_len);
    return SPES_OK;
}

// The id of the token an eos_token / bos_token value names (tokenizer_config.json /
// special_tokens_map.json): a string or {"content": ...}; -1 for null or a token the vocabulary
// does not hold.
static int64_t token_named(const Tokenizer *t, const json_t *value) {
    if (json_is_object(value)) value = json_object_get(value, "content");
    if (!json_is_string(value)) return -1;
    const char *name = json_string_value(value);
    int64_t id = added_vocab_find(&t->added, name);
    for (uint32_t i = 0; id < 0 && i < bpe_model_vocab_size(t->model); i++) {
        size_t len;
        const char *s = bpe_model_token(t->model, i, &len);
        if (s && !strcmp(s, name)) id = i;
    }
    return id;
}

static int64_t eos_by_convention(const Tokenizer *t) {
    static const char *names[] = {"<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>"};
    for (int i = 0; i < 5; i++) {
        int64_t id = added_vocab_find(&t->added, names[i]);
        if (id >= 0) return id;
    }
    return -1;
}

static int load_parts(Tokenizer *t, const json_t *root) {
    if (!json_is_object(root) || !json_is_object(json_object_get(root, "model")))
        return spes_fail("not a tokenizer.json: no \"model\" object");
    SPES_TRY(normalizer_parse(json_object_get(root, "normalizer"), &t->normalizer));
    SPES_TRY(pretok_parse(json_object_get(root, "pre_tokenizer"), &t->pretok));
    SPES_TRY(bpe_model_load(json_object_get(root, "model"), &t->model));
    SPES_TRY(added_vocab_parse(json_object_get(root, "added_tokens"),
                               json_object_get(json_object_get(root, "model"), "vocab"), &t->normalizer, &t->added));
    SPES_TRY(check_decoder(json_object_get(root, "decoder")));
    t->vocab_size = bpe_model_vocab_size(t->model);
    for (int i = 0; i < t->added.num_all; i++)
        if (t->added.all[i].id + 1 > t->vocab_size) t->vocab_size = t->added.all[i].id + 1;
    snprintf(t->description, sizeof t->description, "BPE vocab %u, %zu merges, %d added tokens, normalizer %s, pre-tokenizer %s",
             t->vocab_size, bpe_model_num_merges(t->model), t->added.num_all, t->normalizer.nfc ? "NFC" : "none",
             t->pretok.description);
    SPES_TRY(check_post_processor(json_object_get(root, "post_processor"), t->description, sizeof t->description));
    return build_decode_table(t);
}

// tokenizer.json text -> *out. eos_token, bos_token: the values the tokenizer's config files give
// those keys, NULL when they give none (the EOS is then picked by convention; there is no BOS).
static int load_tokenizer(const char *json, size_t len, const json_t *eos_token, const json_t *bos_token,
                          const char *origin, Tokenizer **out) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    if (!root) return spes_fail("%s: invalid JSON at line %d column %d: %s", origin, jerr.line, jerr.column, jerr.text);
    Tokenizer *t = spes_calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return SPES_ERR;
    }
    int rc = load_parts(t, root);
    json_decref(root);
    if (rc != SPES_OK) {
        tokenizer_free(t);
        return spes_fail_context("%s", origin);
    }
    t->eos_id = eos_token ? token_named(t, eos_token) : eos_by_convention(t);
    t->bos_id = token_named(t, bos_token);
    *out = t;
    return SPES_OK;
}

int tokenizer_load_json(const char *json, size_t len, const char *config_json, const char *origin, Tokenizer **out) {
    // A config that is not JSON names no EOS here (tokenizer_load refuses such a file).
    json_t *config = config_json ? json_loads(config_json, 0, NULL) : NULL;
    int rc = load_tokenizer(json, len, json_object_get(config, "eos_token"), json_object_get(config, "bos_token"),
                            origin, out);
    json_decref(config);
    return rc;
}

// <dir>/<name> parsed into *out (NULL when the file does not exist). AutoTokenizer refuses a
// broken file; reading it as "no eos_token" picked an EOS by convention (<|endoftext|> where
// the file said <|im_end|>), silently.
static int read_config_file(const char *dir, const char *name, json_t **out) {
    *out = NULL;
    char *p = path_join(dir, name);
    if (!p) return SPES_ERR;
    uint8_t *text = NULL;
    size_t len;
    int rc = file_exists(p) ? file_read_all(p, &text, &len) : SPES_OK;
    if (rc == SPES_OK && text) {
        json_error_t jerr;
        *out = json_loadb((const char *)text, len, 0, &jerr);
        if (!json_is_object(*out))
            rc = *out ? spes_fail("%s is not a JSON object", p)
                      : spes_fail("%s: invalid JSON at line %d column %d: %s", p, jerr.line, jerr.column, jerr.text);
    }
    if (rc != SPES_OK) {
        json_decref(*out);
        *out = NULL;
    }
    free(text);
    free(p);
    return rc;
}

// special_tokens_map.json's value of `key` (null there too wins: transformers has no such token
// then), else tokenizer_config.json's; NULL when neither file gives the key.
static const json_t *special_token(const json_t *map, const json_t *config, const char *key) {
    const json_t *v = json_object_get(map, key);
    return v ? v : json_object_get(config, key);
}

int tokenizer_load(const char *path, Tokenizer **out) {
    *out = NULL;
    if (!strcmp(path, "bytes")) {
        Tokenizer *t = spes_calloc(1, sizeof *t);
        if (!t) return SPES_ERR;
        t->is_bytes = 1;
        t->vocab_size = BYTES_VOCAB;
        t->eos_id = BYTES_EOS;
        t->bos_id = -1;
        snprintf(t->description, sizeof t->description, "built-in bytes tokenizer (ids 0-255 = bytes, EOS = 256, vocab 257)");
        *out = t;
        return SPES_OK;
    }
    if (!file_exists(path) && !dir_exists(path))
        return spes_fail("tokenizer %s not found: give a tokenizer.json, a directory holding one (e.g. a downloaded "
                         "Hugging Face model), or 'bytes'; Hub names are not downloaded", path);
    char *json_path = dir_exists(path) ? path_join(path, "tokenizer.json") : spes_strdup(path);
    if (!json_path) return SPES_ERR;
    uint8_t *json = NULL;
    size_t len;
    int rc = file_read_all(json_path, &json, &len);
    if (rc != SPES_OK && dir_exists(path)) spes_fail_context("tokenizer directory %s has no readable tokenizer.json", path);
    json_t *config = NULL, *map = NULL;
    if (rc == SPES_OK && dir_exists(path)) {
        // AutoTokenizer (transformers 5.23, as 4.x) takes tokenizer_config.json's keys; a legacy
        // config, one without "added_tokens_decoder" (or none), has them overridden by those
        // of special_tokens_map.json, which is not even read otherwise.
        rc = read_config_file(path, "tokenizer_config.json", &config);
        if (rc == SPES_OK && !json_object_get(config, "added_tokens_decoder"))
            rc = read_config_file(path, "special_tokens_map.json", &map);
    }
    if (rc == SPES_OK)
        rc = load_tokenizer((const char *)json, len, special_token(map, config, "eos_token"),
                            special_token(map, config, "bos_token"), json_path, out);
    json_decref(config);
    json_decref(map);
    free(json);
    free(json_path);
    return rc;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    pretok_free(&t->pretok);
    bpe_model_free(t->model);
    added_vocab_free(&t->added);
    free(t->decoded);
    free(t->decoded_off);
    free(t->decoded_ok);
    free(t);
}

uint32_t tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }
int64_t tokenizer_eos_id(const Tokenizer *t) { return t->eos_id; }
int64_t tokenizer_bos_id(const Tokenizer *t) { return t->bos_id; }
const char *tokenizer_describe(const Tokenizer *t) { return t->description; }

// ---------------------------------------------------------------------------------------------
// Encoding

int tokenizer_encoder_new(const Tokenizer *t, TokenEncoder **out) {
    *out = NULL;
    TokenEncoder *e = spes_calloc(1, sizeof *e);
    if (!e) return SPES_ERR;
    e->tok = t;
    if (!t->is_bytes && (pretok_scratch_init(&e->pretok) != SPES_OK || bpe_cache_new(&e->cache) != SPES_OK)) {
        tokenizer_encoder_free(e);
        return SPES_ERR;
    }
    *out = e;
    return SPES_OK;
}

void tokenizer_encoder_free(TokenEncoder *e) {
    if (!e) return;
    normalize_scratch_free(&e->norm);
    pretok_scratch_free(&e->pretok);
    bpe_cache_free(e->cache);
    free(e);
}

static int encode_word(void *ctx, const char *piece, size_t len) {
    TokenEncoder *e = ctx;
    return bpe_encode_word(e->tok->model, e->cache, (const uint8_t *)piece, len, e->out);
}

// A piece between raw added tokens: normalize, split off normalized added tokens, pre-tokenize
// and BPE the rest.
static int encode_piece(TokenEncoder *e, const char *text, size_t len) {
    if (len == 0) return SPES_OK;
    const Tokenizer *t = e->tok;
    const char *norm;
    size_t norm_len;
    SPES_TRY(normalizer_apply(&t->normalizer, &e->norm, text, len, &norm, &norm_len));
    size_t pos = 0, start, mlen;
    uint32_t id;
    while (added_match(&t->added.normalized, norm, norm_len, pos, &start, &mlen, &id)) {
        SPES_TRY(pretok_run(&t->pretok, &e->pretok, norm + pos, start - pos, encode_word, e));
        SPES_TRY(id_buffer_push(e->out, id));
        pos = start + mlen;
    }
    return pretok_run(&t->pretok, &e->pretok, norm + pos, norm_len - pos, encode_word, e);
}

int tokenizer_encode(TokenEncoder *e, const char *text, size_t len, IdBuffer *out) {
    const Tokenizer *t = e->tok;
    if (t->is_bytes) {
        for (size_t i = 0; i < len; i++) SPES_TRY(id_buffer_push(out, (uint8_t)text[i]));
        return SPES_OK;
    }
    size_t bad;
    if (!utf8_valid((const uint8_t *)text, len, &bad))
        return spes_fail("text is not valid UTF-8 at byte %zu (Hugging Face tokenizers only encode Unicode strings)", bad);
    e->out = out;
    size_t pos = 0, start, mlen;
    uint32_t id;
    while (added_match(&t->added.raw, text, len, pos, &start, &mlen, &id)) {
        SPES_TRY(encode_piece(e, text + pos, start - pos));
        SPES_TRY(id_buffer_push(out, id));
        pos = start + mlen;
    }
    return encode_piece(e, text + pos, len - pos);
}

// ---------------------------------------------------------------------------------------------
// Decoding

int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, size_t n, char **text, size_t *len) {
    size_t need = *len;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->vocab_size || (!t->is_bytes && !t->decoded_ok[ids[i]]))
            return spes_fail("cannot decode token id %u (vocab size %u)", ids[i], t->vocab_size);
        if (t->is_bytes) need += ids[i] == BYTES_EOS ? 0 : 1;
        else need += t->decoded_off[ids[i] + 1] - t->decoded_off[ids[i]];
    }
    char *buf = spes_realloc(*text, need + 1);
    if (!buf) return SPES_ERR;
    size_t pos = *len;
    for (size_t i = 0; i < n; i++) {
        if (t->is_bytes) {
            if (ids[i] != BYTES_EOS) buf[pos++] = (char)ids[i];
            continue;
        }
        size_t k = t->decoded_off[ids[i] + 1] - t->decoded_off[ids[i]];
        memcpy(buf + pos, t->decoded + t->decoded_off[ids[i]], k);
        pos += k;
    }
    buf[pos] = 0;
    *text = buf;
    *len = pos;
    return SPES_OK;
}
