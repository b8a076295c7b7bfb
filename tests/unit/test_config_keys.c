// docs/config-keys.md is generated from the key table; this test fails when they disagree.
// Regenerate with: build/tests/test_config_keys --write-docs docs/config-keys.md
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "config/config.h"

static char *generated_markdown(size_t *len) {
    char *text = NULL;
    FILE *mem = open_memstream(&text, len);
    config_write_keys_markdown(mem);
    fclose(mem);
    return text;
}

static void test_docs_match_table(void **state) {
    (void)state;
    size_t gen_len;
    char *gen = generated_markdown(&gen_len);
    uint8_t *doc;
    size_t doc_len;
    if (file_read_all("docs/config-keys.md", &doc, &doc_len) != SPES_OK)
        fail_msg("%s (run from the repository root)", spes_last_error());
    if (doc_len != gen_len || memcmp(doc, gen, gen_len) != 0)
        fail_msg("docs/config-keys.md is stale: regenerate with "
                 "<build>/tests/test_config_keys --write-docs docs/config-keys.md");
    free(doc);
    free(gen);
}

// Every row names a status; the seeds' GPU-only keys are in the table as ignored.
static void test_table_content(void **state) {
    (void)state;
    size_t len;
    char *gen = generated_markdown(&len);
    assert_non_null(strstr(gen, "| `compile` |  | ignored |"));
    // data parallelism inside a node (src/parallel/, docs/distributed.md)
    assert_non_null(strstr(gen, "| `distributed_strategy` | `\"fsdp\"` | supported |"));
    assert_non_null(strstr(gen, "| `fsdp.sharding_strategy` | `\"FULL_SHARD\"` | supported |"));
    assert_non_null(strstr(gen, "| `ddp.bucket_cap_mb` | `25` | supported |"));
    assert_non_null(strstr(gen, "| `optimizer.learning_rate` | `0.0001` | supported |"));
    assert_non_null(strstr(gen, "| `model.activation_type` | `swiglu` | fixed |"));
    assert_non_null(strstr(gen, "| `data.instance_filter` | `null` | supported | OLMo's repetition filter"));
    free(gen);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-docs") == 0) {
        size_t len;
        char *gen = generated_markdown(&len);
        int rc = file_write_atomic(argv[2], gen, len);
        free(gen);
        if (rc != SPES_OK) fprintf(stderr, "%s\n", spes_last_error());
        return rc == SPES_OK ? 0 : 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_match_table),
        cmocka_unit_test(test_table_content),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
