/* keel: flash attention (FLASH_ATTN and its backward) on the cpu backend, float32, with no score
 * matrix: a query row's scores live in a scratch row of Tk floats while the row is worked on.
 * q, k and v are read as contiguous float32 (bf16 or strided sources widened first, exactly).
 *   forward   a (example, query, head) row an item: its scores over the keys it sees
 *             (SOFT_MAX_CAUSAL's mask), their max, the sum of exp (float64), o and lse;
 *   backward  two passes, each item the only writer of what it writes (no two threads add into
 *             one place, so the bits do not depend on the thread count): dq a query row an item
 *             (p = exp(scale q.k - lse), dp = do.v, ds = p (dp - delta), delta = do.o - dlse),
 *             then dk and dv a key row an item, over the query heads of its kv head and the
 *             queries that see the key, in that order, recomputing p and ds as the first pass did. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "ops/ops.h"
#include "util/error.h"

typedef struct {
    const float *q, *k, *v;
    const float *o, *lse, *dO, *dlse; /* backward: the forward's packed output and its gradient */
    const keel_tensor *pos;
    float *out, *delta; /* delta: backward, per query row */
    int64_t D, H, Tq, B, KV, Tk, Dv;
    float scale;
    int failed; /* set by an item that could not get scratch memory */
} fa_ctx;

/* A sum over n products in 8 interleaved partial sums, added in a fixed order: vector code, and
 * the same bits on every thread count. */
static float dot(const float *a, const float *b, int64_t n) {
    float p[8] = {0}, s = 0.0f;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) p[l] += a[i + l] * b[i + l];
    for (; i < n; i++) s += a[i] * b[i];
    for (int l = 0; l < 8; l++) s += p[l];
    return s;
}
static void axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* The keys query tt of example b sees: lo .. hi (hi = tt + Tk - Tq: the keys before the queries
 * are a cache of earlier tokens). */
static int64_t first_key(const fa_ctx *c, int64_t tt, int64_t b) {
    int64_t lo = tt + c->Tk - c->Tq - cpu_pos(c->pos, tt, b);
    return lo < 0 ? 0 : lo;
}
/* Query row `row` (example b, query tt, head h in q's order): its example, kv head, and the keys
 * it sees, lo .. hi */
typedef struct {
    int64_t b, kh, lo, hi;
} row_span;
static row_span span_of(const fa_ctx *c, int64_t row) {
    int64_t h = row % c->H, tt = (row / c->H) % c->Tq, b = row / (c->H * c->Tq);
    row_span r = {b, h / (c->H / c->KV), first_key(c, tt, b), tt + c->Tk - c->Tq};
    return r;
}
static const float *krow(const fa_ctx *c, const float *x, int64_t n, int64_t b, int64_t j, int64_t kh) {
    return x + ((b * c->Tk + j) * c->KV + kh) * n;
}

/* n floats of an item's scratch; NULL (and the node failed) when there is no memory */
static float *scratch(fa_ctx *c, int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) c->failed = 1;
    return p;
}

static void forward_task(void *arg, int64_t r0, int64_t r1, int th) {
    (void)th;
    fa_ctx *c = arg;
    int64_t D = c->D, Dv = c->Dv, H = c->H, no = Dv * H * c->Tq * c->B;
    float *s = scratch(c, c->Tk + Dv), *acc = s ? s + c->Tk : NULL;
    if (!s) return;
    for (int64_t row = r0; row < r1; row++) {
        row_span sp = span_of(c, row);
        int64_t b = sp.b, kh = sp.kh, lo = sp.lo, hi = sp.hi;
        const float *q = c->q + row * D;
        float mx = -INFINITY;
        for (int64_t j = lo; j <= hi; j++) {
            s[j] = c->scale * dot(q, krow(c, c->k, D, b, j, kh), D);
            mx = fmaxf(mx, s[j]);
        }
        double z = 0;
        memset(acc, 0, (size_t)Dv * sizeof(float));
        for (int64_t j = lo; j <= hi; j++) {
            float e = expf(s[j] - mx);
            z += e;
            axpy(acc, e, krow(c, c->v, Dv, b, j, kh), Dv);
        }
        float inv = (float)(1.0 / z);
        for (int64_t e = 0; e < Dv; e++) c->out[row * Dv + e] = acc[e] * inv;
        c->out[no + row] = (float)((double)mx + log(z));
    }
    free(s);
}

/* p and ds of query row `row` and key j: the one formula both backward passes use */
static inline float prob(const fa_ctx *c, int64_t row, const float *kj) {
    return expf(c->scale * dot(c->q + row * c->D, kj, c->D) - c->lse[row]);
}

static void dq_task(void *arg, int64_t r0, int64_t r1, int th) {
    (void)th;
    fa_ctx *c = arg;
    int64_t D = c->D, Dv = c->Dv;
    float *dq = scratch(c, D);
    if (!dq) return;
    for (int64_t row = r0; row < r1; row++) {
        row_span sp = span_of(c, row);
        int64_t b = sp.b, kh = sp.kh, lo = sp.lo, hi = sp.hi;
        const float *dO = c->dO + row * Dv;
        float delta = dot(dO, c->o + row * Dv, Dv) - c->dlse[row];
        c->delta[row] = delta;
        memset(dq, 0, (size_t)D * sizeof(float));
        for (int64_t j = lo; j <= hi; j++) {
            const float *kj = krow(c, c->k, D, b, j, kh);
            float p = prob(c, row, kj), dp = dot(dO, krow(c, c->v, Dv, b, j, kh), Dv);
            axpy(dq, p * (dp - delta), kj, D);
        }
        for (int64_t d = 0; d < D; d++) c->out[row * D + d] = c->scale * dq[d];
    }
    free(dq);
}

static void dkv_task(void *arg, int64_t r0, int64_t r1, int th) {
    (void)th;
    fa_ctx *c = arg;
    int64_t D = c->D, Dv = c->Dv, H = c->H, G = H / c->KV, off = c->Tk - c->Tq;
    int64_t nq = D * H * c->Tq * c->B, nk = D * c->KV * c->Tk * c->B;
    float *dk = scratch(c, D + Dv), *dv = dk ? dk + D : NULL;
    if (!dk) return;
    for (int64_t r = r0; r < r1; r++) { /* r = (b Tk + j) KV + kh: k's own row order */
        int64_t kh = r % c->KV, j = (r / c->KV) % c->Tk, b = r / (c->KV * c->Tk);
        const float *kj = krow(c, c->k, D, b, j, kh), *vj = krow(c, c->v, Dv, b, j, kh);
        memset(dk, 0, (size_t)(D + Dv) * sizeof(float));
        for (int64_t h = kh * G; h < (kh + 1) * G; h++)
            for (int64_t tt = j - off < 0 ? 0 : j - off; tt < c->Tq; tt++) {
                if (j < first_key(c, tt, b)) continue;
                int64_t row = (b * c->Tq + tt) * H + h;
                const float *dO = c->dO + row * Dv;
                float p = prob(c, row, kj), ds = p * (dot(dO, vj, Dv) - c->delta[row]);
                axpy(dk, ds, c->q + row * D, D);
                axpy(dv, p, dO, Dv);
            }
        for (int64_t d = 0; d < D; d++) c->out[nq + r * D + d] = c->scale * dk[d];
        memcpy(c->out + nq + nk + r * Dv, dv, (size_t)Dv * sizeof(float));
    }
    free(dk);
}

int cpu_flash_attn(keel_backend *be, const keel_tensor *t) {
    keel_tensor tmp[3];
    const float *src[3];
    int made = 0, rc = -1;
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
    fa_ctx c = {.q = src[0],
                .k = src[1],
                .v = src[2],
                .pos = t->src[3],
                .out = t->data,
                .D = q->ne[0],
                .H = q->ne[1],
                .Tq = q->ne[2],
                .B = q->ne[3],
                .KV = k->ne[1],
                .Tk = k->ne[2],
                .Dv = v->ne[0],
                .scale = (float)t->fp[0]};
    int64_t rows = c.H * c.Tq * c.B, no = c.Dv * rows;
    if (t->op == KEEL_OP_FLASH_ATTN) {
        keel_pool_for(cpu_pool(be), rows, forward_task, &c);
    } else {
        c.o = t->src[4]->data, c.lse = c.o + no, c.dO = t->src[5]->data, c.dlse = c.dO + no;
        c.delta = malloc((size_t)rows * sizeof(float));
        if (!c.delta) {
            keel_fail("cpu: out of memory for the attention backward's row sums of '%s'", t->name);
            goto done;
        }
        keel_pool_for(cpu_pool(be), rows, dq_task, &c);
        if (!c.failed) keel_pool_for(cpu_pool(be), c.B * c.Tk * c.KV, dkv_task, &c);
        free(c.delta);
    }
    rc = c.failed ? keel_fail("cpu: out of memory for the attention scratch of '%s'", t->name) : 0;
done:
    for (int i = 0; i < made; i++) free(tmp[i].data);
    return rc;
}
