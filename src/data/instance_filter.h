// OLMo's instance filter (data.instance_filter): a training instance in which some short token
// pattern repeats many times in a row (degenerate web text: "ha ha ha ...", runs of one
// token) keeps its inputs but has its loss masked out (OLMo sets its labels to -100).
//
// OLMo finds the repeats with find_periodic_sequences (olmo/data/util.py) and masks an instance
// when one of them, of period p in [min_period, min(max_period, n / 3)], covers max_count or
// more periods. Its row-matrix sweep is equivalent to this scan, which we run instead: for each
// period p, a maximal stretch of positions i >= p with ids[i] == ids[i - p], of length len,
// is the repetition [i0 - p, i0 + len) covering (len + p) / p periods; OLMo reports only those
// covering 3 or more (len >= 2p), in order of period, then position. The equivalence is tested
// against OLMo's own function on random and planted inputs (tests/ref/instance_filter_ref.py).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

typedef struct {
    int start, end;   // [start, end): the tokens the repetition covers
    int period;
    int times;        // (end - start) / period, at least 3
} Repetition;

// Called for each repetition in OLMo's order; return false to stop the scan.
typedef bool (*RepetitionFn)(void *ctx, const Repetition *r);

// Every repetition of ids[0..n) with a period in [min_period, min(max_period, n / 3)].
void find_periodic_sequences(const int32_t *ids, int n, int min_period, int max_period, RepetitionFn fn, void *ctx);

// Whether OLMo trains on this instance: false when a repetition covers f->max_count periods or
// more. Always true when the filter is off.
bool instance_filter_keeps(const InstanceFilterConfig *f, const int32_t *ids, int n);
