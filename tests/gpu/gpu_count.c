// Prints how many GPUs this CUDA build sees (0 without a driver or device; never fails).
// tests/run_gpu.sh uses it to decide whether the compute-sanitizer pass can run.
#include <stdio.h>

#include "ops/cuda/cuda_backend.h"

int main(void) {
    printf("%d\n", cuda_device_count());
    return 0;
}
