/* keel: LINEAR_CROSS_ENTROPY and its backward on the cpu backend: the language-model head and its
 * loss a chunk of tokens at a time, so that only one chunk's logits [V, chunk] exist. Per chunk:
 * logits = W^T x_c (the float32 matrix product), then per token the row's max and sum of exp, its
 * loss in float64 (forward), or (backward) its row turned in place into g = (softmax - onehot)
 * dloss / D, dx_c = W g and dW += x_c g^T (the chunks in order, the first assigning). bf16 x and W
 * are read as they are by the products (the bf16 kernel for the logits, widened to float32 as they
 * are packed next to g, gemm.h); the logits and g are rounded to bf16 (as the cuda backend has
 * them), kept in float32. Each token's row is one thread's, sums in a
 * fixed order: the result does not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/vec_math.h"
#include "backends/kernel_common.h"
#include "ops/ops.h"
#include "tensor/convert.h"
#include "util/error.h"

typedef struct {
    float *logits; /* [V, nc]: token c's row at c * V */
    const int32_t *y;
    int64_t V, c0;
    double *loss; /* forward: per token of the whole batch */
    float k;      /* backward: dloss / D */
    bool back;    /* the rows turned into their gradient (the backward, or the forward with ip1) */
    bool round;   /* bf16 x and W: the logits and g rounded to bf16 (tensor/convert.h) */
} rows_ctx;

static void rows_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    rows_ctx *c = arg;
    for (int64_t i = b; i < e; i++) {
        float *z = c->logits + i * c->V;
        int32_t y = c->y[c->c0 + i];
        if (c->round) /* bf16 x and W: the logits in bf16, as every backend has them */
            for (int64_t v = 0; v < c->V; v++) z[v] = keel_cvt_f32_to_bf16_f32(z[v]);
        if (y < 0) { /* no loss here, no gradient */
            if (c->back) memset(z, 0, (size_t)c->V * sizeof *z);
            if (c->loss) c->loss[c->c0 + i] = 0.0;
            continue;
        }
        /* the vector max, exp and float64 sum of CROSS_ENTROPY_LOSS's rows (vec_math.h), in place */
        float mx = keel_max_row(z, c->V), zy = z[y];
        keel_exp_row(z, mx, c->V);
        double sum = keel_sum_row_f64(z, c->V);
        if (c->loss) c->loss[c->c0 + i] = log(sum) + mx - zy;
        if (!c->back) continue;
        float inv = (float)(1.0 / sum), ey = z[y];
        for (int64_t v = 0; v < c->V; v++) z[v] = (z[v] * inv) * c->k;
        z[y] = (ey * inv - 1.0f) * c->k;
        if (c->round) /* bf16 x and W: g as every backend gives it to the products */
            for (int64_t v = 0; v < c->V; v++) z[v] = keel_cvt_f32_to_bf16_f32(z[v]);
    }
}

int cpu_linear_ce(keel_backend *be, const keel_tensor *t) {
    /* fwd: the loss; back: the gradients (LINEAR_CROSS_ENTROPY_BACK, or the forward with ip1 for
     * dloss 1, unless ip2 skips them) */
    bool fwd = t->op == KEEL_OP_LINEAR_CROSS_ENTROPY, back = !fwd || (t->ip[1] && !t->ip[2]);
    int64_t D = t->src[0]->ne[0], N1 = t->src[0]->ne[1], N = N1 * t->src[0]->ne[2], V = t->src[1]->ne[1];
    int64_t C = t->ip[0] < N ? t->ip[0] : N;
    double div;
    int32_t *y = NULL;
    if (keel_backend_ce_divisor(be, t, &div)) return -1; /* and the targets checked */
    y = malloc((size_t)(N ? N : 1) * sizeof *y);
    int rc = !y || keel_tensor_read(be, t->src[2], y, KEEL_I32) ? -1 : 0;
    /* x and W as the products read them: themselves (float32 or bf16), or exact float32 copies
     * (other types; or x whose tokens are not evenly spaced) */
    keel_tensor xt = {0}, wt = {0};
    const keel_tensor *x = t->src[0], *w = t->src[1];
    bool cx = (x->type != KEEL_F32 && x->type != KEEL_BF16) || (x->ne[2] > 1 && x->nb[2] != x->ne[1] * x->nb[1]),
         cw = w->type != KEEL_F32 && w->type != KEEL_BF16;
    if (!rc && cx) rc = cpu_f32_temp(be, x, &xt, true), x = &xt;
    if (!rc && cw) rc = cpu_f32_temp(be, w, &wt, true), w = &wt;
    float *L = rc ? NULL : cpu_scratch(be, (size_t)(V * (C ? C : 1)) * sizeof *L);
    double *loss = !fwd || rc ? NULL : calloc((size_t)(N ? N : 1), sizeof *loss);
    if (!rc && (!L || (fwd && !loss))) rc = keel_fail("cpu: out of memory for the logits of '%s'", t->name);
    float k = back && !rc ? (float)((fwd ? 1.0 : cpu_ldf(t->src[3]->data)) / div) : 0.0f;
    float *out = t->data;
    if (!rc && fwd && t->ip[1] && !back) memset(out, 0, (size_t)(N * D + D * V) * sizeof *out); /* skipped: zeros */
    keel_pool *pool = cpu_pool(be);
    for (int64_t c0 = 0; c0 < N && !rc; c0 += C) {
        int64_t nc = N - c0 < C ? N - c0 : C;
        const char *xc = (const char *)x->data + (c0 % N1) * x->nb[1] + (c0 / N1) * x->nb[2];
        keel_gemm_args lg = {.M = V,
                             .N = nc,
                             .K = D,
                             .A = w->data,
                             .a_m = w->nb[1],
                             .a_k = w->nb[0],
                             .B = xc,
                             .b_k = x->nb[0],
                             .b_n = x->nb[1],
                             .C = L,
                             .c_m = 4,
                             .c_n = V * 4,
                             .a_bf16 = w->type == KEEL_BF16,
                             .b_bf16 = x->type == KEEL_BF16};
        if (keel_cpu_gemm(pool, &lg)) {
            rc = -1;
            break;
        }
        rows_ctx r = {L, y, V, c0, loss, k, back, t->src[0]->type == KEEL_BF16};
        keel_pool_for(pool, nc, rows_task, &r);
        if (!back) continue;
        /* dx_c[d, c] = sum_v W[d, v] g[v, c]; dW[d, v] (+)= sum_c x_c[d, c] g[v, c] */
        keel_gemm_args dx = {.M = D,
                             .N = nc,
                             .K = V,
                             .A = w->data,
                             .a_m = w->nb[0],
                             .a_k = w->nb[1],
                             .B = L,
                             .b_k = 4,
                             .b_n = V * 4,
                             .C = out + c0 * D,
                             .c_m = 4,
                             .c_n = D * 4,
                             .a_bf16 = w->type == KEEL_BF16};
        keel_gemm_args dw = {.M = D,
                             .N = V,
                             .K = nc,
                             .A = xc,
                             .a_m = x->nb[0],
                             .a_k = x->nb[1],
                             .B = L,
                             .b_k = V * 4,
                             .b_n = 4,
                             .C = out + N * D,
                             .c_m = 4,
                             .c_n = D * 4,
                             .accumulate = c0 > 0,
                             .a_bf16 = x->type == KEEL_BF16};
        if (keel_cpu_gemm(pool, &dx) || keel_cpu_gemm(pool, &dw)) rc = -1;
    }
    if (!rc && back && N == 0) memset(out, 0, (size_t)(D * V) * sizeof *out);
    if (!rc && fwd) {
        double s = 0;
        for (int64_t n = 0; n < N; n++) s += loss[n];
        out[t->ip[1] ? N * D + D * V : 0] = (float)(s / div);
    }
    free(xt.data), free(wt.data);
    free(loss), free(y);
    return rc ? -1 : 0;
}
