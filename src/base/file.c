#include "base/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"

// " (a directory)" and the like, for messages about a path that is not a regular file.
static const char *file_kind_note(mode_t mode) {
    return S_ISDIR(mode)    ? " (a directory)"
           : S_ISFIFO(mode) ? " (a FIFO)"
           : S_ISCHR(mode)  ? " (a character device)"
           : S_ISBLK(mode)  ? " (a block device)"
           : S_ISSOCK(mode) ? " (a socket)"
                            : "";
}

// open() of a FIFO blocks until a writer appears; O_NONBLOCK returns at once so that the type
// check below can refuse it (for a regular file the flag changes nothing).
static int open_regular(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return spes_fail("cannot open %s: %s", path, strerror(errno)), -1;
    struct stat st;
    int ok = fstat(fd, &st) == 0;
    if (!ok || !S_ISREG(st.st_mode)) {
        close(fd);
        if (!ok) return spes_fail("cannot stat %s: %s", path, strerror(errno)), -1;
        return spes_fail("%s is not a regular file%s", path, file_kind_note(st.st_mode)), -1;
    }
    return fd;
}

int file_read_all(const char *path, uint8_t **data, size_t *len) {
    *data = NULL;
    *len = 0;
    int fd = open_regular(path);
    if (fd < 0) return SPES_ERR;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return spes_fail("cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fclose(fp);
        return spes_fail("cannot stat %s: %s", path, strerror(errno));
    }
    size_t size = (size_t)st.st_size;
    uint8_t *buf = spes_malloc(size + 1);
    if (!buf) {
        fclose(fp);
        return spes_fail_context("reading %s", path);
    }
    if (size && fread(buf, 1, size, fp) != size) {
        free(buf);
        fclose(fp);
        return spes_fail("short read on %s", path);
    }
    fclose(fp);
    buf[size] = 0;
    *data = buf;
    *len = size;
    return SPES_OK;
}

int file_map(const char *path, MappedFile *out) {
    memset(out, 0, sizeof *out);
    int fd = open_regular(path);
    if (fd < 0) return SPES_ERR;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return spes_fail("cannot stat %s: %s", path, strerror(errno));
    }
    if (st.st_size == 0) {
        close(fd);
        return SPES_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return spes_fail("cannot map %s: %s", path, strerror(errno));
    out->data = p;
    out->size = (size_t)st.st_size;
    out->mapping = p;
    return SPES_OK;
}

void file_unmap(MappedFile *mf) {
    if (mf->mapping) munmap(mf->mapping, mf->size);
    memset(mf, 0, sizeof *mf);
}

// What the commit's rename replaces. Nothing there, or a regular file: the path itself. A
// symbolic link to a regular file: its target (the link stays a link). Anything else is
// refused: the rename would put a regular file in place of a device, FIFO or socket (as root,
// `--out /dev/null` would have deleted /dev/null) or fail late on a directory.
static char *atomic_target(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return spes_strdup(path);
        spes_fail("cannot write %s: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        spes_fail("cannot write %s: it exists and is not a regular file%s", path, file_kind_note(st.st_mode));
        return NULL;
    }
    struct stat lst;
    if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
        char *target = realpath(path, NULL);
        if (!target) spes_fail("cannot resolve the link %s: %s", path, strerror(errno));
        return target;
    }
    return spes_strdup(path);
}

int atomic_file_open(AtomicFile *af, const char *path) {
    memset(af, 0, sizeof *af);
    af->final_path = atomic_target(path);
    if (!af->final_path) return SPES_ERR;
    path = af->final_path;
    size_t n = strlen(path) + 32;
    af->temp_path = spes_malloc(n);
    if (!af->final_path || !af->temp_path) {
        atomic_file_abort(af);
        return SPES_ERR;
    }
    snprintf(af->temp_path, n, "%s.tmp.%ld", path, (long)getpid());
    af->fp = fopen(af->temp_path, "wb");
    if (!af->fp) {
        spes_fail("cannot create %s: %s", af->temp_path, strerror(errno));
        atomic_file_abort(af);
        return SPES_ERR;
    }
    return SPES_OK;
}

int atomic_file_write(AtomicFile *af, const void *data, size_t len) {
    if (len && fwrite(data, 1, len, af->fp) != len)
        return spes_fail("write to %s failed: %s", af->temp_path, strerror(errno));
    return SPES_OK;
}

static char *dir_of(const char *path) {
    char *copy = spes_strdup(path);
    if (!copy) return NULL;
    char *d = spes_strdup(dirname(copy));
    free(copy);
    return d;
}

int atomic_file_commit(AtomicFile *af) {
    int rc = SPES_OK;
    if (fflush(af->fp) != 0 || fsync(fileno(af->fp)) != 0)
        rc = spes_fail("cannot flush %s: %s", af->temp_path, strerror(errno));
    if (fclose(af->fp) != 0 && rc == SPES_OK)
        rc = spes_fail("cannot close %s: %s", af->temp_path, strerror(errno));
    af->fp = NULL;
    if (rc == SPES_OK && rename(af->temp_path, af->final_path) != 0)
        rc = spes_fail("cannot rename %s to %s: %s", af->temp_path, af->final_path, strerror(errno));
    if (rc == SPES_OK) {
        char *dir = dir_of(af->final_path);
        if (dir) {
            rc = fsync_dir(dir);
            free(dir);
        }
        free(af->temp_path);
        af->temp_path = NULL;   // nothing left to remove
    }
    atomic_file_abort(af);
    return rc;
}

void atomic_file_abort(AtomicFile *af) {
    if (af->fp) fclose(af->fp);
    if (af->temp_path) unlink(af->temp_path);
    free(af->temp_path);
    free(af->final_path);
    memset(af, 0, sizeof *af);
}

int file_write_atomic(const char *path, const void *data, size_t len) {
    AtomicFile af;
    SPES_TRY(atomic_file_open(&af, path));
    if (atomic_file_write(&af, data, len) != SPES_OK) {
        atomic_file_abort(&af);
        return SPES_ERR;
    }
    return atomic_file_commit(&af);
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int mkdir_p(const char *path) {
    char *copy = spes_strdup(path);
    if (!copy) return SPES_ERR;
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(copy, 0755) != 0 && errno != EEXIST) {
            spes_fail("cannot create directory %s: %s", copy, strerror(errno));
            free(copy);
            return SPES_ERR;
        }
        *p = '/';
    }
    int rc = SPES_OK;
    if (mkdir(copy, 0755) != 0 && errno != EEXIST)
        rc = spes_fail("cannot create directory %s: %s", copy, strerror(errno));
    else if (!dir_exists(copy))
        rc = spes_fail("%s exists and is not a directory", copy);
    free(copy);
    return rc;
}

int remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? SPES_OK : spes_fail("cannot stat %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return spes_fail("cannot open directory %s: %s", path, strerror(errno));
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *child = path_join(path, e->d_name);
            if (!child || remove_tree(child) != SPES_OK) {
                free(child);
                closedir(d);
                return SPES_ERR;
            }
            free(child);
        }
        closedir(d);
        if (rmdir(path) != 0) return spes_fail("cannot remove %s: %s", path, strerror(errno));
        return SPES_OK;
    }
    if (unlink(path) != 0) return spes_fail("cannot remove %s: %s", path, strerror(errno));
    return SPES_OK;
}

int dir_lock(const char *dir, const char *name, const char *what, const char *holder, const char *hint,
             int *lock_fd) {
    *lock_fd = -1;
    if (mkdir_p(dir) != SPES_OK) return spes_fail_context("%s", what);
    char *path = path_join(dir, name);
    if (!path) return SPES_ERR;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = spes_fail("%s: cannot open %s: %s", what, path, strerror(errno));
        free(path);
        return rc;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        close(fd);
        int rc = err == EWOULDBLOCK
                     ? spes_fail("%s is in use by another %s (it holds the lock on %s)%s%s", what, holder, path,
                                 hint ? "; " : "", hint ? hint : "")
                     : spes_fail("%s: cannot lock %s: %s", what, path, strerror(err));
        free(path);
        return rc;
    }
    free(path);
    *lock_fd = fd;
    return SPES_OK;
}

int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return spes_fail("cannot open directory %s: %s", dir, strerror(errno));
    int rc = fsync(fd) == 0 ? SPES_OK : spes_fail("cannot fsync directory %s: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

int rename_durable(const char *from, const char *to) {
    if (rename(from, to) != 0) return spes_fail("cannot rename %s to %s: %s", from, to, strerror(errno));
    char *dir = dir_of(to);
    if (!dir) return SPES_ERR;
    int rc = fsync_dir(dir);
    free(dir);
    return rc;
}

char *path_join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *p = spes_malloc(na + nb + 2);
    if (!p) return NULL;
    memcpy(p, a, na);
    size_t at = na;
    if (na && a[na - 1] != '/') p[at++] = '/';
    memcpy(p + at, b, nb + 1);
    return p;
}

int fd_write_all(int fd, const void *data, size_t len) {
    const uint8_t *at = data;
    while (len > 0) {
        ssize_t w = write(fd, at, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        at += w;
        len -= (size_t)w;
    }
    return 0;
}

int fs_free_bytes(const char *path, size_t *bytes) {
    struct statvfs fs;
    *bytes = 0;
    if (statvfs(path, &fs) != 0) return errno;
    *bytes = (size_t)fs.f_bavail * (size_t)fs.f_frsize;
    return 0;
}
