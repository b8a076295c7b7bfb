// Checked allocation. Failures return NULL and leave an error message (never abort):
// a size read from a file may be absurd, and the caller reports that as bad input.
#pragma once
#include <stddef.h>

void *spes_malloc(size_t nbytes);
void *spes_calloc(size_t count, size_t size);     // checks count*size overflow
void *spes_realloc(void *ptr, size_t nbytes);
// 64-byte aligned, zeroed; free with spes_free_aligned (never free()). Large blocks are
// mapped lazily: pages cost memory only once written.
void *spes_alloc_aligned(size_t nbytes);
void spes_free_aligned(void *ptr);
char *spes_strdup(const char *s);
// Overflow-checked size arithmetic: returns 0 on overflow (and sets *out = 0).
int spes_mul_size(size_t a, size_t b, size_t *out);
