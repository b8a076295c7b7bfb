// libFuzzer harness: token files (raw or .npy header) on arbitrary bytes.
#include <stdint.h>
#include <stdlib.h>

#include "io/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    TokenFile tf;
    if (token_file_parse(data, size, TOKEN_U16, "fuzz.npy", &tf) != 0) return 0;
    // Every token the parser promised must be readable.
    uint32_t buf[64];
    for (uint64_t at = 0; at < tf.count; at += 64) {
        size_t n = tf.count - at < 64 ? (size_t)(tf.count - at) : 64;
        if (token_file_read_u32(&tf, at, n, buf) != 0) break;
    }
    if (tf.count) (void)token_file_get(&tf, tf.count - 1);
    return 0;
}
