#include "sync/call_status.h"

#include <stdarg.h>

#include "base/error.h"

grpc_status_code status_fail(grpc_status_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    spes_failv(fmt, ap);
    va_end(ap);
    return code;
}
