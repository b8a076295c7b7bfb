// Files: whole-file reads, read-only mappings, atomic writes (temp + fsync + rename),
// directories. Every function names the path in its error message.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Reads a whole file into a malloc'd buffer (NUL-terminated for convenience; *len excludes it).
int file_read_all(const char *path, uint8_t **data, size_t *len);

// Read-only memory mapping of a whole file. An empty file maps to data == NULL, size 0.
typedef struct {
    const uint8_t *data;
    size_t size;
    void *mapping;      // what munmap gets (NULL for an empty file)
} MappedFile;
int file_map(const char *path, MappedFile *out);
void file_unmap(MappedFile *mf);

// Atomic write: everything goes to "<path>.tmp.<pid>" and only atomic_file_commit makes
// it visible under <path> (fflush + fsync + rename + fsync of the directory). A crash at
// any point leaves either the old file or the new one, never a torn one. A <path> that exists
// must be a regular file, or a symbolic link to one (its target is replaced, the link kept);
// a directory, device, FIFO or socket there is refused by atomic_file_open.
typedef struct {
    FILE *fp;
    char *final_path;
    char *temp_path;
} AtomicFile;
int atomic_file_open(AtomicFile *af, const char *path);
int atomic_file_write(AtomicFile *af, const void *data, size_t len);
int atomic_file_commit(AtomicFile *af);
void atomic_file_abort(AtomicFile *af);     // removes the temp file; safe after commit
// Convenience: the whole content at once.
int file_write_atomic(const char *path, const void *data, size_t len);

int file_exists(const char *path);
int dir_exists(const char *path);
int mkdir_p(const char *path);             // like `mkdir -p`
int remove_tree(const char *path);         // like `rm -rf`; missing path is fine
// fsync a directory so a rename inside it is durable.
int fsync_dir(const char *dir);
// Creates dir if needed and takes an exclusive lock on dir/name (flock), held while *lock_fd is
// open: one process a directory (a server's state dir, a training run's save_folder). The
// kernel drops the lock when the process ends, even on SIGKILL, so a crash leaves nothing to
// clean up. Refused when another process holds it: "<what> is in use by another <holder> (it
// holds the lock on <dir/name>); <hint>" (hint may be NULL). Closing *lock_fd releases it.
int dir_lock(const char *dir, const char *name, const char *what, const char *holder, const char *hint,
             int *lock_fd);

// Renames a directory atomically (used for checkpoint dirs: write stepN.tmp, rename to stepN).
int rename_durable(const char *from, const char *to);

// All of data[0..len) written to fd, a write interrupted by a signal resumed. 0, or the errno of
// the failure (ENOSPC for a write that took nothing); what was written before a failure stays.
// Returns an errno rather than a message: the callers' messages (a log's, a server's) differ.
int fd_write_all(int fd, const void *data, size_t len);

// The bytes an unprivileged writer may still use on the filesystem holding path (statvfs's
// f_bavail x f_frsize). 0, or the errno of a failure.
int fs_free_bytes(const char *path, size_t *bytes);

// "a" + "/" + "b" into a malloc'd string.
char *path_join(const char *a, const char *b);
