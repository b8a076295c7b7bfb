// One error path for the whole project.
//
// Functions that can fail return SPES_OK (0) or SPES_ERR (-1). On failure they leave a
// message (what, where, what to do) with spes_fail(); callers may add context with
// spes_fail_context(). Only main() prints it and exits. Library code never exits or aborts
// on bad input.
#pragma once
#include <stdarg.h>

#define SPES_OK 0
#define SPES_ERR (-1)

// Sets the thread's error message (printf-style) and returns SPES_ERR.
int spes_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The same with a va_list (for wrappers that return a code of their own).
int spes_failv(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
// Prepends "context: " to the current message and returns SPES_ERR.
int spes_fail_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The last message of this thread ("" when none).
const char *spes_last_error(void);
void spes_clear_error(void);

// Propagate a failure upward unchanged.
#define SPES_TRY(expr)                  \
    do {                                \
        if ((expr) != SPES_OK)          \
            return SPES_ERR;            \
    } while (0)
