#include "base/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

void *spes_alloc_aligned(size_t nbytes) {
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded < nbytes) {
        spes_fail("allocation size overflow (%zu bytes)", nbytes);
        return NULL;
    }
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) {
        spes_fail("out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

void spes_free_aligned(void *ptr) { free(ptr); }

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
