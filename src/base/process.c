#include "base/process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timer.h"

char *process_self_exe(void) {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) {
        spes_fail("cannot find the running executable (/proc/self/exe): %s", strerror(errno));
        return NULL;
    }
    buf[n] = '\0';
    return spes_strdup(buf);
}

int process_spawn(char *const argv[], const char *log_path, char *const env[], pid_t *out) {
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return spes_fail("cannot create log %s: %s", log_path, strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return spes_fail("cannot start %s: fork failed: %s", argv[0], strerror(errno));
    }
    if (pid == 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, STDIN_FILENO);
        for (int i = 0; env && env[i]; i++) putenv(env[i]);
        execv(argv[0], argv);
        dprintf(STDERR_FILENO, "cannot execute %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    *out = pid;
    return SPES_OK;
}

static int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

bool process_poll(pid_t pid, int *exit_code) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
        *exit_code = exit_code_of(status);
        return true;
    }
    if (r < 0) {   // not our child any more (already reaped)
        *exit_code = 1;
        return true;
    }
    return false;
}

int process_wait(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return 1;
    return exit_code_of(status);
}

void process_stop(pid_t pid, double grace_s) {
    int code;
    if (process_poll(pid, &code)) return;
    kill(pid, SIGTERM);
    double deadline = now_seconds() + grace_s;
    while (now_seconds() < deadline) {
        if (process_poll(pid, &code)) return;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGKILL);
    process_wait(pid);
}
