#include "backends/cpu/gemm.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KEEL_X86 1
#endif

/* Blocking: an MC x KC block of A (256 KiB) stays in L2, a KC x NR micro-panel of B (12 KiB) in L1.
 * KC is fixed (not derived from the thread count): it decides each element's summation order. */
#ifndef KEEL_GEMM_KC
#define KEEL_GEMM_KC 512
#endif
#ifndef KEEL_GEMM_MC
#define KEEL_GEMM_MC 128
#endif
enum { MR = 16, NR = 6, KC = KEEL_GEMM_KC, MC = KEEL_GEMM_MC, NC = 384 };

/* One MR x NR tile over kc steps: acc = Ap^T Bp, then C = acc (first) or C += acc. */
typedef void (*tile_fn)(int64_t kc, const float *Ap, const float *Bp, float *acc);

static void tile_portable(int64_t kc, const float *Ap, const float *Bp, float *acc) {
    float c[NR][MR] = {{0}};
    for (int64_t k = 0; k < kc; k++, Ap += MR, Bp += NR)
        for (int j = 0; j < NR; j++)
            for (int i = 0; i < MR; i++) c[j][i] += Ap[i] * Bp[j];
    memcpy(acc, c, sizeof c);
}

#ifdef KEEL_X86
__attribute__((target("avx2,fma"))) static void tile_avx2(int64_t kc, const float *Ap, const float *Bp, float *acc) {
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

static tile_fn pick_tile(const char **name) {
#ifdef KEEL_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        if (name) *name = "avx2-fma 16x6";
        return tile_avx2;
    }
#endif
    if (name) *name = "portable 16x6";
    return tile_portable;
}

const char *keel_cpu_gemm_kernel(void) {
    const char *n;
    pick_tile(&n);
    return n;
}

typedef struct {
    const keel_gemm_args *g;
    int64_t pc, kc;
    float *Bp;  /* packed panel: for each NR column group, kc x NR */
    float **Ap; /* per thread: MC x kc, MR-row groups of kc x MR */
    int64_t n_mblk, n_nblk;
    tile_fn tile;
    bool avx2;
} gemm_ctx;

static inline float ldf(const void *base, int64_t off) {
    float v;
    memcpy(&v, (const char *)base + off, 4);
    return v;
}

static void pack_b(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    gemm_ctx *c = arg;
    const keel_gemm_args *g = c->g;
    for (int64_t jg = begin; jg < end; jg++) {
        float *dst = c->Bp + jg * c->kc * NR;
        int64_t j0 = jg * NR, nj = g->N - j0 < NR ? g->N - j0 : NR;
        for (int64_t k = 0; k < c->kc; k++) {
            int64_t koff = (c->pc + k) * g->b_k;
            for (int64_t j = 0; j < NR; j++) dst[k * NR + j] = j < nj ? ldf(g->B, koff + (j0 + j) * g->b_n) : 0.0f;
        }
    }
}

#ifdef KEEL_X86
/* A(m,k) with k contiguous: 8 rows x 8 k at a time, transposed in registers into d[k*MR + i]. */
__attribute__((target("avx2"))) static void pack_a_rows8(const char *A, int64_t a_m, int64_t kc, float *d) {
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
        _mm256_store_ps(d + (k + 0) * MR, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_store_ps(d + (k + 1) * MR, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_store_ps(d + (k + 2) * MR, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_store_ps(d + (k + 3) * MR, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_store_ps(d + (k + 4) * MR, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_store_ps(d + (k + 5) * MR, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_store_ps(d + (k + 6) * MR, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_store_ps(d + (k + 7) * MR, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
    for (; k < kc; k++)
        for (int i = 0; i < 8; i++) d[k * MR + i] = ((const float *)(const void *)(A + i * a_m))[k];
}
#endif

static void pack_a(const gemm_ctx *c, float *dst, int64_t m0, int64_t mb) {
    const keel_gemm_args *g = c->g;
    for (int64_t ig = 0; ig < (mb + MR - 1) / MR; ig++) {
        float *d = dst + ig * c->kc * MR;
        int64_t i0 = m0 + ig * MR, ni = m0 + mb - i0 < MR ? m0 + mb - i0 : MR;
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
                pack_a_rows8(src, g->a_m, c->kc, d);
                pack_a_rows8(src + 8 * g->a_m, g->a_m, c->kc, d + 8);
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

static void compute_blocks(void *arg, int64_t begin, int64_t end, int thread) {
    gemm_ctx *c = arg;
    const keel_gemm_args *g = c->g;
    float *Ap = c->Ap[thread];
    _Alignas(32) float acc[NR * MR];
    bool first = c->pc == 0 && !g->accumulate;
    for (int64_t task = begin; task < end; task++) {
        int64_t ib = task / c->n_nblk, jb = task % c->n_nblk;
        int64_t m0 = ib * MC, mb = g->M - m0 < MC ? g->M - m0 : MC;
        int64_t ncol = c->n_nblk == 1 ? g->N : NC;
        int64_t n0 = jb * ncol, nbk = g->N - n0 < ncol ? g->N - n0 : ncol;
        pack_a(c, Ap, m0, mb);
        for (int64_t jr = 0; jr < nbk; jr += NR) {
            const float *Bp = c->Bp + ((n0 + jr) / NR) * c->kc * NR;
            int64_t nj = nbk - jr < NR ? nbk - jr : NR;
            for (int64_t ir = 0; ir < mb; ir += MR) {
                c->tile(c->kc, Ap + (ir / MR) * c->kc * MR, Bp, acc);
                int64_t ni = mb - ir < MR ? mb - ir : MR;
                for (int64_t j = 0; j < nj; j++) {
                    char *col = (char *)g->C + (n0 + jr + j) * g->c_n + (m0 + ir) * g->c_m;
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
        }
    }
}

int keel_cpu_gemm(keel_pool *pool, const keel_gemm_args *g) {
    if (g->M <= 0 || g->N <= 0) return 0;
    if (g->K <= 0) { /* empty sum */
        for (int64_t n = 0; n < g->N; n++)
            for (int64_t m = 0; m < g->M; m++)
                if (!g->accumulate) *(float *)((char *)g->C + n * g->c_n + m * g->c_m) = 0.0f;
        return 0;
    }
    int nt = keel_pool_size(pool);
    int64_t n_groups = (g->N + NR - 1) / NR;
    gemm_ctx c = {.g = g};
    c.tile = pick_tile(NULL);
    c.avx2 = c.tile != tile_portable;
    c.n_mblk = (g->M + MC - 1) / MC;
    /* Enough row blocks to share: each task packs its A block once and sweeps all of N (B is
     * packed for the whole k-block). Otherwise split N too. Either way, no element's sum order
     * changes. */
    c.n_nblk = c.n_mblk >= 2 * nt ? 1 : (g->N + NC - 1) / NC;
    int64_t kc_max = g->K < KC ? g->K : KC;
    c.Bp = aligned_alloc(64, (size_t)(n_groups * NR * kc_max * 4 + 64) / 64 * 64);
    c.Ap = calloc((size_t)nt, sizeof *c.Ap);
    int rc = 0;
    if (!c.Bp || !c.Ap) rc = -1;
    for (int t = 0; t < nt && !rc; t++) {
        c.Ap[t] = aligned_alloc(64, (size_t)(((MC + MR - 1) / MR) * MR * kc_max * 4 + 64) / 64 * 64);
        if (!c.Ap[t]) rc = -1;
    }
    for (int64_t pc = 0; pc < g->K && !rc; pc += KC) {
        c.pc = pc;
        c.kc = g->K - pc < KC ? g->K - pc : KC;
        keel_pool_for(pool, n_groups, pack_b, &c);
        keel_pool_for(pool, c.n_mblk * c.n_nblk, compute_blocks, &c);
    }
    if (c.Ap)
        for (int t = 0; t < nt; t++) free(c.Ap[t]);
    free(c.Ap);
    free(c.Bp);
    if (rc)
        return keel_fail("cpu matmul: out of memory for %lldx%lldx%lld scratch", (long long)g->M, (long long)g->N,
                         (long long)g->K);
    return 0;
}
