/* keel: LINEAR_CROSS_ENTROPY and its backward on CUDA: the language-model head and its loss a chunk
 * of tokens at a time, so that only one chunk's logits [V, chunk] exist (in the node's planned
 * scratch, never in the graph). Per chunk: logits = W^T x_c by cuBLAS (float32 sums; float32
 * operands and logits, or bf16 operands and logits rounded to bf16, as PyTorch's autocast and the
 * plan have them; ref and cpu round them the same way); then the rows' statistics by segments of
 * SEG logits (a block a segment of a token's row: its max and its float64 sum of exp against that
 * max, one read of the logits; on bf16 logits a thread's terms are summed in float32 first, see
 * lce_exp), combined per token in segment order by a thread a token (the row's
 * max, and the sum rescaled to it in float64), which also makes the token's loss as a float64
 * partial (forward); then each segment turned into g = (softmax - onehot) dloss / D (backward: the
 * second and last read), then dx_c = W g and
 * dW (+)= x_c g^T by cuBLAS, the chunks in order (beta 0 for the first, 1 after); the forward with
 * ip1 does both, the loss and then the gradients for dloss 1, from one product of each chunk's
 * logits (the backward's bits: the same kernels on the same logits). g replaces the logits in
 * place, element by element: with bf16 operands it goes to the tensor cores rounded once to bf16
 * (ref and cpu round it the same way, so every backend computes one function). The partials are
 * summed by one block in token order. No atomics: the same bits every run. */
#include <cuda_bf16.h>

#include "backends/cuda/cuda_internal.h"

#define LT  KEEL_CUDA_RT /* threads of a segment's block */
#define SEG 4096         /* logits of a segment: 16 a thread, held in registers between the max and the sum */

__host__ __device__ static inline int64_t segments(int64_t V) { return (V + SEG - 1) / SEG; }

/* a logit (or its gradient) as float32, and back in its type (bf16: round to nearest even) */
__device__ static inline float zf(float z) { return z; }
__device__ static inline float zf(__nv_bfloat16 z) { return __bfloat162float(z); }
__device__ static inline void zset(float *p, float v) { *p = v; }
__device__ static inline void zset(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* The logits a thread of a segment's block holds: element i of its SEG / LT is the segment's
 * element seg_at<P2>(i). P2 (bf16 logits, V even): pairs, thread t's pair i the segment's pair
 * t + i LT (one 4-byte load or store a pair); else thread t's element i is t + i LT. */
template <bool P2> __device__ static inline int seg_at(int i) {
    return P2 ? 2 * ((int)threadIdx.x + (i >> 1) * LT) + (i & 1) : (int)threadIdx.x + i * LT;
}

/* The block's max over its LT / 32 warps: a butterfly of shuffles in each warp, then the warps'
 * maxima; every thread ends with the same value (maxima commute). */
__device__ static inline float seg_max(float v, float *sw) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = sw[0];
    for (int i = 1; i < LT / 32; i++) m = fmaxf(m, sw[i]);
    return m;
}

/* The block's sum, for thread 0: a butterfly of shuffles in each warp (each lane's sums are its
 * partner's, commuted: the same bits), then the warps' sums in warp order. */
__device__ static inline double seg_sum(double v, double *sw) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    if (threadIdx.x == 0)
        for (int i = 0; i < LT / 32; i++) s += sw[i];
    return s;
}

/* e^x for x = a logit less its row's max (x <= 0, or -inf). Float32 logits (the parity mode): expf,
 * and the statistics' sums take each term in float64, as they always have. Bf16 logits: __expf
 * (ex2.approx of x log2 e: a few float32 ulps, and the product's rounding, about |x| 2^-24 of the
 * result), where each logit already carries its bf16 rounding (2^-9) and the gradient goes back
 * rounded to bf16; a thread's 16 terms are summed in float32 (each at most 1: within about 2^-20 of the
 * sum) before the float64 sums across threads. The bf16 statistics were issue-bound (ncu: 89% of
 * the issue slots busy, expf's dozen instructions and a float64 conversion and add a logit). */
template <typename T> __device__ static inline float lce_exp(float x) {
    if constexpr (sizeof(T) == 2)
        return __expf(x);
    else
        return expf(x);
}

/* Segment blockIdx.y of token blockIdx.x's logits row: its max (smax) and sum of exp (ssum), its
 * SEG logits held in registers between the two (16 a thread), the reductions by warps */
template <typename T, bool P2> __global__ void k_lce_stats(const T *L, int64_t V, float *smax, double *ssum) {
    __shared__ float swm[LT / 32];
    __shared__ double sws[LT / 32];
    int64_t row = blockIdx.x, v0 = (int64_t)blockIdx.y * SEG, ns = gridDim.y;
    const T *z = L + row * V + v0;
    int w = (int)(V - v0 < SEG ? V - v0 : SEG);
    float r[SEG / LT], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < SEG / LT; i += P2 ? 2 : 1) {
        int v = seg_at<P2>(i);
        if (P2) { /* w is even: a pair is in or out */
            float2 f = v < w ? __bfloat1622float2(*(const __nv_bfloat162 *)(z + v)) : make_float2(-INFINITY, -INFINITY);
            r[i] = f.x, r[i + 1] = f.y;
            mx = fmaxf(mx, fmaxf(f.x, f.y));
        } else {
            r[i] = v < w ? zf(z[v]) : -INFINITY;
            mx = fmaxf(mx, r[i]);
        }
    }
    mx = seg_max(mx, swm);
    double s = 0;
    if constexpr (sizeof(T) == 2) {
        float sf = 0.0f;
#pragma unroll
        for (int i = 0; i < SEG / LT; i++)
            if (seg_at<P2>(i) < w) sf += lce_exp<T>(r[i] - mx);
        s = sf;
    } else {
#pragma unroll
        for (int i = 0; i < SEG / LT; i++)
            if (seg_at<P2>(i) < w) s += lce_exp<T>(r[i] - mx);
    }
    s = seg_sum(s, sws);
    if (threadIdx.x == 0) smax[row * ns + blockIdx.y] = mx, ssum[row * ns + blockIdx.y] = s;
}

/* A row's max and sum of exp against it, from its ns segments' statistics in segment order */
__device__ static void row_stats(const float *smax, const double *ssum, int64_t row, int64_t ns, float *mx, double *s) {
    float m = -INFINITY;
    for (int64_t i = 0; i < ns; i++) m = fmaxf(m, smax[row * ns + i]);
    double a = 0;
    for (int64_t i = 0; i < ns; i++) a += ssum[row * ns + i] * exp((double)smax[row * ns + i] - (double)m);
    *mx = m, *s = a;
}

/* Token c0 + row's statistics, a thread a token: its row's max and the inverse of its sum of exp
 * (rst[2 row], rst[2 row + 1]; 0 and 1 for a token without a target, whose gradient is 0), and in
 * the forward (partial) its loss. Once a row, so that the gradient's blocks each read two floats. */
template <typename T>
__global__ void k_lce_rows(const T *L, kt tg, int64_t V, int64_t c0, int nc, const float *smax, const double *ssum,
                           double *partial, float *rst) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= nc) return;
    int64_t n = c0 + row;
    int32_t y = kt_i32(tg, n);
    float mx = 0.0f;
    double s = 1.0;
    /* no loss where y < 0 (y >= V: cuda_ce_divisor has marked the node, the run fails) */
    if (y >= 0 && y < V) row_stats(smax, ssum, row, segments(V), &mx, &s);
    rst[2 * row] = mx, rst[2 * row + 1] = (float)(1.0 / s);
    if (partial) partial[n] = y >= 0 && y < V ? log(s) + mx - zf(L[row * V + y]) : 0.0;
}

/* A logit's gradient (softmax - onehot) k, each rounding pinned */
template <typename T> __device__ static inline float lce_g(float z, float mx, float inv, bool target, float k) {
    return __fmul_rn(__fsub_rn(__fmul_rn(lce_exp<T>(z - mx), inv), target ? 1.0f : 0.0f), k);
}

/* Backward: segment blockIdx.y of token c0 + blockIdx.x's row turned into its gradient in place
 * (each element read, then written, by one thread), from the row's statistics rst; the factor
 * dloss / D from the device (dl, div; dl NULL: 1) */
template <typename T, bool P2>
__global__ void k_lce_grad(T *L, kt tg, int64_t V, int64_t c0, const float *rst, const float *dl, const double *div) {
    int64_t row = blockIdx.x, v0 = (int64_t)blockIdx.y * SEG, n = c0 + row;
    int w = (int)(V - v0 < SEG ? V - v0 : SEG);
    int32_t y = kt_i32(tg, n);
    if (y >= V) y = -1; /* out of range: cuda_ce_divisor has marked the node, the run fails */
    float mx = rst[2 * row], inv = rst[2 * row + 1], k = (float)((double)(dl ? *dl : 1.0f) / *div);
    T *z = L + row * V + v0;
    if (P2) { /* bf16 pairs (w even) */
        for (int v = 2 * (int)threadIdx.x; v < w; v += 2 * LT) {
            __nv_bfloat162 *p = (__nv_bfloat162 *)(z + v);
            float2 f = __bfloat1622float2(*p);
            f.x = y < 0 ? 0.0f : lce_g<T>(f.x, mx, inv, v0 + v == y, k);
            f.y = y < 0 ? 0.0f : lce_g<T>(f.y, mx, inv, v0 + v + 1 == y, k);
            *p = __floats2bfloat162_rn(f.x, f.y);
        }
    } else {
        for (int v = threadIdx.x; v < w; v += LT)
            zset(&z[v], y < 0 ? 0.0f : lce_g<T>(zf(z[v]), mx, inv, v0 + v == y, k));
    }
}

static size_t round_up(size_t n) { return (n + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN; }

/* s as a column-major matrix with unit stride along dim 0 and tokens evenly spaced along dims 1, 2:
 * itself, or a contiguous copy in scratch at *at */
static const keel_tensor *plain(keel_backend *be, const keel_tensor *s, keel_tensor *tmp, char *base, size_t *at,
                                bool copy) {
    if (!copy) return s;
    *tmp = *s;
    tmp->view_src = NULL;
    keel_set_contiguous_strides(tmp);
    tmp->data = base + *at;
    *at += round_up(keel_nbytes(tmp));
    return cuda_copy(be, tmp, s, false) ? NULL : tmp;
}

static bool needs_copy(const keel_tensor *s) {
    size_t es = keel_type_size(s->type);
    return s->nb[0] != (int64_t)es || s->nb[1] < s->ne[0] * (int64_t)es || s->nb[1] % (int64_t)es ||
           (s->ne[2] > 1 && s->nb[2] != s->ne[1] * s->nb[1]);
}

/* fwd: the loss; back: the gradients (LINEAR_CROSS_ENTROPY_BACK, or the forward with ip1) */
static bool lce_fwd(const keel_tensor *t) { return t->op == KEEL_OP_LINEAR_CROSS_ENTROPY; }
static bool lce_back(const keel_tensor *t) { return !lce_fwd(t) || t->ip[1]; }

/* One chunk's logits (their gradient in their place; 4 bytes a logit, 2 with bf16 operands) and
 * segment statistics, the forward's per-token loss terms, contiguous copies of x and W where needed. */
size_t cuda_linear_ce_scratch(const keel_tensor *t) {
    bool fwd = lce_fwd(t);
    const keel_tensor *x = t->src[0], *w = t->src[1];
    int64_t N = x->ne[1] * x->ne[2], V = w->ne[1], C = t->ip[0] < N ? t->ip[0] : N, C1 = C ? C : 1;
    return KEEL_CUDA_LT_WORKSPACE + round_up((size_t)(V * C1) * (x->type == KEEL_BF16 ? 2 : 4)) +
           round_up((size_t)(segments(V) * C1) * 4) + round_up((size_t)(segments(V) * C1) * 8) +
           round_up((size_t)C1 * 8) + (fwd ? round_up((size_t)(N ? N : 1) * 8) : 0) +
           (needs_copy(x) ? round_up(keel_nbytes(x)) : 0) + (needs_copy(w) ? round_up(keel_nbytes(w)) : 0) + KEEL_ALIGN;
}

/* D (m x n, ldd, of type dd) = op(A) op(B) (+ D when beta is 1), A and B of type dt (x's and W's:
 * the logits and their gradient have it too), by cuBLASLt with float32 sums */
static int product(keel_backend *be, const keel_tensor *t, void *ws, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                   const void *a, int64_t lda, const void *b, int64_t ldb, cudaDataType_t dt, void *d,
                   cudaDataType_t dd, int64_t ldd, float beta) {
    cuda_gemm g = cuda_gemm_plain(ta, tb, m, n, k, a, dt, lda, b, dt, ldb, d, dd, ldd, beta);
    return cuda_gemm_run(be, &g, ws, t);
}

/* The kernels of one chunk after its logits product, on logits of type T (float, or bf16) */
template <typename T>
static int chunk_rows(const keel_tensor *t, cudaStream_t s, T *L, kt tg, int64_t V, int64_t c0, int nc, float *smax,
                      double *ssum, float *rst, double *partial, bool back, const float *dl, const double *div) {
    dim3 segs((unsigned)nc, (unsigned)segments(V));
    void (*stats)(const T *, int64_t, float *, double *) = k_lce_stats<T, false>;
    void (*grad)(T *, kt, int64_t, int64_t, const float *, const float *, const double *) = k_lce_grad<T, false>;
    if constexpr (sizeof(T) == 2) /* bf16 logits a pair at a time */
        if (V % 2 == 0) stats = k_lce_stats<T, true>, grad = k_lce_grad<T, true>;
    stats<<<segs, LT, 0, s>>>(L, V, smax, ssum);
    if (cuda_check(cudaGetLastError(), "linear cross-entropy statistics launch", t)) return -1;
    k_lce_rows<T><<<(nc + LT - 1) / LT, LT, 0, s>>>(L, tg, V, c0, nc, smax, ssum, partial, rst);
    if (cuda_check(cudaGetLastError(), "linear cross-entropy rows launch", t)) return -1;
    if (!back) return 0;
    grad<<<segs, LT, 0, s>>>(L, tg, V, c0, rst, dl, div);
    return cuda_check(cudaGetLastError(), "linear cross-entropy gradient launch", t);
}

int cuda_linear_ce(keel_backend *be, const keel_tensor *t) {
    bool fwd = lce_fwd(t), back = lce_back(t) && !(fwd && t->ip[2]);
    const keel_tensor *x = t->src[0], *w = t->src[1], *tg = t->src[2];
    int64_t D = x->ne[0], N = x->ne[1] * x->ne[2], V = w->ne[1], C = t->ip[0] < N ? t->ip[0] : N;
    bool bf = x->type == KEEL_BF16;
    cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
    if (D > INT32_MAX || V > INT32_MAX || C > INT32_MAX)
        return keel_fail("cuda: %s '%s': a dimension exceeds cuBLAS's 32-bit limit", keel_op_get(t->op)->name, t->name);
    if (segments(V) > 65535)
        return keel_fail("cuda: %s '%s': a vocabulary of %lld, the most is %d", keel_op_get(t->op)->name, t->name,
                         (long long)V, 65535 * SEG);
    if (cuda_ce_divisor(be, t)) return -1; /* the targets checked, the divisor on the device */
    const double *div = cuda_im(be)->ce_div;
    const float *dl = fwd ? NULL : (const float *)t->src[3]->data; /* the forward's: 1 */
    bool cx = needs_copy(x), cw = needs_copy(w);
    char *base = (char *)cuda_scratch(be, cuda_linear_ce_scratch(t), t);
    if (!base) return -1;
    void *ws = base; /* cuBLASLt's workspace, then the chunk's arrays */
    size_t at = KEEL_CUDA_LT_WORKSPACE;
    void *L = base + at; /* the chunk's logits (V x nc), then their gradient */
    at += round_up((size_t)(V * (C ? C : 1)) * (bf ? 2 : 4));
    int64_t ns = segments(V);
    float *smax = (float *)(base + at);
    at += round_up((size_t)(ns * (C ? C : 1)) * 4);
    double *ssum = (double *)(base + at);
    at += round_up((size_t)(ns * (C ? C : 1)) * 8);
    float *rst = (float *)(base + at); /* per token of the chunk: max, 1 / sum of exp */
    at += round_up((size_t)(C ? C : 1) * 8);
    double *partial = NULL;
    if (fwd) partial = (double *)(base + at), at += round_up((size_t)(N ? N : 1) * 8);
    keel_tensor xt, wt;
    if (!(x = plain(be, x, &xt, base, &at, cx)) || !(w = plain(be, w, &wt, base, &at, cw))) return -1;
    size_t es = keel_type_size(x->type);
    int ldx = (int)(x->nb[1] / (int64_t)es), ldw = (int)(w->nb[1] / (int64_t)es);
    cudaStream_t s = cuda_im(be)->stream;
    float *out = (float *)t->data, *loss = fwd ? out + (t->ip[1] ? N * D + D * V : 0) : NULL;
    if (fwd && t->ip[1] && !back && /* gradients skipped: zeros */
        cuda_check(cudaMemsetAsync(out, 0, (size_t)(N * D + D * V) * 4, s), "memset", t))
        return -1;
    for (int64_t c0 = 0; c0 < N; c0 += C) {
        int nc = (int)(N - c0 < C ? N - c0 : C);
        const char *xc = (const char *)x->data + c0 * x->nb[1]; /* tokens evenly spaced */
        /* L (V x nc) = W^T (V x D) x_c (D x nc), in x's and W's type */
        if (product(be, t, ws, true, false, V, nc, D, w->data, ldw, xc, ldx, dt, L, dt, V, 0.0f)) return -1;
        if (bf ? chunk_rows(t, s, (__nv_bfloat16 *)L, kt_of(tg), V, c0, nc, smax, ssum, rst, partial, back, dl, div)
               : chunk_rows(t, s, (float *)L, kt_of(tg), V, c0, nc, smax, ssum, rst, partial, back, dl, div))
            return -1;
        if (!back) continue;
        /* dx_c (D x nc) = W (D x V) g (V x nc); dW (D x V) (+)= x_c (D x nc) g^T (nc x V), g in L, float32
         * results */
        const float bw = c0 > 0 ? 1.0f : 0.0f;
        if (product(be, t, ws, false, false, D, nc, V, w->data, ldw, L, V, dt, out + c0 * D, CUDA_R_32F, D, 0.0f) ||
            product(be, t, ws, false, true, D, V, nc, xc, ldx, L, V, dt, out + N * D, CUDA_R_32F, D, bw))
            return -1;
    }
    if (back && N == 0 && cuda_check(cudaMemsetAsync(out, 0, (size_t)(D * V) * 4, s), "memset", t)) return -1;
    if (fwd) {
        k_finish_sum<<<1, KEEL_CUDA_RT, 0, s>>>(loss, partial, N, 1.0, div); /* the partials in token order */
        return cuda_check(cudaGetLastError(), "linear cross-entropy sum launch", t);
    }
    return 0;
}
