// libFuzzer harness: the config loader (libyaml tree, overrides, interpolation, key table,
// validation) on arbitrary text. A first line starting with "--" is used as an override.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    log_set_level(LOG_ERROR);   // unknown-key warnings would flood the fuzzer output
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char *yaml = text, *override = NULL;
    if (strncmp(text, "--", 2) == 0) {
        char *nl = strchr(text, '\n');
        if (nl) {
            *nl = '\0';
            yaml = nl + 1;
        } else {
            yaml = text + size;
        }
        override = text;
    }
    TrainConfig cfg;
    if (config_load_string(yaml, "fuzz.yaml", override ? 1 : 0, &override, &cfg) == 0) {
        (void)config_hash(&cfg);
        config_free(&cfg);
    }
    free(text);
    return 0;
}
