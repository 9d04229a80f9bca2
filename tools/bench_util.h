/* keel: small helpers the benchmarks share. */
#ifndef KEEL_BENCH_UTIL_H
#define KEEL_BENCH_UTIL_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort comparison of doubles, ascending (medians). */
static inline int bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
