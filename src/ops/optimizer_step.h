/* keel: the optimizer step's shared arithmetic, written once for every backend (nvcc sees __host__
 * __device__): the block of SUM_SQ's first level, and the factor ADAMW gives the gradients. */
#ifndef KEEL_OPTIMIZER_STEP_H
#define KEEL_OPTIMIZER_STEP_H

#include <math.h>
#include <stdint.h>

#include "tensor/convert.h" /* KEEL_HD */

/* SUM_SQ sums blocks of this many elements first, each into its own float64 sum: a count fixed by
 * the op, never by the machine, so the order is the same on any GPU or thread count. */
#define KEEL_SUM_SQ_BLOCK 65536

/* ADAMW's factor on the gradients from s, the sum of their squares: the norm n = sqrt(s) / d (d:
 * the micro-batches times ranks whose gradients were summed), the clip factor min(1, clip / n) when
 * clip > 0, over d. 0 when n is not finite: the step is skipped (every element left as it was). */
KEEL_HD int keel_adamw_factor(double s, double clip, int64_t d, double *factor) {
    double n = sqrt(s) / (double)d;
    if (!isfinite(n)) return 0;
    *factor = (clip > 0 && n > clip ? clip / n : 1.0) / (double)d;
    return 1;
}

#endif
