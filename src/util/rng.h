/* keel: SplitMix64, the one seeded generator (initial weights, test values, data order). */
#ifndef KEEL_RNG_H
#define KEEL_RNG_H

#include <stdint.h>

static inline uint64_t keel_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double keel_uniform01(uint64_t *s) {
    return (double)(keel_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
