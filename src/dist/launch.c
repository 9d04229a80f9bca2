#define _DEFAULT_SOURCE
#include "dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/error.h"

int keel_dist_launch(int nproc, int (*run)(void *ud), void *ud) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
        if (fd >= 0) close(fd);
        return keel_fail("--nproc: cannot find a free loopback port");
    }
    close(fd);
    char port[16], world[16];
    snprintf(port, sizeof port, "%d", ntohs(sa.sin_port));
    snprintf(world, sizeof world, "%d", nproc);
    pid_t *pids = calloc((size_t)nproc, sizeof *pids);
    if (!pids) return keel_fail("out of memory");
    for (int r = 0; r < nproc; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            for (int k = 0; k < r; k++) kill(pids[k], SIGTERM);
            free(pids);
            return keel_fail("--nproc: cannot start rank %d", r);
        }
        if (pid == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("KEEL_RANK", rank, 1), setenv("KEEL_WORLD_SIZE", world, 1);
            setenv("KEEL_MASTER_ADDR", "127.0.0.1", 1), setenv("KEEL_MASTER_PORT", port, 1);
            setenv("KEEL_LOCAL_RANK", rank, 1); /* one GPU per process: rank r takes GPU r */
            _exit(run(ud));
        }
        pids[r] = pid;
    }
    int result = 0, left = nproc, waited_ms = 0;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, result ? WNOHANG : 0);
        if (pid < 0) break;
        if (pid == 0) { /* a failure happened; the others are still running */
            usleep(50000);
            if ((waited_ms += 50) == 5000)
                for (int k = 0; k < nproc; k++)
                    if (pids[k] > 0) kill(pids[k], SIGTERM);
            continue;
        }
        left--;
        int r = 0;
        while (r < nproc && pids[r] != pid) r++;
        if (r < nproc) pids[r] = -1;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code && !result) {
            fprintf(stderr, "keel train: rank %d exited with status %d; stopping the other ranks\n", r, code);
            result = code;
        }
    }
    free(pids);
    return result;
}
