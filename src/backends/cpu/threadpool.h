/* keel: a fixed pool of worker threads. Work is split by item index, never by a reduction, so a
 * result never depends on how many threads computed it. */
#ifndef KEEL_THREADPOOL_H
#define KEEL_THREADPOOL_H

#include <stdint.h>

typedef struct keel_pool keel_pool;
/* fn(arg, begin, end, thread): process items [begin, end) on worker `thread`. */
typedef void (*keel_pool_fn)(void *arg, int64_t begin, int64_t end, int thread);

keel_pool *keel_pool_new(int n_threads);
void keel_pool_free(keel_pool *p);
int keel_pool_size(const keel_pool *p);
/* Run items [0, n) split into contiguous chunks over the threads; returns when all are done. */
void keel_pool_for(keel_pool *p, int64_t n, keel_pool_fn fn, void *arg);

#endif
