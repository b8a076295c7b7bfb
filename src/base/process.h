// Child processes for commands that orchestrate others (`spes demo`): spawn this very
// binary with arguments, output to a log file, and wait or stop.
#pragma once
#include <stdbool.h>
#include <sys/types.h>

// Path of the running executable (/proc/self/exe), malloc'd.
char *process_self_exe(void);
// Starts argv[0] with argv (NULL-terminated); stdout and stderr go to log_path (created or
// truncated). env: "NAME=value" entries added to the environment (NULL-terminated, may be NULL).
int process_spawn(char *const argv[], const char *log_path, char *const env[], pid_t *out);
// Non-blocking check: true when it has exited (then *exit_code is its code, or 128+signal).
bool process_poll(pid_t pid, int *exit_code);
// Blocks until it exits; returns its exit code (128+signal when killed).
int process_wait(pid_t pid);
// SIGTERM, then SIGKILL after grace_s seconds if it is still alive; reaps it.
void process_stop(pid_t pid, double grace_s);
