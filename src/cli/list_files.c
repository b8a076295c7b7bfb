// `spes list-files DIR OUT`: the manifest (file_list.txt) a training config's data.paths can
// name — every token file (*.npy) under DIR, recursively, as absolute paths, sorted, one a
// line, written atomically. SPES's list_processed_files.sh lists every file under DIR with
// `find`; we keep only token files so stray logs or temp files never reach training.
// With --dtype uint16|uint32 each file is also opened and validated (size, npy header).
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/file.h"
#include "base/printable.h"
#include "cli/commands.h"
#include "io/npy.h"

typedef struct {
    char **paths;
    size_t count, cap;
} PathList;

static int path_list_add(PathList *l, char *path) {
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **grown = spes_realloc(l->paths, cap * sizeof *grown);
        if (!grown) return SPES_ERR;
        l->paths = grown;
        l->cap = cap;
    }
    l->paths[l->count++] = path;
    return SPES_OK;
}

static void path_list_free(PathList *l) {
    for (size_t i = 0; i < l->count; i++) free(l->paths[i]);
    free(l->paths);
}

static int is_token_file_name(const char *name) {
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, ".npy") == 0;
}

// Regular files (symlinks to them included) named *.npy under dir. Symlinked directories
// are not followed (no cycles).
static int collect(const char *dir, PathList *out) {
    DIR *d = opendir(dir);
    if (!d) return spes_fail("cannot open directory %s: %s", dir, strerror(errno));
    int rc = SPES_OK;
    struct dirent *e;
    while (rc == SPES_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *child = path_join(dir, e->d_name);
        if (!child) {
            rc = SPES_ERR;
            break;
        }
        struct stat lst, st;
        char shown[512];
        if (lstat(child, &lst) != 0) {
            rc = spes_fail("cannot stat %s: %s", escape_printable(child, strlen(child), shown, sizeof shown),
                           strerror(errno));
        } else if ((S_ISDIR(lst.st_mode) || is_token_file_name(e->d_name)) && !is_printable(child, strlen(child))) {
            // It would be echoed raw, and a newline in it would split a manifest line in two.
            rc = spes_fail("%s: the name holds control characters or invalid UTF-8; rename it",
                           escape_printable(child, strlen(child), shown, sizeof shown));
        } else if (S_ISDIR(lst.st_mode)) {
            rc = collect(child, out);
        } else if (is_token_file_name(e->d_name) && stat(child, &st) == 0 && S_ISREG(st.st_mode)) {
            rc = path_list_add(out, child);
            child = NULL;
        }
        free(child);
    }
    closedir(d);
    return rc;
}

static int compare_paths(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int write_manifest(const char *out_path, const PathList *l) {
    AtomicFile af;
    SPES_TRY(atomic_file_open(&af, out_path));
    for (size_t i = 0; i < l->count; i++) {
        if (atomic_file_write(&af, l->paths[i], strlen(l->paths[i])) != SPES_OK || atomic_file_write(&af, "\n", 1) != SPES_OK) {
            atomic_file_abort(&af);
            return SPES_ERR;
        }
    }
    return atomic_file_commit(&af);
}

static int validate(const PathList *l, TokenDtype dtype, uint64_t *tokens) {
    *tokens = 0;
    for (size_t i = 0; i < l->count; i++) {
        TokenFile tf;
        SPES_TRY(token_file_open(l->paths[i], dtype, &tf));
        *tokens += tf.count;
        token_file_close(&tf);
    }
    return SPES_OK;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: spes list-files DIR OUT [--dtype uint16|uint32]\n"
            "  Writes OUT (e.g. file_list.txt): every *.npy token file under DIR, recursively,\n"
            "  as sorted absolute paths, one a line. Point data.paths at OUT.\n"
            "  --dtype  also open every file as raw tokens of this type (real .npy files use\n"
            "           their header) and check it; prints the token total.\n");
}

static int list_files(const char *dir, const char *out_path, const char *dtype_name) {
    TokenDtype dtype = TOKEN_U16;
    if (dtype_name) SPES_TRY(token_dtype_parse_raw(dtype_name, &dtype));
    if (!dir_exists(dir)) return spes_fail("%s is not a directory (list-files DIR OUT)", dir);
    char *abs_dir = realpath(dir, NULL);
    if (!abs_dir) return spes_fail("cannot resolve %s: %s", dir, strerror(errno));
    PathList l = {0};
    int rc = collect(abs_dir, &l);
    if (rc == SPES_OK && l.count == 0) rc = spes_fail("no token files (*.npy) under %s", abs_dir);
    if (rc == SPES_OK) qsort(l.paths, l.count, sizeof *l.paths, compare_paths);
    uint64_t tokens = 0;
    if (rc == SPES_OK && dtype_name) rc = validate(&l, dtype, &tokens);
    if (rc == SPES_OK) rc = write_manifest(out_path, &l);
    if (rc == SPES_OK) {
        if (dtype_name) fprintf(stderr, "list-files: %zu token files, %" PRIu64 " tokens -> %s\n", l.count, tokens, out_path);
        else fprintf(stderr, "list-files: %zu token files -> %s\n", l.count, out_path);
    }
    path_list_free(&l);
    free(abs_dir);
    return rc;
}

int cmd_list_files(int argc, char **argv) {
    const char *positional[2] = {NULL, NULL};
    const char *dtype_name = NULL;
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            dtype_name = argv[++i];
        } else if (!strcmp(argv[i], "--dtype")) {
            fprintf(stderr, "spes: list-files: --dtype needs a value (uint16 or uint32)\n");
            return 2;
        } else if (!strncmp(argv[i], "--dtype=", 8)) {
            dtype_name = argv[i] + 8;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "spes: list-files: unknown flag %s\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (npos < 2) {
            positional[npos++] = argv[i];
        } else {
            fprintf(stderr, "spes: list-files: too many arguments\n");
            usage(stderr);
            return 2;
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 2;
    }
    if (list_files(positional[0], positional[1], dtype_name) != SPES_OK) {
        fprintf(stderr, "spes: %s\n", spes_last_error());
        return 1;
    }
    return 0;
}
