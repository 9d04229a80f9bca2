/* keel: flash attention on CUDA (FLASH_ATTN and its backward): causal softmax attention with GQA,
 * no score matrix in memory, and no floating-point atomics.
 *
 * Forward, a block per (query tile of QT rows, query head, example): key tiles of KT keys over the
 * causal range of the tile, S = scale Q K^T in shared memory, the online softmax a warp a row
 * (running max m and sum l, float32; a tile's 32 keys a lane each, summed by a fixed shuffle tree),
 * O = alpha O + P V; at the end o = O / l and lse = m + log l.
 * Backward, after delta = do.o - dlse a row:
 *   dq   a block per (query tile, query head, example), over the key tiles: S and dP = dO V^T,
 *        p = exp(S - lse), ds = p (dP - delta), dQ += dS K; the block writes dq once;
 *   dk dv a block per (key tile, kv head, example), over the query heads of its kv head and the
 *        query tiles that see its keys, in that order: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
 *        dK += dS^T Q; the block writes dk and dv once.
 * Each element of each product is one thread's sum in a fixed order (cuda_tile.cuh) and the work
 * is split by shapes only: the bits repeat and do not depend on the GPU. This float32 form serves
 * float32 q, k, v, and bf16 ones the tensor-core form further down does not take (widened exactly
 * first). Heads of up to 256 (Qwen3.5's) fit the tiles in shared memory; larger ones are refused
 * by cuda_flash_attn_supports. */
#include <cuda_bf16.h>

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_tile.cuh"
#include "backends/cuda/cuda_wgmma.cuh"

#define FA_QT   64  /* query rows a forward block */
#define FA_BT   32  /* query rows and keys a backward block's tiles */
#define FA_KT   32  /* keys a tile (a lane each in the softmax) */
#define FA_MAXD 256 /* head sizes the tiles are sized for */
#define LDK     PAD_LD(FA_KT)

typedef struct {
    kt q, k, v, pos;
    const float *o, *dO;  /* backward: the forward's packed output [o | lse] and its gradient [do | dlse] */
    const float *dlse;    /* backward: NULL where the gradient is [do] alone (dlse 0) */
    float *delta;         /* backward: do.o - dlse a query row */
    kt do16;              /* backward, tensor cores: do rounded to bf16, [Dv,H,Tq,B] */
    void *ds;             /* backward, tensor cores: dS^T of a slab of examples, bf16 [example][H][ldk][ldq], or NULL */
    int64_t ldk, ldq, b0; /* Tk and Tq rounded up to 64; the slab's first example */
    int64_t D, H, Tq, B, KV, Tk, Dv, no; /* no: elements of o (lse follows) */
    float scale;
} fa_args;

/* The keys query row tt of example b sees: lo .. tt + Tk - Tq (SOFT_MAX_CAUSAL's mask) */
__device__ static inline int64_t fa_lo(const fa_args &A, int64_t tt, int64_t b) {
    int64_t lo = tt + A.Tk - A.Tq - pos_at(A.pos, tt, b);
    return lo < 0 ? 0 : lo;
}
__device__ static inline int64_t row_of(const fa_args &A, int64_t tt, int64_t h, int64_t b) {
    return (b * A.Tq + tt) * A.H + h;
}

/* lo of the n rows from t0 into lo[] (rows n .. cap: past every key, so masked), and the
 * smallest of them (every thread gets it) */
__device__ static int64_t tile_lo(const fa_args &A, int *lo, int64_t t0, int n, int64_t b, int cap) {
    __shared__ int mn;
    if (threadIdx.x == 0) mn = 0x7fffffff;
    __syncthreads();
    for (int r = threadIdx.x; r < cap; r += blockDim.x) {
        lo[r] = r < n ? (int)fa_lo(A, t0 + r, b) : 0x7fffffff;
        atomicMin(&mn, lo[r]); /* an integer minimum: the same whatever the order */
    }
    __syncthreads();
    int64_t m = mn;
    __syncthreads();
    return m;
}

/* key tile j0 (nk keys) of kv head kh into Ks and Vs, waited for and visible to the block */
__device__ static void fetch_kv(const fa_args &A, float *Ks, int LDD, float *Vs, int LDV, int64_t kh, int64_t j0,
                                int64_t b, int nk) {
    fetch_rows(Ks, LDD, A.k, kh, j0, b, nk, 0, (int)A.D);
    fetch_rows(Vs, LDV, A.v, kh, j0, b, nk, 0, (int)A.Dv);
    fetch_commit();
    fetch_wait(0);
    __syncthreads();
}

__global__ void __launch_bounds__(NT) k_fa_fwd(fa_args A, float *out) {
    extern __shared__ __align__(16) float sm[];
    int LDD = PAD_LD((int)A.D), LDV = PAD_LD((int)A.Dv);
    float *Qs = sm, *Ks = Qs + FA_QT * LDD, *Vs = Ks + FA_KT * LDD, *Ss = Vs + FA_KT * LDV, *Os = Ss + FA_QT * LDK;
    float *rm = Os + FA_QT * LDV, *rl = rm + FA_QT, *al = rl + FA_QT;
    int *lo = (int *)(al + FA_QT);
    int64_t t0 = (int64_t)blockIdx.x * FA_QT, h = blockIdx.y, b = blockIdx.z, kh = h / (A.H / A.KV), off = A.Tk - A.Tq;
    int n = (int)min((int64_t)FA_QT, A.Tq - t0), D = (int)A.D, Dv = (int)A.Dv;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    fetch_rows(Qs, LDD, A.q, h, t0, b, n, 0, D);
    fetch_commit();
    int64_t kmin = tile_lo(A, lo, t0, n, b, n), kmax = t0 + n - 1 + off;
    for (int e = threadIdx.x; e < FA_QT * LDV; e += NT) Os[e] = 0.0f;
    for (int r = threadIdx.x; r < FA_QT; r += NT) rm[r] = -INFINITY, rl[r] = 0.0f;
    for (int64_t j0 = kmin / FA_KT * FA_KT; j0 <= kmax; j0 += FA_KT) {
        int nk = (int)min((int64_t)FA_KT, A.Tk - j0);
        fetch_kv(A, Ks, LDD, Vs, LDV, kh, j0, b, nk);
        bmm<false, true>(Ss, LDK, Qs, LDD, Ks, LDD, n, nk, D, A.scale, 0.0f, false);
        __syncthreads();
        for (int r = warp; r < n; r += NT / 32) { /* the online softmax, a warp a row, a lane a key */
            int64_t j = j0 + lane, hi = t0 + r + off;
            float s = lane < nk && j >= lo[r] && j <= hi ? Ss[r * LDK + lane] : -INFINITY, mx = s;
            for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
            float mo = rm[r], mn = fmaxf(mo, mx);
            float p = mn == -INFINITY ? 0.0f : expf(s - mn), a = mn == -INFINITY ? 1.0f : expf(mo - mn);
            float ps = warp_sum(p);
            Ss[r * LDK + lane] = p;
            __syncwarp();
            if (lane == 0) rm[r] = mn, rl[r] = a * rl[r] + ps, al[r] = a;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n * Dv; e += NT) {
            int r = e / Dv, c = e - r * Dv;
            Os[r * LDV + c] *= al[r];
        }
        __syncthreads();
        bmm<false, false>(Os, LDV, Ss, LDK, Vs, LDV, n, Dv, nk, 1.0f, 1.0f, true);
        __syncthreads();
    }
    for (int e = threadIdx.x; e < n * Dv; e += NT) {
        int r = e / Dv, c = e - r * Dv;
        out[row_of(A, t0 + r, h, b) * Dv + c] = Os[r * LDV + c] * (1.0f / rl[r]);
    }
    for (int r = threadIdx.x; r < n; r += NT) out[A.no + row_of(A, t0 + r, h, b)] = rm[r] + logf(rl[r]);
}

/* delta = do.o - dlse, a warp a query row (a fixed shuffle tree): lane l sums columns l, l + 32, ...
 * in that order. Heads of up to 256 whose width is a multiple of 32 (Qwen3.5's) issue a row's loads
 * all at once, 16 a lane in flight, and make the bf16 copy from the registers: the same sums. */
__global__ void k_fa_delta(fa_args A) {
    int64_t rows = A.H * A.Tq * A.B, w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= rows) return;
    float s = 0.0f;
    if (A.Dv % 32 == 0 && A.Dv <= FA_MAXD) {
        const float *d = A.dO + w * A.Dv + lane, *o = A.o + w * A.Dv + lane;
        int n = (int)(A.Dv / 32);
        float dv[FA_MAXD / 32], ov[FA_MAXD / 32];
#pragma unroll
        for (int i = 0; i < FA_MAXD / 32; i++)
            if (i < n) dv[i] = d[32 * i], ov[i] = o[32 * i];
#pragma unroll
        for (int i = 0; i < FA_MAXD / 32; i++)
            if (i < n) s += dv[i] * ov[i];
        s = warp_sum(s);
        if (lane == 0) A.delta[w] = s - (A.dlse ? A.dlse[w] : 0.0f);
        if (A.do16.p) {
            __nv_bfloat16 *d16 = (__nv_bfloat16 *)A.do16.p + w * A.Dv + lane;
#pragma unroll
            for (int i = 0; i < FA_MAXD / 32; i++)
                if (i < n) d16[32 * i] = __float2bfloat16_rn(dv[i]);
        }
        return;
    }
    for (int64_t c = lane; c < A.Dv; c += 32) s += A.dO[w * A.Dv + c] * A.o[w * A.Dv + c];
    s = warp_sum(s);
    if (lane == 0) A.delta[w] = s - (A.dlse ? A.dlse[w] : 0.0f);
    if (A.do16.p) /* the bf16 copy the tensor-core kernels stage */
        for (int64_t c = lane; c < A.Dv; c += 32)
            ((__nv_bfloat16 *)A.do16.p)[w * A.Dv + c] = __float2bfloat16_rn(A.dO[w * A.Dv + c]);
}

__global__ void __launch_bounds__(NT) k_fa_dq(fa_args A, float *out) {
    extern __shared__ __align__(16) float sm[];
    int LDD = PAD_LD((int)A.D), LDV = PAD_LD((int)A.Dv);
    float *Qs = sm, *dOs = Qs + FA_BT * LDD, *dQs = dOs + FA_BT * LDV, *Ks = dQs + FA_BT * LDD, *Vs = Ks + FA_KT * LDD;
    float *Ps = Vs + FA_KT * LDV, *dPs = Ps + FA_BT * LDK, *ls = dPs + FA_BT * LDK, *dl = ls + FA_BT;
    int *lo = (int *)(dl + FA_BT);
    int64_t t0 = (int64_t)blockIdx.x * FA_BT, h = blockIdx.y, b = blockIdx.z, kh = h / (A.H / A.KV), off = A.Tk - A.Tq;
    int n = (int)min((int64_t)FA_BT, A.Tq - t0), D = (int)A.D, Dv = (int)A.Dv;
    fetch_rows(Qs, LDD, A.q, h, t0, b, n, 0, D);
    for (int e = threadIdx.x; e < n * Dv; e += NT) {
        int r = e / Dv, c = e - r * Dv;
        dOs[r * LDV + c] = A.dO[row_of(A, t0 + r, h, b) * Dv + c];
    }
    for (int r = threadIdx.x; r < n; r += NT)
        ls[r] = A.o[A.no + row_of(A, t0 + r, h, b)], dl[r] = A.delta[row_of(A, t0 + r, h, b)];
    for (int e = threadIdx.x; e < FA_BT * LDD; e += NT) dQs[e] = 0.0f;
    fetch_commit();
    int64_t kmin = tile_lo(A, lo, t0, n, b, n), kmax = t0 + n - 1 + off;
    for (int64_t j0 = kmin / FA_KT * FA_KT; j0 <= kmax; j0 += FA_KT) {
        int nk = (int)min((int64_t)FA_KT, A.Tk - j0);
        fetch_kv(A, Ks, LDD, Vs, LDV, kh, j0, b, nk);
        bmm<false, true>(Ps, LDK, Qs, LDD, Ks, LDD, n, nk, D, A.scale, 0.0f, false);
        bmm<false, true>(dPs, LDK, dOs, LDV, Vs, LDV, n, nk, Dv, 1.0f, 0.0f, false);
        __syncthreads();
        for (int e = threadIdx.x; e < n * FA_KT; e += NT) {
            int r = e / FA_KT, c = e - r * FA_KT;
            int64_t j = j0 + c;
            bool in = c < nk && j >= lo[r] && j <= t0 + r + off;
            float p = in ? expf(Ps[r * LDK + c] - ls[r]) : 0.0f;
            Ps[r * LDK + c] = in ? p * (dPs[r * LDK + c] - dl[r]) : 0.0f; /* ds */
        }
        __syncthreads();
        bmm<false, false>(dQs, LDD, Ps, LDK, Ks, LDD, n, D, nk, 1.0f, 1.0f, true);
        __syncthreads();
    }
    for (int e = threadIdx.x; e < n * D; e += NT) {
        int r = e / D, c = e - r * D;
        out[row_of(A, t0 + r, h, b) * D + c] = A.scale * dQs[r * LDD + c];
    }
}

__global__ void __launch_bounds__(NT) k_fa_dkv(fa_args A, float *out) {
    extern __shared__ __align__(16) float sm[];
    int LDD = PAD_LD((int)A.D), LDV = PAD_LD((int)A.Dv);
    float *Ks = sm, *Vs = Ks + FA_KT * LDD, *dKs = Vs + FA_KT * LDV, *dVs = dKs + FA_KT * LDD, *Qs = dVs + FA_KT * LDV;
    float *dOs = Qs + FA_BT * LDD, *St = dOs + FA_BT * LDV, *dPt = St + FA_KT * LDK, *ls = dPt + FA_KT * LDK,
          *dl = ls + FA_BT;
    int *lo = (int *)(dl + FA_BT);
    int64_t j0 = (int64_t)blockIdx.x * FA_KT, kh = blockIdx.y, b = blockIdx.z, off = A.Tk - A.Tq, G = A.H / A.KV;
    int nk = (int)min((int64_t)FA_KT, A.Tk - j0), D = (int)A.D, Dv = (int)A.Dv;
    fetch_rows(Ks, LDD, A.k, kh, j0, b, nk, 0, D);
    fetch_rows(Vs, LDV, A.v, kh, j0, b, nk, 0, Dv);
    fetch_commit();
    for (int e = threadIdx.x; e < FA_KT * LDD; e += NT) dKs[e] = 0.0f;
    for (int e = threadIdx.x; e < FA_KT * LDV; e += NT) dVs[e] = 0.0f;
    int64_t tfirst = j0 - off < 0 ? 0 : j0 - off; /* the first query that can see key j0 */
    for (int64_t h = kh * G; h < (kh + 1) * G; h++)
        for (int64_t t0 = tfirst / FA_BT * FA_BT; t0 < A.Tq; t0 += FA_BT) {
            int n = (int)min((int64_t)FA_BT, A.Tq - t0);
            if (tile_lo(A, lo, t0, n, b, n) > j0 + nk - 1) continue; /* no query of the tile sees these keys */
            fetch_rows(Qs, LDD, A.q, h, t0, b, n, 0, D);
            fetch_commit();
            for (int e = threadIdx.x; e < n * Dv; e += NT) {
                int r = e / Dv, c = e - r * Dv;
                dOs[r * LDV + c] = A.dO[row_of(A, t0 + r, h, b) * Dv + c];
            }
            for (int r = threadIdx.x; r < n; r += NT)
                ls[r] = A.o[A.no + row_of(A, t0 + r, h, b)], dl[r] = A.delta[row_of(A, t0 + r, h, b)];
            fetch_wait(0);
            __syncthreads();
            bmm<false, true>(St, LDK, Ks, LDD, Qs, LDD, nk, n, D, A.scale, 0.0f, false);
            bmm<false, true>(dPt, LDK, Vs, LDV, dOs, LDV, nk, n, Dv, 1.0f, 0.0f, false);
            __syncthreads();
            for (int e = threadIdx.x; e < FA_KT * FA_BT; e += NT) {
                int c = e / FA_BT, r = e - c * FA_BT; /* key c, query r */
                int64_t j = j0 + c;
                bool in = c < nk && r < n && j >= lo[r] && j <= t0 + r + off;
                float p = in ? expf(St[c * LDK + r] - ls[r]) : 0.0f;
                St[c * LDK + r] = p;
                dPt[c * LDK + r] = in ? p * (dPt[c * LDK + r] - dl[r]) : 0.0f; /* ds */
            }
            __syncthreads();
            bmm<false, false>(dVs, LDV, St, LDK, dOs, LDV, nk, Dv, n, 1.0f, 1.0f, true);
            bmm<false, false>(dKs, LDD, dPt, LDK, Qs, LDD, nk, D, n, 1.0f, 1.0f, true);
            __syncthreads();
        }
    int64_t nq = A.D * A.H * A.Tq * A.B, nkk = A.D * A.KV * A.Tk * A.B;
    for (int e = threadIdx.x; e < nk * D; e += NT) {
        int c = e / D, d = e - c * D;
        out[nq + ((b * A.Tk + j0 + c) * A.KV + kh) * D + d] = A.scale * dKs[c * LDD + d];
    }
    for (int e = threadIdx.x; e < nk * Dv; e += NT) {
        int c = e / Dv, d = e - c * Dv;
        out[nq + nkk + ((b * A.Tk + j0 + c) * A.KV + kh) * Dv + d] = dVs[c * LDV + d];
    }
}

/* ---- The bf16 form on tensor cores (mma.sync m16n8k16: bf16 operands, float32 sums) ----
 * For bf16 q, k, v with heads of 64, 128 or 256 whose rows start on 16-byte boundaries. The same
 * passes as above, with P and dS rounded to bf16 as operands of their products (the float32
 * statistics, lse and delta are not) and do rounded to bf16 as it is staged; the sums of a product
 * run in the tensor cores' fixed order. The backward runs dk dv first, which also writes dS (bf16)
 * to scratch, then dq = dS K from it, a slab of examples at a time (ds_slab); where not even one
 * example's dS fits, dq recomputes S and dP itself (k_fa_dq_tc). Tiles live in shared memory as bf16 rows of D + 8 (a row
 * 16 bytes past a multiple of 128: the 32-bit fragment loads and ldmatrix rows of a warp fall in
 * distinct banks). A warp's accumulator fragment holds rows g and g + 8 (g = lane / 4) and columns
 * 2c, 2c + 1 (c = lane % 4) of each 8-column tile; a row's max and sum over a tile are a quad's
 * (shuffles over lanes 1 and 2 apart, a fixed order). */
typedef __nv_bfloat16 bf16;

__device__ static inline uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
__device__ static inline void mma_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Four 8x8 bf16 matrices transposed: lane l gives the address of row l % 8 of matrix l / 8 */
__device__ static inline void ldsm_x4_t(uint32_t *r, const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* The A fragment (16 rows x 16 of depth from kk) of a row-major bf16 tile */
__device__ static inline void ldsm_x4(uint32_t *r, const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* one ldmatrix: lanes 0-15 give rows row0 .. + 15 at column kk, lanes 16-31 the same rows at kk + 8 */
__device__ static inline void frag_a(uint32_t *a, const bf16 *t, int ld, int row0, int kk, int lane) {
    ldsm_x4(a, t + (row0 + (lane & 15)) * ld + kk + (lane >> 4) * 8);
}
/* B fragments of n-tiles n0 and n0 + 8 (b[0], b[1] and b[2], b[3]) for depth kk .. kk + 15 of
 * Y^T, Y row-major (rows the n index): one ldmatrix */
__device__ static inline void frag_bt2(uint32_t *b, const bf16 *Y, int ld, int n0, int kk, int lane) {
    ldsm_x4(b, Y + (n0 + (lane >> 4) * 8 + (lane & 7)) * ld + kk + ((lane >> 3) & 1) * 8);
}
/* acc[nt] (16 x 8 n-tiles) += A (16 rows from row0 of X) B^T, B the rows n0 .. of Y: X Y^T over D */
template <int D, int NTL>
__device__ static inline void mma_abt(float (*acc)[4], const bf16 *X, int row0, const bf16 *Y, int n0, int lane) {
    const int LD = D + 8;
#pragma unroll 4
    for (int kk = 0; kk < D; kk += 16) {
        uint32_t a[4];
        frag_a(a, X, LD, row0, kk, lane);
#pragma unroll
        for (int nt = 0; nt < NTL; nt += 2) {
            uint32_t b[4];
            frag_bt2(b, Y, LD, n0 + nt * 8, kk, lane);
            mma_bf16(acc[nt], a, b[0], b[1]);
            mma_bf16(acc[nt + 1], a, b[2], b[3]);
        }
    }
}
/* one 16-deep step of two products (below) */
template <int D, int NTL>
__device__ static inline void mma_abt2_step(float (*acc)[4], const bf16 *X, const bf16 *Y, float (*acc2)[4],
                                            const bf16 *X2, const bf16 *Y2, int row0, int n0, int kk, int lane) {
    const int LD = D + 8;
    uint32_t a[4], a2[4];
    frag_a(a, X, LD, row0, kk, lane);
    frag_a(a2, X2, LD, row0, kk, lane);
#pragma unroll
    for (int nt = 0; nt < NTL; nt += 2) {
        uint32_t b[4], b2[4];
        frag_bt2(b, Y, LD, n0 + nt * 8, kk, lane);
        frag_bt2(b2, Y2, LD, n0 + nt * 8, kk, lane);
        mma_bf16(acc[nt], a, b[0], b[1]);
        mma_bf16(acc[nt + 1], a, b[2], b[3]);
        mma_bf16(acc2[nt], a2, b2[0], b2[1]);
        mma_bf16(acc2[nt + 1], a2, b2[2], b2[3]);
    }
}
/* Two such products in one loop, acc += X Y^T and acc2 += X2 Y2^T (same rows and columns). The
 * depth's 16-wide steps alternate between acc and a second set of sums added at the end: twice the
 * independent tensor-core work in flight (a product of few columns is a chain of D / 16 dependent
 * steps otherwise; the sum's order is still fixed by the shapes). D: a multiple of 32. */
template <int D, int NTL>
__device__ static inline void mma_abt2(float (*acc)[4], const bf16 *X, const bf16 *Y, float (*acc2)[4], const bf16 *X2,
                                       const bf16 *Y2, int row0, int n0, int lane) {
    float o1[NTL][4], o2[NTL][4];
#pragma unroll
    for (int i = 0; i < NTL; i++)
        o1[i][0] = o1[i][1] = o1[i][2] = o1[i][3] = o2[i][0] = o2[i][1] = o2[i][2] = o2[i][3] = 0.0f;
#pragma unroll 2
    for (int kk = 0; kk < D; kk += 32) {
        mma_abt2_step<D, NTL>(acc, X, Y, acc2, X2, Y2, row0, n0, kk, lane);
        mma_abt2_step<D, NTL>(o1, X, Y, o2, X2, Y2, row0, n0, kk + 16, lane);
    }
#pragma unroll
    for (int i = 0; i < NTL; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] += o1[i][e], acc2[i][e] += o2[i][e];
}
/* acc[dt] (16 x 8 d-tiles from d0, ND of them) += A Y for one k-step: A's fragment a (16 x 16),
 * Y's rows yr .. yr + 15 of a row-major tile, read transposed by ldmatrix */
template <int D, int ND>
__device__ static inline void mma_ay_step(float (*acc)[4], const uint32_t *a, const bf16 *Y, int yr, int d0, int lane) {
    const bf16 *p = Y + (yr + ((lane >> 3) & 1) * 8 + (lane & 7)) * (D + 8) + d0 + (lane >> 4) * 8;
#pragma unroll
    for (int dp = 0; dp < ND / 2; dp++) {
        uint32_t b[4];
        ldsm_x4_t(b, p + dp * 16);
        mma_bf16(acc[2 * dp], a, b[0], b[1]);
        mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
    }
}
/* the A fragment of columns 16 ks .. + 15 of s (accumulator layout), rounded to bf16 */
__device__ static inline void p_frag(uint32_t *a, const float (*s)[4], int ks) {
    a[0] = pack_bf16(s[2 * ks][0], s[2 * ks][1]), a[1] = pack_bf16(s[2 * ks][2], s[2 * ks][3]);
    a[2] = pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]), a[3] = pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
}
/* acc += P Y, P the 16 x 16 KS probabilities in s[2 KS][4] (accumulator layout, rounded to bf16 as
 * A fragments), Y's rows 0 .. 16 KS */
template <int D, int KS, int ND>
__device__ static inline void mma_py(float (*acc)[4], const float (*s)[4], const bf16 *Y, int d0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a[4];
        p_frag(a, s, ks);
        mma_ay_step<D, ND>(acc, a, Y, ks * 16, d0, lane);
    }
}
/* acc += X Y, X rows row0 .. row0 + 15 of a bf16 tile in shared memory (row stride ldx, 16 KS wide) */
template <int D, int KS, int ND>
__device__ static inline void mma_xy(float (*acc)[4], const bf16 *X, int ldx, int row0, const bf16 *Y, int d0,
                                     int lane) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a[4];
        frag_a(a, X, ldx, row0, ks * 16, lane);
        mma_ay_step<D, ND>(acc, a, Y, ks * 16, d0, lane);
    }
}
/* rows [t0, t0 + n) of a bf16 input (row stride nb[2], 16-byte aligned) into a tile of `rows`
 * rows, the rest zero (a zero row times a probability of 0 stays 0, garbage might be NaN) */
template <int D>
__device__ static void tc_fetch(bf16 *dst, const kt &x, int64_t h, int64_t t0, int64_t b, int n, int rows) {
    for (int e = threadIdx.x; e < rows * (D / 8); e += blockDim.x) {
        int r = e / (D / 8), c = (e - r * (D / 8)) * 8;
        bf16 *d = dst + r * (D + 8) + c;
        if (r < n)
            __pipeline_memcpy_async(d, kt_at(x, c, h, t0 + r, b), 16);
        else
            *(uint4 *)d = make_uint4(0, 0, 0, 0);
    }
}

#define TC_Q 64 /* query rows a forward or dq block (4 warps of 16) */
#define TC_K 64 /* keys a forward tile, and a dk dv block (4 warps of 16 keys, each D in two halves) */
#define TC_B 32 /* keys a tile of the dq kernel that recomputes S and dP */

/* A key tile's scores for rows r0 and r0 + 8 of a warp (s, accumulator layout; hi: the last key row r0
 * sees, lor[i] the first each sees): masked and scaled, then the online softmax's step: the running
 * max m and sum l updated, P = exp(s - m) in place of s, the output so far rescaled */
template <int D>
__device__ static inline void fa_softmax_tile(float (*s)[4], float (*o)[4], float *m, float *l, const int *lor,
                                              int64_t hi0, int64_t j0, int c, float scale) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int64_t hi = hi0 + 8 * i;
        float mx = -INFINITY;
        /* the row sees the whole tile: no mask to test. Two loops: one with `full || mask` (as dk dv's)
         * takes 1 to 36 more registers in 5 of k_fa_fwd_tc's 6 instances (ptxas -v, sm_90a) */
        if (j0 >= lor[i] && j0 + TC_K - 1 <= hi) {
#pragma unroll
            for (int nt = 0; nt < TC_K / 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float v = s[nt][2 * i + e] * scale;
                    s[nt][2 * i + e] = v;
                    mx = fmaxf(mx, v);
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < TC_K / 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int64_t j = j0 + nt * 8 + 2 * c + e;
                    float v = j >= lor[i] && j <= hi ? s[nt][2 * i + e] * scale : -INFINITY;
                    s[nt][2 * i + e] = v;
                    mx = fmaxf(mx, v);
                }
        }
        float mn = fmaxf(m[i], quad_max(mx)), al = mn == -INFINITY ? 1.0f : expf(m[i] - mn), sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < TC_K / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float p = mn == -INFINITY ? 0.0f : expf(s[nt][2 * i + e] - mn);
                s[nt][2 * i + e] = p;
                sum += p;
            }
        l[i] = al * l[i] + quad_sum(sum), m[i] = mn;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) o[dt][2 * i] *= al, o[dt][2 * i + 1] *= al;
    }
}
/* The forward's rows r0 and r0 + 8 of a warp out: o = O / l, lse = m + log l */
template <int D>
__device__ static inline void fa_store_o(const fa_args &A, const float (*o)[4], const float *m, const float *l,
                                         float *out, int64_t t0, int r0, int n, int64_t h, int64_t b, int c) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (r0 + 8 * i >= n) continue;
        int64_t row = row_of(A, t0 + r0 + 8 * i, h, b);
        float inv = 1.0f / l[i];
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            *(float2 *)(out + row * D + dt * 8 + 2 * c) = make_float2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
        if (c == 0) out[A.no + row] = m[i] + logf(l[i]);
    }
}

/* o (64 x D) += A Y on the warpgroup products: A a register fragment (16 of depth), Y the rows kk .. + 15
 * of a tile of TC_K rows in swizzled panels, read transposed */
template <int D> __device__ static inline void wg_pv(float (*o)[4], const uint32_t *a, const bf16 *Vs, int kk) {
#ifdef KEEL_WGMMA_BODY
    if constexpr (D == 256)
        wg_rs_n256_t(o, a, wg_desc_n(Vs, TC_K, kk));
    else if constexpr (D == 128)
        wg_rs_n128_t(o, a, wg_desc_n(Vs, TC_K, kk));
    else
        wg_rs_n64_t(o, a, wg_desc_n(Vs, TC_K, kk));
#endif
}
/* acc (64 x D) += A Y over TC_K of depth, waited for: A as TC_K / 16 register fragments, Y a tile
 * of TC_K rows in swizzled panels (wg_pv) */
template <int D> __device__ static inline void wg_acc_rs(float (*acc)[4], const uint32_t (*a)[4], const bf16 *Y) {
#ifdef KEEL_WGMMA_BODY
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < TC_K / 16; ks++) wg_pv<D>(acc, a[ks], Y, ks * 16);
    wg_commit();
    wg_wait0();
#endif
}
/* rows [t0, t0 + n) of a bf16 input into a tile of `rows` rows: swizzled panels for the warpgroup
 * products (WG), else rows of D + 8 */
template <int D, bool WG>
__device__ static inline void tile_fetch(bf16 *dst, const kt &x, int64_t h, int64_t t0, int64_t b, int n, int rows) {
    if (WG)
        wg_fetch<D>(dst, x, h, t0, b, n, rows);
    else
        tc_fetch<D>(dst, x, h, t0, b, n, rows);
}
/* a tile's data in, to the warps (and, WG, to the tensor cores' reads) */
template <bool WG> __device__ static inline void tile_ready() {
#ifdef KEEL_WGMMA_BODY
    if (WG) wg_proxy_fence();
#endif
    __syncthreads();
}

/* The forward (WG: on Hopper's warpgroup products, the block's 4 warps one warpgroup: S = Q K^T
 * as 16-deep steps over Q's and K's swizzled panels, O += P V with P from the registers S came
 * back in and V's panels read transposed; the tensor cores read the tiles themselves, no warp loads
 * fragments; 96 KiB of shared memory at heads of 256, two blocks a multiprocessor) */
template <int D, bool WG> __global__ void __launch_bounds__(128) k_fa_fwd_tc(fa_args A, float *out) {
#ifndef KEEL_WGMMA_BODY
    if (WG) __trap(); /* launched only where the sm_90a code exists (cuda_impl.wgmma) */
#endif
    extern __shared__ __align__(16) unsigned char sraw[];
    const int LD = WG ? D : D + 8;
    bf16 *Qs = (bf16 *)(WG ? wg_aligned(sraw) : sraw), *Ks = Qs + TC_Q * LD, *Vs = Ks + TC_K * LD;
    int *lo = (int *)(Vs + TC_K * LD);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int64_t t0 = (int64_t)(gridDim.z - 1 - blockIdx.z) * TC_Q, h = blockIdx.x, b = blockIdx.y, kh = h / (A.H / A.KV),
            off = A.Tk - A.Tq; /* the last query tiles (the most keys) first: see tc_run */
    int n = (int)min((int64_t)TC_Q, A.Tq - t0);
    tile_fetch<D, WG>(Qs, A.q, h, t0, b, n, TC_Q);
    fetch_commit();
    int64_t kmin = tile_lo(A, lo, t0, n, b, TC_Q), kmax = t0 + n - 1 + off, j0 = kmin / TC_K * TC_K;
    tile_fetch<D, WG>(Ks, A.k, kh, j0, b, (int)min((int64_t)TC_K, A.Tk - j0), TC_K);
    fetch_commit();
    tile_fetch<D, WG>(Vs, A.v, kh, j0, b, (int)min((int64_t)TC_K, A.Tk - j0), TC_K);
    fetch_commit();
    int r0 = warp * 16 + g, lor[2] = {lo[r0], lo[r0 + 8]};
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (; j0 <= kmax; j0 += TC_K) {
        fetch_wait(1); /* K (and Q) in; V may be on its way */
        tile_ready<WG>();
        float s[TC_K / 8][4];
#pragma unroll
        for (int i = 0; i < TC_K / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        if constexpr (WG) {
#ifdef KEEL_WGMMA_BODY
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < D; kk += 16) wg_ss_n64(s, wg_desc_k(Qs, TC_Q, kk), wg_desc_k(Ks, TC_K, kk));
            wg_commit();
            wg_wait0();
#endif
        } else {
            mma_abt<D, TC_K / 8>(s, Qs, warp * 16, Ks, 0, lane);
        }
        __syncthreads(); /* every warp is done with K: fetch the next tile's */
        if (j0 + TC_K <= kmax)
            tile_fetch<D, WG>(Ks, A.k, kh, j0 + TC_K, b, (int)min((int64_t)TC_K, A.Tk - j0 - TC_K), TC_K);
        fetch_commit();
        fa_softmax_tile<D>(s, o, m, l, lor, t0 + r0 + off, j0, c, A.scale);
        fetch_wait(1); /* V in; the next K may be on its way */
        tile_ready<WG>();
        if constexpr (WG) {
#ifdef KEEL_WGMMA_BODY
            uint32_t a[TC_K / 16][4]; /* P as A fragments, as mma_py makes them */
#pragma unroll
            for (int ks = 0; ks < TC_K / 16; ks++) p_frag(a[ks], s, ks);
            wg_acc_rs<D>(o, a, Vs);
#endif
        } else {
            mma_py<D, TC_K / 16, D / 8>(o, s, Vs, 0, lane);
        }
        __syncthreads(); /* every warp is done with V */
        if (j0 + TC_K <= kmax)
            tile_fetch<D, WG>(Vs, A.v, kh, j0 + TC_K, b, (int)min((int64_t)TC_K, A.Tk - j0 - TC_K), TC_K);
        fetch_commit();
    }
    fa_store_o<D>(A, o, m, l, out, t0, r0, n, h, b, c);
}

/* a dq block's result: rows r0 and r0 + 8 of the warp's 16 (accumulator layout), scaled */
template <int D>
__device__ static inline void store_dq(const fa_args &A, const float (*dq)[4], float *out, int64_t t0, int r0, int n,
                                       int64_t h, int64_t b, int c) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (r0 + 8 * i >= n) continue;
        int64_t row = row_of(A, t0 + r0 + 8 * i, h, b);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            *(float2 *)(out + row * D + dt * 8 + 2 * c) =
                make_float2(A.scale * dq[dt][2 * i], A.scale * dq[dt][2 * i + 1]);
    }
}

template <int D> __global__ void __launch_bounds__(128) k_fa_dq_tc(fa_args A, float *out) {
    extern __shared__ __align__(16) unsigned char sraw[];
    const int LD = D + 8;
    bf16 *Qs = (bf16 *)sraw, *dOs = Qs + TC_Q * LD, *Ks = dOs + TC_Q * LD, *Vs = Ks + TC_B * LD;
    float *ls = (float *)(Vs + TC_B * LD), *dl = ls + TC_Q;
    int *lo = (int *)(dl + TC_Q);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int64_t t0 = (int64_t)blockIdx.x * TC_Q, h = blockIdx.y, b = blockIdx.z, kh = h / (A.H / A.KV), off = A.Tk - A.Tq;
    int n = (int)min((int64_t)TC_Q, A.Tq - t0);
    tc_fetch<D>(Qs, A.q, h, t0, b, n, TC_Q);
    tc_fetch<D>(dOs, A.do16, h, t0, b, n, TC_Q);
    fetch_commit();
    for (int r = threadIdx.x; r < TC_Q; r += blockDim.x) {
        ls[r] = r < n ? A.o[A.no + row_of(A, t0 + r, h, b)] : 0.0f;
        dl[r] = r < n ? A.delta[row_of(A, t0 + r, h, b)] : 0.0f;
    }
    int64_t kmin = tile_lo(A, lo, t0, n, b, TC_Q), kmax = t0 + n - 1 + off;
    int r0 = warp * 16 + g, lor[2] = {lo[r0], lo[r0 + 8]};
    float lr[2] = {ls[r0], ls[r0 + 8]}, dr[2] = {dl[r0], dl[r0 + 8]};
    float dq[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    for (int64_t j0 = kmin / TC_B * TC_B; j0 <= kmax; j0 += TC_B) {
        int nk = (int)min((int64_t)TC_B, A.Tk - j0);
        tc_fetch<D>(Ks, A.k, kh, j0, b, nk, TC_B);
        tc_fetch<D>(Vs, A.v, kh, j0, b, nk, TC_B);
        fetch_commit();
        fetch_wait(0);
        __syncthreads();
        float s[TC_B / 8][4], dp[TC_B / 8][4];
#pragma unroll
        for (int i = 0; i < TC_B / 8; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
        mma_abt2<D, TC_B / 8>(s, Qs, Ks, dp, dOs, Vs, warp * 16, 0, lane);
#pragma unroll
        for (int nt = 0; nt < TC_B / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) { /* ds = p (dp - delta) */
                int i = e >> 1;
                int64_t j = j0 + nt * 8 + 2 * c + (e & 1);
                bool in = j >= lor[i] && j <= t0 + r0 + 8 * i + off;
                float p = in ? expf(s[nt][e] * A.scale - lr[i]) : 0.0f;
                s[nt][e] = in ? p * (dp[nt][e] - dr[i]) : 0.0f;
            }
        mma_py<D, TC_B / 16, D / 8>(dq, s, Ks, 0, lane);
        __syncthreads(); /* every warp is done with K and V */
    }
    store_dq<D>(A, dq, out, t0, r0, n, h, b, c);
}

/* dq from dS (the dk dv kernel's, bf16 in scratch as dS^T: keys the rows): a block per (64 query
 * rows, query head, example of the slab), dQ += dS K over the 64-key tiles its rows see, the next
 * tile's keys and dS in flight during this one's products. dS is masked as its fragments are
 * loaded (entries a row does not see are 0 whatever the buffer holds: the dk dv kernel skips tiles
 * no row of which sees its keys). The same bf16 dS operands as the recomputing kernel above, a
 * fifth of its products. */
#define LDSD (TC_Q + 8)
template <int D, bool WG>
__device__ static void dq_ds_fetch(const fa_args &A, bf16 *Ks, bf16 *Ss, const bf16 *ds, int64_t kh, int64_t j0,
                                   int64_t b) {
    tile_fetch<D, WG>(Ks, A.k, kh, j0, b, (int)min((int64_t)TC_K, A.Tk - j0), TC_K);
    for (int e = threadIdx.x; e < TC_K * (TC_Q / 8); e += blockDim.x) {
        int r = e / (TC_Q / 8), c = (e - r * (TC_Q / 8)) * 8;
        __pipeline_memcpy_async(Ss + r * LDSD + c, ds + (j0 + r) * A.ldq + c, 16);
    }
}

/* The A fragment of a dq block's warp (its 16 query rows) for keys 16 ks .. + 15 of the dS^T tile Ss
 * (rows: keys), read transposed (matrix m = lane / 8: keys + 8 (m / 2), queries + 8 (m % 2)), as
 * stored: for a tile whose every key the thread's two rows see */
__device__ static inline void ds_frag_all(uint32_t *a, const bf16 *Ss, int ks, int warp, int lane) {
    ldsm_x4_t(a, Ss + (ks * 16 + ((lane >> 4) << 3) + (lane & 7)) * LDSD + warp * 16 + ((lane >> 3) & 1) * 8);
}
/* ... and masked: a[f] holds row r0 + 8 (f & 1), keys j, j + 1; what the row does not see is 0 */
__device__ static inline void ds_frag(uint32_t *a, const bf16 *Ss, int ks, int64_t j0, const int *lor,
                                      const int64_t *hir, int warp, int lane) {
    ds_frag_all(a, Ss, ks, warp, lane);
#pragma unroll
    for (int f = 0; f < 4; f++) {
        int64_t j = j0 + ks * 16 + 8 * (f >> 1) + 2 * (lane & 3);
        int ri = f & 1;
        uint32_t m =
            (j >= lor[ri] && j <= hir[ri] ? 0xffffu : 0u) | (j + 1 >= lor[ri] && j + 1 <= hir[ri] ? 0xffff0000u : 0u);
        a[f] &= m;
    }
}

/* (WG: dS's fragments as above are the A registers of warpgroup products, K's swizzled panels their
 * transposed B; the block's 4 warps one warpgroup) */
template <int D, bool WG> __global__ void __launch_bounds__(128) k_fa_dq_ds_tc(fa_args A, float *out) {
#ifndef KEEL_WGMMA_BODY
    if (WG) __trap(); /* launched only where the sm_90a code exists (cuda_impl.wgmma) */
#endif
    extern __shared__ __align__(16) unsigned char sraw[];
    const int LD = WG ? D : D + 8;
    bf16 *Kb = (bf16 *)(WG ? wg_aligned(sraw) : sraw), *Sb = Kb + 2 * TC_K * LD;
    int *lo = (int *)(Sb + 2 * TC_K * LDSD);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int64_t t0 = (int64_t)(gridDim.z - 1 - blockIdx.z) * TC_Q, h = blockIdx.x, zb = blockIdx.y, b = A.b0 + zb,
            kh = h / (A.H / A.KV), off = A.Tk - A.Tq;
    int n = (int)min((int64_t)TC_Q, A.Tq - t0);
    const bf16 *ds = (const bf16 *)A.ds + (zb * A.H + h) * A.ldk * A.ldq + t0;
    int64_t kmin = tile_lo(A, lo, t0, n, b, TC_Q), kmax = t0 + n - 1 + off, j0 = kmin / TC_K * TC_K;
    int r0 = warp * 16 + g, lor[2] = {lo[r0], lo[r0 + 8]};
    int64_t hir[2] = {t0 + r0 + off, t0 + r0 + 8 + off};
    float dq[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    dq_ds_fetch<D, WG>(A, Kb, Sb, ds, kh, j0, b);
    fetch_commit();
    for (int i = 0; j0 <= kmax; j0 += TC_K, i++) {
        int bi = i & 1;
        if (j0 + TC_K <= kmax)
            dq_ds_fetch<D, WG>(A, Kb + (bi ^ 1) * TC_K * LD, Sb + (bi ^ 1) * TC_K * LDSD, ds, kh, j0 + TC_K, b);
        fetch_commit();
        fetch_wait(1); /* this tile in; the next on its way */
        tile_ready<WG>();
        const bf16 *Ks = Kb + bi * TC_K * LD, *Ss = Sb + bi * TC_K * LDSD;
        /* both of the thread's rows see the whole tile: the dk dv kernel wrote all of it, no mask */
        bool full = j0 >= lor[0] && j0 >= lor[1] && j0 + TC_K - 1 <= hir[0];
        if constexpr (WG) {
#ifdef KEEL_WGMMA_BODY
            uint32_t a[TC_K / 16][4];
            if (full)
#pragma unroll
                for (int ks = 0; ks < TC_K / 16; ks++) ds_frag_all(a[ks], Ss, ks, warp, lane);
            else
#pragma unroll
                for (int ks = 0; ks < TC_K / 16; ks++) ds_frag(a[ks], Ss, ks, j0, lor, hir, warp, lane);
            wg_acc_rs<D>(dq, a, Ks);
#endif
        } else {
#pragma unroll
            for (int ks = 0; ks < TC_K / 16; ks++) {
                uint32_t a[4];
                if (full)
                    ds_frag_all(a, Ss, ks, warp, lane);
                else
                    ds_frag(a, Ss, ks, j0, lor, hir, warp, lane);
                mma_ay_step<D, D / 8>(dq, a, Ks, ks * 16, 0, lane);
            }
        }
        __syncthreads(); /* every warp is done with this tile's buffers */
    }
    store_dq<D>(A, dq, out, t0, r0, n, h, b, c);
}

/* dk, dv: a block per 64 keys; warp w takes keys 16 (w % 4) .. + 16 and, of each 64-query tile,
 * queries 32 (w / 4) .. + 32 for S^T and dP^T (8 independent sums in flight a warp), then (P^T and
 * dS^T exchanged through shared memory) head columns (w / 4) D/2 .. + D/2 of dV += P^T dO and
 * dK += dS^T Q. The next query tile
 * is fetched while this one is worked on; tiles no query of which sees the block's keys (another
 * packed example) are skipped, known from each tile's smallest first key (tmin). */
#define TC_BQ 64 /* queries a dk dv tile */
#define LDP   (TC_BQ + 8)

/* the byte offset of (key r, query q) in a P^T or dS^T tile: rows of LDP, or (WG) a swizzled panel */
template <bool WG> __device__ static inline int pt_at(int r, int q) {
    return WG ? wg_at(TC_K, r, q) : (r * LDP + q) * (int)sizeof(bf16);
}

/* the query tile after tile `it` (it = head in the group * nqt + query tile) that sees keys up to
 * jlast, or -1 */
__device__ static int next_tile(int it, int n_it, int nqt, int qfirst, const int *tmin, int64_t jlast) {
    for (it++; it < n_it; it++) {
        int qt = it % nqt;
        if (qt >= qfirst && tmin[qt] <= jlast) return it;
    }
    return -1;
}

/* tile `it` of the dk dv loop into buffers: q and do rows (cp.async), and its rows' lse, delta
 * and positions (cp.async of 4 bytes; past the last query 0) */
template <int D, bool WG>
__device__ static void dkv_fetch(const fa_args &A, int it, int nqt, int64_t h0, int64_t b, bf16 *Qs, bf16 *dOs,
                                 float *ls, float *dl, int *ps) {
    int64_t h = h0 + it / nqt, t0 = (int64_t)(it % nqt) * TC_BQ;
    int n = (int)min((int64_t)TC_BQ, A.Tq - t0);
    tile_fetch<D, WG>(Qs, A.q, h, t0, b, n, TC_BQ);
    tile_fetch<D, WG>(dOs, A.do16, h, t0, b, n, TC_BQ);
    for (int r = threadIdx.x; r < TC_BQ; r += blockDim.x) {
        if (r >= n) {
            ls[r] = dl[r] = 0.0f, ps[r] = 0;
            continue;
        }
        int64_t row = row_of(A, t0 + r, h, b);
        __pipeline_memcpy_async(ls + r, A.o + A.no + row, 4);
        __pipeline_memcpy_async(dl + r, A.delta + row, 4);
        __pipeline_memcpy_async(ps + r, A.pos.p + (t0 + r) * A.pos.nb[0] + (A.pos.ne[1] == 1 ? 0 : b * A.pos.nb[1]), 4);
    }
}

/* d (64 x N) += A B on the warpgroup products, A K-major and B N-major (dk dv's second products) */
template <int N> __device__ static inline void wg_ab_t(float (*d)[4], const bf16 *A_, const bf16 *B_, int kk, int c0) {
#ifdef KEEL_WGMMA_BODY
    if constexpr (N == 128)
        wg_ss_n128_t(d, wg_desc_k(A_, TC_K, kk), wg_desc_n(B_, TC_BQ, kk, c0));
    else
        wg_ss_n64_t(d, wg_desc_k(A_, TC_K, kk), wg_desc_n(B_, TC_BQ, kk, c0));
#endif
}
/* (WG: on the warpgroup products, heads of 128 or 256: the block's warps 4 w .. 4 w + 3 are
 * warpgroup w, whose 64 rows are the block's keys, so each warp keeps its keys and columns above;
 * S^T and dP^T are 16-deep steps over K's (V's) and q's (do's) swizzled panels, the second products
 * read P^T and dS^T from swizzled panels and do's and q's panels transposed; at the 0.8B shape, bf16
 * batch 8 (ncu): 431 us a layer against mma.sync's 549. Measured and not kept: a tile's second
 * products left running into the next tile's first ones, waited for with the next tile's loads
 * behind them: the same bits, 471 us) */
template <int D, bool WG> __global__ void __launch_bounds__(256) k_fa_dkv_tc(fa_args A, float *out) {
#ifndef KEEL_WGMMA_BODY
    if (WG) __trap(); /* launched only where the sm_90a code exists (cuda_impl.wgmma) */
#endif
    extern __shared__ __align__(16) unsigned char sraw[];
    const int LD = WG ? D : D + 8, DH = D / 2, LP = WG ? TC_BQ : LDP;
    bf16 *Ks = (bf16 *)(WG ? wg_aligned(sraw) : sraw), *Vs = Ks + TC_K * LD, *Qb = Vs + TC_K * LD,
         *dOb = Qb + 2 * TC_BQ * LD;
    bf16 *Pt = dOb + 2 * TC_BQ * LD, *dSt = Pt + TC_K * LP;
    float *lsb = (float *)(dSt + TC_K * LP), *dlb = lsb + 2 * TC_BQ; /* a tile's lse, delta, positions */
    int *psb = (int *)(dlb + 2 * TC_BQ), *tmin = psb + 2 * TC_BQ;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int kr = (warp & 3) * 16, qh = warp >> 2, d0 = qh * DH;
    int64_t j0 = (int64_t)blockIdx.z * TC_K, kh = blockIdx.x, zb = blockIdx.y, b = A.b0 + zb, off = A.Tk - A.Tq,
            G = A.H / A.KV; /* the first keys (seen by the most queries) first: see tc_run */
    int nk = (int)min((int64_t)TC_K, A.Tk - j0), nqt = (int)((A.Tq + TC_BQ - 1) / TC_BQ);
    int64_t jlast = j0 + nk - 1, jr[2] = {j0 + kr + g, j0 + kr + g + 8};
    tile_fetch<D, WG>(Ks, A.k, kh, j0, b, nk, TC_K);
    tile_fetch<D, WG>(Vs, A.v, kh, j0, b, nk, TC_K);
    fetch_commit();
    for (int qt = threadIdx.x; qt < nqt; qt += blockDim.x) tmin[qt] = 0x7fffffff;
    __syncthreads();
    for (int64_t r = threadIdx.x; r < A.Tq; r += blockDim.x) atomicMin(&tmin[r / TC_BQ], (int)fa_lo(A, r, b));
    __syncthreads();
    int qfirst = (int)((j0 - off < 0 ? 0 : j0 - off) / TC_BQ), n_it = (int)G * nqt;
    float dk[DH / 8][4], dv[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++)
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    int cur = next_tile(-1, n_it, nqt, qfirst, tmin, jlast);
    if (cur >= 0) dkv_fetch<D, WG>(A, cur, nqt, kh * G, b, Qb, dOb, lsb, dlb, psb);
    fetch_commit();
    for (int i = 0; cur >= 0; i++) {
        int nx = next_tile(cur, n_it, nqt, qfirst, tmin, jlast), bi = i & 1;
        if (nx >= 0) /* the next tile into the other buffers */
            dkv_fetch<D, WG>(A, nx, nqt, kh * G, b, Qb + (bi ^ 1) * TC_BQ * LD, dOb + (bi ^ 1) * TC_BQ * LD,
                             lsb + (bi ^ 1) * TC_BQ, dlb + (bi ^ 1) * TC_BQ, psb + (bi ^ 1) * TC_BQ);
        fetch_commit();
        fetch_wait(1); /* this tile in */
        tile_ready<WG>();
        const bf16 *Qs = Qb + bi * TC_BQ * LD, *dOs = dOb + bi * TC_BQ * LD;
        const float *ls = lsb + bi * TC_BQ, *dl = dlb + bi * TC_BQ;
        const int *ps = psb + bi * TC_BQ;
        int64_t t0 = (int64_t)(cur % nqt) * TC_BQ;
        int n = (int)min((int64_t)TC_BQ, A.Tq - t0);
        float s[4][4], dp[4][4]; /* S^T and dP^T: 16 keys x 32 queries */
#pragma unroll
        for (int k = 0; k < 4; k++)
            s[k][0] = s[k][1] = s[k][2] = s[k][3] = dp[k][0] = dp[k][1] = dp[k][2] = dp[k][3] = 0.0f;
        if constexpr (WG) {
#ifdef KEEL_WGMMA_BODY
            wg_fence();
#pragma unroll 4
            for (int kk = 0; kk < D; kk += 16) {
                wg_ss_n32(s, wg_desc_k(Ks, TC_K, kk), wg_desc_k(Qs, TC_BQ, kk, 32 * qh));
                wg_ss_n32(dp, wg_desc_k(Vs, TC_K, kk), wg_desc_k(dOs, TC_BQ, kk, 32 * qh));
            }
            wg_commit();
            wg_wait0();
#endif
        } else {
            mma_abt2<D, 4>(s, Ks, Qs, dp, Vs, dOs, kr, 32 * qh, lane);
        }
        /* each of the warp's 32 queries sees each of its 16 keys (a lane a query): no mask to test */
        int64_t wj = j0 + kr, wq = t0 + 32 * qh + lane;
        bool full = __all_sync(0xffffffffu, 32 * qh + lane < n && kr + 16 <= nk && wj + 15 <= wq + off &&
                                                wq + off - ps[32 * qh + lane] <= wj);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            float pv[4], dv4[4];
#pragma unroll
            for (int e = 0; e < 4; e++) { /* key jr[e / 2], query q */
                int q = 32 * qh + nt * 8 + 2 * c + (e & 1);
                int64_t j = jr[e >> 1], tq = t0 + q;
                bool in = full || (q < n && j >= tq + off - ps[q] && j <= tq + off); /* fa_lo's mask */
                float p = in ? expf(s[nt][e] * A.scale - ls[q]) : 0.0f;
                pv[e] = p, dv4[e] = in ? p * (dp[nt][e] - dl[q]) : 0.0f;
            }
            int col = 32 * qh + nt * 8 + 2 * c, at0 = pt_at<WG>(kr + g, col), at8 = pt_at<WG>(kr + g + 8, col);
            *(uint32_t *)((char *)Pt + at0) = pack_bf16(pv[0], pv[1]);
            *(uint32_t *)((char *)Pt + at8) = pack_bf16(pv[2], pv[3]);
            *(uint32_t *)((char *)dSt + at0) = pack_bf16(dv4[0], dv4[1]);
            *(uint32_t *)((char *)dSt + at8) = pack_bf16(dv4[2], dv4[3]);
        }
        tile_ready<WG>();
        if (A.ds) /* dS^T for the dq pass: the tile's 64 keys x 64 queries, 16 bytes a copy */
            for (int e = threadIdx.x; e < TC_K * TC_BQ / 8; e += blockDim.x) {
                int r = e / (TC_BQ / 8), q8 = (e % (TC_BQ / 8)) * 8;
                bf16 *dst = (bf16 *)A.ds + ((zb * A.H + kh * G + cur / nqt) * A.ldk + j0 + r) * A.ldq + t0 + q8;
                *(uint4 *)dst = *(const uint4 *)((const char *)dSt + pt_at<WG>(r, q8));
            }
        if constexpr (WG) {
#ifdef KEEL_WGMMA_BODY
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < TC_BQ / 16; ks++) {
                wg_ab_t<DH>(dv, Pt, dOs, ks * 16, d0);
                wg_ab_t<DH>(dk, dSt, Qs, ks * 16, d0);
            }
            wg_commit();
            wg_wait0();
#endif
        } else {
            mma_xy<D, TC_BQ / 16, DH / 8>(dv, Pt, LDP, kr, dOs, d0, lane);
            mma_xy<D, TC_BQ / 16, DH / 8>(dk, dSt, LDP, kr, Qs, d0, lane);
        }
        __syncthreads(); /* every warp is done with this tile's buffers */
        cur = nx;
    }
    int64_t nq = A.D * A.H * A.Tq * A.B, nkk = A.D * A.KV * A.Tk * A.B;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (kr + g + 8 * i >= nk) continue;
        int64_t r = (b * A.Tk + jr[i]) * A.KV + kh;
#pragma unroll
        for (int dt = 0; dt < DH / 8; dt++) {
            int col = d0 + dt * 8 + 2 * c;
            *(float2 *)(out + nq + r * D + col) = make_float2(A.scale * dk[dt][2 * i], A.scale * dk[dt][2 * i + 1]);
            *(float2 *)(out + nq + nkk + r * D + col) = make_float2(dv[dt][2 * i], dv[dt][2 * i + 1]);
        }
    }
}

/* The dk dv kernel's shared memory: K, V, two tiles of q and do, P^T and dS^T, a tile's statistics,
 * and each query tile's first key (so it grows with Tq) */
static size_t dkv_tc_smem(int64_t D, int64_t Tq, bool wg) {
    return (wg ? WG_ALIGN + (2 * TC_K + 4 * TC_BQ) * D * sizeof(bf16) + 2 * TC_K * TC_BQ * sizeof(bf16)
               : (2 * TC_K + 4 * TC_BQ) * (D + 8) * sizeof(bf16) + 2 * TC_K * LDP * sizeof(bf16)) +
           6 * TC_BQ * sizeof(float) + (size_t)((Tq + TC_BQ - 1) / TC_BQ) * sizeof(int);
}
#define TC_SMEM_MAX (227 * 1024) /* the most shared memory a block may opt in to on sm_90 */

/* Grids put the tile index last (blockIdx.z), heads and examples first, and the kernels number
 * tiles so the ones with the most causal work start first: blocks are handed out in order, and a
 * long block started last would run alone at the end. Which block owns which tile, and so every
 * sum, does not depend on the order. */
template <int D, bool WG>
static int tc_launch(keel_backend *be, const keel_tensor *t, fa_args &A, float *out, bool back, int64_t nb) {
    size_t row = (WG ? D : D + 8) * sizeof(bf16), al = WG ? WG_ALIGN : 0;
    if (!back) {
        dim3 grid((unsigned)A.H, (unsigned)A.B, (unsigned)((A.Tq + TC_Q - 1) / TC_Q));
        size_t shm = al + (TC_Q + 2 * TC_K) * row + TC_Q * sizeof(int);
        TILE_LAUNCH((k_fa_fwd_tc<D, WG>), grid, 128, shm, "attention forward (tensor cores) launch", A, out);
        return 0;
    }
    /* dk dv on the warpgroup products for heads of 128 and 256 (the second products' halves of the
     * columns are whole panels) */
    const bool wk = WG && D >= 128;
    size_t sk = dkv_tc_smem(D, A.Tq, wk);
    if (!nb) { /* dq recomputes S and dP */
        size_t rt = (D + 8) * sizeof(bf16);
        dim3 gq((unsigned)((A.Tq + TC_Q - 1) / TC_Q), (unsigned)A.H, (unsigned)A.B);
        size_t sq = (2 * TC_Q + 2 * TC_B) * rt + 3 * TC_Q * sizeof(float);
        TILE_LAUNCH(k_fa_dq_tc<D>, gq, 128, sq, "attention dq (tensor cores) launch", A, out);
        dim3 gk((unsigned)A.KV, (unsigned)A.B, (unsigned)((A.Tk + TC_K - 1) / TC_K));
        TILE_LAUNCH((k_fa_dkv_tc<D, wk>), gk, 256, sk, "attention dk, dv (tensor cores) launch", A, out);
        return 0;
    }
    /* a slab of nb examples at a time: dk dv (writing dS), then dq from dS */
    size_t sq = al + 2 * TC_K * row + 2 * TC_K * LDSD * sizeof(bf16) + TC_Q * sizeof(int);
    for (A.b0 = 0; A.b0 < A.B; A.b0 += nb) {
        unsigned z = (unsigned)(A.B - A.b0 < nb ? A.B - A.b0 : nb);
        dim3 gk((unsigned)A.KV, z, (unsigned)((A.Tk + TC_K - 1) / TC_K));
        TILE_LAUNCH((k_fa_dkv_tc<D, wk>), gk, 256, sk, "attention dk, dv, dS (tensor cores) launch", A, out);
        dim3 gq((unsigned)A.H, z, (unsigned)((A.Tq + TC_Q - 1) / TC_Q));
        TILE_LAUNCH((k_fa_dq_ds_tc<D, WG>), gq, 128, sq, "attention dq from dS (tensor cores) launch", A, out);
    }
    A.b0 = 0;
    return 0;
}
/* the kernels on Hopper's warpgroup products where the device has them (cuda_impl.wgmma), else on
 * mma.sync */
template <int D>
static int tc_run(keel_backend *be, const keel_tensor *t, fa_args &A, float *out, bool back, int64_t nb) {
    return cuda_im(be)->wgmma ? tc_launch<D, true>(be, t, A, out, back, nb)
                              : tc_launch<D, false>(be, t, A, out, back, nb);
}

/* The tensor-core form reads q, k, v rows by 16-byte copies; its backward's dk dv block holds a word
 * per query tile (windows past about 150k queries at heads of 256 take the float32 tiles) */
static bool tc_fits(const keel_tensor *t) {
    const keel_tensor *q = t->src[0];
    if (q->type != KEEL_BF16 || q->ne[0] != t->src[2]->ne[0] || (q->ne[0] != 64 && q->ne[0] != 128 && q->ne[0] != 256))
        return false;
    if (t->op == KEEL_OP_FLASH_ATTN_BACK && dkv_tc_smem(q->ne[0], q->ne[2], false) > TC_SMEM_MAX) return false;
    for (int i = 0; i < 3; i++) {
        const keel_tensor *x = t->src[i];
        if (x->nb[0] != 2 || ((uintptr_t)x->data & 15) || (x->nb[1] | x->nb[2] | x->nb[3]) & 15) return false;
    }
    return true;
}

static size_t fwd_smem(const fa_args &A) {
    size_t ldd = PAD_LD(A.D), ldv = PAD_LD(A.Dv);
    return (FA_QT * ldd + FA_KT * ldd + FA_KT * ldv + FA_QT * LDK + FA_QT * ldv + 4 * FA_QT) * sizeof(float);
}
static size_t dq_smem(const fa_args &A) {
    size_t ldd = PAD_LD(A.D), ldv = PAD_LD(A.Dv);
    return (2 * FA_BT * ldd + FA_BT * ldv + FA_KT * ldd + FA_KT * ldv + 2 * FA_BT * LDK + 3 * FA_BT) * sizeof(float);
}
static size_t dkv_smem(const fa_args &A) {
    size_t ldd = PAD_LD(A.D), ldv = PAD_LD(A.Dv);
    return (2 * FA_KT * (ldd + ldv) + FA_BT * (ldd + ldv) + 2 * FA_KT * LDK + 3 * FA_BT) * sizeof(float);
}

bool cuda_flash_attn_supports(const keel_tensor *t) {
    const keel_tensor *q = t->src[0], *v = t->src[2];
    return q->ne[0] <= FA_MAXD && v->ne[0] <= FA_MAXD && q->ne[1] <= 65535 && q->ne[3] <= 65535 &&
           t->src[1]->ne[1] <= 65535 && q->ne[2] / TC_Q < 65535 && t->src[1]->ne[2] / TC_K < 65535;
}

/* q, k, v as float32 tensors the kernels read: themselves, or widened copies in scratch */
static int widen(keel_backend *be, const keel_tensor *t, float *scr, keel_tensor *w) {
    for (int i = 0; i < 3; i++) {
        w[i] = *t->src[i];
        if (w[i].type == KEEL_F32) continue;
        w[i].type = KEEL_F32;
        w[i].view_src = NULL;
        keel_set_contiguous_strides(&w[i]);
        w[i].data = scr;
        scr += keel_nelements(&w[i]);
        if (cuda_copy(be, &w[i], t->src[i], false)) return -1;
    }
    return 0;
}

/* The tensor-core backward's dS pass: examples a slab (as many as KEEL_CUDA_FA_DS_BYTES, default
 * 256 MiB, holds of bf16 dS^T, [H][Tk][Tq] an example with both rounded up to 64), or 0 where not
 * even one fits (long windows: dq then recomputes S and dP itself). */
static int64_t ds_slab(const keel_tensor *t, int64_t *ldk, int64_t *ldq) {
    const keel_tensor *q = t->src[0];
    *ldk = (t->src[1]->ne[2] + TC_K - 1) / TC_K * TC_K, *ldq = (q->ne[2] + TC_Q - 1) / TC_Q * TC_Q;
    const char *env = getenv("KEEL_CUDA_FA_DS_BYTES");
    double budget = env && *env ? strtod(env, NULL) : 256.0 * 1024 * 1024;
    double per = (double)q->ne[1] * (double)*ldk * (double)*ldq * sizeof(bf16);
    int64_t nb = per > 0 && budget > 0 ? (int64_t)(budget / per) : 0; /* (a negative or NaN budget: 0) */
    return nb < q->ne[3] ? nb : q->ne[3];
}

/* Floats of scratch: widened copies of bf16 q, k, v for the float32 tiles; in the backward, delta
 * a row (rounded up to 4) and, for the tensor-core kernels, dO as bf16 in floats' room, then a
 * slab's dS (in floats' room, 16-byte aligned). */
static void scratch_parts(const keel_tensor *t, size_t *wide, size_t *back_floats, size_t *ds_floats) {
    const keel_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
    bool back = t->op == KEEL_OP_FLASH_ATTN_BACK, tc = tc_fits(t);
    size_t rows = (size_t)(q->ne[1] * q->ne[2] * q->ne[3]), no = (size_t)v->ne[0] * rows;
    *wide = q->type == KEEL_F32 || tc ? 0 : (size_t)(keel_nelements(q) + keel_nelements(k) + keel_nelements(v));
    *back_floats = back ? (rows + 3) / 4 * 4 + (tc ? (no + 7) / 8 * 4 : 0) : 0;
    int64_t ldk, ldq, nb = back && tc ? ds_slab(t, &ldk, &ldq) : 0;
    *ds_floats = nb ? (size_t)(nb * q->ne[1] * ldk * ldq / 2) : 0;
}

size_t cuda_flash_attn_scratch(const keel_tensor *t) {
    size_t wide, bf, dsf;
    scratch_parts(t, &wide, &bf, &dsf);
    return t->src[0]->ne[1] * t->src[0]->ne[2] * t->src[0]->ne[3] == 0 ? 0 : (wide + bf + dsf) * sizeof(float);
}

int cuda_flash_attn(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
    bool back = t->op == KEEL_OP_FLASH_ATTN_BACK;
    fa_args A;
    memset(&A, 0, sizeof A);
    A.D = q->ne[0], A.H = q->ne[1], A.Tq = q->ne[2], A.B = q->ne[3], A.KV = k->ne[1], A.Tk = k->ne[2], A.Dv = v->ne[0];
    A.no = A.Dv * A.H * A.Tq * A.B, A.scale = (float)t->fp[0];
    int64_t rows = A.H * A.Tq * A.B;
    if (rows == 0) return 0;
    bool tc = tc_fits(t);
    size_t wide, back_floats, ds_floats;
    scratch_parts(t, &wide, &back_floats, &ds_floats);
    float *scr = NULL;
    if (wide || back) {
        scr = (float *)cuda_scratch(be, (wide + back_floats + ds_floats) * sizeof(float), t);
        if (!scr) return -1;
    }
    int64_t nb = 0;
    if (ds_floats) nb = ds_slab(t, &A.ldk, &A.ldq), A.ds = scr + wide + back_floats;
    keel_tensor w[3];
    if (!tc && widen(be, t, scr, w)) return -1;
    A.q = kt_of(tc ? q : &w[0]), A.k = kt_of(tc ? k : &w[1]), A.v = kt_of(tc ? v : &w[2]), A.pos = kt_of(t->src[3]);
    float *out = (float *)t->data;
    cudaStream_t st = cuda_im(be)->stream;
    if (back) {
        A.o = (const float *)t->src[4]->data, A.dO = (const float *)t->src[5]->data, A.delta = scr + wide;
        A.dlse = keel_nelements(t->src[5]) > A.no ? A.dO + A.no : NULL;
        if (tc) { /* [Dv,H,Tq,B] bf16, contiguous, after delta (16-byte aligned: rows of 64+ bf16) */
            A.do16.p = (char *)(A.delta + (rows + 3) / 4 * 4);
            A.do16.ne[0] = A.Dv, A.do16.ne[1] = A.H, A.do16.ne[2] = A.Tq, A.do16.ne[3] = A.B;
            A.do16.nb[0] = 2, A.do16.nb[1] = 2 * A.Dv, A.do16.nb[2] = 2 * A.Dv * A.H,
            A.do16.nb[3] = 2 * A.Dv * A.H * A.Tq;
            A.do16.type = KEEL_BF16, A.do16.contig = 1;
        }
        k_fa_delta<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, st>>>(A);
        if (cuda_check(cudaGetLastError(), "attention backward's row sums launch", t)) return -1;
    }
    if (tc)
        return A.D == 256   ? tc_run<256>(be, t, A, out, back, nb)
               : A.D == 128 ? tc_run<128>(be, t, A, out, back, nb)
                            : tc_run<64>(be, t, A, out, back, nb);
    if (!back) {
        dim3 grid((unsigned)((A.Tq + FA_QT - 1) / FA_QT), (unsigned)A.H, (unsigned)A.B);
        TILE_LAUNCH(k_fa_fwd, grid, NT, fwd_smem(A), "attention forward launch", A, out);
        return 0;
    }
    dim3 gq((unsigned)((A.Tq + FA_BT - 1) / FA_BT), (unsigned)A.H, (unsigned)A.B);
    TILE_LAUNCH(k_fa_dq, gq, NT, dq_smem(A), "attention dq launch", A, out);
    dim3 gk((unsigned)((A.Tk + FA_KT - 1) / FA_KT), (unsigned)A.KV, (unsigned)A.B);
    TILE_LAUNCH(k_fa_dkv, gk, NT, dkv_smem(A), "attention dk, dv launch", A, out);
    return 0;
}
