/* keel: flash attention (FLASH_ATTN and its backward) on the cpu backend, float32, by blocks of
 * QB queries of one (example, query head): the block's scores over the keys its queries see live
 * in a scratch block [QB, keys] while the block is worked on (never a [T, T] matrix), and every
 * product is the backend's matrix product (gemm.h), which splits only the tiles of its result and
 * sums each element in one order, whatever the thread count. q, k and v are read as contiguous
 * float32 (bf16 or strided sources widened first, exactly).
 *   forward   S = Q K^T; a row at a time (the pool's items) the mask (SOFT_MAX_CAUSAL's), the max,
 *             p = exp(scale s - max) and the sum of p (float64); O = P V, then o = O / sum and
 *             lse = max + log sum;
 *   backward  for each block: S again and P = exp(scale S - lse), dP = dO V^T, dS = scale P (dP -
 *             delta) with delta = do.o - dlse; dQ = dS K, and dK += dS^T Q, dV += P^T dO into
 *             the kv head's rows, the blocks and the query heads of the group in a fixed order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/gemm.h"
#include "ops/ops.h"
#include "util/error.h"

enum { QB = 128 }; /* queries a block */

typedef struct {
    const float *q, *k, *v;
    const float *o, *lse, *dO, *dlse; /* backward: the forward's packed output and its gradient */
    const keel_tensor *pos;
    float *out;
    int64_t D, H, Tq, B, KV, Tk, Dv, no; /* no: elements of o (lse follows) */
    float scale;
    /* the block being worked on */
    int64_t b, h, t0, nq, j0, nk; /* example, query head, first query, queries, first key, keys */
    float *S, *dP;                /* [nq][nk] */
    double *z;                    /* forward: the rows' sums of p */
} fa_ctx;

/* The keys query tt of example b sees: lo .. hi (hi = tt + Tk - Tq: the keys before the queries
 * are a cache of earlier tokens). */
static int64_t first_key(const fa_ctx *c, int64_t tt, int64_t b) {
    int64_t lo = tt + c->Tk - c->Tq - cpu_pos(c->pos, tt, b);
    return lo < 0 ? 0 : lo;
}
/* rows of q (or do, o) of query head h, and of k (or v) of kv head kh, in their tensors' order */
static int64_t qrow(const fa_ctx *c, int64_t t) { return (c->b * c->Tq + t) * c->H + c->h; }
static int64_t krow(const fa_ctx *c, int64_t j) { return (c->b * c->Tk + j) * c->KV + c->h / (c->H / c->KV); }

/* C = A B (or C += A B), A [m,k] with byte strides (am, ak), B [k,n] with (bk, bn), C rows cm apart */
static int gemm(keel_backend *be, int64_t m, int64_t n, int64_t k, const float *A, int64_t am, int64_t ak,
                const float *Bm, int64_t bk, int64_t bn, float *C, int64_t cm, bool acc) {
    keel_gemm_args g = {.M = m,
                        .N = n,
                        .K = k,
                        .A = A,
                        .a_m = am * 4,
                        .a_k = ak * 4,
                        .B = Bm,
                        .b_k = bk * 4,
                        .b_n = bn * 4,
                        .C = C,
                        .c_m = cm * 4,
                        .c_n = 4,
                        .accumulate = acc};
    return keel_cpu_gemm(cpu_pool(be), &g);
}

/* Forward rows: mask, max, p, the sum of p; o = O / sum and lse once O = P V is made */
static void softmax_rows(void *arg, int64_t r0, int64_t r1, int th) {
    (void)th;
    fa_ctx *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        int64_t tt = c->t0 + r, lo = first_key(c, tt, c->b) - c->j0, hi = tt + c->Tk - c->Tq - c->j0;
        float *s = c->S + r * c->nk, mx = -INFINITY;
        for (int64_t j = lo; j <= hi; j++) mx = fmaxf(mx, s[j] *= c->scale);
        double z = 0;
        for (int64_t j = 0; j < c->nk; j++) {
            float p = j >= lo && j <= hi ? expf(s[j] - mx) : 0.0f;
            s[j] = p;
            z += p;
        }
        c->z[r] = z;
        c->out[c->no + qrow(c, tt)] = (float)((double)mx + log(z));
    }
}
static void scale_rows(void *arg, int64_t r0, int64_t r1, int th) {
    (void)th;
    fa_ctx *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        float inv = (float)(1.0 / c->z[r]), *o = c->out + qrow(c, c->t0 + r) * c->Dv;
        for (int64_t e = 0; e < c->Dv; e++) o[e] *= inv;
    }
}

/* Backward rows: P = exp(scale S - lse) in S, dS = scale P (dP - delta) in dP */
static void grad_rows(void *arg, int64_t r0, int64_t r1, int th) {
    (void)th;
    fa_ctx *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        int64_t tt = c->t0 + r, row = qrow(c, tt);
        int64_t lo = first_key(c, tt, c->b) - c->j0, hi = tt + c->Tk - c->Tq - c->j0;
        const float *dO = c->dO + row * c->Dv, *o = c->o + row * c->Dv;
        double dd = 0;
        for (int64_t e = 0; e < c->Dv; e++) dd += (double)dO[e] * o[e];
        float delta = (float)(dd - (c->dlse ? c->dlse[row] : 0.0f)), *s = c->S + r * c->nk, *dp = c->dP + r * c->nk;
        for (int64_t j = 0; j < c->nk; j++) {
            float p = j >= lo && j <= hi ? expf(s[j] * c->scale - c->lse[row]) : 0.0f;
            s[j] = p;
            dp[j] = c->scale * (p * (dp[j] - delta));
        }
    }
}

/* The block's key range: from the first key any of its queries sees to the last query's own */
static void block_keys(fa_ctx *c) {
    int64_t lo = c->Tk;
    for (int64_t t = c->t0; t < c->t0 + c->nq; t++) {
        int64_t l = first_key(c, t, c->b);
        if (l < lo) lo = l;
    }
    c->j0 = lo, c->nk = c->t0 + c->nq - 1 + c->Tk - c->Tq - lo + 1;
}

static int forward_block(keel_backend *be, fa_ctx *c) {
    int64_t D = c->D, Dv = c->Dv, HD = c->H * D, KD = c->KV * D;
    const float *Q = c->q + qrow(c, c->t0) * D, *K = c->k + krow(c, c->j0) * D, *V = c->v + krow(c, c->j0) * Dv;
    if (gemm(be, c->nq, c->nk, D, Q, HD, 1, K, 1, KD, c->S, c->nk, false)) return -1;
    keel_pool_for(cpu_pool(be), c->nq, softmax_rows, c);
    float *O = c->out + qrow(c, c->t0) * Dv;
    if (gemm(be, c->nq, Dv, c->nk, c->S, c->nk, 1, V, c->KV * Dv, 1, O, c->H * Dv, false)) return -1;
    keel_pool_for(cpu_pool(be), c->nq, scale_rows, c);
    return 0;
}

static int backward_block(keel_backend *be, fa_ctx *c) {
    int64_t D = c->D, Dv = c->Dv, HD = c->H * D, KD = c->KV * D, KDv = c->KV * Dv;
    int64_t nqk = D * c->H * c->Tq * c->B, nkk = D * c->KV * c->Tk * c->B;
    const float *Q = c->q + qrow(c, c->t0) * D, *K = c->k + krow(c, c->j0) * D, *V = c->v + krow(c, c->j0) * Dv;
    const float *dO = c->dO + qrow(c, c->t0) * Dv;
    if (gemm(be, c->nq, c->nk, D, Q, HD, 1, K, 1, KD, c->S, c->nk, false) ||
        gemm(be, c->nq, c->nk, Dv, dO, c->H * Dv, 1, V, 1, KDv, c->dP, c->nk, false))
        return -1;
    keel_pool_for(cpu_pool(be), c->nq, grad_rows, c);
    float *dq = c->out + qrow(c, c->t0) * D, *dk = c->out + nqk + krow(c, c->j0) * D;
    float *dv = c->out + nqk + nkk + krow(c, c->j0) * Dv;
    return gemm(be, c->nq, D, c->nk, c->dP, c->nk, 1, K, KD, 1, dq, HD, false) ||              /* dQ = dS K */
                   gemm(be, c->nk, D, c->nq, c->dP, 1, c->nk, Q, HD, 1, dk, KD, true) ||       /* dK += dS^T Q */
                   gemm(be, c->nk, Dv, c->nq, c->S, 1, c->nk, dO, c->H * Dv, 1, dv, KDv, true) /* dV += P^T dO */
               ? -1
               : 0;
}

int cpu_flash_attn(keel_backend *be, const keel_tensor *t) {
    keel_tensor tmp[3];
    const float *src[3];
    int made = 0, rc = -1;
    fa_ctx c = {0};
    for (int i = 0; i < 3; i++) {
        const keel_tensor *x = t->src[i];
        if (x->type == KEEL_F32 && keel_is_contiguous(x)) {
            src[i] = x->data;
            continue;
        }
        if (cpu_f32_temp(be, x, &tmp[made], true)) goto done;
        src[i] = tmp[made++].data;
    }
    const keel_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
    bool back = t->op == KEEL_OP_FLASH_ATTN_BACK;
    c.q = src[0], c.k = src[1], c.v = src[2], c.pos = t->src[3], c.out = t->data, c.scale = (float)t->fp[0];
    c.D = q->ne[0], c.H = q->ne[1], c.Tq = q->ne[2], c.B = q->ne[3], c.KV = k->ne[1], c.Tk = k->ne[2];
    c.Dv = v->ne[0], c.no = c.Dv * c.H * c.Tq * c.B;
    int64_t nb = c.Tq < QB ? c.Tq : QB;
    c.S = malloc((size_t)(nb * c.Tk) * sizeof(float) * (back ? 2 : 1));
    c.z = malloc((size_t)(nb ? nb : 1) * sizeof(double));
    if (!c.S || !c.z) {
        keel_fail("cpu: out of memory for the attention scratch of '%s' (%lld keys)", t->name, (long long)c.Tk);
        goto done;
    }
    c.dP = c.S + nb * c.Tk;
    if (back) {
        c.o = t->src[4]->data, c.lse = c.o + c.no, c.dO = t->src[5]->data;
        c.dlse = keel_nelements(t->src[5]) > c.no ? c.dO + c.no : NULL; /* [do] alone: dlse 0 */
        /* dk and dv are sums over the blocks and query heads that see each key: from 0 */
        int64_t nq = keel_nelements(q);
        memset(c.out + nq, 0, (size_t)(keel_nelements(t) - nq) * sizeof(float));
    }
    for (c.b = 0; c.b < c.B; c.b++) /* a kv head's query heads one after another: dk, dv in a fixed order */
        for (c.h = 0; c.h < c.H; c.h++)
            for (c.t0 = 0; c.t0 < c.Tq; c.t0 += QB) {
                c.nq = c.Tq - c.t0 < QB ? c.Tq - c.t0 : QB;
                block_keys(&c);
                if (back ? backward_block(be, &c) : forward_block(be, &c)) goto done;
            }
    rc = 0;
done:
    free(c.S), free(c.z);
    for (int i = 0; i < made; i++) free(tmp[i].data);
    return rc;
}
