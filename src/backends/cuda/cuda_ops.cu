/* keel: the CUDA backend's kernels (float32) and the per-node dispatch. Elementwise kernels take
 * one thread per result element; row kernels take one block (or, for short rows, one warp) per
 * row and reduce in float64 over a fixed thread layout and a fixed tree, so results repeat
 * bitwise and never use floating-point atomics. Formulas follow the cpu backend's (cpu_ops.c)
 * operation for operation. */
#include <cuda_pipeline_primitives.h>
#include <math.h>
#include <stdlib.h>

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_api.h"
#include "ops/dropout_mask.h"
#include "ops/optimizer_step.h"
#include "ops/scalar_f32.h"
#include "tensor/convert.h"

#define RT KEEL_CUDA_RT

static cudaStream_t st(keel_backend *be) { return cuda_im(be)->stream; }

/* Rows of at most WARP_ROW_MAX elements take one warp each (8 rows to a block): a block per
 * 128-element row leaves most of it idle and waits on barriers. A warp sums over a butterfly:
 * every lane ends with the same bits, since each pairwise sum is taken in both orders. */
#define WARP_ROW_MAX 1024

__device__ static double team_sum(double v, double *sh, bool warp) {
    if (!warp) return block_sum(v, sh);
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

__device__ static float team_max(float v, double *sh, bool warp) {
    if (!warp) return block_max(v, sh);
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* ---------------------------------------------------------------- elementwise */

/* Contiguous float32 operands on 16-byte boundaries go 4 elements a thread (VEC_LOOP, VEC_TAIL in
 * cuda_internal.h); the per-element formulas are the scalar paths', so the bits are the same. */

/* rows_vec (dispatch below): the 4 floats at column c of row r (flat over dims 1..3) of a, a view
 * whose rows are dense and 16-byte aligned, strided apart; 32-bit index arithmetic */
__device__ static inline const float4 *row_group(const kt &a, unsigned r, unsigned c) {
    unsigned n1 = (unsigned)a.ne[1], n2 = (unsigned)a.ne[2];
    return (const float4 *)(a.p + (r % n1) * a.nb[1] + (r / n1 % n2) * a.nb[2] + (r / n1 / n2) * a.nb[3] + c * 4);
}
__global__ void k_unary(kt t, kt a, int op, float s, float b, int vec) {
    int64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    if (vec == 2) { /* rows_vec: t dense, a's rows dense and strided apart; a thread a group of 4 */
        unsigned n4 = (unsigned)(t.ne[0] / 4);
        GRID_STRIDE(q, n / 4) {
            unsigned r = (unsigned)q / n4;
            float4 v = *row_group(a, r, ((unsigned)q - r * n4) * 4);
            ((float4 *)t.p)[q] = make_float4(keel_unary_f32(op, v.x, s, b), keel_unary_f32(op, v.y, s, b),
                                             keel_unary_f32(op, v.z, s, b), keel_unary_f32(op, v.w, s, b));
        }
        return;
    }
    if (vec) {
        const float *x = (const float *)a.p;
        float *y = (float *)t.p;
        VEC_LOOP(q, n) {
            float4 v = ((const float4 *)x)[q];
            ((float4 *)y)[q] = make_float4(keel_unary_f32(op, v.x, s, b), keel_unary_f32(op, v.y, s, b),
                                           keel_unary_f32(op, v.z, s, b), keel_unary_f32(op, v.w, s, b));
        }
        VEC_TAIL(e, n) y[e] = keel_unary_f32(op, x[e], s, b);
        return;
    }
    if (t.contig && a.contig) {
        const float *x = (const float *)a.p;
        float *y = (float *)t.p;
        GRID_STRIDE(e, n) y[e] = keel_unary_f32(op, x[e], s, b);
        return;
    }
    GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]) {
        int64_t i[4];
        kt_unflat(t, e, i);
        stf(kt_at(t, i[0], i[1], i[2], i[3]), keel_unary_f32(op, ldf(kt_at(a, i[0], i[1], i[2], i[3])), s, b));
    }
}

/* ymode 1: t, x, y contiguous and of one shape; 2: t, x contiguous and y one contiguous row
 * broadcast over the others; 0: anything else. */
__global__ void k_binary(kt t, kt x, kt y, int op, int ymode, int vec) {
    int64_t n0 = t.ne[0], n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    if (vec) { /* ymode 1, or 2 with rows of a multiple of 4 */
        const float *xp = (const float *)x.p, *yp = (const float *)y.p;
        float *tp = (float *)t.p;
        VEC_LOOP(q, n) {
            float4 u = ((const float4 *)xp)[q], v = ((const float4 *)yp)[ymode == 1 ? q : q % (n0 / 4)];
            ((float4 *)tp)[q] = make_float4(keel_binary_f32(op, u.x, v.x), keel_binary_f32(op, u.y, v.y),
                                            keel_binary_f32(op, u.z, v.z), keel_binary_f32(op, u.w, v.w));
        }
        VEC_TAIL(e, n) tp[e] = keel_binary_f32(op, xp[e], yp[ymode == 1 ? e : e % n0]);
        return;
    }
    GRID_STRIDE(e, n) {
        float u, v;
        char *dst;
        if (ymode) {
            u = ((const float *)x.p)[e], v = ((const float *)y.p)[ymode == 1 ? e : e % n0], dst = t.p + e * 4;
        } else {
            int64_t i[4];
            kt_unflat(t, e, i);
            u = ldf(kt_at(x, i[0], i[1], i[2], i[3]));
            v = ldf(kt_at(y, i[0] % y.ne[0], i[1] % y.ne[1], i[2] % y.ne[2], i[3] % y.ne[3]));
            dst = kt_at(t, i[0], i[1], i[2], i[3]);
        }
        stf(dst, keel_binary_f32(op, u, v));
    }
}

__global__ void k_fill(kt t, float v) {
    if (t.contig) {
        GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3])((float *)t.p)[e] = v;
        return;
    }
    GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]) {
        int64_t i[4];
        kt_unflat(t, e, i);
        stf(kt_at(t, i[0], i[1], i[2], i[3]), v);
    }
}

__global__ void k_repeat(kt t, kt a) {
    GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]) {
        int64_t i[4];
        kt_unflat(t, e, i);
        stf(kt_at(t, i[0], i[1], i[2], i[3]),
            ldf(kt_at(a, i[0] % a.ne[0], i[1] % a.ne[1], i[2] % a.ne[2], i[3] % a.ne[3])));
    }
}

__global__ void k_dropout(kt t, kt a, uint64_t key, uint64_t thr, float inv) {
    GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]) {
        int64_t i[4];
        kt_unflat(t, e, i);
        float x = ldf(kt_at(a, i[0], i[1], i[2], i[3]));
        stf(kt_at(t, i[0], i[1], i[2], i[3]), keel_dropout_keep(key, (uint64_t)e, thr) ? x * inv : 0.0f);
    }
}

/* Reductions of many terms per result element (REPEAT_BACK over its tiles, the conv weight
 * gradient over batch and time) run in two passes so that a few result elements still fill the
 * GPU: pass 1 gives each (chunk of terms, element) pair a thread that sums its chunk in order in
 * float64; pass 2 sums the chunks in order. Chunk sizes follow from the shapes alone, so the
 * result does not depend on the GPU. */
#define PARTIAL_THREADS (1LL << 20) /* aim: about this many pass-1 threads */

static int64_t chunk_terms(int64_t n_out, int64_t n_terms) {
    int64_t chunks = PARTIAL_THREADS / (n_out > 0 ? n_out : 1);
    if (chunks < 1) chunks = 1;
    if (chunks > n_terms) chunks = n_terms;
    return (n_terms + chunks - 1) / chunks;
}

/* REPEAT_BACK, pass 1: tile q of result element e is a's element e's coordinates plus q's tile
 * offsets, tiles in flat order (dim 0 fastest), as the cpu backend sums them. */
__global__ void k_repeat_back_part(kt t, kt a, int64_t per, int64_t n_chunks, double *part) {
    int64_t n_out = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    int64_t r0 = a.ne[0] / t.ne[0], r1 = a.ne[1] / t.ne[1], r2 = a.ne[2] / t.ne[2],
            n_tiles = r0 * r1 * r2 * (a.ne[3] / t.ne[3]);
    GRID_STRIDE(e, n_out * n_chunks) {
        int64_t o = e % n_out, c = e / n_out, i[4];
        kt_unflat(t, o, i);
        double acc = 0;
        int64_t q = c * per, q1 = q + per < n_tiles ? q + per : n_tiles;
        if (q < q1) {
            /* the tile's coordinates, divided out once and then counted up like an odometer:
             * 64-bit divisions per term would cost more than the loads */
            int64_t q0 = q % r0, qq = q / r0, qa = qq % r1, qb = (qq / r1) % r2, qc = qq / (r1 * r2);
            const char *p =
                kt_at(a, i[0] + q0 * t.ne[0], i[1] + qa * t.ne[1], i[2] + qb * t.ne[2], i[3] + qc * t.ne[3]);
            for (; q < q1; q++) {
                acc += ldf(p);
                p += t.ne[0] * a.nb[0];
                if (++q0 < r0) continue;
                q0 = 0, p -= r0 * t.ne[0] * a.nb[0], p += t.ne[1] * a.nb[1];
                if (++qa < r1) continue;
                qa = 0, p -= r1 * t.ne[1] * a.nb[1], p += t.ne[2] * a.nb[2];
                if (++qb < r2) continue;
                qb = 0, p -= r2 * t.ne[2] * a.nb[2], p += t.ne[3] * a.nb[3];
                qc++;
            }
        }
        part[c * n_out + o] = acc;
    }
}

/* The same where t is a's leading dimensions (both contiguous; t.ne[d] is a.ne[d] up to some d and 1
 * after, as a norm weight's gradient [n] from [n, T, B]): tile q is a's block q of n_out elements,
 * so the terms and their order are k_repeat_back_part's without its index arithmetic, and a thread
 * has 8 loads in flight (that kernel's loop waits on one load at a time). */
__global__ void k_repeat_back_part_lead(const float *a, int64_t n_out, int64_t n_tiles, int64_t per, int64_t n_chunks,
                                        double *part) {
    GRID_STRIDE(e, n_out * n_chunks) {
        int64_t o = e % n_out, c = e / n_out, q = c * per, q1 = q + per < n_tiles ? q + per : n_tiles;
        double acc = 0;
        for (; q < q1; q += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = q + u < q1 ? a[(q + u) * n_out + o] : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (q + u < q1) acc += v[u];
        }
        part[c * n_out + o] = acc;
    }
}

/* The same for n_out a multiple of 4, 4 result elements a thread, through 16-byte loads where a is on
 * a 16-byte boundary (VEC; four times the bytes in flight a thread: ncu on the H200, the kernel above
 * waited on its loads, about 1.5 TB/s), else 4 loads of 4 bytes: each chunk's terms and order are
 * the kernel's above. A block takes RB_CHUNKS consecutive chunks (a warp each) of the same 32 groups
 * of 4 elements (a lane each: a warp reads 512 contiguous bytes of a row) and adds its chunks' sums
 * in chunk order, so that a partial is RB_CHUNKS chunks' and pass 2 reads an eighth of the bytes
 * (ncu, the 0.8B's norm weights at batch 8: pass 2 read 8 MB in 11 us, pass 1 33 MB in 12.5; now
 * 4.4 us). The sums depend on the shapes alone, not on a's alignment. 8 blocks a multiprocessor (32
 * registers): at 48, 5 blocks, pass 1 took 14 us for 12.5. */
#define RB_CHUNKS 8
/* The chunks REPEAT_BACK's pass 1 sums together in a block for n_out result elements over leading
 * dimensions (lead): RB_CHUNKS on the 4-wide kernel, else 1. GDN_GATE_BACK's pass 2 follows it. */
__host__ static inline int chunk_group(int64_t n_out, bool lead) { return lead && n_out % 4 == 0 ? RB_CHUNKS : 1; }
template <bool VEC>
__global__ void __launch_bounds__(256, 8) k_repeat_back_part_lead4(const float *a, int64_t n_out, int64_t n_tiles,
                                                                   int64_t per, int64_t n_chunks, double *part) {
    __shared__ double sh[RB_CHUNKS][4][32];
    int64_t n4 = n_out / 4, n_ob = (n4 + 31) / 32, n_cb = (n_chunks + RB_CHUNKS - 1) / RB_CHUNKS;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int64_t bi = blockIdx.x; bi < n_ob * n_cb; bi += gridDim.x) {
        int64_t cb = bi / n_ob, o4 = (bi % n_ob) * 32 + lane, c = cb * RB_CHUNKS + w;
        double acc[4] = {0, 0, 0, 0};
        if (o4 < n4 && c < n_chunks) {
            int64_t o = o4 * 4, q = c * per, q1 = q + per < n_tiles ? q + per : n_tiles;
            if (!VEC) { /* a row's 4 floats at a time: the same sums in the same order */
#pragma unroll 1
                for (; q < q1; q++) {
                    const float *r = a + q * n_out + o;
                    acc[0] += r[0], acc[1] += r[1], acc[2] += r[2], acc[3] += r[3];
                }
            }
            for (; q < q1; q += 8) {
                float4 v[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    v[u] =
                        q + u < q1 ? *(const float4 *)(a + (q + u) * n_out + o) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (q + u < q1) acc[0] += v[u].x, acc[1] += v[u].y, acc[2] += v[u].z, acc[3] += v[u].w;
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) sh[w][j][lane] = acc[j];
        __syncthreads();
        if (w == 0 && o4 < n4) {
            int nk = n_chunks - cb * RB_CHUNKS < RB_CHUNKS ? (int)(n_chunks - cb * RB_CHUNKS) : RB_CHUNKS;
            double sum[4] = {0, 0, 0, 0};
            for (int k = 0; k < nk; k++)
#pragma unroll
                for (int j = 0; j < 4; j++) sum[j] += sh[k][j][lane];
#pragma unroll
            for (int j = 0; j < 4; j++) part[cb * n_out + o4 * 4 + j] = sum[j];
        }
        __syncthreads();
    }
}

/* The conv weight gradient, pass 1: dw[j, ch] = sum over (b, t) of dy[ch, t, b] x[ch, t-(K-1)+j, b]. */
__global__ void k_conv_back_w_part(kt t, kt x, kt dy, kt pos, int64_t per, int64_t n_chunks, double *part) {
    int64_t K = t.ne[0], C = t.ne[1], T = x.ne[1], n_out = K * C, n_terms = T * x.ne[2];
    GRID_STRIDE(e, n_out * n_chunks) {
        int64_t o = e % n_out, c = e / n_out, ch = o % C, j = o / C;
        double acc = 0;
        int64_t q = c * per, q1 = q + per < n_terms ? q + per : n_terms;
        int64_t tt = q % T, bb = q / T; /* then counted up: no division per term */
        for (; q < q1; q++) {
            int64_t ts = tt - (K - 1) + j;
            if (ts >= 0 && K - 1 - j <= pos_at(pos, tt, bb))
                acc += (double)ldf(kt_at(dy, ch, tt, bb, 0)) * ldf(kt_at(x, ch, ts, bb, 0));
            if (++tt == T) tt = 0, bb++;
        }
        part[c * n_out + o] = acc;
    }
}

/* CONV1D_BACK_WEIGHT's pass 1 on dense float32 x and dy, 4 channels a thread (C a multiple of 4, x
 * and dy on 16-byte boundaries): a thread a (4 channels, chunk) computes the partials of all K taps,
 * reading dy once and x through a window of the last K positions kept in registers (the generic
 * kernel, a thread a (tap, channel, chunk), reads both K times, with the index and position
 * arithmetic per channel). The rows of x and dy go 4 at a time, all 8 loads issued before the
 * first is used. Each channel's partials are the generic kernel's float64 sums over the chunk's
 * terms in the same order: the same bits. */
enum { CONV_TAPS_MAX = 8, BW_ROWS = 4 };
/* KM: the taps' array size (K <= KM), known at compile time so the window and sums stay in
 * registers; tap j of K is slot j + KM - K, the first KM - K slots unused */
template <int KM>
__global__ void k_conv_back_w_part_dense4(const float *x, const float *dy, kt pos, int64_t C, int64_t T, int64_t B,
                                          int K, int64_t per, int64_t n_chunks, double *part) {
    int64_t n_out = (int64_t)K * C, n_terms = T * B, C4 = C / 4;
    int jlo = KM - K;
    GRID_STRIDE(e, C4 * n_chunks) {
        int64_t ch = (e % C4) * 4, c = e / C4;
        double acc[KM][4];
        float4 win[KM]; /* win[j] = x(ch .. ch + 3, tt - (KM - 1) + j, bb) */
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < KM; j++) {
            win[j] = zero;
#pragma unroll
            for (int i = 0; i < 4; i++) acc[j][i] = 0;
        }
        int64_t q = c * per, q1 = q + per < n_terms ? q + per : n_terms;
        int64_t tt = q % T, bb = q / T;
        bool fresh = true;
        for (; q < q1; q += BW_ROWS) { /* rows q .. q + 3, row q = bb * T + tt */
            float4 xs[BW_ROWS], ds[BW_ROWS];
#pragma unroll
            for (int u = 0; u < BW_ROWS; u++)
                if (q + u < q1)
                    xs[u] = *(const float4 *)(x + (q + u) * C + ch), ds[u] = *(const float4 *)(dy + (q + u) * C + ch);
#pragma unroll
            for (int u = 0; u < BW_ROWS; u++) {
                if (q + u >= q1) break;
                if (fresh) { /* the chunk's or an example column's first position: the window from memory */
#pragma unroll
                    for (int j = 0; j < KM - 1; j++) {
                        int64_t d = KM - 1 - j;
                        win[j] = j >= jlo && tt - d >= 0 ? *(const float4 *)(x + (q + u - d) * C + ch) : zero;
                    }
                    fresh = false;
                } else {
#pragma unroll
                    for (int j = 0; j < KM - 1; j++) win[j] = win[j + 1];
                }
                win[KM - 1] = xs[u];
                double d4[4] = {(double)ds[u].x, (double)ds[u].y, (double)ds[u].z, (double)ds[u].w};
                int64_t p = pos_at(pos, tt, bb);
#pragma unroll
                for (int j = 0; j < KM; j++) {
                    int64_t d = KM - 1 - j;
                    if (j >= jlo && tt - d >= 0 && d <= p) {
                        acc[j][0] += d4[0] * win[j].x;
                        acc[j][1] += d4[1] * win[j].y;
                        acc[j][2] += d4[2] * win[j].z;
                        acc[j][3] += d4[3] * win[j].w;
                    }
                }
                if (++tt == T) tt = 0, bb++, fresh = true;
            }
        }
#pragma unroll
        for (int j = 0; j < KM; j++)
            if (j >= jlo)
#pragma unroll
                for (int i = 0; i < 4; i++) part[c * n_out + (int64_t)(j - jlo) * C + ch + i] = acc[j][i];
    }
}

/* Pass 2: element o of the result (REPEAT_BACK: t's flat order; conv: o = j*C + ch in dw [K, C]
 * stored at (j, ch)) is the sum of its chunks: with many chunks (few result elements) by a block
 * per element, each thread taking chunks tid, tid + RT, ... in order and the block's fixed tree
 * adding the threads' sums; else by a thread per element, chunks in order. */
__device__ static void store_part_sum(kt t, int64_t o, double acc, int conv) {
    if (conv) {
        stf(kt_at(t, o / t.ne[1], o % t.ne[1], 0, 0), (float)acc);
    } else {
        int64_t i[4];
        kt_unflat(t, o, i);
        stf(kt_at(t, i[0], i[1], i[2], i[3]), (float)acc);
    }
}

__global__ void k_finish_parts(kt t, const double *part, int64_t n_out, int64_t n_chunks, int conv) {
    GRID_STRIDE(o, n_out) {
        double acc = 0;
        for (int64_t c = 0; c < n_chunks; c++) acc += part[c * n_out + o];
        store_part_sum(t, o, acc, conv);
    }
}

__global__ void k_finish_parts_blocks(kt t, const double *part, int64_t n_out, int64_t n_chunks, int conv) {
    __shared__ double sh[RT];
    for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
        double acc = 0;
        for (int64_t c = threadIdx.x; c < n_chunks; c += RT) acc += part[c * n_out + o];
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) store_part_sum(t, o, acc, conv);
    }
}

/* k_finish_parts_blocks for FO consecutive result elements a block: thread tid's sum over chunks tid,
 * tid + RT, ... and block_sum's tree, each element's own, so the same bits; a thread reads FO
 * partials of a chunk together (one 32-byte sector at FO = 4, where a block an element reads 8 bytes of
 * each sector it fetches). */
#define FO 4
__global__ void k_finish_parts_blocks4(kt t, const double *part, int64_t n_out, int64_t n_chunks, int conv) {
    __shared__ double sh[FO][RT];
    for (int64_t o0 = (int64_t)blockIdx.x * FO; o0 < n_out; o0 += (int64_t)gridDim.x * FO) {
        int m = n_out - o0 < FO ? (int)(n_out - o0) : FO;
        double acc[FO] = {0, 0, 0, 0};
        for (int64_t c = threadIdx.x; c < n_chunks; c += RT)
#pragma unroll
            for (int j = 0; j < FO; j++)
                if (j < m) acc[j] += part[c * n_out + o0 + j];
#pragma unroll
        for (int j = 0; j < FO; j++) sh[j][threadIdx.x] = acc[j];
        __syncthreads();
        for (int s = RT / 2; s > 0; s >>= 1) { /* block_sum's tree */
            if ((int)threadIdx.x < s)
#pragma unroll
                for (int j = 0; j < FO; j++) sh[j][threadIdx.x] += sh[j][threadIdx.x + s];
            __syncthreads();
        }
        if ((int)threadIdx.x < m) store_part_sum(t, o0 + threadIdx.x, sh[threadIdx.x][0], conv);
        __syncthreads();
    }
}

__device__ static inline float silu_back1(float xv, float d) {
    float sg = 1.0f / (1.0f + expf(-xv));
    return d * sg * (1.0f + xv * (1.0f - sg));
}
/* GDN_GATE: softplus(a + dt_bias) * -exp(A_log), the unary and binary formulas of the ADD, SOFTPLUS,
 * EXP, NEG and MUL it replaces (head h: a's dim 0; A_log and dt_bias one value a head) */
__device__ static inline float gate_head(const kt &x, int64_t h) { return ldf(x.p + h * x.nb[0]); }
__global__ void k_gdn_gate(kt t, kt a, kt al, kt dt) {
    GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]) {
        int64_t i[4];
        kt_unflat(t, e, i);
        float x = keel_binary_f32(KEEL_OP_ADD, ldf(kt_at(a, i[0], i[1], i[2], i[3])), gate_head(dt, i[0]));
        float ne =
            keel_unary_f32(KEEL_OP_NEG, keel_unary_f32(KEEL_OP_EXP, gate_head(al, i[0]), 0.0f, 0.0f), 0.0f, 0.0f);
        stf(kt_at(t, i[0], i[1], i[2], i[3]), __fmul_rn(keel_unary_f32(KEEL_OP_SOFTPLUS, x, 0.0f, 0.0f), ne));
    }
}

/* GDN_GATE_BACK, pass 1: the old rules' elementwise ops (MUL by -exp(A_log), SIGMOID of a + dt_bias,
 * MUL; MUL of dy by the softplus) for head o's rows q of chunk c, da written at its flat place and
 * the two chunk sums (dy softplus and da) in float64 in row order: REPEAT_BACK's pass 1 for [H] from
 * [H, rows] with the same chunks, so the same partials. part: [chunk][2 H]. */
__global__ void k_gdn_gate_back_part(kt t, kt a, kt al, kt dt, kt dy, int64_t per, int64_t n_chunks, double *part) {
    int64_t H = a.ne[0], rows = a.ne[1] * a.ne[2] * a.ne[3];
    float *da = (float *)t.p;
    GRID_STRIDE(e, H * n_chunks) {
        int64_t o = e % H, c = e / H, q = c * per, q1 = q + per < rows ? q + per : rows;
        float ex = keel_unary_f32(KEEL_OP_EXP, gate_head(al, o), 0.0f, 0.0f), bias = gate_head(dt, o);
        float ne = keel_unary_f32(KEEL_OP_NEG, ex, 0.0f, 0.0f);
        double s_n = 0, s_dt = 0;
        for (; q < q1; q++) {
            int64_t i1 = q % a.ne[1], i2 = q / a.ne[1] % a.ne[2], i3 = q / a.ne[1] / a.ne[2];
            float x = keel_binary_f32(KEEL_OP_ADD, ldf(kt_at(a, o, i1, i2, i3)), bias),
                  d = ldf(kt_at(dy, o, i1, i2, i3));
            float dx = __fmul_rn(__fmul_rn(d, ne), keel_unary_f32(KEEL_OP_SIGMOID, x, 0.0f, 0.0f));
            da[q * H + o] = dx;
            s_n += __fmul_rn(d, keel_unary_f32(KEEL_OP_SOFTPLUS, x, 0.0f, 0.0f));
            s_dt += dx;
        }
        part[c * 2 * H + o] = s_n;
        part[c * 2 * H + H + o] = s_dt;
    }
}

/* Pass 2: result j of [dA_log | ddt_bias] the sum of its chunks in REPEAT_BACK's order (many chunks:
 * a block, thread tid's chunks tid, tid + RT, ... and block_sum's tree; else a thread, in order; with
 * H a multiple of 4, as REPEAT_BACK's 4-wide pass 1, the chunks first summed in groups of grp =
 * RB_CHUNKS, each from 0 in chunk order, and those sums taken as the chunks), then
 * dA_log = NEG(sum) * exp(A_log), the old rules' NEG and EXP's MUL */
__device__ static void gate_back_store(kt t, kt al, int64_t H, int64_t j, double acc) {
    float *r = (float *)t.p + (t.ne[0] - 2 * H);
    float s = (float)acc;
    r[j] = j < H ? __fmul_rn(keel_unary_f32(KEEL_OP_NEG, s, 0.0f, 0.0f),
                             keel_unary_f32(KEEL_OP_EXP, gate_head(al, j), 0.0f, 0.0f))
                 : s;
}
/* group k's partial of result j: chunk k's (grp 1), or chunks k grp .. k grp + grp - 1's sum */
__device__ static double gate_group(const double *part, int64_t H, int64_t j, int64_t k, int grp, int64_t n_chunks) {
    if (grp == 1) return part[k * 2 * H + j];
    double s = 0;
    for (int64_t c = k * grp; c < n_chunks && c < (k + 1) * grp; c++) s += part[c * 2 * H + j];
    return s;
}
__global__ void k_gdn_gate_back_sum(kt t, kt al, int64_t H, const double *part, int64_t n_chunks, int grp, int blocks) {
    __shared__ double sh[RT];
    int64_t n_groups = (n_chunks + grp - 1) / grp;
    if (!blocks) {
        GRID_STRIDE(j, 2 * H) {
            double acc = 0;
            for (int64_t k = 0; k < n_groups; k++) acc += gate_group(part, H, j, k, grp, n_chunks);
            gate_back_store(t, al, H, j, acc);
        }
        return;
    }
    for (int64_t j = blockIdx.x; j < 2 * H; j += gridDim.x) {
        double acc = 0;
        for (int64_t k = threadIdx.x; k < n_groups; k += RT) acc += gate_group(part, H, j, k, grp, n_chunks);
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) gate_back_store(t, al, H, j, acc);
    }
}

/* SIGMOID_BACK from y = sigmoid(x): SIGMOID's old rule, SCALE(y, -1, 1) then two MULs, the same roundings */
__device__ static inline float sigmoid_back1(float y, float d) {
    return __fmul_rn(d, __fmul_rn(y, keel_unary_f32(KEEL_OP_SCALE, y, -1.0f, 1.0f)));
}
/* SILU_BACK (sg 0: of x) and SIGMOID_BACK (sg 1: of y) */
__device__ static inline float unary_back1(int sg, float x, float d) {
    return sg ? sigmoid_back1(x, d) : silu_back1(x, d);
}
__global__ void k_unary_back(kt t, kt x, kt dy, int vec, int sg) {
    if (vec) {
        const float *xp = (const float *)x.p, *dp = (const float *)dy.p;
        float *y = (float *)t.p;
        int64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
        VEC_LOOP(q, n) {
            float4 u = ((const float4 *)xp)[q], v = ((const float4 *)dp)[q];
            ((float4 *)y)[q] = make_float4(unary_back1(sg, u.x, v.x), unary_back1(sg, u.y, v.y),
                                           unary_back1(sg, u.z, v.z), unary_back1(sg, u.w, v.w));
        }
        VEC_TAIL(e, n) y[e] = unary_back1(sg, xp[e], dp[e]);
        return;
    }
    if (t.contig && x.contig && dy.contig) {
        const float *xp = (const float *)x.p, *dp = (const float *)dy.p;
        float *y = (float *)t.p;
        GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]) y[e] = unary_back1(sg, xp[e], dp[e]);
        return;
    }
    GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]) {
        int64_t i[4];
        kt_unflat(t, e, i);
        stf(kt_at(t, i[0], i[1], i[2], i[3]),
            unary_back1(sg, ldf(kt_at(x, i[0], i[1], i[2], i[3])), ldf(kt_at(dy, i[0], i[1], i[2], i[3]))));
    }
}

/* 4 results at group q of a dense float32 (bf 0) or bf16 (bf 1, each rounded by CAST's function) array */
__device__ static inline void store4(void *p, int64_t q, float4 r, int bf) {
    if (bf)
        ((ushort4 *)p)[q] = make_ushort4(keel_cvt_f32_to_bf16(r.x), keel_cvt_f32_to_bf16(r.y),
                                         keel_cvt_f32_to_bf16(r.z), keel_cvt_f32_to_bf16(r.w));
    else
        ((float4 *)p)[q] = r;
}
__device__ static inline void store1(void *p, int64_t e, float r, int bf) {
    if (bf)
        ((uint16_t *)p)[e] = keel_cvt_f32_to_bf16(r);
    else
        ((float *)p)[e] = r;
}

/* SIGMOID_MUL (x * sigmoid(gate)) and SIGMOID_MUL_BACK ([dx | dgate]): keel_unary_f32's SIGMOID,
 * MUL's products and sigmoid_back1, the bits of the SIGMOID, MUL and their rules' ops; bf: SIGMOID_MUL's
 * bf16 result (store4's rounding, the CAST it replaces; t is contiguous). rows4: every source rows_vec's
 * (attention's gate is every other half row of the q projection): a thread a group of 4 (row_group);
 * else an element a thread. */
__device__ static inline float sigmoid1(float g) { return keel_unary_f32(KEEL_OP_SIGMOID, g, 0.0f, 0.0f); }
__device__ static inline void sigmoid_mul_back1(float x, float g, float d, float *dx, float *dg) {
    float s = sigmoid1(g);
    *dx = __fmul_rn(d, s);
    *dg = sigmoid_back1(s, __fmul_rn(d, x));
}
__global__ void k_sigmoid_mul(kt t, kt x, kt g, kt dy, int back, int rows4, int bf) {
    int64_t n = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3];
    if (rows4) {
        unsigned n4 = (unsigned)(x.ne[0] / 4);
        GRID_STRIDE(q, n / 4) {
            unsigned r = (unsigned)q / n4, c = ((unsigned)q - r * n4) * 4;
            float4 xv = *row_group(x, r, c), gv = *row_group(g, r, c), o, o2;
            if (!back) {
                o = make_float4(__fmul_rn(xv.x, sigmoid1(gv.x)), __fmul_rn(xv.y, sigmoid1(gv.y)),
                                __fmul_rn(xv.z, sigmoid1(gv.z)), __fmul_rn(xv.w, sigmoid1(gv.w)));
            } else {
                float4 dv = *row_group(dy, r, c);
                sigmoid_mul_back1(xv.x, gv.x, dv.x, &o.x, &o2.x);
                sigmoid_mul_back1(xv.y, gv.y, dv.y, &o.y, &o2.y);
                sigmoid_mul_back1(xv.z, gv.z, dv.z, &o.z, &o2.z);
                sigmoid_mul_back1(xv.w, gv.w, dv.w, &o.w, &o2.w);
                ((float4 *)t.p)[n / 4 + q] = o2;
            }
            store4(t.p, q, o, bf);
        }
        return;
    }
    GRID_STRIDE(e, n) {
        int64_t i[4];
        kt_unflat(x, e, i);
        float xv = ldf(kt_at(x, i[0], i[1], i[2], i[3])), gv = ldf(kt_at(g, i[0], i[1], i[2], i[3]));
        if (!back) {
            store1(t.p, e, __fmul_rn(xv, sigmoid1(gv)), bf);
        } else {
            float dx, dg;
            sigmoid_mul_back1(xv, gv, ldf(kt_at(dy, i[0], i[1], i[2], i[3])), &dx, &dg);
            ((float *)t.p)[e] = dx, ((float *)t.p)[n + e] = dg;
        }
    }
}

/* RMS_NORM_W and GATED_RMS_NORM and their backward, a warp a row: k_rows' warp-a-row RMS_NORM and
 * RMS_NORM_BACK (the same lanes, the same butterfly), SCALE's 1 + w, MUL's products, the unary SILU
 * and silu_back1, so the bits of the ops they replace for rows of up to WARP_ROW_MAX elements. The
 * backward writes [dx | dz (gated)], each row at its flat place, and the products dy silu(z)
 * rms_norm(x) that dw sums: QK_NORM_ROPE_BACK's after dx in its result, for REPEAT_BACK; the others'
 * into the node's scratch (terms), which norm_dw then sums as REPEAT_BACK would, or, in
 * k_norm_w_back_dw, into shared memory. */
typedef struct {
    kt t, x, w, z, dy, pos; /* z: gated only; dy: backward only; pos: QK_NORM_ROPE */
    kt g;                   /* RMS_NORM_W_BACK_ADD: added to dx (add) */
    double eps;
    int gated, back, one; /* one: the 1 + w form */
    int add;
    int rope;           /* QK_NORM_ROPE: k_rope's rotation after the norm (and back before its gradient) */
    const double *freq; /* its n_rot/2 frequencies (host-made, keel_rope_freq) */
    const float2 *cs;   /* and the float cos, sin of positions [0, n_cs) (rope_cs): the same bits */
    int64_t nr, n_cs;
    int64_t fx, fz, fg, fa; /* k_norm_w_pipe: the byte stride of x's (z's, dy's, g's) rows where it is one (else 0) */
    float *terms;           /* the backward's products dw sums, a row at r n (NULL: QK_NORM_ROPE_BACK's, in t) */
    uint16_t *part16;       /* the backward's bf16 part (ip1: dz, or a copy of dx), a row at r n; NULL: none */
} norm_w_args;

/* where row r's products for dw go (n elements a row, N all rows' elements) */
__device__ static inline float *norm_terms_row(const norm_w_args &A, int64_t r, int64_t n, int64_t N) {
    return A.terms ? A.terms + r * n : (float *)A.t.p + N + r * n;
}

__device__ static inline float norm_w_weight(const norm_w_args &A, int64_t i) {
    /* through the read-only path: the weight is an input of the node, never written while it runs,
     * so its loads need not wait for the stores before them */
    float w = __ldg((const float *)kt_at(A.w, i, 0, 0, 0));
    return A.one ? keel_unary_f32(KEEL_OP_SCALE, w, 1.0f, 1.0f) : w;
}

/* Element j of the row a rotation reads (stride nb bytes): as stored (dy), or normed as RMS_NORM_W
 * gives it (x sc w) */
__device__ static inline float nw_val(const norm_w_args &A, const char *row, int64_t nb, int64_t j, float sc,
                                      bool normed) {
    float v = ldf(row + j * nb);
    return normed ? __fmul_rn(__fmul_rn(v, sc), norm_w_weight(A, j)) : v;
}
/* The float cos and sin of the angle p freq_f (in float64, as on the cpu); sin's sign turned by
 * dir (+1 forward, -1 back: exact, so either sign's bits are the turned bits). k_rope, the table
 * of k_rope_cs and rope_elem all take them from here, so a table entry holds what the kernels make. */
__device__ static inline float2 rope_cos_sin(int64_t p, const double *freq, int64_t f, double dir) {
    double ang = (double)p * freq[f];
    float s = (float)sin(ang);
    return make_float2((float)cos(ang), dir < 0 ? -s : s);
}
/* the same as a call (positions past the table: rare), so that its float64 sin and cos do not take
 * the registers of every kernel that rotates */
__device__ static __noinline__ float2 rope_cos_sin_call(int64_t p, const double *freq, int64_t f) {
    return rope_cos_sin(p, freq, f, 1.0);
}
/* k_rope's rotation of element i of that row: pairs f, f + nr/2 turned by the angle pos * freq_f
 * (dir -1: back), the same float32 formulas; past n_rot (or without rope) the element itself */
__device__ static inline float rope_elem(const norm_w_args &A, const char *row, int64_t nb, int64_t i, int64_t p,
                                         double dir, float sc, bool normed) {
    if (!A.rope || i >= A.nr) return nw_val(A, row, nb, i, sc, normed);
    int64_t h = A.nr / 2, f = i < h ? i : i - h;
    /* the table's entry where there is one (float64 cos and sin an element made the kernel slow) */
    float2 c = p >= 0 && p < A.n_cs ? A.cs[p * h + f] : rope_cos_sin_call(p, A.freq, f);
    float cs = c.x, sn = dir < 0 ? -c.y : c.y;
    float x1 = nw_val(A, row, nb, f, sc, normed), x2 = nw_val(A, row, nb, f + h, sc, normed);
    return i < h ? __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn)) : __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
}

/* Row r of RMS_NORM_W, GATED_RMS_NORM, QK_NORM_ROPE or a backward of them (the backward's result at
 * its flat place: r n in each part of the packed result), by the calling warp: lane l takes elements
 * i = l + 32 k for k < KN (known when compiled; 0: kn, at run time), sums their squares (and the
 * backward's products) in k's order in float64, then adds the lanes' sums over the butterfly. Every
 * kernel below runs its rows through here, so the bits do not depend on where a kernel keeps the
 * row. X(k, i), Z(k, i): element i of x and of z; G(k, i): the
 * gradient reaching the norm's output (dy, or ROPE_BACK's g); Y(i, sc, y): the forward's value
 * before the gate, from y = x sc w (the rotation's variant turns the normed row); W(i): w_i (or
 * 1 + w_i) as norm_w_weight gives it; S(i, v): the forward stores v as element i of its row; Ga(k, i):
 * element i of RMS_NORM_W_BACK_ADD's addend (add), which dx is added to as ADD adds; tw: where the
 * backward puts the row's products for dw (tw[i]). */
template <int KN, int UNR, typename FX, typename FZ, typename FG, typename FY, typename FW, typename FS, typename FA>
__device__ static inline void norm_w_row(const norm_w_args &A, int64_t r, int kn, bool gated, bool back, bool add,
                                         float *tw, FX X, FZ Z, FG G, FY Y, FW W, FS S, FA Ga) {
    int64_t n = A.x.ne[0], N = n * A.x.ne[1] * A.x.ne[2] * A.x.ne[3];
    int lane = threadIdx.x & 31;
    double ss = 0, sd = 0;
#pragma unroll(UNR)
    for (int k = 0; k < (KN ? KN : kn); k++) {
        int i = lane + 32 * k;
        if (i >= n) break;
        double xv = X(k, i);
        ss += xv * xv;
        if (back) {
            float db = G(k, i);
            if (gated) db = __fmul_rn(db, keel_unary_f32(KEEL_OP_SILU, Z(k, i), 0.0f, 0.0f));
            sd += xv * __fmul_rn(db, W(i));
        }
    }
    for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    if (back)
        for (int m = 16; m > 0; m >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, m);
    float sc = (float)(1.0 / sqrt(ss / (double)n + A.eps));
    double sb = 1.0 / sqrt(ss / (double)n + A.eps), f2 = sb * sb * sb * sd / (double)n;
    float *o = back ? (float *)A.t.p + r * n : NULL;
#pragma unroll(UNR)
    for (int k = 0; k < (KN ? KN : kn); k++) {
        int i = lane + 32 * k;
        if (i >= n) break;
        float xv = X(k, i), wv = W(i), a = __fmul_rn(xv, sc);
        float zv = gated ? Z(k, i) : 0.0f;
        float sg = gated ? keel_unary_f32(KEEL_OP_SILU, zv, 0.0f, 0.0f) : 1.0f;
        if (!back) {
            float y = Y(i, sc, __fmul_rn(a, wv));
            S(i, gated ? __fmul_rn(y, sg) : y);
            continue;
        }
        float g = G(k, i), db = gated ? __fmul_rn(g, sg) : g, dx = (float)(sb * __fmul_rn(db, wv) - f2 * xv);
        dx = add ? __fadd_rn(Ga(k, i), dx) : dx; /* RMS_NORM_W_BACK_ADD: ADD's sum */
        o[i] = dx;
        /* dz, in float32 or as the bf16 part; without z, the bf16 part is dx's copy (both as CAST rounds) */
        float dz = gated ? silu_back1(zv, __fmul_rn(g, __fmul_rn(a, wv))) : dx;
        if (A.part16)
            A.part16[r * n + i] = keel_cvt_f32_to_bf16(dz);
        else if (gated)
            o[N + i] = dz;
        tw[i] = __fmul_rn(db, a);
    }
}

/* the forward's store of v at element i of row trow (any strides): as float32, or as the bf16 result
 * (QK_NORM_ROPE's ip2, the others' ip1), rounded as CAST rounds it */
__device__ static inline void norm_w_store(const norm_w_args &A, char *trow, int i, float v) {
    if (A.t.type == KEEL_BF16)
        *(uint16_t *)(trow + i * A.t.nb[0]) = keel_cvt_f32_to_bf16(v);
    else
        stf(trow + i * A.t.nb[0], v);
}

/* PM > 0: rows of at most 32 PM elements, without the rotation; a lane loads its elements of x,
 * z and dy into registers before the first sum (all its loads in flight at once) and the
 * second pass reads them there. PM = 0: every element from memory in both passes (a load waits
 * for the stores before it: the pointers may alias). The same terms in the same order either way.
 * GB: the gated (1) and backward (2) flags known when compiled, so that a variant keeps only the
 * registers its rows need (the 1024-wide forward: 103 a thread, against 166 with them read at run
 * time); -1: read from A (the rotation's variant and the backward, see launch_norm_w). */
template <int PM, int GB> __global__ void k_norm_w(norm_w_args A) {
    const bool gated = GB < 0 ? A.gated != 0 : (GB & 1) != 0, back = GB < 0 ? A.back != 0 : (GB & 2) != 0,
               add = GB < 0 && A.add != 0;
    int64_t n = A.x.ne[0], R = A.x.ne[1] * A.x.ne[2] * A.x.ne[3];
    int lane = threadIdx.x & 31, kn = PM ? PM : (int)((n + 31) / 32);
    int64_t w0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, ws = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t r = w0; r < R; r += ws) {
        int64_t i1 = r % A.x.ne[1], i2 = (r / A.x.ne[1]) % A.x.ne[2], i3 = r / (A.x.ne[1] * A.x.ne[2]);
        const char *xs = kt_at(A.x, 0, i1, i2, i3), *zs = gated ? kt_at(A.z, 0, i1, i2, i3) : NULL;
        const char *gs = back ? kt_at(A.dy, 0, i1, i2, i3) : NULL, *as = add ? kt_at(A.g, 0, i1, i2, i3) : NULL;
        const bool rope = PM == 0 && A.rope; /* known false at compile time in the register variants */
        int64_t p = rope ? pos_at(A.pos, i2, i3) : 0;
        float xr[PM ? PM : 1], zr[PM ? PM : 1], gr[PM ? PM : 1];
#pragma unroll
        for (int k = 0; k < PM; k++) { /* rows of unit stride here: one address a row, offsets known */
            int i = lane + 32 * k;
            if (i < n) {
                xr[k] = ((const float *)xs)[i];
                if (gated) zr[k] = ((const float *)zs)[i];
                if (back) gr[k] = ((const float *)gs)[i];
            }
        }
        char *trow = back ? NULL : kt_at(A.t, 0, i1, i2, i3);
        norm_w_row<PM, PM ? PM : 1>(
            A, r, kn, gated, back, add, back ? norm_terms_row(A, r, n, n * R) : NULL,
            [&](int k, int64_t i) {
                return PM ? xr[k] : ldf(xs + i * A.x.nb[0]);
            },
            [&](int k, int64_t i) {
                return PM ? zr[k] : ldf(zs + i * A.z.nb[0]);
            },
            [&](int k, int64_t i) {
                return PM ? gr[k]
                          : rope_elem(A, gs, A.dy.nb[0], i, p, -1.0, 0.0f, false); /* QK_NORM_ROPE: ROPE_BACK's g */
            },
            [&](int64_t i, float sc, float y) { /* the normed row, rotated */
                                                return rope ? rope_elem(A, xs, A.x.nb[0], i, p, 1.0, sc, true) : y;
            },
            [&](int i) {
                return norm_w_weight(A, i);
            },
            [&](int i, float v) {
                norm_w_store(A, trow, i, v);
            },
            [&](int, int64_t i) { /* the addend: read where it is added, after the row's sums */
                                  return ldf(as + i * A.g.nb[0]);
            });
    }
}

/* the forward's variants known when compiled; the backward's flags read at run time (compiled for
 * them, the 1024-wide backward took 211 registers a thread, two blocks a multiprocessor, against
 * 166 and three) */
template <int PM> static void launch_norm_w(const norm_w_args &A, unsigned blocks, int threads, cudaStream_t s) {
    if (A.back)
        k_norm_w<PM, -1><<<blocks, threads, 0, s>>>(A);
    else if (A.gated)
        k_norm_w<PM, 1><<<blocks, threads, 0, s>>>(A);
    else
        k_norm_w<PM, 0><<<blocks, threads, 0, s>>>(A);
}

/* The same on rows of unit stride whose starts lie on 16-byte boundaries, n a multiple of 4 up to
 * 32 PM, w of unit stride, a contiguous result (PM: the elements a lane takes; GB: the gated (1),
 * backward (2), rotation (4) and bf16-result (8) flags; all known when compiled). A warp takes rows
 * r, r + (the grid's warps), ..., each row's x (z, dy) copied into shared memory by 16-byte
 * asynchronous copies while the warp works on the row before; w (or 1 + w) sits in shared memory
 * once a block; rows laid out at one stride (norm_w_args' fx, fz, fg) are found without divisions.
 * ncu on the H200: the register kernels above are issue-bound (a 1024-wide row spent some 40
 * instructions an element on 64-bit addresses, the weight's loads and the result type's branch; the
 * 128-wide gated norm more on index divisions than on elements). Rows are independent, so the grid
 * (sized by occupancy) does not change any bits; the row itself is norm_w_row's. */
#define NORM_PIPE_WARPS 4
/* the rows a warp's stage holds: x, and z (gated), dy (backward) and g (RMS_NORM_W_BACK_ADD's addend) */
__host__ __device__ constexpr int norm_pipe_arrays(int gb) { return 1 + (gb & 1) + ((gb & 2) >> 1) + ((gb & 16) >> 4); }
/* the start of row r of x (flat: its rows at one stride, 0: found from the indices) */
__device__ static inline const char *norm_row(const kt &x, int64_t r, int64_t flat) {
    return flat ? x.p + r * flat : kt_at(x, 0, r % x.ne[1], (r / x.ne[1]) % x.ne[2], r / (x.ne[1] * x.ne[2]));
}
template <int PM, int GB> __global__ void __launch_bounds__(32 * NORM_PIPE_WARPS, 4) k_norm_w_pipe(norm_w_args A) {
    extern __shared__ float nsm[];
    constexpr bool gated = (GB & 1) != 0, back = (GB & 2) != 0, rope = (GB & 4) != 0, bf = (GB & 8) != 0,
                   add = (GB & 16) != 0;
    constexpr int na = norm_pipe_arrays(GB), unr = rope ? 2 : PM < 8 ? PM : 8; /* the rotation's registers: 2 */
    constexpr int og = gated ? 2 : 1, oa = og + 1; /* the stage's rows: x, z, dy (at og), g (at oa) */
    int n = (int)A.x.ne[0], lane = threadIdx.x & 31;
    int64_t R = A.x.ne[1] * A.x.ne[2] * A.x.ne[3];
    float *buf = nsm + (size_t)(threadIdx.x >> 5) * 2 * na * n, /* the warp's two stages */
        *wsm = nsm + (size_t)NORM_PIPE_WARPS * 2 * na * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) wsm[i] = norm_w_weight(A, i);
    __syncthreads();
    int64_t w0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, ws = ((int64_t)gridDim.x * blockDim.x) >> 5;
    /* row r's x, z, dy, g into stage s; an empty batch past the last row, so that every wait below
     * counts the same batches */
    auto fetch = [&](int64_t r, int s) {
        if (r < R) {
            float *d = buf + (size_t)s * na * n;
            const char *xs = norm_row(A.x, r, A.fx), *zs = gated ? norm_row(A.z, r, A.fz) : NULL,
                       *gs = back ? norm_row(A.dy, r, A.fg) : NULL, *as = add ? norm_row(A.g, r, A.fa) : NULL;
            for (int c = 4 * lane; c < n; c += 128) {
                __pipeline_memcpy_async(d + c, xs + c * 4, 16);
                if (gated) __pipeline_memcpy_async(d + n + c, zs + c * 4, 16);
                if (back) __pipeline_memcpy_async(d + og * n + c, gs + c * 4, 16);
                if (add) __pipeline_memcpy_async(d + oa * n + c, as + c * 4, 16);
            }
        }
        __pipeline_commit();
    };
    fetch(w0, 0);
    int s = 0;
    for (int64_t r = w0; r < R; r += ws, s ^= 1) {
        fetch(r + ws, s ^ 1);
        __pipeline_wait_prior(1); /* this row's copies (this lane's) */
        __syncwarp();             /* and the other lanes' */
        const float *xb = buf + (size_t)s * na * n, *zb = xb + n, *gb = xb + og * n, *ab = xb + oa * n;
        int64_t p = rope ? pos_at(A.pos, (r / A.x.ne[1]) % A.x.ne[2], r / (A.x.ne[1] * A.x.ne[2])) : 0;
        char *trow = A.t.p + r * n * (bf ? 2 : 4);
        /* the rotation reads the row in shared memory as k_norm_w reads it in global memory */
        norm_w_row<PM, unr>(
            A, r, PM, gated, back, add, back ? norm_terms_row(A, r, n, n * R) : NULL,
            [&](int, int i) {
                return xb[i];
            },
            [&](int, int i) {
                return zb[i];
            },
            [&](int, int i) {
                return rope ? rope_elem(A, (const char *)gb, sizeof(float), i, p, -1.0, 0.0f, false) : gb[i];
            },
            [&](int i, float sc, float y) {
                return rope ? rope_elem(A, (const char *)xb, sizeof(float), i, p, 1.0, sc, true) : y;
            },
            [&](int i) {
                return wsm[i];
            },
            [&](int i, float v) {
                if (bf) /* the bf16 result (QK_NORM_ROPE's ip2, the others' ip1): rounded as CAST rounds it */
                    ((uint16_t *)trow)[i] = keel_cvt_f32_to_bf16(v);
                else
                    ((float *)trow)[i] = v;
            },
            [&](int, int i) {
                return ab[i];
            });
        __syncwarp(); /* every lane has read the stage before the next fetch into it */
    }
}

template <int PM, int GB>
static int launch_norm_pipe(keel_backend *be, const keel_tensor *t, const norm_w_args &A, int64_t R) {
    size_t shm = ((size_t)NORM_PIPE_WARPS * 2 * (size_t)norm_pipe_arrays(GB) + 1) * (size_t)A.x.ne[0] * sizeof(float);
    int dev = 0, sms = 0, per = 0, most_shm = 0;
    if (cuda_check(cudaGetDevice(&dev), "norm launch", t) ||
        cuda_check(cudaDeviceGetAttribute(&most_shm, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "norm launch", t))
        return -1;
    if (shm > (size_t)most_shm) return 1; /* a GPU with less shared memory a block than the H200's 227 KB */
    if (cuda_check(cudaFuncSetAttribute(k_norm_w_pipe<PM, GB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm),
                   "norm launch", t) ||
        cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "norm launch", t) ||
        cuda_check(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_norm_w_pipe<PM, GB>, 32 * NORM_PIPE_WARPS, shm),
            "norm launch", t))
        return -1;
    int64_t need = (R + NORM_PIPE_WARPS - 1) / NORM_PIPE_WARPS, most = (int64_t)(per > 0 ? per : 1) * sms;
    k_norm_w_pipe<PM, GB><<<(unsigned)(need < most ? need : most), 32 * NORM_PIPE_WARPS, shm, st(be)>>>(A);
    return cuda_check(cudaGetLastError(), "norm launch", t);
}
/* the variant for the row length and the op: GB from A's flags and the result's type. 0: launched;
 * 1: not (its shared memory is more than the device gives a block); -1: an error */
template <int PM>
static int launch_norm_pipe_w(keel_backend *be, const keel_tensor *t, const norm_w_args &A, int64_t R) {
    bool bf = A.t.type == KEEL_BF16;
    if (A.rope)
        return A.back ? launch_norm_pipe<PM, 6>(be, t, A, R)
               : bf   ? launch_norm_pipe<PM, 12>(be, t, A, R)
                      : launch_norm_pipe<PM, 4>(be, t, A, R);
    if (A.back)
        return A.gated ? launch_norm_pipe<PM, 3>(be, t, A, R)
               : A.add ? launch_norm_pipe<PM, 18>(be, t, A, R)
                       : launch_norm_pipe<PM, 2>(be, t, A, R);
    if (A.gated) return bf ? launch_norm_pipe<PM, 9>(be, t, A, R) : launch_norm_pipe<PM, 1>(be, t, A, R);
    return bf ? launch_norm_pipe<PM, 8>(be, t, A, R) : launch_norm_pipe<PM, 0>(be, t, A, R);
}

/* RMS_NORM_W_BACK(_ADD) and GATED_RMS_NORM_BACK with dw summed in the same pass: REPEAT_BACK's float64
 * partials of [n] from the rows (chunks of per rows, grp chunks a partial: norm_dw_chunks) made from
 * the products in shared memory, so that the [n, rows] tensor of products is neither written nor read
 * back (a 1024-wide norm at batch 8: 32 MB each way, and a launch). A block takes one partial's rows,
 * tr at a time: a row a warp (norm_w_row, its x, z, dy and addend in registers as k_norm_w keeps them,
 * the loop over them unrolled whole so that they stay there; dx and dz to the result), its products
 * into row k of the tile; then a thread a column adds the tile's products in row order to its chunk's
 * float64 sum and, at a chunk's last row, that sum to the partial's: k_repeat_back_part_lead4's sums
 * (at grp 1, k_repeat_back_part_lead's), so the partials, and after norm_dw's second pass dw, have
 * REPEAT_BACK's bits. Short rows (PM <= 8) load a warp's next row while it works on this one, long
 * ones (no registers for two) the next tile's while the tile's sums are made. PM: a lane's elements of
 * a row (n <= 32 PM, unit stride); GB: gated (1), RMS_NORM_W_BACK_ADD (16). */
#define NORM_DW_TILE_BYTES 32768
#define NORM_DW_THREADS    256
template <int PM, int GB>
__global__ void __launch_bounds__(NORM_DW_THREADS, PM <= 4 ? 4 : PM <= 8 ? 2 : 1)
    k_norm_w_back_dw(norm_w_args A, int64_t per, int64_t n_chunks, int grp, int tr, double *part) {
    extern __shared__ float dsm[];
    constexpr bool gated = (GB & 1) != 0, add = (GB & 16) != 0, pf = PM <= 8;
    constexpr int CPT = (32 * PM + NORM_DW_THREADS - 1) / NORM_DW_THREADS, /* a thread's columns */
        NW = NORM_DW_THREADS / 32, NQ = pf ? PM : 1;
    int n = (int)A.x.ne[0], lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    int64_t R = A.x.ne[1] * A.x.ne[2] * A.x.ne[3], c0 = (int64_t)blockIdx.x * grp,
            c1 = c0 + grp < n_chunks ? c0 + grp : n_chunks, r0 = c0 * per, r1 = c1 * per < R ? c1 * per : R;
    float *tile = dsm, *wsm = dsm + (size_t)tr * n;
    for (int i = threadIdx.x; i < n; i += NORM_DW_THREADS) wsm[i] = norm_w_weight(A, i);
    double cs[CPT], ps[CPT]; /* this thread's columns' sums: of the chunk so far, of the partial */
#pragma unroll
    for (int j = 0; j < CPT; j++) cs[j] = 0.0, ps[j] = 0.0;
    int64_t cend = r0 + per < R ? r0 + per : R; /* the end of the chunk the column sums are in */
    bool have = false; /* long rows: this warp's first row of the tile loaded during the last tile */
    float xr[PM], zr[PM], gr[PM], ar[PM], xq[NQ], zq[NQ], gq[NQ], aq[NQ];
    __syncthreads();
    for (int64_t ra = r0; ra < r1; ra += tr) {
        int nr = (int)(r1 - ra < tr ? r1 - ra : tr);
/* row r's elements into X, Z, G, A_ (all of the row's loads in flight at once) */
#define NORM_DW_LOAD(r, X, Z, G, A_, M)                                                                                \
    do {                                                                                                               \
        const float *xs_ = (const float *)norm_row(A.x, (r), A.fx), *gs_ = (const float *)norm_row(A.dy, (r), A.fg);   \
        const float *zs_ = gated ? (const float *)norm_row(A.z, (r), A.fz) : NULL,                                     \
                    *as_ = add ? (const float *)norm_row(A.g, (r), A.fa) : NULL;                                       \
        _Pragma("unroll") for (int m = 0; m < (M); m++) {                                                              \
            int i = lane + 32 * m;                                                                                     \
            if (i < n) {                                                                                               \
                X[m] = xs_[i], G[m] = gs_[i];                                                                          \
                if (gated) Z[m] = zs_[i];                                                                              \
                if (add) A_[m] = as_[i];                                                                               \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)
        if (!have && wp < nr) NORM_DW_LOAD(ra + wp, xr, zr, gr, ar, PM);
        have = false;
        for (int k = wp; k < nr; k += NW) {
            bool next = pf && k + NW < nr;
            if (next) NORM_DW_LOAD(ra + k + NW, xq, zq, gq, aq, NQ);
            norm_w_row<PM, PM>(
                A, ra + k, PM, gated, true, add, tile + (size_t)k * n,
                [&](int m, int) {
                    return xr[m];
                },
                [&](int m, int) {
                    return zr[m];
                },
                [&](int m, int) {
                    return gr[m];
                },
                [&](int, float, float y) {
                    return y;
                },
                [&](int i) {
                    return wsm[i];
                },
                [&](int, float) {
                },
                [&](int m, int) {
                    return ar[m];
                });
            if (next) {
#pragma unroll
                for (int m = 0; m < NQ; m++) xr[m] = xq[m], zr[m] = zq[m], gr[m] = gq[m], ar[m] = aq[m];
            } else if (!pf && k + NW < nr) {
                NORM_DW_LOAD(ra + k + NW, xr, zr, gr, ar, PM);
            } else if (!pf && wp < tr && ra + tr + wp < r1) { /* the next tile's row, in flight over the sums */
                NORM_DW_LOAD(ra + tr + wp, xr, zr, gr, ar, PM);
                have = true;
            }
        }
#undef NORM_DW_LOAD
        __syncthreads();   /* the tile's products are in */
        uint64_t ends = 0; /* the tile's rows that end a chunk (tr <= 64) */
        for (int k = 0; k < nr; k++)
            if (ra + k + 1 == cend) ends |= 1ull << k, cend = cend + per < R ? cend + per : R;
#pragma unroll
        for (int j = 0; j < CPT; j++) {
            int col = (int)threadIdx.x + NORM_DW_THREADS * j;
            if (col >= n) continue;
            for (int k = 0; k < nr; k++) {
                cs[j] += tile[(size_t)k * n + col];
                if (ends >> k & 1) ps[j] += cs[j], cs[j] = 0.0; /* a chunk's last row */
            }
        }
        __syncthreads(); /* the tile is read: the next rows may take it */
    }
#pragma unroll
    for (int j = 0; j < CPT; j++) {
        int col = (int)threadIdx.x + NORM_DW_THREADS * j;
        if (col < n) part[(int64_t)blockIdx.x * n + col] = ps[j];
    }
}

/* GDN_CONV and GDN_CONV_BACK (ops.h): k_conv's float32 sum, the unary SILU, k_rows' warp-a-row
 * L2_NORM and L2_NORM_BACK (the same lanes, the same butterfly), SCALE's formula and silu_back1:
 * the bits of the ops it replaces for heads of up to WARP_ROW_MAX channels. A warp takes a head at
 * a (position, example), summing its squares over the conv's output, then recomputes that output
 * to write (a few loads that hit the cache, where a head in registers would not fit every size);
 * the value channels take a thread each. */
typedef struct {
    kt x, w, pos, dy, t;
    int64_t n, hd; /* channels of q and of k; a head */
    double eps;
    float a; /* q's scale */
    int back;
} gconv_args;

__device__ static float gconv_u(const gconv_args &A, int64_t ch, int64_t tt, int64_t bb, int64_t p) {
    int64_t K = A.w.ne[0];
    float acc = 0.0f;
    for (int64_t j = 0; j < K; j++) {
        int64_t ts = tt - (K - 1) + j;
        if (ts >= 0 && K - 1 - j <= p) acc += __fmul_rn(ldf(kt_at(A.w, j, ch, 0, 0)), ldf(kt_at(A.x, ch, ts, bb, 0)));
    }
    return acc;
}
/* the gradient reaching the norm's output: SCALE's backward (s dy + 0) for q */
__device__ static inline float gconv_g(const gconv_args &A, int64_t ch, int64_t tt, int64_t bb, bool q) {
    float d = ldf(kt_at(A.dy, ch, tt, bb, 0));
    return q ? keel_unary_f32(KEEL_OP_SCALE, d, A.a, 0.0f) : d;
}

__global__ void k_gconv_heads(gconv_args A) {
    int64_t T = A.x.ne[1], H = 2 * A.n / A.hd, tasks = T * A.x.ne[2] * H;
    int lane = threadIdx.x & 31;
    int64_t w0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, ws = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t wi = w0; wi < tasks; wi += ws) {
        int64_t r = wi / H, h0 = (wi % H) * A.hd, tt = r % T, bb = r / T, p = pos_at(A.pos, tt, bb);
        bool q = h0 < A.n;
        double ss = 0, sd = 0;
        for (int64_t i = lane; i < A.hd; i += 32) {
            double x = keel_unary_f32(KEEL_OP_SILU, gconv_u(A, h0 + i, tt, bb, p), 0.0f, 0.0f);
            ss += x * x;
            if (A.back) sd += x * gconv_g(A, h0 + i, tt, bb, q);
        }
        for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
        if (A.back)
            for (int m = 16; m > 0; m >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, m);
        float scf = (float)(1.0 / sqrt(ss + A.eps));
        double sc = 1.0 / sqrt(ss / 1.0 + A.eps), f2 = sc * sc * sc * sd / 1.0; /* L2_NORM_BACK's, dn = 1 */
        for (int64_t i = lane; i < A.hd; i += 32) {
            int64_t ch = h0 + i;
            float u = gconv_u(A, ch, tt, bb, p), sv = keel_unary_f32(KEEL_OP_SILU, u, 0.0f, 0.0f), y;
            if (A.back)
                y = silu_back1(u, (float)(sc * gconv_g(A, ch, tt, bb, q) - f2 * sv));
            else
                y = q ? keel_unary_f32(KEEL_OP_SCALE, sv * scf, A.a, 0.0f) : sv * scf;
            stf(kt_at(A.t, ch, tt, bb, 0), y);
        }
    }
}

__global__ void k_gconv_values(gconv_args A) {
    int64_t T = A.x.ne[1], c0 = 2 * A.n, nv = A.x.ne[0] - c0;
    GRID_STRIDE(e, nv * T * A.x.ne[2]) {
        int64_t ch = c0 + e % nv, r = e / nv, tt = r % T, bb = r / T;
        float u = gconv_u(A, ch, tt, bb, pos_at(A.pos, tt, bb));
        float y = A.back ? silu_back1(u, ldf(kt_at(A.dy, ch, tt, bb, 0))) : keel_unary_f32(KEEL_OP_SILU, u, 0.0f, 0.0f);
        stf(kt_at(A.t, ch, tt, bb, 0), y);
    }
}

/* The same on dense float32 tensors (w as [C][K]) with heads of 32, 64, 96 or 128 channels and
 * channel counts in multiples of 4 (the DeltaNet's): a lane keeps its up to 4 channels of a head
 * in registers, in the generic kernel's order; the value channels go 4 a thread through 16-byte
 * accesses. The index arithmetic of the generic kernels made the op slower than the five it
 * replaces. */
typedef struct {
    const float *x, *w, *dy;
    float *y;
    kt pos;
    int64_t C, T, B, n;
    int K, hd;
    double eps;
    float a;
    int back;
} gconv_dense;

/* The dense conv kernels' 4 channels a thread: a tap's products added to the 4 sums (float32, in
 * the callers' tap order) */
__device__ static inline void tap_add4(float4 &acc, float4 w, float4 x) {
    acc.x += __fmul_rn(w.x, x.x);
    acc.y += __fmul_rn(w.y, x.y);
    acc.z += __fmul_rn(w.z, x.z);
    acc.w += __fmul_rn(w.w, x.w);
}

/* A warp (heads; the value channels: k_conv4_rows, below) takes CONV_TILE_HEADS consecutive rows of
 * its channels and slides a window of the last K rows of x along them in registers, so each x element
 * is read about once (a kernel a row read it K times, 0.50 ms and 0.61 ms for the 0.8B's forward and
 * backward at batch 8; tiled 0.27 and 0.36) and the weights once a tile; the next row's loads are
 * issued before this row's sums. The sums are the row kernels': the same bits. The taps
 * are counted from the end of KM (an array size known at compile time, so the window stays in
 * registers): tap j of K is j + KM - K, the first KM - K unused. The heads kernel of up to 4 taps
 * runs three blocks a multiprocessor (80 registers a thread, the backward spilling 96 bytes, against
 * 106 and two blocks: 203 -> 191 us for the 0.8B's forward at batch 8). With a lane's channel count
 * and the direction known when compiled and 32-bit row offsets (the twentieth session): 191 -> 117
 * us forward, 263 -> 189 backward (ncu, same call), the same bits. */
/* The tiles of rows: at 16, a heads kernel's warp set up its weights and window (28 loads a lane) for
 * 16 rows of 4 loads (8 backward); 32 rows for the heads (64: too few warps for the last wave) and 64 for the
 * 4-channel kernel took the conv ops 33.88 -> 32.35 ms over 3 bf16 steps at batch 8 on an H100, the
 * same bits (docs/h200-log.md, "The DeltaNet conv's backward fused a third time") */
#define CONV_TILE_HEADS 32
#define CONV_TILE_ROWS  64
template <int KM, int PER, bool BACK>
__global__ void __launch_bounds__(256, KM <= 4 ? 3 : 1) k_gconv_heads_tiled(gconv_dense A) {
    /* PER (a lane's channels of a head, hd / 32) and BACK are known when compiled, and a tile's rows
     * are addressed by 32-bit offsets from its first (the launcher checks they fit): the kernel was
     * issue-bound (75% of issue slots), much of it on 64-bit index arithmetic and branches */
    int64_t H = 2 * A.n / A.hd, R = A.T * A.B, nt = (R + CONV_TILE_HEADS - 1) / CONV_TILE_HEADS, tasks = nt * H;
    int lane = threadIdx.x & 31, K = A.K, jlo = KM - K, C = (int)A.C, T = (int)A.T;
    int64_t w0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, ws = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t wi = w0; wi < tasks; wi += ws) {
        int64_t h0 = (wi % H) * A.hd, r0 = (wi / H) * CONV_TILE_HEADS, bb = r0 / A.T;
        int nr = (int)(R - r0 < CONV_TILE_HEADS ? R - r0 : CONV_TILE_HEADS), tt = (int)(r0 % A.T);
        bool q = h0 < A.n;
        const float *xr = A.x + r0 * A.C + h0 + lane, *dr = BACK ? A.dy + r0 * A.C + h0 + lane : NULL;
        float *yr = A.y + r0 * A.C + h0 + lane;
        float wv[PER][KM], win[PER][KM], nx[PER], nd[PER];
#pragma unroll
        for (int m = 0; m < PER; m++) {
            int64_t ch = h0 + lane + 32 * m;
#pragma unroll
            for (int j = 0; j < KM; j++) { /* the window as the row before r0 left it (see below) */
                int d = KM - j;
                wv[m][j] = j >= jlo ? A.w[ch * K + j - jlo] : 0.0f;
                win[m][j] = j > jlo && r0 - d >= 0 ? xr[32 * m - d * C] : 0.0f;
            }
            nx[m] = xr[32 * m];
            nd[m] = BACK ? dr[32 * m] : 0.0f;
        }
        for (int i = 0; i < nr; i++) {
            int64_t p = pos_at(A.pos, tt, bb);
            float u[PER], sv[PER], g[PER];
            double ss = 0, sd = 0;
#pragma unroll
            for (int m = 0; m < PER; m++) {
                float xn = nx[m], dn = nd[m];
                if (i + 1 < nr) {
                    nx[m] = xr[(i + 1) * C + 32 * m];
                    if (BACK) nd[m] = dr[(i + 1) * C + 32 * m];
                }
#pragma unroll
                for (int j = 0; j < KM - 1; j++) win[m][j] = win[m][j + 1];
                win[m][KM - 1] = xn;
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < KM; j++) {
                    int d = KM - 1 - j;
                    if (j >= jlo && tt - d >= 0 && d <= p) acc += __fmul_rn(wv[m][j], win[m][j]);
                }
                u[m] = acc;
                sv[m] = keel_unary_f32(KEEL_OP_SILU, u[m], 0.0f, 0.0f);
                double x = sv[m];
                ss += x * x;
                if (BACK) {
                    g[m] = q ? keel_unary_f32(KEEL_OP_SCALE, dn, A.a, 0.0f) : dn;
                    sd += x * g[m];
                }
            }
            for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
            if (BACK)
                for (int m = 16; m > 0; m >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, m);
            float scf = (float)(1.0 / sqrt(ss + A.eps));
            double sc = 1.0 / sqrt(ss / 1.0 + A.eps), f2 = sc * sc * sc * sd / 1.0;
#pragma unroll
            for (int m = 0; m < PER; m++) {
                float v = BACK ? silu_back1(u[m], (float)(sc * g[m] - f2 * sv[m]))
                               : (q ? keel_unary_f32(KEEL_OP_SCALE, sv[m] * scf, A.a, 0.0f) : sv[m] * scf);
                yr[i * C + 32 * m] = v;
            }
            if (++tt == T) tt = 0, bb++;
        }
    }
}
/* the heads kernel for a's lane count and direction */
template <int KM> static void gconv_heads_launch(keel_backend *be, const gconv_dense &D, unsigned blocks) {
#define GCONV_HEADS(PER)                                                                                               \
    (D.back ? k_gconv_heads_tiled<KM, PER, true> : k_gconv_heads_tiled<KM, PER, false>)<<<blocks, 256, 0, st(be)>>>(D)
    switch (D.hd / 32) {
    case 1:
        GCONV_HEADS(1);
        break;
    case 2:
        GCONV_HEADS(2);
        break;
    case 3:
        GCONV_HEADS(3);
        break;
    default:
        GCONV_HEADS(4);
        break;
    }
#undef GCONV_HEADS
}

/* SWIGLU and SWIGLU_BACK: the unary SILU's formula, MUL's product and silu_back1, so the bits of
 * the SILU, MUL and SILU_BACK they replace; 4 elements a thread on dense aligned tensors. bf: SWIGLU's
 * bf16 result, each float32 value rounded by CAST's function (the bits of the CAST it replaces). */
__device__ static inline float swiglu1(float g, float u) {
    return __fmul_rn(keel_unary_f32(KEEL_OP_SILU, g, 0.0f, 0.0f), u);
}
__device__ static inline void swiglu_back1(float g, float u, float d, float *dg, float *du) {
    *dg = silu_back1(g, __fmul_rn(d, u));
    *du = __fmul_rn(d, keel_unary_f32(KEEL_OP_SILU, g, 0.0f, 0.0f));
}
__global__ void k_swiglu(kt t, kt g, kt u, kt dy, int back, int vec, int bf) {
    int64_t n = g.ne[0] * g.ne[1] * g.ne[2] * g.ne[3];
    const float *gp = (const float *)g.p, *up = (const float *)u.p, *dp = (const float *)dy.p;
    /* SWIGLU_BACK: [d gate | d up], the second half n elements on */
    char *y2 = t.p + n * (bf ? 2 : 4);
    if (vec) {
        VEC_LOOP(q, n) {
            float4 a = ((const float4 *)gp)[q], b = ((const float4 *)up)[q], r, r2;
            if (!back) {
                r = make_float4(swiglu1(a.x, b.x), swiglu1(a.y, b.y), swiglu1(a.z, b.z), swiglu1(a.w, b.w));
            } else {
                float4 d = ((const float4 *)dp)[q];
                swiglu_back1(a.x, b.x, d.x, &r.x, &r2.x);
                swiglu_back1(a.y, b.y, d.y, &r.y, &r2.y);
                swiglu_back1(a.z, b.z, d.z, &r.z, &r2.z);
                swiglu_back1(a.w, b.w, d.w, &r.w, &r2.w);
                store4(y2, q, r2, bf);
            }
            store4(t.p, q, r, bf);
        }
        VEC_TAIL(e, n) {
            if (!back) {
                store1(t.p, e, swiglu1(gp[e], up[e]), bf);
            } else {
                float r, r2;
                swiglu_back1(gp[e], up[e], dp[e], &r, &r2);
                store1(t.p, e, r, bf), store1(y2, e, r2, bf);
            }
        }
        return;
    }
    GRID_STRIDE(e, n) {
        int64_t i[4];
        kt_unflat(g, e, i);
        float a = ldf(kt_at(g, i[0], i[1], i[2], i[3])), b = ldf(kt_at(u, i[0], i[1], i[2], i[3]));
        if (!back && bf) {
            *(uint16_t *)kt_at(t, i[0], i[1], i[2], i[3]) = keel_cvt_f32_to_bf16(swiglu1(a, b));
        } else if (!back) {
            stf(kt_at(t, i[0], i[1], i[2], i[3]), swiglu1(a, b));
        } else { /* the packed result is dense: element e of each half */
            float r, r2;
            swiglu_back1(a, b, ldf(kt_at(dy, i[0], i[1], i[2], i[3])), &r, &r2);
            store1(t.p, e, r, bf), store1(y2, e, r2, bf);
        }
    }
}

/* ROPE / ROPE_BACK: a [D,H,T,B], positions [T]; freq: the n_rot/2 float32 frequencies (host-made,
 * keel_rope_freq); angles in float64 as on the cpu. One thread per element of the first half of
 * the rotated part (it writes the pair) or of the unrotated tail. */
__global__ void k_rope(kt t, kt a, kt pos, const double *freq, int64_t nr, double dir) {
    int64_t h = nr / 2, w = h + (t.ne[0] - nr), rows = t.ne[1] * t.ne[2] * t.ne[3];
    GRID_STRIDE(e, w * rows) {
        int64_t c = e % w, r = e / w;
        int64_t i1 = r % t.ne[1], i2 = (r / t.ne[1]) % t.ne[2], i3 = r / (t.ne[1] * t.ne[2]);
        const char *s = kt_at(a, 0, i1, i2, i3);
        char *d = kt_at(t, 0, i1, i2, i3);
        if (c < h) {
            float2 r = rope_cos_sin(pos_at(pos, i2, i3), freq, c, dir);
            float cs = r.x, sn = r.y;
            float x1 = ldf(s + c * a.nb[0]), x2 = ldf(s + (c + h) * a.nb[0]);
            stf(d + c * t.nb[0], __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn)));
            stf(d + (c + h) * t.nb[0], __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn)));
        } else {
            int64_t i = nr + (c - h);
            stf(d + i * t.nb[0], ldf(s + i * a.nb[0]));
        }
    }
}

/* Causal depthwise conv over time: x [C,T,B], w [K,C]. CONV1D reads x[t-(K-1)+j], the input
 * gradient reads dy[t+(K-1)-j], a tap reaching K-1-j steps back from the output position only
 * within its example (<= its position); a float32 sum in j order, as on the cpu. */
__global__ void k_conv(kt t, kt x, kt w, kt pos, int fwd) {
    int64_t K = w.ne[0], T = x.ne[1];
    GRID_STRIDE(e, t.ne[0] * t.ne[1] * t.ne[2]) {
        int64_t i[4];
        kt_unflat(t, e, i); /* 32-bit index arithmetic where it fits */
        int64_t ch = i[0], tt = i[1], bb = i[2];
        float acc = 0;
        for (int64_t j = 0; j < K; j++) {
            int64_t ts = fwd ? tt - (K - 1) + j : tt + (K - 1) - j;
            if (ts >= 0 && ts < T && K - 1 - j <= pos_at(pos, fwd ? tt : ts, bb))
                acc += __fmul_rn(ldf(kt_at(w, j, ch, 0, 0)), ldf(kt_at(x, ch, ts, bb, 0)));
        }
        if (t.type == KEEL_BF16) /* CONV1D_BACK_INPUT's bf16 result: the float32 sum rounded as CAST rounds it */
            *(uint16_t *)kt_at(t, ch, tt, bb, 0) = keel_cvt_f32_to_bf16(acc);
        else
            stf(kt_at(t, ch, tt, bb, 0), acc);
    }
}

/* The same on dense float32 x, result and w with C % 4 == 0 (the DeltaNet's [6144, T, B]), and the
 * DeltaNet conv's value channels (GDN_CONV's SiLU, its backward's silu_back1 with dy): 4 channels a
 * thread through 16-byte loads and stores, each channel's sum the same float32 sum in j order (the
 * generic kernel's index arithmetic and 4-byte accesses ran at a fifth of the memory bandwidth). A
 * block takes CONV_TILE_ROWS consecutive rows of 4 x 256 channels (upward, or downward for the input
 * gradient, whose taps reach forward) and slides a window of the rows the taps read in registers:
 * each element read about once, the weights once (a thread a row: 0.46 ms for the 0.8B's input
 * gradient at batch 8; tiled 0.17). The rows' times and positions are the block's, in shared memory,
 * and a thread's rows come CONV_GROUP at a time, the next group's loads issued before this group's
 * sums: with one row in flight a thread (83 registers, three blocks a multiprocessor) the kernels
 * waited on memory at about half its bandwidth. The taps counted from the end of KM, as in
 * k_gconv_heads_tiled. MODE: CONV1D, CONV1D_BACK_INPUT, GDN_CONV's value channels, its backward. */
enum { CV_FWD, CV_BACK_INPUT, CV_SILU, CV_SILU_BACK };
#define CONV_GROUP 4 /* loads in flight a thread */
template <int KM, int MODE>
__global__ void __launch_bounds__(256) k_conv4_rows(void *y, const float *x, const float *dy, const float *w, kt pos,
                                                    int64_t C, int64_t c0, int64_t T, int64_t B, int K, int bf) {
    constexpr bool fwd = MODE != CV_BACK_INPUT, dyr = MODE == CV_SILU_BACK;
    /* rows a group: two loads a row with dy */
    constexpr int G = dyr ? CONV_GROUP / 2 : CONV_GROUP;
    __shared__ int st[CONV_TILE_ROWS + KM], sp[CONV_TILE_ROWS + KM]; /* the tile's rows' times and positions */
    int64_t C4 = C / 4, c4 = c0 / 4 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x, R = T * B,
            nt = (R + CONV_TILE_ROWS - 1) / CONV_TILE_ROWS, s = fwd ? -1 : 1; /* a tap d steps away reads row r + s d */
    int jlo = KM - K;
    bool act = c4 < C4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 wv[KM];
#pragma unroll
    for (int j = 0; j < KM; j++) {
        int64_t i = j - jlo, ch = 4 * c4; /* w(j, ch) at ch * K + j */
        wv[j] = act && j >= jlo
                    ? make_float4(w[ch * K + i], w[(ch + 1) * K + i], w[(ch + 2) * K + i], w[(ch + 3) * K + i])
                    : zero;
    }
    for (int64_t tile = blockIdx.y; tile < nt; tile += gridDim.y) {
        int64_t r0 = tile * CONV_TILE_ROWS, r1 = r0 + CONV_TILE_ROWS < R ? r0 + CONV_TILE_ROWS : R,
                rs = fwd ? r0 : r1 - 1;
        int n = (int)(r1 - r0), np = fwd ? n : n + KM - 1; /* the input gradient's taps read rows past the tile */
        const float4 *xs = (const float4 *)x + rs * C4 + c4, *ds = dyr ? (const float4 *)dy + rs * C4 + c4 : NULL;
        int step = fwd ? (int)C4 : -(int)C4; /* from a row to the next one the thread takes (the launcher: 32 bits) */
        /* the taps' window, and the next group of rows in flight */
        float4 win[KM], nx[G], nd[G];
        if (act) { /* the window as the row before rs left it, and the first group in flight */
#pragma unroll
            for (int j = 0; j < KM; j++) {
                int64_t rr = rs + s * (KM - j);
                win[j] = j > jlo && rr >= 0 && rr < R ? xs[-(KM - j) * step] : zero;
            }
#pragma unroll
            for (int u = 0; u < G; u++) {
                nx[u] = u < n ? xs[u * step] : zero;
                if (dyr) nd[u] = u < n ? ds[u * step] : zero;
            }
        }
        __syncthreads(); /* the tile before has read st and sp */
        for (int i = threadIdx.x; i < np; i += blockDim.x) {
            int64_t rr = r0 + i;
            int tt = rr < R ? (int)(rr % T) : 0;
            st[i] = tt, sp[i] = rr < R ? (int)pos_at(pos, tt, rr / T) : 0;
        }
        __syncthreads();
        if (!act) continue;
        for (int k0 = 0; k0 < n; k0 += G) {
            float4 cx[G], cd[G]; /* this group, while the next one's loads are in flight */
#pragma unroll
            for (int u = 0; u < G; u++) {
                cx[u] = nx[u], cd[u] = dyr ? nd[u] : zero;
                if (k0 + G + u < n) {
                    nx[u] = xs[(k0 + G + u) * step];
                    if (dyr) nd[u] = ds[(k0 + G + u) * step];
                }
            }
#pragma unroll
            for (int u = 0; u < G; u++) {
                int k = k0 + u, i = fwd ? k : n - 1 - k; /* the row's place in the tile */
                if (k >= n) break;
#pragma unroll
                for (int j = 0; j < KM - 1; j++) win[j] = win[j + 1];
                win[KM - 1] = cx[u];
                int tt = st[i];
                float4 acc = zero;
#pragma unroll
                for (int j = 0; j < KM; j++) {
                    /* CONV1D: x[t - d] within t's example; the input gradient: dy[t + d] within its own */
                    int d = KM - 1 - j;
                    bool in = fwd ? tt - d >= 0 && d <= sp[i] : tt + d < T && d <= sp[i + d];
                    if (j >= jlo && in) tap_add4(acc, wv[j], win[j]);
                }
                int64_t q = (r0 + i) * C4 + c4;
                if (MODE == CV_SILU)
                    ((float4 *)y)[q] = make_float4(keel_unary_f32(KEEL_OP_SILU, acc.x, 0.0f, 0.0f),
                                                   keel_unary_f32(KEEL_OP_SILU, acc.y, 0.0f, 0.0f),
                                                   keel_unary_f32(KEEL_OP_SILU, acc.z, 0.0f, 0.0f),
                                                   keel_unary_f32(KEEL_OP_SILU, acc.w, 0.0f, 0.0f));
                else if (MODE == CV_SILU_BACK)
                    ((float4 *)y)[q] = make_float4(silu_back1(acc.x, cd[u].x), silu_back1(acc.y, cd[u].y),
                                                   silu_back1(acc.z, cd[u].z), silu_back1(acc.w, cd[u].w));
                else
                    store4(y, q, acc, bf); /* bf: CONV1D_BACK_INPUT's bf16 result */
            }
        }
    }
}
/* k_conv4_rows over channels [c0, C) of dense x (and dy) and y: a block 256 groups of 4 channels and
 * CONV_TILE_ROWS rows, tiles looped past 65535 */
template <int MODE>
static void conv4_rows_launch(keel_backend *be, void *y, const float *x, const float *dy, const float *w, kt pos,
                              int64_t C, int64_t c0, int64_t T, int64_t B, int K, int bf) {
    int64_t nt = (T * B + CONV_TILE_ROWS - 1) / CONV_TILE_ROWS, g4 = (C - c0) / 4;
    if (nt == 0 || g4 <= 0) return;
    /* (the caller: C / 4 (CONV_TILE_ROWS + CONV_TAPS_MAX) and T within 32 bits, the rows' offsets in a tile) */
    dim3 grid((unsigned)((g4 + 255) / 256), (unsigned)(nt < 65535 ? nt : 65535));
    if (K <= 4)
        k_conv4_rows<4, MODE><<<grid, 256, 0, st(be)>>>(y, x, dy, w, pos, C, c0, T, B, K, bf);
    else
        k_conv4_rows<CONV_TAPS_MAX, MODE><<<grid, 256, 0, st(be)>>>(y, x, dy, w, pos, C, c0, T, B, K, bf);
}

/* GET_ROWS_BACK: result row r sums the dy rows whose id is r, in ascending item order, in float32
 * as on the cpu. The result is zeroed by a memset first; then block i looks at item i: when no
 * earlier item has its id, the block owns that row and sums its items, which it finds in order by
 * scanning the later ids (RT a pass; each warp's matches by ballot, the block's in order through
 * shared memory). A thread keeps GRB_COLS of the row's elements in registers (a scan for each
 * GRB_COLS x RT of them). All on the device: the host used to read the ids and group them, a wait
 * for the stream every step; the scans read about n^2 / 2 ids from cache (34 M at 8,192 ids). An id
 * outside [0, rows) marks the node and is skipped. */
#define GRB_COLS 4
/* GET_ROWS_BACK_ADD: the same sums, stored as c + the sum (ADD's formula); the rows no id names are
 * c + 0 from the pass before (SCALE by 1 plus 0: ADD's bits with a zero). */
__global__ void k_get_rows_back(kt t, kt dy, kt ids, int64_t n, kt cc, int add, unsigned *bad, unsigned node) {
    __shared__ int list[RT];
    __shared__ int wcount[RT / 32];
    int tid = (int)threadIdx.x, lane = tid & 31, w = tid >> 5;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        int32_t id = kt_i32(ids, i);
        if (id < 0 || id >= t.ne[1]) {
            if (tid == 0) atomicMin(bad, node);
            continue;
        }
        int seen = 0;
        for (int64_t j = tid; j < i && !seen; j += RT) seen = kt_i32(ids, j) == id;
        if (__syncthreads_or(seen)) continue; /* an earlier item's block owns the row */
        char *row = kt_at(t, 0, id, 0, 0);
        for (int64_t c0 = 0; c0 < t.ne[0]; c0 += GRB_COLS * RT) {
            float acc[GRB_COLS];
#pragma unroll
            for (int q = 0; q < GRB_COLS; q++) acc[q] = 0.0f;
            for (int64_t j0 = i; j0 < n; j0 += RT) {
                int64_t j = j0 + tid;
                bool m = j < n && kt_i32(ids, j) == id;
                unsigned bal = __ballot_sync(0xffffffffu, m);
                if (lane == 0) wcount[w] = __popc(bal);
                __syncthreads();
                int at = __popc(bal & ((1u << lane) - 1u)), total = 0;
                for (int k = 0; k < RT / 32; k++) at += k < w ? wcount[k] : 0, total += wcount[k];
                if (m) list[at] = (int)(j - i);
                __syncthreads();
                for (int k = 0; k < total; k++) {
                    int64_t jj = i + list[k];
                    const char *src = dy.p + jj % dy.ne[1] * dy.nb[1] + jj / dy.ne[1] * dy.nb[2];
#pragma unroll
                    for (int q = 0; q < GRB_COLS; q++) {
                        int64_t c = c0 + q * RT + tid;
                        if (c < t.ne[0]) acc[q] += ldf(src + c * dy.nb[0]);
                    }
                }
                __syncthreads(); /* the list is rewritten next pass */
            }
#pragma unroll
            for (int q = 0; q < GRB_COLS; q++) {
                int64_t c = c0 + q * RT + tid;
                if (c < t.ne[0])
                    stf(row + c * t.nb[0],
                        add ? keel_binary_f32(KEEL_OP_ADD, ldf(kt_at(cc, c, id, 0, 0)), acc[q]) : acc[q]);
            }
        }
    }
}

/* ADAMW's scalars, as the op table gives them (fp0 lr, fp1 b1, fp2 b2, fp3 eps, fp4 weight decay,
 * ip0 step), the bias corrections and the decay worked out in float64 on the host; the gradients'
 * factor comes from the SUM_SQ on the device (keel_adamw_factor). The kernel reads them from the
 * node's slot of device memory (cuda_impl's hp_dev), uploaded when a run starts: the learning rate
 * and the step change every step, the launch does not, so a captured step replays as it is. */
typedef struct {
    float lr, b1, b2, eps, decay, bc1, bc2;
} adamw_hp;
static_assert(sizeof(adamw_hp) <= KEEL_CUDA_HP_BYTES, "a slot holds adamw_hp");

static adamw_hp adamw_hp_of(const keel_tensor *t) {
    adamw_hp h;
    h.lr = (float)t->fp[0], h.b1 = (float)t->fp[1], h.b2 = (float)t->fp[2], h.eps = (float)t->fp[3];
    h.decay = (float)(1.0 - t->fp[0] * t->fp[4]);
    h.bc1 = (float)(1.0 - pow(t->fp[1], (double)t->ip[0])), h.bc2 = (float)(1.0 - pow(t->fp[2], (double)t->ip[0]));
    return h;
}

int cuda_adamw_slot(const cuda_impl *im, const keel_tensor *t) {
    for (int k = 0; k < KEEL_CUDA_HP_SLOTS; k++)
        if (im->hp_node[k] == t) return k;
    return -1;
}

int cuda_adamw_upload(keel_backend *be, const keel_graph *g, int64_t from, int64_t to) {
    cuda_impl *im = cuda_im(be);
    im->run++;
    for (int64_t i = from; i < to; i++) {
        const keel_tensor *t = g->nodes[i];
        if (t->op != KEEL_OP_ADAMW && t->op != KEEL_OP_ADAMW_SHADOW) continue;
        int s = cuda_adamw_slot(im, t);
        for (int k = 0; s < 0 && k < KEEL_CUDA_HP_SLOTS; k++) /* a new node: a free slot */
            if (!im->hp_node[k]) s = k;
        if (s < 0) { /* else the one uploaded longest ago, not in this run (a node in a captured run that
                      * loses its slot gets another, and its key, which holds the slot, changes) */
            for (int k = 0; k < KEEL_CUDA_HP_SLOTS; k++)
                if (im->hp_used[k] != im->run && (s < 0 || im->hp_used[k] < im->hp_used[s])) s = k;
            if (s < 0) return keel_fail("cuda: more than %d ADAMW nodes in one run", KEEL_CUDA_HP_SLOTS);
        }
        im->hp_node[s] = t, im->hp_used[s] = im->run;
        adamw_hp h = adamw_hp_of(t);
        if (cuda_upload(be, (char *)im->hp_dev + (size_t)s * KEEL_CUDA_HP_BYTES, &h, sizeof h, t)) return -1;
    }
    return 0;
}

/* AdamW on one element, each rounding pinned by the _rn intrinsics (no FMA contraction), so the
 * 16-byte and the scalar path give the same bits as the cpu's formula. */
__device__ __forceinline__ void adamw_one(float &p, float g, float &m, float &v, const adamw_hp &h, float gs,
                                          float decay) {
    float gi = g * gs;
    float mi = __fadd_rn(h.b1 * m, (1.0f - h.b1) * gi);
    float vi = __fadd_rn(h.b2 * v, __fmul_rn((1.0f - h.b2) * gi, gi));
    m = mi;
    v = vi;
    p = __fsub_rn(p * decay, __fmul_rn(h.lr, mi / h.bc1) / (sqrtf(vi / h.bc2) + h.eps));
}

/* The optimizer step in one launch: in training p, g, m, v are the groups' flat tensors, every
 * trained parameter at once; elements [0, decay_end) take the weight decay. Every thread works out
 * the factor from the sum of squares s and leaves everything as it was when the norm is not
 * finite, so a bad step changes nothing without the host looking first. */
__global__ void k_adamw(float *p, const float *g, float *m, float *v, const float *s, uint16_t *c, int64_t c0,
                        int64_t n, int64_t decay_end, const adamw_hp *hp, double clip, int64_t div, int vec) {
    double f;
    if (!keel_adamw_factor((double)*s, clip, div, &f)) return;
    const adamw_hp h = *hp;
    const float gs = (float)f;
    /* c: the decayed weights' bf16 copies (SHADOW's) of elements [c0, decay_end), each rounded as CAST
     * rounds it, or NULL */
#define ADAMW_AT(i, P, G, M, V) adamw_one(P, G, M, V, h, gs, (i) < decay_end ? h.decay : 1.0f)
#define COPY_AT(i, P)                                                                                                  \
    if (c && (i) >= c0 && (i) < decay_end) c[(i)-c0] = keel_cvt_f32_to_bf16(P)
    if (vec) {
        VEC_LOOP(q, n) {
            float4 p4 = ((float4 *)p)[q], m4 = ((float4 *)m)[q], v4 = ((float4 *)v)[q];
            const float4 g4 = ((const float4 *)g)[q];
            ADAMW_AT(4 * q, p4.x, g4.x, m4.x, v4.x);
            ADAMW_AT(4 * q + 1, p4.y, g4.y, m4.y, v4.y);
            ADAMW_AT(4 * q + 2, p4.z, g4.z, m4.z, v4.z);
            ADAMW_AT(4 * q + 3, p4.w, g4.w, m4.w, v4.w);
            ((float4 *)p)[q] = p4, ((float4 *)m)[q] = m4, ((float4 *)v)[q] = v4;
            if (c && 4 * q >= c0 && 4 * q + 4 <= decay_end) { /* 8 bytes at once (vec: c0 % 4 == 0) */
                store4(c + (4 * q - c0), 0, p4, 1);
            } else {
                COPY_AT(4 * q, p4.x);
                COPY_AT(4 * q + 1, p4.y);
                COPY_AT(4 * q + 2, p4.z);
                COPY_AT(4 * q + 3, p4.w);
            }
        }
        VEC_TAIL(e, n) {
            ADAMW_AT(e, p[e], g[e], m[e], v[e]);
            COPY_AT(e, p[e]);
        }
        return;
    }
    GRID_STRIDE(e, n) {
        ADAMW_AT(e, p[e], g[e], m[e], v[e]);
        COPY_AT(e, p[e]);
    }
#undef ADAMW_AT
#undef COPY_AT
}

/* SUM_SQ's first level: a block per KEEL_SUM_SQ_BLOCK elements; thread i takes the runs of four
 * elements at 4i, 4i + 4 RT, ... (one 16-byte load each where x allows: the same order either way),
 * float64 sums, then the block's fixed tree (block_sum). */
__global__ void k_sum_sq_blocks(const float *x, int64_t n, double *partial, int vec) {
    __shared__ double sh[RT];
    int64_t lo = (int64_t)blockIdx.x * KEEL_SUM_SQ_BLOCK, hi = min(lo + (int64_t)KEEL_SUM_SQ_BLOCK, n);
    double acc = 0;
    for (int64_t i = lo + 4 * (int64_t)threadIdx.x; i < hi; i += 4 * RT) {
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (vec && i + 4 <= hi) {
            float4 q = *(const float4 *)(x + i);
            a[0] = q.x, a[1] = q.y, a[2] = q.z, a[3] = q.w;
        } else {
            for (int k = 0; k < 4 && i + k < hi; k++) a[k] = x[i + k];
        }
        for (int k = 0; k < 4; k++) acc += (double)a[k] * a[k];
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* ---------------------------------------------------------------- rows */

/* One block, or with `warp` one warp, per row of a (rows flat over dims 1..3). partial: float64
 * per row (SUM, CE). */
__global__ void k_rows(int op, kt t, kt a, kt y, kt tg, const float *dloss, double *partial, float p0, double eps,
                       const double *ce_div, int warp) {
    __shared__ double sh[RT];
    int64_t n = a.ne[0], R = a.ne[1] * a.ne[2] * a.ne[3];
    int tid = warp ? (int)(threadIdx.x & 31) : (int)threadIdx.x, TS = warp ? 32 : RT;
    int64_t r0 = warp ? (int64_t)blockIdx.x * (RT / 32) + threadIdx.x / 32 : (int64_t)blockIdx.x;
    int64_t rstep = warp ? (int64_t)gridDim.x * (RT / 32) : (int64_t)gridDim.x;
    for (int64_t r = r0; r < R; r += rstep) {
        int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
        const char *s = kt_at(a, 0, i1, i2, i3);
        char *d = t.p ? kt_at(t, 0, i1, i2, i3) : NULL;
        int64_t an = a.nb[0];
        switch (op) {
        case KEEL_OP_SUM:
        case KEEL_OP_SUM_ROWS:
        case KEEL_OP_MEAN: {
            double acc = 0;
            for (int64_t i = tid; i < n; i += TS) acc += ldf(s + i * an);
            acc = team_sum(acc, sh, warp);
            if (tid == 0) {
                if (op == KEEL_OP_SUM)
                    partial[r] = acc;
                else
                    stf(d, (float)(op == KEEL_OP_MEAN ? acc / (double)n : acc));
            }
            break;
        }
        case KEEL_OP_RMS_NORM:
        case KEEL_OP_L2_NORM: {
            double acc = 0;
            for (int64_t i = tid; i < n; i += TS) {
                double x = ldf(s + i * an);
                acc += x * x;
            }
            acc = team_sum(acc, sh, warp);
            if (op == KEEL_OP_RMS_NORM) acc /= (double)n;
            float sc = (float)(1.0 / sqrt(acc + eps));
            for (int64_t i = tid; i < n; i += TS) stf(d + i * t.nb[0], ldf(s + i * an) * sc);
            break;
        }
        case KEEL_OP_RMS_NORM_BACK:
        case KEEL_OP_L2_NORM_BACK: {
            const char *dy = kt_at(y, 0, i1, i2, i3);
            double ss = 0, sd = 0;
            for (int64_t i = tid; i < n; i += TS) {
                double x = ldf(s + i * an);
                ss += x * x;
                sd += x * ldf(dy + i * y.nb[0]);
            }
            ss = team_sum(ss, sh, warp);
            sd = team_sum(sd, sh, warp);
            double dn = op == KEEL_OP_RMS_NORM_BACK ? (double)n : 1.0;
            double sc = 1.0 / sqrt(ss / dn + eps), f2 = sc * sc * sc * sd / dn;
            for (int64_t i = tid; i < n; i += TS)
                stf(d + i * t.nb[0], (float)(sc * ldf(dy + i * y.nb[0]) - f2 * ldf(s + i * an)));
            break;
        }
        case KEEL_OP_SOFT_MAX:
        case KEEL_OP_SOFT_MAX_CAUSAL: { /* over keys lo .. hi; the others 0 */
            int64_t lo = 0, hi = n - 1;
            if (op == KEEL_OP_SOFT_MAX_CAUSAL) {
                hi = i1 + (n - a.ne[1]);
                lo = hi - pos_at(y, i1, i3);
                if (lo < 0) lo = 0;
            }
            float mx = -INFINITY;
            for (int64_t i = lo + tid; i <= hi; i += TS) mx = fmaxf(mx, __fmul_rn(p0, ldf(s + i * an)));
            mx = team_max(mx, sh, warp);
            double z = 0;
            for (int64_t i = lo + tid; i <= hi; i += TS) z += expf(__fsub_rn(__fmul_rn(p0, ldf(s + i * an)), mx));
            z = team_sum(z, sh, warp);
            float iz = (float)(1.0 / z);
            for (int64_t i = tid; i < n; i += TS)
                stf(d + i * t.nb[0],
                    i >= lo && i <= hi ? expf(__fsub_rn(__fmul_rn(p0, ldf(s + i * an)), mx)) * iz : 0.0f);
            break;
        }
        case KEEL_OP_SOFT_MAX_BACK: {
            const char *dy = kt_at(y, 0, i1, i2, i3);
            double sd = 0;
            for (int64_t i = tid; i < n; i += TS) sd += (double)ldf(s + i * an) * ldf(dy + i * y.nb[0]);
            float fs = (float)team_sum(sd, sh, warp);
            for (int64_t i = tid; i < n; i += TS)
                stf(d + i * t.nb[0], __fmul_rn(p0 * ldf(s + i * an), ldf(dy + i * y.nb[0]) - fs));
            break;
        }
        case KEEL_OP_CROSS_ENTROPY_LOSS:
        case KEEL_OP_CROSS_ENTROPY_LOSS_BACK: {
            /* targets are read in flat order over the logits' rows */
            int64_t ti0 = r % tg.ne[0], ti1 = (r / tg.ne[0]) % tg.ne[1], ti2 = (r / (tg.ne[0] * tg.ne[1])) % tg.ne[2],
                    ti3 = r / (tg.ne[0] * tg.ne[1] * tg.ne[2]);
            int32_t yv = *(const int32_t *)kt_at(tg, ti0, ti1, ti2, ti3);
            if (yv >= n) yv = -1; /* out of range: k_ce_divisor has marked the node, the run fails */
            float mx = -INFINITY;
            for (int64_t i = tid; i < n; i += TS) mx = fmaxf(mx, ldf(s + i * an));
            mx = team_max(mx, sh, warp);
            double z = 0;
            for (int64_t i = tid; i < n; i += TS) z += expf(ldf(s + i * an) - mx);
            z = team_sum(z, sh, warp);
            if (yv < 0) { /* no loss at this position (the row was still reduced above: every thread of
                           * the team takes part in team_max and team_sum) */
                if (op == KEEL_OP_CROSS_ENTROPY_LOSS) {
                    if (tid == 0) partial[r] = 0.0;
                } else {
                    for (int64_t i = tid; i < n; i += TS) stf(d + i * t.nb[0], 0.0f);
                }
            } else if (op == KEEL_OP_CROSS_ENTROPY_LOSS) {
                if (tid == 0) partial[r] = log(z) + mx - ldf(s + (int64_t)yv * an);
            } else {
                float sc = (float)(1.0 / z), k = (float)(*dloss / *ce_div);
                for (int64_t i = tid; i < n; i += TS)
                    stf(d + i * t.nb[0],
                        __fmul_rn(__fsub_rn(__fmul_rn(expf(ldf(s + i * an) - mx), sc), (float)(i == yv)), k));
            }
            break;
        }
        default:
            break;
        }
    }
}

/* SUM and CROSS_ENTROPY_LOSS: the per-row float64 partials summed by one block (fixed layout). */
__global__ void k_finish_sum(float *out, const double *partial, int64_t R, double div, const double *divp) {
    __shared__ double sh[RT];
    double acc = 0;
    for (int64_t r = threadIdx.x; r < R; r += RT) acc += partial[r];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) *out = (float)(acc / (divp ? *divp : div));
}

/* One block: the targets below `limit` (negative: no loss) counted, the divisor *div = fp0 or that
 * count (1 when 0), as keel_backend_ce_divisor gives it on the host; a target at or above limit marks
 * the node. */
__global__ void k_ce_divisor(kt tg, int64_t limit, double fp0, double *div, unsigned *bad, unsigned node) {
    __shared__ double sh[RT];
    int64_t n = tg.ne[0] * tg.ne[1] * tg.ne[2] * tg.ne[3];
    double valid = 0;
    bool out = false;
    for (int64_t e = threadIdx.x; e < n; e += RT) {
        int32_t y = kt_i32(tg, e);
        valid += y >= 0 && y < limit;
        out |= y >= limit;
    }
    if (out) atomicMin(bad, node);
    valid = block_sum(valid, sh);
    if (threadIdx.x == 0) *div = fp0 > 0 ? fp0 : valid > 0 ? valid : 1.0;
}

/* ---------------------------------------------------------------- dispatch */

/* A dense float32 t of a's shape, a's rows dense, a multiple of 4 wide and on 16-byte boundaries but
 * strided apart (a view: attention's gate, every other half row of its q projection), fewer than
 * 2^31 elements: k_unary's rows_vec path (the generic path's three 64-bit divisions an element ran
 * SIGMOID of the 0.8B's gate at 139 us, a third of the bandwidth). rows_vec_to: t float32 or bf16
 * (store4's groups, for a kernel that rounds its result). */
static bool rows_vec_to(const keel_tensor *t, const keel_tensor *a) {
    return (t->type == KEEL_F32 || t->type == KEEL_BF16) && a->type == KEEL_F32 && keel_is_contiguous(t) &&
           vec_ok(t->data) && vec_ok(a->data) && a->nb[0] == 4 && t->ne[0] % 4 == 0 && a->ne[0] % 4 == 0 &&
           a->nb[1] % 16 == 0 && a->nb[2] % 16 == 0 && a->nb[3] % 16 == 0 && keel_nelements(t) < INT32_MAX;
}
static bool rows_vec(const keel_tensor *t, const keel_tensor *a) { return t->type == KEEL_F32 && rows_vec_to(t, a); }

/* GDN_GATE_BACK's chunks of a's rows: those of REPEAT_BACK of [H] from a's [H, rows] */
static void gate_chunks(const keel_tensor *t, int64_t *per, int64_t *n_chunks) {
    const keel_tensor *a = t->src[0];
    int64_t rows = keel_nrows(a);
    *per = chunk_terms(a->ne[0], rows), *n_chunks = (rows + *per - 1) / *per;
}

/* REPEAT_BACK and CONV1D_BACK_WEIGHT: the terms summed into each result element */
static int64_t terms_of(const keel_tensor *t) {
    const keel_tensor *a = t->src[0];
    int64_t n = keel_nelements(t);
    return t->op == KEEL_OP_REPEAT_BACK ? keel_nelements(a) / (n ? n : 1) : a->ne[1] * a->ne[2];
}

/* dw of RMS_NORM_W_BACK(_ADD) and GATED_RMS_NORM_BACK: REPEAT_BACK's chunks for [n] from the [n, rows]
 * products (per rows a chunk, n_chunks chunks, grp of them a partial, n_parts partials an element) */
static void norm_dw_chunks(const keel_tensor *t, int64_t *per, int64_t *n_chunks, int *grp, int64_t *n_parts) {
    const keel_tensor *a = t->src[0];
    int64_t n = a->ne[0], R = keel_nrows(a);
    *per = chunk_terms(n, R > 0 ? R : 1), *n_chunks = (R + *per - 1) / *per, *grp = chunk_group(n, true);
    *n_parts = (*n_chunks + *grp - 1) / *grp;
}
static bool norm_dw_op(const keel_tensor *t) {
    return t->op == KEEL_OP_RMS_NORM_W_BACK || t->op == KEEL_OP_RMS_NORM_W_BACK_ADD ||
           t->op == KEEL_OP_GATED_RMS_NORM_BACK;
}
/* The rows of k_norm_w_back_dw's tile of products: NORM_DW_TILE_BYTES of them, 1 to 64 rows */
static int norm_dw_tile_rows(int64_t n) {
    int64_t tr = NORM_DW_TILE_BYTES / (n * (int64_t)sizeof(float));
    return (int)(tr < 1 ? 1 : tr > 64 ? 64 : tr);
}
/* k_norm_w_back_dw's PM for node t (a lane's elements of a row), or 0 where it does not take the node:
 * float32 rows of at most WARP_ROW_MAX elements, unit stride along them (x, z, dy, the addend), a
 * contiguous result */
static int norm_dw_pm(const keel_tensor *t) {
    const keel_tensor *a = t->src[0];
    int64_t n = a->ne[0];
    if (!norm_dw_op(t) || a->type != KEEL_F32 || n < 1 || n > WARP_ROW_MAX || !keel_is_contiguous(t)) return 0;
    for (int i = 0; i < KEEL_MAX_SRC && t->src[i]; i++) /* x, z or dy, dy or the addend (w: any stride) */
        if (i != 1 && t->src[i]->nb[0] != (int64_t)sizeof(float)) return 0;
    return n <= 128 ? 4 : n <= 256 ? 8 : n <= 512 ? 16 : 32;
}

/* The scratch each node's kernel asks cuda_scratch for (keel_cuda_scratch_bytes): one formula per
 * kind of node, which its kernel uses too. */
static size_t node_scratch(const keel_tensor *t) {
    const keel_tensor *a = t->src[0];
    switch (t->op) {
    case KEEL_OP_SUM: /* a float64 partial a row */
    case KEEL_OP_CROSS_ENTROPY_LOSS:
        return (size_t)(keel_nrows(a) ? keel_nrows(a) : 1) * sizeof(double);
    case KEEL_OP_SUM_SQ: { /* a float64 partial a block */
        int64_t R = (keel_nelements(a) + KEEL_SUM_SQ_BLOCK - 1) / KEEL_SUM_SQ_BLOCK;
        return (size_t)(R ? R : 1) * sizeof(double);
    }
    case KEEL_OP_GDN_GATE_BACK: { /* two float64 partials a head and chunk of rows */
        int64_t per, n_chunks;
        gate_chunks(t, &per, &n_chunks);
        return (size_t)(2 * a->ne[0] * n_chunks) * sizeof(double);
    }
    case KEEL_OP_RMS_NORM_W_BACK: /* dw's float64 partials; without k_norm_w_back_dw, the products first */
    case KEEL_OP_RMS_NORM_W_BACK_ADD:
    case KEEL_OP_GATED_RMS_NORM_BACK: {
        int64_t per, n_chunks, n_parts;
        int grp;
        norm_dw_chunks(t, &per, &n_chunks, &grp, &n_parts);
        return (size_t)(a->ne[0] * n_parts) * sizeof(double) +
               (norm_dw_pm(t) ? 0 : (size_t)keel_nelements(a) * sizeof(float));
    }
    case KEEL_OP_REPEAT_BACK: /* a float64 partial per result element and chunk of terms */
    case KEEL_OP_CONV1D_BACK_WEIGHT: {
        int64_t n_out = keel_nelements(t), n_terms = terms_of(t);
        if (n_out == 0 || n_terms == 0) return 0;
        int64_t per = chunk_terms(n_out, n_terms);
        return (size_t)(n_out * ((n_terms + per - 1) / per)) * sizeof(double);
    }
    case KEEL_OP_MUL_MAT:
    case KEEL_OP_MUL_MAT_ADD:
    case KEEL_OP_OUT_PROD:
        return cuda_matmul_scratch(t);
    case KEEL_OP_GATED_DELTA_NET:
    case KEEL_OP_GATED_DELTA_NET_BACK:
    case KEEL_OP_GATED_DELTA_NET_STATE:
        return cuda_gdn_scratch(t);
    case KEEL_OP_LINEAR_CROSS_ENTROPY:
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK:
        return cuda_linear_ce_scratch(t);
    case KEEL_OP_FLASH_ATTN:
    case KEEL_OP_FLASH_ATTN_BACK:
        return cuda_flash_attn_scratch(t);
    default:
        return 0;
    }
}

extern "C" size_t keel_cuda_scratch_bytes(const keel_tensor *t) {
    return keel_op_get(t->op)->flags & OPF_VIEW ? 0 : node_scratch(t);
}

extern "C" size_t keel_cuda_carry_bytes(const keel_graph *g, int64_t reader, int64_t *writer) {
    return cuda_gdn_carry(g, reader, writer);
}

/* The cross-entropy ops take their divisor from im->ce_div (cuda_ce_divisor runs first) */
static int rows(keel_backend *be, const keel_tensor *t, double *partial) {
    kt none;
    memset(&none, 0, sizeof none);
    const keel_tensor *a = t->src[0];
    bool ce = t->op == KEEL_OP_CROSS_ENTROPY_LOSS || t->op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK;
    /* y: dy of the backward ops, the positions of SOFT_MAX_CAUSAL */
    bool has_y = t->op == KEEL_OP_RMS_NORM_BACK || t->op == KEEL_OP_L2_NORM_BACK || t->op == KEEL_OP_SOFT_MAX_BACK ||
                 t->op == KEEL_OP_SOFT_MAX_CAUSAL;
    int64_t R = keel_nrows(a);
    if (R == 0) return 0;
    bool warp = a->ne[0] <= WARP_ROW_MAX;
    int64_t want = warp ? (R + RT / 32 - 1) / (RT / 32) : R;
    unsigned blocks = (unsigned)(want < 65535LL * 8 ? want : 65535LL * 8);
    k_rows<<<blocks, RT, 0, st(be)>>>(t->op, partial ? none : kt_of(t), kt_of(a), has_y ? kt_of(t->src[1]) : none,
                                      ce ? kt_of(t->src[1]) : none,
                                      t->op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK ? (const float *)t->src[2]->data : NULL,
                                      partial, (float)t->fp[0], t->fp[0], cuda_im(be)->ce_div, warp ? 1 : 0);
    return 0;
}

static int reduce_all(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0];
    int64_t R = keel_nrows(a);
    bool ce = t->op == KEEL_OP_CROSS_ENTROPY_LOSS;
    if (ce && cuda_ce_divisor(be, t)) return -1;
    double *partial = (double *)cuda_scratch(be, node_scratch(t), t);
    if (!partial || rows(be, t, partial)) return -1;
    k_finish_sum<<<1, RT, 0, st(be)>>>((float *)t->data, partial, R, 1.0, ce ? cuda_im(be)->ce_div : NULL);
    return 0;
}

int cuda_ce_divisor(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *tg;
    int64_t limit;
    bool neg;
    const char *what;
    if (!keel_backend_id_rule(t, &tg, &limit, &neg, &what))
        return keel_fail("'%s' is not a cross-entropy node", t->name);
    cuda_impl *im = cuda_im(be);
    k_ce_divisor<<<1, RT, 0, im->stream>>>(kt_of(tg), limit, t->fp[0], im->ce_div, im->bad_node, im->node);
    return cuda_check(cudaGetLastError(), "cross-entropy divisor launch", t);
}

/* The n_rot/2 rotation frequencies in float64 (keel_rope_freq) on the device: made and uploaded the
 * first time a (n_rot, theta) is seen (a small allocation and a wait, once), then the same table;
 * NULL with an error */
/* room for one more table in the backend's list (the caller fills im->rope[im->n_rope] and counts it) */
static int rope_room(cuda_impl *im, const keel_tensor *t) {
    if (im->n_rope < im->cap_rope) return 0;
    int cap = im->cap_rope ? 2 * im->cap_rope : 8;
    cuda_rope_table *r = (cuda_rope_table *)realloc(im->rope, (size_t)cap * sizeof *r);
    if (!r) return keel_fail("out of memory in '%s'", t->name);
    im->rope = r, im->cap_rope = cap;
    return 0;
}

static const double *rope_freqs(keel_backend *be, const keel_tensor *t, int64_t nr, double theta) {
    cuda_impl *im = cuda_im(be);
    for (int i = 0; i < im->n_rope; i++)
        if (im->rope[i].n_rot == nr && im->rope[i].theta == theta && !im->rope[i].n_pos) return im->rope[i].dev;
    if (rope_room(im, t)) return NULL;
    int64_t h = nr / 2;
    double *freq = (double *)malloc((size_t)(h ? h : 1) * sizeof(double)), *dev = NULL;
    if (!freq) {
        keel_fail("out of memory in '%s'", t->name);
        return NULL;
    }
    for (int64_t f = 0; f < h; f++) freq[f] = keel_rope_freq(theta, nr, f);
    int rc = cuda_check(cudaMalloc(&dev, (size_t)(h ? h : 1) * sizeof(double)), "RoPE frequency table", t) ||
             cuda_upload(be, dev, freq, (size_t)h * sizeof(double), t);
    free(freq);
    if (rc) {
        cudaFree(dev);
        return NULL;
    }
    im->rope[im->n_rope].n_rot = nr, im->rope[im->n_rope].theta = theta, im->rope[im->n_rope].dev = dev;
    im->rope[im->n_rope].n_pos = 0, im->rope[im->n_rope].cs = NULL;
    im->n_rope++;
    return dev;
}

/* The float cos and sin of every angle p freq_f for positions p in [0, n_pos): k_rope_cs evaluates
 * rope_cos_sin on the device, as k_rope and rope_elem do, so a table entry holds the bits they make.
 * Made once a (n_rot, theta, n_pos) in the first (uncaptured) run that needs it and kept until the
 * backend goes: a captured graph keeps the address it saw. */
__global__ void k_rope_cs(float2 *cs, const double *freq, int64_t h, int64_t n_pos) {
    GRID_STRIDE(e, h * n_pos) {
        int64_t p = e / h, f = e % h;
        cs[e] = rope_cos_sin(p, freq, f, 1.0);
    }
}
static const float2 *rope_cs(keel_backend *be, const keel_tensor *t, int64_t nr, double theta, int64_t n_pos) {
    cuda_impl *im = cuda_im(be);
    for (int i = 0; i < im->n_rope; i++)
        if (im->rope[i].n_rot == nr && im->rope[i].theta == theta && im->rope[i].n_pos == n_pos) return im->rope[i].cs;
    const double *freq = rope_freqs(be, t, nr, theta); /* first: it may grow the list */
    if (!freq || rope_room(im, t)) return NULL;
    int64_t h = nr / 2;
    float2 *cs = NULL;
    if (cuda_check(cudaMalloc(&cs, (size_t)(h * n_pos > 0 ? h * n_pos : 1) * sizeof(float2)), "RoPE cos/sin table", t))
        return NULL;
    if (h * n_pos > 0) k_rope_cs<<<cuda_blocks(h * n_pos, 256), 256, 0, st(be)>>>(cs, freq, h, n_pos);
    if (cuda_check(cudaGetLastError(), "RoPE cos/sin table launch", t)) {
        cudaFree(cs);
        return NULL;
    }
    cuda_rope_table *r = &im->rope[im->n_rope++];
    r->n_rot = nr, r->theta = theta, r->dev = NULL, r->n_pos = n_pos, r->cs = cs;
    return cs;
}

static int rope(keel_backend *be, const keel_tensor *t) {
    int64_t nr = t->ip[0], h = nr / 2, w = h + (t->ne[0] - nr);
    const double *dev = rope_freqs(be, t, nr, t->fp[0]);
    if (!dev) return -1;
    int64_t n = w * keel_nrows(t);
    if (n)
        k_rope<<<cuda_blocks(n, 256), 256, 0, st(be)>>>(kt_of(t), kt_of(t->src[0]), kt_of(t->src[1]), dev, nr,
                                                        t->op == KEEL_OP_ROPE ? 1.0 : -1.0);
    return 0;
}

/* Whether the 16-byte (4 elements a thread) path can take these tensors: each contiguous and on a
 * 16-byte boundary (NULL ones left out). */
static bool vec_tensors(const keel_tensor *x, const keel_tensor *y, const keel_tensor *z) {
    const keel_tensor *ts[3] = {x, y, z};
    for (int i = 0; i < 3; i++)
        if (ts[i] && !(keel_is_contiguous(ts[i]) && vec_ok(ts[i]->data))) return false;
    return true;
}

/* Whether each row of t (dim 0) has unit stride and starts on a 16-byte boundary: the 16-byte copies
 * of k_norm_w_pipe. */
static bool rows16(const keel_tensor *t) {
    if (t->nb[0] != (int64_t)sizeof(float) || !vec_ok(t->data)) return false;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] > 1 && t->nb[d] % 16) return false;
    return true;
}

/* The byte stride between t's consecutive rows (dim 0) where there is one, row r at r times it;
 * 0 where there is none (or a single row) */
static int64_t flat_rows(const keel_tensor *t) {
    int64_t stride = 0, next = 0;
    for (int d = 1; d < 4; d++) {
        if (t->ne[d] == 1) continue;
        if (stride && t->nb[d] != next) return 0;
        if (!stride) stride = t->nb[d];
        next = t->nb[d] * t->ne[d];
    }
    return stride;
}

/* Whether t is a's leading dimensions (both contiguous; t.ne[d] is a.ne[d] up to some d and 1 after). */
static bool leading_dims(const keel_tensor *t, const keel_tensor *a) {
    if (!keel_is_contiguous(t) || !keel_is_contiguous(a)) return false;
    int d = 0;
    while (d < 4 && t->ne[d] == a->ne[d]) d++;
    for (; d < 4; d++)
        if (t->ne[d] != 1) return false;
    return true;
}

/* GDN_GATE_BACK: da and the chunk partials, then the two sums a head (the chunks REPEAT_BACK of [H]
 * from a's [H, rows] would take, so its bits). */
static int gdn_gate_back(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0];
    int64_t H = a->ne[0], per, n_chunks;
    gate_chunks(t, &per, &n_chunks);
    double *part = (double *)cuda_scratch(be, node_scratch(t), t);
    if (!part) return -1;
    k_gdn_gate_back_part<<<cuda_blocks(H * n_chunks, 256), 256, 0, st(be)>>>(
        kt_of(t), kt_of(a), kt_of(t->src[1]), kt_of(t->src[2]), kt_of(t->src[3]), per, n_chunks, part);
    int grp = chunk_group(H, true); /* REPEAT_BACK's of [H] from a's contiguous [H, rows] (the unfused ops) */
    bool blocks = (n_chunks + grp - 1) / grp >= 64;
    unsigned grid = blocks ? (unsigned)(2 * H < 65535 ? 2 * H : 65535) : (unsigned)cuda_blocks(2 * H, RT);
    k_gdn_gate_back_sum<<<grid, RT, 0, st(be)>>>(kt_of(t), kt_of(t->src[1]), H, part, n_chunks, grp, blocks ? 1 : 0);
    return 0;
}

/* REPEAT_BACK's pass 1 where the result is x's leading dimensions (x the n_out x n_terms float32 terms,
 * contiguous): float64 partials of n_out elements into part, by chunks of per terms (n_chunks of them),
 * RB_CHUNKS of them a partial where n_out is a multiple of 4 (chunk_group). Returns the partials a
 * result element, pass 2's count. */
static int64_t lead_parts(keel_backend *be, const float *x, int64_t n_out, int64_t n_terms, int64_t per,
                          int64_t n_chunks, double *part) {
    if (chunk_group(n_out, true) > 1) {
        int64_t nb = (n_out / 4 + 31) / 32 * ((n_chunks + RB_CHUNKS - 1) / RB_CHUNKS);
        unsigned blocks = (unsigned)(nb < 65535LL * 8 ? nb : 65535LL * 8);
        (vec_ok(x) ? k_repeat_back_part_lead4<true> : k_repeat_back_part_lead4<false>)<<<blocks, 256, 0, st(be)>>>(
            x, n_out, n_terms, per, n_chunks, part);
        return (n_chunks + RB_CHUNKS - 1) / RB_CHUNKS; /* pass 2 sums the blocks' partials */
    }
    k_repeat_back_part_lead<<<cuda_blocks(n_out * n_chunks, 256), 256, 0, st(be)>>>(x, n_out, n_terms, per, n_chunks,
                                                                                    part);
    return n_chunks;
}

/* Pass 2 of REPEAT_BACK and CONV1D_BACK_WEIGHT (conv): element o of out the sum of its n_chunks partials */
static void finish_parts(keel_backend *be, const kt &out, const double *part, int64_t n_out, int64_t n_chunks,
                         int conv) {
    if (n_chunks >= 64 && n_out >= 512) /* a few hundred result elements: a block per FO of them */
        k_finish_parts_blocks4<<<(unsigned)((n_out + FO - 1) / FO < 65535 ? (n_out + FO - 1) / FO : 65535), RT, 0,
                                 st(be)>>>(out, part, n_out, n_chunks, conv);
    else if (n_chunks >= 64) /* few result elements: a block each */
        k_finish_parts_blocks<<<(unsigned)(n_out < 65535 ? n_out : 65535), RT, 0, st(be)>>>(out, part, n_out, n_chunks,
                                                                                            conv);
    else
        k_finish_parts<<<cuda_blocks(n_out, 256), 256, 0, st(be)>>>(out, part, n_out, n_chunks, conv);
}

/* REPEAT_BACK and CONV1D_BACK_WEIGHT: n_terms summed into each result element, in two passes. */
static int reduce_terms(keel_backend *be, const keel_tensor *t, int64_t n_terms) {
    int64_t n_out = keel_nelements(t);
    if (n_out == 0) return 0;
    if (n_terms == 0) return cuda_check(cudaMemsetAsync(t->data, 0, keel_nbytes(t), st(be)), "memset", t);
    int64_t per = chunk_terms(n_out, n_terms), n_chunks = (n_terms + per - 1) / per;
    double *part = (double *)cuda_scratch(be, node_scratch(t), t);
    if (!part) return -1;
    bool conv = t->op == KEEL_OP_CONV1D_BACK_WEIGHT;
    const keel_tensor *x = t->src[0], *dy = t->src[1];
    bool dense4 = conv && t->ne[0] <= CONV_TAPS_MAX && x->ne[0] % 4 == 0 && vec_tensors(x, dy, NULL);
    if (dense4 && t->ne[0] <= 4)
        k_conv_back_w_part_dense4<4><<<cuda_blocks(x->ne[0] / 4 * n_chunks, 256), 256, 0, st(be)>>>(
            (const float *)x->data, (const float *)dy->data, kt_of(t->src[2]), x->ne[0], x->ne[1], x->ne[2],
            (int)t->ne[0], per, n_chunks, part);
    else if (dense4)
        k_conv_back_w_part_dense4<CONV_TAPS_MAX><<<cuda_blocks(x->ne[0] / 4 * n_chunks, 256), 256, 0, st(be)>>>(
            (const float *)x->data, (const float *)dy->data, kt_of(t->src[2]), x->ne[0], x->ne[1], x->ne[2],
            (int)t->ne[0], per, n_chunks, part);
    else if (conv)
        k_conv_back_w_part<<<cuda_blocks(n_out * n_chunks, 256), 256, 0, st(be)>>>(
            kt_of(t), kt_of(t->src[0]), kt_of(t->src[1]), kt_of(t->src[2]), per, n_chunks, part);
    else if (leading_dims(t, x))
        n_chunks = lead_parts(be, (const float *)x->data, n_out, n_terms, per, n_chunks, part);
    else
        k_repeat_back_part<<<cuda_blocks(n_out * n_chunks, 256), 256, 0, st(be)>>>(kt_of(t), kt_of(t->src[0]), per,
                                                                                   n_chunks, part);
    finish_parts(be, kt_of(t), part, n_out, n_chunks, conv ? 1 : 0);
    return 0;
}

/* RMS_NORM_W, GATED_RMS_NORM, QK_NORM_ROPE and their backward over rows (A made by the op's case; a
 * backward's products for dw to A.terms, or QK_NORM_ROPE_BACK's to its result) */
static int norm_w_rows(keel_backend *be, const keel_tensor *t, norm_w_args &A) {
    /* the register variants of long rows take ~170 registers a thread: blocks of 128 threads,
     * so that a multiprocessor holds three of them rather than one of 256 */
    const keel_tensor *a = t->src[0], *b = t->src[1], *dyt = A.back ? t->src[A.gated || A.rope ? 3 : 2] : NULL;
    int64_t R = keel_nrows(a), w = a->ne[0];
    unsigned blocks = cuda_blocks(R * 32, 256), half = cuda_blocks(R * 32, 128);
    if (R == 0) return 0;
    bool unit = a->nb[0] == 4 && (!A.gated || t->src[2]->nb[0] == 4) && (!A.back || A.dy.nb[0] == 4);
    if (w % 4 == 0 && w <= WARP_ROW_MAX && rows16(a) && (!A.gated || rows16(t->src[2])) && (!A.back || rows16(dyt)) &&
        (!A.add || rows16(t->src[3])) && b->nb[0] == (int64_t)sizeof(float) && keel_is_contiguous(t)) {
        A.fx = flat_rows(a), A.fz = A.gated ? flat_rows(t->src[2]) : 0, A.fg = A.back ? flat_rows(dyt) : 0;
        A.fa = A.add ? flat_rows(t->src[3]) : 0;
        int rc = w <= 32 * 4    ? launch_norm_pipe_w<4>(be, t, A, R)
                 : w <= 32 * 8  ? launch_norm_pipe_w<8>(be, t, A, R)
                 : w <= 32 * 16 ? launch_norm_pipe_w<16>(be, t, A, R)
                                : launch_norm_pipe_w<32>(be, t, A, R);
        if (rc <= 0) return rc; /* else the register kernels below */
    }
    if (A.rope || w > 32 * 32 || !unit)
        k_norm_w<0, -1><<<blocks, 256, 0, st(be)>>>(A);
    else if (w <= 32 * 4)
        launch_norm_w<4>(A, blocks, 256, st(be));
    else if (w <= 32 * 8)
        launch_norm_w<8>(A, blocks, 256, st(be));
    else if (w <= 32 * 16)
        launch_norm_w<16>(A, half, 128, st(be));
    else
        launch_norm_w<32>(A, half, 128, st(be));
    return 0;
}

/* dw of RMS_NORM_W_BACK(_ADD) and GATED_RMS_NORM_BACK (the last n values of the packed result): the
 * sums REPEAT_BACK makes of [n] from the [n, rows] products, in the same chunks (norm_dw_chunks), made
 * by k_norm_w_back_dw where it takes the rows (norm_dw_pm), else from the products written to the
 * scratch by the norm kernels and summed by REPEAT_BACK's pass 1; then its pass 2. */
static int norm_dw(keel_backend *be, const keel_tensor *t, norm_w_args &A) {
    const keel_tensor *a = t->src[0];
    int64_t n = a->ne[0], R = keel_nrows(a), per, n_chunks, n_parts;
    int grp, pm = norm_dw_pm(t);
    kt dw = kt_of(t); /* the result's last n values, as a [n] tensor */
    dw.p += (keel_nelements(t) - n) * (int64_t)sizeof(float);
    dw.ne[0] = n, dw.ne[1] = dw.ne[2] = dw.ne[3] = 1, dw.nb[1] = dw.nb[2] = dw.nb[3] = n * (int64_t)sizeof(float);
    if (n == 0) return 0;
    if (R == 0) return cuda_check(cudaMemsetAsync(dw.p, 0, (size_t)n * sizeof(float), st(be)), "memset", t);
    norm_dw_chunks(t, &per, &n_chunks, &grp, &n_parts);
    double *part = (double *)cuda_scratch(be, node_scratch(t), t);
    if (!part) return -1;
    if (pm) {
        const keel_tensor *dyt = t->src[A.gated ? 3 : 2];
        A.fx = flat_rows(a), A.fz = A.gated ? flat_rows(t->src[2]) : 0, A.fg = flat_rows(dyt);
        A.fa = A.add ? flat_rows(t->src[3]) : 0;
        int tr = norm_dw_tile_rows(n);
        size_t shm = (size_t)(tr + 1) * (size_t)n * sizeof(float);
        void (*k)(norm_w_args, int64_t, int64_t, int, int, double *) = pm == 4    ? (A.gated ? k_norm_w_back_dw<4, 1>
                                                                                     : A.add ? k_norm_w_back_dw<4, 16>
                                                                                             : k_norm_w_back_dw<4, 0>)
                                                                       : pm == 8  ? (A.gated ? k_norm_w_back_dw<8, 1>
                                                                                     : A.add ? k_norm_w_back_dw<8, 16>
                                                                                             : k_norm_w_back_dw<8, 0>)
                                                                       : pm == 16 ? (A.gated ? k_norm_w_back_dw<16, 1>
                                                                                     : A.add ? k_norm_w_back_dw<16, 16>
                                                                                             : k_norm_w_back_dw<16, 0>)
                                                                                  : (A.gated ? k_norm_w_back_dw<32, 1>
                                                                                     : A.add ? k_norm_w_back_dw<32, 16>
                                                                                             : k_norm_w_back_dw<32, 0>);
        k<<<(unsigned)n_parts, NORM_DW_THREADS, shm, st(be)>>>(A, per, n_chunks, grp, tr, part);
    } else {
        A.terms = (float *)(part + n * n_parts);
        if (norm_w_rows(be, t, A)) return -1;
        if (lead_parts(be, A.terms, n, R, per, n_chunks, part) != n_parts)
            return keel_fail("cuda: '%s': dw's partials do not match the plan's", t->name);
    }
    finish_parts(be, dw, part, n, n_parts, 0);
    return cuda_check(cudaGetLastError(), "norm launch", t);
}

#define EW(kernel, n, ...)                                                                                             \
    do {                                                                                                               \
        if ((n) > 0) kernel<<<cuda_blocks((n), 256), 256, 0, st(be)>>>(__VA_ARGS__);                                   \
    } while (0)

/* t = op(a) elementwise (FAM_UNARY's formula, SCALE's s and b): 16-byte groups where both are dense,
 * rows_vec groups where a's rows are, else an element a thread */
static void unary(keel_backend *be, const keel_tensor *t, const keel_tensor *a, int op, float s, float b) {
    int64_t n = keel_nelements(t);
    int vec = vec_tensors(t, a, NULL) ? 1 : rows_vec(t, a) ? 2 : 0;
    if (vec && n > 0)
        k_unary<<<vec_blocks(n), 256, 0, st(be)>>>(kt_of(t), kt_of(a), op, s, b, vec);
    else
        EW(k_unary, n, kt_of(t), kt_of(a), op, s, b, 0);
}

static int get_rows_back(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *dy = t->src[0], *ids = t->src[1];
    bool add = t->op == KEEL_OP_GET_ROWS_BACK_ADD;
    if (!keel_is_contiguous(t)) return keel_fail("cuda: '%s': GET_ROWS_BACK writes a contiguous result", t->name);
    kt kc = kt_of(add ? t->src[2] : t);
    if (!add) {
        if (cuda_check(cudaMemsetAsync(t->data, 0, keel_nbytes(t), st(be)), "memset", t)) return -1;
    } else { /* every row c + 0: SCALE by 1 plus 0, ADD's bits with a zero */
        unary(be, t, t->src[2], KEEL_OP_SCALE, 1.0f, 0.0f);
    }
    int64_t n = keel_nelements(ids);
    if (n > INT32_MAX) return keel_fail("cuda: '%s': %lld ids, more than 2^31 - 1", t->name, (long long)n);
    cuda_impl *im = cuda_im(be);
    if (n > 0 && t->ne[0] > 0)
        k_get_rows_back<<<(unsigned)(n < (1 << 20) ? n : (1 << 20)), RT, 0, st(be)>>>(
            kt_of(t), kt_of(dy), kt_of(ids), n, kc, add ? 1 : 0, im->bad_node, im->node);
    return 0;
}

int cuda_node(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    int64_t n = keel_nelements(t);
    switch (keel_op_get(t->op)->family) { /* families first */
    case FAM_UNARY:
        unary(be, t, a, t->op, (float)t->fp[0], (float)t->fp[1]);
        return 0;
    case FAM_BINARY: {
        kt kx = kt_of(t), ka = kt_of(a), kb = kt_of(b);
        int ymode = 0;
        if (kx.contig && ka.contig && kb.contig && keel_same_shape(t, b))
            ymode = 1;
        else if (kx.contig && ka.contig && kb.contig && b->ne[0] == t->ne[0] && keel_nrows(b) == 1)
            ymode = 2;
        int vec = ymode && vec_ok(t->data) && vec_ok(a->data) && vec_ok(b->data) && (ymode == 1 || t->ne[0] % 4 == 0);
        if (vec && n > 0)
            k_binary<<<vec_blocks(n), 256, 0, st(be)>>>(kx, ka, kb, t->op, ymode, 1);
        else
            EW(k_binary, n, kx, ka, kb, t->op, ymode, 0);
        return 0;
    }
    case FAM_COPY:
        return keel_backend_run_copy_family(be, t);
    default:
        break;
    }
    switch (t->op) {
    case KEEL_OP_GET_ROWS:
        return cuda_copy_rows(be, t, a, b); /* ids checked by the copy kernel */
    case KEEL_OP_GET_ROWS_BACK:
    case KEEL_OP_GET_ROWS_BACK_ADD:
        return get_rows_back(be, t);
    case KEEL_OP_FILL: { /* zeros (a gradient's start) by the driver's memset: k_fill's 4-byte stores
                          * took 0.18 ms for the DeltaNet's 201 MB conv gradient, a quarter of the bandwidth */
        float v = (float)t->fp[0];
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        if (bits == 0 && keel_is_contiguous(t))
            return cuda_check(cudaMemsetAsync(t->data, 0, keel_nbytes(t), st(be)), "memset", t);
        EW(k_fill, n, kt_of(t), v);
        return 0;
    }
    case KEEL_OP_REPEAT:
        EW(k_repeat, n, kt_of(t), kt_of(a));
        return 0;
    case KEEL_OP_REPEAT_BACK:
        return reduce_terms(be, t, terms_of(t));
    case KEEL_OP_DROPOUT:
        EW(k_dropout, n, kt_of(t), kt_of(a),
           keel_dropout_key((uint64_t)t->ip[0], (uint64_t)t->ip[1], (uint64_t)t->ip[2]), (uint64_t)t->ip[3],
           (float)(1.0 / (1.0 - t->fp[0])));
        return 0;
    case KEEL_OP_SILU_BACK:
    case KEEL_OP_SIGMOID_BACK: {
        kt kx = kt_of(t), ka = kt_of(a), kb = kt_of(b);
        bool vec = vec_tensors(t, a, b);
        int sg = t->op == KEEL_OP_SIGMOID_BACK ? 1 : 0;
        if (vec && n > 0)
            k_unary_back<<<vec_blocks(n), 256, 0, st(be)>>>(kx, ka, kb, 1, sg);
        else
            EW(k_unary_back, n, kx, ka, kb, 0, sg);
        return 0;
    }
    case KEEL_OP_GDN_GATE:
        EW(k_gdn_gate, n, kt_of(t), kt_of(a), kt_of(b), kt_of(t->src[2]));
        return 0;
    case KEEL_OP_SIGMOID_MUL:
    case KEEL_OP_SIGMOID_MUL_BACK: {
        bool back = t->op == KEEL_OP_SIGMOID_MUL_BACK;
        const keel_tensor *dy = back ? t->src[2] : a;
        int64_t m = keel_nelements(a);
        bool r4 = rows_vec_to(t, a) && rows_vec_to(t, b) && rows_vec_to(t, dy) && m % 4 == 0;
        kt none;
        memset(&none, 0, sizeof none);
        if (m > 0)
            k_sigmoid_mul<<<r4 ? vec_blocks(m) : cuda_blocks(m, 256), 256, 0, st(be)>>>(
                kt_of(t), kt_of(a), kt_of(b), back ? kt_of(dy) : none, back ? 1 : 0, r4 ? 1 : 0,
                t->type == KEEL_BF16 ? 1 : 0);
        return 0;
    }
    case KEEL_OP_GDN_GATE_BACK:
        return gdn_gate_back(be, t);
    case KEEL_OP_SWIGLU:
    case KEEL_OP_SWIGLU_BACK: {
        bool back = t->op == KEEL_OP_SWIGLU_BACK;
        kt none;
        memset(&none, 0, sizeof none);
        kt kd = back ? kt_of(t->src[2]) : none;
        int64_t ng = keel_nelements(a);
        bool vec = vec_tensors(t, a, b) && (!back || (vec_tensors(t->src[2], NULL, NULL) && ng % 4 == 0));
        if (ng > 0)
            k_swiglu<<<vec ? vec_blocks(ng) : cuda_blocks(ng, 256), 256, 0, st(be)>>>(
                kt_of(t), kt_of(a), kt_of(b), kd, back ? 1 : 0, vec ? 1 : 0, t->type == KEEL_BF16 ? 1 : 0);
        return 0;
    }
    case KEEL_OP_SUM:
    case KEEL_OP_CROSS_ENTROPY_LOSS:
        return reduce_all(be, t);
    case KEEL_OP_CROSS_ENTROPY_LOSS_BACK:
        return cuda_ce_divisor(be, t) || rows(be, t, NULL) ? -1 : 0;
    case KEEL_OP_SUM_ROWS:
    case KEEL_OP_MEAN:
    case KEEL_OP_RMS_NORM:
    case KEEL_OP_L2_NORM:
    case KEEL_OP_RMS_NORM_BACK:
    case KEEL_OP_L2_NORM_BACK:
    case KEEL_OP_SOFT_MAX:
    case KEEL_OP_SOFT_MAX_CAUSAL:
    case KEEL_OP_SOFT_MAX_BACK:
        return rows(be, t, NULL);
    case KEEL_OP_ROPE:
    case KEEL_OP_ROPE_BACK:
        return rope(be, t);
    case KEEL_OP_MUL_MAT:
    case KEEL_OP_MUL_MAT_ADD:
        return cuda_matmul(be, t);
    case KEEL_OP_OUT_PROD:
        return cuda_out_prod(be, t);
    case KEEL_OP_CONV1D:
    case KEEL_OP_CONV1D_BACK_INPUT:
        if (a->ne[0] % 4 == 0 && b->ne[0] <= CONV_TAPS_MAX && vec_tensors(t, a, NULL) && keel_is_contiguous(b) &&
            a->ne[0] <= INT32_MAX / (CONV_TILE_ROWS + CONV_TAPS_MAX) && a->ne[1] <= INT32_MAX) {
            int K = (int)b->ne[0], bf = t->type == KEEL_BF16 ? 1 : 0;
            const float *x = (const float *)a->data, *w = (const float *)b->data;
            if (n > 0 && t->op == KEEL_OP_CONV1D)
                conv4_rows_launch<CV_FWD>(be, t->data, x, NULL, w, kt_of(t->src[2]), a->ne[0], 0, a->ne[1], a->ne[2], K,
                                          bf);
            else if (n > 0)
                conv4_rows_launch<CV_BACK_INPUT>(be, t->data, x, NULL, w, kt_of(t->src[2]), a->ne[0], 0, a->ne[1],
                                                 a->ne[2], K, bf);
        } else {
            EW(k_conv, n, kt_of(t), kt_of(a), kt_of(b), kt_of(t->src[2]), t->op == KEEL_OP_CONV1D ? 1 : 0);
        }
        return 0;
    case KEEL_OP_CONV1D_BACK_WEIGHT:
        return reduce_terms(be, t, terms_of(t));
    case KEEL_OP_RMS_NORM_W:
    case KEEL_OP_RMS_NORM_W_BACK:
    case KEEL_OP_RMS_NORM_W_BACK_ADD:
    case KEEL_OP_GATED_RMS_NORM:
    case KEEL_OP_GATED_RMS_NORM_BACK:
    case KEEL_OP_QK_NORM_ROPE:
    case KEEL_OP_QK_NORM_ROPE_BACK: {
        norm_w_args A;
        memset(&A, 0, sizeof A);
        A.gated = t->op == KEEL_OP_GATED_RMS_NORM || t->op == KEEL_OP_GATED_RMS_NORM_BACK;
        A.rope = t->op == KEEL_OP_QK_NORM_ROPE || t->op == KEEL_OP_QK_NORM_ROPE_BACK;
        A.add = t->op == KEEL_OP_RMS_NORM_W_BACK_ADD;
        A.back = t->op == KEEL_OP_RMS_NORM_W_BACK || t->op == KEEL_OP_GATED_RMS_NORM_BACK ||
                 t->op == KEEL_OP_QK_NORM_ROPE_BACK || A.add;
        if (A.add) A.g = kt_of(t->src[3]);
        A.t = kt_of(t), A.x = kt_of(a), A.w = kt_of(b), A.eps = t->fp[0], A.one = t->ip[0] != 0;
        if (A.gated) A.z = kt_of(t->src[2]);
        if (A.back) A.dy = kt_of(t->src[A.gated || A.rope ? 3 : 2]);
        if (A.back && !A.rope && t->ip[1]) /* the bf16 part after dx (QK_NORM_ROPE_BACK's ip1 is n_rot) */
            A.part16 = (uint16_t *)((float *)t->data + keel_nelements(a));
        if (A.rope) {
            A.pos = kt_of(t->src[2]), A.nr = t->ip[1];
            A.freq = rope_freqs(be, t, t->ip[1], t->fp[1]);
            if (!A.freq) return -1;
            A.n_cs = a->ne[2]; /* positions below the window's length (a window's own), from the table */
            if (A.n_cs > 0 && !(A.cs = rope_cs(be, t, t->ip[1], t->fp[1], A.n_cs))) return -1;
        }
        return A.back && !A.rope ? norm_dw(be, t, A) : norm_w_rows(be, t, A);
    }
    case KEEL_OP_GDN_CONV:
    case KEEL_OP_GDN_CONV_BACK: {
        gconv_args A;
        memset(&A, 0, sizeof A);
        A.x = kt_of(a), A.w = kt_of(b), A.pos = kt_of(t->src[2]), A.t = kt_of(t);
        A.back = t->op == KEEL_OP_GDN_CONV_BACK;
        if (A.back) A.dy = kt_of(t->src[3]);
        A.n = t->ip[0], A.hd = t->ip[1], A.eps = t->fp[0], A.a = (float)t->fp[1];
        int64_t R = a->ne[1] * a->ne[2], heads = R * (2 * A.n / A.hd);
        const keel_tensor *w = b, *dy = A.back ? t->src[3] : NULL;
        bool wdense = w->nb[0] == (int64_t)sizeof(float) && w->nb[1] == w->ne[0] * (int64_t)sizeof(float);
        /* the dense kernels address a tile's rows (and the K rows before it) by 32-bit offsets */
        bool fits32 = a->ne[0] <= INT32_MAX / (CONV_TILE_ROWS + CONV_TAPS_MAX) && a->ne[1] <= INT32_MAX;
        if (vec_tensors(a, t, dy) && wdense && w->ne[0] <= CONV_TAPS_MAX && A.hd % 32 == 0 && A.hd <= 128 &&
            A.n % 4 == 0 && a->ne[0] % 4 == 0 && fits32) {
            gconv_dense D;
            D.x = (const float *)a->data, D.w = (const float *)w->data, D.dy = dy ? (const float *)dy->data : NULL;
            D.y = (float *)t->data, D.pos = A.pos, D.C = a->ne[0], D.T = a->ne[1], D.B = a->ne[2], D.n = A.n;
            D.K = (int)w->ne[0], D.hd = (int)A.hd, D.eps = A.eps, D.a = A.a, D.back = A.back;
            int64_t nt = (R + CONV_TILE_HEADS - 1) / CONV_TILE_HEADS;
            unsigned hb = (unsigned)cuda_blocks(nt * (heads / R) * 32, 256);
            if (heads > 0 && D.K <= 4) gconv_heads_launch<4>(be, D, hb);
            if (heads > 0 && D.K > 4) gconv_heads_launch<CONV_TAPS_MAX>(be, D, hb);
            /* the value channels */
            if (D.back)
                conv4_rows_launch<CV_SILU_BACK>(be, D.y, D.x, D.dy, D.w, D.pos, D.C, 2 * D.n, D.T, D.B, D.K, 0);
            else
                conv4_rows_launch<CV_SILU>(be, D.y, D.x, D.dy, D.w, D.pos, D.C, 2 * D.n, D.T, D.B, D.K, 0);
            return 0;
        }
        if (heads > 0) k_gconv_heads<<<cuda_blocks(heads * 32, 256), 256, 0, st(be)>>>(A);
        EW(k_gconv_values, (a->ne[0] - 2 * A.n) * R, A);
        return 0;
    }
    case KEEL_OP_GATED_DELTA_NET:
    case KEEL_OP_GATED_DELTA_NET_STATE:
        return cuda_gdn_forward(be, t);
    case KEEL_OP_GATED_DELTA_NET_BACK:
        return cuda_gdn_backward(be, t);
    case KEEL_OP_LINEAR_CROSS_ENTROPY:
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK:
        return cuda_linear_ce(be, t);
    case KEEL_OP_FLASH_ATTN:
    case KEEL_OP_FLASH_ATTN_BACK:
        return cuda_flash_attn(be, t);
    case KEEL_OP_SUM_SQ: { /* the second level: k_finish_sum's fixed tree over the blocks' sums */
        int64_t na = keel_nelements(a), R = (na + KEEL_SUM_SQ_BLOCK - 1) / KEEL_SUM_SQ_BLOCK;
        double *partial = (double *)cuda_scratch(be, node_scratch(t), t);
        if (!partial) return -1;
        if (R) k_sum_sq_blocks<<<(unsigned)R, RT, 0, st(be)>>>((const float *)a->data, na, partial, vec_ok(a->data));
        k_finish_sum<<<1, RT, 0, st(be)>>>((float *)t->data, partial, R, 1.0, NULL);
        return 0;
    }
    case KEEL_OP_ADAMW:
    case KEEL_OP_ADAMW_SHADOW: {
        /* the copies' 4-element stores take 8 bytes: 8-byte aligned when c is and c0, the element c
         * starts at, is a multiple of 4 */
        uint16_t *c = t->op == KEEL_OP_ADAMW_SHADOW ? (uint16_t *)t->src[5]->data : NULL;
        int64_t c0 = c ? t->ip[3] : 0;
        bool vec =
            vec_tensors(t, b, t->src[2]) && vec_tensors(t->src[3], NULL, NULL) && (uintptr_t)c % 8 == 0 && c0 % 4 == 0;
        int slot = cuda_adamw_slot(cuda_im(be), t); /* its scalars, uploaded when the run started */
        if (slot < 0) return keel_fail("cuda: ADAMW node '%s' has no slot of scalars", t->name);
        const adamw_hp *hp = (const adamw_hp *)((const char *)cuda_im(be)->hp_dev + (size_t)slot * KEEL_CUDA_HP_BYTES);
        if (n > 0)
            k_adamw<<<vec ? vec_blocks(n) : cuda_blocks(n, 256), 256, 0, st(be)>>>(
                (float *)t->data, (const float *)b->data, (float *)t->src[2]->data, (float *)t->src[3]->data,
                (const float *)t->src[4]->data, c, c0, n, t->ip[2], hp, t->fp[5], t->ip[1], vec ? 1 : 0);
        return 0;
    }
    default:
        return keel_fail("cuda: no kernel for %s", keel_op_get(t->op)->name);
    }
}
