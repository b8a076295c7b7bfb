#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log_sink.h"

static LogLevel current_level = LOG_INFO;
static int level_from_env_done = 0;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
// The console is a log-like output too: a full disk under a redirected stderr, or a pipe whose
// reader ended, loses lines, counted and said when stderr takes them again (base/log_sink.h).
static LogSink console;
static bool console_ready;

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

// All of text to stderr with write(2) (one call unless cut short). 0 or the errno of a failure.
static int write_stderr(const char *text, size_t len) { return fd_write_all(STDERR_FILENO, text, len); }

// "12:00:00" now, local time.
static void time_stamp(char *out, size_t cap) {
    time_t now = time(NULL);
    struct tm tm_now;
    localtime_r(&now, &tm_now);
    strftime(out, cap, "%H:%M:%S", &tm_now);
}

// "[12:00:00 warn] text\n" (caller holds log_lock).
static int write_line(const char *stamp, const char *tag, const char *text) {
    char head[48];
    int n = snprintf(head, sizeof head, "[%s %s] ", stamp, tag);
    size_t len = strlen(text);
    char line[2048];
    if ((size_t)n + len + 1 <= sizeof line) {   // one write: lines of threads do not interleave
        memcpy(line, head, (size_t)n);
        memcpy(line + n, text, len);
        line[(size_t)n + len] = '\n';
        return write_stderr(line, (size_t)n + len + 1);
    }
    int err = write_stderr(head, (size_t)n);
    if (!err) err = write_stderr(text, len);
    if (!err) err = write_stderr("\n", 1);
    return err;
}

void log_message(LogLevel level, const char *fmt, ...) {
    if (!level_from_env_done) read_level_from_env();
    if (level < current_level) return;
    static const char *tags[] = {"debug", "info", "warn", "error"};
    char stamp[32];
    time_stamp(stamp, sizeof stamp);
    char small[2048], *text = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small && (text = malloc((size_t)n + 1))) {
        va_start(ap, fmt);
        vsnprintf(text, (size_t)n + 1, fmt, ap);
        va_end(ap);
    } else if (n >= (int)sizeof small) {
        text = small;   // out of memory: the line cut at its first 2047 bytes
    }
    pthread_mutex_lock(&log_lock);
    if (!console_ready) {
        log_sink_init(&console, "stderr", "log line");
        console_ready = true;
    }
    fflush(stderr);   // what others wrote with stdio first (unbuffered, normally nothing)
    int err = write_line(stamp, tags[level], text);
    char msg[512];
    // The first failure cannot be said on the console it is about; a recovery is, before the line.
    if (log_sink_note(&console, err == 0, err ? strerror(err) : NULL, -1, msg, sizeof msg) == SINK_RECOVERED)
        write_line(stamp, tags[LOG_WARN], msg);
    pthread_mutex_unlock(&log_lock);
    if (text != small) free(text);
}

void log_report_lost(void) {
    pthread_mutex_lock(&log_lock);
    char msg[512];
    if (console_ready && log_sink_final(&console, msg, sizeof msg)) {
        char stamp[32];
        time_stamp(stamp, sizeof stamp);
        write_line(stamp, "warn", msg);
    }
    pthread_mutex_unlock(&log_lock);
}
