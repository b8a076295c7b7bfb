// The CUDA backend's entry points, callable from C (src/ops/backend.c opens it when the
// binary was built with nvcc, i.e. SPES_WITH_CUDA is defined).
#pragma once
#include "ops/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// GPUs visible to this process; 0 when there is no driver or no device (never an error).
int cuda_device_count(void);
// Opens GPU `device` with the given precision (compute type bf16 / f16 / f32). *out is
// closed with backend_close. Errors name the device and CUDA's reason.
int cuda_backend_open(int device, Precision precision, Backend **out);
// The architectures compiled in, e.g. "sm_80,sm_89,sm_90".
const char *cuda_archs(void);
// Free and total memory of GPU `device` (cudaMemGetInfo), in bytes.
int cuda_device_memory(int device, size_t *free_bytes, size_t *total_bytes);

#ifdef __cplusplus
}
#endif
