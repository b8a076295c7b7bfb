#include "sync/call_status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/printable.h"

grpc_status_code status_fail(grpc_status_code code, const char *fmt, ...) {
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    spes_fail("%s", message);
    return code;
}

void log_refusal(const char *what) {
    // Messages quote what peers sent (tensor names, method names): escaped, so that a peer
    // cannot write terminal escape sequences or fake log lines into the server's log.
    char safe_what[256], safe[4096];
    const char *error = spes_last_error();
    log_warn("server: %s refused: %s", escape_printable(what, strlen(what), safe_what, sizeof safe_what),
             escape_printable(error, strlen(error), safe, sizeof safe));
}
