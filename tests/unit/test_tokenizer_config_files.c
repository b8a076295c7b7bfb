// A tokenizer directory's config files (tokenizer_config.json, special_tokens_map.json), on a
// temporary directory holding ../shared/data's gpt-neox-olmo.json as tokenizer.json: each is
// parsed once per load, and the EOS is the one Hugging Face's AutoTokenizer picks
// (tests/integration/tokenizer_eos_files.sh checks the same against transformers itself).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   // memmem, RTLD_NEXT
#endif
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "tokenizer/tokenizer.h"

// In gpt-neox-olmo.json: <|padding|> is id 1, <|endoftext|> id 50279 (also the EOS by convention).
#define PADDING 1
#define ENDOFTEXT 50279

// Config texts holding MARKER are counted when jansson parses them. The definitions below take
// the place of libjansson's for the code linked into this program and forward to it.
#define MARKER "spes-parse-count"
static int marked_parses;

json_t *json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error) {
    static json_t *(*real)(const char *, size_t, size_t, json_error_t *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "json_loadb");
    if (memmem(buffer, buflen, MARKER, strlen(MARKER))) marked_parses++;
    return real(buffer, buflen, flags, error);
}

json_t *json_loads(const char *input, size_t flags, json_error_t *error) {
    static json_t *(*real)(const char *, size_t, json_error_t *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "json_loads");
    if (strstr(input, MARKER)) marked_parses++;
    return real(input, flags, error);
}

static char dir[] = "/tmp/spes_tok_config_XXXXXX";
static bool have_data;   // ../shared/data's tokenizer is there (the tests are skipped otherwise)

// Writes <dir>/<name> (text NULL: removes it).
static void put(const char *name, const char *text) {
    char *path = path_join(dir, name);
    if (text) assert_int_equal(file_write_atomic(path, text, strlen(text)), SPES_OK);
    else remove(path);
    free(path);
}

// The EOS (or BOS) id of the directory with these config files (NULL: no such file).
static int64_t id_with(int64_t (*which)(const Tokenizer *), const char *tokenizer_config, const char *special_tokens_map) {
    put("tokenizer_config.json", tokenizer_config);
    put("special_tokens_map.json", special_tokens_map);
    Tokenizer *tok;
    if (tokenizer_load(dir, &tok) != SPES_OK) fail_msg("tokenizer_load: %s", spes_last_error());
    int64_t id = which(tok);
    tokenizer_free(tok);
    return id;
}

static int64_t eos_with(const char *tokenizer_config, const char *special_tokens_map) {
    return id_with(tokenizer_eos_id, tokenizer_config, special_tokens_map);
}

// tokenizer_config.json was parsed twice per load: once to refuse a broken file, once for its
// eos_token. Once now, the same EOS.
static void test_config_parsed_once(void **state) {
    (void)state;
    if (!have_data) skip();
    marked_parses = 0;
    assert_int_equal(eos_with("{\"eos_token\": \"<|padding|>\", \"x\": \"" MARKER "\"}", NULL), PADDING);
    assert_int_equal(marked_parses, 1);
    // A broken file is still refused, with the same message.
    put("tokenizer_config.json", "{\"eos_token\": \"<|padding|>\",\n");
    Tokenizer *tok;
    assert_int_equal(tokenizer_load(dir, &tok), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "tokenizer_config.json: invalid JSON at line 2"));
    put("tokenizer_config.json", "[\"eos_token\"]");
    assert_int_equal(tokenizer_load(dir, &tok), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "tokenizer_config.json is not a JSON object"));
    // The in-memory entry parses its config text once too.
    uint8_t *json;
    size_t len;
    char *path = path_join(dir, "tokenizer.json");
    assert_int_equal(file_read_all(path, &json, &len), SPES_OK);
    marked_parses = 0;
    assert_int_equal(tokenizer_load_json((const char *)json, len, "{\"eos_token\": {\"content\": \"<|padding|>\"}, \"x\": \"" MARKER "\"}",
                                         path, &tok),
                     SPES_OK);
    assert_int_equal(marked_parses, 1);
    assert_int_equal(tokenizer_eos_id(tok), PADDING);
    tokenizer_free(tok);
    free(json);
    free(path);
}

// What transformers 5.23's AutoTokenizer gives for each pair of files (checked with the .venv;
// 4.x reads them the same way): a tokenizer_config.json without "added_tokens_decoder" (legacy)
// has its keys overridden by special_tokens_map.json's, null included; one with it makes
// AutoTokenizer ignore that file, even a broken one. The EOS used to come from
// tokenizer_config.json alone whenever it existed.
#define ATD "\"added_tokens_decoder\": {\"1\": {\"content\": \"<|padding|>\", \"special\": true}}"
static void test_eos_precedence(void **state) {
    (void)state;
    if (!have_data) skip();
    // special_tokens_map.json alone, or beside a legacy config without eos_token (was: by convention)
    assert_int_equal(eos_with(NULL, "{\"eos_token\": \"<|padding|>\"}"), PADDING);
    assert_int_equal(eos_with("{\"model_max_length\": 8}", "{\"eos_token\": \"<|padding|>\"}"), PADDING);
    // both name one: special_tokens_map.json wins over a legacy config (was: tokenizer_config.json's)
    assert_int_equal(eos_with("{\"eos_token\": \"<|endoftext|>\"}", "{\"eos_token\": {\"content\": \"<|padding|>\"}}"),
                     PADDING);
    assert_int_equal(eos_with("{\"eos_token\": null}", "{\"eos_token\": \"<|padding|>\"}"), PADDING);
    assert_int_equal(eos_with("{\"eos_token\": \"<|padding|>\"}", "{\"eos_token\": null}"), -1);
    // ... and loses to one with added_tokens_decoder (as before), whose special_tokens_map.json is not read
    assert_int_equal(eos_with("{\"eos_token\": \"<|padding|>\", " ATD "}", "{\"eos_token\": \"<|endoftext|>\"}"), PADDING);
    assert_int_equal(eos_with("{\"eos_token\": \"<|padding|>\", " ATD "}", "{\"eos_token\": "), PADDING);
    assert_int_equal(eos_with("{\"eos_token\": \"<|endoftext|>\", \"added_tokens_decoder\": {}}",
                              "{\"eos_token\": \"<|padding|>\"}"),
                     ENDOFTEXT);
    // A file AutoTokenizer reads is refused when broken, naming it.
    put("tokenizer_config.json", "{\"eos_token\": \"<|padding|>\"}");
    put("special_tokens_map.json", "{\"eos_token\": ");
    Tokenizer *tok;
    assert_int_equal(tokenizer_load(dir, &tok), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "special_tokens_map.json: invalid JSON at line 1"));
    put("special_tokens_map.json", "[1]");
    assert_int_equal(tokenizer_load(dir, &tok), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "special_tokens_map.json is not a JSON object"));
    // Neither names one: by convention (AutoTokenizer has none), <|endoftext|> here.
    assert_int_equal(eos_with("{\"model_max_length\": 8}", "{\"bos_token\": \"<|padding|>\"}"), ENDOFTEXT);
}

// The BOS (lm-eval's prefix token for an empty context when there is one) from the same files
// in the same order; none by convention, as AutoTokenizer has none then.
static void test_bos_precedence(void **state) {
    (void)state;
    if (!have_data) skip();
    assert_int_equal(id_with(tokenizer_bos_id, NULL, NULL), -1);
    assert_int_equal(id_with(tokenizer_bos_id, "{\"eos_token\": \"<|endoftext|>\"}", NULL), -1);
    assert_int_equal(id_with(tokenizer_bos_id, "{\"bos_token\": \"<|padding|>\"}", NULL), PADDING);
    assert_int_equal(id_with(tokenizer_bos_id, NULL, "{\"bos_token\": {\"content\": \"<|endoftext|>\"}}"), ENDOFTEXT);
    assert_int_equal(id_with(tokenizer_bos_id, "{\"bos_token\": \"<|padding|>\"}", "{\"bos_token\": \"<|endoftext|>\"}"),
                     ENDOFTEXT);
    assert_int_equal(id_with(tokenizer_bos_id, "{\"bos_token\": \"<|padding|>\"}", "{\"bos_token\": null}"), -1);
    assert_int_equal(id_with(tokenizer_bos_id, "{\"bos_token\": \"<|padding|>\", " ATD "}", "{\"bos_token\": null}"),
                     PADDING);
    Tokenizer *tok;
    assert_int_equal(tokenizer_load("bytes", &tok), SPES_OK);
    assert_int_equal(tokenizer_bos_id(tok), -1);
    tokenizer_free(tok);
}

static int setup(void **state) {
    (void)state;
    if (!mkdtemp(dir)) return -1;
    const char *data = getenv("SPES_TEST_DATA") ? getenv("SPES_TEST_DATA") : "../shared/data";
    char *from = path_join(data, "tokenizers/gpt-neox-olmo.json"), *to = path_join(dir, "tokenizer.json");
    uint8_t *text = NULL;
    size_t len;
    have_data = from && to && file_exists(from);
    int ok = !have_data || (file_read_all(from, &text, &len) == SPES_OK && file_write_atomic(to, text, len) == SPES_OK);
    free(from);
    free(to);
    free(text);
    return ok ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return remove_tree(dir) == SPES_OK ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_parsed_once),
        cmocka_unit_test(test_eos_precedence),
        cmocka_unit_test(test_bos_precedence),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
