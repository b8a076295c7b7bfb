// The step an aggregate states (see aggregate_step.h).
#include "sync/aggregate_step.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"

int sync_aggregate_stated_step(const SafeTensors *st, const char *what, int *step) {
    *step = -1;
    const char *text = safetensors_meta(st, SYNC_META_STEP);
    if (!text) return SPES_OK;
    char *end = NULL;
    long value = text[0] >= '0' && text[0] <= '9' ? strtol(text, &end, 10) : -1;
    if (value < 0 || value > INT32_MAX || *end)
        return spes_fail("%s: its %s '%.32s' is not a step", what, SYNC_META_STEP, text);
    *step = (int)value;
    return SPES_OK;
}

int sync_aggregate_check_step(const uint8_t *bytes, size_t len, int asked, const char *server) {
    SafeTensors st;
    if (safetensors_parse(bytes, len, "aggregate", &st) != SPES_OK) {
        spes_clear_error();
        return SPES_OK;
    }
    char what[300];
    snprintf(what, sizeof what, "server %s: the aggregate of step %d", server, asked);
    int stated = -1;
    int rc = sync_aggregate_stated_step(&st, what, &stated);
    safetensors_close(&st);
    if (rc != SPES_OK || stated < 0 || stated == asked) return rc;
    return spes_fail("server %s: asked for the aggregate of step %d, it sent the aggregate of step %d (its %s): a "
                     "server serving another round's aggregate, or a broken one; not loaded",
                     server, asked, stated, SYNC_META_STEP);
}
