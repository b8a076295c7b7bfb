// Console logging to stderr. Level from SPES_LOG_LEVEL (debug|info|warn|error), default info.
#pragma once

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } LogLevel;

void log_set_level(LogLevel level);
// A line that stderr does not take (a full disk, a pipe whose reader ended: SIGPIPE is the
// caller's to ignore) is counted, and the count said when stderr takes a line again.
void log_message(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// At the end of a run: the console lines lost since stderr last took one, said (if it now can).
void log_report_lost(void);

#define log_debug(...) log_message(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_message(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_message(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_message(LOG_ERROR, __VA_ARGS__)
