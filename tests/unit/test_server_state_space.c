// Disk space of the parameter server's state / spool dir (src/server/state_space.c): what a round
// needs at its fullest, and the warning naming the dir, the bytes needed and free.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/log.h"
#include "server/state_space.h"

static void test_needed(void **state) {
    (void)state;
    StateSpace s = {.peers = 4, .upload = 100, .aggregate = 1000, .beside = 10, .keep_steps = 2};
    // A fresh state dir: 4 uploads, and 2 kept + the one being written.
    assert_int_equal(state_space_needed(&s, 0), 4 * 100 + 3 * 1010);
    assert_int_equal(state_space_needed(&s, 1), 4 * 100 + 2 * 1010);
    // At keep_steps (or over it, after --keep_steps shrank): the one being written.
    assert_int_equal(state_space_needed(&s, 2), 4 * 100 + 1010);
    assert_int_equal(state_space_needed(&s, 5), 4 * 100 + 1010);
    // A spool dir holds the uploads only.
    StateSpace spool = {.peers = 4, .upload = 100, .keep_steps = 2};
    assert_int_equal(state_space_needed(&spool, 0), 400);
}

// The warning on a filesystem with less free than needed names the dir, both sizes and the flag;
// one with room says nothing. (stderr captured through a pipe.)
static char *check_output(const char *dir, const StateSpace *s) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fds[1], 2);
    close(fds[1]);
    state_space_check(dir, "--state_dir", s, 0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    static char out[4096];
    ssize_t n = read(fds[0], out, sizeof out - 1);
    close(fds[0]);
    out[n > 0 ? n : 0] = '\0';
    return out;
}

static void test_warning(void **state) {
    (void)state;
    StateSpace huge = {.peers = 4, .upload = (size_t)1 << 50, .aggregate = (size_t)1 << 50, .keep_steps = 2};
    const char *out = check_output("/tmp", &huge);
    if (!strstr(out, "server: --state_dir /tmp: ") || !strstr(out, "free on its filesystem; a round needs up to ") ||
        !strstr(out, "(4 uploads of up to ") || !strstr(out, "3 aggregates of ") || !strstr(out, "--keep_steps 2"))
        fail_msg("no warning naming the dir and sizes: %s", out);
    StateSpace small = {.peers = 1, .upload = 1, .aggregate = 1, .keep_steps = 1};
    out = check_output("/tmp", &small);
    if (out[0]) fail_msg("warned with room: %s", out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_needed),
        cmocka_unit_test(test_warning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
