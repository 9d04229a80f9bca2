/* keel: the gated delta rule on CUDA, forward and backward. Per (batch, value head) lane, with the
 * state S (Dk x Dv), for each step t:  S = exp(g) S;  d = beta (v - S^T k);  S = S + k d^T;
 * o = S^T q. Column j of S only ever meets column j of the update, so the work is parallel over
 * batch, heads and value columns: one warp owns one column, its Dk entries spread over the 32
 * lanes in registers (Dk <= 256), and sums over Dk are warp butterflies (every lane ends with the
 * same bits). The backward pass keeps S at every GDN_CHUNK-th step and recomputes the states of a
 * chunk from there, as the cpu backend does. Sums over columns (dq, dk, dg, dbeta) are formed in
 * shared memory per block of columns, written per block, and summed over blocks in a fixed
 * order by a second kernel: no atomics anywhere, so results repeat bitwise. */
#include "backends/cuda/cuda_internal.h"

#define GDN_CHUNK 64
#define FWD_WARPS 8  /* columns per forward block */
#define BWD_WARPS 16 /* columns per backward block */

typedef struct {
    kt q, k, v, g, beta, dO, s0;
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

/* This lane's entries i = lane + 32 r of a Dk vector of the lane's head (0 beyond Dk). */
template <int R>
__device__ static inline void load_vec(const kt &x, int64_t Dk, int64_t h, int64_t t, int64_t b, float *out) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t i = lane + 32 * r;
        out[r] = i < Dk ? ldf(kt_at(x, i, h, t, b)) : 0.0f;
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
template <int R>
__global__ void k_gdn_fwd(gdn_args A, kt o, float *packed, int has_s0) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int64_t L = blockIdx.x, b = L / A.Hv, hv = L % A.Hv, hk = hv / (A.Hv / A.Hk);
    int64_t j = (int64_t)blockIdx.y * FWD_WARPS + w;
    if (j >= A.Dv) return; /* no block-wide barriers below */
    float S[R], k[R], q[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t i = lane + 32 * r;
        S[r] = has_s0 && i < A.Dk ? ldf(kt_at(A.s0, j, i, hv, b)) : 0.0f;
    }
    for (int64_t t = 0; t < A.T; t++) {
        load_vec<R>(A.k, A.Dk, hk, t, b, k);
        load_vec<R>(A.q, A.Dk, hk, t, b, q);
        float eg = expf(ldf(kt_at(A.g, hv, t, b, 0))), bt = ldf(kt_at(A.beta, hv, t, b, 0));
        float vj = ldf(kt_at(A.v, j, hv, t, b));
        step<R>(S, k, eg, bt, vj, NULL);
        float y = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) y += S[r] * q[r];
        y = warp_sum(y);
        if (lane == 0) {
            if (packed) packed[((b * A.T + t) * A.Hv + hv) * A.Dv + j] = y;
            else stf(kt_at(o, j, hv, t, b), y);
        }
    }
    if (packed) {
        float *fin = packed + A.Dv * A.Hv * A.T * A.B + (b * A.Hv + hv) * A.Dk * A.Dv;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int64_t i = lane + 32 * r;
            if (i < A.Dk) fin[i * A.Dv + j] = S[r];
        }
    }
}

typedef struct {
    float *ck;     /* [lane][Dv padded][n_chunks][Dk] states at chunk starts */
    float *cs;     /* [lane][Dv padded][GDN_CHUNK + 1][Dk] the states of the chunk being worked on */
    float *pq, *pk; /* [group][row][Dk] per-block-of-columns parts of dq, dk */
    double *pg, *pb; /* [group][row] parts of dg, dbeta */
    float *out;    /* the packed result */
    int64_t n_chunks, rows;
} gdn_bwd_buf;

template <int R>
__global__ void k_gdn_bwd(gdn_args A, gdn_bwd_buf W) {
    extern __shared__ float smem[]; /* [2][BWD_WARPS][Dk] dq parts, [2][BWD_WARPS][Dk] dk parts, then doubles */
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int64_t Dk = A.Dk, Dv = A.Dv, T = A.T, Hv = A.Hv;
    int64_t L = blockIdx.x, b = L / Hv, hv = L % Hv, hk = hv / (Hv / A.Hk), grp = blockIdx.y;
    int64_t j = grp * BWD_WARPS + w;
    bool act = j < Dv;
    int64_t jj = act ? j : 0; /* inactive warps shadow column 0 but contribute nothing */
    float *sq = smem, *sk = smem + 2 * BWD_WARPS * Dk;
    double *sd = (double *)(smem + 4 * BWD_WARPS * Dk); /* [2][BWD_WARPS][2]: dg, dbeta */
    /* scratch columns are padded to whole blocks, so an inactive warp scribbles only on its own */
    int64_t Dvp = gridDim.y * BWD_WARPS;
    float *ck = W.ck + (L * Dvp + j) * W.n_chunks * Dk, *cs = W.cs + (L * Dvp + j) * (GDN_CHUNK + 1) * Dk;
    int64_t off_dk = Dk * Hv * T * A.B, off_dv = 2 * off_dk;
    float S[R], k[R], q[R], dS[R];
    /* forward, keeping the state at each chunk start */
#pragma unroll
    for (int r = 0; r < R; r++) S[r] = 0.0f;
    for (int64_t t = 0; t < T; t++) {
        if (t % GDN_CHUNK == 0) {
#pragma unroll
            for (int r = 0; r < R; r++)
                if (lane + 32 * r < Dk) ck[(t / GDN_CHUNK) * Dk + lane + 32 * r] = S[r];
        }
        load_vec<R>(A.k, Dk, hk, t, b, k);
        step<R>(S, k, expf(ldf(kt_at(A.g, hv, t, b, 0))), ldf(kt_at(A.beta, hv, t, b, 0)), ldf(kt_at(A.v, jj, hv, t, b)), NULL);
    }
#pragma unroll
    for (int r = 0; r < R; r++) dS[r] = 0.0f;
    for (int64_t ch = W.n_chunks - 1; ch >= 0; ch--) {
        int64_t t0 = ch * GDN_CHUNK, t1 = t0 + GDN_CHUNK < T ? t0 + GDN_CHUNK : T;
        /* recompute the chunk's states; each lane reads back only what it wrote itself */
#pragma unroll
        for (int r = 0; r < R; r++) {
            int64_t i = lane + 32 * r;
            S[r] = i < Dk ? ck[ch * Dk + i] : 0.0f;
            if (i < Dk) cs[i] = S[r];
        }
        for (int64_t t = t0; t < t1; t++) {
            load_vec<R>(A.k, Dk, hk, t, b, k);
            step<R>(S, k, expf(ldf(kt_at(A.g, hv, t, b, 0))), ldf(kt_at(A.beta, hv, t, b, 0)), ldf(kt_at(A.v, jj, hv, t, b)), NULL);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (lane + 32 * r < Dk) cs[(t - t0 + 1) * Dk + lane + 32 * r] = S[r];
        }
        for (int64_t t = t1 - 1; t >= t0; t--) {
            int buf = (int)(t & 1);
            float Sa[R], St[R];
            load_vec<R>(A.k, Dk, hk, t, b, k);
            load_vec<R>(A.q, Dk, hk, t, b, q);
            float eg = expf(ldf(kt_at(A.g, hv, t, b, 0))), bt = ldf(kt_at(A.beta, hv, t, b, 0));
            float vj = ldf(kt_at(A.v, jj, hv, t, b)), dOj = ldf(kt_at(A.dO, jj, hv, t, b));
            int64_t row = (b * T + t) * Hv + hv;
            float u = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int64_t i = lane + 32 * r;
                Sa[r] = i < Dk ? eg * cs[(t - t0) * Dk + i] : 0.0f;
                St[r] = i < Dk ? cs[(t - t0 + 1) * Dk + i] : 0.0f;
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
                for (int x = 0; x < BWD_WARPS; x++) a1 += sq[(buf * BWD_WARPS + x) * Dk + tid], a2 += sk[(buf * BWD_WARPS + x) * Dk + tid];
                W.pq[(grp * W.rows + row) * Dk + tid] = a1;
                W.pk[(grp * W.rows + row) * Dk + tid] = a2;
            } else if (tid == (int)blockDim.x - 1) {
                double g1 = 0.0, b1 = 0.0;
                for (int x = 0; x < BWD_WARPS; x++) g1 += sd[(buf * BWD_WARPS + x) * 2], b1 += sd[(buf * BWD_WARPS + x) * 2 + 1];
                W.pg[grp * W.rows + row] = g1;
                W.pb[grp * W.rows + row] = b1;
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
    A.q = kt_of(t->src[0]), A.k = kt_of(t->src[1]), A.v = kt_of(t->src[2]), A.g = kt_of(t->src[3]), A.beta = kt_of(t->src[4]);
    if (t->op == KEEL_OP_GATED_DELTA_NET_BACK) A.dO = kt_of(t->src[5]);
    if (t->op == KEEL_OP_GATED_DELTA_NET_STATE) A.s0 = kt_of(t->src[5]);
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
    if (A.Dk <= 128) k_gdn_fwd<4><<<grid, FWD_WARPS * 32, 0, s>>>(A, o, packed, st ? 1 : 0);
    else k_gdn_fwd<8><<<grid, FWD_WARPS * 32, 0, s>>>(A, o, packed, st ? 1 : 0);
    return cuda_check(cudaGetLastError(), "gated delta rule forward launch", t);
}

int cuda_gdn_backward(keel_backend *be, const keel_tensor *t) {
    gdn_args A = args_of(t);
    int64_t L = A.B * A.Hv, G = (A.Dv + BWD_WARPS - 1) / BWD_WARPS;
    gdn_bwd_buf W;
    W.n_chunks = (A.T + GDN_CHUNK - 1) / GDN_CHUNK;
    W.rows = A.B * A.T * A.Hv;
    W.out = (float *)t->data;
    if (L == 0 || A.T == 0) return 0;
    if (A.Dv == 0) return cuda_check(cudaMemsetAsync(t->data, 0, keel_nbytes(t), cuda_im(be)->stream), "memset", t);
    int64_t Dvp = G * BWD_WARPS;
    size_t n_ck = (size_t)(L * Dvp * W.n_chunks * A.Dk), n_cs = (size_t)(L * Dvp * (GDN_CHUNK + 1) * A.Dk);
    size_t n_p = (size_t)(G * W.rows * A.Dk), n_d = (size_t)(G * W.rows);
    size_t bytes = (n_ck + n_cs + 2 * n_p) * sizeof(float) + 2 * n_d * sizeof(double) + 256;
    char *base = (char *)cuda_scratch(be, bytes, t);
    if (!base) return -1;
    W.pg = (double *)base, W.pb = W.pg + n_d; /* doubles first: aligned */
    W.ck = (float *)(W.pb + n_d), W.cs = W.ck + n_ck, W.pq = W.cs + n_cs, W.pk = W.pq + n_p;
    size_t shm = 4 * BWD_WARPS * (size_t)A.Dk * sizeof(float) + 4 * BWD_WARPS * sizeof(double);
    dim3 grid((unsigned)L, (unsigned)G);
    cudaStream_t s = cuda_im(be)->stream;
    if (A.Dk <= 128) {
        if (cuda_check(cudaFuncSetAttribute(k_gdn_bwd<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm), "shared memory limit", t)) return -1;
        k_gdn_bwd<4><<<grid, BWD_WARPS * 32, shm, s>>>(A, W);
    } else {
        if (cuda_check(cudaFuncSetAttribute(k_gdn_bwd<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm), "shared memory limit", t)) return -1;
        k_gdn_bwd<8><<<grid, BWD_WARPS * 32, shm, s>>>(A, W);
    }
    if (cuda_check(cudaGetLastError(), "gated delta rule backward launch", t)) return -1;
    int64_t off_dk = A.Dk * A.Hv * A.T * A.B, off_dg = 2 * off_dk + A.Dv * A.Hv * A.T * A.B, off_db = off_dg + A.Hv * A.T * A.B;
    int64_t n = W.rows * A.Dk + W.rows;
    k_gdn_reduce<<<cuda_blocks(n, 256), 256, 0, s>>>(W, G, A.Dk, off_dk, off_dg, off_db);
    return cuda_check(cudaGetLastError(), "gated delta rule reduction launch", t);
}
