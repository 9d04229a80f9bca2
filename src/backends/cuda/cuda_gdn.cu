/* keel: the gated delta rule on CUDA in the chunked (WY) form, forward and backward, float32 (with
 * the op's ip0, TC below: the per-chunk products on the tensor cores, 1 in split TF32, 2 in split bf16;
 * 3, the bf16 mode's variant, runs the forward as 2 and the backward's products on one bf16 part of
 * each operand, PR 3: see bmm_tc; the arrays only those products read, Uc, Kb, Ac and Am, it keeps
 * in bf16: gdn_scr).
 *
 * Per (batch, value head) lane the recurrence is, with the state S (Dk x Dv), for each step t:
 * S = e^g_t S (0 where an example starts);  u_t = beta_t (v_t - S^T k_t);  S = S + k_t u_t^T;
 * o_t = S^T q_t. Over a chunk of CH steps starting from the state S, with G_t the sum of g since
 * the chunk's start (or since an example start inside it), Gam_t = e^G_t (0 once an example has
 * started in the chunk) and D_ts = e^(G_t - G_s) for s <= t in the same example (else 0):
 *   (I + M) U = diag(beta) V - diag(beta Gam) K S,   M_ts = beta_t D_ts k_t.k_s (s < t)
 *   O = diag(Gam) Q S + (D o Q K^T) U,   S_next = Gam_C S + (diag(D_C) K)^T U,
 * with D_C the decays to the chunk's last step. So with A = (I + M)^-1, W = A diag(beta Gam) K and
 * U0 = A diag(beta) V (no dependence on S), U = U0 - W S, and only the chunk-to-chunk state pass
 * is sequential. Every part is a small matrix product over a chunk's rows.
 *
 * Kernels: prep (per chunk: decays, A by blocks in float64, W, U0, and the scaled rows the other
 * passes read); the state pass, the only sequential one (per lane and block of JB value columns:
 * column j of S only ever meets column j of U, V, O; two products a chunk, U = U0 - W S and
 * S = Gam_C S + Kc^T U, keeping S and U of every chunk); then the output per chunk, O = Qg S + Pm U
 * (the tensor-core state pass makes it itself, chunk by chunk, from the S and U it holds).
 * The backward runs prep and the state pass again, then per chunk dR0 = A^T Pm^T dO and
 * G0 = Qg^T dO; its reverse state pass carries dS back (dR = dR0 + (A^T Kc) dS, dS <- Gam_C dS +
 * G0 - Kb^T dR), and two per-chunk passes finish dq, dk, dg, dbeta from the contractions over value
 * columns. Inputs reach shared memory by asynchronous copies (cp.async): every element of a tile
 * in flight at once, and the sequential passes fetch the next chunk's rows during this one's products.
 * Every element of every product is summed by one thread in a fixed order (on the tensor cores, by
 * one warp's tile in a fixed order: bmm_tc) and every reduction has a fixed tree: no atomics, and
 * the work is split by shapes only, so results repeat bitwise and do not depend on the GPU. Decays
 * are exponents of non-positive differences of float64 sums (a float sum of large gates would lose a
 * small difference). */
#include <cuda_pipeline_primitives.h>

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_tile.cuh"

#define CH  64 /* steps in a chunk (decay_load's scan takes two a lane) */
#define JB  32 /* value columns per block of the sequential passes */
#define JO  64 /* value columns per block of the per-chunk output passes */
#define LDO PAD_LD(JO)
#define LDC PAD_LD(CH)
#define LDJ PAD_LD(JB)

typedef struct {
    kt q, k, v, g, beta, pos, dO, s0;
    int64_t Dk, Hk, T, B, Dv, Hv;
    int half; /* Uc, Kb, Ac and Am in bf16 (gdn_scr) */
} gdn_args;

/* Scratch, per lane l and chunk c at lc = l * nc + c, rows of a chunk at stride CH. */
typedef struct {
    float *W, *Qg, *Kc, *Kb,
        *Ac;        /* [lc][CH][Dk]: A diag(beta Gam) K, diag(Gam) Q, diag(D_C) K, diag(beta Gam) K, A^T Kc */
    float *U0;      /* [lc][CH][Dv]: A diag(beta) V */
    float *Pm, *Am; /* [lc][CH][CH]: D o Q K^T (lower), A */
    /* With gdn_args' half (ip0 3, whose backward reads Uc, Kb, Ac and Am only as operands of its
     * products in one bf16 part; Dk and Dv multiples of 32 up to STATE_TC_MAX, where the forward's
     * output is the tensor-core state pass's, which does not read Uc back), those four hold bf16 values
     * (uint16_t, half the bytes), each the float32 value rounded as those products round it: the same
     * bits, half the traffic. */
    float *GamC;    /* [lc] the decay across the whole chunk */
    float *Sc, *Uc; /* [lc][Dk][Dv] the state entering the chunk, [lc][CH][Dv] U */
    /* backward */
    float *dSc;             /* [lc][Dk][Dv]: G0 = Qg^T dO, then the gradient of the state leaving the chunk */
    float *dR;              /* [lc][CH][Dv]: dR0 = A^T Pm^T dO, then dR = A^T dU */
    float *dQa, *dKa, *dKb; /* [lc][CH][Dk]: dO S^T, U dS_next^T, dR S^T */
    float *dPm, *dMm;       /* [lc][CH][CH]: dO U^T, -dR U^T */
    float *r3, *dGamC;      /* [lc][CH]: rows of dR o V; [lc]: sum of S o dS_next */
    float *Pd16, *E16;      /* [lc][CH][CH] bf16, with half: the gradient pass's scaled dPm and dMm (below) */
    /* With half, the reverse state pass also keeps dR (once made) as bf16 where its floats were, a block
     * of JB columns' values in the first half of their floats' bytes, and makes r3 itself, a part a
     * block of JB columns ([lc][Dv / JB][CH], the contractions' sums of the same terms in the same
     * order), which the gradient pass adds in order as the contractions added them. */
    int64_t nc;
} gdn_scr;

/* The decays of chunk [t0, t0 + n) of lane (b, hv), in shared memory: seg[t] the step of the
 * chunk where the example holding t starts (-1: before the chunk), G[t] the sum of g since then,
 * Gam[t] the decay of the incoming state (0 once an example started), DC[t] the decay from t to
 * the chunk's last step (0 across a start), bt[t] beta. */
typedef struct {
    double *G;
    int *seg;
    float *Gam, *DC, *bt;
} chunk_decay;

__device__ static void decay_load(const gdn_args &A, chunk_decay d, int64_t b, int64_t hv, int64_t t0, int n) {
    for (int t = threadIdx.x; t < n; t += blockDim.x) { /* parallel loads, then one thread's scan */
        d.G[t] = (double)ldf(kt_at(A.g, hv, t0 + t, b, 0));
        d.seg[t] = pos_at(A.pos, t0 + t, b) == 0 ? t : -1;
        d.bt[t] = ldf(kt_at(A.beta, hv, t0 + t, b, 0));
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* the sums since the example's start: a segmented scan, one warp, two steps a lane */
        int lane = threadIdx.x, ta = 2 * lane, tb = ta + 1;
        bool fa = ta < n && d.seg[ta] == ta, fb = tb < n && d.seg[tb] == tb; /* an example starts there */
        double va = ta < n && !fa ? d.G[ta] : 0.0, vb = tb < n && !fb ? d.G[tb] : 0.0;
        /* the pair's sum (since a start inside it) and last start, then Hillis-Steele over the pairs
         * in a fixed tree: an earlier part (ov, of) adds to a later (pv, pf) unless pf (a start) */
        double pv = fb ? vb : va + vb;
        bool pf = fa || fb;
        int ps = fb ? tb : fa ? ta : -1;
        for (int k = 1; k < 32; k <<= 1) {
            double ov = __shfl_up_sync(0xffffffffu, pv, k);
            int of = __shfl_up_sync(0xffffffffu, (int)pf, k), os = __shfl_up_sync(0xffffffffu, ps, k);
            if (lane >= k) {
                if (!pf) pv = ov + pv;
                pf = pf || of, ps = ps > os ? ps : os;
            }
        }
        /* what the pairs before this one leave: their sum since the last start, and that start */
        double ev = __shfl_up_sync(0xffffffffu, pv, 1);
        int es = __shfl_up_sync(0xffffffffu, ps, 1);
        if (lane == 0) ev = 0.0, es = -1;
        double ga = fa ? 0.0 : ev + va;
        if (ta < n) d.G[ta] = ga, d.seg[ta] = fa ? ta : es;
        if (tb < n) d.G[tb] = fb ? 0.0 : ga + vb, d.seg[tb] = fb ? tb : fa ? ta : es;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        d.Gam[t] = d.seg[t] < 0 ? expf((float)d.G[t]) : 0.0f;
        d.DC[t] = d.seg[t] == d.seg[n - 1] ? expf((float)(d.G[n - 1] - d.G[t])) : 0.0f;
    }
    __syncthreads();
}

__device__ static inline float dmask(const chunk_decay &d, int t, int s) {
    return s <= t && d.seg[t] == d.seg[s] ? expf((float)(d.G[t] - d.G[s])) : 0.0f;
}

/* shared layout of a chunk_decay: CH doubles, CH ints, 3 CH floats */
#define DECAY_BYTES (CH * (sizeof(double) + sizeof(int) + 3 * sizeof(float)))
__device__ static chunk_decay decay_at(void *base) {
    chunk_decay d;
    d.G = (double *)base, d.seg = (int *)(d.G + CH), d.Gam = (float *)(d.seg + CH), d.DC = d.Gam + CH, d.bt = d.DC + CH;
    return d;
}

/* Row t = threadIdx.x / 4 of A o B summed over its jw columns (row stride ld), 4 threads a row, each
 * every 4th column from its own, then quad_sum: r3's sums of a block of value columns. The reverse
 * state pass makes them in the bf16 mode (dR stored in bf16) and the contractions otherwise; one
 * sequence, so both give the same bits. Every thread of the block calls it (quad_sum's shuffles);
 * *row is t, and the thread with t < n and threadIdx.x % 4 == 0 holds the row's sum. */
__device__ static inline float row_dot4(const float *A, const float *B, int ld, int n, int jw, int *row) {
    int t = (int)threadIdx.x >> 2;
    float s = 0.0f;
    for (int x = (int)threadIdx.x & 3; t < n && x < jw; x += 4) s += A[t * ld + x] * B[t * ld + x];
    *row = t;
    return quad_sum(s);
}

__device__ static inline int chunk_len(int64_t T, int64_t c) { return (int)(T - c * CH < CH ? T - c * CH : CH); }

/* A = (I + M)^-1 in float64 for a strictly lower M (CH x CH, zero past the chunk's rows): the
 * 16 x 16 diagonal blocks by forward substitution (a thread a column), then the blocks below them
 * one block diagonal at a time, A_IJ = -A_II sum_{J<=K<I} M_IK A_KJ. T: 3 x 16 x 16 doubles. */
#define SB 16
__device__ static void invert_unit_lower(const float *M, double *Ad, double *T) {
    for (int e = threadIdx.x; e < CH * CH; e += blockDim.x) Ad[e] = 0.0;
    __syncthreads();
    if (threadIdx.x < CH) { /* the column in registers, the loops unrolled: the chain of subtractions
                               * no longer waits on shared memory (the solve was a fifth of prep) */
        int j = threadIdx.x, I0 = j / SB * SB, jj = j - I0;
        double x[SB];
#pragma unroll
        for (int t = 0; t < SB; t++) {
            /* the terms before jj are - M 0 and leave s at +0, as not adding them does (finite M) */
            double s = t == jj ? 1.0 : 0.0;
#pragma unroll
            for (int p = 0; p < t; p++) s -= (double)M[(I0 + t) * LDC + I0 + p] * x[p];
            x[t] = t < jj ? 0.0 : s;
        }
#pragma unroll
        for (int t = 0; t < SB; t++) Ad[(I0 + t) * CH + j] = x[t];
    }
    __syncthreads();
    /* the blocks below, a thread an element (r, c) of each block of the diagonal: their sums side by
     * side (each still in order over its depth), so that one waits less on the one before */
    static_assert(NT == SB * SB, "a thread an element of a 16 x 16 block");
    int r = (int)threadIdx.x / SB, c = (int)threadIdx.x % SB;
#pragma unroll
    for (int dd = 1; dd < CH / SB; dd++) {
        constexpr int NBMAX = CH / SB - 1;
        int nblk = CH / SB - dd;
        double s[NBMAX];
#pragma unroll
        for (int J = 0; J < NBMAX; J++) s[J] = 0.0;
        for (int K = 0; K < dd; K++) /* by blocks of SB, unrolled: the loads ahead of the sums */
#pragma unroll
            for (int qq = 0; qq < SB; qq++)
#pragma unroll
                for (int J = 0; J < NBMAX; J++)
                    if (J < nblk) {
                        int q = (J + K) * SB + qq;
                        s[J] += (double)M[((J + dd) * SB + r) * LDC + q] * Ad[q * CH + J * SB + c];
                    }
#pragma unroll
        for (int J = 0; J < NBMAX; J++)
            if (J < nblk) T[J * SB * SB + r * SB + c] = s[J];
        __syncthreads();
#pragma unroll
        for (int J = 0; J < NBMAX; J++) s[J] = 0.0;
#pragma unroll
        for (int q = 0; q < SB; q++)
#pragma unroll
            for (int J = 0; J < NBMAX; J++)
                if (J < nblk) s[J] -= Ad[((J + dd) * SB + r) * CH + (J + dd) * SB + q] * T[J * SB * SB + q * SB + c];
#pragma unroll
        for (int J = 0; J < NBMAX; J++)
            if (J < nblk) Ad[((J + dd) * SB + r) * CH + J * SB + c] = s[J];
        __syncthreads();
    }
}

/* shared floats of prep's Q, which later holds A in float64, then Kc; doubles of the solve's T */
#define PREP_T (3 * SB * SB)
__host__ __device__ static inline int prep_q_floats(int Dk) {
    return CH * PAD_LD(Dk) > 2 * CH * CH ? CH * PAD_LD(Dk) : 2 * CH * CH;
}

/* The columns of V a block of prep can hold in `room` floats of shared memory: all Dv, or the most
 * (a multiple of 4) whose CH rows fit. */
__device__ static int v_cols(int room, int Dv) {
    int vb = Dv;
    while (vb > 4 && CH * PAD_LD(vb) > room) vb = (vb - 1) / 4 * 4 > 4 ? (vb - 1) / 4 * 4 : 4;
    return vb;
}

/* Per chunk (grid: chunks x lanes): decays, A, W, U0, the scaled rows; the backward's A, Kb, A^T Kc. */
template <int TC> __global__ void __launch_bounds__(NT) k_gdn_prep(gdn_args A, gdn_scr P, int bwd) {
    extern __shared__ double smd[];
    int64_t c = blockIdx.x, l = blockIdx.y, b = l / A.Hv, hv = l % A.Hv, hk = hv / (A.Hv / A.Hk);
    int64_t t0 = c * CH, lc = l * P.nc + c;
    int n = chunk_len(A.T, c), Dk = (int)A.Dk, Dv = (int)A.Dv, ldk = PAD_LD(Dk);
    bool half = TC == 2 && bwd && A.half; /* ip0 3's forward runs as 2 */
    chunk_decay d = decay_at(smd);
    float *Q = (float *)((char *)smd + DECAY_BYTES), *K = Q + prep_q_floats(Dk) + 2 * PREP_T, *M = K + CH * ldk,
          *Pm = M + CH * LDC, *Vt = Q; /* V's columns take Q's space (and on, see below) */
    double *Ad = (double *)Q, *T = (double *)(Q + prep_q_floats(Dk)); /* A in float64 takes Q's space */
    fetch_rows(Q, ldk, A.q, hk, t0, b, n, 0, Dk);
    fetch_rows(K, ldk, A.k, hk, t0, b, n, 0, Dk);
    fetch_commit();
    decay_load(A, d, b, hv, t0, n); /* while the tiles are in flight */
    fetch_wait(0);
    __syncthreads();
    bmm_sel<TC, false, true>(M, LDC, K, ldk, K, ldk, n, n, Dk, 1.0f, 0.0f, false);
    bmm_sel<TC, false, true>(Pm, LDC, Q, ldk, K, ldk, n, n, Dk, 1.0f, 0.0f, false);
    int64_t rk = lc * CH * (int64_t)Dk;
    grid_walk(n, Dk, [&](int t, int i) {
        P.Qg[rk + t * Dk + i] = d.Gam[t] * Q[t * ldk + i];
    });
    __syncthreads();
    for (int e = threadIdx.x; e < CH * CH; e += NT) {
        int t = e / CH, s = e - t * CH;
        bool in = t < n && s < n;
        float D = in ? dmask(d, t, s) : 0.0f;
        M[t * LDC + s] = in && s < t ? d.bt[t] * D * M[t * LDC + s] : 0.0f;
        if (in) Pm[t * LDC + s] = D * Pm[t * LDC + s];
    }
    __syncthreads();
    invert_unit_lower(M, Ad, T);
    /* M <- A, Pm (once written out) <- A diag(beta), for U0 = A diag(beta) V */
    grid_walk(n, n, [&](int t, int s) {
        float a = (float)Ad[t * CH + s];
        P.Pm[lc * CH * CH + t * CH + s] = Pm[t * LDC + s];
        if (half)
            ((uint16_t *)P.Am)[lc * CH * CH + t * CH + s] = bf16_of(a);
        else if (bwd)
            P.Am[lc * CH * CH + t * CH + s] = a;
        M[t * LDC + s] = a;
        Pm[t * LDC + s] = (float)(Ad[t * CH + s] * (double)d.bt[s]);
    });
    /* V for U0 = A diag(beta) V, as many columns at a time as fit (all of them at the 0.8B's
     * shape, one fetch and one product that keeps every thread busy): the forward puts them in
     * Q's and T's space, free once Ad is read, so they are in flight during the W product; the
     * backward also needs Q (Kc, for A^T Kc), so there that product comes first and V then takes
     * the same space, in flight during the W product (fetched after both products, V waited a
     * memory latency with nothing else to do: 6% of the pass's stall samples, ncu). The same
     * sums (each element's over the chunk in order) either way. */
    int vb = v_cols(prep_q_floats(Dk) + 2 * PREP_T, Dv), ldv = PAD_LD(vb);
    __syncthreads(); /* Ad is read: Q's space takes Kc (backward) or V (forward) */
    if (!bwd) {
        fetch_rows(Vt, ldv, A.v, hv, t0, b, n, 0, vb);
        fetch_commit();
    }
    grid_walk(n, Dk, [&](int t, int i) {
        float kc = d.DC[t] * K[t * ldk + i], kb = d.bt[t] * d.Gam[t] * K[t * ldk + i];
        P.Kc[rk + t * Dk + i] = kc;
        if (bwd) Q[t * ldk + i] = kc;
        K[t * ldk + i] = kb;
        if (half)
            ((uint16_t *)P.Kb)[rk + t * Dk + i] = bf16_of(kb);
        else if (bwd)
            P.Kb[rk + t * Dk + i] = kb;
    });
    if (threadIdx.x == 0) P.GamC[lc] = d.Gam[n - 1];
    __syncthreads();
    if (bwd) {
        if constexpr (TC == 2)
            if (half) bmm_tc<2, true, false>((uint16_t *)P.Ac + rk, Dk, M, LDC, Q, ldk, n, Dk, n, 1.0f, 0.0f, false);
        if (!half) bmm_sel<TC, true, false>(P.Ac + rk, Dk, M, LDC, Q, ldk, n, Dk, n, 1.0f, 0.0f, false);
        __syncthreads(); /* Kc is read: V's first columns take its space */
        fetch_rows(Vt, ldv, A.v, hv, t0, b, n, 0, vb);
        fetch_commit();
    }
    bmm_sel<TC, false, false>(P.W + rk, Dk, M, LDC, K, ldk, n, Dk, n, 1.0f, 0.0f, false);
    for (int j0 = 0; j0 < Dv; j0 += vb) {
        int jw = Dv - j0 < vb ? Dv - j0 : vb;
        if (j0 > 0) {
            __syncthreads(); /* the products before have read the previous columns */
            fetch_rows(Vt, ldv, A.v, hv, t0, b, n, j0, jw);
            fetch_commit();
        }
        fetch_wait(0);
        __syncthreads();
        bmm_sel<TC, false, false>(P.U0 + lc * CH * (int64_t)Dv + j0, Dv, Pm, LDC, Vt, ldv, n, jw, n, 1.0f, 0.0f, false);
    }
}

static size_t prep_smem(int64_t Dk) {
    return DECAY_BYTES + (size_t)(prep_q_floats((int)Dk) + 2 * PREP_T + CH * PAD_LD(Dk) + 2 * CH * LDC) * sizeof(float);
}

/* The state pass (grid: lanes x blocks of JB value columns), chunk after chunk: keeps S, then
 * U = U0 - W S (kept), S = Gam_C S + Kc^T U. The next chunk's W is fetched during the S update and
 * its Kc during the next U: two batches of copies in flight, W and U0 ahead of Kc. The decoding
 * variant starts from s0 and writes the final state after the outputs in packed. */
__global__ void __launch_bounds__(NT) k_gdn_state(gdn_args A, gdn_scr P, float *packed) {
    extern __shared__ float sm[];
    int64_t l = blockIdx.x, b = l / A.Hv, hv = l % A.Hv, j0 = (int64_t)blockIdx.y * JB;
    int Dk = (int)A.Dk, Dv = (int)A.Dv, ldk = PAD_LD(Dk), jw = (int)(Dv - j0 < JB ? Dv - j0 : JB);
    float *S = sm, *Xw = S + Dk * LDJ, *Xk = Xw + CH * ldk, *U = Xk + CH * ldk;
    for (int e = threadIdx.x; e < Dk * jw; e += NT) {
        int i = e / jw, x = e - i * jw;
        S[i * LDJ + x] = A.s0.p ? ldf(kt_at(A.s0, j0 + x, i, hv, b)) : 0.0f;
    }
    int64_t rk = l * P.nc * CH * (int64_t)Dk, rv = l * P.nc * CH * (int64_t)Dv + j0;
    fetch_mat(Xw, ldk, P.W + rk, Dk, chunk_len(A.T, 0), Dk);
    fetch_mat(U, LDJ, P.U0 + rv, Dv, chunk_len(A.T, 0), jw);
    fetch_commit();
    fetch_mat(Xk, ldk, P.Kc + rk, Dk, chunk_len(A.T, 0), Dk);
    fetch_commit();
    for (int64_t c = 0; c < P.nc; c++) {
        int64_t lc = l * P.nc + c;
        int n = chunk_len(A.T, c), n1 = c + 1 < P.nc ? chunk_len(A.T, c + 1) : 0;
        rk = lc * CH * (int64_t)Dk, rv = lc * CH * (int64_t)Dv + j0;
        fetch_wait(1); /* W and U0 of this chunk */
        __syncthreads();
        store_mat(P.Sc + lc * Dk * (int64_t)Dv + j0, Dv, S, LDJ, Dk, jw);
        bmm<false, false, 2>(U, LDJ, Xw, ldk, S, LDJ, n, jw, Dk, -1.0f, 1.0f, true); /* 2 rows a thread: all busy */
        __syncthreads();
        fetch_mat(Xw, ldk, P.W + rk + CH * Dk, Dk, n1, Dk);
        fetch_commit();
        fetch_wait(1); /* Kc of this chunk */
        __syncthreads();
        store_mat(P.Uc + rv, Dv, U, LDJ, n, jw);
        bmm<true, false>(S, LDJ, Xk, ldk, U, LDJ, Dk, jw, n, 1.0f, P.GamC[lc], true);
        __syncthreads();
        fetch_mat(U, LDJ, P.U0 + rv + CH * Dv, Dv, n1, jw);
        fetch_commit();
        fetch_mat(Xk, ldk, P.Kc + rk + CH * Dk, Dk, n1, Dk);
        fetch_commit();
    }
    fetch_wait(0);
    if (packed) {
        float *fin = packed + A.Dv * A.Hv * A.T * A.B + (b * A.Hv + hv) * A.Dk * A.Dv;
        for (int e = threadIdx.x; e < Dk * jw; e += NT) {
            int i = e / jw, x = e - i * jw;
            fin[i * A.Dv + j0 + x] = S[i * LDJ + x];
        }
    }
}

static size_t state_smem(int64_t Dk) { return (size_t)(Dk * LDJ + 2 * CH * PAD_LD(Dk) + CH * LDJ) * sizeof(float); }

/* The state pass of the tensor-core variant (Dk and Dv up to STATE_TC_MAX; not the decoding one,
 * which starts from a given state and keeps the last), with the output: a block a lane, over all
 * Dv columns, so that W and Kc are read once a chunk (the pass above reads them whole in each of
 * its Dv / JB blocks: most of its memory traffic), with S in registers as a warp's 32 x 32 tiles,
 * two turns a warp. A chunk: S to shared memory (the next products' operand) and out to Sc; U =
 * U0 - W S (W S summed from zero on the tensor cores, then stored as bmm's alpha -1, beta 1 stores
 * it; U0 fetched ahead into U's tile) to shared memory and out to Uc; with o, the chunk's output O =
 * Qg S + Pm U (k_gdn_out's tensor-core sums, element by element: the same bits, without reading
 * S and U back from memory, 400 MB a layer at the 0.8B shape, batch 8); S = Gam_C S + Kc^T U, the
 * products added to Gam_C S in the tiles' registers. The next chunk's W is fetched during the
 * output and the S update, its U0, Qg, Pm and Kc once those have read the tiles. Which warp owns
 * which tile, and each tile's order of sums, follow from the shapes. At that shape (ncu) the pass
 * took 266 us and the output 174 before the output moved in; one block of 8 warps a multiprocessor
 * (215 KB of shared memory with the output's tiles) waits on its own barriers and products. The
 * same design for the reverse pass ran 512 us against 508 and was not kept. SP (split bf16, Dk and Dv
 * multiples of 32): the operands as split tiles (cuda_tile.cuh), S and U split straight from the
 * registers that made them, Sc and Uc stored from those registers; the chunk's W, Qg, Pm and Kc split
 * once they are in, Kc waited for with the rest (one barrier for the split): 340 -> 288 us a layer
 * (ncu, the same call), the same bits. */
#define STATE_TC_MAX 128
/* a warp's one turn of 2 x 4 tiles (tc_acc's registers) set to 0, for a product summed from zero */
__device__ static inline void tiles_zero(float (*u)[2][4][4]) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) u[0][i][j][e] = 0.0f;
}
template <int TC, bool SP> __global__ void __launch_bounds__(NT, 1) k_gdn_state_tc(gdn_args A, gdn_scr P, float *o) {
    extern __shared__ float sm[];
    int64_t l = blockIdx.x, b = l / A.Hv, hv = l % A.Hv, ld = A.Hv * A.Dv;
    int Dk = (int)A.Dk, Dv = (int)A.Dv, ldk = PAD_LD(Dk), ldv = PAD_LD(Dv);
    float *Ss = sm, *Us = Ss + Dk * ldv, *Xw = Us + CH * ldv, *Xk = Xw + CH * ldk, *Xq = Xk + CH * ldk,
          *Pm = Xq + CH * ldk;               /* the last two only with o */
    float s[2][2][4][4] = {}, u[1][2][4][4]; /* the state starts at 0 (no decoding variant here) */
    /* chunk c's W (with w), U0 (into U's tile) and, with o, its Qg and Pm; then its Kc */
    auto fetch_a = [&](int64_t c, bool w) {
        int64_t lc = l * P.nc + c;
        int n = c < P.nc ? chunk_len(A.T, c) : 0;
        if (w) fetch_mat(Xw, ldk, P.W + lc * CH * (int64_t)Dk, Dk, n, Dk);
        fetch_mat(Us, ldv, P.U0 + lc * CH * (int64_t)Dv, Dv, n, Dv);
        if (o) {
            fetch_mat(Xq, ldk, P.Qg + lc * CH * (int64_t)Dk, Dk, n, Dk);
            fetch_mat(Pm, LDC, P.Pm + lc * CH * CH, CH, n, n);
        }
    };
    auto fetch_k = [&](int64_t c) {
        int n = c < P.nc ? chunk_len(A.T, c) : 0;
        fetch_mat(Xk, ldk, P.Kc + (l * P.nc + c) * CH * (int64_t)Dk, Dk, n, Dk);
    };
    fetch_a(0, true);
    fetch_commit();
    fetch_k(0);
    fetch_commit();
    for (int64_t c = 0; c < P.nc; c++) {
        int64_t lc = l * P.nc + c, rv = lc * CH * (int64_t)Dv;
        int n = chunk_len(A.T, c), n1 = c + 1 < P.nc ? chunk_len(A.T, c + 1) : 0, n16 = (n + 15) / 16 * 16;
        float *Sc = P.Sc + lc * Dk * (int64_t)Dv;
        if (SP) /* S split into its tile (the products' operand) and out to Sc from the registers */
            tc_each_pair<2, 4, 2>(Dk, Dv, [&](int t, int i, int j, int h, int r, int x, int w) {
                split_pair(Ss, ldv, r, x, s[t][i][j][2 * h], s[t][i][j][2 * h + 1]);
                store_pair(Sc + r * (int64_t)Dv + x, s[t][i][j][2 * h], s[t][i][j][2 * h + 1], w);
            });
        else
            tc_each<2, 4, 2>(Dk, Dv, [&](int t, int i, int j, int e, int r, int x) {
                Ss[r * ldv + x] = s[t][i][j][e];
            });
        fetch_wait(SP ? 0 : 1); /* W, U0 (and Qg, Pm) of this chunk; split tiles: its Kc too */
        __syncthreads();
        if (SP) { /* the chunk's operands split once (Pm's and Kc's depth past n as zeros) */
            split_tile(Xw, ldk, n, Dk, n, Dk);
            split_tile(Xk, ldk, n, Dk, n16, Dk);
            if (o) split_tile(Xq, ldk, n, Dk, n, Dk), split_tile(Pm, LDC, n, n, n, n16);
            __syncthreads();
        } else {
            store_mat(Sc, Dv, Ss, ldv, Dk, Dv);
        }
        tiles_zero(u);
        tc_acc<TC, false, false, 2, 4, 1, SP>(u, Xw, ldk, Ss, ldv, n, Dv, Dk);
        if (SP) { /* U = U0 - W S out to Uc and, split, in place of U0: a group of 8 columns of a row is
                   * one warp's (its 4 lanes of that row), which reads all its U0 before writing */
            float u0[2][4][4];
            tc_each<2, 4, 1>(n, Dv, [&](int, int i, int j, int e, int r, int x) {
                u0[i][j][e] = Us[r * ldv + x];
            });
            __syncwarp();
            tc_each_pair<2, 4, 1>(n, Dv, [&](int t, int i, int j, int h, int r, int x, int w) {
                float y0 = 1.0f * u0[i][j][2 * h] + -1.0f * u[t][i][j][2 * h],
                      y1 = 1.0f * u0[i][j][2 * h + 1] + -1.0f * u[t][i][j][2 * h + 1];
                split_pair(Us, ldv, r, x, y0, y1);
                if (A.half)
                    store_pair((uint16_t *)P.Uc + rv + r * (int64_t)Dv + x, y0, y1, w);
                else
                    store_pair(P.Uc + rv + r * (int64_t)Dv + x, y0, y1, w);
            });
            split_zero_rows(Us, ldv, n, Dv); /* U's depth past n (rows no warp reads as U0) */
        } else {
            tc_each<2, 4, 1>(n, Dv, [&](int t, int i, int j, int e, int r, int x) {
                Us[r * ldv + x] = 1.0f * Us[r * ldv + x] + -1.0f * u[t][i][j][e];
            });
        }
        __syncthreads(); /* W is read, U whole */
        if (n1) fetch_mat(Xw, ldk, P.W + (lc + 1) * CH * (int64_t)Dk, Dk, n1, Dk);
        fetch_commit();
        if (!SP) store_mat(P.Uc + rv, Dv, Us, ldv, n, Dv);
        if (o) { /* O = Qg S + Pm U in u's registers (k_gdn_out's sums), to o */
            float *out = o + ((b * A.T + c * CH) * A.Hv + hv) * A.Dv;
            tiles_zero(u);
            tc_acc<TC, false, false, 2, 4, 1, SP>(u, Xq, ldk, Ss, ldv, n, Dv, Dk);
            tc_acc<TC, false, false, 2, 4, 1, SP>(u, Pm, LDC, Us, ldv, n, Dv, n);
            tc_each_pair<2, 4, 1>(n, Dv, [&](int t, int i, int j, int h, int r, int x, int w) {
                store_pair(out + r * ld + x, u[t][i][j][2 * h], u[t][i][j][2 * h + 1], w);
            });
        }
        if (!SP) {
            fetch_wait(1); /* Kc of this chunk */
            __syncthreads();
        }
        float g = P.GamC[lc];
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[t][i][j][e] *= g;
        /* Kc^T U into the state's two turns */
        tc_acc<TC, true, false, 2, 4, 2, SP>(s, Xk, ldk, Us, ldv, Dk, Dv, n);
        __syncthreads(); /* Kc, U, Qg and Pm are read */
        fetch_a(c + 1, false);
        fetch_commit();
        fetch_k(c + 1);
        fetch_commit();
    }
    fetch_wait(0);
}

static size_t state_tc_smem(int64_t Dk, int64_t Dv, bool out) {
    size_t f = (size_t)((Dk + CH) * PAD_LD(Dv) + 2 * CH * PAD_LD(Dk));
    if (out) f += (size_t)(CH * PAD_LD(Dk) + CH * LDC);
    return f * sizeof(float);
}

/* The reverse state pass's Ac and Kb come as tiles of half their columns: the first state_kh of Dk */
__host__ __device__ static inline int state_kh(int Dk) { return (Dk / 2 + 3) / 4 * 4; }

/* The per-chunk passes over blocks of value columns (or parts) number their blocks chunk-major
 * along x (block z of chunk c at x = c nz + z): the blocks of a chunk then run side by side and
 * read the chunk's shared operands (Qg, Pm, A; S, U) once from memory, the later ones from the L2
 * cache. With the blocks of a chunk along z, each z ran over all chunks before the next: the
 * contractions read 940 MB a layer at the 0.8B shape, S and U three times over (ncu). */
__host__ __device__ static inline int jo_blocks(const gdn_args &A) { return (int)((A.Dv + JO - 1) / JO); }
#define CONTRACT_PARTS 3

/* The output per chunk (grid: chunks and blocks of JO value columns x lanes): O = Qg S + Pm U,
 * written to o (or to packed: the same layout). */
template <int TC> __global__ void __launch_bounds__(NT) k_gdn_out(gdn_args A, gdn_scr P, float *o) {
    extern __shared__ float sm[];
    int64_t c = blockIdx.x / jo_blocks(A), l = blockIdx.y, b = l / A.Hv, hv = l % A.Hv, lc = l * P.nc + c,
            j0 = (int64_t)(blockIdx.x % jo_blocks(A)) * JO;
    int n = chunk_len(A.T, c), Dk = (int)A.Dk, Dv = (int)A.Dv, ldk = PAD_LD(Dk),
        jw = (int)(Dv - j0 < JO ? Dv - j0 : JO);
    float *X = sm, *Pm = X + CH * ldk, *St = Pm + CH * LDC, *Ut = St + Dk * LDO;
    fetch_mat(X, ldk, P.Qg + lc * CH * (int64_t)Dk, Dk, n, Dk);
    fetch_mat(St, LDO, P.Sc + lc * Dk * (int64_t)Dv + j0, Dv, Dk, jw);
    fetch_commit();
    fetch_mat(Pm, LDC, P.Pm + lc * CH * CH, CH, n, n); /* in flight during the first product */
    fetch_mat(Ut, LDO, P.Uc + lc * CH * (int64_t)Dv + j0, Dv, n, jw);
    fetch_commit();
    fetch_wait(1);
    __syncthreads();
    float *out = o + ((b * A.T + c * CH) * A.Hv + hv) * A.Dv + j0, acc[1][4][4]; /* one turn: n, jw <= 64 */
    int64_t ld = A.Hv * A.Dv;
    if (TC) { /* on the tensor cores: a warp's 32 x 16 tiles, one turn */
        float s[1][2][2][4] = {};
        tc_acc<TC, false, false, 2, 2, 1>(s, X, ldk, St, LDO, n, jw, Dk);
        fetch_wait(0);
        __syncthreads();
        tc_acc<TC, false, false, 2, 2, 1>(s, Pm, LDC, Ut, LDO, n, jw, n);
        tc_each<2, 2, 1>(n, jw, [&](int u, int i, int j, int e, int t, int x) {
            out[t * ld + x] = s[u][i][j][e];
        });
        return;
    }
    bmm_reg<false, false, 1>(acc, X, ldk, St, LDO, n, jw, Dk, 1.0f, 0.0f, false);
    fetch_wait(0);
    __syncthreads();
    bmm_reg<false, false, 1>(acc, Pm, LDC, Ut, LDO, n, jw, n, 1.0f, 1.0f, true); /* as bmm into out twice */
    bmm_each<false, 1>(n, jw, [&](int u, int i, int j, int t, int x) {
        out[t * ld + x] = acc[u][i][j];
    });
}

static size_t out_smem(int64_t Dk) {
    return (size_t)(CH * PAD_LD(Dk) + CH * LDC + Dk * LDO + CH * LDO) * sizeof(float);
}

/* Per chunk (grid: chunks and blocks of JO value columns x lanes), what the reverse pass needs that
 * does not depend on dS: G0 = Qg^T dO into dSc, dR0 = A^T (Pm^T dO) into dR. */
template <int TC> __global__ void __launch_bounds__(NT) k_gdn_pre_back(gdn_args A, gdn_scr P) {
    extern __shared__ float sm[];
    int64_t c = blockIdx.x / jo_blocks(A), l = blockIdx.y, b = l / A.Hv, hv = l % A.Hv, lc = l * P.nc + c,
            j0 = (int64_t)(blockIdx.x % jo_blocks(A)) * JO;
    int n = chunk_len(A.T, c), Dk = (int)A.Dk, Dv = (int)A.Dv, ldk = PAD_LD(Dk),
        jw = (int)(Dv - j0 < JO ? Dv - j0 : JO);
    float *X = sm, *Pm = X + CH * ldk, *Am = Pm + CH * LDC, *dOt = Am + CH * LDC, *dU = dOt + CH * LDO;
    fetch_mat(Pm, LDC, P.Pm + lc * CH * CH, CH, n, n);
    fetch_rows(dOt, LDO, A.dO, hv, c * CH, b, n, j0, jw);
    fetch_commit();
    fetch_mat(X, ldk, P.Qg + lc * CH * (int64_t)Dk, Dk, n, Dk); /* in flight during the first product */
    bool half = TC == 3 && A.half;
    if (half)
        fetch_mat16((uint16_t *)Am, 2 * LDC, (const uint16_t *)P.Am + lc * CH * CH, CH, n, n);
    else
        fetch_mat(Am, LDC, P.Am + lc * CH * CH, CH, n, n);
    fetch_commit();
    fetch_wait(1);
    __syncthreads();
    bmm_sel<TC, true, false>(dU, LDO, Pm, LDC, dOt, LDO, n, jw, n, 1.0f, 0.0f, false);
    fetch_wait(0);
    __syncthreads();
    bmm_sel<TC, true, false>(P.dSc + lc * Dk * (int64_t)Dv + j0, Dv, X, ldk, dOt, LDO, Dk, jw, n, 1.0f, 0.0f, false);
    __syncthreads();
    if constexpr (TC == 3)
        if (half) {
            bmm_tc<3, true, false>(P.dR + lc * CH * (int64_t)Dv + j0, Dv, (const uint16_t *)Am, 2 * LDC, dU, LDO, n, jw,
                                   n, 1.0f, 0.0f, false);
            return;
        }
    bmm_sel<TC, true, false>(P.dR + lc * CH * (int64_t)Dv + j0, Dv, Am, LDC, dU, LDO, n, jw, n, 1.0f, 0.0f, false);
}

static size_t pre_back_smem(int64_t Dk) {
    return (size_t)(CH * PAD_LD(Dk) + 2 * CH * LDC + 2 * CH * LDO) * sizeof(float);
}

/* The reverse state pass (grid: lanes x blocks of JB value columns), last chunk first, with dS the
 * gradient of the state leaving the chunk: keeps dS (over G0, read first), dR = dR0 + Ac dS
 * (kept; dv = beta dR), dS <- Gam_C dS + G0 - Kb^T dR. Ac and Kb come through one tile of half
 * their columns, half after half: dR's sums continue in registers from the first half's depth to
 * the second's (bmm_block with zero false: the bits of one product), dS's rows are updated half by
 * half. dS (the state's gradient leaving the chunk) goes out over G0 once dR is made: a thread loads
 * its elements of G0 into registers, then stores its elements of dS in their place (its own loads
 * before its own stores) and updates them. 48 KB and 64 registers a block at Dk 128: four blocks a
 * multiprocessor (508 us a layer at the 0.8B shape, 596 with the full tiles and one block; the same
 * for the forward's state pass ran 465 us against 444 with two blocks of full tiles, prefetched:
 * not kept there). In the tensor-core modes (TC) both products run on the tensor cores, a warp a
 * 16 x 16 tile (the same four blocks a multiprocessor: 487 -> 427 us; the float32 ones were bound by
 * shared-memory loads), and G0's rows are prefetched into L2 when a chunk starts. */
/* G0 walks a thread's elements of a block of Dk x jw, e = threadIdx.x + u NT for u < GR (GR NT >= Dk JB),
 * as store_mat does: f(u, i, x) for the ones inside, the row and column kept without divisions */
template <int GR, typename F> __device__ static inline void g0_walk(int Dk, int jw, F f) {
    int i = (int)threadIdx.x / jw, x = (int)threadIdx.x - i * jw, di = NT / jw, dx = NT - di * jw;
#pragma unroll
    for (int u = 0; u < GR; u++) {
        if (i < Dk) f(u, i, x);
        i += di, x += dx;
        if (x >= jw) x -= jw, i++;
    }
}
template <int GR, int TC, bool H>
__global__ void __launch_bounds__(NT, GR <= 16 ? 4 : 1) k_gdn_state_back(gdn_args A, gdn_scr P, float *out) {
    extern __shared__ float sm[];
    int64_t l = blockIdx.x, b = l / A.Hv, hv = l % A.Hv, j0 = (int64_t)blockIdx.y * JB;
    int Dk = (int)A.Dk, Dv = (int)A.Dv, kh = state_kh(Dk), ldx = PAD_LD(kh), jw = (int)(Dv - j0 < JB ? Dv - j0 : JB);
    float *dS = sm, *X = dS + Dk * LDJ, *dRt = X + CH * ldx, *bt = dRt + CH * LDJ, *Vt = bt + CH;
    /* H (gdn_scr's half, TC 3): X holds Kb's and Ac's whole rows in bf16 (Dk values take no more room
     * than kh floats), each product one, as the two halves' sums in the same order (kh a multiple of
     * 16); Vt the chunk's rows of V for r3's part; dR goes out as bf16 */
    uint16_t *X16 = (uint16_t *)X;
    const uint16_t *Ac16 = (const uint16_t *)P.Ac, *Kb16 = (const uint16_t *)P.Kb;
    int ld16 = 2 * ldx;
    /* dv's place in a token's row of the packed result (keel_gdn_back_layout) */
    int64_t prow = (2 * A.Dk + A.Dv) * A.Hv, off_dv = 2 * A.Dk * A.Hv + hv * Dv, last = P.nc - 1;
    for (int e = threadIdx.x; e < Dk * LDJ; e += NT) dS[e] = 0.0f;
    int64_t lc = l * P.nc + last, rk = lc * CH * (int64_t)Dk, rv = lc * CH * (int64_t)Dv + j0;
    int n = chunk_len(A.T, last);
    if (H) {
        fetch_mat16(X16, ld16, Ac16 + rk, Dk, n, Dk);
        fetch_rows(Vt, LDJ, A.v, hv, last * CH, b, n, j0, jw);
    } else {
        fetch_mat(X, ldx, P.Ac + rk, Dk, n, kh);
    }
    fetch_mat(dRt, LDJ, P.dR + rv, Dv, n, jw);
    fetch_commit();
    bmm_owner<false, 2> ow(CH, JB); /* dR's blocks: one turn a thread at most */
    for (int64_t c = last; c >= 0; c--) {
        lc = l * P.nc + c, rk = lc * CH * (int64_t)Dk, rv = lc * CH * (int64_t)Dv + j0, n = chunk_len(A.T, c);
        int n1 = c > 0 ? CH : 0; /* every chunk before the last is whole */
        int64_t t0 = c * CH;
        float gc = P.GamC[lc], *dSo = P.dSc + lc * Dk * (int64_t)Dv + j0;
        /* G0's rows into the L2 cache now, for the loads below, after dR (they stalled a quarter of
         * the pass on memory: ncu's samples, long scoreboard) */
        if ((int)threadIdx.x < Dk) l2_prefetch(dSo + threadIdx.x * (int64_t)Dv);
        for (int t = threadIdx.x; t < n; t += NT) bt[t] = ldf(kt_at(A.beta, hv, t0 + t, b, 0));
        fetch_wait(0); /* Ac (its first half), dR0 */
        __syncthreads();
        if constexpr (H) {
            float s[1][1][2][4] = {};
            tc_acc<3, false, false, 1, 2, 1>(s, X16, ld16, dS, LDJ, n, jw, Dk);
            tc_each<1, 2, 1>(n, jw, [&](int u, int i, int j, int e, int r, int x) {
                dRt[r * LDJ + x] = 1.0f * dRt[r * LDJ + x] + 1.0f * s[u][i][j][e];
            });
        } else if (TC) { /* the same on the tensor cores: a warp's 16 x 16 tile, the sum continued over both halves */
            float s[1][1][2][4] = {};
            tc_acc<TC ? TC : 1, false, false, 1, 2, 1>(s, X, ldx, dS, LDJ, n, jw, kh);
            __syncthreads();
            fetch_mat(X, ldx, P.Ac + rk + kh, Dk, n, Dk - kh);
            fetch_commit();
            fetch_wait(0);
            __syncthreads();
            tc_acc<TC ? TC : 1, false, false, 1, 2, 1>(s, X, ldx, dS + kh * LDJ, LDJ, n, jw, Dk - kh);
            tc_each<1, 2, 1>(n, jw, [&](int u, int i, int j, int e, int r, int x) {
                dRt[r * LDJ + x] = 1.0f * dRt[r * LDJ + x] + 1.0f * s[u][i][j][e];
            });
        } else {
            int r0, cb, cs;
            bool mine = ow.block(0, &r0, &cb, &cs) && r0 < n && cb < jw;
            float s[2][4];
            if (mine) bmm_block<false, false, 2>(s, X, ldx, dS, LDJ, n, jw, kh, r0, cb, cs);
            __syncthreads();
            fetch_mat(X, ldx, P.Ac + rk + kh, Dk, n, Dk - kh);
            fetch_commit();
            fetch_wait(0);
            __syncthreads();
            if (mine) { /* dR = dR0 + Ac dS, as bmm(dRt, ..., 1, 1, acc) stores it */
                bmm_block<false, false, 2>(s, X, ldx, dS + kh * LDJ, LDJ, n, jw, Dk - kh, r0, cb, cs, false);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int r = r0 + i, x = cb + j * cs;
                        if (r < n && x < jw) dRt[r * LDJ + x] = 1.0f * dRt[r * LDJ + x] + 1.0f * s[i][j];
                    }
            }
        }
        __syncthreads();
        if (H)
            fetch_mat16(X16, ld16, Kb16 + rk, Dk, n, Dk);
        else
            fetch_mat(X, ldx, P.Kb + rk, Dk, n, kh);
        fetch_commit();
        if constexpr (H) { /* dR as bf16 pairs (bf16_pair's rounding, as the products round it); r3's part */
            grid_walk(n, jw / 2, [&](int t, int x2) {
                ((uint32_t *)(P.dR + rv + t * (int64_t)Dv))[x2] =
                    bf16_pair(dRt[t * LDJ + 2 * x2], dRt[t * LDJ + 2 * x2 + 1]);
            });
            int t;
            float s = row_dot4(dRt, Vt, LDJ, n, jw, &t);
            if (t < n && (threadIdx.x & 3) == 0) P.r3[(lc * gridDim.y + blockIdx.y) * CH + t] = s;
        } else {
            store_mat(P.dR + rv, Dv, dRt, LDJ, n, jw);
        }
        grid_walk(n, jw, [&](int t, int x) {
            out[(b * A.T + t0 + t) * prow + off_dv + j0 + x] = bt[t] * dRt[t * LDJ + x];
        });
#pragma unroll
        for (int h = 0; h < 2; h++) { /* half of the thread's elements at a time: registers for four blocks */
            float g0[GR / 2];
            g0_walk<GR>(Dk, jw, [&](int u, int i, int x) {
                if (u / (GR / 2) == h) g0[u % (GR / 2)] = dSo[i * Dv + x];
            });
            /* dS out over G0 (this thread's loads came first), then dS <- Gam_C dS + G0 */
            g0_walk<GR>(Dk, jw, [&](int u, int i, int x) {
                if (u / (GR / 2) != h) return;
                dSo[i * Dv + x] = dS[i * LDJ + x];
                dS[i * LDJ + x] = gc * dS[i * LDJ + x] + g0[u % (GR / 2)];
            });
        }
        fetch_wait(0);
        __syncthreads();
        if constexpr (H) {
            bmm_tc<3, true, false>(dS, LDJ, (const uint16_t *)X16, ld16, dRt, LDJ, Dk, jw, n, -1.0f, 1.0f, true);
        } else {
            bmm_sel<TC, true, false>(dS, LDJ, X, ldx, dRt, LDJ, kh, jw, n, -1.0f, 1.0f, true); /* dS's first kh rows */
            __syncthreads();
            fetch_mat(X, ldx, P.Kb + rk + kh, Dk, n, Dk - kh);
            fetch_commit();
            fetch_wait(0);
            __syncthreads();
            bmm_sel<TC, true, false>(dS + kh * LDJ, LDJ, X, ldx, dRt, LDJ, Dk - kh, jw, n, -1.0f, 1.0f, true);
        }
        __syncthreads();
        if (H) {
            fetch_mat16(X16, ld16, Ac16 + rk - CH * Dk, Dk, n1, Dk);
            fetch_rows(Vt, LDJ, A.v, hv, t0 - CH, b, n1, j0, jw);
        } else {
            fetch_mat(X, ldx, P.Ac + rk - CH * Dk, Dk, n1, kh);
        }
        fetch_mat(dRt, LDJ, P.dR + rv - CH * Dv, Dv, n1, jw);
        fetch_commit();
    }
    fetch_wait(0);
}

static size_t state_back_smem(int64_t Dk, bool half) {
    return (size_t)(Dk * LDJ + CH * PAD_LD(state_kh((int)Dk)) + (half ? 2 : 1) * CH * LDJ + CH) * sizeof(float);
}

/* The contractions over value columns, per chunk (grid: chunks and 3 parts x lanes), summed over
 * blocks of JB columns in order: part 0 dQa = dO S^T and dPm = dO U^T; part 1 dKa = U dS^T and
 * dGamC = sum S o dS; part 2 dKb = dR S^T, dMm = -dR U^T and r3 = rows of dR o V. The two results
 * are summed in registers and stored once (bmm_reg: bmm's sums, as into C block after block; on the
 * tensor cores, tc_acc: every tile's sums one chain over all the blocks, dMm's sign at the store),
 * so shared memory holds only the blocks of the operands, in two stages: the next block's copies
 * are in flight during this one's products (one stage made every block wait a memory latency with
 * nothing to do but the other resident block's work). About 94 KB at Dk 128, two blocks a
 * multiprocessor (registers allow no more; the float32 variant then spills 88 bytes a thread, and
 * still runs the float32 backward 3.58 ms a layer against 3.87 with one block). NB: bmm_reg's turns
 * of n x Dk (2 up to Dk = 128, 4 up to 256). SP (split bf16, Dk a multiple of 32): each stage's
 * elementwise sums first, on its floats, then its tiles split in place for the products (565 -> 524
 * us a layer, ncu in the same call; the same bits). With gdn_scr's half (TC 3), Uc and dR come in
 * as bf16 straight into their split tiles' big parts, and r3 is the reverse state pass's. */
/* a stage's floats: Ta (CH rows), St (Dk), and a third tile of Dk rows or two of CH: Tb (parts 0
 * and 2), St2 (part 1) or Tb and Tc (part 2) */
__host__ __device__ static inline int contract_stage(int Dk) { return (CH + Dk + (Dk > 2 * CH ? Dk : 2 * CH)) * LDJ; }
template <int TC, int NB, bool SP>
__global__ void __launch_bounds__(NT, NB == 2 ? 2 : 1) k_gdn_contract(gdn_args A, gdn_scr P) {
    extern __shared__ double smd[];
    int64_t c = blockIdx.x / CONTRACT_PARTS, l = blockIdx.y, b = l / A.Hv, hv = l % A.Hv, t0 = c * CH,
            lc = l * P.nc + c;
    int part = blockIdx.x % CONTRACT_PARTS, n = chunk_len(A.T, c), Dk = (int)A.Dk, Dv = (int)A.Dv;
    double *sh = smd;
    float *r3 = (float *)(sh + NT), *stages = r3 + CH;
    const float *Sc = P.Sc + lc * Dk * (int64_t)Dv, *dSc = P.dSc + lc * Dk * (int64_t)Dv;
    int64_t rv = lc * CH * (int64_t)Dv;
    int sf = contract_stage(Dk);
    double part_sum = 0.0; /* this thread's share of dGamC, in a fixed order */
    float acc1[NB][4][4], acc2[1][4][4], s1[NB / 2][2][4][4] = {}, s2[1][2][2][4] = {};
    /* block j0's operands into stage st: Ta, St, then Tb, St2 or Tb and Tc (tile below) */
    /* Uc in bf16 (gdn_scr's half, TC 3 with split tiles: jw is 32) lands as its split tile's big parts */
    bool uh = TC == 3 && SP && A.half;
    auto fetch_u = [&](float *X, int j0, int jw) {
        if (uh)
            split_fetch16(X, LDJ, (const uint16_t *)P.Uc + rv + j0, Dv, n, jw);
        else
            fetch_mat(X, LDJ, P.Uc + rv + j0, Dv, n, jw);
    };
    auto fetch_block = [&](int j0, int st) {
        int jw = Dv - j0 < JB ? Dv - j0 : JB;
        float *Ta = stages + st * sf, *St = Ta + CH * LDJ, *X3 = St + Dk * LDJ;
        if (part == 0) {
            fetch_rows(Ta, LDJ, A.dO, hv, t0, b, n, j0, jw);
            fetch_mat(St, LDJ, Sc + j0, Dv, Dk, jw);
            fetch_u(X3, j0, jw);
        } else if (part == 1) {
            fetch_u(Ta, j0, jw);
            fetch_mat(St, LDJ, dSc + j0, Dv, Dk, jw);
            fetch_mat(X3, LDJ, Sc + j0, Dv, Dk, jw);
        } else if (uh) { /* dR as the reverse pass left it, bf16 in its floats' first half; r3 made there */
            split_fetch16(Ta, LDJ, (const uint16_t *)(P.dR + rv + j0), 2 * (int64_t)Dv, n, jw);
            fetch_mat(St, LDJ, Sc + j0, Dv, Dk, jw);
            fetch_u(X3, j0, jw);
        } else {
            fetch_mat(Ta, LDJ, P.dR + rv + j0, Dv, n, jw);
            fetch_mat(St, LDJ, Sc + j0, Dv, Dk, jw);
            fetch_u(X3, j0, jw);
            fetch_rows(X3 + CH * LDJ, LDJ, A.v, hv, t0, b, n, j0, jw);
        }
        fetch_commit();
    };
    for (int t = threadIdx.x; t < n; t += NT) r3[t] = 0.0f;
    fetch_block(0, 0);
    for (int j0 = 0, st = 0; j0 < Dv; j0 += JB, st ^= 1) {
        int jw = Dv - j0 < JB ? Dv - j0 : JB;
        bool more = j0 > 0, next = j0 + JB < Dv;
        if (next) fetch_block(j0 + JB, st ^ 1); /* that stage was read before the last barrier */
        fetch_wait(next ? 1 : 0);
        __syncthreads();
        float *Ta = stages + st * sf, *St = Ta + CH * LDJ, *Tb = St + Dk * LDJ, *St2 = Tb, *Tc = Tb + CH * LDJ;
        auto sums = [&]() { /* the elementwise sums, on the stage's floats */
            if (part == 1)
                grid_walk(Dk, jw, [&](int i, int x) {
                    part_sum += (double)St2[i * LDJ + x] * St[i * LDJ + x];
                });
            if (part == 2 && !uh) { /* 4 threads a row (a thread a row left 3 of 4 warps waiting) */
                int t;
                float s = row_dot4(Ta, Tc, LDJ, n, jw, &t);
                if (t < n && (threadIdx.x & 3) == 0) r3[t] += s;
            }
        };
        if (SP) { /* the sums first, then the tiles split in place (the depth padded to 16) for the products */
            int j16 = (jw + 15) / 16 * 16;
            sums();
            if (part == 1 || (part == 2 && !uh)) __syncthreads();
            if (!uh || part == 0) /* uh: part 1's Ta (Uc) and part 2's (dR) came split; part 0's is dO */
                split_tile<TC == 3>(Ta, LDJ, n, jw, n, j16);
            split_tile<TC == 3>(St, LDJ, Dk, jw, Dk, j16);
            if (part != 1 && !uh) split_tile<TC == 3>(Tb, LDJ, n, jw, n, j16); /* Uc: came split with uh */
            __syncthreads();
            tc_acc<TC, false, true, 2, 4, NB / 2, true>(s1, Ta, LDJ, St, LDJ, n, Dk, jw);
            if (part != 1) tc_acc<TC, false, true, 2, 2, 1, true>(s2, Ta, LDJ, Tb, LDJ, n, n, jw);
        } else {
            if (TC) {
                tc_acc<TC, false, true, 2, 4, NB / 2>(s1, Ta, LDJ, St, LDJ, n, Dk, jw);
                if (part != 1) tc_acc<TC, false, true, 2, 2, 1>(s2, Ta, LDJ, Tb, LDJ, n, n, jw);
            } else {
                bmm_reg<false, true, NB>(acc1, Ta, LDJ, St, LDJ, n, Dk, jw, 1.0f, 1.0f, more);
                if (part != 1)
                    bmm_reg<false, true, 1>(acc2, Ta, LDJ, Tb, LDJ, n, n, jw, part == 0 ? 1.0f : -1.0f, 1.0f, more);
            }
            sums();
        }
        __syncthreads(); /* this stage is read: the next turn's copies may take it */
    }
    float *out1 = part == 0   ? P.dQa
                  : part == 1 ? P.dKa
                              : P.dKb,
          *out2 = part == 0 ? P.dPm : P.dMm, sg = part == 2 ? -1.0f : 1.0f;
    out1 += lc * CH * (int64_t)Dk, out2 += lc * CH * CH;
    if (TC) {
        tc_each_pair<2, 4, NB / 2>(n, Dk, [&](int u, int i, int j, int h, int r, int x, int w) {
            store_pair(out1 + r * Dk + x, s1[u][i][j][2 * h], s1[u][i][j][2 * h + 1], w);
        });
        if (part != 1)
            tc_each_pair<2, 2, 1>(n, n, [&](int u, int i, int j, int h, int r, int x, int w) {
                store_pair(out2 + r * CH + x, sg * s2[u][i][j][2 * h], sg * s2[u][i][j][2 * h + 1], w);
            });
    } else {
        bmm_each<true, NB>(n, Dk, [&](int u, int i, int j, int r, int x) {
            out1[r * Dk + x] = acc1[u][i][j];
        });
        if (part != 1)
            bmm_each<true, 1>(n, n, [&](int u, int i, int j, int r, int x) {
                out2[r * CH + x] = acc2[u][i][j];
            });
    }
    __syncthreads(); /* r3's rows are whole */
    if (part == 2 && !uh)
        for (int t = threadIdx.x; t < n; t += NT) P.r3[lc * CH + t] = r3[t];
    if (part == 1) {
        double s = block_sum(part_sum, sh);
        if (threadIdx.x == 0) P.dGamC[lc] = (float)s;
    }
}

static size_t contract_smem(int64_t Dk) {
    return NT * sizeof(double) + (size_t)(CH + 2 * contract_stage((int)Dk)) * sizeof(float);
}

/* Per chunk (grid: chunks x lanes): dq, dk, dg, dbeta from the contractions.
 *   dq = Gam dQa + (dPm o D) K
 *   dk = D_C dKa - beta Gam dKb + E K + E^T K + (dPm o D)^T Q,  E = dMm o beta D (below the diagonal)
 *   dbeta_t = r3_t - Gam_t k_t.dKb_t + sum_s<t dMm_ts D_ts k_t.k_s
 * and dG_t, the gradient of the summed gate G_t, from everything a decay multiplies; dg is the
 * sum of dG over the later steps of the same example in the chunk (0 where an example starts). */
template <int NB, int TC> __global__ void __launch_bounds__(NT) k_gdn_grads(gdn_args A, gdn_scr P, float *out) {
    extern __shared__ double smd[];
    int64_t c = blockIdx.x, l = blockIdx.y, b = l / A.Hv, hv = l % A.Hv, hk = hv / (A.Hv / A.Hk);
    int64_t t0 = c * CH, lc = l * P.nc + c;
    int n = chunk_len(A.T, c), Dk = (int)A.Dk, ldk = PAD_LD(Dk), lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    chunk_decay d = decay_at(smd);
    /* dPm and dMm are read from global memory and written back there scaled, so that only two
     * CH x CH tiles are in shared memory at once (two blocks a multiprocessor, not one): X and Y,
     * then, once their sums are taken, the scaled dPm and dMm (Pd, E) fetched back into their place. */
    float *dGam = (float *)((char *)smd + DECAY_BYTES), *dDC = dGam + CH, *dG = dDC + CH, *kdKb = dG + CH,
          *Q = kdKb + CH, *K = Q + CH * ldk, *X = K + CH * ldk, *Y = X + CH * LDC, *Pd = X, *E = Y;
    float *gPd = P.dPm + lc * CH * CH, *gE = P.dMm + lc * CH * CH;
    /* gdn_scr's half (TC 3): the scaled ones go to bf16 arrays of their own, which only this pass's
     * one-part products read (rounded as they round them; in place they would overwrite floats other
     * threads have still to read) */
    bool gh = TC == 3 && A.half;
    uint16_t *hPd = (uint16_t *)P.Pd16 + lc * CH * CH, *hE = (uint16_t *)P.E16 + lc * CH * CH;
    fetch_rows(Q, ldk, A.q, hk, t0, b, n, 0, Dk);
    fetch_rows(K, ldk, A.k, hk, t0, b, n, 0, Dk);
    fetch_commit();
    { /* the contractions' results this block loads itself (not through fetches) into the L2 cache
       * now, a line a thread at a time: those loads waited on memory for a third of the pass (ncu) */
        int64_t rk = lc * CH * (int64_t)Dk;
        int nk = (n * Dk + 31) / 32, nm = (n * CH + 31) / 32;
        for (int i = threadIdx.x; i < 3 * nk; i += NT) {
            int a = i / nk;
            l2_prefetch((a == 0 ? P.dQa : a == 1 ? P.dKa : P.dKb) + rk + 32 * (i - a * nk));
        }
        for (int i = threadIdx.x; i < 2 * nm; i += NT) l2_prefetch((i < nm ? gPd : gE) + 32 * (i < nm ? i : i - nm));
    }
    /* what this thread's row of dG and dbeta reads of the contractions' results (the first of a row's
     * 4 threads), loaded now: behind a barrier later, they were a memory latency of their own */
    float r3v = 0.0f, dgc = P.dGamC[lc];
    if (threadIdx.x < 4 * n && (threadIdx.x & 3) == 0) {
        int t = (int)threadIdx.x >> 2, nj = (int)(A.Dv / JB);
        if (TC == 3 && A.half) /* the reverse pass's parts, added as the contractions added them */
            for (int j = 0; j < nj; j++) r3v += P.r3[(lc * nj + j) * CH + t];
        else
            r3v = P.r3[lc * CH + t];
    }
    decay_load(A, d, b, hv, t0, n); /* while the tiles are in flight */
    fetch_wait(0);
    __syncthreads();
    bmm_sel<TC, false, true>(X, LDC, Q, ldk, K, ldk, n, n, Dk, 1.0f, 0.0f, false);
    bmm_sel<TC, false, true>(Y, LDC, K, ldk, K, ldk, n, n, Dk, 1.0f, 0.0f, false);
    __syncthreads();
    /* a thread's elements of dPm and dMm, 8 of each in flight at once (one after another, each
     * waited on, they cost a memory latency each): e = t n + s from threadIdx.x in steps of NT, the
     * row and column stepped as grid_walk steps them, twice over each 8 (the loads, then the work) */
    int wt = (int)threadIdx.x / n, ws = (int)threadIdx.x - wt * n, dwt = NT / n, dws = NT - dwt * n;
    while (wt < n) {
        float dpv[8], dmv[8];
        int t = wt, s = ws;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            dpv[u] = t < n ? gPd[t * CH + s] : 0.0f, dmv[u] = t < n ? gE[t * CH + s] : 0.0f;
            t += dwt, s += dws;
            if (s >= n) s -= n, t++;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            t = wt, s = ws;
            wt += dwt, ws += dws;
            if (ws >= n) ws -= n, wt++;
            if (t >= n) break;
            float D = dmask(d, t, s), dpm = dpv[u], dmm = dmv[u], y = Y[t * LDC + s];
            bool low = s < t;
            /* X: D_ts times the gradient of D_ts (the diagonal's D is 1 and cancels in dG: left out) */
            X[t * LDC + s] = low ? D * (dpm * X[t * LDC + s] + dmm * d.bt[t] * y) : 0.0f;
            Y[t * LDC + s] = low ? dmm * D * y : 0.0f;
            if (gh) {
                hPd[t * CH + s] = bf16_of(D * dpm);
                hE[t * CH + s] = bf16_of(low ? dmm * d.bt[t] * D : 0.0f);
            } else {
                gPd[t * CH + s] = D * dpm;
                gE[t * CH + s] = low ? dmm * d.bt[t] * D : 0.0f;
            }
        }
    }
    __syncthreads();
    /* the packed result (keel_gdn_back_layout): a row a token [dq | dk | dv], then dg, dbeta */
    int64_t prow = (2 * A.Dk + A.Dv) * A.Hv, off_dk = A.Dk * A.Hv, off_dg = prow * A.T * A.B,
            off_db = off_dg + A.Hv * A.T * A.B;
    int64_t rk = lc * CH * (int64_t)Dk;
    /* a warp two rows at a time (t and t + NT / 32): dot products over Dk, 4 loads of each row's
     * three arrays in flight together */
    for (int t = w; t < n; t += 2 * (NT / 32)) {
        int rows[2] = {t, t + NT / 32};
        float x1[2] = {0.0f, 0.0f}, x2[2] = {0.0f, 0.0f}, x3[2] = {0.0f, 0.0f};
        for (int i0 = lane; i0 < Dk; i0 += 128) {
            float a1[2][4], a2[2][4], a3[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    int i = i0 + 32 * u;
                    bool in = i < Dk && rows[h] < n;
                    int64_t at = rk + rows[h] * Dk + i;
                    a1[h][u] = in ? P.dQa[at] : 0.0f, a2[h][u] = in ? P.dKb[at] : 0.0f,
                    a3[h][u] = in ? P.dKa[at] : 0.0f;
                }
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    int i = i0 + 32 * u, r = rows[h];
                    if (i < Dk && r < n) {
                        x1[h] += Q[r * ldk + i] * a1[h][u];
                        x2[h] += K[r * ldk + i] * a2[h][u];
                        x3[h] += K[r * ldk + i] * a3[h][u];
                    }
                }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float s1 = warp_sum(x1[h]), s2 = warp_sum(x2[h]), s3 = warp_sum(x3[h]);
            int r = rows[h];
            if (lane == 0 && r < n) {
                dGam[r] = s1 - d.bt[r] * s2;
                dDC[r] = s3;
                kdKb[r] = s2; /* k_t . dKb_t */
            }
        }
    }
    __syncthreads();
    { /* dG and dbeta, 4 threads a row (NT / 4 >= CH), each every 4th term of the row's sums */
        int t = threadIdx.x >> 2, h = threadIdx.x & 3;
        float s = 0.0f, y = 0.0f, e = 0.0f;
        for (int x = h; t < n && x < n; x += 4) {
            s += X[t * LDC + x] - X[x * LDC + t];
            if (x < t) y += Y[t * LDC + x];
            if (t == n - 1) e += d.DC[x] * dDC[x];
        }
        s = quad_sum(s), y = quad_sum(y), e = quad_sum(e);
        if (t < n && h == 0) {
            s += d.Gam[t] * dGam[t] - d.DC[t] * dDC[t];
            if (t == n - 1) s += d.Gam[n - 1] * dgc + e;
            dG[t] = s;
            out[off_db + (b * A.T + t0 + t) * A.Hv + hv] = r3v - d.Gam[t] * kdKb[t] + y;
        }
    }
    __syncthreads(); /* X and Y are read: they take the scaled dPm and dMm, in flight during what follows */
    if (gh) {
        fetch_mat16((uint16_t *)Pd, 2 * LDC, hPd, CH, n, n);
        fetch_mat16((uint16_t *)E, 2 * LDC, hE, CH, n, n);
    } else {
        fetch_mat(Pd, LDC, gPd, CH, n, n);
        fetch_mat(E, LDC, gE, CH, n, n);
    }
    fetch_commit();
    { /* dg: the example's dG summed from u on, 4 threads a step */
        int u = threadIdx.x >> 2, h = threadIdx.x & 3;
        float s = 0.0f;
        if (u < n && d.seg[u] != u)
            for (int t = u + h; t < n; t += 4) s += d.seg[t] == d.seg[u] ? dG[t] : 0.0f;
        s = quad_sum(s);
        if (u < n && h == 0) out[off_dg + (b * A.T + t0 + u) * A.Hv + hv] = s;
    }
    /* dq, then dk, in registers: each element's first terms, then the products added as bmm adds
     * them to C (bmm_reg: the same sums in the same order), and one store; NB: the turns of a
     * thread's blocks over n x Dk (2 up to Dk = 128, 4 up to 256) */
    float *oq = out + (b * A.T + t0) * prow + hv * A.Dk, *ok = oq + off_dk, acc[NB][4][4];
    int64_t ld = prow;
    const float *qa = P.dQa + rk, *ka = P.dKa + rk, *kb = P.dKb + rk;
    /* the same on the tensor cores: a warp's 32 x 32 tiles (NB / 2 turns) in registers; Pd and E as
     * floats (row stride LDC) or, with gh, as bf16 (2 LDC) */
    auto tc_tail = [&](const auto *Pdx, const auto *Ex, int ldp) {
        float s[NB / 2][2][4][4];
        tc_each<2, 4, NB / 2>(n, Dk, [&](int u, int i, int j, int e, int t, int c) {
            s[u][i][j][e] = d.Gam[t] * qa[t * Dk + c];
        });
        fetch_wait(0);
        __syncthreads(); /* Pd and E have landed */
        tc_acc<TC, false, false, 2, 4, NB / 2>(s, Pdx, ldp, K, ldk, n, Dk, n);
        tc_each_pair<2, 4, NB / 2>(n, Dk, [&](int u, int i, int j, int h, int t, int c, int w) {
            store_pair(oq + t * ld + c, s[u][i][j][2 * h], s[u][i][j][2 * h + 1], w);
        });
        tc_each<2, 4, NB / 2>(n, Dk, [&](int u, int i, int j, int e, int t, int c) {
            s[u][i][j][e] = d.DC[t] * ka[t * Dk + c] - d.bt[t] * d.Gam[t] * kb[t * Dk + c];
        });
        tc_acc<TC, false, false, 2, 4, NB / 2>(s, Ex, ldp, K, ldk, n, Dk, n);
        tc_acc<TC, true, false, 2, 4, NB / 2>(s, Ex, ldp, K, ldk, n, Dk, n);
        tc_acc<TC, true, false, 2, 4, NB / 2>(s, Pdx, ldp, Q, ldk, n, Dk, n);
        tc_each_pair<2, 4, NB / 2>(n, Dk, [&](int u, int i, int j, int h, int t, int c, int w) {
            store_pair(ok + t * ld + c, s[u][i][j][2 * h], s[u][i][j][2 * h + 1], w);
        });
    };
    if constexpr (TC == 3)
        if (gh) {
            tc_tail((const uint16_t *)Pd, (const uint16_t *)E, 2 * LDC);
            return;
        }
    if (TC) {
        tc_tail((const float *)Pd, (const float *)E, LDC);
        return;
    }
    bmm_each<false, NB>(n, Dk, [&](int u, int i, int j, int t, int c) {
        acc[u][i][j] = d.Gam[t] * qa[t * Dk + c];
    });
    fetch_wait(0);
    __syncthreads(); /* Pd and E have landed */
    bmm_reg<false, false, NB>(acc, Pd, LDC, K, ldk, n, Dk, n, 1.0f, 1.0f, true);
    bmm_each<false, NB>(n, Dk, [&](int u, int i, int j, int t, int c) {
        oq[t * ld + c] = acc[u][i][j];
    });
    bmm_each<false, NB>(n, Dk, [&](int u, int i, int j, int t, int c) {
        acc[u][i][j] = d.DC[t] * ka[t * Dk + c] - d.bt[t] * d.Gam[t] * kb[t * Dk + c];
    });
    bmm_reg<false, false, NB>(acc, E, LDC, K, ldk, n, Dk, n, 1.0f, 1.0f, true);
    bmm_reg<true, false, NB>(acc, E, LDC, K, ldk, n, Dk, n, 1.0f, 1.0f, true);
    bmm_reg<true, false, NB>(acc, Pd, LDC, Q, ldk, n, Dk, n, 1.0f, 1.0f, true);
    bmm_each<false, NB>(n, Dk, [&](int u, int i, int j, int t, int c) {
        ok[t * ld + c] = acc[u][i][j];
    });
}

static size_t grads_smem(int64_t Dk) {
    return DECAY_BYTES + (size_t)(4 * CH + 2 * CH * PAD_LD(Dk) + 2 * CH * LDC) * sizeof(float);
}

static gdn_args args_of(const keel_tensor *t) {
    gdn_args A;
    memset(&A, 0, sizeof A);
    A.q = kt_of(t->src[0]), A.k = kt_of(t->src[1]), A.v = kt_of(t->src[2]), A.g = kt_of(t->src[3]),
    A.beta = kt_of(t->src[4]);
    A.pos = kt_of(t->src[5]);
    if (t->op == KEEL_OP_GATED_DELTA_NET_BACK) A.dO = kt_of(t->src[6]);
    if (t->op == KEEL_OP_GATED_DELTA_NET_STATE) A.s0 = kt_of(t->src[6]);
    const keel_tensor *q = t->src[0], *v = t->src[2];
    A.Dk = q->ne[0], A.Hk = q->ne[1], A.T = q->ne[2], A.B = q->ne[3], A.Dv = v->ne[0], A.Hv = v->ne[1];
    A.half = t->ip[0] == KEEL_GDN_BF16_GRAD && t->op != KEEL_OP_GATED_DELTA_NET_STATE && A.Dk % 32 == 0 &&
             A.Dv % 32 == 0 && A.Dk <= STATE_TC_MAX && A.Dv <= STATE_TC_MAX;
    return A;
}

/* The scratch's arrays in four parts: what only the forward state pass reads (W, Kc, U0); what the
 * output and the backward read (Qg, Uc, Pm, Sc, GamC); what only the backward reads of the
 * preparation's (Kb, Ac, Am); the backward's own (dSc ... dGamC). A forward's scratch holds the
 * first two, a backward's all four, unless the plan carries the middle two from a forward to its
 * backward (keel_cuda_carry_bytes): then the forward's scratch holds the first, the backward's the
 * last, and the carried block the middle two, so the backward does not make them again. */
enum { PART_STATE = 1, PART_KEPT = 2, PART_BACK_KEPT = 4, PART_BACK = 8 };

/* Carve the given parts from p, in order (the arrays of one element a lane-chunk last, so that the
 * others stay 16-byte aligned); p NULL: only count. Returns the floats they take. */
static size_t carve(const gdn_args &A, int parts, float *p, gdn_scr *P) {
    size_t nlc = (size_t)(A.B * A.Hv) * (size_t)((A.T + CH - 1) / CH), rk = nlc * CH * (size_t)A.Dk,
           rv = nlc * CH * (size_t)A.Dv, rc = nlc * CH * CH, st = nlc * (size_t)(A.Dk * A.Dv), n = 0;
#define TAKE(field, count) (P->field = p ? p + n : NULL, n += (count))
    if (parts & PART_STATE) TAKE(W, rk), TAKE(Kc, rk), TAKE(U0, rv);
    if (parts & PART_KEPT) TAKE(Qg, rk), TAKE(Uc, A.half ? rv / 2 : rv), TAKE(Pm, rc), TAKE(Sc, st);
    if (parts & PART_BACK_KEPT) /* in bf16 (half, as Uc): half the floats, every array still 16-byte aligned */
        TAKE(Kb, A.half ? rk / 2 : rk), TAKE(Ac, A.half ? rk / 2 : rk), TAKE(Am, A.half ? rc / 2 : rc);
    if (parts & PART_BACK)
        TAKE(dSc, st), TAKE(dR, rv), TAKE(dQa, rk), TAKE(dKa, rk), TAKE(dKb, rk), TAKE(dPm, rc), TAKE(dMm, rc),
            TAKE(r3, nlc * CH * (A.half ? (size_t)(A.Dv / JB) : 1)), TAKE(Pd16, A.half ? rc / 2 : 0),
            TAKE(E16, A.half ? rc / 2 : 0);
    if (parts & PART_KEPT) TAKE(GamC, nlc);
    if (parts & PART_BACK) TAKE(dGamC, nlc);
#undef TAKE
    return n;
}

/* The parts of node t's own scratch: all its arrays, or, when the plan pairs it (carry_peer), those
 * the carried block does not hold */
static int own_parts(const keel_tensor *t) {
    bool bwd = t->op == KEEL_OP_GATED_DELTA_NET_BACK, carried = t->carry_peer != NULL;
    if (carried) return bwd ? PART_BACK : PART_STATE;
    return bwd ? PART_STATE | PART_KEPT | PART_BACK_KEPT | PART_BACK : PART_STATE | PART_KEPT;
}
#define CARRIED_PARTS (PART_KEPT | PART_BACK_KEPT)

size_t cuda_gdn_scratch(const keel_tensor *t) {
    gdn_scr P;
    return carve(args_of(t), own_parts(t), NULL, &P) * sizeof(float);
}

/* KEEL_CUDA_CARRY: 1 (or unset) carries the states, 0 does not (the memory of recompute off at the
 * price of the backward's time); -1 for any other value */
int cuda_carry_setting(void) {
    const char *e = getenv("KEEL_CUDA_CARRY");
    return !e || !*e || !strcmp(e, "1") ? 1 : !strcmp(e, "0") ? 0 : -1;
}

/* Node `reader`, a backward of the delta rule, carries the states its forward made when the graph
 * has that forward before it: the same op variant (ip0) over the same six inputs, none of them
 * written in place in between (then what the forward left would not be what the backward makes). */
size_t cuda_gdn_carry(const keel_graph *g, int64_t reader, int64_t *writer) {
    const keel_tensor *b = g->nodes[reader];
    if (b->op != KEEL_OP_GATED_DELTA_NET_BACK || cuda_carry_setting() != 1) return 0;
    for (int64_t j = reader - 1; j >= 0; j--) {
        const keel_tensor *f = g->nodes[j];
        bool same = f->op == KEEL_OP_GATED_DELTA_NET && f->ip[0] == b->ip[0];
        for (int s = 0; same && s < 6; s++) same = f->src[s] == b->src[s];
        if (same) {
            gdn_scr P;
            *writer = j;
            return carve(args_of(b), CARRIED_PARTS, NULL, &P) * sizeof(float);
        }
        if (f->view_src && !(keel_op_get(f->op)->flags & OPF_VIEW)) /* an in-place result */
            for (int s = 0; s < 6; s++)
                if (keel_root((keel_tensor *)b->src[s]) == f->view_src) return 0;
    }
    return 0;
}

/* Node t's scratch arrays: its own block, and the carried block when the plan carries one */
static int scratch_of(keel_backend *be, const keel_tensor *t, const gdn_args &A, gdn_scr *P) {
    memset(P, 0, sizeof *P);
    P->nc = (A.T + CH - 1) / CH;
    int own = own_parts(t);
    float *p = (float *)cuda_scratch(be, carve(A, own, NULL, P) * sizeof(float), t);
    if (!p) return -1;
    carve(A, own, p, P);
    if (!t->carry_peer) return 0;
    gdn_scr C;
    size_t need = carve(A, CARRIED_PARTS, NULL, &C) * sizeof(float);
    if (!t->carry || t->carry_bytes < need)
        return keel_fail("cuda: '%s': the delta rule's carried states take %zu bytes, %zu planned", t->name, need,
                         t->carry_bytes);
    carve(A, CARRIED_PARTS, (float *)t->carry, &C);
    P->Qg = C.Qg, P->Uc = C.Uc, P->Pm = C.Pm, P->Sc = C.Sc, P->GamC = C.GamC, P->Kb = C.Kb, P->Ac = C.Ac, P->Am = C.Am;
    return 0;
}

/* Whether the state pass is the tensor-core one, which also makes the output (k_gdn_state_tc) */
static bool state_tc(int tc, const gdn_args &A, const float *packed) {
    return tc && !packed && !A.s0.p && A.Dk <= STATE_TC_MAX && A.Dv <= STATE_TC_MAX;
}

/* The forward, and the backward's first half: prep, the state pass (S and U of every chunk; with o
 * and the tensor-core pass, the output too). TC: the products on the CUDA cores (0) or the tensor
 * cores (bmm_tc's precision; the op's ip0). */
template <int TC>
static int forward_states(keel_backend *be, const keel_tensor *t, const gdn_args &A, const gdn_scr &P, int bwd,
                          float *packed, float *o) {
    constexpr int PR = TC ? TC : 1; /* k_gdn_state_tc runs only for TC > 0; TC 0 needs a name to compile */
    dim3 chunks((unsigned)P.nc, (unsigned)(A.B * A.Hv)),
        lanes((unsigned)(A.B * A.Hv), (unsigned)((A.Dv + JB - 1) / JB));
    TILE_LAUNCH(k_gdn_prep<TC>, chunks, NT, prep_smem(A.Dk), "gated delta rule chunk preparation launch", A, P, bwd);
    if (state_tc(TC, A, packed)) {
        /* split tiles (the same bits) in split bf16 where the widths are whole warp tiles of 32 (a warp
         * tile past Dk or Dv would read past its rows, and past the last shared tile) */
        void (*st)(gdn_args, gdn_scr, float *) =
            TC == 2 && A.Dk % 32 == 0 && A.Dv % 32 == 0 ? k_gdn_state_tc<PR, PR == 2> : k_gdn_state_tc<PR, false>;
        TILE_LAUNCH(st, (unsigned)(A.B * A.Hv), NT, state_tc_smem(A.Dk, A.Dv, o != NULL),
                    "gated delta rule state pass launch", A, P, o);
    }
    else
        TILE_LAUNCH(k_gdn_state, lanes, NT, state_smem(A.Dk), "gated delta rule state pass launch", A, P, packed);
    return 0;
}

/* The products' precision (bmm_tc's PR) of the forward for the op's ip0: KEEL_GDN_ 0 float32, 1 split
 * TF32, 2 split bf16; 3 (KEEL_GDN_BF16_GRAD) runs the forward in split bf16 and only its backward's
 * products in one bf16 part (PR 3) */
static int forward_pr(int tc) { return tc == KEEL_GDN_BF16_GRAD ? KEEL_GDN_SPLIT_BF16 : tc; }

/* forward_states for the op's ip0 */
static int forward_any(int tc, keel_backend *be, const keel_tensor *t, const gdn_args &A, const gdn_scr &P, int bwd,
                       float *packed, float *o) {
    tc = forward_pr(tc);
    return tc == 2   ? forward_states<2>(be, t, A, P, bwd, packed, o)
           : tc == 1 ? forward_states<1>(be, t, A, P, bwd, packed, o)
                     : forward_states<0>(be, t, A, P, bwd, packed, o);
}

/* The grids' limits: lanes and column blocks along y (65535), chunks times their blocks along x */
static int grid_check(const gdn_args &A, const keel_tensor *t) {
    int64_t L = A.B * A.Hv, nc = (A.T + CH - 1) / CH,
            per = jo_blocks(A) > CONTRACT_PARTS ? jo_blocks(A) : CONTRACT_PARTS;
    if (L > 65535)
        return keel_fail("cuda: '%s': %lld lanes of the gated delta rule, the most is 65535", t->name, (long long)L);
    if ((A.Dv + JB - 1) / JB > 65535 || nc * per > INT32_MAX)
        return keel_fail("cuda: '%s': the gated delta rule's %lld steps of %lld value columns take more blocks than "
                         "a grid holds",
                         t->name, (long long)A.T, (long long)A.Dv);
    return 0;
}

int cuda_gdn_forward(keel_backend *be, const keel_tensor *t) {
    gdn_args A = args_of(t);
    if (A.B * A.Hv == 0 || A.Dv == 0 || A.T == 0) return 0;
    if (grid_check(A, t)) return -1;
    if (!keel_is_contiguous(t))
        return keel_fail("cuda: '%s': the gated delta rule writes a contiguous result", t->name);
    gdn_scr P;
    if (scratch_of(be, t, A, &P)) return -1;
    bool st = t->op == KEEL_OP_GATED_DELTA_NET_STATE;
    float *packed = st ? (float *)t->data : NULL;
    /* carrying its states to the backward, the preparation makes the backward's arrays too */
    int bwd = t->carry_peer != NULL;
    int tc = (int)t->ip[0];
    if (forward_any(tc, be, t, A, P, bwd, packed, (float *)t->data)) return -1;
    if (state_tc(tc, A, packed)) return 0; /* its state pass made the output */
    dim3 outs((unsigned)(P.nc * jo_blocks(A)), (unsigned)(A.B * A.Hv));
    tc = forward_pr(tc);
    void (*outk)(gdn_args, gdn_scr, float *) = tc == 2 ? k_gdn_out<2> : tc == 1 ? k_gdn_out<1> : k_gdn_out<0>;
    TILE_LAUNCH(outk, outs, NT, out_smem(A.Dk), "gated delta rule output launch", A, P, (float *)t->data);
    return 0;
}

template <int TC> static int backward(keel_backend *be, const keel_tensor *t, const gdn_args &A, const gdn_scr &P) {
    int64_t L = A.B * A.Hv;
    float *out = (float *)t->data;
    if (!t->carry_peer && forward_any((int)t->ip[0], be, t, A, P, 1, NULL, NULL))
        return -1; /* else its forward made them */
    dim3 outs((unsigned)(P.nc * jo_blocks(A)), (unsigned)L), chunks((unsigned)P.nc, (unsigned)L),
        parts((unsigned)(P.nc * CONTRACT_PARTS), (unsigned)L), lanes((unsigned)L, (unsigned)((A.Dv + JB - 1) / JB));
    TILE_LAUNCH(k_gdn_pre_back<TC>, outs, NT, pre_back_smem(A.Dk), "gated delta rule reverse preparation launch", A, P);
    void (*state_back)(gdn_args, gdn_scr, float *) =
        A.Dk <= 128 ? k_gdn_state_back<128 * JB / NT, TC, false> : k_gdn_state_back<256 * JB / NT, TC, false>;
    if (TC == 3 && A.half)
        state_back =
            A.Dk <= 128 ? k_gdn_state_back<128 * JB / NT, TC, TC == 3> : k_gdn_state_back<256 * JB / NT, TC, TC == 3>;
    TILE_LAUNCH(state_back, lanes, NT, state_back_smem(A.Dk, TC == 3 && A.half),
                "gated delta rule reverse state pass launch", A, P, out);
    /* split tiles (TC 2 and 3, the same bits) where Dk is whole warp tiles of 32 */
    bool sp = TC >= 2 && A.Dk % 32 == 0;
    void (*contract)(gdn_args, gdn_scr) = A.Dk <= 128
                                              ? (sp ? k_gdn_contract<TC, 2, TC >= 2> : k_gdn_contract<TC, 2, false>)
                                              : (sp ? k_gdn_contract<TC, 4, TC >= 2> : k_gdn_contract<TC, 4, false>);
    TILE_LAUNCH(contract, parts, NT, contract_smem(A.Dk), "gated delta rule contraction launch", A, P);
    void (*grads)(gdn_args, gdn_scr, float *) = A.Dk <= 128 ? k_gdn_grads<2, TC> : k_gdn_grads<4, TC>;
    TILE_LAUNCH(grads, chunks, NT, grads_smem(A.Dk), "gated delta rule gradient launch", A, P, out);
    return 0;
}

int cuda_gdn_backward(keel_backend *be, const keel_tensor *t) {
    gdn_args A = args_of(t);
    int64_t L = A.B * A.Hv;
    if (L == 0 || A.T == 0) return 0;
    if (A.Dv == 0) return cuda_check(cudaMemsetAsync(t->data, 0, keel_nbytes(t), cuda_im(be)->stream), "memset", t);
    if (grid_check(A, t)) return -1;
    gdn_scr P;
    if (scratch_of(be, t, A, &P)) return -1;
    int tc = (int)t->ip[0];
    return tc == 3   ? backward<3>(be, t, A, P)
           : tc == 2 ? backward<2>(be, t, A, P)
           : tc == 1 ? backward<1>(be, t, A, P)
                     : backward<0>(be, t, A, P);
}
