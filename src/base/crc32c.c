#include "base/crc32c.h"

#include <isa-l/crc.h>
#include <limits.h>

// Intel ISA-L's crc32_iscsi is the reflected CRC-32C update without the initial and final
// inversions: the standard CRC is ~crc32_iscsi(data, len, ~0). Its length is an int: longer
// data goes in pieces.
uint32_t crc32c(const void *data, size_t len) {
    uint32_t crc = 0xffffffffu;
    const unsigned char *p = data;
    while (len > 0) {
        int n = len > INT_MAX ? INT_MAX : (int)len;
        crc = crc32_iscsi((unsigned char *)p, n, crc);
        p += n;
        len -= (size_t)n;
    }
    return ~crc;
}
