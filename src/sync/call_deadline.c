#include "sync/call_deadline.h"

double sync_call_deadline(size_t bytes, int sharing, double cap_s) {
    double deadline = SYNC_CALL_FLOOR_S + (double)bytes * (sharing > 1 ? sharing : 1) / SYNC_MIN_RATE;
    return cap_s > 0 && deadline > cap_s ? cap_s : deadline;
}

size_t sync_download_chunk_bytes(size_t total, int chunks, size_t chunk_size) {
    if (chunk_size == 0) chunk_size = chunks > 1 ? (total + (size_t)chunks - 1) / (size_t)chunks : total;
    return chunk_size < total ? chunk_size : total;
}

SyncDeadlineSide sync_deadline_side(double elapsed_s, double deadline_s, bool own_timer) {
    return own_timer || elapsed_s >= deadline_s - SYNC_DEADLINE_SLACK_S ? SYNC_DEADLINE_PEER : SYNC_DEADLINE_SERVER;
}
