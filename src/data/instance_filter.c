// OLMo's instance filter as a run scan (the equivalence is argued in instance_filter.h).
#include "data/instance_filter.h"

void find_periodic_sequences(const int32_t *ids, int n, int min_period, int max_period, RepetitionFn fn, void *ctx) {
    if (max_period > n / 3) max_period = n / 3;   // a repetition covers 3 periods at least
    for (int p = min_period < 1 ? 1 : min_period; p <= max_period; p++) {
        int run = 0;   // length of the stretch of ids[i] == ids[i - p] ending before i
        for (int i = p; i <= n; i++) {
            if (i < n && ids[i] == ids[i - p]) {
                run++;
                continue;
            }
            if (run >= 2 * p) {
                Repetition r = {.start = i - run - p, .end = i, .period = p, .times = (run + p) / p};
                if (!fn(ctx, &r)) return;
            }
            run = 0;
        }
    }
}

typedef struct {
    int max_count;
    bool found;
} TooManyRepeats;

static bool stop_at_too_many(void *ctx, const Repetition *r) {
    TooManyRepeats *s = ctx;
    s->found = r->times >= s->max_count;
    return !s->found;
}

bool instance_filter_keeps(const InstanceFilterConfig *f, const int32_t *ids, int n) {
    if (!f->enabled) return true;
    TooManyRepeats s = {.max_count = f->max_count, .found = false};
    find_periodic_sequences(ids, n, f->min_period, f->max_period, stop_at_too_many, &s);
    return !s.found;
}
