/* keel: scalar conversions between keel's types, bit exact (round to nearest even), written once
 * for the host and for CUDA device code (nvcc sees __host__ __device__), so every backend's copy
 * path rounds identically. */
#ifndef KEEL_CONVERT_H
#define KEEL_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KEEL_HD __host__ __device__ static inline
#else
#define KEEL_HD static inline
#endif

KEEL_HD float keel_cvt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 5.9604644775390625e-8f;
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

KEEL_HD uint16_t keel_cvt_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {                                  /* below the smallest normal half: subnormal or zero */
        float a;
        memcpy(&a, &ax, 4);
        /* a * 2^24 rounded to nearest even integer gives the subnormal mantissa */
        float m = nearbyintf(a * 16777216.0f);
        return (uint16_t)(sign | (uint32_t)m);
    }
    uint32_t e = ((ax >> 23) - 112) << 10, man = ax & 0x7fffff;
    uint32_t h = e | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

KEEL_HD float keel_cvt_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

KEEL_HD uint16_t keel_cvt_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* g rounded to bf16 (nearest even) and back: the value the mixed-precision LM head keeps of each of
 * its logits and of each element of their gradient. Every backend rounds them so, so they compute
 * one function. */
KEEL_HD float keel_cvt_f32_to_bf16_f32(float g) { return keel_cvt_bf16_to_f32(keel_cvt_f32_to_bf16(g)); }

/* One element of type `type` (a keel_type value) at p, as float64; and the reverse. */
KEEL_HD double keel_cvt_load(int type, const void *p) {
    switch (type) {
    case 0: {
        float f;
        memcpy(&f, p, 4);
        return f;
    } /* F32 */
    case 1: {
        uint16_t h;
        memcpy(&h, p, 2);
        return keel_cvt_f16_to_f32(h);
    } /* F16 */
    case 2: {
        uint16_t h;
        memcpy(&h, p, 2);
        return keel_cvt_bf16_to_f32(h);
    } /* BF16 */
    case 3: {
        int32_t i;
        memcpy(&i, p, 4);
        return i;
    } /* I32 */
    case 4: {
        double d;
        memcpy(&d, p, 8);
        return d;
    } /* F64 */
    default:
        return NAN;
    }
}

KEEL_HD void keel_cvt_store(int type, void *p, double v) {
    switch (type) {
    case 0: {
        float f = (float)v;
        memcpy(p, &f, 4);
        break;
    }
    case 1: {
        uint16_t h = keel_cvt_f32_to_f16((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case 2: {
        uint16_t h = keel_cvt_f32_to_bf16((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case 3: {
        int32_t i = (int32_t)v;
        memcpy(p, &i, 4);
        break;
    }
    case 4:
        memcpy(p, &v, 8);
        break;
    default:
        break;
    }
}

#endif
