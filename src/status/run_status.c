#include "status/run_status.h"

#include <stdlib.h>
#include <string.h>

const char *peer_liveness_name(PeerLiveness l) {
    switch (l) {
    case PEER_ALIVE: return "alive";
    case PEER_LATE: return "late";
    case PEER_MISSING: return "missing";
    case PEER_UNSEEN: break;
    }
    return "unseen";
}

int run_status_alloc(RunStatus *s, int num_peers) {
    memset(s, 0, sizeof *s);
    s->num_peers = num_peers;
    s->peers = calloc((size_t)(num_peers > 0 ? num_peers : 1), sizeof *s->peers);
    s->round_history = calloc(RUN_STATUS_ROUNDS, sizeof *s->round_history);
    if (!s->peers || !s->round_history) {
        run_status_free(s);
        return -1;
    }
    for (int p = 0; p < num_peers; p++) {
        s->peers[p].peer = p;
        s->peers[p].last_upload_step = -1;
        if (!(s->peers[p].points = calloc(RUN_STATUS_POINTS, sizeof *s->peers[p].points))) {
            run_status_free(s);
            return -1;
        }
    }
    return 0;
}

void run_status_free(RunStatus *s) {
    if (s->peers)
        for (int p = 0; p < s->num_peers; p++) free(s->peers[p].points);
    free(s->peers);
    free(s->round_history);
    memset(s, 0, sizeof *s);
}
