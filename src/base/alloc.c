#include "base/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/error.h"

void *spes_malloc(size_t nbytes) {
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) spes_fail("out of memory allocating %zu bytes", nbytes);
    return p;
}

void *spes_calloc(size_t count, size_t size) {
    size_t total;
    if (!spes_mul_size(count, size, &total)) {
        spes_fail("allocation size overflow (%zu x %zu)", count, size);
        return NULL;
    }
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) spes_fail("out of memory allocating %zu bytes", total);
    return p;
}

void *spes_realloc(void *ptr, size_t nbytes) {
    void *p = realloc(ptr, nbytes ? nbytes : 1);
    if (!p) spes_fail("out of memory reallocating %zu bytes", nbytes);
    return p;
}

// Aligned blocks carry a 64-byte header holding the size of their mapping (0 for heap
// blocks). Large blocks come straight from mmap: already zero and not resident until
// written, so a buffer that is allocated but never touched (the full gradient buffer
// between model_create and the trainable mask) costs no memory.
#define ALIGNED_HEADER 64
#define MMAP_THRESHOLD ((size_t)1 << 20)

void *spes_alloc_aligned(size_t nbytes) {
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    size_t total = rounded + ALIGNED_HEADER;
    if (rounded < nbytes || total < rounded) {
        spes_fail("allocation size overflow (%zu bytes)", nbytes);
        return NULL;
    }
    char *base;
    if (total >= MMAP_THRESHOLD) {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            spes_fail("out of memory allocating %zu bytes", nbytes);
            return NULL;
        }
        *(size_t *)base = total;
    } else {
        base = aligned_alloc(64, total);
        if (!base) {
            spes_fail("out of memory allocating %zu bytes", nbytes);
            return NULL;
        }
        memset(base, 0, total);
    }
    return base + ALIGNED_HEADER;
}

void spes_free_aligned(void *ptr) {
    if (!ptr) return;
    char *base = (char *)ptr - ALIGNED_HEADER;
    size_t mapped = *(size_t *)base;
    if (mapped) munmap(base, mapped);
    else free(base);
}

char *spes_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = spes_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

int spes_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) {
        *out = 0;
        return 0;
    }
    *out = a * b;
    return 1;
}
