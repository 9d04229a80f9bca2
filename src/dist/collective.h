/* keel: collectives for data-parallel training. The interface is what NCCL provides; this file's
 * implementation is the CPU one over TCP (rank 0 gathers, sums in rank order, sends the result
 * back), used on CPUs and by the tests, and deterministic by construction. Ranks find each other
 * through KEEL_RANK, KEEL_WORLD_SIZE, KEEL_MASTER_ADDR and KEEL_MASTER_PORT. */
#ifndef KEEL_COLLECTIVE_H
#define KEEL_COLLECTIVE_H

#include <stddef.h>

typedef struct keel_coll keel_coll;

/* From the environment; NULL with no error when KEEL_WORLD_SIZE is unset or 1 (one process).
 * timeout_s bounds every wait for another rank. */
keel_coll *keel_coll_from_env(double timeout_s, int *failed);
void keel_coll_free(keel_coll *c);
int keel_coll_rank(const keel_coll *c);
int keel_coll_size(const keel_coll *c);
/* buf <- sum over ranks of buf, summed in rank order (0, 1, 2, ...) on every rank. */
int keel_coll_allreduce_sum(keel_coll *c, float *buf, size_t n);
int keel_coll_allreduce_sum_f64(keel_coll *c, double *buf, size_t n);

#endif
