#include "spawn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/error.h"

int keel_spawn_read(char *const argv[], const char *env_name, const char *env_value, bool merge_stderr, keel_child *c) {
    int fd[2];
    c->out = NULL, c->pid = -1;
    if (pipe(fd) != 0) return keel_fail("cannot run %s: pipe: %s", argv[0], strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fd[0]), close(fd[1]);
        return keel_fail("cannot run %s: fork: %s", argv[0], strerror(e));
    }
    if (pid == 0) { /* the child: only async-signal-safe work until exec */
        dup2(fd[1], STDOUT_FILENO);
        if (merge_stderr) dup2(fd[1], STDERR_FILENO);
        close(fd[0]), close(fd[1]);
        if (env_name) setenv(env_name, env_value, 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    c->out = fdopen(fd[0], "r");
    if (!c->out) {
        close(fd[0]);
        waitpid(pid, NULL, 0);
        return keel_fail("cannot run %s: fdopen", argv[0]);
    }
    c->pid = pid;
    return 0;
}

int keel_spawn_wait(keel_child *c) {
    if (c->out) fclose(c->out);
    c->out = NULL;
    int st;
    while (waitpid(c->pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}
