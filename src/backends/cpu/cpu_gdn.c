/* keel: the gated delta rule on the cpu backend, forward and backward, one (batch, value head)
 * lane per work item. Per lane, with state S (Dk x Dv), S0 = 0, for each step t:
 *   S = exp(g) S;  d = beta (v - S^T k);  S = S + k d^T;  o = S^T q.
 * The backward pass stores S only at chunk boundaries (every GDN_CHUNK steps) and recomputes the
 * states inside a chunk from there, with the same step function as the forward pass. */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"
#include "ops/ops.h"
#include "util/error.h"

#define GDN_CHUNK 64

typedef struct {
    const keel_tensor *t;
    int64_t Dk, Hk, T, B, Dv, Hv;
    int failed; /* set by a lane that could not get scratch memory */
} gdn_ctx;

/* Lane inputs gathered into contiguous arrays (inputs may be strided views). */
typedef struct {
    float *q, *k, *v, *g, *beta, *dO; /* [T][Dk], [T][Dk], [T][Dv], [T], [T], [T][Dv] */
} lane_in;

static void gather(const gdn_ctx *c, int64_t b, int64_t hv, lane_in *L, bool with_do) {
    keel_tensor *const *s = c->t->src;
    int64_t hk = hv / (c->Hv / c->Hk);
    for (int64_t t = 0; t < c->T; t++) {
        const char *qr = cpu_row(s[0], hk, t, b), *kr = cpu_row(s[1], hk, t, b), *vr = cpu_row(s[2], hv, t, b);
        for (int64_t i = 0; i < c->Dk; i++) {
            L->q[t * c->Dk + i] = cpu_ldf(qr + i * s[0]->nb[0]);
            L->k[t * c->Dk + i] = cpu_ldf(kr + i * s[1]->nb[0]);
        }
        for (int64_t j = 0; j < c->Dv; j++) L->v[t * c->Dv + j] = cpu_ldf(vr + j * s[2]->nb[0]);
        L->g[t] = cpu_ldf(cpu_row(s[3], t, b, 0) + hv * s[3]->nb[0]);
        L->beta[t] = cpu_ldf(cpu_row(s[4], t, b, 0) + hv * s[4]->nb[0]);
        if (with_do) {
            const char *dr = cpu_row(s[5], hv, t, b);
            for (int64_t j = 0; j < c->Dv; j++) L->dO[t * c->Dv + j] = cpu_ldf(dr + j * s[5]->nb[0]);
        }
    }
}

/* One step of the recurrence: S <- exp(g) S, then S <- S + k d^T with d = beta (v - S^T k).
 * u (Dv scratch) receives S_a^T k, d receives d. */
static void step(float *S, const float *k, const float *v, float g, float beta, int64_t Dk, int64_t Dv, float *u,
                 float *d) {
    float eg = expf(g);
    for (int64_t i = 0; i < Dk * Dv; i++) S[i] *= eg;
    for (int64_t j = 0; j < Dv; j++) u[j] = 0.0f;
    for (int64_t i = 0; i < Dk; i++) {
        float ki = k[i];
        const float *Si = S + i * Dv;
        for (int64_t j = 0; j < Dv; j++) u[j] += Si[j] * ki;
    }
    for (int64_t j = 0; j < Dv; j++) d[j] = beta * (v[j] - u[j]);
    for (int64_t i = 0; i < Dk; i++) {
        float ki = k[i];
        float *Si = S + i * Dv;
        for (int64_t j = 0; j < Dv; j++) Si[j] += ki * d[j];
    }
}

static float *lane_alloc(const gdn_ctx *c, lane_in *L) {
    int64_t per = c->T * (2 * c->Dk + 2 * c->Dv + 2);
    float *m = malloc((size_t)per * sizeof(float));
    if (!m) return NULL;
    L->q = m, L->k = L->q + c->T * c->Dk, L->v = L->k + c->T * c->Dk, L->dO = L->v + c->T * c->Dv;
    L->g = L->dO + c->T * c->Dv, L->beta = L->g + c->T;
    return m;
}

static void forward_task(void *arg, int64_t begin, int64_t end, int th) {
    (void)th;
    gdn_ctx *c = arg;
    int64_t Dk = c->Dk, Dv = c->Dv;
    lane_in L;
    float *mem = lane_alloc(c, &L);
    float *S = malloc((size_t)(Dk * Dv + 2 * Dv) * sizeof(float));
    if (!mem || !S) {
        free(mem), free(S);
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *u = S + Dk * Dv, *d = u + Dv;
    for (int64_t lane = begin; lane < end; lane++) {
        int64_t b = lane / c->Hv, hv = lane % c->Hv;
        gather(c, b, hv, &L, false);
        const keel_tensor *s0 = c->t->op == KEEL_OP_GATED_DELTA_NET_STATE ? c->t->src[5] : NULL;
        for (int64_t i = 0; i < Dk; i++)
            for (int64_t j = 0; j < Dv; j++) S[i * Dv + j] = s0 ? cpu_ldf(cpu_row(s0, i, hv, b) + j * s0->nb[0]) : 0.0f;
        for (int64_t t = 0; t < c->T; t++) {
            step(S, L.k + t * Dk, L.v + t * Dv, L.g[t], L.beta[t], Dk, Dv, u, d);
            const float *q = L.q + t * Dk;
            for (int64_t j = 0; j < Dv; j++) u[j] = 0.0f;
            for (int64_t i = 0; i < Dk; i++) {
                const float *Si = S + i * Dv;
                for (int64_t j = 0; j < Dv; j++) u[j] += Si[j] * q[i];
            }
            if (s0) { /* packed result: o [Dv,Hv,T,B], then the final states [Dv,Dk,Hv,B] */
                float *o = (float *)c->t->data + ((b * c->T + t) * c->Hv + hv) * Dv;
                for (int64_t j = 0; j < Dv; j++) o[j] = u[j];
            } else {
                char *o = cpu_row(c->t, hv, t, b);
                for (int64_t j = 0; j < Dv; j++) cpu_stf(o + j * c->t->nb[0], u[j]);
            }
        }
        if (s0)
            memcpy((float *)c->t->data + Dv * c->Hv * c->T * c->B + (b * c->Hv + hv) * Dk * Dv, S,
                   (size_t)(Dk * Dv) * sizeof(float));
    }
    free(mem);
    free(S);
}

static void backward_task(void *arg, int64_t begin, int64_t end, int th) {
    (void)th;
    gdn_ctx *c = arg;
    int64_t Dk = c->Dk, Dv = c->Dv, T = c->T, Hv = c->Hv, B = c->B, n = Dk * Dv;
    int64_t n_chunks = (T + GDN_CHUNK - 1) / GDN_CHUNK;
    lane_in L;
    float *mem = lane_alloc(c, &L);
    /* chunk-start states, the states of one chunk, dS, and vectors */
    float *Sck = malloc((size_t)(n_chunks * n) * sizeof(float));
    float *Sl = malloc((size_t)((GDN_CHUNK + 1) * n) * sizeof(float));
    float *dS = malloc((size_t)(n + 4 * Dv) * sizeof(float));
    if (!mem || !Sck || !Sl || !dS) {
        free(mem), free(Sck), free(Sl), free(dS);
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *u = dS + n, *d = u + Dv, *dd = d + Dv, *tmp = dd + Dv;
    float *out = c->t->data;
    int64_t off_dk = Dk * Hv * T * B, off_dv = 2 * Dk * Hv * T * B, off_dg = off_dv + Dv * Hv * T * B,
            off_db = off_dg + Hv * T * B;
    for (int64_t lane = begin; lane < end; lane++) {
        int64_t b = lane / Hv, hv = lane % Hv;
        gather(c, b, hv, &L, true);
        /* forward, keeping the state at each chunk start */
        for (int64_t i = 0; i < n; i++) Sl[i] = 0.0f;
        for (int64_t t = 0; t < T; t++) {
            if (t % GDN_CHUNK == 0) memcpy(Sck + (t / GDN_CHUNK) * n, Sl, (size_t)n * sizeof(float));
            step(Sl, L.k + t * Dk, L.v + t * Dv, L.g[t], L.beta[t], Dk, Dv, u, d);
        }
        for (int64_t i = 0; i < n; i++) dS[i] = 0.0f;
        for (int64_t ch = n_chunks - 1; ch >= 0; ch--) {
            int64_t t0 = ch * GDN_CHUNK, t1 = t0 + GDN_CHUNK < T ? t0 + GDN_CHUNK : T;
            memcpy(Sl, Sck + ch * n, (size_t)n * sizeof(float));
            for (int64_t t = t0; t < t1; t++) {
                memcpy(Sl + (t - t0 + 1) * n, Sl + (t - t0) * n, (size_t)n * sizeof(float));
                step(Sl + (t - t0 + 1) * n, L.k + t * Dk, L.v + t * Dv, L.g[t], L.beta[t], Dk, Dv, u, d);
            }
            for (int64_t t = t1 - 1; t >= t0; t--) {
                const float *Sp = Sl + (t - t0) * n, *St = Sl + (t - t0 + 1) * n;
                const float *q = L.q + t * Dk, *k = L.k + t * Dk, *v = L.v + t * Dv, *dO = L.dO + t * Dv;
                float eg = expf(L.g[t]), bt = L.beta[t];
                int64_t row = (b * T + t) * Hv + hv;
                /* u = (eg Sp)^T k, d = beta (v - u) */
                for (int64_t j = 0; j < Dv; j++) u[j] = 0.0f;
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++) u[j] += (eg * Sp[i * Dv + j]) * k[i];
                for (int64_t j = 0; j < Dv; j++) d[j] = bt * (v[j] - u[j]);
                /* o = St^T q: dq = St dO, dS += q dO^T */
                for (int64_t i = 0; i < Dk; i++) {
                    float s = 0.0f;
                    for (int64_t j = 0; j < Dv; j++) s += St[i * Dv + j] * dO[j];
                    out[row * Dk + i] = s;
                }
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++) dS[i * Dv + j] += q[i] * dO[j];
                /* St = Sa + k d^T: dd = dS^T k; dv = beta dd; dbeta = dd . (v - u) */
                for (int64_t j = 0; j < Dv; j++) dd[j] = 0.0f;
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++) dd[j] += dS[i * Dv + j] * k[i];
                double dbeta = 0;
                for (int64_t j = 0; j < Dv; j++) {
                    dbeta += (double)dd[j] * (v[j] - u[j]);
                    out[off_dv + row * Dv + j] = bt * dd[j];
                    tmp[j] = -bt * dd[j]; /* du */
                }
                /* dk = dS d + Sa du */
                for (int64_t i = 0; i < Dk; i++) {
                    float s1 = 0.0f, s2 = 0.0f;
                    for (int64_t j = 0; j < Dv; j++) {
                        s1 += dS[i * Dv + j] * d[j];
                        s2 += (eg * Sp[i * Dv + j]) * tmp[j];
                    }
                    out[off_dk + row * Dk + i] = s1 + s2;
                }
                /* dSa = dS + k du^T; dg = sum(Sa * dSa); dSp = eg dSa */
                double dg = 0;
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++) {
                        float v2 = dS[i * Dv + j] + k[i] * tmp[j];
                        dg += (double)(eg * Sp[i * Dv + j]) * v2;
                        dS[i * Dv + j] = eg * v2;
                    }
                out[off_dg + row] = (float)dg;
                out[off_db + row] = (float)dbeta;
            }
        }
    }
    free(mem), free(Sck), free(Sl), free(dS);
}

static int run(keel_backend *be, const keel_tensor *t, keel_pool_fn fn) {
    const keel_tensor *q = t->src[0], *v = t->src[2];
    gdn_ctx c = {t, q->ne[0], q->ne[1], q->ne[2], q->ne[3], v->ne[0], v->ne[1], 0};
    keel_pool_for(cpu_pool(be), c.B * c.Hv, fn, &c);
    if (c.failed) return keel_fail("cpu: out of memory for the gated delta rule scratch of '%s'", t->name);
    return 0;
}

int cpu_gdn_forward(keel_backend *be, const keel_tensor *t) { return run(be, t, forward_task); }
int cpu_gdn_backward(keel_backend *be, const keel_tensor *t) { return run(be, t, backward_task); }
