#include "tokenizer/tokenizer_bpe.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tokenizer/tokenizer_bytelevel.h"
#include "tokenizer/tokenizer_utf8.h"

// Words longer than this (in bytes = initial symbols) use the heap merge; shorter ones the
// rank-array scan, which is faster for the short words that make up almost all text.
#define BPE_LINEAR_MAX 64
// Words up to this many bytes are cached.
#define BPE_CACHE_WORD_MAX 255

#define PAIR_EMPTY UINT64_MAX

typedef struct {
    uint64_t key;      // (left id << 32) | right id, PAIR_EMPTY for a free slot
    uint32_t rank;
    uint32_t new_id;
} MergeSlot;

// Raw bytes -> id, for ignore_merges (whole words found in the vocab skip merging).
typedef struct {
    uint64_t hash;     // 0 = free
    uint32_t off, len;
    uint32_t id;
} WordSlot;

struct BpeModel {
    uint32_t vocab_size;           // largest id + 1
    char *token_blob;              // every vocab string, NUL-separated
    uint64_t *token_off;           // [vocab_size] offset into token_blob, UINT64_MAX for a gap
    uint32_t byte_id[256];         // initial symbol of each byte
    MergeSlot *merges;
    size_t merge_mask;             // table size - 1 (power of two)
    size_t num_merges;
    int ignore_merges;
    WordSlot *words;               // only when ignore_merges
    size_t word_mask;
    uint8_t *word_bytes;           // raw bytes of the tokens in `words`
};

// ---------------------------------------------------------------------------------------------
// Hashing

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

// Hash of a byte string, never 0 (0 marks a free slot).
static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0x100000001B3ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w);
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = mix64(h ^ w ^ 0xA5);
    return h | 1;
}

static size_t table_size_for(size_t n) {
    size_t size = 16;
    while (size < 2 * n) size <<= 1;
    return size;
}

static const MergeSlot *merge_find(const BpeModel *m, uint32_t left, uint32_t right) {
    uint64_t key = ((uint64_t)left << 32) | right;
    size_t i = (size_t)mix64(key) & m->merge_mask;
    for (;;) {
        const MergeSlot *s = &m->merges[i];
        if (s->key == key) return s;
        if (s->key == PAIR_EMPTY) return NULL;
        i = (i + 1) & m->merge_mask;
    }
}

static inline uint32_t merge_rank(const BpeModel *m, uint32_t left, uint32_t right) {
    const MergeSlot *s = merge_find(m, left, right);
    return s ? s->rank : UINT32_MAX;
}

// A later duplicate of a merge replaces the earlier one (HF collects merges into a HashMap).
static void merge_insert(BpeModel *m, uint32_t left, uint32_t right, uint32_t rank, uint32_t new_id) {
    uint64_t key = ((uint64_t)left << 32) | right;
    size_t i = (size_t)mix64(key) & m->merge_mask;
    while (m->merges[i].key != PAIR_EMPTY && m->merges[i].key != key) i = (i + 1) & m->merge_mask;
    m->merges[i] = (MergeSlot){key, rank, new_id};
}

static int word_find(const BpeModel *m, const uint8_t *w, size_t len, uint32_t *id) {
    uint64_t h = hash_bytes(w, len);
    for (size_t i = (size_t)h & m->word_mask;; i = (i + 1) & m->word_mask) {
        const WordSlot *s = &m->words[i];
        if (!s->hash) return 0;
        if (s->hash == h && s->len == len && !memcmp(m->word_bytes + s->off, w, len)) {
            *id = s->id;
            return 1;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loading

static int vocab_id(const json_t *vocab, const char *tok, size_t len, uint32_t *id) {
    const json_t *v = json_object_getn(vocab, tok, len);
    if (!v) return 0;
    *id = (uint32_t)json_integer_value(v);
    return 1;
}

// One merge entry: "left right" (classic) or ["left", "right"] (tokenizers >= 0.20).
static int merge_parts(const json_t *entry, size_t index, const char **left, size_t *left_len, const char **right,
                       size_t *right_len) {
    if (json_is_string(entry)) {
        const char *s = json_string_value(entry);
        size_t n = json_string_length(entry);
        const char *space = memchr(s, ' ', n);
        if (!space || memchr(space + 1, ' ', n - (size_t)(space + 1 - s)))
            return spes_fail("tokenizer.json: merge %zu \"%s\" is not two tokens separated by one space", index, s);
        *left = s;
        *left_len = (size_t)(space - s);
        *right = space + 1;
        *right_len = n - *left_len - 1;
        return SPES_OK;
    }
    if (json_is_array(entry) && json_array_size(entry) == 2 && json_is_string(json_array_get(entry, 0)) &&
        json_is_string(json_array_get(entry, 1))) {
        *left = json_string_value(json_array_get(entry, 0));
        *left_len = json_string_length(json_array_get(entry, 0));
        *right = json_string_value(json_array_get(entry, 1));
        *right_len = json_string_length(json_array_get(entry, 1));
        return SPES_OK;
    }
    return spes_fail("tokenizer.json: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", index);
}

// Options that would change the ids and that byte-level BPE files do not use: refuse them.
static int check_model_options(const json_t *model) {
    const json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v) && json_number_value(v) != 0.0)
        return spes_fail("tokenizer.json: BPE dropout is not supported (it makes encoding random)");
    const char *empty_ok[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(model, empty_ok[i])) && !json_is_null(v) &&
            !(json_is_string(v) && json_string_length(v) == 0))
            return spes_fail("tokenizer.json: BPE %s \"%s\" is not supported (byte-level BPE only)", empty_ok[i],
                             json_is_string(v) ? json_string_value(v) : "?");
    if ((v = json_object_get(model, "byte_fallback")) && json_is_true(v))
        return spes_fail("tokenizer.json: BPE byte_fallback is not supported (byte-level BPE only)");
    return SPES_OK;
}

static int load_vocab(BpeModel *m, const json_t *vocab) {
    const char *key;
    const json_t *val;
    size_t blob_len = 0;
    uint64_t max_id = 0;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= UINT32_MAX - 1)
            return spes_fail("tokenizer.json: vocab entry \"%s\" has no valid id", key);
        // Tables here are dense over ids (33 bytes per id): an id of 2^31 would cost 70 GB.
        if (json_integer_value(val) > BPE_MAX_ID)
            return spes_fail("tokenizer.json: vocab entry \"%s\" has id %lld; ids above %u are not supported", key,
                             (long long)json_integer_value(val), BPE_MAX_ID);
        if ((uint64_t)json_integer_value(val) > max_id) max_id = (uint64_t)json_integer_value(val);
        blob_len += strlen(key) + 1;
    }
    if (json_object_size(vocab) == 0) return spes_fail("tokenizer.json: BPE vocab is empty");
    m->vocab_size = (uint32_t)max_id + 1;
    m->token_blob = spes_malloc(blob_len);
    m->token_off = spes_malloc(sizeof(uint64_t) * m->vocab_size);
    if (!m->token_blob || !m->token_off) return SPES_ERR;
    memset(m->token_off, 0xFF, sizeof(uint64_t) * m->vocab_size);
    size_t pos = 0;
    json_object_foreach((json_t *)vocab, key, val) {
        size_t n = strlen(key) + 1;
        memcpy(m->token_blob + pos, key, n);
        m->token_off[json_integer_value(val)] = pos;
        pos += n;
    }
    // The initial symbols: each byte's alphabet character. Some vocabs lack the bytes valid
    // UTF-8 never contains (0xC0, 0xC1, 0xF5-0xFF); a word that needs a missing one is an error.
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        char ch[4];
        size_t n = utf8_encode(bytelevel_codepoint((uint8_t)b), ch);
        if (!vocab_id(vocab, ch, n, &m->byte_id[b])) {
            m->byte_id[b] = UINT32_MAX;
            missing += b < 0x80;
        }
    }
    if (missing)
        return spes_fail("tokenizer.json: vocab lacks byte-level symbols for %d ASCII bytes; only byte-level BPE "
                         "models are supported", missing);
    return SPES_OK;
}

static int load_merges(BpeModel *m, const json_t *vocab, const json_t *merges) {
    if (!json_is_array(merges)) return spes_fail("tokenizer.json: BPE merges is missing or not a list");
    m->num_merges = json_array_size(merges);
    size_t size = table_size_for(m->num_merges);
    m->merges = spes_malloc(sizeof(MergeSlot) * size);
    if (!m->merges) return SPES_ERR;
    memset(m->merges, 0xFF, sizeof(MergeSlot) * size);
    m->merge_mask = size - 1;
    char *joined = NULL;
    size_t joined_cap = 0;
    for (size_t i = 0; i < m->num_merges; i++) {
        const char *l = NULL, *r = NULL;
        size_t ln = 0, rn = 0;
        uint32_t lid, rid, nid;
        if (merge_parts(json_array_get(merges, i), i, &l, &ln, &r, &rn) != SPES_OK) goto fail;
        if (ln + rn > joined_cap) {
            joined_cap = 2 * (ln + rn);
            char *grown = spes_realloc(joined, joined_cap);
            if (!grown) goto fail;
            joined = grown;
        }
        memcpy(joined, l, ln);
        memcpy(joined + ln, r, rn);
        if (!vocab_id(vocab, l, ln, &lid) || !vocab_id(vocab, r, rn, &rid) || !vocab_id(vocab, joined, ln + rn, &nid)) {
            spes_fail("tokenizer.json: merge %zu (\"%.*s\" + \"%.*s\") uses a token that is not in the vocab", i,
                      (int)ln, l, (int)rn, r);
            goto fail;
        }
        merge_insert(m, lid, rid, (uint32_t)i, nid);
    }
    free(joined);
    return SPES_OK;
fail:
    free(joined);
    return SPES_ERR;
}

// Raw-bytes index of the vocab, needed only for ignore_merges.
static int load_word_index(BpeModel *m) {
    size_t size = table_size_for(m->vocab_size);
    size_t blob_len = 0;
    for (uint32_t id = 0; id < m->vocab_size; id++)
        if (m->token_off[id] != UINT64_MAX) blob_len += strlen(m->token_blob + m->token_off[id]);
    m->words = spes_calloc(size, sizeof(WordSlot));
    m->word_bytes = spes_malloc(blob_len + 1);
    if (!m->words || !m->word_bytes) return SPES_ERR;
    m->word_mask = size - 1;
    size_t pos = 0;
    for (uint32_t id = 0; id < m->vocab_size; id++) {
        if (m->token_off[id] == UINT64_MAX) continue;
        const char *tok = m->token_blob + m->token_off[id];
        size_t len;
        // Tokens with characters outside the byte alphabet can never equal a byte-level word.
        if (!bytelevel_token_to_bytes(tok, strlen(tok), m->word_bytes + pos, &len)) continue;
        uint64_t h = hash_bytes(m->word_bytes + pos, len);
        size_t i = (size_t)h & m->word_mask;
        while (m->words[i].hash) i = (i + 1) & m->word_mask;
        m->words[i] = (WordSlot){h, (uint32_t)pos, (uint32_t)len, id};
        pos += len;
    }
    return SPES_OK;
}

int bpe_model_load(const json_t *model, BpeModel **out) {
    *out = NULL;
    const json_t *type = json_object_get(model, "type");
    if (!json_is_object(model) || (type && !(json_is_string(type) && !strcmp(json_string_value(type), "BPE"))))
        return spes_fail("tokenizer.json: model type %s is not supported (only BPE)",
                         type && json_is_string(type) ? json_string_value(type) : "(missing)");
    SPES_TRY(check_model_options(model));
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return spes_fail("tokenizer.json: BPE vocab is missing or not an object");
    BpeModel *m = spes_calloc(1, sizeof *m);
    if (!m) return SPES_ERR;
    m->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    if (load_vocab(m, vocab) != SPES_OK || load_merges(m, vocab, json_object_get(model, "merges")) != SPES_OK ||
        (m->ignore_merges && load_word_index(m) != SPES_OK)) {
        bpe_model_free(m);
        return SPES_ERR;
    }
    *out = m;
    return SPES_OK;
}

void bpe_model_free(BpeModel *m) {
    if (!m) return;
    free(m->token_blob);
    free(m->token_off);
    free(m->merges);
    free(m->words);
    free(m->word_bytes);
    free(m);
}

uint32_t bpe_model_vocab_size(const BpeModel *m) { return m->vocab_size; }
size_t bpe_model_num_merges(const BpeModel *m) { return m->num_merges; }

const char *bpe_model_token(const BpeModel *m, uint32_t id, size_t *len) {
    if (id >= m->vocab_size || m->token_off[id] == UINT64_MAX) return NULL;
    const char *t = m->token_blob + m->token_off[id];
    *len = strlen(t);
    return t;
}

// ---------------------------------------------------------------------------------------------
// Merging

size_t bpe_merge_linear(const BpeModel *m, uint32_t *sym, size_t n) {
    // rank[i]: merge rank of the pair (sym[i], sym[i+1]); shape [n-1].
    uint32_t rank[BPE_LINEAR_MAX];
    for (size_t i = 0; i + 1 < n; i++) rank[i] = merge_rank(m, sym[i], sym[i + 1]);
    while (n >= 2) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        sym[best] = merge_find(m, sym[best], sym[best + 1])->new_id;
        // Drop symbol best+1 and pair rank best+1, then refresh the two pairs touching best.
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof *sym);
        if (best + 2 < n) memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof *rank);
        n--;
        if (best > 0) rank[best - 1] = merge_rank(m, sym[best - 1], sym[best]);
        if (best + 1 < n) rank[best] = merge_rank(m, sym[best], sym[best + 1]);
    }
    return n;
}

// HF's algorithm for long words: a min-heap of (rank, position) candidates over a linked list
// of symbols; stale candidates (their pair has changed) are skipped when popped.
typedef struct {
    uint32_t rank, pos, new_id;
} Candidate;

static inline int cand_less(Candidate a, Candidate b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(Candidate *h, size_t *n, Candidate c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(c, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static Candidate heap_pop(Candidate *h, size_t *n) {
    Candidate top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(const BpeModel *m, Candidate *heap, size_t *hn, const uint32_t *sym, size_t left, size_t right) {
    const MergeSlot *s = merge_find(m, sym[left], sym[right]);
    if (s) heap_push(heap, hn, (Candidate){s->rank, (uint32_t)left, s->new_id});
}

int bpe_merge_heap(const BpeModel *m, uint32_t *sym, size_t n, size_t *out_n) {
    if (n > UINT32_MAX - 1) return spes_fail("BPE word of %zu bytes is too long", n);
    // next[i]/prev[i]: linked list over live symbols (n = none); alive[i] = 0 once merged away.
    // Every merge pushes at most 2 candidates, so the heap never exceeds 3n.
    uint32_t *next = spes_malloc(sizeof(uint32_t) * n), *prev = spes_malloc(sizeof(uint32_t) * n);
    uint8_t *alive = spes_malloc(n);
    Candidate *heap = spes_malloc(sizeof(Candidate) * 3 * n);
    if (!next || !prev || !alive || !heap) {
        free(next), free(prev), free(alive), free(heap);
        return SPES_ERR;
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        next[i] = (uint32_t)(i + 1);
        prev[i] = i ? (uint32_t)(i - 1) : (uint32_t)n;
        alive[i] = 1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(m, heap, &hn, sym, i, i + 1);
    while (hn) {
        Candidate c = heap_pop(heap, &hn);
        if (!alive[c.pos] || next[c.pos] == n) continue;
        uint32_t right = next[c.pos];
        const MergeSlot *s = merge_find(m, sym[c.pos], sym[right]);
        if (!s || s->new_id != c.new_id) continue;   // stale candidate
        sym[c.pos] = c.new_id;
        alive[right] = 0;
        next[c.pos] = next[right];
        if (next[right] != n) prev[next[right]] = c.pos;
        if (prev[c.pos] != n) push_pair(m, heap, &hn, sym, prev[c.pos], c.pos);
        if (next[c.pos] != n) push_pair(m, heap, &hn, sym, c.pos, next[c.pos]);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i = next[i]) sym[k++] = sym[i];
    *out_n = k;
    free(next), free(prev), free(alive), free(heap);
    return SPES_OK;
}

// ---------------------------------------------------------------------------------------------
// Word cache: raw bytes -> ids. Fixed-size table and arenas; cleared wholesale when full.

#define CACHE_SLOTS (1u << 16)
#define CACHE_KEY_BYTES (4u << 20)
#define CACHE_IDS (1u << 20)

typedef struct {
    uint64_t hash;      // 0 = free
    uint32_t key_off, ids_off;
    uint16_t key_len, ids_len;
} CacheSlot;

struct BpeCache {
    CacheSlot *slots;
    size_t used;
    uint8_t *keys;
    size_t keys_len;
    uint32_t *ids;
    size_t ids_len;
};

int bpe_cache_new(BpeCache **out) {
    BpeCache *c = spes_calloc(1, sizeof *c);
    if (!c) return SPES_ERR;
    c->slots = spes_calloc(CACHE_SLOTS, sizeof(CacheSlot));
    c->keys = spes_malloc(CACHE_KEY_BYTES);
    c->ids = spes_malloc(CACHE_IDS * sizeof(uint32_t));
    if (!c->slots || !c->keys || !c->ids) {
        bpe_cache_free(c);
        return SPES_ERR;
    }
    *out = c;
    return SPES_OK;
}

void bpe_cache_free(BpeCache *c) {
    if (!c) return;
    free(c->slots);
    free(c->keys);
    free(c->ids);
    free(c);
}

static void cache_store(BpeCache *c, uint64_t h, size_t slot, const uint8_t *w, size_t len, const uint32_t *ids,
                        size_t n) {
    if (c->used + 1 > CACHE_SLOTS / 4 * 3 || c->keys_len + len > CACHE_KEY_BYTES || c->ids_len + n > CACHE_IDS) {
        memset(c->slots, 0, CACHE_SLOTS * sizeof(CacheSlot));
        c->used = c->keys_len = c->ids_len = 0;
        slot = (size_t)h & (CACHE_SLOTS - 1);
    }
    memcpy(c->keys + c->keys_len, w, len);
    memcpy(c->ids + c->ids_len, ids, n * sizeof *ids);
    c->slots[slot] = (CacheSlot){h, (uint32_t)c->keys_len, (uint32_t)c->ids_len, (uint16_t)len, (uint16_t)n};
    c->keys_len += len;
    c->ids_len += n;
    c->used++;
}

// The initial symbols of a word: one per byte.
static int word_symbols(const BpeModel *m, const uint8_t *w, size_t len, uint32_t *sym) {
    for (size_t i = 0; i < len; i++) {
        sym[i] = m->byte_id[w[i]];
        if (sym[i] == UINT32_MAX) return spes_fail("byte 0x%02x has no token in this vocab", w[i]);
    }
    return SPES_OK;
}

static int append_ids(IdBuffer *out, const uint32_t *ids, size_t n) {
    if (out->len + n > out->cap) {
        size_t cap = out->cap ? out->cap : 256;
        while (cap < out->len + n) cap *= 2;
        uint32_t *grown = spes_realloc(out->ids, cap * sizeof *grown);
        if (!grown) return SPES_ERR;
        out->ids = grown;
        out->cap = cap;
    }
    memcpy(out->ids + out->len, ids, n * sizeof *ids);
    out->len += n;
    return SPES_OK;
}

int bpe_encode_word(const BpeModel *m, BpeCache *cache, const uint8_t *w, size_t len, IdBuffer *out) {
    uint32_t whole;
    if (m->ignore_merges && word_find(m, w, len, &whole)) return append_ids(out, &whole, 1);
    if (len <= BPE_CACHE_WORD_MAX) {
        uint64_t h = hash_bytes(w, len);
        size_t slot = (size_t)h & (CACHE_SLOTS - 1);
        for (;; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            const CacheSlot *s = &cache->slots[slot];
            if (!s->hash) break;
            if (s->hash == h && s->key_len == len && !memcmp(cache->keys + s->key_off, w, len))
                return append_ids(out, cache->ids + s->ids_off, s->ids_len);
        }
        uint32_t sym[BPE_CACHE_WORD_MAX];
        SPES_TRY(word_symbols(m, w, len, sym));
        size_t n;
        if (len <= BPE_LINEAR_MAX) n = bpe_merge_linear(m, sym, len);
        else SPES_TRY(bpe_merge_heap(m, sym, len, &n));
        cache_store(cache, h, slot, w, len, sym, n);
        return append_ids(out, sym, n);
    }
    uint32_t *sym = spes_malloc(len * sizeof *sym);
    if (!sym) return SPES_ERR;
    size_t n;
    int rc = word_symbols(m, w, len, sym);
    if (rc == SPES_OK) rc = bpe_merge_heap(m, sym, len, &n);
    if (rc == SPES_OK) rc = append_ids(out, sym, n);
    free(sym);
    return rc;
}
