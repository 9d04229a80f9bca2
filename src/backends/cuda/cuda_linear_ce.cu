/* keel: LINEAR_CROSS_ENTROPY and its backward on CUDA: the language-model head and its loss a chunk
 * of tokens at a time, so that only one chunk's float32 logits [V, chunk] exist (in the node's
 * planned scratch, never in the graph). Per chunk: logits = W^T x_c by cuBLAS (float32 or bf16
 * operands, float32 sums), then a block per token: the row's max and sum of exp in a fixed tree, its
 * loss as a float64 partial (forward), or its row turned into g = (softmax - onehot) dloss / D
 * (backward), then dx_c = W g and dW (+)= x_c g^T by cuBLAS, the chunks in order (beta 0 for the
 * first, 1 after). With bf16 operands g goes to the tensor cores as two bf16 parts, g = hi + lo (16
 * of its 24 bits): g in one bf16 moved a small model's eval loss by 1.2-1.9% from the float32 run's
 * early in training, where float32 g kept it within 0.9%. The parts of token j lie side by side
 * (hi_j, lo_j: columns 2j and 2j+1 of one V x 2n matrix), so dW takes both in one product of depth
 * 2n against x_c with every column twice: dW is read and written once a chunk, not once a part.
 * The partials are summed by one block in token order. No atomics: the same bits every run. */
#include <cuda_bf16.h>

#include "backends/cuda/cuda_internal.h"

#define LT KEEL_CUDA_RT /* threads of a token's row block */

/* Token c0 + blockIdx.x: its logits row L[row], its loss partial or its gradient row (in L, or with
 * bf16 operands as its two parts in G at row * 2V: hi, then lo); the gradient's factor dloss / D from
 * the device (dl, div: no read to the host). */
__global__ void k_lce_rows(float *L, __nv_bfloat16 *G, kt tg, int64_t V, int64_t c0, double *partial, const float *dl,
                           const double *div, int back) {
    __shared__ double sh[LT];
    int64_t row = blockIdx.x, n = c0 + row;
    float *z = L + row * V;
    int32_t y = kt_i32(tg, n);
    if (y >= V) y = -1; /* out of range: cuda_ce_divisor has marked the node, the run fails */
    if (y < 0) {        /* no loss here, no gradient */
        if (!back && threadIdx.x == 0) partial[n] = 0.0;
        for (int64_t v = threadIdx.x; back && v < V; v += LT) {
            z[v] = 0.0f;
            if (G) G[row * 2 * V + v] = G[row * 2 * V + V + v] = __float2bfloat16_rn(0.0f);
        }
        return;
    }
    float mx = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += LT) mx = fmaxf(mx, z[v]);
    mx = block_max(mx, sh);
    double s = 0;
    for (int64_t v = threadIdx.x; v < V; v += LT) s += expf(z[v] - mx);
    s = block_sum(s, sh);
    if (!back) {
        if (threadIdx.x == 0) partial[n] = log(s) + mx - z[y];
        return;
    }
    float inv = (float)(1.0 / s), k = (float)((double)*dl / *div);
    for (int64_t v = threadIdx.x; v < V; v += LT) {
        float gv = __fmul_rn(__fsub_rn(__fmul_rn(expf(z[v] - mx), inv), v == y ? 1.0f : 0.0f), k);
        if (G) {
            __nv_bfloat16 hi = __float2bfloat16_rn(gv);
            G[row * 2 * V + v] = hi;
            G[row * 2 * V + V + v] = __float2bfloat16_rn(__fsub_rn(gv, __bfloat162float(hi)));
        } else
            z[v] = gv;
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

/* One chunk's float32 logits (and with bf16 operands, in the backward, their gradient as two bf16
 * parts and the chunk's x with every column twice), the forward's per-token loss terms, contiguous
 * copies of x and W where needed. */
size_t cuda_linear_ce_scratch(const keel_tensor *t) {
    bool back = t->op == KEEL_OP_LINEAR_CROSS_ENTROPY_BACK, bf = t->src[0]->type == KEEL_BF16;
    const keel_tensor *x = t->src[0], *w = t->src[1];
    int64_t D = x->ne[0], N = x->ne[1] * x->ne[2], V = w->ne[1], C = t->ip[0] < N ? t->ip[0] : N, C1 = C ? C : 1;
    return KEEL_CUDA_LT_WORKSPACE + round_up((size_t)(V * C1) * 4) +
           (bf && back ? round_up((size_t)(V * C1) * 4) + round_up((size_t)(D * C1) * 4) : 0) +
           (back ? 0 : round_up((size_t)(N ? N : 1) * 8)) + (needs_copy(x) ? round_up(keel_nbytes(x)) : 0) +
           (needs_copy(w) ? round_up(keel_nbytes(w)) : 0) + KEEL_ALIGN;
}

/* D (m x n, ldd, float32) = op(A) op(B) (+ D when beta is 1), A and B of type dt (x's and W's: the
 * logits' float32 gradient meets them only with float32 x and W), by cuBLASLt */
static int product(keel_backend *be, const keel_tensor *t, void *ws, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                   const void *a, int64_t lda, const void *b, int64_t ldb, cudaDataType_t dt, float *d, int64_t ldd,
                   float beta) {
    cuda_gemm g = cuda_gemm_plain(ta, tb, m, n, k, a, dt, lda, b, dt, ldb, d, CUDA_R_32F, ldd, beta);
    return cuda_gemm_run(be, &g, ws, t);
}

int cuda_linear_ce(keel_backend *be, const keel_tensor *t) {
    bool back = t->op == KEEL_OP_LINEAR_CROSS_ENTROPY_BACK;
    const keel_tensor *x = t->src[0], *w = t->src[1], *tg = t->src[2];
    int64_t D = x->ne[0], N = x->ne[1] * x->ne[2], V = w->ne[1], C = t->ip[0] < N ? t->ip[0] : N;
    bool bf = x->type == KEEL_BF16;
    cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
    if (D > INT32_MAX || 2 * V > INT32_MAX || 2 * C > INT32_MAX)
        return keel_fail("cuda: %s '%s': a dimension exceeds cuBLAS's 32-bit limit", keel_op_get(t->op)->name, t->name);
    if (cuda_ce_divisor(be, t)) return -1; /* the targets checked, the divisor on the device */
    const double *div = cuda_im(be)->ce_div;
    const float *dl = back ? (const float *)t->src[3]->data : NULL;
    bool cx = needs_copy(x), cw = needs_copy(w);
    char *base = (char *)cuda_scratch(be, cuda_linear_ce_scratch(t), t);
    if (!base) return -1;
    void *ws = base; /* cuBLASLt's workspace, then the chunk's arrays */
    size_t at = KEEL_CUDA_LT_WORKSPACE;
    float *L = (float *)(base + at);
    at += round_up((size_t)(V * (C ? C : 1)) * 4);
    __nv_bfloat16 *G = NULL, *x2 = NULL; /* bf16 backward: the parts (V x 2 nc), x_c's columns twice (D x 2 nc) */
    if (bf && back) {
        G = (__nv_bfloat16 *)(base + at), at += round_up((size_t)(V * (C ? C : 1)) * 4);
        x2 = (__nv_bfloat16 *)(base + at), at += round_up((size_t)(D * (C ? C : 1)) * 4);
    }
    double *partial = NULL;
    if (!back) partial = (double *)(base + at), at += round_up((size_t)(N ? N : 1) * 8);
    keel_tensor xt, wt;
    if (!(x = plain(be, x, &xt, base, &at, cx)) || !(w = plain(be, w, &wt, base, &at, cw))) return -1;
    size_t es = keel_type_size(x->type);
    int ldx = (int)(x->nb[1] / (int64_t)es), ldw = (int)(w->nb[1] / (int64_t)es);
    cudaStream_t s = cuda_im(be)->stream;
    float *out = (float *)t->data;
    for (int64_t c0 = 0; c0 < N; c0 += C) {
        int nc = (int)(N - c0 < C ? N - c0 : C);
        const char *xc = (const char *)x->data + c0 * x->nb[1]; /* tokens evenly spaced */
        /* L (V x nc) = W^T (V x D) x_c (D x nc) */
        if (product(be, t, ws, true, false, V, nc, D, w->data, ldw, xc, ldx, dt, L, V, 0.0f)) return -1;
        k_lce_rows<<<nc, LT, 0, s>>>(L, G, kt_of(tg), V, c0, partial, dl, div, back ? 1 : 0);
        if (cuda_check(cudaGetLastError(), "linear cross-entropy rows launch", t)) return -1;
        if (!back) continue;
        const float bw = c0 > 0 ? 1.0f : 0.0f;
        if (!bf) { /* dx_c (D x nc) = W (D x V) G (V x nc); dW (D x V) (+)= x_c (D x nc) G^T (nc x V) */
            if (product(be, t, ws, false, false, D, nc, V, w->data, ldw, L, V, dt, out + c0 * D, D, 0.0f) ||
                product(be, t, ws, false, true, D, V, nc, xc, ldx, L, V, dt, out + N * D, D, bw))
                return -1;
            continue;
        }
        /* dx_c = W hi + W lo (the parts: every other V-column of G, ld 2V); dW (+)= x2 G^T with
         * x2 = [x_0 x_0 x_1 x_1 ...] (D x 2nc), one product of depth 2nc */
        for (int part = 0; part < 2; part++) {
            const float bx = part ? 1.0f : 0.0f;
            if (product(be, t, ws, false, false, D, nc, V, w->data, ldw, G + part * V, 2 * V, dt, out + c0 * D, D, bx))
                return -1;
        }
        for (int twice = 0; twice < 2; twice++)
            if (cuda_check(cudaMemcpy2DAsync(x2 + twice * D, (size_t)(2 * D) * es, xc, (size_t)ldx * es, (size_t)D * es,
                                             (size_t)nc, cudaMemcpyDeviceToDevice, s),
                           "copy of x (dW)", t))
                return -1;
        if (product(be, t, ws, false, true, D, V, 2 * nc, x2, D, G, V, dt, out + N * D, D, bw)) return -1;
    }
    if (back && N == 0) return cuda_check(cudaMemsetAsync(out, 0, (size_t)(D * V) * 4, s), "memset", t);
    if (!back) {
        k_finish_sum<<<1, KEEL_CUDA_RT, 0, s>>>(out, partial, N, 1.0, div); /* the partials in token order */
        return cuda_check(cudaGetLastError(), "linear cross-entropy sum launch", t);
    }
    return 0;
}
