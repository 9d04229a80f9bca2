#include "backends/cpu/gemm.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KEEL_X86 1
#endif

/* Blocking: an MC x KC block of A (256 KiB) stays in L2, a KC x NR micro-panel of B (12 or 24 KiB) in L1.
 * KC is fixed (not derived from the thread count): it decides each element's summation order. */
#ifndef KEEL_GEMM_KC
#define KEEL_GEMM_KC 512
#endif
#ifndef KEEL_GEMM_MC
#define KEEL_GEMM_MC 128
#endif
/* MC, NC and NC_BLOCK are multiples of every kernel's MR and NR. B is packed NC_BLOCK columns at
 * a time (KC x NC_BLOCK, 1.5 MiB: it stays in cache while every row block of A sweeps it; packing
 * all of N at once streamed the LM head's 248,320 columns from memory once per row block, and
 * 768 measured better than 1536 and 3840 on the weight-gradient shapes). Each element of C is summed over k in
 * ascending order, one fused multiply-add per step, in KC blocks added to C in order: the same
 * bits for the AVX-512 and the AVX2 kernel (both fuse), whatever the tile shape or thread count. */
#ifndef KEEL_GEMM_NC_BLOCK
#define KEEL_GEMM_NC_BLOCK 768
#endif
enum { MR_MAX = 32, NR_MAX = 12, KC = KEEL_GEMM_KC, MC = KEEL_GEMM_MC, NC = 384, NC_BLOCK = KEEL_GEMM_NC_BLOCK };

/* One mr x nr tile over kc steps: acc[j*mr + i] = sum_k Ap[k*mr + i] Bp[k*nr + j]; the caller then
 * sets C = acc (first) or adds C += acc. */
typedef void (*tile_fn)(int64_t kc, const float *Ap, const float *Bp, float *acc);
/* The same for a whole mr x nr tile of a C whose columns are contiguous (ldc floats apart),
 * written from the registers: C = sum (first) or C += sum, the same roundings as through acc. */
typedef void (*tile_c_fn)(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, bool first);

typedef struct {
    const char *name;
    int mr, nr;
    tile_fn tile;
    tile_c_fn tile_c; /* NULL: every tile goes through acc */
    int vec_floats;   /* floats per vector register, for the peak */
} gemm_kernel;

static void tile_portable(int64_t kc, const float *Ap, const float *Bp, float *acc) {
    enum { MR = 16, NR = 6 };
    float c[NR][MR] = {{0}};
    for (int64_t k = 0; k < kc; k++, Ap += MR, Bp += NR)
        for (int j = 0; j < NR; j++)
            for (int i = 0; i < MR; i++) c[j][i] += Ap[i] * Bp[j];
    memcpy(acc, c, sizeof c);
}

#ifdef KEEL_X86
__attribute__((target("avx2,fma"))) static void tile_avx2(int64_t kc, const float *Ap, const float *Bp, float *acc) {
    enum { MR = 16, NR = 6 };
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++, Ap += MR, Bp += NR) {
        _mm_prefetch((const char *)(Ap + 8 * MR), _MM_HINT_T0);
        __m256 a0 = _mm256_load_ps(Ap), a1 = _mm256_load_ps(Ap + 8), b;
        b = _mm256_broadcast_ss(Bp + 0);
        c00 = _mm256_fmadd_ps(a0, b, c00);
        c01 = _mm256_fmadd_ps(a1, b, c01);
        b = _mm256_broadcast_ss(Bp + 1);
        c10 = _mm256_fmadd_ps(a0, b, c10);
        c11 = _mm256_fmadd_ps(a1, b, c11);
        b = _mm256_broadcast_ss(Bp + 2);
        c20 = _mm256_fmadd_ps(a0, b, c20);
        c21 = _mm256_fmadd_ps(a1, b, c21);
        b = _mm256_broadcast_ss(Bp + 3);
        c30 = _mm256_fmadd_ps(a0, b, c30);
        c31 = _mm256_fmadd_ps(a1, b, c31);
        b = _mm256_broadcast_ss(Bp + 4);
        c40 = _mm256_fmadd_ps(a0, b, c40);
        c41 = _mm256_fmadd_ps(a1, b, c41);
        b = _mm256_broadcast_ss(Bp + 5);
        c50 = _mm256_fmadd_ps(a0, b, c50);
        c51 = _mm256_fmadd_ps(a1, b, c51);
    }
    _mm256_store_ps(acc + 0, c00), _mm256_store_ps(acc + 8, c01);
    _mm256_store_ps(acc + 16, c10), _mm256_store_ps(acc + 24, c11);
    _mm256_store_ps(acc + 32, c20), _mm256_store_ps(acc + 40, c21);
    _mm256_store_ps(acc + 48, c30), _mm256_store_ps(acc + 56, c31);
    _mm256_store_ps(acc + 64, c40), _mm256_store_ps(acc + 72, c41);
    _mm256_store_ps(acc + 80, c50), _mm256_store_ps(acc + 88, c51);
}
#endif

#ifdef KEEL_X86
/* 32 x 12: 24 accumulators, two A vectors and a broadcast in the 32 zmm registers; each k step
 * loads 32 floats of A and 12 of B for 24 FMAs. */
#define FMA2(j)                                                                                                        \
    b = _mm512_set1_ps(Bp[j]);                                                                                         \
    c##j##0 = _mm512_fmadd_ps(a0, b, c##j##0);                                                                         \
    c##j##1 = _mm512_fmadd_ps(a1, b, c##j##1);
#define PUT2(j)                                                                                                        \
    if (first) {                                                                                                       \
        _mm512_storeu_ps(C + (j)*ldc, c##j##0);                                                                        \
        _mm512_storeu_ps(C + (j)*ldc + 16, c##j##1);                                                                   \
    } else {                                                                                                           \
        _mm512_storeu_ps(C + (j)*ldc, _mm512_add_ps(_mm512_loadu_ps(C + (j)*ldc), c##j##0));                           \
        _mm512_storeu_ps(C + (j)*ldc + 16, _mm512_add_ps(_mm512_loadu_ps(C + (j)*ldc + 16), c##j##1));                 \
    }
__attribute__((target("avx512f"))) static void tile_avx512_c(int64_t kc, const float *Ap, const float *Bp, float *C,
                                                             int64_t ldc, bool first) {
    for (int j = 0; j < 12; j++) { /* C's lines on their way while the k loop runs */
        _mm_prefetch((const char *)(C + j * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + j * ldc + 16), _MM_HINT_T0);
    }
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00,
           c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++, Ap += 32, Bp += 12) {
        _mm_prefetch((const char *)(Ap + 8 * 32), _MM_HINT_T0);
        __m512 a0 = _mm512_load_ps(Ap), a1 = _mm512_load_ps(Ap + 16), b;
        FMA2(0) FMA2(1) FMA2(2) FMA2(3) FMA2(4) FMA2(5) FMA2(6) FMA2(7) FMA2(8) FMA2(9) FMA2(10) FMA2(11)
    }
    PUT2(0) PUT2(1) PUT2(2) PUT2(3) PUT2(4) PUT2(5) PUT2(6) PUT2(7) PUT2(8) PUT2(9) PUT2(10) PUT2(11)
}
#undef FMA2 /* PUT2 stays defined: tile_bf16_c writes its tile the same way */
/* The tile into acc: acc is a C of columns 32 floats apart. */
__attribute__((target("avx512f"))) static void tile_avx512(int64_t kc, const float *Ap, const float *Bp, float *acc) {
    tile_avx512_c(kc, Ap, Bp, acc, 32, true);
}
#endif

#ifdef KEEL_X86
/* bf16 operands, 32 x 12 like tile_avx512_c: panels hold k in pairs, one 32-bit slot per row (A) or
 * column (B) per pair, k in the upper half and k + 1 in the lower. VDPBF16PS adds the upper halves'
 * product first, then the lower's, each rounded once (a product of two bf16 is exact in float32):
 * the same two roundings as two FMAs in k order. Measured on this instruction against fmaf in both
 * orders: upper-first matches bit for bit. kc is in k steps; an odd kc's last pair has a zero lower half. */
#define DP2(j)                                                                                                         \
    b = (__m512bh)_mm512_castps_si512(_mm512_set1_ps(Bp[j]));                                                          \
    c##j##0 = _mm512_dpbf16_ps(c##j##0, a0, b);                                                                        \
    c##j##1 = _mm512_dpbf16_ps(c##j##1, a1, b);
__attribute__((target("avx512f,avx512bf16"))) static void tile_bf16_c(int64_t kc, const float *Ap, const float *Bp,
                                                                      float *C, int64_t ldc, bool first) {
    for (int j = 0; j < 12; j++) {
        _mm_prefetch((const char *)(C + j * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + j * ldc + 16), _MM_HINT_T0);
    }
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00,
           c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    const int64_t np = (kc + 1) / 2;
#pragma GCC unroll 2
    for (int64_t p = 0; p < np; p++, Ap += 32, Bp += 12) {
        _mm_prefetch((const char *)(Ap + 8 * 32), _MM_HINT_T0);
        __m512bh a0 = (__m512bh)_mm512_castps_si512(_mm512_load_ps(Ap)),
                 a1 = (__m512bh)_mm512_castps_si512(_mm512_load_ps(Ap + 16)), b;
        DP2(0) DP2(1) DP2(2) DP2(3) DP2(4) DP2(5) DP2(6) DP2(7) DP2(8) DP2(9) DP2(10) DP2(11)
    }
    PUT2(0) PUT2(1) PUT2(2) PUT2(3) PUT2(4) PUT2(5) PUT2(6) PUT2(7) PUT2(8) PUT2(9) PUT2(10) PUT2(11)
}
#undef PUT2
#undef DP2
__attribute__((target("avx512f,avx512bf16"))) static void tile_bf16(int64_t kc, const float *Ap, const float *Bp,
                                                                    float *acc) {
    tile_bf16_c(kc, Ap, Bp, acc, 32, true);
}
#endif

static const gemm_kernel K_PORTABLE = {"portable 16x6", 16, 6, tile_portable, NULL, 1};
#ifdef KEEL_X86
static const gemm_kernel K_AVX2 = {"avx2-fma 16x6", 16, 6, tile_avx2, NULL, 8};
static const gemm_kernel K_AVX512 = {"avx512f 32x12", 32, 12, tile_avx512, tile_avx512_c, 16};
static const gemm_kernel K_BF16 = {"avx512bf16 32x12", 32, 12, tile_bf16, tile_bf16_c, 16};
#endif

/* The widest kernel the CPU runs; KEEL_GEMM_ISA=avx512|avx2|portable picks a narrower one (to
 * compare them; an unavailable one falls back). */
static const gemm_kernel *pick_kernel(void) {
    const char *want = getenv("KEEL_GEMM_ISA");
    (void)want;
#ifdef KEEL_X86
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
    if (want && !strcmp(want, "portable")) return &K_PORTABLE;
    if (avx512 && !(want && !strcmp(want, "avx2"))) return &K_AVX512;
    if (avx2) return &K_AVX2;
#endif
    return &K_PORTABLE;
}

/* The bf16 kernel where the CPU has it and KEEL_GEMM_ISA (avx512bf16, or unset) lets it run. */
static const gemm_kernel *pick_bf16_kernel(void) {
#ifdef KEEL_X86
    const char *want = getenv("KEEL_GEMM_ISA");
    if (pick_kernel() == &K_AVX512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && (!want || !*want || !strcmp(want, "avx512bf16")))
        return &K_BF16;
#endif
    return NULL;
}

const char *keel_cpu_gemm_kernel(void) { return pick_kernel()->name; }

const char *keel_cpu_gemm_bf16_kernel(void) {
    const gemm_kernel *k = pick_bf16_kernel();
    return k ? k->name : NULL;
}

int keel_cpu_gemm_vector_floats(void) { return pick_kernel()->vec_floats; }

typedef struct {
    const keel_gemm_args *g;
    int64_t pc, kc, jc, ncb; /* the k block; the column block [jc, jc + ncb) B is packed for */
    float *Bp;               /* packed panel: for each NR column group of the block, kc x NR */
    float **Ap;              /* per thread: MC x kc, MR-row groups of kc x MR */
    const float *Apre;       /* or every (k block, row block) of A packed once, a_blk floats each (NULL: no) */
    int64_t a_blk, b_blk;    /* fused: B packed for every k block, b_blk floats apart */
    bool fused, pairs;       /* pairs: the bf16 kernel's panels (k in pairs) */
    int64_t n_mblk, n_nblk;
    const gemm_kernel *kern;
    int mr, nr;
    bool avx2;
} gemm_ctx;

static inline float ldf(const void *base, int64_t off) {
    float v;
    memcpy(&v, (const char *)base + off, 4);
    return v;
}

/* 32-bit slots a panel gives each row (A) or column (B) over kc steps of k: one per k, or one per
 * pair of k for bf16 operands. */
static inline int64_t kslots(const gemm_ctx *c, int64_t kc) { return c->pairs ? (kc + 1) / 2 : kc; }

#ifdef KEEL_X86
static void pack_rows8(const char *A, int64_t a_m, int64_t kc, float *d, int MR);
static void pack_rows4(const char *A, int64_t a_m, int64_t kc, float *d, int MR);
#endif
static void pack_pairs(const char *base, int64_t s_k, int64_t s_x, int64_t nx, int64_t kc, float *d, int W);
static void pack_widen(const gemm_ctx *c, const char *base, int64_t s_k, int64_t s_x, int64_t nx, float *d, int W);

/* pack_b's items: the rows k of the block when rows of B are contiguous in n (each thread reads
 * whole rows: splitting the columns halved each row's contiguous run), else its NR-column groups */
enum { PACK_KR = 32 };
static int64_t pack_b_items(const gemm_ctx *c) {
    return c->g->b_n == 4 && !c->g->b_bf16 ? (c->kc + PACK_KR - 1) / PACK_KR : (c->ncb + c->nr - 1) / c->nr;
}

static void pack_b(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    gemm_ctx *c = arg;
    const keel_gemm_args *g = c->g;
    const int NR = c->nr;
    const int64_t end_col = c->jc + c->ncb;
    if (g->b_bf16) {
        for (int64_t jg = begin; jg < end; jg++) {
            int64_t j0 = c->jc + jg * NR, nj = end_col - j0 < NR ? end_col - j0 : NR;
            const char *src = (const char *)g->B + c->pc * g->b_k + j0 * g->b_n;
            float *dst = c->Bp + jg * kslots(c, c->kc) * NR;
            if (c->pairs)
                pack_pairs(src, g->b_k, g->b_n, nj, c->kc, dst, NR);
            else
                pack_widen(c, src, g->b_k, g->b_n, nj, dst, NR);
        }
        return;
    }
    if (g->b_n == 4) { /* rows of B contiguous in n: items are blocks of KR rows (pack_b_items) */
        int64_t groups = (c->ncb + NR - 1) / NR;
        for (int64_t k0 = begin * PACK_KR; k0 < end * PACK_KR && k0 < c->kc; k0 += PACK_KR) {
            int64_t k1 = k0 + PACK_KR < c->kc ? k0 + PACK_KR : c->kc;
            /* a block of rows (far apart: the LM head's are 1 MiB) read once into cache, then each
             * panel gets its KR rows as one contiguous run: writing 48 bytes to each of 64 panels per
             * row missed the cache on every store */
            for (int64_t jg = 0; jg < groups; jg++) {
                int64_t j0 = c->jc + jg * NR, nj = end_col - j0 < NR ? end_col - j0 : NR;
                float *dst = c->Bp + jg * c->kc * NR + k0 * NR;
                for (int64_t k = k0; k < k1; k++, dst += NR) {
                    const float *src =
                        (const float *)(const void *)((const char *)g->B + (c->pc + k) * g->b_k + j0 * 4);
                    if (nj == 12 && NR == 12) { /* a fixed size: vector moves (an element loop stayed scalar) */
                        memcpy(dst, src, 12 * sizeof(float));
                    } else if (nj == 6 && NR == 6) {
                        memcpy(dst, src, 6 * sizeof(float));
                    } else {
                        for (int64_t j = 0; j < NR; j++) dst[j] = j < nj ? src[j] : 0.0f;
                    }
                }
            }
        }
        return;
    }
    for (int64_t jg = begin; jg < end; jg++) {
        float *dst = c->Bp + jg * c->kc * NR;
        int64_t j0 = c->jc + jg * NR, nj = end_col - j0 < NR ? end_col - j0 : NR;
#ifdef KEEL_X86
        if (g->b_k == 4 && nj == NR && c->avx2) { /* columns of B contiguous in k: transpose in registers */
            const char *src = (const char *)g->B + j0 * g->b_n + c->pc * 4;
            int j = 0;
            for (; j + 8 <= NR; j += 8) pack_rows8(src + j * g->b_n, g->b_n, c->kc, dst + j, NR);
            for (; j + 4 <= NR; j += 4) pack_rows4(src + j * g->b_n, g->b_n, c->kc, dst + j, NR);
            for (; j < NR; j++)
                for (int64_t k = 0; k < c->kc; k++) dst[k * NR + j] = ldf(src, j * g->b_n + k * 4);
            continue;
        }
#endif
        for (int64_t k = 0; k < c->kc; k++) {
            int64_t koff = (c->pc + k) * g->b_k;
            for (int64_t j = 0; j < NR; j++) dst[k * NR + j] = j < nj ? ldf(g->B, koff + (j0 + j) * g->b_n) : 0.0f;
        }
    }
}

#ifdef KEEL_X86
/* 8 rows of a matrix stored with k contiguous (row stride a_m bytes): 8 rows x 8 k at a time,
 * transposed in registers into d[k*MR + i]. For A panels (MR floats a k step) and B panels (NR). */
__attribute__((target("avx2"))) static void pack_rows8(const char *A, int64_t a_m, int64_t kc, float *d, int MR) {
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 r0 = _mm256_loadu_ps((const float *)(const void *)(A + 0 * a_m) + k);
        __m256 r1 = _mm256_loadu_ps((const float *)(const void *)(A + 1 * a_m) + k);
        __m256 r2 = _mm256_loadu_ps((const float *)(const void *)(A + 2 * a_m) + k);
        __m256 r3 = _mm256_loadu_ps((const float *)(const void *)(A + 3 * a_m) + k);
        __m256 r4 = _mm256_loadu_ps((const float *)(const void *)(A + 4 * a_m) + k);
        __m256 r5 = _mm256_loadu_ps((const float *)(const void *)(A + 5 * a_m) + k);
        __m256 r6 = _mm256_loadu_ps((const float *)(const void *)(A + 6 * a_m) + k);
        __m256 r7 = _mm256_loadu_ps((const float *)(const void *)(A + 7 * a_m) + k);
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        _mm256_storeu_ps(d + (k + 0) * MR, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(d + (k + 1) * MR, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(d + (k + 2) * MR, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(d + (k + 3) * MR, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(d + (k + 4) * MR, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(d + (k + 5) * MR, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(d + (k + 6) * MR, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(d + (k + 7) * MR, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
    for (; k < kc; k++)
        for (int i = 0; i < 8; i++) d[k * MR + i] = ((const float *)(const void *)(A + i * a_m))[k];
}

/* The same for 4 rows, 4 k at a time. */
__attribute__((target("avx2"))) static void pack_rows4(const char *A, int64_t a_m, int64_t kc, float *d, int MR) {
    int64_t k = 0;
    for (; k + 4 <= kc; k += 4) {
        __m128 r0 = _mm_loadu_ps((const float *)(const void *)(A + 0 * a_m) + k);
        __m128 r1 = _mm_loadu_ps((const float *)(const void *)(A + 1 * a_m) + k);
        __m128 r2 = _mm_loadu_ps((const float *)(const void *)(A + 2 * a_m) + k);
        __m128 r3 = _mm_loadu_ps((const float *)(const void *)(A + 3 * a_m) + k);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
        _mm_storeu_ps(d + (k + 0) * MR, r0);
        _mm_storeu_ps(d + (k + 1) * MR, r1);
        _mm_storeu_ps(d + (k + 2) * MR, r2);
        _mm_storeu_ps(d + (k + 3) * MR, r3);
    }
    for (; k < kc; k++)
        for (int i = 0; i < 4; i++) d[k * MR + i] = ((const float *)(const void *)(A + i * a_m))[k];
}
#endif

/* A bf16 panel of W rows (A) or columns (B) x kc steps of k, element (x, k) at base + k s_k + x s_x
 * bytes, nx of the W valid (the rest zero): slot d[p W + x] holds k = 2p in its upper 16 bits and
 * k = 2p + 1 in its lower (zero past kc), the order tile_bf16_c's instruction sums them in. */
static inline uint32_t ldh(const char *base, int64_t off) {
    uint16_t v;
    memcpy(&v, base + off, 2);
    return v;
}

static void pack_pairs_scalar(const char *base, int64_t s_k, int64_t s_x, int64_t nx, int64_t kc, float *d, int W) {
    for (int64_t p = 0; p < (kc + 1) / 2; p++)
        for (int64_t x = 0; x < W; x++) {
            uint32_t hi = x < nx ? ldh(base, 2 * p * s_k + x * s_x) : 0;
            uint32_t lo = x < nx && 2 * p + 1 < kc ? ldh(base, (2 * p + 1) * s_k + x * s_x) : 0;
            uint32_t u = hi << 16 | lo;
            memcpy(d + p * W + x, &u, 4);
        }
}

#ifdef KEEL_X86
/* x contiguous (s_x = 2 bytes, OUT_PROD's operands): each pair of rows of k widened and merged,
 * 16 x at a time; masked loads read nothing past the nx valid ones. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void pack_pairs_x(const char *base, int64_t s_k, int64_t nx,
                                                                              int64_t kc, float *d, int W) {
    for (int64_t p = 0; p < (kc + 1) / 2; p++) {
        const char *r0 = base + 2 * p * s_k, *r1 = r0 + s_k;
        bool has1 = 2 * p + 1 < kc;
        for (int64_t x = 0; x < W; x += 16) {
            int64_t n = nx - x < 0 ? 0 : nx - x > 16 ? 16 : nx - x, w = W - x < 16 ? W - x : 16;
            __mmask16 m = (__mmask16)((1u << n) - 1);
            __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + x * 2));
            __m512i lo = has1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + x * 2)) : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(d + p * W + x, (__mmask16)((1u << w) - 1),
                                     _mm512_or_si512(_mm512_slli_epi32(hi, 16), lo));
        }
    }
}

/* k contiguous (s_k = 2 bytes, MUL_MAT's operands): a pair is one 4-byte word, k in its lower half;
 * the words transposed like floats (pack_rows8/4 only move bits), then their halves swapped. */
__attribute__((target("avx512f"))) static void swap_halves(float *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_castsi512_ps(_mm512_rol_epi32(_mm512_castps_si512(_mm512_loadu_ps(d + i)), 16)));
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, d + i, 4);
        u = u << 16 | u >> 16;
        memcpy(d + i, &u, 4);
    }
}
#endif

static void pack_pairs(const char *base, int64_t s_k, int64_t s_x, int64_t nx, int64_t kc, float *d, int W) {
#ifdef KEEL_X86
    if (s_x == 2) {
        pack_pairs_x(base, s_k, nx, kc, d, W);
        return;
    }
    /* the words must be 4-byte aligned (an odd K's rows are not): they are read as floats */
    if (s_k == 2 && nx == W && W % 4 == 0 && s_x % 4 == 0 && (uintptr_t)base % 4 == 0) {
        int64_t np = kc / 2, x = 0;
        for (; x + 8 <= W; x += 8) pack_rows8(base + x * s_x, s_x, np, d + x, W);
        for (; x + 4 <= W; x += 4) pack_rows4(base + x * s_x, s_x, np, d + x, W);
        swap_halves(d, np * W);
        if (kc % 2) pack_pairs_scalar(base + np * 4, s_k, s_x, nx, 1, d + np * W, W);
        return;
    }
#endif
    pack_pairs_scalar(base, s_k, s_x, nx, kc, d, W);
}

/* A bf16 operand for the float32 kernel: the panel of W rows (A) or columns (B) x c->kc steps of k,
 * element (x, k) at base + k s_k + x s_x, widened to float32 (exact) into d[k W + x], zero for the
 * x past nx. */
static inline float bf16_at(const char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

enum { WIDEN_KB = 64 }; /* k contiguous: k steps widened per block */
static void pack_widen(const gemm_ctx *c, const char *base, int64_t s_k, int64_t s_x, int64_t nx, float *d, int W) {
    const int64_t kc = c->kc;
#ifdef KEEL_X86
    if (s_k == 2 && nx == W && W % 8 == 0 && c->avx2) {
        /* k contiguous (the LM head's logits): WIDEN_KB steps of each row widened into a block,
         * then transposed like float32 rows */
        _Alignas(64) float blk[MR_MAX * WIDEN_KB];
        for (int64_t k0 = 0; k0 < kc; k0 += WIDEN_KB) {
            int64_t nk = kc - k0 < WIDEN_KB ? kc - k0 : WIDEN_KB;
            for (int64_t x = 0; x < W; x++)
                for (int64_t k = 0; k < nk; k++) blk[x * WIDEN_KB + k] = bf16_at(base + x * s_x + (k0 + k) * 2);
            for (int x = 0; x < W; x += 8)
                pack_rows8((const char *)blk + x * WIDEN_KB * 4, WIDEN_KB * 4, nk, d + k0 * W + x, W);
        }
        return;
    }
#endif
    for (int64_t k = 0; k < kc; k++) {
        const char *row = base + k * s_k;
        for (int64_t x = 0; x < W; x++) d[k * W + x] = x < nx ? bf16_at(row + x * s_x) : 0.0f;
    }
}

static void pack_a(const gemm_ctx *c, float *dst, int64_t m0, int64_t mb) {
    const keel_gemm_args *g = c->g;
    const int MR = c->mr;
    for (int64_t ig = 0; ig < (mb + MR - 1) / MR; ig++) {
        float *d = dst + ig * kslots(c, c->kc) * MR;
        int64_t i0 = m0 + ig * MR, ni = m0 + mb - i0 < MR ? m0 + mb - i0 : MR;
        if (g->a_bf16) {
            const char *src = (const char *)g->A + c->pc * g->a_k + i0 * g->a_m;
            if (c->pairs)
                pack_pairs(src, g->a_k, g->a_m, ni, c->kc, d, MR);
            else
                pack_widen(c, src, g->a_k, g->a_m, ni, d, MR);
            continue;
        }
        if (g->a_m == 4) { /* rows of A contiguous in m: copy MR at a time */
            for (int64_t k = 0; k < c->kc; k++) {
                const char *src = (const char *)g->A + (c->pc + k) * g->a_k + i0 * 4;
                memcpy(d + k * MR, src, (size_t)ni * 4);
                for (int64_t i = ni; i < MR; i++) d[k * MR + i] = 0.0f;
            }
        } else {
#ifdef KEEL_X86
            if (g->a_k == 4 && ni == MR && c->avx2) {
                const char *src = (const char *)g->A + i0 * g->a_m + c->pc * 4;
                for (int r = 0; r < MR; r += 8) pack_rows8(src + r * g->a_m, g->a_m, c->kc, d + r, MR);
                continue;
            }
#endif
            for (int64_t i = 0; i < MR; i++) {
                if (i >= ni) {
                    for (int64_t k = 0; k < c->kc; k++) d[k * MR + i] = 0.0f;
                    continue;
                }
                const char *src = (const char *)g->A + (i0 + i) * g->a_m + c->pc * g->a_k;
                for (int64_t k = 0; k < c->kc; k++) d[k * MR + i] = ldf(src, k * g->a_k);
            }
        }
    }
}

/* Pack every (k block, row block) of A once, task x = k block * n_mblk + row block. */
static void prepack_a(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const gemm_ctx *c = arg;
    for (int64_t x = begin; x < end; x++) {
        gemm_ctx b = *c;
        int64_t ib = x % c->n_mblk, m0 = ib * MC;
        b.pc = x / c->n_mblk * KC, b.kc = c->g->K - b.pc < KC ? c->g->K - b.pc : KC;
        pack_a(&b, (float *)c->Apre + x * c->a_blk, m0, c->g->M - m0 < MC ? c->g->M - m0 : MC);
    }
}

/* One mr x nr tile of C over one k block: C = sum (first) or C += sum. */
static void tile_to_c(const gemm_ctx *c, int64_t kc, const float *Ap, const float *Bp, int64_t col0, int64_t row0,
                      int64_t ni, int64_t nj, bool first, float *acc) {
    const keel_gemm_args *g = c->g;
    const int MR = c->mr, NR = c->nr;
    if (c->kern->tile_c && ni == MR && nj == NR && g->c_m == 4 && g->c_n % 4 == 0) { /* a whole tile, straight to C */
        c->kern->tile_c(kc, Ap, Bp, (float *)((char *)g->C + col0 * g->c_n + row0 * 4), g->c_n / 4, first);
        return;
    }
    c->kern->tile(kc, Ap, Bp, acc);
    for (int64_t j = 0; j < nj; j++) {
        char *col = (char *)g->C + (col0 + j) * g->c_n + row0 * g->c_m;
        const float *a = acc + j * MR;
        if (g->c_m == 4) {
            float *cc = (float *)col;
            if (first)
                memcpy(cc, a, (size_t)ni * 4);
            else
                for (int64_t i = 0; i < ni; i++) cc[i] += a[i];
        } else {
            for (int64_t i = 0; i < ni; i++) {
                float *cc = (float *)(col + i * g->c_m);
                *cc = first ? a[i] : *cc + a[i];
            }
        }
    }
}

/* The tasks of a column block: row block x column part. Each NR-column strip of C runs the k
 * blocks [kb0, kb1) in order, one after the other while the strip is hot (the fused path, A and B
 * packed for every k block), or the one k block c->pc (A packed here or before, B for that block).
 * Either way each element is C = sum of the first k block, then C += the next one's: the same bits. */
static void compute_blocks(void *arg, int64_t begin, int64_t end, int thread) {
    gemm_ctx *c = arg;
    const keel_gemm_args *g = c->g;
    const int MR = c->mr, NR = c->nr;
    _Alignas(64) float acc[NR_MAX * MR_MAX];
    int64_t kb0 = c->fused ? 0 : c->pc / KC, kb1 = c->fused ? (g->K + KC - 1) / KC : kb0 + 1;
    for (int64_t task = begin; task < end; task++) {
        int64_t ib = task / c->n_nblk, jb = task % c->n_nblk;
        int64_t m0 = ib * MC, mb = g->M - m0 < MC ? g->M - m0 : MC;
        int64_t ncol = c->n_nblk == 1 ? c->ncb : NC;
        int64_t n0 = jb * ncol, nbk = c->ncb - n0 < ncol ? c->ncb - n0 : ncol; /* within the column block */
        if (!c->Apre) pack_a(c, c->Ap[thread], m0, mb);
        for (int64_t jr = 0; jr < nbk; jr += NR) {
            int64_t nj = nbk - jr < NR ? nbk - jr : NR;
            /* k blocks outside the row tiles: one micro-panel of B stays in L1 while the tiles sweep it */
            for (int64_t kb = kb0; kb < kb1; kb++) {
                int64_t kc = g->K - kb * KC < KC ? g->K - kb * KC : KC;
                const float *Ap = c->Apre ? c->Apre + (kb * c->n_mblk + ib) * c->a_blk : c->Ap[thread];
                const float *Bp = c->Bp + (c->fused ? kb * c->b_blk : 0) + ((n0 + jr) / NR) * kslots(c, kc) * NR;
                for (int64_t ir = 0; ir < mb; ir += MR) {
                    int64_t ni = mb - ir < MR ? mb - ir : MR;
                    tile_to_c(c, kc, Ap + (ir / MR) * kslots(c, kc) * MR, Bp, c->jc + n0 + jr, m0 + ir, ni, nj,
                              kb == 0 && !g->accumulate, acc);
                }
            }
        }
    }
}

/* Packing buffers, kept by the calling thread from one product to the next and grown when a
 * product needs more: a fresh allocation per call cost page faults that dominated products of
 * n = 512. Contents never carry over (each product packs before it reads). */
enum { KEEL_GEMM_MAX_THREADS = 1024 }; /* the --threads range */
static _Thread_local struct {
    float *Bp, *Ap[KEEL_GEMM_MAX_THREADS], *Apre;
    size_t Bp_bytes, Ap_bytes, Apre_bytes;
    int n_ap;
} scratch;

/* A packed whole, when it is small and B is wide: packing it per column block of B cost the LM
 * head's weight gradient (1024 x 248320 x 1024: 323 column blocks) a re-pack of A per block. */
enum { APRE_MAX_BYTES = 16 << 20 };
static float *scratch_apre(size_t bytes) {
    if (bytes > scratch.Apre_bytes) {
        free(scratch.Apre);
        scratch.Apre = aligned_alloc(64, (bytes + 63) / 64 * 64);
        scratch.Apre_bytes = scratch.Apre ? bytes : 0;
    }
    return scratch.Apre;
}

static int scratch_get(float **Bp, size_t b_bytes, float ***Ap, int nt, size_t a_bytes) {
    if (nt > KEEL_GEMM_MAX_THREADS) return -1;
    if (b_bytes > scratch.Bp_bytes) {
        free(scratch.Bp);
        scratch.Bp = aligned_alloc(64, (b_bytes + 63) / 64 * 64);
        scratch.Bp_bytes = scratch.Bp ? b_bytes : 0;
        if (!scratch.Bp) return -1;
    }
    if (a_bytes > scratch.Ap_bytes || nt > scratch.n_ap) {
        for (int t = 0; t < scratch.n_ap; t++) free(scratch.Ap[t]);
        scratch.n_ap = 0;
        size_t want = a_bytes > scratch.Ap_bytes ? a_bytes : scratch.Ap_bytes;
        for (int t = 0; t < nt; t++) {
            scratch.Ap[t] = aligned_alloc(64, (want + 63) / 64 * 64);
            if (!scratch.Ap[t]) {
                for (int u = 0; u < t; u++) free(scratch.Ap[u]);
                scratch.Ap_bytes = 0;
                return -1;
            }
            scratch.n_ap = t + 1;
        }
        scratch.Ap_bytes = want;
    }
    *Bp = scratch.Bp;
    *Ap = scratch.Ap;
    return 0;
}

/* slice: one of the K slices below, whose A is always packed whole and whose tiles run all of its k blocks */
static int gemm_run(keel_pool *pool, const keel_gemm_args *g, bool slice);

/* K of many blocks (the LM head's input gradient sums 248,320 terms): slices of FUSED_KBLK k blocks
 * one after the other, each on the fused path (C goes to cache once a slice, not once a k block;
 * A packed once a slice, not once a column block of B). The first slice sets C (or adds to it), the
 * next ones add: each element is C = first k block, then C += the next, in order, as unsliced. */
enum { FUSED_KBLK = 4 };
int keel_cpu_gemm(keel_pool *pool, const keel_gemm_args *g) {
    int64_t span = (int64_t)FUSED_KBLK * KC, apre = (g->M + MC - 1) / MC * MC * span * 4;
    if (g->M <= 0 || g->N <= 0 || g->K <= span || apre > APRE_MAX_BYTES) return gemm_run(pool, g, false);
    for (int64_t k0 = 0; k0 < g->K; k0 += span) {
        keel_gemm_args s = *g;
        s.A = (const char *)g->A + k0 * g->a_k, s.B = (const char *)g->B + k0 * g->b_k;
        s.K = g->K - k0 < span ? g->K - k0 : span;
        s.accumulate = g->accumulate || k0 > 0;
        if (gemm_run(pool, &s, true)) return -1;
    }
    return 0;
}

static int gemm_run(keel_pool *pool, const keel_gemm_args *g, bool slice) {
    if (g->M <= 0 || g->N <= 0) return 0;
    if (g->K <= 0) { /* empty sum */
        for (int64_t n = 0; n < g->N; n++)
            for (int64_t m = 0; m < g->M; m++)
                if (!g->accumulate) *(float *)((char *)g->C + n * g->c_n + m * g->c_m) = 0.0f;
        return 0;
    }
    int nt = keel_pool_size(pool);
    gemm_ctx c = {.g = g};
    c.kern = g->a_bf16 && g->b_bf16 && pick_bf16_kernel() ? pick_bf16_kernel() : pick_kernel();
#ifdef KEEL_X86
    c.pairs = c.kern == &K_BF16;
#endif
    c.mr = c.kern->mr, c.nr = c.kern->nr;
    c.avx2 = c.kern != &K_PORTABLE;
    const int MR = c.mr, NR = c.nr;
    int64_t n_groups = ((g->N < NC_BLOCK ? g->N : NC_BLOCK) + NR - 1) / NR;
    c.n_mblk = (g->M + MC - 1) / MC;
    int64_t kc_max = g->K < KC ? g->K : KC;
    /* A small and B wide: A packed once (prepack_a); and with few k blocks, every tile runs all of
     * them while it is hot, B packed for each (C then goes to memory once, not once per k block:
     * the LM head's weight gradient writes 1 GiB). Neither changes any element's order of sums. */
    c.a_blk = ((MC + MR - 1) / MR) * MR * kc_max, c.b_blk = n_groups * NR * kc_max;
    int64_t n_kblk = (g->K + KC - 1) / KC, n_cblk = (g->N + NC_BLOCK - 1) / NC_BLOCK;
    size_t apre = (size_t)(n_kblk * c.n_mblk * c.a_blk) * 4;
    bool pre = (n_cblk >= 4 || slice) && apre <= APRE_MAX_BYTES;
    c.fused = pre && n_kblk > 1 && n_kblk <= FUSED_KBLK;
    int rc = scratch_get(&c.Bp, (size_t)(c.b_blk * (c.fused ? n_kblk : 1)) * 4, &c.Ap, nt,
                         (size_t)(((MC + MR - 1) / MR) * MR * kc_max * 4));
    if (!rc && pre && (c.Apre = scratch_apre(apre)) != NULL) keel_pool_for(pool, n_kblk * c.n_mblk, prepack_a, &c);
    c.fused = c.fused && c.Apre;
    for (int64_t jc = 0; c.fused && jc < g->N && !rc; jc += NC_BLOCK) {
        c.jc = jc, c.ncb = g->N - jc < NC_BLOCK ? g->N - jc : NC_BLOCK;
        c.n_nblk = c.n_mblk >= 2 * nt ? 1 : (c.ncb + NC - 1) / NC;
        float *Bp0 = c.Bp;
        for (int64_t kb = 0; kb < n_kblk; kb++) {
            c.pc = kb * KC, c.kc = g->K - c.pc < KC ? g->K - c.pc : KC, c.Bp = Bp0 + kb * c.b_blk;
            keel_pool_for(pool, pack_b_items(&c), pack_b, &c);
        }
        c.Bp = Bp0;
        keel_pool_for(pool, c.n_mblk * c.n_nblk, compute_blocks, &c);
    }
    for (int64_t pc = 0; !c.fused && pc < g->K && !rc; pc += KC) {
        c.pc = pc;
        c.kc = g->K - pc < KC ? g->K - pc : KC;
        for (int64_t jc = 0; jc < g->N; jc += NC_BLOCK) {
            c.jc = jc, c.ncb = g->N - jc < NC_BLOCK ? g->N - jc : NC_BLOCK;
            /* Enough row blocks to share: each task packs its A block once and sweeps the whole
             * column block. Otherwise split the columns too. Either way, no element's sum order
             * changes: k blocks stay in order for every element. */
            c.n_nblk = c.n_mblk >= 2 * nt ? 1 : (c.ncb + NC - 1) / NC;
            keel_pool_for(pool, pack_b_items(&c), pack_b, &c);
            keel_pool_for(pool, c.n_mblk * c.n_nblk, compute_blocks, &c);
        }
    }
    if (rc)
        return keel_fail("cpu matmul: out of memory for %lldx%lldx%lld scratch", (long long)g->M, (long long)g->N,
                         (long long)g->K);
    return 0;
}
