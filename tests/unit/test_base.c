// Base library: error messages and context, atomic files, directories, RNG determinism, the
// duration and byte-count texts, the host memory a process may use.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/bytes_text.h"
#include "base/error.h"
#include "base/file.h"
#include "base/host_memory.h"
#include "base/progress.h"
#include "base/rng.h"

static void test_error_context(void **state) {
    (void)state;
    assert_int_equal(spes_fail("bad value %d", 7), SPES_ERR);
    assert_int_equal(spes_fail_context("loading %s", "x.yaml"), SPES_ERR);
    assert_string_equal(spes_last_error(), "loading x.yaml: bad value 7");
    spes_clear_error();
    assert_string_equal(spes_last_error(), "");
}

static void test_alloc_overflow_is_an_error(void **state) {
    (void)state;
    assert_null(spes_calloc(SIZE_MAX / 2, 4));
    assert_non_null(strstr(spes_last_error(), "overflow"));
}

// The file at path holds exactly the len bytes of want.
static void assert_file_holds(const char *path, const char *want, size_t len) {
    uint8_t *data;
    size_t got;
    assert_int_equal(file_read_all(path, &data, &got), SPES_OK);
    assert_int_equal(got, len);
    assert_memory_equal(data, want, len);
    free(data);
}

static void test_atomic_file(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_base_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = path_join(dir, "f.txt");
    assert_int_equal(file_write_atomic(path, "hello", 5), SPES_OK);
    assert_file_holds(path, "hello", 5);
    // An aborted write leaves the old content and no temp file behind.
    AtomicFile af;
    assert_int_equal(atomic_file_open(&af, path), SPES_OK);
    assert_int_equal(atomic_file_write(&af, "garbage", 7), SPES_OK);
    atomic_file_abort(&af);
    assert_file_holds(path, "hello", 5);
    char *sub = path_join(dir, "a/b/c");
    assert_int_equal(mkdir_p(sub), SPES_OK);
    assert_true(dir_exists(sub));
    assert_int_equal(remove_tree(dir), SPES_OK);
    assert_false(dir_exists(dir));
    uint8_t *data;
    size_t len;
    assert_int_equal(file_read_all(path, &data, &len), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), path));
    free(sub);
    free(path);
}

// An atomic write never replaces what is not a regular file (the rename would have put a file in
// place of a FIFO here, of /dev/full or /dev/stdout for a root user's --out), and writes
// through a symbolic link to its target, leaving the link a link.
static void test_atomic_file_target_kinds(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_base_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *fifo = path_join(dir, "fifo"), *sub = path_join(dir, "sub"), *file = path_join(dir, "file");
    char *link = path_join(dir, "link");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(file_write_atomic(fifo, "x", 1), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "not a regular file (a FIFO)"));
    assert_int_equal(file_write_atomic(sub, "x", 1), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "(a directory)"));
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(file_write_atomic(file, "old", 3), SPES_OK);
    assert_int_equal(symlink("file", link), 0);
    assert_int_equal(file_write_atomic(link, "new!", 4), SPES_OK);
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_file_holds(file, "new!", 4);
    assert_int_equal(remove_tree(dir), SPES_OK);
    free(fifo), free(sub), free(file), free(link);
}

static void test_rng_deterministic_and_truncated(void **state) {
    (void)state;
    Rng a, b;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) assert_true(rng_next_u64(&a) == rng_next_u64(&b));
    double sum = 0, sumsq = 0, maxabs = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = rng_truncated_normal(&a, 0.02, 3.0);
        sum += x;
        sumsq += x * x;
        if (fabs(x) > maxabs) maxabs = fabs(x);
    }
    assert_true(maxabs <= 0.06);
    double std = sqrt(sumsq / n - (sum / n) * (sum / n));
    // Truncation at 3 sigma shrinks the std by ~1.3%.
    assert_true(fabs(std - 0.02 * 0.9866) < 0.0003);
    for (int i = 0; i < 1000; i++) assert_true(rng_below(&a, 7) < 7);
}

static void test_format_duration(void **state) {
    (void)state;
    char buf[32];
    format_duration(59.4, buf, sizeof buf);
    assert_string_equal(buf, "59s");
    format_duration(185, buf, sizeof buf);
    assert_string_equal(buf, "3m05s");
    format_duration(3725, buf, sizeof buf);
    assert_string_equal(buf, "1h02m");
}

static void test_bytes_text(void **state) {
    (void)state;
    char buf[32];
    assert_string_equal(bytes_text(12, buf, sizeof buf), "12 B");
    assert_string_equal(bytes_text(999, buf, sizeof buf), "999 B");
    assert_string_equal(bytes_text(1000, buf, sizeof buf), "1 kB");
    assert_string_equal(bytes_text(529392, buf, sizeof buf), "529 kB");
    assert_string_equal(bytes_text(999600, buf, sizeof buf), "1 MB");   // rounds up into the next unit
    assert_string_equal(bytes_text(8573479248u, buf, sizeof buf), "8.57 GB");
    assert_string_equal(bytes_text(51440875488u, buf, sizeof buf), "51.4 GB");
}

// put(root, rel, text): writes root/rel, creating its folders.
static void put(const char *root, const char *rel, const char *text) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    assert_int_equal(mkdir_p(path), SPES_OK);
    *slash = '/';
    assert_int_equal(file_write_atomic(path, text, strlen(text)), SPES_OK);
}

// The host memory a process may use: MemAvailable alone, a cgroup v1 limit on an ancestor, a
// cgroup v2 limit at the root of a namespace ("max" below it), each the tightest that applies.
static void test_host_memory(void **state) {
    (void)state;
    char root[] = "/tmp/spes_host_memory_XXXXXX";
    assert_non_null(mkdtemp(root));
    char proc[600], cg[600];
    snprintf(proc, sizeof proc, "%s/proc", root);
    snprintf(cg, sizeof cg, "%s/cgroup", root);
    put(proc, "meminfo", "MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:    8000000 kB\n");
    HostMemory m;
    // no cgroup file: MemAvailable
    assert_int_equal(host_memory_read(proc, cg, &m), SPES_OK);
    assert_int_equal(m.available, (size_t)8000000 * 1024);
    assert_int_equal(m.total, (size_t)16000000 * 1024);
    assert_string_equal(m.limited_by, "MemAvailable");
    // v1: the memory controller's path /a/b; /a/b unlimited, /a 2 GB with 1.5 GB used
    put(proc, "self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/a/b\n0::/\n");
    put(cg, "memory/a/b/memory.limit_in_bytes", "9223372036854771712\n");
    put(cg, "memory/a/b/memory.usage_in_bytes", "100\n");
    put(cg, "memory/a/memory.limit_in_bytes", "2000000000\n");
    put(cg, "memory/a/memory.usage_in_bytes", "1500000000\n");
    assert_int_equal(host_memory_read(proc, cg, &m), SPES_OK);
    assert_int_equal(m.available, 500000000);
    assert_int_equal(m.total, 2000000000);
    assert_string_equal(m.limited_by, "the cgroup's memory limit");
    // over its limit: nothing left
    put(cg, "memory/a/memory.usage_in_bytes", "2100000000\n");
    assert_int_equal(host_memory_read(proc, cg, &m), SPES_OK);
    assert_int_equal(m.available, 0);
    // v2 (no v1 memory line): "max" at the process's cgroup, 3 GB with 1 GB used at the root
    put(proc, "self/cgroup", "0::/c\n");
    put(cg, "c/memory.max", "max\n");
    put(cg, "c/memory.current", "5\n");
    put(cg, "memory.max", "3000000000\n");
    put(cg, "memory.current", "1000000000\n");
    assert_int_equal(host_memory_read(proc, cg, &m), SPES_OK);
    assert_int_equal(m.available, 2000000000);
    assert_string_equal(m.limited_by, "the cgroup's memory limit");
    // a limit above what the host has free: MemAvailable still
    put(cg, "memory.max", "900000000000\n");
    assert_int_equal(host_memory_read(proc, cg, &m), SPES_OK);
    assert_int_equal(m.available, (size_t)8000000 * 1024);
    assert_string_equal(m.limited_by, "MemAvailable");
    // no meminfo: an error naming it
    char meminfo[700];
    snprintf(meminfo, sizeof meminfo, "%s/meminfo", proc);
    unlink(meminfo);
    assert_int_equal(host_memory_read(proc, cg, &m), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "meminfo"));
    remove_tree(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_context), cmocka_unit_test(test_alloc_overflow_is_an_error),
        cmocka_unit_test(test_atomic_file), cmocka_unit_test(test_atomic_file_target_kinds),
        cmocka_unit_test(test_rng_deterministic_and_truncated),
        cmocka_unit_test(test_format_duration), cmocka_unit_test(test_bytes_text),
        cmocka_unit_test(test_host_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
