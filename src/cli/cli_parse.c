#include "cli/cli_parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/file.h"

int cli_int(const char *flag, const char *text, long min, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        return spes_fail("--%s: '%s' is not an integer in [%ld, %ld]", flag, text, min, max);
    *out = (int)v;
    return SPES_OK;
}

int cli_u64(const char *flag, const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-')
        return spes_fail("--%s: '%s' is not a non-negative integer", flag, text);
    *out = (uint64_t)v;
    return SPES_OK;
}

int cli_float(const char *flag, const char *text, double min, double max, float *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < min || v > max)
        return spes_fail("--%s: '%s' is not a number in [%g, %g]", flag, text, min, max);
    *out = (float)v;
    return SPES_OK;
}

const char *cli_default_tokenizer(const char *model_dir) {
    char *path = model_dir ? path_join(model_dir, "tokenizer.json") : NULL;
    int found = path && file_exists(path);
    free(path);
    return found ? model_dir : NULL;
}

int cli_report_error(void) {
    fprintf(stderr, "spes: %s\n", spes_last_error());
    return 1;
}
