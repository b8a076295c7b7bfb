#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static LogLevel current_level = LOG_INFO;
static int level_from_env_done = 0;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void log_set_level(LogLevel level) {
    current_level = level;
    level_from_env_done = 1;
}

static void read_level_from_env(void) {
    level_from_env_done = 1;
    const char *env = getenv("SPES_LOG_LEVEL");
    if (!env) return;
    if (!strcmp(env, "debug")) current_level = LOG_DEBUG;
    else if (!strcmp(env, "warn")) current_level = LOG_WARN;
    else if (!strcmp(env, "error")) current_level = LOG_ERROR;
}

void log_message(LogLevel level, const char *fmt, ...) {
    if (!level_from_env_done) read_level_from_env();
    if (level < current_level) return;
    static const char *tags[] = {"debug", "info", "warn", "error"};
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm_now;
    localtime_r(&now, &tm_now);
    strftime(stamp, sizeof stamp, "%H:%M:%S", &tm_now);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "[%s %s] ", stamp, tags[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&log_lock);
}
