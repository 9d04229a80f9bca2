/* keel train: flags -> keel_train_run (in one process, or one per rank through keel_dist_launch). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "dist/launch.h"
#include "train/train.h"
#include "util/error.h"

static void on_sigint(int sig) {
    (void)sig;
    keel_train_stop = 1;
}

static int run_train(void *opts) { return keel_train_run(opts); }

int cmd_train(int argc, char **argv) {
    keel_train_opts o;
    int pr = keel_train_parse(argc, argv, &o);
    if (pr == 1) {
        keel_train_help(keel_backend_list());
        return 0;
    }
    if (pr) {
        fprintf(stderr, "keel train: %s\n", keel_last_error());
        keel_train_opts_release();
        return 2;
    }
    signal(SIGINT, on_sigint);
    if (o.nproc > 1 && !getenv("KEEL_WORLD_SIZE")) { /* start the ranks here, on loopback */
        int r = keel_dist_launch((int)o.nproc, run_train, &o);
        if (r < 0) fprintf(stderr, "keel train: %s\n", keel_last_error());
        keel_train_opts_release();
        return r < 0 ? 1 : r;
    }
    int r = keel_train_run(&o);
    keel_train_opts_release();
    return r;
}
