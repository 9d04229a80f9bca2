/* keel: the cpu backend's row helpers that the compiler turns into vector code: exp over a row,
 * and max and float64 sums in LANES interleaved partials (element i into partial i % LANES, the
 * partials combined in lane order), so the order is fixed by the row length alone, never by
 * threads or ISA. A single running sum or max is a serial chain the compiler may not reorder
 * (no -ffast-math here); libm's expf is a call per element. */
#ifndef KEEL_CPU_VEC_MATH_H
#define KEEL_CPU_VEC_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { KEEL_LANES = 16 };

/* exp(x) for float32 x, within 2 ulp of the true value for results that are normal numbers:
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two parts so n ln2 is exact), e^r by its Taylor
 * series to r^7 (the first term left out is below 1e-8 relative), then 2^n put into the exponent
 * in two factors so results down to the subnormal range stay right. Below -104 gives 0, above
 * 88.8 gives +inf, NaN stays NaN. Branch free, for vector code. */
static inline float keel_expf_fast(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float xc = x >= -104.0f ? x : -104.0f; /* NaN too: no float-to-int conversion of NaN below */
    xc = xc <= 88.8f ? xc : 88.8f;
    float n = nearbyintf(xc * log2e);
    float r = (xc - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* 2^n = 2^n1 2^n2 with both factors normal: n in [-150, 128] */
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    float y = p * s1 * s2;
    y = x < -104.0f ? 0.0f : y;
    y = x > 88.8f ? INFINITY : y;
    return x != x ? x : y;
}

/* x[i] = exp(x[i] - shift) over a contiguous row, in place (one pointer: with a separate source
 * and destination that are the same array, the compiler's overlap check would pick its scalar
 * loop). */
static inline void keel_exp_row(float *x, float shift, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = keel_expf_fast(x[i] - shift);
}

/* max over a contiguous row (NaN elements are skipped, as fmaxf does; -inf for n = 0). Written as
 * a compare and select, which is the vector max instruction (a partial is never NaN, so a NaN
 * element loses the compare); GCC keeps fmaxf a scalar call for its NaN rules. */
static inline float keel_max_row(const float *x, int64_t n) {
    float p[KEEL_LANES];
    for (int l = 0; l < KEEL_LANES; l++) p[l] = -INFINITY;
    int64_t i = 0;
    for (; i + KEEL_LANES <= n; i += KEEL_LANES)
        for (int l = 0; l < KEEL_LANES; l++) p[l] = x[i + l] > p[l] ? x[i + l] : p[l];
    for (int l = 0; l < KEEL_LANES && i < n; i++, l++) p[l] = x[i] > p[l] ? x[i] : p[l];
    float m = -INFINITY;
    for (int l = 0; l < KEEL_LANES; l++) m = fmaxf(m, p[l]);
    return m;
}

/* sum of a contiguous row in float64 */
static inline double keel_sum_row_f64(const float *x, int64_t n) {
    double p[KEEL_LANES] = {0};
    int64_t i = 0;
    for (; i + KEEL_LANES <= n; i += KEEL_LANES)
        for (int l = 0; l < KEEL_LANES; l++) p[l] += (double)x[i + l];
    for (int l = 0; l < KEEL_LANES && i < n; i++, l++) p[l] += (double)x[i];
    double s = 0;
    for (int l = 0; l < KEEL_LANES; l++) s += p[l];
    return s;
}

#endif
