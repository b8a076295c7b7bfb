// libFuzzer harness: the document reader (line splitting, over-long records read past, JSON
// lines / JSON array / .txt sources) on arbitrary bytes with a small, input-chosen limit per
// document. The first byte picks the format and the limit (1..32 bytes, so the skip path runs
// often); the rest is the file.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "documents/doc_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const ext[4] = {"jsonl", "json", "txt", "jsonl"};
    char path[64];
    snprintf(path, sizeof path, "/tmp/spes_fuzz_doc_%d.%s", (int)getpid(), ext[data[0] & 3]);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (size > 1) fwrite(data + 1, 1, size - 1, f);
    fclose(f);
    DocReader *r = NULL;
    if (doc_reader_open(path, "text", NULL, NULL, &r) == 0) {
        size_t limit = (data[0] & 4) ? (size_t)(data[0] >> 3) + 1 : DOC_READER_MAX_DOC_BYTES;
        if (doc_reader_set_max_doc_bytes(r, limit) == 0) {
            const char *text;
            size_t len;
            volatile char sink = 0;
            while (doc_reader_next(r, &text, &len) == 1)
                if (len) {
                    if (len > limit) abort();   // the bound holds
                    sink ^= text[0] ^ text[len - 1];
                }
        }
        doc_reader_close(r);
    }
    unlink(path);
    return 0;
}
