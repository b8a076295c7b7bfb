// A log-like file appended one whole record (a metrics line, a TensorBoard record) at a time,
// which a full or failing disk cannot stop (base/log_sink.h): a record that cannot be written is
// counted as lost and said once, the run goes on, and each later record is tried again.
//   - one write() a record on an O_APPEND descriptor; a record cut short (ENOSPC mid-way) is
//     truncated off again, so the file only ever holds whole records
//   - a file removed or replaced under the run (rm -rf save_folder) is noticed at the next
//     record and started anew at its path, header first; while the directory is missing that
//     record is lost (the next checkpoint save recreates save_folder)
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/log_sink.h"

typedef struct {
    char *path;
    int fd;                     // -1: not open
    dev_t dev;                  // the open file's identity, to notice a removed or replaced one
    ino_t ino;
    uint8_t *header;            // written first into a file started anew (NULL: none)
    size_t header_len;
    LogSink sink;
} AppendLog;

// Opens path for appending (exclusive: creates it, failing if it exists); with header, a file
// that is empty is given it first. A failure here is an error (spes_fail): the run has not started.
int append_log_open(AppendLog *a, const char *path, const char *unit, bool exclusive, const void *header,
                    size_t header_len);
// One record of `step` (-1: none). Never fails the caller: a failure is counted and said (log_warn).
// Returns whether the record was written.
bool append_log_write(AppendLog *a, const void *record, size_t len, int64_t step);
// Says what was lost and never said (a streak still failing), then closes.
void append_log_close(AppendLog *a);
