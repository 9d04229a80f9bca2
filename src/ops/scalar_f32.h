/* keel: the float32 formulas of the unary and binary op families, written once for the cpu
 * backend (C) and the CUDA kernels (nvcc sees __host__ __device__). Floating-point contraction is
 * off in both (-ffp-contract=off, -fmad=false), so `s * x + b` rounds twice on each. The float64
 * reference (backends/ref) keeps formulas of its own: it is what these are checked against. */
#ifndef KEEL_SCALAR_F32_H
#define KEEL_SCALAR_F32_H

#include <math.h>

#include "ops/op_table.h"
#include "tensor/convert.h" /* KEEL_HD */

/* FAM_UNARY: y = f(x); s and b are SCALE's parameters (fp0, fp1). */
KEEL_HD float keel_unary_f32(int op, float x, float s, float b) {
    switch (op) {
    case KEEL_OP_SCALE:
        return s * x + b;
    case KEEL_OP_SQR:
        return x * x;
    case KEEL_OP_SQRT:
        return sqrtf(x);
    case KEEL_OP_EXP:
        return expf(x);
    case KEEL_OP_LOG:
        return logf(x);
    case KEEL_OP_NEG:
        return -x;
    case KEEL_OP_SILU:
        return x / (1.0f + expf(-x));
    case KEEL_OP_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    case KEEL_OP_SOFTPLUS:
        return x > 20.0f ? x : log1pf(expf(x));
    default:
        return NAN;
    }
}

/* FAM_BINARY: y = f(a, b), b broadcast over a. */
KEEL_HD float keel_binary_f32(int op, float a, float b) {
    switch (op) {
    case KEEL_OP_ADD:
        return a + b;
    case KEEL_OP_SUB:
        return a - b;
    case KEEL_OP_MUL:
        return a * b;
    case KEEL_OP_DIV:
        return a / b;
    default:
        return NAN;
    }
}

#endif
