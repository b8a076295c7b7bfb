#include "server/round_deadline.h"

#include <string.h>

double rounds_deadline(double round_timeout_s, const double *recent, int n) {
    if (n > ROUNDS_RECENT) n = ROUNDS_RECENT;
    if (n <= 0) return round_timeout_s;   // nothing known yet (recent may be NULL)
    double sorted[ROUNDS_RECENT];
    memcpy(sorted, recent, (size_t)n * sizeof *sorted);
    for (int i = 1; i < n; i++)   // insertion sort of at most 8 values
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            double x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    return 3 * median > round_timeout_s ? 3 * median : round_timeout_s;
}

RoundWaitDecision round_wait_decide(const RoundWait *w, double *due) {
    *due = 0;
    if (w->round_timeout_s <= 0)
        return ROUND_KEEP_WAITING;
    double deadline = w->opened_at + rounds_deadline(w->round_timeout_s, w->recent, w->n_recent);
    if (w->now < deadline) {
        *due = deadline;
        return ROUND_KEEP_WAITING;
    }
    if (w->uploaded < w->min_peers || (w->needs_earlier && !w->have_earlier)) {
        *due = w->now + 1;   // an upload may complete the quorum
        return ROUND_PAST_DEADLINE_NO_QUORUM;
    }
    return ROUND_CLOSE_PARTIAL;
}
