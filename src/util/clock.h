/* keel: the one clock keel measures time with (timeouts, progress, benchmarks). */
#ifndef KEEL_CLOCK_H
#define KEEL_CLOCK_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double keel_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
