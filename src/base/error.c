#include "base/error.h"

#include <stdio.h>
#include <string.h>

#define ERROR_CAPACITY 4096
static _Thread_local char error_message[ERROR_CAPACITY];

int spes_failv(const char *fmt, va_list ap) {
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    return SPES_ERR;
}

int spes_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    spes_failv(fmt, ap);
    va_end(ap);
    return SPES_ERR;
}

int spes_fail_context(const char *fmt, ...) {
    char previous[ERROR_CAPACITY];
    memcpy(previous, error_message, sizeof previous);
    char context[ERROR_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    // Truncation is fine here: a very long message keeps its beginning.
    size_t n = strnlen(context, ERROR_CAPACITY - 3);
    memcpy(error_message, context, n);
    memcpy(error_message + n, ": ", 2);
    size_t room = ERROR_CAPACITY - n - 3;
    size_t m = strnlen(previous, room);
    memcpy(error_message + n + 2, previous, m);
    error_message[n + 2 + m] = '\0';
    return SPES_ERR;
}

const char *spes_last_error(void) { return error_message; }

void spes_clear_error(void) { error_message[0] = '\0'; }
