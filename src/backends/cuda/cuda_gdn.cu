/* keel: the gated delta rule on CUDA, forward and backward. Per (batch, value head) lane, with the
 * state S (Dk x Dv), for each step t:  S = exp(g) S;  d = beta (v - S^T k);  S = S + k d^T;
 * o = S^T q. Column j of S only ever meets column j of the update, so the work is parallel over
 * batch, heads and value columns: one warp owns one column, its Dk entries spread over the 32
 * lanes in registers (Dk <= 256), and sums over Dk are warp butterflies (every lane ends with the
 * same bits). The backward pass keeps S at every GDN_SUB-th step and recomputes the states of a
 * sub-chunk from there, as the cpu backend does (there every 64th): the states of a sub-chunk of
 * the whole GPU (~37 MB for a 0.8B layer) stay in L2, so reading them back in reverse, one step
 * ahead, does not wait on HBM. Checkpoints do not change results: a recomputed state has the same
 * bits as the first. Sums over columns (dq, dk, dg, dbeta) are formed in
 * shared memory per block of columns, written per block, and summed over blocks in a fixed
 * order by a second kernel: no atomics anywhere, so results repeat bitwise. */
#include "backends/cuda/cuda_internal.h"

#define GDN_CHUNK 64 /* backward: inputs staged this many steps at a time */
#define GDN_SUB   16 /* backward: states kept every GDN_SUB steps (divides GDN_CHUNK) */
#define FWD_CHUNK 32 /* forward: steps staged at a time (a smaller stage lets 4 blocks share an SM) */
#define FWD_WARPS 8  /* columns per forward block */
#define BWD_WARPS 16 /* columns per backward block */

typedef struct {
    kt q, k, v, g, beta, pos, dO, s0;
    int64_t Dk, Hk, T, B, Dv, Hv;
} gdn_args;

__device__ static inline float warp_sum(float x) {
    for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}
__device__ static inline double warp_sum_d(double x) {
    for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

/* The inputs of a chunk of steps of one (batch, head) lane, staged in shared memory by the whole
 * block with coalesced loads, so the sequential recurrence reads them at shared-memory latency:
 * k and q [steps][Dk], v and dO [steps][cols] for the block's columns, exp(g) and beta [steps]. */
typedef struct {
    float *k, *q, *v, *dO, *eg, *beta;
} stage;

__host__ __device__ static size_t stage_floats(int chunk, int64_t Dk, int cols, bool with_do) {
    return (size_t)chunk * (size_t)(2 * Dk + cols * (with_do ? 2 : 1) + 2);
}

__device__ static stage stage_at(float *base, int chunk, int64_t Dk, int cols, bool with_do) {
    stage st;
    st.k = base, st.q = st.k + chunk * Dk, st.v = st.q + chunk * Dk;
    st.dO = with_do ? st.v + chunk * cols : NULL;
    st.eg = st.v + chunk * cols * (with_do ? 2 : 1), st.beta = st.eg + chunk;
    return st;
}

/* Fill the stage with steps [t0, t0 + n) of lane (b, hv); columns j0 .. j0 + cols - 1 (0 past Dv). */
__device__ static void stage_load(const stage &st, const gdn_args &A, int64_t b, int64_t hv, int64_t hk, int64_t t0,
                                  int n, int64_t j0, int cols, bool with_q) {
    int Dk = (int)A.Dk;
    for (int x = threadIdx.x; x < n * Dk; x += blockDim.x) {
        int s = x / Dk, i = x - s * Dk;
        st.k[x] = ldf(kt_at(A.k, i, hk, t0 + s, b));
        if (with_q) st.q[x] = ldf(kt_at(A.q, i, hk, t0 + s, b));
    }
    for (int x = threadIdx.x; x < n * cols; x += blockDim.x) {
        int s = x / cols, c = x - s * cols;
        bool in = j0 + c < A.Dv;
        st.v[x] = in ? ldf(kt_at(A.v, j0 + c, hv, t0 + s, b)) : 0.0f;
        if (st.dO) st.dO[x] = in ? ldf(kt_at(A.dO, j0 + c, hv, t0 + s, b)) : 0.0f;
    }
    for (int x = threadIdx.x; x < n; x += blockDim.x) {
        /* an example starts here (position 0): a decay of exactly 0 resets the state (forward)
         * and stops dS flowing into the previous example (backward) */
        st.eg[x] = pos_at(A.pos, t0 + x, b) == 0 ? 0.0f : expf(ldf(kt_at(A.g, hv, t0 + x, b, 0)));
        st.beta[x] = ldf(kt_at(A.beta, hv, t0 + x, b, 0));
    }
}

/* This lane's entries i = lane + 32 r of a staged Dk vector (0 beyond Dk). */
template <int R> __device__ static inline void lane_vec(const float *x, int64_t Dk, float *out) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t i = lane + 32 * r;
        out[r] = i < Dk ? x[i] : 0.0f;
    }
}

/* One step on this warp's column: S <- eg S; u = S^T k; d = beta (v - u); S <- S + k d. */
template <int R>
__device__ static inline float step(float *S, const float *k, float eg, float bt, float vj, float *u_out) {
    float u = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        S[r] *= eg;
        u += S[r] * k[r];
    }
    u = warp_sum(u);
    float d = bt * (vj - u);
#pragma unroll
    for (int r = 0; r < R; r++) S[r] += k[r] * d;
    if (u_out) *u_out = u;
    return d;
}

/* Forward (and the decoding variant with an initial state s0 and a packed [o | final state]). */
/* Four 8-warp blocks share an SM (registers <= 64, a 33 KiB stage): the lanes of a 0.8B layer
 * take 2 waves of blocks. */
template <int R>
__global__ void __launch_bounds__(FWD_WARPS * 32, R <= 4 ? 4 : 2)
    k_gdn_fwd(gdn_args A, kt o, float *packed, int has_s0) {
    extern __shared__ float smem[];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int64_t L = blockIdx.x, b = L / A.Hv, hv = L % A.Hv, hk = hv / (A.Hv / A.Hk);
    int64_t j0 = (int64_t)blockIdx.y * FWD_WARPS, j = j0 + w;
    bool act = j < A.Dv; /* inactive warps still load and meet the barriers */
    stage st = stage_at(smem, FWD_CHUNK, A.Dk, FWD_WARPS, false);
    float S[R], k[R], q[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t i = lane + 32 * r;
        S[r] = act && has_s0 && i < A.Dk ? ldf(kt_at(A.s0, j, i, hv, b)) : 0.0f;
    }
    for (int64_t t0 = 0; t0 < A.T; t0 += FWD_CHUNK) {
        int n = (int)(A.T - t0 < FWD_CHUNK ? A.T - t0 : FWD_CHUNK);
        __syncthreads(); /* the previous chunk is consumed */
        stage_load(st, A, b, hv, hk, t0, n, j0, FWD_WARPS, true);
        __syncthreads();
        if (!act) continue;
        for (int s = 0; s < n; s++) {
            lane_vec<R>(st.k + s * A.Dk, A.Dk, k);
            lane_vec<R>(st.q + s * A.Dk, A.Dk, q);
            step<R>(S, k, st.eg[s], st.beta[s], st.v[s * FWD_WARPS + w], NULL);
            float y = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) y += S[r] * q[r];
            y = warp_sum(y);
            if (lane == 0) {
                int64_t t = t0 + s;
                if (packed)
                    packed[((b * A.T + t) * A.Hv + hv) * A.Dv + j] = y;
                else
                    stf(kt_at(o, j, hv, t, b), y);
            }
        }
    }
    if (packed && act) {
        float *fin = packed + A.Dv * A.Hv * A.T * A.B + (b * A.Hv + hv) * A.Dk * A.Dv;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int64_t i = lane + 32 * r;
            if (i < A.Dk) fin[i * A.Dv + j] = S[r];
        }
    }
}

typedef struct {
    float *ck;       /* [lane][Dv padded][n_subs][Dk] states at sub-chunk starts */
    float *cs;       /* [lane][Dv padded][GDN_SUB + 1][Dk] the states of the sub-chunk being worked on */
    float *pq, *pk;  /* [group][row][Dk] per-block-of-columns parts of dq, dk */
    double *pg, *pb; /* [group][row] parts of dg, dbeta */
    float *out;      /* the packed result */
    int64_t n_chunks, n_subs, rows;
} gdn_bwd_buf;

/* Two blocks per SM when a column fits 4 registers a lane (Dk <= 128): with the register count
 * capped at 64 the 16-warp blocks run two to an SM, so the lanes of a 0.8B layer take 2 waves of
 * blocks instead of 4. */
template <int R>
__global__ void __launch_bounds__(BWD_WARPS * 32, R <= 4 ? 2 : 1) k_gdn_bwd(gdn_args A, gdn_bwd_buf W) {
    /* shared: the stage, then [2][BWD_WARPS][Dk] dq parts, [2][BWD_WARPS][Dk] dk parts, then
     * [2][BWD_WARPS][2] doubles (dg, dbeta parts) */
    extern __shared__ float smem[];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int64_t Dk = A.Dk, Dv = A.Dv, T = A.T, Hv = A.Hv;
    int64_t L = blockIdx.x, b = L / Hv, hv = L % Hv, hk = hv / (Hv / A.Hk), grp = blockIdx.y;
    int64_t j0 = grp * BWD_WARPS, j = j0 + w;
    bool act = j < Dv;
    stage st = stage_at(smem, GDN_CHUNK, Dk, BWD_WARPS, true);
    float *sq = smem + stage_floats(GDN_CHUNK, Dk, BWD_WARPS, true), *sk = sq + 2 * BWD_WARPS * Dk;
    double *sd = (double *)(sk + 2 * BWD_WARPS * Dk);
    /* scratch columns are padded to whole blocks, so an inactive warp scribbles only on its own */
    int64_t Dvp = gridDim.y * BWD_WARPS;
    float *ck = W.ck + (L * Dvp + j) * W.n_subs * Dk, *cs = W.cs + (L * Dvp + j) * (GDN_SUB + 1) * Dk;
    int64_t off_dk = Dk * Hv * T * A.B, off_dv = 2 * off_dk;
    float S[R], k[R], q[R], dS[R];
    /* forward, keeping the state at each sub-chunk start */
#pragma unroll
    for (int r = 0; r < R; r++) S[r] = 0.0f;
    for (int64_t ch = 0; ch < W.n_chunks; ch++) {
        int64_t t0 = ch * GDN_CHUNK;
        int n = (int)(T - t0 < GDN_CHUNK ? T - t0 : GDN_CHUNK);
        __syncthreads();
        stage_load(st, A, b, hv, hk, t0, n, j0, BWD_WARPS, false);
        __syncthreads();
        for (int s = 0; s < n; s++) {
            if (s % GDN_SUB == 0) {
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (lane + 32 * r < Dk) ck[((t0 + s) / GDN_SUB) * Dk + lane + 32 * r] = S[r];
            }
            lane_vec<R>(st.k + s * Dk, Dk, k);
            step<R>(S, k, st.eg[s], st.beta[s], st.v[s * BWD_WARPS + w], NULL);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) dS[r] = 0.0f;
    for (int64_t ch = W.n_chunks - 1; ch >= 0; ch--) {
        int64_t t0 = ch * GDN_CHUNK;
        int n = (int)(T - t0 < GDN_CHUNK ? T - t0 : GDN_CHUNK);
        __syncthreads(); /* everyone is done with the previous chunk's stage */
        stage_load(st, A, b, hv, hk, t0, n, j0, BWD_WARPS, true);
        __syncthreads();
        for (int s0 = (n - 1) / GDN_SUB * GDN_SUB; s0 >= 0; s0 -= GDN_SUB) {
            int m = n - s0 < GDN_SUB ? n - s0 : GDN_SUB; /* steps s0 .. s0 + m - 1 of the stage */
            /* recompute the sub-chunk's states; each lane reads back only what it wrote itself */
#pragma unroll
            for (int r = 0; r < R; r++) {
                int64_t i = lane + 32 * r;
                S[r] = i < Dk ? ck[((t0 + s0) / GDN_SUB) * Dk + i] : 0.0f;
                if (i < Dk) cs[i] = S[r];
            }
            for (int s = 0; s < m; s++) {
                lane_vec<R>(st.k + (s0 + s) * Dk, Dk, k);
                step<R>(S, k, st.eg[s0 + s], st.beta[s0 + s], st.v[(s0 + s) * BWD_WARPS + w], NULL);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (lane + 32 * r < Dk) cs[(s + 1) * Dk + lane + 32 * r] = S[r];
            }
            /* St of the last step is the state just computed; Sp of step s is loaded one step ahead */
            float St[R], Sp[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                St[r] = S[r];
                Sp[r] = lane + 32 * r < Dk ? cs[(m - 1) * Dk + lane + 32 * r] : 0.0f;
            }
            for (int s = m - 1; s >= 0; s--) {
                int x = s0 + s; /* the step within the stage */
                int64_t t = t0 + x;
                int buf = (int)(t & 1);
                float Sn[R]; /* the previous step's Sp, in flight while this step computes */
#pragma unroll
                for (int r = 0; r < R; r++)
                    Sn[r] = s > 0 && lane + 32 * r < Dk ? cs[(s - 1) * Dk + lane + 32 * r] : 0.0f;
                lane_vec<R>(st.k + x * Dk, Dk, k);
                lane_vec<R>(st.q + x * Dk, Dk, q);
                float eg = st.eg[x], bt = st.beta[x], vj = st.v[x * BWD_WARPS + w], dOj = st.dO[x * BWD_WARPS + w];
                int64_t row = (b * T + t) * Hv + hv;
                float Sa[R], u = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    Sa[r] = eg * Sp[r];
                    u += Sa[r] * k[r];
                }
                u = warp_sum(u);
                float d = bt * (vj - u);
                /* o = St^T q: dq gets St dO; dS += q dO^T */
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int64_t i = lane + 32 * r;
                    if (i < Dk) sq[(buf * BWD_WARPS + w) * Dk + i] = act ? St[r] * dOj : 0.0f;
                    dS[r] += q[r] * dOj;
                }
                /* St = Sa + k d^T: dd = dS^T k, dv = beta dd, dbeta = dd (v - u), du = -beta dd */
                float dd = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) dd += dS[r] * k[r];
                dd = warp_sum(dd);
                float du = -bt * dd;
                if (act && lane == 0) W.out[off_dv + row * Dv + j] = bt * dd;
                /* dk = dS d + Sa du; dSa = dS + k du^T; dg = sum(Sa dSa); dS_prev = eg dSa */
                double dg = 0.0;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int64_t i = lane + 32 * r;
                    if (i < Dk) sk[(buf * BWD_WARPS + w) * Dk + i] = act ? dS[r] * d + Sa[r] * du : 0.0f;
                    float v2 = dS[r] + k[r] * du;
                    dg += (double)Sa[r] * v2;
                    dS[r] = eg * v2;
                }
                dg = warp_sum_d(dg);
                if (lane == 0) {
                    sd[(buf * BWD_WARPS + w) * 2] = act ? dg : 0.0;
                    sd[(buf * BWD_WARPS + w) * 2 + 1] = act ? (double)dd * (vj - u) : 0.0;
                }
                __syncthreads();
                /* this block's sums over its columns, in warp order; the buffers alternate with t, so
                 * one barrier per step keeps the next step's writes off what is being read here */
                int tid = threadIdx.x;
                if (tid < Dk) {
                    float a1 = 0.0f, a2 = 0.0f;
                    for (int y = 0; y < BWD_WARPS; y++)
                        a1 += sq[(buf * BWD_WARPS + y) * Dk + tid], a2 += sk[(buf * BWD_WARPS + y) * Dk + tid];
                    W.pq[(grp * W.rows + row) * Dk + tid] = a1;
                    W.pk[(grp * W.rows + row) * Dk + tid] = a2;
                } else if (tid == (int)blockDim.x - 1) {
                    double g1 = 0.0, b1 = 0.0;
                    for (int y = 0; y < BWD_WARPS; y++)
                        g1 += sd[(buf * BWD_WARPS + y) * 2], b1 += sd[(buf * BWD_WARPS + y) * 2 + 1];
                    W.pg[grp * W.rows + row] = g1;
                    W.pb[grp * W.rows + row] = b1;
                }
#pragma unroll
                for (int r = 0; r < R; r++) St[r] = Sp[r], Sp[r] = Sn[r];
            }
        }
    }
}

/* Sum the blocks' parts in block order into the packed [dq | dk | dv | dg | dbeta]. */
__global__ void k_gdn_reduce(gdn_bwd_buf W, int64_t G, int64_t Dk, int64_t off_dk, int64_t off_dg, int64_t off_db) {
    int64_t nv = W.rows * Dk;
    GRID_STRIDE(e, nv + W.rows) {
        if (e < nv) {
            float a1 = 0.0f, a2 = 0.0f;
            for (int64_t g = 0; g < G; g++) a1 += W.pq[g * nv + e], a2 += W.pk[g * nv + e];
            W.out[e] = a1;
            W.out[off_dk + e] = a2;
        } else {
            int64_t r = e - nv;
            double g1 = 0.0, b1 = 0.0;
            for (int64_t g = 0; g < G; g++) g1 += W.pg[g * W.rows + r], b1 += W.pb[g * W.rows + r];
            W.out[off_dg + r] = (float)g1;
            W.out[off_db + r] = (float)b1;
        }
    }
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
    return A;
}

int cuda_gdn_forward(keel_backend *be, const keel_tensor *t) {
    gdn_args A = args_of(t);
    if (A.B * A.Hv == 0 || A.Dv == 0 || A.T == 0) return 0;
    bool st = t->op == KEEL_OP_GATED_DELTA_NET_STATE;
    dim3 grid((unsigned)(A.B * A.Hv), (unsigned)((A.Dv + FWD_WARPS - 1) / FWD_WARPS));
    kt o = kt_of(t);
    float *packed = st ? (float *)t->data : NULL;
    cudaStream_t s = cuda_im(be)->stream;
    size_t shm = stage_floats(FWD_CHUNK, A.Dk, FWD_WARPS, false) * sizeof(float);
    if (A.Dk <= 128) {
        if (cuda_check(cudaFuncSetAttribute(k_gdn_fwd<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm),
                       "shared memory limit", t))
            return -1;
        k_gdn_fwd<4><<<grid, FWD_WARPS * 32, shm, s>>>(A, o, packed, st ? 1 : 0);
    } else {
        if (cuda_check(cudaFuncSetAttribute(k_gdn_fwd<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm),
                       "shared memory limit", t))
            return -1;
        k_gdn_fwd<8><<<grid, FWD_WARPS * 32, shm, s>>>(A, o, packed, st ? 1 : 0);
    }
    return cuda_check(cudaGetLastError(), "gated delta rule forward launch", t);
}

int cuda_gdn_backward(keel_backend *be, const keel_tensor *t) {
    gdn_args A = args_of(t);
    int64_t L = A.B * A.Hv, G = (A.Dv + BWD_WARPS - 1) / BWD_WARPS;
    gdn_bwd_buf W;
    W.n_chunks = (A.T + GDN_CHUNK - 1) / GDN_CHUNK;
    W.n_subs = (A.T + GDN_SUB - 1) / GDN_SUB;
    W.rows = A.B * A.T * A.Hv;
    W.out = (float *)t->data;
    if (L == 0 || A.T == 0) return 0;
    if (A.Dv == 0) return cuda_check(cudaMemsetAsync(t->data, 0, keel_nbytes(t), cuda_im(be)->stream), "memset", t);
    int64_t Dvp = G * BWD_WARPS;
    size_t n_ck = (size_t)(L * Dvp * W.n_subs * A.Dk), n_cs = (size_t)(L * Dvp * (GDN_SUB + 1) * A.Dk);
    size_t n_p = (size_t)(G * W.rows * A.Dk), n_d = (size_t)(G * W.rows);
    size_t bytes = (n_ck + n_cs + 2 * n_p) * sizeof(float) + 2 * n_d * sizeof(double) + 256;
    char *base = (char *)cuda_scratch(be, bytes, t);
    if (!base) return -1;
    W.pg = (double *)base, W.pb = W.pg + n_d; /* doubles first: aligned */
    W.ck = (float *)(W.pb + n_d), W.cs = W.ck + n_ck, W.pq = W.cs + n_cs, W.pk = W.pq + n_p;
    size_t shm = (stage_floats(GDN_CHUNK, A.Dk, BWD_WARPS, true) + 4 * BWD_WARPS * (size_t)A.Dk) * sizeof(float) +
                 4 * BWD_WARPS * sizeof(double);
    dim3 grid((unsigned)L, (unsigned)G);
    cudaStream_t s = cuda_im(be)->stream;
    if (A.Dk <= 128) {
        if (cuda_check(cudaFuncSetAttribute(k_gdn_bwd<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm),
                       "shared memory limit", t))
            return -1;
        k_gdn_bwd<4><<<grid, BWD_WARPS * 32, shm, s>>>(A, W);
    } else {
        if (cuda_check(cudaFuncSetAttribute(k_gdn_bwd<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm),
                       "shared memory limit", t))
            return -1;
        k_gdn_bwd<8><<<grid, BWD_WARPS * 32, shm, s>>>(A, W);
    }
    if (cuda_check(cudaGetLastError(), "gated delta rule backward launch", t)) return -1;
    int64_t off_dk = A.Dk * A.Hv * A.T * A.B, off_dg = 2 * off_dk + A.Dv * A.Hv * A.T * A.B,
            off_db = off_dg + A.Hv * A.T * A.B;
    int64_t n = W.rows * A.Dk + W.rows;
    k_gdn_reduce<<<cuda_blocks(n, 256), 256, 0, s>>>(W, G, A.Dk, off_dk, off_dg, off_db);
    return cuda_check(cudaGetLastError(), "gated delta rule reduction launch", t);
}
