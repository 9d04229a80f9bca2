/* keel: tile helpers shared by the CUDA backend's blocked kernels (the delta rule, attention):
 * products of shared-memory tiles with one thread a result element (sums in a fixed order, so bits
 * that depend on the shapes only), and asynchronous copies of tiles between global and shared
 * memory. Every kernel that uses them runs NT threads a block. */
#ifndef KEEL_CUDA_TILE_CUH
#define KEEL_CUDA_TILE_CUH

#include <cuda_pipeline_primitives.h>

#include "backends/cuda/cuda_internal.h"

/* Shared-memory row lengths: a multiple of 4 floats (16-byte loads along a row) and an odd number
 * of 16-byte units (rows walked in step by a warp fall in distinct banks). */
#define PAD_LD(x) ((((x) + 7) & ~7) + 4)
#define NT        256 /* threads per block (= KEEL_CUDA_RT: block_sum) */

/* Launch fn with `threads` threads and `shm` bytes of dynamic shared memory (opting in above 48 KiB),
 * from a backend function that has `be` and the node `t` in scope: an error names what and the node */
#define TILE_LAUNCH(fn, grid, threads, shm, what, ...)                                                                 \
    do {                                                                                                               \
        if (cuda_check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(shm)), what, t))    \
            return -1;                                                                                                 \
        fn<<<grid, threads, shm, cuda_im(be)->stream>>>(__VA_ARGS__);                                                  \
        if (cuda_check(cudaGetLastError(), what, t)) return -1;                                                        \
    } while (0)

__device__ static inline float warp_sum(float x) {
    for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}
/* The sum (max) of x over the 4 lanes of a quad (lanes 4i .. 4i + 3), in a fixed tree: every lane
 * gets the same bits. Every lane of the warp must call it (the delta rule's and attention's kernels). */
__device__ static inline float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ static inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* C (m x n, row stride ldc) = alpha op(A) op(B) [+ beta C when acc], op(A)(r, p) = TA ? A[p lda + r]
 * : A[r lda + p], likewise B; k the depth; A and B in shared memory with lda, ldb multiples of 4
 * and 16-byte aligned. Each element of C is one thread's, summed over p in order, so the bits
 * depend on the shapes only. A thread owns RB (4, or 2 where a product has too few rows to keep
 * every thread busy) consecutive rows and 4 columns: consecutive when B is not transposed (one
 * 16-byte load a depth step), else n4 = ceil(n/4) apart (a warp's loads of B then walk rows an odd
 * number of 16-byte units apart). Which thread owns which block depends on m, n and RB only. Depth
 * goes 4 at a time with 16-byte loads of both operands (16 loads for 64 multiply-adds at RB 4),
 * the last k % 4 one at a time. Rows and columns
 * past the edge read padding or the last row and are not stored. The transpositions are template
 * parameters: each of the four forms compiles to its own loop. */

/* The blocks a thread owns, in order: a warp takes 4 x 8 of the threads' blocks at a time (4 RB
 * rows, 32 columns), so its loads touch 4 RB rows of A and 8 column groups of B, a wavefront or two
 * of shared memory each. Block b of the thread (its b-th turn, counted whether or not the turn has
 * a block) starts at row r0 and column cb, its columns cs apart; false past the edge. */
template <bool TB, int RB> struct bmm_owner {
    int mr, n4, wc, lane;
    __device__ bmm_owner(int m, int n)
        : mr((m + RB - 1) / RB), n4((n + 3) >> 2), wc((n4 + 7) >> 3), lane(threadIdx.x & 31) {}
    __device__ int turns() const { return (((mr + 3) >> 2) * wc - (int)(threadIdx.x >> 5) + NT / 32 - 1) / (NT / 32); }
    __device__ bool block(int b, int *r0, int *cb, int *cs) const {
        int wt = (int)(threadIdx.x >> 5) + b * (NT / 32), rg = (wt / wc) * 4 + (lane >> 3),
            cx = (wt % wc) * 8 + (lane & 7);
        if (rg >= mr || cx >= n4) return false;
        *r0 = rg * RB, *cb = TB ? cx : 4 * cx, *cs = TB ? n4 : 1;
        return true;
    }
};

/* The product's block at (r0, cb, cs), summed over the depth in order into s (from 0, or with zero
 * false on from what s holds: a depth split in parts, each a call, gives the one call's bits). */
template <bool TA, bool TB, int RB>
__device__ static inline void bmm_block(float s[RB][4], const float *A, int lda, const float *B, int ldb, int m, int n,
                                        int k, int r0, int cb, int cs, bool zero = true) {
    int k4 = k & ~3;
    const float *pa[RB], *pb[4];
#pragma unroll
    for (int i = 0; i < RB; i++) {
        int r = min(r0 + i, m - 1);
        pa[i] = TA ? A + r : A + r * lda;
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (zero) s[i][j] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int c = min(cb + i * cs, n - 1);
        pb[i] = TB ? B + c * ldb : B + c;
    }
    for (int p = 0; p < k4; p += 4) {
        float a[RB][4], b[4][4]; /* a[row][depth], b[depth][column] */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (TA && RB == 4) {
                float4 v = *(const float4 *)(A + (p + q) * lda + r0);
                a[0][q] = v.x, a[1][q] = v.y, a[2][q] = v.z, a[3 % RB][q] = v.w;
            } else if (TA) {
                float2 v = *(const float2 *)(A + (p + q) * lda + r0);
                a[0][q] = v.x, a[1 % RB][q] = v.y;
            } else if (q < RB) {
                float4 v = *(const float4 *)(pa[q] + p);
                a[q][0] = v.x, a[q][1] = v.y, a[q][2] = v.z, a[q][3] = v.w;
            }
            float4 w = TB ? *(const float4 *)(pb[q] + p) : *(const float4 *)(B + (p + q) * ldb + cb);
            if (TB)
                b[0][q] = w.x, b[1][q] = w.y, b[2][q] = w.z, b[3][q] = w.w;
            else
                b[q][0] = w.x, b[q][1] = w.y, b[q][2] = w.z, b[q][3] = w.w;
        }
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int i = 0; i < RB; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] = fmaf(a[i][q], b[q][j], s[i][j]);
    }
    for (int p = k4; p < k; p++) {
        float a[RB], b[4];
#pragma unroll
        for (int i = 0; i < RB; i++) a[i] = TA ? pa[i][p * lda] : pa[i][p];
#pragma unroll
        for (int j = 0; j < 4; j++) b[j] = TB ? pb[j][p] : pb[j][p * ldb];
#pragma unroll
        for (int i = 0; i < RB; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) s[i][j] = fmaf(a[i], b[j], s[i][j]);
    }
}

template <bool TA, bool TB, int RB = 4>
__device__ static void bmm(float *C, int64_t ldc, const float *A, int lda, const float *B, int ldb, int m, int n, int k,
                           float alpha, float beta, bool acc) {
    bmm_owner<TB, RB> ow(m, n);
    for (int b = 0, nb = ow.turns(); b < nb; b++) {
        int r0, cb, cs;
        if (!ow.block(b, &r0, &cb, &cs)) continue;
        float s[RB][4];
        bmm_block<TA, TB, RB>(s, A, lda, B, ldb, m, n, k, r0, cb, cs);
#pragma unroll
        for (int i = 0; i < RB; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int r = r0 + i, c = cb + j * cs;
                if (r < m && c < n) {
                    float *p = C + r * ldc + c;
                    *p = acc ? beta * *p + alpha * s[i][j] : alpha * s[i][j];
                }
            }
    }
}

/* The same product into registers: acc[b] holds the thread's block b (bmm_owner's turns; NB at
 * least turns()), acc[b] = alpha s, or beta acc[b] + alpha s when add, as bmm does to C with acc,
 * so several products into one C sum in registers with bmm's bits and C is written once (through
 * bmm_each). RB 4. */
/* f(b, r0, cb, cs) for each of the thread's blocks over m x n (RB 4), b its turn (< NB) */
template <bool TB, int NB, typename F> __device__ static inline void bmm_blocks(int m, int n, F f) {
    bmm_owner<TB, 4> ow(m, n);
    int nb = ow.turns();
#pragma unroll
    for (int b = 0; b < NB; b++) {
        int r0, cb, cs;
        if (b < nb && ow.block(b, &r0, &cb, &cs)) f(b, r0, cb, cs);
    }
}
template <bool TA, bool TB, int NB>
__device__ static void bmm_reg(float acc[NB][4][4], const float *A, int lda, const float *B, int ldb, int m, int n,
                               int k, float alpha, float beta, bool add) {
    bmm_blocks<TB, NB>(m, n, [&](int b, int r0, int cb, int cs) {
        float s[4][4];
        bmm_block<TA, TB, 4>(s, A, lda, B, ldb, m, n, k, r0, cb, cs);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[b][i][j] = add ? beta * acc[b][i][j] + alpha * s[i][j] : alpha * s[i][j];
    });
}
/* Element (r, c) of each of the thread's blocks (as bmm_reg's with this m, n and TB): f(b, i, j, r, c)
 * for the ones inside m x n. */
template <bool TB, int NB, typename F> __device__ static void bmm_each(int m, int n, F f) {
    bmm_blocks<TB, NB>(m, n, [&](int b, int r0, int cb, int cs) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int r = r0 + i, c = cb + j * cs;
                if (r < m && c < n) f(b, i, j, r, c);
            }
    });
}

/* The same product on the tensor cores (mma.sync m16n8k8, TF32), in about float32's precision: each
 * operand x is split into big = x rounded to TF32 (10 bits after the point) and small = x - big
 * (exact in float32; the tensor cores read its top 10 bits), and a b = big_a big_b + big_a small_b +
 * small_a big_b, the small terms first; what is left out, small_a small_b and small's lost bits, is
 * about 2^-21 of a b, where one TF32 product would lose 2^-11. A warp owns WM x WN tiles of 16 x 8
 * results at a time (which warp, which tiles: from m and n only) and sums each over the depth in
 * steps of 8 inside the tensor cores, float32: the same bits every run, not bmm's bits. Depth past k
 * reads as 0; rows and columns past the edges read the last one and are not stored. The warp tile
 * is chosen from m x n so that the 8 warps have work. */
__device__ static inline uint32_t tf32_big(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ static inline void mma_tf32(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* the same on bf16 operand pairs, 16 in depth (the split bf16 below) */
__device__ static inline void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* The three products of a split step for a warp's WM x WN tiles, small_a big_b, big_a small_b, then
 * big_a big_b, tile after tile in each round, so that no product waits on the one before it; the
 * fragments' parts ab, as (A's big and small), bb, bs (B's), in TF32 or (BF16) as bf16 pairs. */
template <bool BF16, int WM, int WN, bool ONE = false>
__device__ static inline void split_products(float (*s)[WN][4], const uint32_t (*ab)[4], const uint32_t (*as)[4],
                                             const uint32_t (*bb)[2], const uint32_t (*bs)[2]) {
    void (*mma)(float *, const uint32_t *, const uint32_t *) = BF16 ? mma_bf16 : mma_tf32;
    if (!ONE) {
#pragma unroll
        for (int i = 0; i < WM; i++)
#pragma unroll
            for (int j = 0; j < WN; j++) mma(s[i][j], as[i], bb[j]);
#pragma unroll
        for (int i = 0; i < WM; i++)
#pragma unroll
            for (int j = 0; j < WN; j++) mma(s[i][j], ab[i], bs[j]);
    }
#pragma unroll
    for (int i = 0; i < WM; i++)
#pragma unroll
        for (int j = 0; j < WN; j++) mma(s[i][j], ab[i], bb[j]);
}
/* x as big (TF32 bits) and small (float32 bits) */
__device__ static inline void tf32_split(float x, uint32_t *big, uint32_t *small) {
    *big = tf32_big(x);
    *small = __float_as_uint(__fsub_rn(x, __uint_as_float(*big)));
}
/* One step of 8 in depth from p0 for a warp's WM x WN tiles: the fragments (rows ar, columns bc,
 * clamped inside the product; TAIL: depth past k reads 0), split, then the three products of every
 * tile, tile after tile in each round, so that no product waits on the one before it. */
template <bool TA, bool TB, int WM, int WN, bool TAIL>
__device__ static inline void tc_step(float (*s)[WN][4], const float *A, int lda, const float *B, int ldb,
                                      const int (*ar)[2], const int *bc, int p0, int k, int q) {
    uint32_t ab[WM][4], as[WM][4], bb[WN][2], bs[WN][2];
#pragma unroll
    for (int i = 0; i < WM; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) { /* a0 (g, q), a1 (g + 8, q), a2 (g, q + 4), a3 (g + 8, q + 4) */
            int r = ar[i][e & 1], p = p0 + q + 4 * (e >> 1), pl = TAIL ? min(p, k - 1) : p;
            float x = TA ? A[pl * lda + r] : A[r * lda + pl];
            tf32_split(TAIL && p >= k ? 0.0f : x, &ab[i][e], &as[i][e]);
        }
#pragma unroll
    for (int j = 0; j < WN; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) { /* b0 (depth q, column g), b1 (depth q + 4, column g) */
            int c = bc[j], p = p0 + q + 4 * e, pl = TAIL ? min(p, k - 1) : p;
            float x = TB ? B[c * ldb + pl] : B[pl * ldb + c];
            tf32_split(TAIL && p >= k ? 0.0f : x, &bb[j][e], &bs[j][e]);
        }
    split_products<false, WM, WN>(s, ab, as, bb, bs);
}

/* The same tiles with each operand split in two bf16 parts (mma.sync m16n8k16, float32 sums): big = x
 * rounded to bf16 (to nearest even), small = x - big rounded (x - big is exact, so big + small holds
 * 16 bits of x), and a b = big_a big_b + big_a small_b + small_a big_b, the small terms first; what is
 * left out is about 2^-16 of a b (the split TF32 above: 2^-21). Per 16 in depth, three products a
 * tile where the split TF32 takes six, and two operands to a conversion. One bf16 part alone (8 bits,
 * PR 3: big_a big_b only) in the forward takes the delta rule's gate gradients past 1.5x PyTorch
 * autocast's error (docs/h200-log.md, "Where the delta rule's time goes"); in the backward alone it
 * does not ("The delta rule's backward in one bf16 part"), which is where the bf16 mode uses it.
 * Precision PR of the products below: 1 the split TF32, 2 the split bf16, 3 one bf16 part. The results
 * are laid out as above (tc_elems holds for all). */
__device__ static inline uint32_t bf16_pair(float lo, float hi) { /* lo in the low half, as mma reads it */
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
/* Operands in shared memory are float32, or (uint16_t) bf16 bits, values exact in float32: a product
 * in one bf16 part (PR 3) takes them to the tensor cores as they are, the bits its rounding of the
 * float32 values they were rounded from (bf16_pair's, to nearest even) would have given. */
__device__ static inline float ld_f(const float *p) { return *p; }
__device__ static inline float ld_f(const uint16_t *p) { return __uint_as_float((uint32_t)*p << 16); }
/* Depths p and p + 1 at row (or column) r of X: X[r ld + p], X[r ld + p + 1] (ALONG: the depth runs
 * along X's rows; one 8-byte load when V2) or X[p ld + r], X[(p + 1) ld + r]; TAIL: depth at or past
 * k reads 0 (and nothing past k - 1 is read). */
template <bool ALONG, bool TAIL>
__device__ static inline float2 depth_pair(const float *X, int ld, int r, int p, int k, bool v2) {
    if (TAIL) {
        int p1 = min(p + 1, k - 1), p0 = min(p, k - 1);
        float x0 = ALONG ? X[r * ld + p0] : X[p0 * ld + r], x1 = ALONG ? X[r * ld + p1] : X[p1 * ld + r];
        return make_float2(p < k ? x0 : 0.0f, p + 1 < k ? x1 : 0.0f);
    }
    if (ALONG && v2) return *(const float2 *)(X + r * ld + p);
    return ALONG ? make_float2(X[r * ld + p], X[r * ld + p + 1]) : make_float2(X[p * ld + r], X[(p + 1) * ld + r]);
}
/* the same depths of bf16 X as one bf16 pair (the first depth in the low half; one 4-byte load when V2) */
template <bool ALONG, bool TAIL>
__device__ static inline uint32_t depth_bits(const uint16_t *X, int ld, int r, int p, int k, bool v2) {
    if (TAIL) {
        int p1 = min(p + 1, k - 1), p0 = min(p, k - 1);
        uint32_t x0 = ALONG ? X[r * ld + p0] : X[p0 * ld + r], x1 = ALONG ? X[r * ld + p1] : X[p1 * ld + r];
        return (p < k ? x0 : 0u) | (p + 1 < k ? x1 : 0u) << 16;
    }
    if (ALONG && v2) return *(const uint32_t *)(X + r * ld + p);
    return ALONG ? (uint32_t)X[r * ld + p] | (uint32_t)X[r * ld + p + 1] << 16
                 : (uint32_t)X[p * ld + r] | (uint32_t)X[(p + 1) * ld + r] << 16;
}
/* two depths of x as their big bf16 parts and their small ones (each pair's low half the first depth) */
__device__ static inline void bf16_split(float2 x, uint32_t *big, uint32_t *small) {
    *big = bf16_pair(x.x, x.y);
    *small =
        bf16_pair(__fsub_rn(x.x, __uint_as_float(*big << 16)), __fsub_rn(x.y, __uint_as_float(*big & 0xffff0000u)));
}
/* One step of 16 in depth from p0: a0 (g, 2q..2q+1), a1 (g + 8, 2q..), a2 (g, 2q+8..), a3 (g + 8,
 * 2q+8..); b0 (depth 2q..2q+1, column g), b1 (depth 2q+8.., column g); then the products, tile after
 * tile. va, vb: whether A's and B's rows may be read 8 bytes at a time. */
template <bool TA, bool TB, int WM, int WN, bool TAIL, bool ONE, typename AT, typename BT>
__device__ static inline void tc_step16(float (*s)[WN][4], const AT *A, int lda, const BT *B, int ldb,
                                        const int (*ar)[2], const int *bc, int p0, int k, int q, bool va, bool vb) {
    static_assert(ONE || (sizeof(AT) == 4 && sizeof(BT) == 4), "bf16 operands only in one bf16 part");
    uint32_t a[WM][4], as[WM][4], b[WN][2], bs[WN][2];
#pragma unroll
    for (int i = 0; i < WM; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = ar[i][e & 1], p = p0 + 2 * q + 8 * (e >> 1);
            if constexpr (sizeof(AT) == 2)
                a[i][e] = depth_bits<!TA, TAIL>(A, lda, r, p, k, va);
            else
                bf16_split(depth_pair<!TA, TAIL>(A, lda, r, p, k, va), &a[i][e], &as[i][e]);
        }
#pragma unroll
    for (int j = 0; j < WN; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int p = p0 + 2 * q + 8 * e;
            if constexpr (sizeof(BT) == 2)
                b[j][e] = depth_bits<TB, TAIL>(B, ldb, bc[j], p, k, vb);
            else
                bf16_split(depth_pair<TB, TAIL>(B, ldb, bc[j], p, k, vb), &b[j][e], &bs[j][e]);
        }
    split_products<true, WM, WN, ONE>(s, a, as, b, bs);
}
/* one load of two depths at once (8 bytes, or 4 of bf16): the matrix and its row length both keep its alignment */
template <typename T> __device__ static inline bool al_pair(const T *X, int ld) {
    return ((uintptr_t)X & (2 * sizeof(T) - 1)) == 0 && (ld & 1) == 0;
}

/* The warp tile at (m0, n0) of an m x n product: s += op(A) op(B) over depth k, precision PR */
template <int PR, bool TA, bool TB, int WM, int WN, typename AT, typename BT>
__device__ static inline void tc_sum(float (*s)[WN][4], const AT *A, int lda, const BT *B, int ldb, int m, int n, int k,
                                     int m0, int n0) {
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, ar[WM][2], bc[WN];
#pragma unroll
    for (int i = 0; i < WM; i++) ar[i][0] = min(m0 + 16 * i + g, m - 1), ar[i][1] = min(m0 + 16 * i + g + 8, m - 1);
#pragma unroll
    for (int j = 0; j < WN; j++) bc[j] = min(n0 + 8 * j + g, n - 1);
    if constexpr (PR >= 2) {
        int k16 = k & ~15;
        bool va = al_pair(A, lda), vb = al_pair(B, ldb);
        for (int p0 = 0; p0 < k16; p0 += 16)
            tc_step16<TA, TB, WM, WN, false, PR == 3>(s, A, lda, B, ldb, ar, bc, p0, k, q, va, vb);
        if (k16 < k) tc_step16<TA, TB, WM, WN, true, PR == 3>(s, A, lda, B, ldb, ar, bc, k16, k, q, va, vb);
    } else {
        static_assert(sizeof(AT) == 4 && sizeof(BT) == 4, "split TF32 on float32 operands");
        int k8 = k & ~7;
        for (int p0 = 0; p0 < k8; p0 += 8) tc_step<TA, TB, WM, WN, false>(s, A, lda, B, ldb, ar, bc, p0, k, q);
        if (k8 < k) tc_step<TA, TB, WM, WN, true>(s, A, lda, B, ldb, ar, bc, k8, k, q);
    }
}
/* Split tiles: a float32 tile in shared memory split once into its bf16 parts (bf16_split's big and
 * small, element by element), in place, so that the products read their fragments with `ldmatrix`
 * (four 8 x 8 bf16 matrices an instruction) instead of every warp loading and splitting its own
 * float32 elements at every depth step (two conversions, two subtractions and the index work a pair,
 * most of the delta rule's instructions: docs/h200-log.md). A row's elements go by groups of 8, 32 bytes a
 * group where their 8 floats were: the 8 big parts, then the 8 small ones. The products then are the
 * same mma.sync on the same operands in the same order as tc_sum's split bf16 (PR 2): the same bits.
 * Rows and columns keep the float tile's layout (and its row stride, whose odd number of 16-byte
 * units keeps an ldmatrix's 8 rows in distinct banks); an operand whose depth runs down the rows (TA,
 * or B not TB) is read with ldmatrix's transposing form. Depth past k must be zero in both
 * operands: the split pads it (rows or columns up to a multiple of 16). */
__device__ static inline int split_off(int c) { return (c >> 3) * 32 + (c & 7) * 2; } /* element c's big part, bytes */
/* elements (r, c) and (r, c + 1) (c even) of split tile X into its groups: the pair's big and small parts */
__device__ static inline void split_pair(float *X, int ld, int r, int c, float x, float y) {
    uint32_t big, small;
    bf16_split(make_float2(x, y), &big, &small);
    char *p = (char *)(X + r * ld) + split_off(c);
    *(uint32_t *)p = big;
    *(uint32_t *)(p + 16) = small;
}
template <bool TRANS> __device__ static inline void ldsm4(uint32_t r[4], uint32_t addr) {
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}
/* tc_sum for split tiles (PR 2; ONE, PR 3: their big parts alone), the warp tile at (m0, n0) over
 * depth k (WN even). Lane L gives row L % 8 of matrix L / 8 of each ldmatrix: an A fragment's four matrices are (rows, depth)
 * (0, 0), (8, 0), (0, 8), (8, 8) from (m0 + 16 i, p0), two B tiles' are (depth, columns) (0, 0),
 * (8, 0), (0, 8), (8, 8) from (p0, n0 + 16 jj): registers a0..a3, and b0, b1 of tile 2 jj then of
 * tile 2 jj + 1, as tc_step16 makes them. Rows and columns past m and n read the tile's rows
 * beyond (inside its allocation; their sums are never stored). */
template <bool TA, bool TB, int WM, int WN, bool ONE>
__device__ static inline void tc_sum_split(float (*s)[WN][4], const float *A, int lda, const float *B, int ldb, int k,
                                           int m0, int n0) {
    static_assert(WN % 2 == 0, "two B tiles an ldmatrix");
    int lane = threadIdx.x & 31, i8 = lane & 7, lo = (lane >> 3) & 1, hi = lane >> 4;
    uint32_t a0 = (uint32_t)__cvta_generic_to_shared(A), b0 = (uint32_t)__cvta_generic_to_shared(B), aa[WM], ba[WN / 2];
    /* A: (rows + 8 lo, depth + 8 hi); B: (depth + 8 lo, columns + 8 hi); a row of floats is 4 ld bytes */
#pragma unroll
    for (int i = 0; i < WM; i++)
        aa[i] = TA ? a0 + (i8 + 8 * hi) * lda * 4 + split_off(m0 + 16 * i + 8 * lo)
                   : a0 + (m0 + 16 * i + i8 + 8 * lo) * lda * 4 + split_off(8 * hi);
#pragma unroll
    for (int j = 0; j < WN / 2; j++)
        ba[j] = TB ? b0 + (n0 + 16 * j + i8 + 8 * hi) * ldb * 4 + split_off(8 * lo)
                   : b0 + (i8 + 8 * lo) * ldb * 4 + split_off(n0 + 16 * j + 8 * hi);
    uint32_t sa = TA ? 16 * lda * 4 : 64, sb = TB ? 64 : 16 * ldb * 4; /* a step of 16 in depth */
    for (int p0 = 0; p0 < k; p0 += 16) {
        uint32_t ab[WM][4], as[WM][4], bb[WN][2], bs[WN][2];
#pragma unroll
        for (int i = 0; i < WM; i++) {
            ldsm4<TA>(ab[i], aa[i]);
            if (!ONE) ldsm4<TA>(as[i], aa[i] + 16);
            aa[i] += sa;
        }
#pragma unroll
        for (int j = 0; j < WN / 2; j++) {
            uint32_t x[4], y[4] = {0, 0, 0, 0};
            ldsm4<!TB>(x, ba[j]);
            if (!ONE) ldsm4<!TB>(y, ba[j] + 16);
            ba[j] += sb;
            bb[2 * j][0] = x[0], bb[2 * j][1] = x[1], bb[2 * j + 1][0] = x[2], bb[2 * j + 1][1] = x[3];
            bs[2 * j][0] = y[0], bs[2 * j][1] = y[1], bs[2 * j + 1][0] = y[2], bs[2 * j + 1][1] = y[3];
        }
        split_products<true, WM, WN, ONE>(s, ab, as, bb, bs);
    }
}
/* The warp's tiles of an m x n product: its b-th turn is the warp tile at (m0, n0), f(b, m0, n0), for
 * b < NB (unrolled: b indexes registers), or with NB 0 for every turn (b passed as 0) */
template <int WM, int WN, int NB, typename F> __device__ static inline void tc_turns(int m, int n, F f) {
    int tm = (m + 16 * WM - 1) / (16 * WM), tn = (n + 8 * WN - 1) / (8 * WN), w = (int)(threadIdx.x >> 5);
    if (NB > 0) {
#pragma unroll
        for (int b = 0; b < NB; b++) {
            int wt = w + b * (NT / 32);
            if (wt < tm * tn) f(b, wt / tn * 16 * WM, wt % tn * 8 * WN);
        }
    } else {
        for (int wt = w; wt < tm * tn; wt += NT / 32) f(0, wt / tn * 16 * WM, wt % tn * 8 * WN);
    }
}
/* The elements of the warp tile at (m0, n0) two at a time, the pairs a lane holds side by side in a
 * row (c0 (g, 2q) c1 (g, 2q + 1), c2 (g + 8, 2q) c3 (g + 8, 2q + 1) of each tile):
 * f(i, j, h, r, c, w) for s[i][j][2h .. 2h + 1] at (r, c) and (r, c + 1), w of them (1 or 2) inside
 * m x n; a pair's stores can then be one 8-byte store (scalar stores of the tiles queued up in
 * the load-store unit: ncu's lg throttle, the delta rule's contractions) */
template <int WM, int WN, typename F> __device__ static inline void tc_pairs(int m, int n, int m0, int n0, F f) {
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < WM; i++)
#pragma unroll
        for (int j = 0; j < WN; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int r = m0 + 16 * i + g + 8 * h, c = n0 + 8 * j + 2 * q;
                if (r < m && c < n) f(i, j, h, r, c, c + 1 < n ? 2 : 1);
            }
}
/* Element (r, c) of the warp tile at (m0, n0) that s[i][j][e] holds, for the ones inside m x n:
 * f(i, j, e, r, c), in the order of e (tc_pairs' pairs one element at a time). */
template <int WM, int WN, typename F> __device__ static inline void tc_elems(int m, int n, int m0, int n0, F f) {
    tc_pairs<WM, WN>(m, n, m0, n0, [&](int i, int j, int h, int r, int c, int w) {
        f(i, j, 2 * h, r, c);
        if (w == 2) f(i, j, 2 * h + 1, r, c + 1);
    });
}
/* x and y to p and p + 1 (one 8-byte store where p is 8-byte aligned; only x when w is 1) */
__device__ static inline void store_pair(float *p, float x, float y, int w) {
    if (w == 2 && ((uintptr_t)p & 7) == 0) {
        *(float2 *)p = make_float2(x, y);
        return;
    }
    p[0] = x;
    if (w == 2) p[1] = y;
}
/* x's bf16 bits, rounded as bf16_pair rounds it (so as the one-part products round their operands) */
__device__ static inline uint16_t bf16_of(float x) { return (uint16_t)bf16_pair(x, 0.0f); }
/* x and y to bf16 C at p and p + 1 (bf16_pair's rounding; one 4-byte store where p allows it) */
__device__ static inline void store_pair(uint16_t *p, float x, float y, int w) {
    uint32_t b = bf16_pair(x, y);
    if (w == 2 && ((uintptr_t)p & 3) == 0) {
        *(uint32_t *)p = b;
        return;
    }
    p[0] = (uint16_t)b;
    if (w == 2) p[1] = (uint16_t)(b >> 16);
}
template <int PR, bool TA, bool TB, int WM, int WN, typename CT, typename AT, typename BT>
__device__ static void bmm_tc_tiles(CT *C, int64_t ldc, const AT *A, int lda, const BT *B, int ldb, int m, int n, int k,
                                    float alpha, float beta, bool acc) {
    tc_turns<WM, WN, 0>(m, n, [&](int, int m0, int n0) {
        float s[WM][WN][4];
#pragma unroll
        for (int i = 0; i < WM; i++)
#pragma unroll
            for (int j = 0; j < WN; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[i][j][e] = 0.0f;
        tc_sum<PR, TA, TB, WM, WN>(s, A, lda, B, ldb, m, n, k, m0, n0);
        tc_pairs<WM, WN>(m, n, m0, n0, [&](int i, int j, int h, int r, int c, int w) {
            CT *p = C + r * ldc + c;
            float x = alpha * s[i][j][2 * h], y = alpha * s[i][j][2 * h + 1];
            if (acc) x = beta * ld_f(p) + x, y = w == 2 ? beta * ld_f(p + 1) + y : y;
            store_pair(p, x, y, w);
        });
    });
}
/* The tensor-core bmm_reg: a warp's NB turns of WM x WN tiles of an m x n result kept in registers,
 * s[b] its b-th turn (tc_turns); tc_acc adds op(A) op(B) to them (the tensor cores' sums, from the
 * values s holds; SP: A and B are split tiles, split_tile below, their products tc_sum_split's, PR 2
 * or 3), tc_each visits their elements: f(b, i, j, e, r, c). */
template <int PR, bool TA, bool TB, int WM, int WN, int NB, bool SP = false, typename AT, typename BT>
__device__ static void tc_acc(float (*s)[WM][WN][4], const AT *A, int lda, const BT *B, int ldb, int m, int n, int k) {
    tc_turns<WM, WN, NB>(m, n, [&](int b, int m0, int n0) {
        if constexpr (SP)
            tc_sum_split<TA, TB, WM, WN, PR == 3>(s[b], A, lda, B, ldb, k, m0, n0);
        else
            tc_sum<PR, TA, TB, WM, WN>(s[b], A, lda, B, ldb, m, n, k, m0, n0);
    });
}
template <int WM, int WN, int NB, typename F> __device__ static void tc_each(int m, int n, F f) {
    tc_turns<WM, WN, NB>(m, n, [&](int b, int m0, int n0) {
        tc_elems<WM, WN>(m, n, m0, n0, [&](int i, int j, int e, int r, int c) {
            f(b, i, j, e, r, c);
        });
    });
}
/* tc_each's elements two at a time (tc_pairs): f(b, i, j, h, r, c, w) */
template <int WM, int WN, int NB, typename F> __device__ static void tc_each_pair(int m, int n, F f) {
    tc_turns<WM, WN, NB>(m, n, [&](int b, int m0, int n0) {
        tc_pairs<WM, WN>(m, n, m0, n0, [&](int i, int j, int h, int r, int c, int w) {
            f(b, i, j, h, r, c, w);
        });
    });
}
/* C = alpha op(A) op(B) [+ beta C] on the tensor cores in precision PR; C float32 or (uint16_t) bf16,
 * each result rounded once (bf16_pair) */
template <int PR, bool TA, bool TB, typename CT, typename AT, typename BT>
__device__ static void bmm_tc(CT *C, int64_t ldc, const AT *A, int lda, const BT *B, int ldb, int m, int n, int k,
                              float alpha, float beta, bool acc) {
    if (m * n >= 8 * 32 * 32) /* 64 x 128 and up: 32 x 32 a warp */
        bmm_tc_tiles<PR, TA, TB, 2, 4>(C, ldc, A, lda, B, ldb, m, n, k, alpha, beta, acc);
    else if (m * n >= 8 * 32 * 16) /* 64 x 64: 32 x 16 */
        bmm_tc_tiles<PR, TA, TB, 2, 2>(C, ldc, A, lda, B, ldb, m, n, k, alpha, beta, acc);
    else
        bmm_tc_tiles<PR, TA, TB, 1, 2>(C, ldc, A, lda, B, ldb, m, n, k, alpha, beta, acc);
}
/* bmm (float32 on the CUDA cores: TC 0) or bmm_tc in precision TC */
template <int TC, bool TA, bool TB, int RB = 4>
__device__ static inline void bmm_sel(float *C, int64_t ldc, const float *A, int lda, const float *B, int ldb, int m,
                                      int n, int k, float alpha, float beta, bool acc) {
    if (TC)
        bmm_tc<TC ? TC : 1, TA, TB>(C, ldc, A, lda, B, ldb, m, n, k, alpha, beta, acc);
    else
        bmm<TA, TB, RB>(C, ldc, A, lda, B, ldb, m, n, k, alpha, beta, acc);
}

/* f(r, c) for a thread's elements of a rows x cols grid laid out by rows, e = r cols + c = threadIdx.x,
 * threadIdx.x + NT, ... in that order (the order of `for (e = threadIdx.x; e < rows cols; e += NT)`),
 * the row and column stepped by NT without a division an element: the delta rule's contractions
 * spent a third of their instructions on their copies' index arithmetic, a division a copy (ncu's
 * SASS counts, docs/h200-log.md). */
template <typename F> __device__ static inline void grid_walk(int rows, int cols, F f) {
    if (cols <= 0) return;
    int r, c, dr, dc;
    if ((cols & (cols - 1)) == 0) { /* a power of two (the common widths): shifts, not divisions */
        int sh = __ffs(cols) - 1;
        r = (int)threadIdx.x >> sh, c = (int)threadIdx.x & (cols - 1), dr = NT >> sh, dc = NT & (cols - 1);
    } else {
        r = (int)threadIdx.x / cols, c = (int)threadIdx.x - r * cols, dr = NT / cols, dc = NT - dr * cols;
    }
    while (r < rows) {
        f(r, c);
        r += dr, c += dc;
        if (c >= cols) c -= cols, r++;
    }
}

/* Tile X (rows x cols of floats, row stride ld, 16-byte aligned rows) split in place; the elements
 * of rows up to rows_pad and columns up to cols_pad (a multiple of 8, at most ld) past rows x cols
 * become zeros (depth padding). A thread a group: its 8 floats read before its parts are written.
 * ONE: only the big parts, for products in one bf16 part (tc_sum_split's ONE reads no small part). */
template <bool ONE = false>
__device__ static void split_tile(float *X, int ld, int rows, int cols, int rows_pad, int cols_pad) {
    grid_walk(rows_pad, cols_pad >> 3, [&](int r, int g) {
        float v[8];
        const float *x = X + r * ld + 8 * g;
        if (r < rows && 8 * g + 8 <= cols) {
            float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = r < rows && 8 * g + e < cols ? x[e] : 0.0f;
        }
        uint4 big, small;
        bf16_split(make_float2(v[0], v[1]), &big.x, &small.x);
        bf16_split(make_float2(v[2], v[3]), &big.y, &small.y);
        bf16_split(make_float2(v[4], v[5]), &big.z, &small.z);
        bf16_split(make_float2(v[6], v[7]), &big.w, &small.w);
        uint4 *p = (uint4 *)(X + r * ld + 8 * g);
        p[0] = big;
        if (!ONE) p[1] = small;
    });
}
/* rows up to a multiple of 16 past `rows`, cols columns (a multiple of 8), of split tile X set to
 * zeros: depth padding where the depth runs down the rows */
__device__ static void split_zero_rows(float *X, int ld, int rows, int cols) {
    int pad = (rows + 15) / 16 * 16;
    grid_walk(pad - rows, cols >> 2, [&](int r, int c4) {
        *(float4 *)(X + (rows + r) * ld + 4 * c4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    });
}

/* Global memory into shared memory by asynchronous copies (cp.async): a thread issues all its
 * elements before waiting on any, so a tile costs one memory latency, not one per element. A
 * batch of fetches ends with fetch_commit(); fetch_wait(n) waits for all but the n latest batches
 * (the caller's barrier then makes them visible to the block). */
/* Rows of `cols` floats from src (row stride `sb` bytes) to dst (row stride ldd floats): 16 bytes a
 * copy when every row start on both sides is 16-byte aligned and cols a multiple of 4, else 4 (a
 * copy of 4 bytes a thread made the delta rule's kernels 20% slower at the 0.8B shape). */
__device__ static inline bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }
/* The copies of U bytes each (16 or 4), `units` a row, in grid_walk's order of a thread's elements,
 * with both addresses stepped by additions: the walk's index arithmetic per copy (two products, a
 * 64-bit one among them) was a third of the delta rule's reverse preparation and contractions
 * (ncu's samples, the code before their first barrier). */
/* DU: the bytes from one copy's destination to the next one's in a row (U, or 32: split_fetch16) */
template <int U, int DU = U>
__device__ static inline void fetch_walk(float *dst, int ldd, const char *src, int64_t sb, int rows, int units) {
    if (units <= 0) return;
    int r = (int)threadIdx.x / units, c = (int)threadIdx.x - r * units, dr = NT / units, dc = NT - dr * units;
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst) + (uint32_t)((r * ldd) * 4 + c * DU),
             dstep = (uint32_t)(dr * ldd * 4 + dc * DU), dwrap = (uint32_t)(ldd * 4 - units * DU);
    const char *s = src + r * sb + c * U;
    int64_t sstep = dr * sb + dc * U, swrap = sb - (int64_t)units * U;
    while (r < rows) {
        if (U == 16)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(s) : "memory");
        else
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(s) : "memory");
        r += dr, c += dc, d += dstep, s += sstep;
        if (c >= units) c -= units, r++, d += dwrap, s += swrap;
    }
}
__device__ static void fetch_2d(float *dst, int ldd, const char *src, int64_t sb, int rows, int cols) {
    if ((cols & 3) == 0 && (ldd & 3) == 0 && (sb & 15) == 0 && al16(src) && al16(dst))
        fetch_walk<16>(dst, ldd, src, sb, rows, cols >> 2);
    else
        fetch_walk<4>(dst, ldd, src, sb, rows, cols);
}
/* dst[t][c] = x(c0 + c, h, t0 + t, b): rows of an input tensor (a view whose elements are not
 * contiguous along dim 0 goes element by element). */
__device__ static void fetch_rows(float *dst, int ld, const kt &x, int64_t h, int64_t t0, int64_t b, int n, int64_t c0,
                                  int cols) {
    if (x.nb[0] == (int64_t)sizeof(float)) {
        fetch_2d(dst, ld, kt_at(x, c0, h, t0, b), x.nb[2], n, cols);
        return;
    }
    grid_walk(n, cols, [&](int t, int c) {
        __pipeline_memcpy_async(dst + t * ld + c, kt_at(x, c0 + c, h, t0 + t, b), sizeof(float));
    });
}
__device__ static void fetch_mat(float *dst, int ldd, const float *src, int64_t lds, int rows, int cols) {
    fetch_2d(dst, ldd, (const char *)src, lds * (int64_t)sizeof(float), rows, cols);
}
/* the same for bf16 rows (ldd and lds even, 4-byte aligned rows; an odd cols also copies the value
 * after each row's last) */
__device__ static void fetch_mat16(uint16_t *dst, int ldd, const uint16_t *src, int64_t lds, int rows, int cols) {
    fetch_2d((float *)dst, ldd / 2, (const char *)src, lds * (int64_t)sizeof(uint16_t), rows, (cols + 1) / 2);
}
/* Rows of `cols` bf16 values (a multiple of 8, 16-byte aligned rows) into split tile dst as its big
 * parts (split_tile's layout, row stride ldd floats; the small parts' places untouched): a tile for
 * products in one bf16 part (tc_sum_split's ONE), with no split to make. */
__device__ static void split_fetch16(float *dst, int ldd, const uint16_t *src, int64_t lds, int rows, int cols) {
    fetch_walk<16, 32>(dst, ldd, (const char *)src, lds * (int64_t)sizeof(uint16_t), rows, cols >> 3);
}
__device__ static inline void fetch_commit() { __pipeline_commit(); }
/* the 128-byte line at p into the L2 cache, for a later load that would otherwise wait on memory */
__device__ static inline void l2_prefetch(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ static inline void fetch_wait(int pending) { __pipeline_wait_prior(pending); }

/* Shared memory out to global: stores do not wait on memory, a plain loop is enough; 16 bytes a
 * store where both sides' rows allow it (as fetch_2d). */
__device__ static void store_mat(float *dst, int64_t ldd, const float *src, int lds, int rows, int cols) {
    if ((cols & 3) == 0 && (lds & 3) == 0 && (ldd & 3) == 0 && al16(dst) && al16(src)) {
        grid_walk(rows, cols >> 2, [&](int r, int c4) {
            *(float4 *)(dst + r * ldd + 4 * c4) = *(const float4 *)(src + r * lds + 4 * c4);
        });
        return;
    }
    grid_walk(rows, cols, [&](int r, int c) {
        dst[r * ldd + c] = src[r * lds + c];
    });
}

#endif
