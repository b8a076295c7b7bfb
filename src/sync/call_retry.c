// Which failed calls a peer repeats (call_retry.h).
#include "sync/call_retry.h"

#include <string.h>

SyncRetry sync_call_retry(grpc_status_code code, const char *message) {
    if (code == GRPC_STATUS_UNAVAILABLE) return SYNC_RETRY_UNREACHABLE;
    if (code != GRPC_STATUS_RESOURCE_EXHAUSTED || !message) return SYNC_RETRY_NO;
    if (strstr(message, "server busy")) return SYNC_RETRY_BUSY;
    if (strstr(message, SYNC_AGGREGATION_RETRY_MESSAGE)) return SYNC_RETRY_AGGREGATION;
    // The code 11 must end the number: "code 110" is no HTTP/2 error, and not this one.
    const char *reset = strstr(message, SYNC_QUOTA_RESET_MESSAGE);
    if (reset) {
        char after = reset[strlen(SYNC_QUOTA_RESET_MESSAGE)];
        if (after < '0' || after > '9') return SYNC_RETRY_QUOTA_RESET;
    }
    return SYNC_RETRY_NO;
}
