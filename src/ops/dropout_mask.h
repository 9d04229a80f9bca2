/* keel: which elements DROPOUT keeps, written once for every backend (nvcc sees __host__
 * __device__). The mask is a pure function of (seed, stream, counter, element index): no random
 * state, so the forward node, its recompute clone and the backward rule all see the same mask, on
 * every backend and thread count, and a resumed run re-draws exactly the masks of the original.
 * The element index is the logical one (i0 + ne0 (i1 + ne1 (i2 + ne2 i3))), so a view or a
 * different memory layout of the same values gets the same mask. */
#ifndef KEEL_DROPOUT_MASK_H
#define KEEL_DROPOUT_MASK_H

#include <stdint.h>

#include "tensor/convert.h" /* KEEL_HD */

/* SplitMix64's output function: a bijection of 64-bit words whose every output bit depends on
 * every input bit. */
KEEL_HD uint64_t keel_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The per-node key: one draw per (seed, stream, counter). */
KEEL_HD uint64_t keel_dropout_key(uint64_t seed, uint64_t stream, uint64_t counter) {
    return keel_mix64(keel_mix64(keel_mix64(seed + 0x9e3779b97f4a7c15ull) ^ (stream + 0x632be59bd9b4e019ull)) ^
                      (counter + 0x85ebca77c2b2ae63ull));
}

/* DROPOUT's threshold (ip3) for a drop probability p: 2^32 p, rounded. Host code only. */
#ifndef __CUDACC__
#include <math.h>
static inline int64_t keel_dropout_threshold(double p) { return (int64_t)llround(p * 4294967296.0); }
#endif

/* Element i is kept when the high 32 bits of its draw are >= threshold (2^32 p rounded): it is
 * dropped with probability threshold / 2^32. Element i's draw is SplitMix64's i-th output from the key. */
KEEL_HD int keel_dropout_keep(uint64_t key, uint64_t i, uint64_t threshold) {
    return (keel_mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull) >> 32) >= threshold;
}

#endif
