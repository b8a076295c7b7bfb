// libFuzzer harness: the safetensors reader on arbitrary bytes (uploads, checkpoints, HF dirs).
#include <stdint.h>
#include <stdlib.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    SafeTensors st;
    if (safetensors_parse(data, size, "fuzz", &st) != 0) return 0;
    // Everything the parser accepted must be readable in full.
    for (int i = 0; i < st.count; i++) {
        const StTensor *t = &st.tensors[i];
        if (t->dtype == DTYPE_F32 || t->dtype == DTYPE_BF16 || t->dtype == DTYPE_F16 || t->dtype == DTYPE_F64) {
            float *dst = malloc(t->numel * sizeof(float) + 1);
            if (dst) safetensors_to_f32(t, dst);
            free(dst);
        }
    }
    safetensors_close(&st);
    return 0;
}
