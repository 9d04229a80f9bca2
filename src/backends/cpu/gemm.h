/* keel: the cpu backend's matrix product, C(m,n) (+)= sum_k A(m,k) B(k,n) in float32 (A and B
 * float32, or bf16 on the AVX-512 BF16 kernel), for any byte strides. Packed, cache-blocked, an
 * AVX-512 or AVX2/FMA micro-kernel chosen at run time by CPU features. Work is split over tiles of
 * C only and K is blocked by a fixed KC, so every element is summed in the same order whatever the
 * thread count. */
#ifndef KEEL_CPU_GEMM_H
#define KEEL_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/cpu/threadpool.h"

typedef struct {
    int64_t M, N, K;
    const void *A;
    int64_t a_m, a_k; /* byte strides of A(m,k) */
    const void *B;
    int64_t b_k, b_n; /* byte strides of B(k,n) */
    float *C;
    int64_t c_m, c_n; /* byte strides of C(m,n) */
    bool accumulate;  /* C += A B instead of C = A B */
    /* A (B) holds bf16 values, 2 bytes each (strides still in bytes). Both: the bf16 kernel where
     * the CPU has one; otherwise bf16 operands are widened to float32 (exactly) as they are packed,
     * for the float32 kernel: no float32 copy of the operand is made either way. */
    bool a_bf16, b_bf16;
} keel_gemm_args;

/* Returns -1 (with an error) only when scratch memory cannot be had. */
int keel_cpu_gemm(keel_pool *pool, const keel_gemm_args *g);
/* Which float32 micro-kernel runs on this CPU ("avx512f 32x12", "avx2-fma 16x6" or "portable 16x6";
 * the environment variable KEEL_GEMM_ISA=avx512|avx2|portable asks for a narrower one, read at each
 * product). */
const char *keel_cpu_gemm_kernel(void);
/* The kernel for products of two bf16 operands ("avx512bf16 32x12": VDPBF16PS, float32 sums), or
 * NULL where the CPU lacks AVX-512 BF16 or KEEL_GEMM_ISA asks for a narrower kernel (avx512, avx2,
 * portable): they then run on the float32 kernel, widened as they are packed. Both give the same
 * bits, except that the instruction reads subnormal bf16 inputs and writes subnormal partial sums
 * (below 2^-126) as zero. */
const char *keel_cpu_gemm_bf16_kernel(void);
/* Floats per vector register of that kernel (16, 8 or 1), for the peak the benchmark reports. */
int keel_cpu_gemm_vector_floats(void);

#endif
