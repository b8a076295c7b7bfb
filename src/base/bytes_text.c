#include "base/bytes_text.h"

#include <stdio.h>

char *bytes_text(size_t bytes, char *out, size_t cap) {
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 999.5 && u < 5) v /= 1000.0, u++;
    snprintf(out, cap, u == 0 ? "%.0f %s" : "%.3g %s", v, units[u]);
    return out;
}
