/* keel: small helpers the benchmarks share. */
#ifndef KEEL_BENCH_UTIL_H
#define KEEL_BENCH_UTIL_H

#include "util/clock.h"

/* qsort comparison of doubles, ascending (medians). */
static inline int bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
