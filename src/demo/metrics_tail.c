#include "demo/metrics_tail.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"

static void forget(MetricsTail *t) {
    t->offset = 0;
    t->step = 0;
    t->loss = NAN;
    t->tokens_per_s = NAN;
}

int metrics_tail_init(MetricsTail *t, const char *path) {
    memset(t, 0, sizeof *t);
    forget(t);
    t->path = spes_strdup(path);
    return t->path ? SPES_OK : SPES_ERR;
}

void metrics_tail_free(MetricsTail *t) {
    free(t->path);
    t->path = NULL;
}

// The progress a training record shows (a line that does not parse shows none).
static void take_record(MetricsTail *t, const char *line) {
    t->step = 0, t->loss = NAN, t->tokens_per_s = NAN;
    json_t *j = json_loads(line, 0, NULL);
    if (!j) return;
    t->step = json_integer_value(json_object_get(j, "step"));
    t->loss = json_real_value(json_object_get(j, "ce"));
    t->tokens_per_s = json_real_value(json_object_get(json_object_get(j, "perf"), "tokens_per_s"));
    json_decref(j);
}

void metrics_tail_poll(MetricsTail *t) {
    FILE *fp = fopen(t->path, "r");
    if (!fp) return;
    struct stat st;
    if (fstat(fileno(fp), &st) == 0) {
        if (st.st_size < t->offset || st.st_dev != t->dev || st.st_ino != t->ino) forget(t);
        t->dev = st.st_dev;
        t->ino = st.st_ino;
    }
    if (fseeko(fp, t->offset, SEEK_SET) != 0) {
        fclose(fp);
        return;
    }
    // Only the newest complete training line matters: keep it in `last`, read into `line`.
    char *line = NULL, *last = NULL;
    size_t line_cap = 0, last_cap = 0;
    ssize_t n;
    while ((n = getline(&line, &line_cap, fp)) > 0) {
        if (line[n - 1] != '\n') break;   // still being written: read it whole next time
        t->offset += n;
        if (strstr(line, "\"eval\"")) continue;
        char *swap = last;
        size_t swap_cap = last_cap;
        last = line, last_cap = line_cap;
        line = swap, line_cap = swap_cap;
    }
    if (last) take_record(t, last);
    free(line);
    free(last);
    fclose(fp);
}
