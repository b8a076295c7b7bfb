#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
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

// Where the special tokens are named: special_tokens_map.json (`map`) and tokenizer_config.json
// (`config`), either may be NULL. A key of the map wins, its null included (transformers has no
// such token then); else the config's; NULL when neither gives the key.
typedef struct {
    const json_t *map, *config;
} SpecialTokenFiles;

static const json_t *special_token(const SpecialTokenFiles *files, const char *key) {
    const json_t *v = json_object_get(files->map, key);
    return v ? v : json_object_get(files->config, key);
}

// The text a special-token value names: a string or {"content": ...}; NULL otherwise.
static const char *special_token_text(const json_t *value) {
    if (json_is_object(value)) value = json_object_get(value, "content");
    return json_string_value(value);
}

static bool tokenizer_json_has(const json_t *model_vocab, const json_t *added_tokens, const char *text) {
    if (json_object_get(model_vocab, text)) return true;
    for (size_t i = 0; i < json_array_size(added_tokens); i++) {
        const char *content = json_string_value(json_object_get(json_array_get(added_tokens, i), "content"));
        if (content && !strcmp(content, text)) return true;
    }
    return false;
}

// Appends the token `value` names to `added` with id *next_id (then advanced), unless tokenizer.json
// has it already. An object's flags are kept (parse_token refuses the unsupported ones by name).
static int append_special_token(const json_t *model_vocab, json_t *added, const json_t *value, int64_t *next_id) {
    const char *text = special_token_text(value);
    if (!text || !*text || tokenizer_json_has(model_vocab, added, text)) return SPES_OK;
    json_t *entry = json_is_object(value) ? json_deep_copy(value) : json_pack("{s:s}", "content", text);
    int fail = !entry || json_object_set_new(entry, "id", json_integer(*next_id)) ||
               json_object_set_new(entry, "special", json_true()) ||
               (!json_object_get(entry, "normalized") && json_object_set_new(entry, "normalized", json_false()));
    if (fail || json_array_append_new(added, entry)) {
        if (fail) json_decref(entry);
        return spes_fail("out of memory");
    }
    (*next_id)++;
    return SPES_OK;
}

// transformers appends every special token the config files name and tokenizer.json lacks as a
// new special token (normalized false) with the next free id, in the order of its special-token
// attributes, then the additional / extra special tokens (transformers 5.23: an eos_token
// "<|my_eos|>" missing from GPT-NeoX's vocab becomes id 50281 after a missing bos_token's 50280,
// and encodes as that id wherever a text holds it). Reading such a token as "none" dropped the
// EOS. The entries go into tokenizer.json's "added_tokens" before it is parsed, so they match,
// decode and count in the vocabulary size as the file's own added tokens do.
static int append_missing_special_tokens(json_t *root, const SpecialTokenFiles *files) {
    static const char *keys[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                                 "mask_token", "additional_special_tokens", "extra_special_tokens"};
    const json_t *model_vocab = json_object_get(json_object_get(root, "model"), "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model_vocab) || (added && !json_is_array(added))) return SPES_OK;   // load_parts says why
    if (!added) {
        added = json_array();
        if (!added || json_object_set_new(root, "added_tokens", added)) return spes_fail("out of memory");
    }
    int64_t next_id = (int64_t)json_object_size(model_vocab);
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_int_t id = json_integer_value(json_object_get(json_array_get(added, i), "id"));
        if (id >= next_id) next_id = id + 1;
    }
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const json_t *value = special_token(files, keys[k]), *item;
        size_t i;
        const char *name;
        if (json_is_array(value)) {   // additional_special_tokens: a list
            json_array_foreach(value, i, item) SPES_TRY(append_special_token(model_vocab, added, item, &next_id));
        } else if (json_is_object(value) && !json_object_get(value, "content")) {   // named extras {"image_token": ...}
            json_object_foreach((json_t *)value, name, item)
                SPES_TRY(append_special_token(model_vocab, added, item, &next_id));
        } else {
            SPES_TRY(append_special_token(model_vocab, added, value, &next_id));
        }
    }
    return SPES_OK;
}

// tokenizer.json text -> *out. files: the config files naming the special tokens (both NULL
// when there are none: the EOS is then picked by convention; there is no BOS).
static int load_tokenizer(const char *json, size_t len, const SpecialTokenFiles *files, const char *origin,
                          Tokenizer **out) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    if (!root) return spes_fail("%s: invalid JSON at line %d column %d: %s", origin, jerr.line, jerr.column, jerr.text);
    Tokenizer *t = spes_calloc(1, sizeof *t);
    int rc = t ? append_missing_special_tokens(root, files) : SPES_ERR;
    if (rc == SPES_OK) rc = load_parts(t, root);
    json_decref(root);
    if (rc != SPES_OK) {
        tokenizer_free(t);
        return spes_fail_context("%s", origin);
    }
    const json_t *eos_token = special_token(files, "eos_token");
    t->eos_id = eos_token ? token_named(t, eos_token) : eos_by_convention(t);
    t->bos_id = token_named(t, special_token(files, "bos_token"));
    *out = t;
    return SPES_OK;
}

int tokenizer_load_json(const char *json, size_t len, const char *config_json, const char *origin, Tokenizer **out) {
    // A config that is not JSON names no EOS here (tokenizer_load refuses such a file).
    json_t *config = config_json ? json_loads(config_json, 0, NULL) : NULL;
    SpecialTokenFiles files = {NULL, config};
    int rc = load_tokenizer(json, len, &files, origin, out);
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
        rc = load_tokenizer((const char *)json, len, &(SpecialTokenFiles){map, config}, json_path, out);
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
