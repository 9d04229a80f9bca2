/* keel train: flags -> keel_train_run. */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "train/train.h"
#include "util/error.h"

static void on_sigint(int sig) {
    (void)sig;
    keel_train_stop = 1;
}

int cmd_train(int argc, char **argv) {
    keel_train_opts o;
    int pr = keel_train_parse(argc, argv, &o);
    if (pr == 1) {
        keel_train_help(keel_backend_list());
        return 0;
    }
    if (pr) {
        fprintf(stderr, "keel train: %s\n", keel_last_error());
        return 2;
    }
    signal(SIGINT, on_sigint);
    if (o.nproc > 1 && !getenv("KEEL_WORLD_SIZE")) { /* start the ranks here, on loopback */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof sa;
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
            fprintf(stderr, "keel train: --nproc: cannot find a free port\n");
            return 1;
        }
        close(fd);
        char port[16], world[16];
        snprintf(port, sizeof port, "%d", ntohs(sa.sin_port));
        snprintf(world, sizeof world, "%lld", (long long)o.nproc);
        pid_t *pids = calloc((size_t)o.nproc, sizeof *pids);
        for (int r = 0; r < o.nproc; r++) {
            pid_t pid = fork();
            if (pid == 0) {
                char rank[16];
                snprintf(rank, sizeof rank, "%d", r);
                setenv("KEEL_RANK", rank, 1), setenv("KEEL_WORLD_SIZE", world, 1),
                    setenv("KEEL_MASTER_ADDR", "127.0.0.1", 1), setenv("KEEL_MASTER_PORT", port, 1);
                setenv("KEEL_LOCAL_RANK", rank, 1); /* one GPU per process: rank r takes GPU r */
                _exit(keel_train_run(&o));
            }
            pids[r] = pid;
        }
        /* The first failure stops the rest: they get a few seconds to notice on their own (and
         * say so), then SIGTERM. */
        int result = 0, left = (int)o.nproc, waited_ms = 0;
        while (left > 0) {
            int status;
            pid_t pid = waitpid(-1, &status, result ? WNOHANG : 0);
            if (pid < 0) break;
            if (pid == 0) { /* a failure happened; the others are still running */
                usleep(50000);
                if ((waited_ms += 50) == 5000)
                    for (int k = 0; k < o.nproc; k++)
                        if (pids[k] > 0) kill(pids[k], SIGTERM);
                continue;
            }
            left--;
            int r = 0;
            while (r < o.nproc && pids[r] != pid) r++;
            if (r < o.nproc) pids[r] = -1;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (code && !result) {
                fprintf(stderr, "keel train: rank %d exited with status %d; stopping the other ranks\n", r, code);
                result = code;
            }
        }
        free(pids);
        return result;
    }
    int r = keel_train_run(&o);
    return r;
}
