/* keel: the gated delta rule on the cpu backend, forward and backward, one (batch, value head)
 * lane per work item. Per lane, with state S (Dk x Dv), S0 = 0, for each step t:
 *   S = exp(g) S;  d = beta (v - S^T k);  S = S + k d^T;  o = S^T q.
 * Each column j of S evolves on its own (k, q, g, beta are shared; v and d are per column), so a
 * lane runs in blocks of VB value columns over all T: the block's state (VB x Dk floats, each
 * column contiguous in k) stays in L1 where the whole Dk x Dv state did not. Sums over k run in
 * lanes (dot_lanes); sums across columns (dq, dk, dg, dbeta) run over j in ascending order, block
 * after block: a fixed order, whatever the thread count.
 * The backward pass stores the block's state only at chunk boundaries (every GDN_CHUNK steps)
 * and recomputes the states inside a chunk from there, with the forward pass's step function. */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"
#include "ops/ops.h"
#include "tensor/convert.h"
#include "util/faults.h"
#include "util/error.h"

#define GDN_CHUNK 64
enum { VB = 8 }; /* value columns per block */

typedef struct {
    const keel_tensor *t;
    int64_t Dk, Hk, T, B, Dv, Hv;
    int failed;       /* set by a lane that could not get scratch memory */
    bool fault_round; /* KEEL_FAULT=gdn-update-bf16: step's update rounded to bf16 (util/faults.h) */
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
        /* an example starts here: g = -inf makes the decay exp(g) exactly 0, which resets the
         * state (forward) and stops dS flowing into the previous example (backward) */
        L->g[t] = cpu_pos(s[5], t, b) == 0 ? -INFINITY : cpu_ldf(cpu_row(s[3], t, b, 0) + hv * s[3]->nb[0]);
        L->beta[t] = cpu_ldf(cpu_row(s[4], t, b, 0) + hv * s[4]->nb[0]);
        if (with_do) {
            const char *dr = cpu_row(s[6], hv, t, b);
            for (int64_t j = 0; j < c->Dv; j++) L->dO[t * c->Dv + j] = cpu_ldf(dr + j * s[6]->nb[0]);
        }
    }
}

/* Sums over a row run in LANES interleaved partial sums (element j into partial j % LANES), added
 * in lane order at the end: a fixed order (so results never depend on threads or ISA), and one the
 * compiler turns into vector code, where a single running sum would be a serial chain. */
enum { LANES = 16 };

static inline float lane_total(const float *p) {
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += p[l];
    return s;
}

/* sum_j x[j] y[j] in the lane order above */
static inline float dot_lanes(const float *x, const float *y, int64_t n) {
    float p[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) p[l] += x[j + l] * y[j + l];
    for (int l = 0; l < LANES && j < n; j++, l++) p[l] += x[j] * y[j];
    return lane_total(p);
}

/* sum_i (a x[i]) y[i], the lanes as dot_lanes */
static inline float dot_scaled(const float *x, float a, const float *y, int64_t n) {
    float p[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) p[l] += (a * x[i + l]) * y[i + l];
    for (int l = 0; l < LANES && i < n; i++, l++) p[l] += (a * x[i]) * y[i];
    return lane_total(p);
}

/* One step for the nb columns of a block, S [nb][Dk]: Sa = exp(g) S; d = beta (v - Sa^T k);
 * S <- Sa + k d^T; and, when o is given, o[jj] = S[jj] . q. v and o point at the block's first
 * column. fault: d rounded to bf16 (KEEL_FAULT=gdn-update-bf16, for the tests). */
static void step(float *S, int64_t nb, const float *k, const float *v, float g, float beta, int64_t Dk, const float *q,
                 float *o, bool fault) {
    float eg = expf(g);
    for (int64_t jj = 0; jj < nb; jj++) {
        float *s = S + jj * Dk;
        float d = beta * (v[jj] - dot_scaled(s, eg, k, Dk));
        if (fault) d = keel_cvt_bf16_to_f32(keel_cvt_f32_to_bf16(d));
        for (int64_t i = 0; i < Dk; i++) s[i] = eg * s[i] + k[i] * d;
        if (o) o[jj] = dot_lanes(s, q, Dk);
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
    int64_t Dk = c->Dk, Dv = c->Dv, T = c->T;
    lane_in L;
    float *mem = lane_alloc(c, &L);
    float *S = malloc((size_t)(VB * Dk + VB) * sizeof(float));
    if (!mem || !S) {
        free(mem), free(S);
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *o = S + VB * Dk;
    const keel_tensor *s0 = c->t->op == KEEL_OP_GATED_DELTA_NET_STATE ? c->t->src[6] : NULL;
    for (int64_t lane = begin; lane < end; lane++) {
        int64_t b = lane / c->Hv, hv = lane % c->Hv;
        gather(c, b, hv, &L, false);
        /* packed result of the STATE variant: o [Dv,Hv,T,B], then the final states [Dv,Dk,Hv,B] */
        float *fin = s0 ? (float *)c->t->data + Dv * c->Hv * T * c->B + (b * c->Hv + hv) * Dk * Dv : NULL;
        for (int64_t j0 = 0; j0 < Dv; j0 += VB) {
            int64_t nb = Dv - j0 < VB ? Dv - j0 : VB;
            for (int64_t jj = 0; jj < nb; jj++)
                for (int64_t i = 0; i < Dk; i++)
                    S[jj * Dk + i] = s0 ? cpu_ldf(cpu_row(s0, i, hv, b) + (j0 + jj) * s0->nb[0]) : 0.0f;
            for (int64_t t = 0; t < T; t++) {
                step(S, nb, L.k + t * Dk, L.v + t * Dv + j0, L.g[t], L.beta[t], Dk, L.q + t * Dk, o, c->fault_round);
                if (s0) {
                    float *orow = (float *)c->t->data + ((b * T + t) * c->Hv + hv) * Dv + j0;
                    for (int64_t jj = 0; jj < nb; jj++) orow[jj] = o[jj];
                } else {
                    char *orow = cpu_row(c->t, hv, t, b) + j0 * c->t->nb[0];
                    for (int64_t jj = 0; jj < nb; jj++) cpu_stf(orow + jj * c->t->nb[0], o[jj]);
                }
            }
            if (fin)
                for (int64_t jj = 0; jj < nb; jj++)
                    for (int64_t i = 0; i < Dk; i++) fin[i * Dv + j0 + jj] = S[jj * Dk + i];
        }
    }
    free(mem);
    free(S);
}

static void backward_task(void *arg, int64_t begin, int64_t end, int th) {
    (void)th;
    gdn_ctx *c = arg;
    int64_t Dk = c->Dk, Dv = c->Dv, T = c->T, Hv = c->Hv, B = c->B, n = VB * Dk;
    int64_t n_chunks = (T + GDN_CHUNK - 1) / GDN_CHUNK;
    lane_in L;
    float *mem = lane_alloc(c, &L);
    /* the block's chunk-start states, the states of one chunk, its dS; dg and dbeta per step */
    float *Sck = malloc((size_t)(n_chunks * n) * sizeof(float));
    float *Sl = malloc((size_t)((GDN_CHUNK + 1) * n) * sizeof(float));
    float *dS = malloc((size_t)n * sizeof(float));
    double *dgb = malloc((size_t)(2 * T) * sizeof(double));
    if (!mem || !Sck || !Sl || !dS || !dgb) {
        free(mem), free(Sck), free(Sl), free(dS), free(dgb);
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *out = c->t->data;
    keel_gdn_back_layout P = keel_gdn_back_layout_of(Dk, Dv, Hv, T, B);
    for (int64_t lane = begin; lane < end; lane++) {
        int64_t b = lane / Hv, hv = lane % Hv;
        gather(c, b, hv, &L, true);
        for (int64_t t = 0; t < T; t++) { /* dq and dk are summed over the blocks */
            float *row = out + (b * T + t) * P.row + hv * Dk;
            memset(row, 0, (size_t)Dk * sizeof(float));
            memset(row + P.dk, 0, (size_t)Dk * sizeof(float));
        }
        for (int64_t t = 0; t < 2 * T; t++) dgb[t] = 0;
        for (int64_t j0 = 0; j0 < Dv; j0 += VB) {
            int64_t nb = Dv - j0 < VB ? Dv - j0 : VB;
            /* forward, keeping the state at each chunk start */
            memset(Sl, 0, (size_t)n * sizeof(float));
            for (int64_t t = 0; t < T; t++) {
                if (t % GDN_CHUNK == 0) memcpy(Sck + (t / GDN_CHUNK) * n, Sl, (size_t)n * sizeof(float));
                step(Sl, nb, L.k + t * Dk, L.v + t * Dv + j0, L.g[t], L.beta[t], Dk, NULL, NULL, c->fault_round);
            }
            memset(dS, 0, (size_t)n * sizeof(float));
            for (int64_t ch = n_chunks - 1; ch >= 0; ch--) {
                int64_t t0 = ch * GDN_CHUNK, t1 = t0 + GDN_CHUNK < T ? t0 + GDN_CHUNK : T;
                memcpy(Sl, Sck + ch * n, (size_t)n * sizeof(float));
                for (int64_t t = t0; t < t1; t++) {
                    memcpy(Sl + (t - t0 + 1) * n, Sl + (t - t0) * n, (size_t)n * sizeof(float));
                    step(Sl + (t - t0 + 1) * n, nb, L.k + t * Dk, L.v + t * Dv + j0, L.g[t], L.beta[t], Dk, NULL, NULL,
                         c->fault_round);
                }
                for (int64_t t = t1 - 1; t >= t0; t--) {
                    const float *q = L.q + t * Dk, *k = L.k + t * Dk;
                    float eg = expf(L.g[t]), bt = L.beta[t];
                    float *row = out + (b * T + t) * P.row, *dq = row + hv * Dk, *dk = dq + P.dk;
                    for (int64_t jj = 0; jj < nb; jj++) {
                        int64_t j = j0 + jj;
                        const float *sp = Sl + (t - t0) * n + jj * Dk, *st = sp + n;
                        float *ds = dS + jj * Dk, vj = L.v[t * Dv + j], doj = L.dO[t * Dv + j];
                        /* u = (eg sp) . k, d = beta (v - u), as the forward step */
                        float u = dot_scaled(sp, eg, k, Dk), d = bt * (vj - u);
                        /* o = st . q: dq += st dO_j, ds += q dO_j */
                        for (int64_t i = 0; i < Dk; i++) {
                            dq[i] += st[i] * doj;
                            ds[i] += q[i] * doj;
                        }
                        /* st = sa + k d: dd = ds . k; dv = beta dd; dbeta += dd (v - u); du = -beta dd */
                        float dd = dot_lanes(ds, k, Dk), du = -bt * dd;
                        row[P.dv + hv * Dv + j] = bt * dd;
                        dgb[T + t] += (double)dd * (vj - u);
                        /* dk += ds d + sa du; dsa = ds + k du; dg += sa . dsa; ds = eg dsa */
                        double pg[LANES] = {0};
                        int64_t i = 0;
                        for (; i + LANES <= Dk; i += LANES)
                            for (int l = 0; l < LANES; l++) {
                                float sa = eg * sp[i + l], v2 = ds[i + l] + k[i + l] * du;
                                dk[i + l] += ds[i + l] * d + sa * du;
                                pg[l] += (double)sa * v2;
                                ds[i + l] = eg * v2;
                            }
                        for (int l = 0; l < LANES && i < Dk; i++, l++) {
                            float sa = eg * sp[i], v2 = ds[i] + k[i] * du;
                            dk[i] += ds[i] * d + sa * du;
                            pg[l] += (double)sa * v2;
                            ds[i] = eg * v2;
                        }
                        double g = 0;
                        for (int l = 0; l < LANES; l++) g += pg[l];
                        dgb[t] += g;
                    }
                }
            }
        }
        for (int64_t t = 0; t < T; t++) {
            int64_t at = (b * T + t) * Hv + hv;
            out[P.dg + at] = (float)dgb[t];
            out[P.db + at] = (float)dgb[T + t];
        }
    }
    free(mem), free(Sck), free(Sl), free(dS), free(dgb);
}

static int run(keel_backend *be, const keel_tensor *t, keel_pool_fn fn) {
    const keel_tensor *q = t->src[0], *v = t->src[2];
    gdn_ctx c = {t, q->ne[0], q->ne[1], q->ne[2], q->ne[3], v->ne[0], v->ne[1], 0, false};
    int fr = keel_fault_gdn_update_bf16();
    if (fr < 0) return -1;
    c.fault_round = fr == 1;
    keel_pool_for(cpu_pool(be), c.B * c.Hv, fn, &c);
    if (c.failed) return keel_fail("cpu: out of memory for the gated delta rule scratch of '%s'", t->name);
    return 0;
}

int cpu_gdn_forward(keel_backend *be, const keel_tensor *t) { return run(be, t, forward_task); }
int cpu_gdn_backward(keel_backend *be, const keel_tensor *t) { return run(be, t, backward_task); }
