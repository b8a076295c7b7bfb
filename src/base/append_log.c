// A log-like file a failing disk cannot stop. See append_log.h.
#include "base/append_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"

// Writes all of data at the end of fd; a part written before a failure is cut off again.
// Returns 0 or the errno of the failure.
static int append_whole(int fd, const void *data, size_t len) {
    off_t start = lseek(fd, 0, SEEK_END);
    if (start < 0) return errno;
    int err = fd_write_all(fd, data, len);
    if (err) {   // a torn record cut off again (should this fail too, readers drop a torn tail: metrics_open, tfevents_open)
        int cut = ftruncate(fd, start);
        (void)cut;
    }
    return err;
}

// Opens a->path (creating it), records its identity and gives an empty file the header.
// Returns 0 or an errno.
static int open_file(AppendLog *a, int extra_flags) {
    int fd = open(a->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | extra_flags, 0644);
    if (fd < 0) return errno;
    struct stat st;
    int err = fstat(fd, &st) == 0 ? 0 : errno;
    if (!err && st.st_size == 0 && a->header_len > 0) err = append_whole(fd, a->header, a->header_len);
    if (err) {
        close(fd);
        return err;
    }
    a->fd = fd;
    a->dev = st.st_dev;
    a->ino = st.st_ino;
    return 0;
}

int append_log_open(AppendLog *a, const char *path, const char *unit, bool exclusive, const void *header,
                    size_t header_len) {
    memset(a, 0, sizeof *a);
    a->fd = -1;
    if (!(a->path = spes_strdup(path))) return SPES_ERR;
    log_sink_init(&a->sink, a->path, unit);
    if (header_len > 0) {
        if (!(a->header = spes_malloc(header_len))) {
            append_log_close(a);
            return SPES_ERR;
        }
        memcpy(a->header, header, header_len);
        a->header_len = header_len;
    }
    int err = open_file(a, exclusive ? O_EXCL : 0);
    if (err) {
        spes_fail("cannot %s %s: %s", exclusive ? "create" : "open for appending", path, strerror(err));
        append_log_close(a);
        return SPES_ERR;
    }
    return SPES_OK;
}

// Whether the open descriptor still is the file at a->path (not removed, not replaced).
static bool still_there(const AppendLog *a) {
    struct stat st;
    return stat(a->path, &st) == 0 && st.st_dev == a->dev && st.st_ino == a->ino;
}

bool append_log_write(AppendLog *a, const void *record, size_t len, int64_t step) {
    if (!a->path) return false;
    if (a->fd >= 0 && !still_there(a)) {
        log_warn("%s was removed or replaced during the run; starting it anew (what it held before is not "
                 "written again)", a->path);
        close(a->fd);
        a->fd = -1;
    }
    int err = a->fd < 0 ? open_file(a, 0) : 0;
    if (!err) err = append_whole(a->fd, record, len);
    char msg[1024];
    if (log_sink_note(&a->sink, err == 0, err ? strerror(err) : NULL, step, msg, sizeof msg) != SINK_QUIET) log_warn("%s", msg);
    return err == 0;
}

void append_log_close(AppendLog *a) {
    char msg[1024];
    if (a->path && log_sink_final(&a->sink, msg, sizeof msg)) log_warn("%s", msg);
    if (a->path && a->fd >= 0) close(a->fd);   // (a zeroed, never opened one has no descriptor)
    free(a->path);
    free(a->header);
    memset(a, 0, sizeof *a);
    a->fd = -1;
}
