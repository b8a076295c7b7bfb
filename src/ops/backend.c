// Choosing a backend, names of types and precisions, and the thin helpers over the table.
#include "ops/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/host_memory.h"
#include "base/log.h"
#ifdef SPES_WITH_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

size_t num_type_size(NumType t) { return t == NUM_F32 ? 4 : 2; }

const char *num_type_name(NumType t) {
    static const char *const names[] = {"f32", "bf16", "f16"};
    return (unsigned)t < 3 ? names[t] : "?";
}

static const char *const precision_names[] = {"fp32", "amp_bf16", "amp_fp16"};

const char *precision_name(Precision p) { return (unsigned)p < 3 ? precision_names[p] : "?"; }

int precision_from_name(const char *s, Precision *out) {
    for (int i = 0; i < 3; i++)
        if (strcmp(s, precision_names[i]) == 0) {
            *out = (Precision)i;
            return SPES_OK;
        }
    return spes_fail("precision '%s': expected fp32, amp_bf16 or amp_fp16", s);
}

const char *backend_compiled(void) {
#ifdef SPES_WITH_CUDA
    static char text[96];
    snprintf(text, sizeof text, "cpu cuda(%s)", cuda_archs());
    return text;
#else
    return "cpu";
#endif
}

int backend_parse_device(const char *device, int *cuda_index) {
    *cuda_index = BACKEND_DEVICE_AUTO;
    if (!device || strcmp(device, "auto") == 0) return SPES_OK;
    *cuda_index = BACKEND_DEVICE_CPU;
    if (strcmp(device, "cpu") == 0) return SPES_OK;
    *cuda_index = 0;
    if (strcmp(device, "cuda") == 0) return SPES_OK;
    char *end;
    long n = strncmp(device, "cuda:", 5) == 0 ? strtol(device + 5, &end, 10) : -1;
    if (n < 0 || n > 1023 || device[5] == '\0' || *end != '\0')
        return spes_fail("device '%s': expected auto, cpu, cuda or cuda:N", device);
    *cuda_index = (int)n;
    return SPES_OK;
}

static int open_cpu(Precision precision, Backend **out) {
    if (precision != PRECISION_FP32)
        log_warn("precision %s: the cpu backend computes in fp32%s", precision_name(precision),
                 precision == PRECISION_AMP_FP16 ? " (dynamic loss scaling still runs; powers of two are exact)" : "");
    *out = backend_cpu();
    return SPES_OK;
}

#ifdef SPES_WITH_CUDA
// " (cuda:N)" when the device name did not say which GPU ("auto", "cuda"), else "".
static const char *resolved_note(const char *device, int index) {
    static _Thread_local char note[32];
    snprintf(note, sizeof note, "cuda:%d", index);
    if (device && strcmp(device, note) == 0) return "";
    snprintf(note, sizeof note, " (cuda:%d)", index);
    return note;
}
#endif

static bool gpu_visible(void) {
#ifdef SPES_WITH_CUDA
    return cuda_device_count() > 0;
#else
    return false;
#endif
}

int backend_open(const char *device, Precision precision, Backend **out) {
    return backend_open_for_rank(device, 0, precision, out);
}

int backend_open_for_rank(const char *device, int local_rank, Precision precision, Backend **out) {
    *out = NULL;
    int index;
    SPES_TRY(backend_parse_device(device, &index));
    // "cuda" without an index is this rank's GPU, as "auto" is when there are GPUs.
    if (device && strcmp(device, "cuda") == 0) index = local_rank;
    if (index == BACKEND_DEVICE_AUTO) {
        if (!gpu_visible()) return open_cpu(precision, out);
        index = local_rank;
    }
    if (index == BACKEND_DEVICE_CPU) return open_cpu(precision, out);
#ifdef SPES_WITH_CUDA
    int count = cuda_device_count();
    if (index >= count)
        return spes_fail("device %s%s: %s", device ? device : "auto", resolved_note(device, index),
                         count == 0 ? "no NVIDIA GPU is visible (driver missing, or CUDA_VISIBLE_DEVICES empty)"
                                    : "no such GPU (fewer are visible)");
    return cuda_backend_open(index, precision, out);
#else
    return spes_fail("device %s: this spes was built without CUDA (nvcc was not found at build time); "
                     "rebuild on a machine with the CUDA toolkit, or use device: cpu", device);
#endif
}

void backend_plan_traits(bool gpu, Precision precision, Backend *out) {
    memset(out, 0, sizeof *out);
    out->name = gpu ? "cuda" : "cpu";
    out->host_memory = !gpu;
    out->device = -1;
    out->precision = gpu ? precision : PRECISION_FP32;
    out->compute = !gpu                              ? NUM_F32
                   : precision == PRECISION_AMP_BF16 ? NUM_BF16
                   : precision == PRECISION_AMP_FP16 ? NUM_F16
                                                     : NUM_F32;
    // cuda: 256-byte logits rows in bf16/f16, and 1 GiB blocks (a few per micro-batch, so lm_head's
    // fp32 dW is read and written a few times, not once per 512 rows); cpu: dense 512-row blocks.
    out->logits_align = gpu ? 128 : 1;
    out->logits_block_bytes = gpu ? (size_t)1 << 30 : 0;
}

void backend_close(Backend *be) {
    if (be && be != backend_cpu()) be->ops->close(be);
}

int backend_device_memory(Backend *be, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
#ifdef SPES_WITH_CUDA
    if (!be->host_memory) return cuda_device_memory(be->device, free_bytes, total_bytes);
#endif
    HostMemory host;
    SPES_TRY(host_memory_read("/proc", "/sys/fs/cgroup", &host));
    *free_bytes = host.available;
    *total_bytes = host.total;
    return SPES_OK;
}

int backend_alloc(Backend *be, size_t bytes, void **out) { return be->ops->alloc(be, bytes, out); }
void backend_free(Backend *be, void *p) {
    if (p) be->ops->free(be, p);
}
int backend_sync(Backend *be) { return be->ops->sync(be); }

void linear_forward(Backend *be, Buf y, Buf x, Buf W, int N, int in, int out, bool accumulate) {
    be->ops->gemm(be, false, true, N, out, in, 1.0f, x, in, W, in, accumulate ? 1.0f : 0.0f, y, out);
}

void linear_forward_residual(Backend *be, Buf y, Buf resid, Buf x, Buf W, int N, int in, int out) {
    be->ops->gemm_residual(be, false, true, N, out, in, 1.0f, x, in, W, in, resid, y, out);
}

void linear_backward_input(Backend *be, Buf dx, Buf dy, Buf W, int N, int in, int out, bool accumulate) {
    be->ops->gemm(be, false, false, N, in, out, 1.0f, dy, out, W, in, accumulate ? 1.0f : 0.0f, dx, in);
}

void linear_backward_weight(Backend *be, float *dW, Buf dy, int ldy, Buf x, int N, int in, int out) {
    be->ops->gemm(be, true, false, out, in, N, 1.0f, dy, ldy, x, in, 1.0f, buf_f32(dW), in);
}
