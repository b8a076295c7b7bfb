// libFuzzer harness: the JSON field extractor of the .jsonl/.json readers on arbitrary bytes.
#include <stdint.h>

#include "documents/json_field.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    JsonScratch scratch = {0};
    const char *text;
    size_t len;
    char why[256];
    volatile char sink = 0;
    if (json_field_string((const char *)data, size, "text", &scratch, &text, &len, why, sizeof why) == JSON_FIELD_OK && len)
        sink ^= text[0] ^ text[len - 1];
    json_scratch_free(&scratch);
    return 0;
}
