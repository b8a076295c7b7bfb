#include "data/token_ids_check.h"

#include <inttypes.h>

#include "base/error.h"

// Ids per block: the max of a block is computed without branches (vectorised); only a block
// whose max is out of range is walked again to find the first bad id.
#define BLOCK 4096

typedef uint16_t u16_any __attribute__((aligned(1)));   // raw files map at any offset after a header
typedef uint32_t u32_any __attribute__((aligned(1)));

static int report(const TokenFile *tf, const char *path, uint64_t i, int64_t id, int64_t vocab_size) {
    uint64_t byte = (uint64_t)(tf->data - tf->file.data) + i * tf->elem_size;
    return spes_fail("data file %s: token %" PRIu64 " (byte offset %" PRIu64 ") has id %" PRId64
                     ", outside model.vocab_size %" PRId64 ": the file was tokenized for another vocabulary, "
                     "has the wrong data.memmap_dtype, or is damaged",
                     path, i, byte, id, vocab_size);
}

int token_ids_check(const TokenFile *tf, const char *path, int64_t vocab_size) {
    if (vocab_size <= 0) return SPES_OK;
    uint64_t n = tf->count;
    if (tf->dtype == TOKEN_U16) {
        if (vocab_size > UINT16_MAX) return SPES_OK;   // every uint16 is a valid id
        const u16_any *p = (const u16_any *)tf->data;
        for (uint64_t b = 0; b < n; b += BLOCK) {
            uint64_t e = b + BLOCK < n ? b + BLOCK : n;
            uint16_t m = 0;
            for (uint64_t i = b; i < e; i++) m = p[i] > m ? p[i] : m;
            if (m < vocab_size) continue;
            for (uint64_t i = b; i < e; i++)
                if (p[i] >= vocab_size) return report(tf, path, i, p[i], vocab_size);
        }
        return SPES_OK;
    }
    if (tf->dtype == TOKEN_U32) {
        const u32_any *p = (const u32_any *)tf->data;
        for (uint64_t b = 0; b < n; b += BLOCK) {
            uint64_t e = b + BLOCK < n ? b + BLOCK : n;
            uint32_t m = 0;
            for (uint64_t i = b; i < e; i++) m = p[i] > m ? p[i] : m;
            if (m < (uint64_t)vocab_size) continue;
            for (uint64_t i = b; i < e; i++)
                if (p[i] >= (uint64_t)vocab_size) return report(tf, path, i, p[i], vocab_size);
        }
        return SPES_OK;
    }
    // The other .npy dtypes (u1, i4, u8, i8): rare, read element by element.
    int is_signed = tf->dtype == TOKEN_I32 || tf->dtype == TOKEN_I64;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = token_file_get(tf, i);
        int64_t id = tf->dtype == TOKEN_I32 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
        if ((is_signed && id < 0) || (!is_signed && v >= (uint64_t)vocab_size) || (is_signed && id >= vocab_size))
            return report(tf, path, i, id, vocab_size);
    }
    return SPES_OK;
}
