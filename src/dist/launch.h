/* keel: starting the ranks of a data-parallel run on this host: one process per rank (fork), the
 * rendezvous on a free loopback port (KEEL_RANK, KEEL_WORLD_SIZE, KEEL_MASTER_ADDR,
 * KEEL_MASTER_PORT, KEEL_LOCAL_RANK set in each, as a multi-host launcher would), and the first
 * failure stopping the rest: they get 5 s to notice on their own and say so, then SIGTERM. */
#ifndef KEEL_LAUNCH_H
#define KEEL_LAUNCH_H

/* Runs run(ud) in nproc child processes (each ends with its status: _exit, as a forked child
 * must). Returns 0 when every rank succeeded, else the first failing rank's status (128 + signal
 * when it was killed); -1 with a message when the ranks could not be started. */
int keel_dist_launch(int nproc, int (*run)(void *ud), void *ud);

#endif
