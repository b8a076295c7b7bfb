// Every `spes <command>`: one function per command, one file per command in src/cli/.
// Each returns a process exit code (0 success); on failure it has printed the error.
#pragma once

typedef int (*CommandFn)(int argc, char **argv);

typedef struct {
    const char *name;
    CommandFn run;
    const char *summary;
} Command;

int cmd_debug_step(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_list_files(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_upcycle(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_server(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_version(int argc, char **argv);
