// Shared by the optimizer and data-parallel unit tests: a parameter table by hand. Offsets
// laid out in order, gradient offsets compact over the trainable entries (as
// param_table_set_trainable does). Free with free(table.entries).
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "model/param_table.h"

typedef struct {
    const char *name;        // NULL: "t<i>"
    ParamKind kind;
    size_t numel;
    bool trainable;
} FlatTensor;

static inline ParamTable flat_table(const FlatTensor *specs, int n) {
    ParamTable t = {.entries = calloc((size_t)n, sizeof(ParamInfo)), .count = n};
    for (int i = 0; i < n; i++) {
        ParamInfo *p = &t.entries[i];
        if (specs[i].name)
            snprintf(p->name, sizeof p->name, "%s", specs[i].name);
        else
            snprintf(p->name, sizeof p->name, "t%d", i);
        p->kind = specs[i].kind;
        p->layer = p->expert = -1;
        p->ndim = 1;
        p->shape[0] = (int64_t)specs[i].numel;
        p->numel = specs[i].numel;
        p->offset = t.total_numel;
        p->trainable = specs[i].trainable;
        p->grad_offset = specs[i].trainable ? (ssize_t)t.trainable_numel : -1;
        t.total_numel += p->numel;
        if (p->trainable) t.trainable_numel += p->numel;
    }
    return t;
}
