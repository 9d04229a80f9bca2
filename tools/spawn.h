/* keel: running a peer program (node, python) for the benchmarks without a shell: fork and exec
 * with an argument vector, so a file name or flag value is never parsed as a command. */
#ifndef KEEL_SPAWN_H
#define KEEL_SPAWN_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct {
    FILE *out; /* the child's standard output (and its standard error when merged) */
    pid_t pid;
} keel_child;

/* Starts argv[0] (looked up in PATH) with argv; env_name=env_value set in the child when env_name
 * is not NULL. merge_stderr: the child's standard error goes to the same pipe. -1 with a message
 * when the pipe or the fork fails; a program that cannot be executed exits with status 127. */
int keel_spawn_read(char *const argv[], const char *env_name, const char *env_value, bool merge_stderr, keel_child *c);
/* Closes the pipe and waits: the exit status (0-255), 128+N for a signal, -1 on a wait error. */
int keel_spawn_wait(keel_child *c);

#endif
