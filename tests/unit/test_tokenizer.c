// Tokenizer unit tests: BPE merge order on a crafted vocab, added-token splitting, NFC, the
// byte-level alphabet, refusal of unsupported features, the bytes tokenizer, invalid UTF-8,
// linear vs heap merges on the shipped vocab, document cleaning, shard boundaries, the uint16
// refusal of `spes tokenize` (and its shards read back by the training dataset), skipped
// invalid documents, concurrent encoders.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "cli/commands.h"
#include "data/dataset.h"
#include "data/token_writer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_bpe.h"
#include "tokenizer/tokenizer_bytelevel.h"
#include "tokenizer/tokenizer_doc_clean.h"
#include "tokenizer/tokenizer_utf8.h"

// ---------------------------------------------------------------------------------------------
// A small byte-level tokenizer.json: ids 0..255 are the bytes' alphabet characters (id = byte),
// then `extra` tokens from id 256 on, the given merges, added tokens and pipeline parts.

static char *byte_token(uint8_t b) {
    static char buf[8];
    size_t n = utf8_encode(bytelevel_codepoint(b), buf);
    buf[n] = 0;
    return buf;
}

static json_t *make_tokenizer(const char **extra, const char **merges, json_t *added, json_t *normalizer,
                              json_t *pre_tokenizer) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) json_object_set_new(vocab, byte_token((uint8_t)b), json_integer(b));
    for (int i = 0; extra && extra[i]; i++) json_object_set_new(vocab, extra[i], json_integer(256 + i));
    json_t *m = json_array();
    for (int i = 0; merges && merges[i]; i++) json_array_append_new(m, json_string(merges[i]));
    json_t *model = json_pack("{s:s, s:o, s:o}", "type", "BPE", "vocab", vocab, "merges", m);
    if (!pre_tokenizer) pre_tokenizer = json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1);
    return json_pack("{s:o, s:o, s:o, s:o, s:{s:s}}", "model", model, "added_tokens", added ? added : json_array(),
                     "normalizer", normalizer ? normalizer : json_null(), "pre_tokenizer", pre_tokenizer, "decoder",
                     "type", "ByteLevel");
}

static json_t *added_token(const char *content, int id, int special, int normalized) {
    return json_pack("{s:s, s:i, s:b, s:b, s:b, s:b, s:b}", "content", content, "id", id, "special", special, "normalized",
                     normalized, "single_word", 0, "lstrip", 0, "rstrip", 0);
}

// Loads the JSON (consumed); returns SPES_OK/SPES_ERR.
static int load(json_t *j, Tokenizer **tok) {
    char *text = json_dumps(j, 0);
    json_decref(j);
    int rc = tokenizer_load_json(text, strlen(text), NULL, "test", tok);
    free(text);
    return rc;
}

// Encodes text, compares with the expected ids (terminated by UINT32_MAX).
static void expect_ids(Tokenizer *tok, const char *text, const uint32_t *want) {
    TokenEncoder *enc;
    assert_int_equal(tokenizer_encoder_new(tok, &enc), SPES_OK);
    IdBuffer ids = {0};
    assert_int_equal(tokenizer_encode(enc, text, strlen(text), &ids), SPES_OK);
    size_t n = 0;
    while (want[n] != UINT32_MAX) n++;
    if (ids.len != n) fprintf(stderr, "\"%s\": got %zu ids, want %zu\n", text, ids.len, n);
    assert_int_equal(ids.len, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids.ids[i], want[i]);
    // And back.
    char *dec = NULL;
    size_t dec_len = 0;
    assert_int_equal(tokenizer_decode(tok, ids.ids, ids.len, &dec, &dec_len), SPES_OK);
    id_buffer_free(&ids);
    tokenizer_encoder_free(enc);
    free(dec);
}

#define END UINT32_MAX

// ---------------------------------------------------------------------------------------------

static void test_bpe_merge_order(void **state) {
    (void)state;
    // 256 "ab", 257 "bc", 258 "abc", 259 "aa", 260 "Ġa"
    const char *extra[] = {"ab", "bc", "abc", "aa", "\xc4\xa0" "a", NULL};
    const char *merges[] = {"a b", "b c", "ab c", "a a", "\xc4\xa0 a", NULL};
    Tokenizer *tok;
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, NULL), &tok), SPES_OK);
    expect_ids(tok, "abc", (uint32_t[]){258, END});            // a b (rank 0) first, then ab c
    expect_ids(tok, "bc", (uint32_t[]){257, END});
    expect_ids(tok, "aaa", (uint32_t[]){259, 'a', END});        // equal ranks: leftmost first
    expect_ids(tok, "cab", (uint32_t[]){'c', 256, END});
    expect_ids(tok, "ab a", (uint32_t[]){256, 260, END});       // " a" is one pre-token (GPT-2 regex)
    expect_ids(tok, "x\n", (uint32_t[]){'x', 10, END});
    assert_int_equal(tokenizer_vocab_size(tok), 261);
    assert_int_equal(tokenizer_eos_id(tok), -1);
    tokenizer_free(tok);

    // ignore_merges: a word that is a vocab entry is taken whole, even when no merge builds it.
    const char *extra2[] = {"ab", "abc", NULL};   // 256 "ab", 257 "abc"
    const char *merges2[] = {"a b", NULL};
    json_t *j = make_tokenizer(extra2, merges2, NULL, NULL, NULL);
    assert_int_equal(load(json_deep_copy(j), &tok), SPES_OK);
    expect_ids(tok, "abc", (uint32_t[]){256, 'c', END});
    tokenizer_free(tok);
    json_object_set_new(json_object_get(j, "model"), "ignore_merges", json_true());
    assert_int_equal(load(j, &tok), SPES_OK);
    expect_ids(tok, "abc", (uint32_t[]){257, END});
    expect_ids(tok, "abcab", (uint32_t[]){256, 'c', 256, END});   // not whole: merges as usual
    tokenizer_free(tok);
}

static void test_added_tokens(void **state) {
    (void)state;
    json_t *added = json_array();
    // Ids as HF assigns them: the next ones after the 256-entry vocab.
    json_array_append_new(added, added_token("<|endoftext|>", 256, 1, 0));
    json_array_append_new(added, added_token("<|a|>", 257, 1, 0));
    json_array_append_new(added, added_token("<|a|>b", 258, 0, 0));   // longer, same start
    json_array_append_new(added, added_token("   ", 259, 0, 1));      // normalized: matched after NFC
    Tokenizer *tok;
    assert_int_equal(load(make_tokenizer(NULL, NULL, added, NULL, NULL), &tok), SPES_OK);
    expect_ids(tok, "x<|endoftext|>y", (uint32_t[]){'x', 256, 'y', END});
    expect_ids(tok, "<|a|>bc<|a|>", (uint32_t[]){258, 'c', 257, END});   // leftmost-longest
    expect_ids(tok, "a     b", (uint32_t[]){'a', 259, ' ', ' ', 'b', END});
    assert_int_equal(tokenizer_eos_id(tok), 256);
    assert_int_equal(tokenizer_vocab_size(tok), 260);
    tokenizer_free(tok);
}

static void test_nfc(void **state) {
    (void)state;
    // "é" precomposed is U+00E9 = bytes C3 A9; decomposed "e" U+0301 must give the same ids.
    Tokenizer *tok;
    assert_int_equal(load(make_tokenizer(NULL, NULL, NULL, json_pack("{s:s}", "type", "NFC"), NULL), &tok), SPES_OK);
    expect_ids(tok, "caf\xc3\xa9", (uint32_t[]){'c', 'a', 'f', 0xC3, 0xA9, END});
    expect_ids(tok, "cafe\xcc\x81", (uint32_t[]){'c', 'a', 'f', 0xC3, 0xA9, END});
    tokenizer_free(tok);
    // Without a normalizer the combining mark stays.
    assert_int_equal(load(make_tokenizer(NULL, NULL, NULL, NULL, NULL), &tok), SPES_OK);
    expect_ids(tok, "cafe\xcc\x81", (uint32_t[]){'c', 'a', 'f', 'e', 0xCC, 0x81, END});
    tokenizer_free(tok);
}

static void test_byte_level_alphabet(void **state) {
    (void)state;
    assert_int_equal(bytelevel_codepoint(' '), 0x120);    // 'Ġ'
    assert_int_equal(bytelevel_codepoint('\n'), 0x10A);   // 'Ċ'
    assert_int_equal(bytelevel_codepoint('A'), 'A');
    assert_int_equal(bytelevel_codepoint(0xAD), 0x143);
    assert_int_equal(bytelevel_codepoint(0xFF), 0xFF);
    int seen[400] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = bytelevel_codepoint((uint8_t)b);
        assert_true(cp < 400);
        assert_int_equal(seen[cp]++, 0);                   // a bijection
        assert_int_equal(bytelevel_byte(cp), b);
    }
    assert_int_equal(bytelevel_byte(' '), -1);
    assert_int_equal(bytelevel_byte(0x100 + 68), -1);
}

static void expect_refusal(json_t *j, const char *needle) {
    Tokenizer *tok = NULL;
    assert_int_equal(load(j, &tok), SPES_ERR);
    assert_null(tok);
    if (!strstr(spes_last_error(), needle)) fprintf(stderr, "message \"%s\" lacks \"%s\"\n", spes_last_error(), needle);
    assert_non_null(strstr(spes_last_error(), needle));
}

static void test_unsupported_features(void **state) {
    (void)state;
    expect_refusal(make_tokenizer(NULL, NULL, NULL, json_pack("{s:s}", "type", "Lowercase"), NULL), "Lowercase");
    expect_refusal(make_tokenizer(NULL, NULL, NULL, NULL, json_pack("{s:s}", "type", "Metaspace")), "Metaspace");
    expect_refusal(make_tokenizer(NULL, NULL, NULL, NULL,
                                  json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex", "a", "behavior",
                                            "Isolated")),
                   "no ByteLevel");
    json_t *added = json_array();
    json_t *t = added_token("<mask>", 300, 1, 0);
    json_object_set_new(t, "lstrip", json_true());
    json_array_append_new(added, t);
    expect_refusal(make_tokenizer(NULL, NULL, added, NULL, NULL), "lstrip");
    json_t *j = make_tokenizer(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(json_object_get(j, "model"), "type", json_string("WordPiece"));
    expect_refusal(j, "WordPiece");
    j = make_tokenizer(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(json_object_get(j, "model"), "byte_fallback", json_true());
    expect_refusal(j, "byte_fallback");
    const char *bad_merge[] = {"a zz", NULL};
    expect_refusal(make_tokenizer(NULL, bad_merge, NULL, NULL, NULL), "not in the vocab");
    j = make_tokenizer(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(j, "post_processor", json_pack("{s:s}", "type", "BertProcessing"));
    expect_refusal(j, "BertProcessing");
    Tokenizer *tok;
    assert_int_equal(tokenizer_load_json("{", 1, NULL, "broken.json", &tok), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "broken.json"));
}

// tokenizer.json files that HF loads but encodes with other ids than they write: HF replaces an
// added token's "id" by its own (the content's vocab id, else the next free one) and only logs
// a warning. Refused by name; the consistent file loads.
static void test_inconsistent_ids_refused(void **state) {
    (void)state;
    json_t *added = json_array();
    json_array_append_new(added, added_token("<|endoftext|>", 300, 1, 0));   // HF: 256
    expect_refusal(make_tokenizer(NULL, NULL, added, NULL, NULL), "added_tokens[0] \"<|endoftext|>\" has id 300, but "
                                                                  "Hugging Face tokenizers gives it id 256");
    const char *extra[] = {"ab", NULL};
    added = json_array();
    json_array_append_new(added, added_token("<s>", 257, 1, 0));
    json_array_append_new(added, added_token("ab", 258, 0, 1));   // in the vocab: HF uses 256
    expect_refusal(make_tokenizer(extra, NULL, added, NULL, NULL), "added_tokens[1] \"ab\" has id 258");
    added = json_array();
    json_array_append_new(added, added_token("<s>", 257, 1, 0));
    json_array_append_new(added, added_token("<s>", 258, 1, 0));   // a duplicate keeps the first id
    expect_refusal(make_tokenizer(extra, NULL, added, NULL, NULL), "added_tokens[1] \"<s>\" has id 258");
    added = json_array();
    json_array_append_new(added, added_token("ab", 256, 0, 1));
    json_array_append_new(added, added_token("<s>", 257, 1, 0));
    json_array_append_new(added, added_token("<s>", 257, 1, 0));
    Tokenizer *tok;
    assert_int_equal(load(make_tokenizer(extra, NULL, added, NULL, NULL), &tok), SPES_OK);
    expect_ids(tok, "x<s>ab", (uint32_t[]){'x', 257, 256, END});
    tokenizer_free(tok);
}

// A vocab id far beyond the vocab (HF accepts any u32) is refused by name: the id tables are
// dense, and 2^31 cost 24 GB of memory and 16 s before anything was encoded.
static void test_far_vocab_id_refused(void **state) {
    (void)state;
    json_t *j = make_tokenizer(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "far", json_integer(2147483653LL));
    expect_refusal(j, "vocab entry \"far\" has id 2147483653; ids above 16777215 are not supported");
}

// Oniguruma escapes PCRE2 reads otherwise: \h is a hex digit there (PCRE2: horizontal white
// space) and \v the vertical tab. "ab" split at each hex digit stays two symbols; read as
// PCRE2's \h it was one piece and merged (256), silently unlike HF. \V is refused by name.
static json_t *split_then_bytelevel(const char *regex) {
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}", "type", "Sequence", "pretokenizers", "type",
                     "Split", "pattern", "Regex", regex, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                     "add_prefix_space", 0, "use_regex", 0);
}

static void test_oniguruma_escapes(void **state) {
    (void)state;
    const char *extra[] = {"ab", "xy", NULL};
    const char *merges[] = {"a b", "x y", NULL};
    Tokenizer *tok;
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("\\h")), &tok), SPES_OK);
    expect_ids(tok, "ab xy", (uint32_t[]){'a', 'b', ' ', 257, END});
    tokenizer_free(tok);
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("[\\hx]")), &tok), SPES_OK);
    expect_ids(tok, "ab xy", (uint32_t[]){'a', 'b', ' ', 'x', 'y', END});
    tokenizer_free(tok);
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("\\H+")), &tok), SPES_OK);
    expect_ids(tok, "ab xy", (uint32_t[]){256, ' ', 257, END});   // " xy" is the non-hex run
    tokenizer_free(tok);
    // \v is only U+000B: "x\ny" is one piece with the newline (no merge applies across it).
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("\\v")), &tok), SPES_OK);
    expect_ids(tok, "ab\vxy", (uint32_t[]){256, 11, 257, END});
    tokenizer_free(tok);
    // Ruby syntax: ^ and $ are line anchors (lines end at LF), and (?m) lets . match a newline.
    // "^a" isolates the a of each line, so no "ab" merge on either; PCRE2's defaults (string
    // anchors, (?m) = multiline) merged the second line's "ab" (256), unlike HF.
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("^a")), &tok), SPES_OK);
    expect_ids(tok, "ab\nab\r\nab", (uint32_t[]){'a', 'b', '\n', 'a', 'b', '\r', '\n', 'a', 'b', END});
    tokenizer_free(tok);
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("(?m)b.+x")), &tok), SPES_OK);
    expect_ids(tok, "ab\nxy", (uint32_t[]){'a', 'b', '\n', 'x', 'y', END});
    tokenizer_free(tok);
    // {,n} is {0,n} (older PCRE2: literal text, no split at all, so "ab" merged).
    assert_int_equal(load(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("a{,1}")), &tok), SPES_OK);
    expect_ids(tok, "ab", (uint32_t[]){'a', 'b', END});
    tokenizer_free(tok);
    // Class set operations PCRE2 would read as literal members: refused.
    expect_refusal(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("[a[xy]]")), "nested in a class");
    expect_refusal(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("[a-z&&[^b]]")), "intersection &&");
    expect_refusal(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("\\V")), "regex uses \\V");
    expect_refusal(make_tokenizer(extra, merges, NULL, NULL, split_then_bytelevel("[\\H]")), "regex uses \\H inside");
}

static void test_bytes_tokenizer_and_invalid_utf8(void **state) {
    (void)state;
    Tokenizer *tok;
    assert_int_equal(tokenizer_load("bytes", &tok), SPES_OK);
    assert_int_equal(tokenizer_vocab_size(tok), 257);
    assert_int_equal(tokenizer_eos_id(tok), 256);
    expect_ids(tok, "hi\xff", (uint32_t[]){'h', 'i', 0xFF, END});   // any bytes, valid UTF-8 or not
    tokenizer_free(tok);

    assert_int_equal(load(make_tokenizer(NULL, NULL, NULL, NULL, NULL), &tok), SPES_OK);
    TokenEncoder *enc;
    assert_int_equal(tokenizer_encoder_new(tok, &enc), SPES_OK);
    IdBuffer ids = {0};
    const char *bad[] = {"ok \xff", "ok \xc3\x28", "ok \xed\xa0\x80", "ok \xc0\xaf", "ok \xe2\x82"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(tokenizer_encode(enc, bad[i], strlen(bad[i]), &ids), SPES_ERR);
        assert_non_null(strstr(spes_last_error(), "not valid UTF-8 at byte 3"));
    }
    // A megabyte of spaces: deep regex backtracking must not hit the JIT stack limit.
    size_t n = 1 << 20;
    char *spaces = malloc(n);
    memset(spaces, ' ', n);
    spaces[n - 1] = 'x';
    ids.len = 0;
    assert_int_equal(tokenizer_encode(enc, spaces, n, &ids), SPES_OK);
    assert_int_equal(ids.len, n);   // no merges in this vocab: one id per byte
    free(spaces);
    uint32_t out_of_range = 9999;
    char *dec = NULL;
    size_t dec_len = 0;
    assert_int_equal(tokenizer_decode(tok, &out_of_range, 1, &dec, &dec_len), SPES_ERR);
    id_buffer_free(&ids);
    tokenizer_encoder_free(enc);
    tokenizer_free(tok);
}

// The rank-array scan (short words) and HF's heap algorithm (long words) must agree; checked
// on the shipped cl100k-style vocab with random words over a small alphabet (many merges apply).
static void test_linear_matches_heap(void **state) {
    (void)state;
    const char *data = getenv("SPES_TEST_DATA") ? getenv("SPES_TEST_DATA") : "../shared/data";
    char *path = path_join(data, "tokenizers/dolma2.json");
    if (!file_exists(path)) {
        free(path);
        skip();
    }
    uint8_t *text;
    size_t len;
    assert_int_equal(file_read_all(path, &text, &len), SPES_OK);
    free(path);
    json_t *root = json_loadb((const char *)text, len, 0, NULL);
    free(text);
    BpeModel *m;
    assert_int_equal(bpe_model_load(json_object_get(root, "model"), &m), SPES_OK);
    json_decref(root);
    BpeCache *cache;
    assert_int_equal(bpe_cache_new(&cache), SPES_OK);
    const char alphabet[] = " etaoinshrdlu";
    uint64_t s = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        uint32_t a[64], b[64], byte_ids[64];
        size_t n = 2 + (size_t)(trial % 62);
        for (size_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            uint8_t c = (uint8_t)alphabet[(s >> 33) % (sizeof alphabet - 1)];
            IdBuffer one = {0};
            assert_int_equal(bpe_encode_word(m, cache, &c, 1, &one), SPES_OK);
            byte_ids[i] = one.ids[0];
            id_buffer_free(&one);
        }
        memcpy(a, byte_ids, n * sizeof *a);
        memcpy(b, byte_ids, n * sizeof *b);
        size_t na = bpe_merge_linear(m, a, n), nb;
        assert_int_equal(bpe_merge_heap(m, b, n, &nb), SPES_OK);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
    }
    bpe_cache_free(cache);
    bpe_model_free(m);
}

static void expect_clean(const char *in, int keep, const char *want) {
    DocCleanScratch s = {0};
    const char *out;
    size_t n;
    assert_int_equal(doc_clean(&s, in, strlen(in), &out, &n), keep);
    if (keep) {
        assert_int_equal(n, strlen(want));
        assert_memory_equal(out, want, n);
    }
    doc_clean_free(&s);
}

static void test_doc_clean(void **state) {
    (void)state;
    expect_clean("  hello \n", 1, "hello");
    expect_clean("\xe3\x80\x80\xc2\xa0x\xe2\x80\xa8\x1c", 1, "x");   // U+3000, NBSP, U+2028, \x1c
    expect_clean("\xe2\x80\x8bx", 1, "\xe2\x80\x8bx");                // U+200B is not space in Python
    expect_clean(" \t\r\n ", 0, "");
    expect_clean("a<extra_id_1>b<extra_id_1>", 1, "ab");
    expect_clean(" <extra_id_1> ", 1, "");   // not re-stripped: an empty document (EOS only)
}

// ---------------------------------------------------------------------------------------------
// Shards and the CLI's uint16 refusal

static char *temp_dir(void) {
    char tmpl[] = "/tmp/spes_tok_XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void expect_shard(const char *prefix, int proc, int shard, const uint8_t *want, size_t n) {
    char path[640];
    snprintf(path, sizeof path, "%s%03d_%06d.npy", prefix, proc, shard);
    uint8_t *data;
    size_t len;
    assert_int_equal(file_read_all(path, &data, &len), SPES_OK);
    assert_int_equal(len, n);
    assert_memory_equal(data, want, n);
    free(data);
}

static void test_shard_boundaries(void **state) {
    (void)state;
    char *dir = temp_dir();
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/sub/tok_", dir);
    TokenWriter *w;
    // 4 uint32 tokens per shard: documents of 3, 1, 2, 4, 5 tokens.
    assert_int_equal(token_writer_open(prefix, 7, 16, 4, &w), SPES_OK);
    uint32_t d1[] = {1, 2, 3}, d2[] = {4}, d3[] = {5, 6}, d4[] = {7, 8, 9, 10}, d5[] = {11, 12, 13, 14, 15};
    assert_int_equal(token_writer_add(w, d1, 3), SPES_OK);
    assert_int_equal(token_writer_add(w, d2, 1), SPES_OK);   // fills shard 1 exactly
    assert_int_equal(token_writer_add(w, d3, 2), SPES_OK);   // shard 2
    assert_int_equal(token_writer_add(w, d4, 4), SPES_OK);   // 2 + 4 > 4: shard 3
    assert_int_equal(token_writer_add(w, d5, 5), SPES_OK);   // alone and larger than the limit: shard 4
    uint64_t shards;
    assert_int_equal(token_writer_close(w, &shards), SPES_OK);
    assert_int_equal(shards, 4);
    expect_shard(prefix, 7, 1, (const uint8_t[]){1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}, 16);
    expect_shard(prefix, 7, 2, (const uint8_t[]){5, 0, 0, 0, 6, 0, 0, 0}, 8);
    expect_shard(prefix, 7, 4, (const uint8_t[]){11, 0, 0, 0, 12, 0, 0, 0, 13, 0, 0, 0, 14, 0, 0, 0, 15, 0, 0, 0}, 20);
    // uint16, little-endian; an id above 65535 is refused.
    assert_int_equal(token_writer_open(prefix, 8, 1 << 20, 2, &w), SPES_OK);
    uint32_t d6[] = {0x1234, 65535};
    assert_int_equal(token_writer_add(w, d6, 2), SPES_OK);
    uint32_t too_big = 65536;
    assert_int_equal(token_writer_add(w, &too_big, 1), SPES_ERR);
    token_writer_abort(w);
    char path[600];
    snprintf(path, sizeof path, "%s008_000001.npy", prefix);
    assert_false(file_exists(path));   // aborted: nothing visible
    remove_tree(dir);
    free(dir);
}

static void test_uint16_refused_for_big_vocab(void **state) {
    (void)state;
    char *dir = temp_dir();
    json_t *added = json_array();
    json_array_append_new(added, added_token("<|endoftext|>", 70000, 1, 0));
    json_t *j = make_tokenizer(NULL, NULL, added, NULL, NULL);
    // HF keeps an added token's id only where the vocab has it: put EOS at 70000 there too.
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "<|endoftext|>", json_integer(70000));
    char tok_path[600], in_path[600], prefix[600], glob[600];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    snprintf(in_path, sizeof in_path, "%s/in.txt", dir);
    snprintf(prefix, sizeof prefix, "%s/out/t_", dir);
    snprintf(glob, sizeof glob, "%s/*.txt", dir);
    assert_int_equal(json_dump_file(j, tok_path, 0), 0);
    json_decref(j);
    assert_int_equal(file_write_atomic(in_path, "hello", 5), SPES_OK);
    char *argv[] = {"tokenize", "--file_glob", glob, "--tokenizer_name_or_path", dir, "--output_prefix", prefix,
                    "--dtype", "uint16", NULL};
    assert_int_not_equal(cmd_tokenize(9, argv), 0);
    assert_non_null(strstr(spes_last_error(), "uint16"));
    char out_dir[620];
    snprintf(out_dir, sizeof out_dir, "%s/out", dir);
    assert_false(dir_exists(out_dir));   // refused before any work
    // uint32 works and writes "hello" + EOS (70000).
    argv[8] = "uint32";
    assert_int_equal(cmd_tokenize(9, argv), 0);
    char shard[700];
    snprintf(shard, sizeof shard, "%s000_000001.npy", prefix);
    uint8_t *data;
    size_t len;
    assert_int_equal(file_read_all(shard, &data, &len), SPES_OK);
    assert_int_equal(len, 6 * 4);
    uint32_t last;
    memcpy(&last, data + 20, 4);
    assert_int_equal(last, 70000);
    free(data);
    // The training loader reads the shard: 2 instances of 3 tokens, "hel" and "lo" + EOS.
    TokenDataset *ds;
    char *paths[] = {shard};
    assert_int_equal(token_dataset_open(paths, 1, MEMMAP_UINT32, 3, 70001, &ds), SPES_OK);
    assert_int_equal(token_dataset_len(ds), 2);
    int32_t inst[3];
    assert_int_equal(token_dataset_get(ds, 1, inst), SPES_OK);
    assert_int_equal(inst[0], 'l');
    assert_int_equal(inst[1], 'o');
    assert_int_equal(inst[2], 70000);
    token_dataset_close(ds);
    remove_tree(dir);
    free(dir);
}

// A document HF could not encode (invalid UTF-8) is skipped and reported, not fatal.
static void test_tokenize_skips_invalid_utf8(void **state) {
    (void)state;
    char *dir = temp_dir();
    char bad[600], good[600], prefix[600], glob[600], shard[700];
    snprintf(bad, sizeof bad, "%s/a.txt", dir);
    snprintf(good, sizeof good, "%s/b.txt", dir);
    snprintf(prefix, sizeof prefix, "%s/out/t_", dir);
    snprintf(glob, sizeof glob, "%s/*.txt", dir);
    assert_int_equal(file_write_atomic(bad, "bad \xff", 5), SPES_OK);
    assert_int_equal(file_write_atomic(good, " ok\n", 4), SPES_OK);
    json_t *added = json_array();
    json_array_append_new(added, added_token("</s>", 256, 1, 0));
    char tok_path[600];
    snprintf(tok_path, sizeof tok_path, "%s/tok.json", dir);
    json_t *j = make_tokenizer(NULL, NULL, added, NULL, NULL);
    assert_int_equal(json_dump_file(j, tok_path, 0), 0);
    json_decref(j);
    char *argv[] = {"tokenize", "--file_glob", glob, "--tokenizer_name_or_path", tok_path, "--output_prefix", prefix, NULL};
    assert_int_equal(cmd_tokenize(7, argv), 0);
    snprintf(shard, sizeof shard, "%s000_000001.npy", prefix);
    uint8_t *data;
    size_t len;
    assert_int_equal(file_read_all(shard, &data, &len), SPES_OK);
    uint32_t want[] = {'o', 'k', 256};   // stripped "ok" + EOS "</s>"; a.txt skipped
    assert_int_equal(len, sizeof want);
    assert_memory_equal(data, want, sizeof want);
    free(data);
    remove_tree(dir);
    free(dir);
}

// One shared Tokenizer, one encoder per thread: identical ids from concurrent encodes.
typedef struct {
    const Tokenizer *tok;
    const char *text;
    IdBuffer ids;
    int rc;
} EncodeJob;

static void *encode_job(void *arg) {
    EncodeJob *job = arg;
    TokenEncoder *enc;
    job->rc = tokenizer_encoder_new(job->tok, &enc);
    for (int rep = 0; job->rc == SPES_OK && rep < 50; rep++) {
        job->ids.len = 0;
        job->rc = tokenizer_encode(enc, job->text, strlen(job->text), &job->ids);
    }
    tokenizer_encoder_free(enc);
    return NULL;
}

static void test_concurrent_encoders(void **state) {
    (void)state;
    const char *extra[] = {"ab", "bc", "abc", NULL};
    const char *merges[] = {"a b", "b c", "ab c", NULL};
    json_t *added = json_array();
    json_array_append_new(added, added_token("<|endoftext|>", 259, 1, 0));
    Tokenizer *tok;
    assert_int_equal(load(make_tokenizer(extra, merges, added, json_pack("{s:s}", "type", "NFC"), NULL), &tok), SPES_OK);
    const char *text = "abc abcab e\xcc\x81 <|endoftext|>bcab 12345 abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabc";
    EncodeJob jobs[4];
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (EncodeJob){.tok = tok, .text = text};
        assert_int_equal(pthread_create(&threads[i], NULL, encode_job, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_join(threads[i], NULL), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(jobs[i].rc, SPES_OK);
        assert_int_equal(jobs[i].ids.len, jobs[0].ids.len);
        assert_memory_equal(jobs[i].ids.ids, jobs[0].ids.ids, jobs[0].ids.len * sizeof(uint32_t));
    }
    for (int i = 0; i < 4; i++) id_buffer_free(&jobs[i].ids);
    tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_merge_order),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_inconsistent_ids_refused),
        cmocka_unit_test(test_far_vocab_id_refused),
        cmocka_unit_test(test_oniguruma_escapes),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_byte_level_alphabet),
        cmocka_unit_test(test_unsupported_features),
        cmocka_unit_test(test_bytes_tokenizer_and_invalid_utf8),
        cmocka_unit_test(test_linear_matches_heap),
        cmocka_unit_test(test_doc_clean),
        cmocka_unit_test(test_shard_boundaries),
        cmocka_unit_test(test_uint16_refused_for_big_vocab),
        cmocka_unit_test(test_tokenize_skips_invalid_utf8),
        cmocka_unit_test(test_concurrent_encoders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
