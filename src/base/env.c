#include "base/env.h"

#include <limits.h>
#include <stdlib.h>

int env_int(const char *name, int unset, int bad) {
    const char *v = getenv(name);
    if (!v || !*v) return unset;
    char *end;
    long x = strtol(v, &end, 10);
    return *end == '\0' && x >= 0 && x <= INT_MAX ? (int)x : bad;
}
