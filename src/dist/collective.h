/* keel: collectives for data-parallel training. Ranks find each other through KEEL_RANK,
 * KEEL_WORLD_SIZE, KEEL_MASTER_ADDR and KEEL_MASTER_PORT and keep a TCP connection to rank 0:
 * the CPU all-reduce (rank 0 gathers, sums in rank order, sends the result back; deterministic by
 * construction) runs over it, on CPUs and in the tests. With the cuda backend in a build that has
 * NCCL, gradient buffers are summed by NCCL on the GPU instead (collective_nccl.c), its unique id
 * sent from rank 0 over the TCP connection. */
#ifndef KEEL_COLLECTIVE_H
#define KEEL_COLLECTIVE_H

#include <stddef.h>

#include "backend/backend.h"

typedef struct keel_coll keel_coll;

/* From the environment; NULL with no error when KEEL_WORLD_SIZE is unset or 1 (one process).
 * timeout_s bounds every wait for another rank. */
keel_coll *keel_coll_from_env(double timeout_s, int *failed);
void keel_coll_free(keel_coll *c);
int keel_coll_rank(const keel_coll *c);
int keel_coll_size(const keel_coll *c);
/* buf <- sum over ranks of buf, summed in rank order (0, 1, 2, ...) on every rank. */
int keel_coll_allreduce_sum_f64(keel_coll *c, double *buf, size_t n);
/* Rank 0's n bytes of buf to every rank. */
int keel_coll_broadcast(keel_coll *c, void *buf, size_t n);

/* Chooses how gradient buffers on backend be are summed: NCCL when be is cuda and the build has
 * NCCL (unless KEEL_DIST_COLLECTIVE=tcp), else the TCP all-reduce through host memory. Call on
 * every rank; returns the collective's name in *name. */
int keel_coll_attach_backend(keel_coll *c, keel_backend *be, const char **name);
/* Starts summing the n contiguous float32 tensors over ranks, in place (the TCP one finishes
 * before it returns; NCCL's runs on its own stream after what is queued on be). */
int keel_coll_allreduce_tensors(keel_coll *c, keel_backend *be, keel_tensor *const *ts, int n);
/* Waits for the started sums; gives up after the timeout with a message (a rank died or hangs). */
int keel_coll_wait(keel_coll *c, keel_backend *be);

#endif
