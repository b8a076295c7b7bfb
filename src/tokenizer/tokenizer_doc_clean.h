// What SPES's tokenize_data.py does to every document before encoding it, so our token files
// match its: Python's str.strip() (a document that strips to nothing is dropped), then
// text.replace("<extra_id_1>", "") (not stripped again: "<extra_id_1>" alone becomes an empty
// document, which still gets its EOS).
#pragma once
#include <stddef.h>

typedef struct {
    char *buf;
    size_t cap;
} DocCleanScratch;

// Returns 0 when the document is dropped, 1 with *out/*out_len (pointing into text or the
// scratch), or SPES_ERR when out of memory.
int doc_clean(DocCleanScratch *s, const char *text, size_t len, const char **out, size_t *out_len);
void doc_clean_free(DocCleanScratch *s);
