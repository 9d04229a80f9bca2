/* keel: the cpu backend's kernels (float32). Each kernel is split over rows of its result (or
 * other independent items); reductions inside a row run serially in index order with a float64
 * accumulator, so results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/gemm.h"
#include "ops/ops.h"
#include "ops/dropout_mask.h"
#include "ops/optimizer_step.h"
#include "ops/scalar_f32.h"
#include "backends/cpu/vec_math.h"
#include "util/error.h"

typedef struct {
    keel_backend *be;
    const keel_tensor *t;
    double *partial; /* per-row results reduced serially afterwards */
    double ce_div;   /* CROSS_ENTROPY_LOSS(_BACK): the loss's divisor */
    double adamw_f;  /* ADAMW: the gradients' factor (keel_adamw_factor) */
    int64_t *csr_start, *csr_items;
    float *wt;    /* CONV1D, GDN_CONV: the weight as [K][C] */
    float *rows;  /* GDN_CONV: 2 C floats a thread (the conv's output and its SiLU); QK_NORM_ROPE, and
                  * CONV1D_BACK_INPUT with a bf16 result: a row a thread (QK_NORM_ROPE's bf16 result: two) */
    double *acc;  /* REPEAT_BACK: one row of float64 sums per thread (NULL: sum element by element) */
    float *terms; /* RMS_NORM_W_BACK(_ADD), GATED_RMS_NORM_BACK: the products dw sums, row after row */
} node_ctx;

#define F(p) (*(const float *)(const void *)(p))
#define W(p) (*(float *)(void *)(p))

/* SiLU and its backward with the vector exp: SILU, SILU_BACK and SWIGLU(_BACK) share them, so the
 * fused op gives the bits of the ops it replaces. */
/* Both from e = exp(-x), so a kernel that needs both for one x (the gated norm's backward) takes
 * the exp once: the same formulas, the same bits. */
static inline float silu_e(float x, float e) { return x / (1.0f + e); }
static inline float silu_back_e(float x, float e, float d) {
    float sg = 1.0f / (1.0f + e);
    return d * sg * (1.0f + x * (1.0f - sg));
}
static inline float silu_f32(float x) { return silu_e(x, keel_expf_fast(-x)); }
static inline float silu_back_f32(float x, float d) { return silu_back_e(x, keel_expf_fast(-x), d); }

/* ROPE's rotation of a row of n (stride sn bytes) into d: pairs f, f + n_rot/2 turned by pos *
 * freq_f (dir -1: back), the rest copied. Angles in float64: a float32 angle at position 1e4 is
 * off by ~1e-3 rad. ROPE and QK_NORM_ROPE share it, so the fused op has ROPE's bits. */
static void rope_row(float *d, const char *s, int64_t sn, int64_t n, int64_t nr, double theta, int64_t pos,
                     double dir) {
    int64_t h = nr / 2;
    for (int64_t f = 0; f < h; f++) {
        double ang = (double)pos * keel_rope_freq(theta, nr, f);
        float cs = (float)cos(ang), sr = (float)(dir * sin(ang));
        float x1 = F(s + f * sn), x2 = F(s + (f + h) * sn);
        d[f] = x1 * cs - x2 * sr;
        d[f + h] = x2 * cs + x1 * sr;
    }
    for (int64_t i = nr; i < n; i++) d[i] = F(s + i * sn);
}

static void unary_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *a = t->src[0];
    for (int64_t r = b; r < e; r++) {
        char *d = cpu_row_flat(t, r);
        const char *s = cpu_row_flat(a, r);
        float sc = (float)t->fp[0], bi = (float)t->fp[1];
        if (t->op == KEEL_OP_SILU) { /* keel_unary_f32's SiLU with the vector exp in place of expf */
            for (int64_t i = 0; i < t->ne[0]; i++) {
                float x = F(s + i * a->nb[0]);
                W(d + 4 * i) = silu_f32(x);
            }
            continue;
        }
        for (int64_t i = 0; i < t->ne[0]; i++) W(d + 4 * i) = keel_unary_f32(t->op, F(s + i * a->nb[0]), sc, bi);
    }
}

static void binary_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *x = t->src[0], *y = t->src[1];
    int64_t n = t->ne[0], ny = y->ne[0];
    for (int64_t r = b; r < e; r++) {
        int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
        float *d = (float *)(void *)cpu_row(t, i1, i2, i3);
        const char *xs = cpu_row(x, i1, i2, i3);
        const char *ys = cpu_row(y, i1 % y->ne[1], i2 % y->ne[2], i3 % y->ne[3]);
        int64_t xn = x->nb[0], yn = y->nb[0];
        if (xn == 4 && yn == 4 && ny == n) {
            const float *xf = (const float *)(const void *)xs, *yf = (const float *)(const void *)ys;
            /* the shared formula with the op a constant in each loop, so each loop is vector code */
#define BINARY_LOOP(OP)                                                                                                \
    case OP:                                                                                                           \
        for (int64_t i = 0; i < n; i++) d[i] = keel_binary_f32(OP, xf[i], yf[i]);                                      \
        break;
            switch (t->op) {
                BINARY_LOOP(KEEL_OP_ADD)
                BINARY_LOOP(KEEL_OP_SUB)
                BINARY_LOOP(KEEL_OP_MUL)
                BINARY_LOOP(KEEL_OP_DIV)
            default:
                for (int64_t i = 0; i < n; i++) d[i] = keel_binary_f32(t->op, xf[i], yf[i]);
            }
#undef BINARY_LOOP
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            d[i] = keel_binary_f32(t->op, F(xs + i * xn), F(ys + (i % ny) * yn));
        }
    }
}

/* Ops that reduce along a row of src0 and write a row (or one value) of the result. */
static void row_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *a = t->src[0], *y = t->src[1];
    int64_t n = a->ne[0], an = a->nb[0];
    for (int64_t r = b; r < e; r++) {
        int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
        const char *s = cpu_row(a, i1, i2, i3);
        char *d = cpu_row(t, i1, i2, i3);
        switch (t->op) {
        case KEEL_OP_SUM:
        case KEEL_OP_SUM_ROWS:
        case KEEL_OP_MEAN: {
            double acc = 0;
            for (int64_t i = 0; i < n; i++) acc += F(s + i * an);
            if (t->op == KEEL_OP_SUM)
                c->partial[r] = acc;
            else
                W(d) = (float)(t->op == KEEL_OP_MEAN ? acc / (double)n : acc);
            break;
        }
        case KEEL_OP_RMS_NORM:
        case KEEL_OP_L2_NORM: {
            double acc = 0;
            for (int64_t i = 0; i < n; i++) {
                double x = F(s + i * an);
                acc += x * x;
            }
            if (t->op == KEEL_OP_RMS_NORM) acc /= (double)n;
            float sc = (float)(1.0 / sqrt(acc + t->fp[0]));
            for (int64_t i = 0; i < n; i++) W(d + 4 * i) = F(s + i * an) * sc;
            break;
        }
        case KEEL_OP_RMS_NORM_BACK:
        case KEEL_OP_L2_NORM_BACK: {
            const char *dy = cpu_row(y, i1, i2, i3);
            int64_t yn = y->nb[0];
            double ss = 0, sd = 0;
            for (int64_t i = 0; i < n; i++) {
                double x = F(s + i * an);
                ss += x * x;
                sd += x * F(dy + i * yn);
            }
            double dn = t->op == KEEL_OP_RMS_NORM_BACK ? (double)n : 1.0;
            double sc = 1.0 / sqrt(ss / dn + t->fp[0]), f2 = sc * sc * sc * sd / dn;
            /* the two terms nearly cancel when eps dominates: combine them in float64 */
            for (int64_t i = 0; i < n; i++) W(d + 4 * i) = (float)(sc * F(dy + i * yn) - f2 * F(s + i * an));
            break;
        }
        case KEEL_OP_SOFT_MAX:
        case KEEL_OP_SOFT_MAX_CAUSAL: { /* over keys lo .. hi; the others 0 */
            int64_t lo = 0, hi = n - 1;
            if (t->op == KEEL_OP_SOFT_MAX_CAUSAL) {
                hi = i1 + (n - a->ne[1]);
                lo = hi - cpu_pos(y, i1, i3);
                if (lo < 0) lo = 0;
            }
            float sc = (float)t->fp[0], mx = -INFINITY;
            for (int64_t i = lo; i <= hi; i++) mx = fmaxf(mx, sc * F(s + i * an));
            double z = 0;
            for (int64_t i = lo; i <= hi; i++) {
                float ev = expf(sc * F(s + i * an) - mx);
                W(d + 4 * i) = ev;
                z += ev;
            }
            float iz = (float)(1.0 / z);
            for (int64_t i = 0; i < lo; i++) W(d + 4 * i) = 0.0f;
            for (int64_t i = lo; i <= hi; i++) W(d + 4 * i) *= iz;
            for (int64_t i = hi + 1; i < n; i++) W(d + 4 * i) = 0.0f;
            break;
        }
        case KEEL_OP_SOFT_MAX_BACK: {
            const char *dy = cpu_row(y, i1, i2, i3);
            int64_t yn = y->nb[0];
            double sd = 0;
            for (int64_t i = 0; i < n; i++) sd += (double)F(s + i * an) * F(dy + i * yn);
            float fs = (float)sd, sc = (float)t->fp[0];
            for (int64_t i = 0; i < n; i++) W(d + 4 * i) = sc * F(s + i * an) * (F(dy + i * yn) - fs);
            break;
        }
        case KEEL_OP_SILU_BACK: {
            const char *dy = cpu_row(y, i1, i2, i3);
            for (int64_t i = 0; i < n; i++) W(d + 4 * i) = silu_back_f32(F(s + i * an), F(dy + i * y->nb[0]));
            break;
        }
        case KEEL_OP_SIGMOID_BACK: { /* SIGMOID's old rule, SCALE(y, -1, 1), MUL, MUL: the same roundings */
            const char *dy = cpu_row(y, i1, i2, i3);
            for (int64_t i = 0; i < n; i++) {
                float yv = F(s + i * an);
                W(d + 4 * i) = F(dy + i * y->nb[0]) * (yv * keel_unary_f32(KEEL_OP_SCALE, yv, -1.0f, 1.0f));
            }
            break;
        }
        case KEEL_OP_ROPE:
        case KEEL_OP_ROPE_BACK:
            rope_row((float *)(void *)d, s, an, n, t->ip[0], t->fp[0], cpu_pos(y, i2, i3),
                     t->op == KEEL_OP_ROPE ? 1.0 : -1.0);
            break;
        case KEEL_OP_CROSS_ENTROPY_LOSS:
        case KEEL_OP_CROSS_ENTROPY_LOSS_BACK: {
            int32_t yv;
            const keel_tensor *tg = t->src[1];
            /* targets are read in flat order over the logits' rows */
            int64_t ti0 = r % tg->ne[0], ti1 = (r / tg->ne[0]) % tg->ne[1],
                    ti2 = (r / (tg->ne[0] * tg->ne[1])) % tg->ne[2], ti3 = r / (tg->ne[0] * tg->ne[1] * tg->ne[2]);
            memcpy(&yv, cpu_row(tg, ti1, ti2, ti3) + ti0 * tg->nb[0], 4);
            if (yv < 0) { /* no loss at this position */
                if (t->op == KEEL_OP_CROSS_ENTROPY_LOSS)
                    c->partial[r] = 0.0;
                else
                    for (int64_t i = 0; i < n; i++) W(d + 4 * i) = 0.0f;
                break;
            }
            if (t->op == KEEL_OP_CROSS_ENTROPY_LOSS) {
                /* max, then sum exp(x - max), over the row in chunks gathered to the stack */
                enum { CH = 1024 };
                float buf[CH], mx = -INFINITY;
                for (int64_t i0 = 0; i0 < n; i0 += CH) {
                    int64_t m = n - i0 < CH ? n - i0 : CH;
                    for (int64_t i = 0; i < m; i++) buf[i] = F(s + (i0 + i) * an);
                    mx = fmaxf(mx, keel_max_row(buf, m));
                }
                double z = 0;
                for (int64_t i0 = 0; i0 < n; i0 += CH) {
                    int64_t m = n - i0 < CH ? n - i0 : CH;
                    for (int64_t i = 0; i < m; i++) buf[i] = F(s + (i0 + i) * an);
                    keel_exp_row(buf, mx, m);
                    z += keel_sum_row_f64(buf, m);
                }
                c->partial[r] = log(z) + mx - F(s + yv * an);
            } else { /* in place in the result row: x, then exp(x - max), then the gradient */
                float *dr = (float *)(void *)d;
                for (int64_t i = 0; i < n; i++) dr[i] = F(s + i * an);
                float mx = keel_max_row(dr, n);
                keel_exp_row(dr, mx, n);
                double z = keel_sum_row_f64(dr, n);
                float dl = F(t->src[2]->data), sc = (float)(1.0 / z), k = (float)(dl / c->ce_div);
                float ey = dr[yv];
                for (int64_t i = 0; i < n; i++) dr[i] = (dr[i] * sc) * k;
                dr[yv] = (ey * sc - 1.0f) * k;
            }
            break;
        }
        default:
            break;
        }
    }
}

static void repeat_task(void *arg, int64_t b, int64_t e, int th) {
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *a = t->src[0];
    for (int64_t r = b; r < e; r++) {
        int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
        char *d = cpu_row(t, i1, i2, i3);
        const char *s = cpu_row(a, i1 % a->ne[1], i2 % a->ne[2], i3 % a->ne[3]);
        if (t->op == KEEL_OP_REPEAT) {
            for (int64_t i = 0; i < t->ne[0]; i++) W(d + 4 * i) = F(s + (i % a->ne[0]) * a->nb[0]);
        } else if (a->ne[0] == t->ne[0] && c->acc) {       /* REPEAT_BACK tiled along rows only: add whole rows */
            double *acc = c->acc + (int64_t)th * t->ne[0]; /* the same order per element as below */
            for (int64_t i = 0; i < t->ne[0]; i++) acc[i] = 0;
            for (int64_t k3 = i3; k3 < a->ne[3]; k3 += t->ne[3])
                for (int64_t k2 = i2; k2 < a->ne[2]; k2 += t->ne[2])
                    for (int64_t k1 = i1; k1 < a->ne[1]; k1 += t->ne[1]) {
                        const char *sr = cpu_row(a, k1, k2, k3);
                        for (int64_t i = 0; i < t->ne[0]; i++) acc[i] += F(sr + i * a->nb[0]);
                    }
            for (int64_t i = 0; i < t->ne[0]; i++) W(d + 4 * i) = (float)acc[i];
        } else { /* REPEAT_BACK: sum over tiles in flat tile order */
            for (int64_t i = 0; i < t->ne[0]; i++) {
                double acc = 0;
                for (int64_t k3 = i3; k3 < a->ne[3]; k3 += t->ne[3])
                    for (int64_t k2 = i2; k2 < a->ne[2]; k2 += t->ne[2])
                        for (int64_t k1 = i1; k1 < a->ne[1]; k1 += t->ne[1]) {
                            const char *sr = cpu_row(a, k1, k2, k3);
                            for (int64_t k0 = i; k0 < a->ne[0]; k0 += t->ne[0]) acc += F(sr + k0 * a->nb[0]);
                        }
                W(d + 4 * i) = (float)acc;
            }
        }
    }
}

/* One row (position tt, example bb) of CONV1D's output into u (back: of CONV1D_BACK_INPUT's, x then
 * dy); wt is the weight as conv_taps gives it.
 * Each channel sums its taps in order j = 0..K-1; tap j reaches K-1-j steps back from the output
 * position (forward: from the input position), within its example. */
/* A conv weight w [K,C] transposed to [K][C] floats (a tap's weights contiguous across channels),
 * for conv_row; NULL when out of memory. */
static float *conv_taps(const keel_tensor *w) {
    int64_t K = w->ne[0], C = w->ne[1];
    float *wt = malloc((size_t)(K * C) * sizeof(float));
    for (int64_t ch = 0; wt && ch < C; ch++)
        for (int64_t j = 0; j < K; j++) wt[j * C + ch] = F(cpu_row(w, ch, 0, 0) + j * w->nb[0]);
    return wt;
}

static void conv_row(const keel_tensor *x, const keel_tensor *p, const float *wt, int64_t K, int64_t tt, int64_t bb,
                     float *u, bool back) {
    int64_t T = x->ne[1], C = x->ne[0], xn = x->nb[0];
    for (int64_t ch = 0; ch < C; ch++) u[ch] = 0.0f;
    for (int64_t j = 0; j < K; j++) {
        int64_t ts = back ? tt + (K - 1) - j : tt - (K - 1) + j;
        if (ts < 0 || ts >= T || K - 1 - j > cpu_pos(p, back ? ts : tt, bb)) continue;
        const char *xr = cpu_row(x, ts, bb, 0);
        const float *wj = wt + j * C;
        if (xn == 4) {
            const float *xf = (const float *)(const void *)xr;
            for (int64_t ch = 0; ch < C; ch++) u[ch] += wj[ch] * xf[ch];
        } else {
            for (int64_t ch = 0; ch < C; ch++) u[ch] += wj[ch] * F(xr + ch * xn);
        }
    }
}

/* Channels of CONV1D_BACK_WEIGHT per work item: a block's rows (64 floats of dy and of x per
 * time step) are read whole, where one channel per item read one float per 24 KiB row. */
enum { CONV_CB = 64 };

static void conv_task(void *arg, int64_t b, int64_t e, int th) {
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *x = t->src[0], *w = t->src[1], *p = t->src[2];
    if (t->op == KEEL_OP_CONV1D_BACK_WEIGHT) { /* item = block of CONV_CB channels; src1 is dy */
        int64_t K = t->ne[0], T = x->ne[1], C = t->ne[1], xn = x->nb[0], wn = w->nb[0];
        for (int64_t blk = b; blk < e; blk++) {
            int64_t c0 = blk * CONV_CB, nc = C - c0 < CONV_CB ? C - c0 : CONV_CB;
            for (int64_t j = 0; j < K; j++) {
                double acc[CONV_CB] = {0}; /* each channel summed over (batch, time) in order */
                for (int64_t bb = 0; bb < x->ne[2]; bb++)
                    for (int64_t tt = (K - 1) - j; tt < T; tt++) {
                        if (K - 1 - j > cpu_pos(p, tt, bb)) continue; /* reaches before the example */
                        const char *dyr = cpu_row(w, tt, bb, 0) + c0 * wn,
                                   *xr = cpu_row(x, tt - (K - 1) + j, bb, 0) + c0 * xn;
                        for (int64_t ch = 0; ch < nc; ch++) acc[ch] += (double)F(dyr + ch * wn) * F(xr + ch * xn);
                    }
                for (int64_t ch = 0; ch < nc; ch++) W(cpu_row(t, c0 + ch, 0, 0) + 4 * j) = (float)acc[ch];
            }
        }
        return;
    }
    /* a bf16 result (CONV1D_BACK_INPUT's ip0): each row's float32 sums, then rounded as CAST rounds them */
    float *row = t->type == KEEL_BF16 ? c->rows + (int64_t)th * t->ne[0] : NULL;
    for (int64_t r = b; r < e; r++) { /* item = (t, b) row of the result */
        int64_t tt = r % t->ne[1], bb = r / t->ne[1];
        char *out = cpu_row(t, tt, bb, 0);
        conv_row(x, p, c->wt, w->ne[0], tt, bb, row ? row : (float *)(void *)out, t->op != KEEL_OP_CONV1D);
        for (int64_t ch = 0; row && ch < t->ne[0]; ch++)
            *(uint16_t *)(void *)(out + ch * t->nb[0]) = keel_cvt_f32_to_bf16(row[ch]);
    }
}

/* RMS_NORM_W and GATED_RMS_NORM and their backward, a row an item: RMS_NORM's float64 sum and
 * float32 scale, SCALE's 1 + w, MUL's products, silu_f32, and backward the products of MUL's rule,
 * silu_back_f32 and RMS_NORM_BACK's formula, so the bits of the ops they replace (the products dy
 * silu(z) rms_norm(x), which MUL's rule sends to REPEAT_BACK, go to c->terms for norm_w_dw_task's
 * sums; QK_NORM_ROPE_BACK's to its packed result, for REPEAT_BACK). */
static void norm_w_task(void *arg, int64_t b, int64_t e, int th) {
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *x = t->src[0], *w = t->src[1];
    bool gated = t->op == KEEL_OP_GATED_RMS_NORM || t->op == KEEL_OP_GATED_RMS_NORM_BACK;
    bool rope = t->op == KEEL_OP_QK_NORM_ROPE || t->op == KEEL_OP_QK_NORM_ROPE_BACK;
    bool back = t->op == KEEL_OP_RMS_NORM_W_BACK || t->op == KEEL_OP_RMS_NORM_W_BACK_ADD ||
                t->op == KEEL_OP_GATED_RMS_NORM_BACK || t->op == KEEL_OP_QK_NORM_ROPE_BACK,
         one = t->ip[0] != 0;
    const keel_tensor *z = gated ? t->src[2] : NULL, *dy = back ? t->src[gated || rope ? 3 : 2] : NULL;
    /* RMS_NORM_W_BACK_ADD: g + dx, ADD's float32 sum */
    const keel_tensor *ga = t->op == KEEL_OP_RMS_NORM_W_BACK_ADD ? t->src[3] : NULL;
    /* QK_NORM_ROPE: a row before its rotation (a bf16 result: then the row after it);
     * GATED_RMS_NORM_BACK: exp(-z) of the row, made by its first pass, read by its second (silu and
     * silu's backward of each z: one exp, not three) */
    float *row = rope || (gated && back) ? c->rows + (int64_t)th * (t->type == KEEL_BF16 ? 2 : 1) * x->ne[0] : NULL;
    int64_t n = x->ne[0], N = keel_nelements(x), xn = x->nb[0], wn = w->nb[0], zn = z ? z->nb[0] : 0;
    const char *ws = cpu_row(w, 0, 0, 0);
#define NW_W(i)  (one ? keel_unary_f32(KEEL_OP_SCALE, F(ws + (i)*wn), 1.0f, 1.0f) : F(ws + (i)*wn))
#define NW_SG(i) (z ? silu_f32(F(zs + (i)*zn)) : 1.0f)
    for (int64_t r = b; r < e; r++) {
        int64_t i1 = r % x->ne[1], i2 = (r / x->ne[1]) % x->ne[2], i3 = r / (x->ne[1] * x->ne[2]);
        const char *xs = cpu_row(x, i1, i2, i3), *zs = z ? cpu_row(z, i1, i2, i3) : NULL;
        double ss = 0, sd = 0;
        for (int64_t i = 0; i < n; i++) {
            double xv = F(xs + i * xn);
            ss += xv * xv;
        }
        float sc = (float)(1.0 / sqrt(ss / (double)n + t->fp[0]));
        int64_t pos = rope ? cpu_pos(t->src[2], i2, i3) : 0;
        if (!dy && t->type == KEEL_BF16 && !rope) { /* ip1: the float32 value rounded, as CAST rounds it */
            uint16_t *d = (uint16_t *)(void *)cpu_row(t, i1, i2, i3);
            for (int64_t i = 0; i < n; i++) {
                float y = F(xs + i * xn) * sc * NW_W(i);
                d[i] = keel_cvt_f32_to_bf16(z ? y * NW_SG(i) : y);
            }
            continue;
        }
        if (!dy) { /* QK_NORM_ROPE's bf16 result (ip2): the rotated row made in the row's second half, rounded */
            bool bf = t->type == KEEL_BF16;
            float *d = bf ? row + n : (float *)(void *)cpu_row(t, i1, i2, i3), *o = rope ? row : d;
            for (int64_t i = 0; i < n; i++) {
                float y = F(xs + i * xn) * sc * NW_W(i);
                o[i] = z ? y * NW_SG(i) : y;
            }
            if (rope) rope_row(d, (const char *)row, 4, n, t->ip[1], t->fp[1], pos, 1.0);
            uint16_t *h = bf ? (uint16_t *)(void *)cpu_row(t, i1, i2, i3) : NULL;
            for (int64_t i = 0; bf && i < n; i++) h[i] = keel_cvt_f32_to_bf16(d[i]);
            continue;
        }
        const char *gs = cpu_row(dy, i1, i2, i3);
        int64_t gn = dy->nb[0];
        if (rope) { /* g = ROPE_BACK(dy), then RMS_NORM_W_BACK's formula with g */
            rope_row(row, gs, gn, n, t->ip[1], t->fp[1], pos, -1.0);
            gs = (const char *)row, gn = 4;
        }
        for (int64_t i = 0; i < n; i++) { /* RMS_NORM_BACK's sums over x and da = (dy silu(z)) w */
            float db = F(gs + i * gn);
            if (z) {
                float zv = F(zs + i * zn);
                row[i] = keel_expf_fast(-zv);
                db = db * silu_e(zv, row[i]);
            }
            sd += (double)F(xs + i * xn) * (db * NW_W(i));
        }
        double sb = 1.0 / sqrt(ss / (double)n + t->fp[0]), f2 = sb * sb * sb * sd / (double)n;
        float *dx = (float *)(void *)cpu_row_flat(t, 0) + r * n, *dz = dx + N, *gw = rope ? dx + N : c->terms + r * n;
        /* the backward's bf16 part (ip1; not QK_NORM_ROPE_BACK's, whose ip1 is n_rot): dz, or a copy of
         * dx, each float32 value rounded as CAST rounds it */
        uint16_t *h = !rope && t->ip[1] ? (uint16_t *)(void *)((float *)(void *)cpu_row_flat(t, 0) + N) + r * n : NULL;
        const char *as = ga ? cpu_row(ga, i1, i2, i3) : NULL;
        for (int64_t i = 0; i < n; i++) {
            float xv = F(xs + i * xn), wv = NW_W(i), g = F(gs + i * gn), zv = z ? F(zs + i * zn) : 0.0f;
            float a = xv * sc, db = z ? g * silu_e(zv, row[i]) : g;
            dx[i] = (float)(sb * (db * wv) - f2 * xv);
            if (as) dx[i] = F(as + i * ga->nb[0]) + dx[i];
            if (z) {
                float v = silu_back_e(zv, row[i], g * (a * wv));
                if (h)
                    h[i] = keel_cvt_f32_to_bf16(v);
                else
                    dz[i] = v;
            } else if (h) {
                h[i] = keel_cvt_f32_to_bf16(dx[i]);
            }
            gw[i] = db * a;
        }
    }
#undef NW_W
#undef NW_SG
}

/* dw of RMS_NORM_W_BACK(_ADD) and GATED_RMS_NORM_BACK, a column an item: the float64 sum of its terms
 * over the rows in row order, as REPEAT_BACK sums the rows of MUL's product (the same bits) */
static void norm_w_dw_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *x = t->src[0];
    int64_t n = x->ne[0], R = keel_nrows(x);
    float *dw = (float *)(void *)cpu_row_flat(t, 0) + keel_nelements(t) - n; /* the last n */
    for (int64_t i = b; i < e; i++) {
        double acc = 0;
        for (int64_t r = 0; r < R; r++) acc += c->terms[r * n + i];
        dw[i] = (float)acc;
    }
}

/* GDN_CONV and GDN_CONV_BACK, a (position, example) row an item: CONV1D's sum, silu_f32, L2_NORM's
 * float64 sums and float32 scale, SCALE's formula, and backward L2_NORM_BACK's and silu_back_f32,
 * so the bits of the CONV1D, SILU, L2_NORM, SCALE ops and their backward ops it replaces. */
static void gdn_conv_task(void *arg, int64_t b, int64_t e, int th) {
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *x = t->src[0], *w = t->src[1], *p = t->src[2];
    const keel_tensor *dy = t->op == KEEL_OP_GDN_CONV_BACK ? t->src[3] : NULL;
    int64_t C = x->ne[0], K = w->ne[0], n = t->ip[0], hd = t->ip[1];
    float *u = c->rows + (int64_t)th * 2 * C, *sv = u + C, a = (float)t->fp[1];
    for (int64_t r = b; r < e; r++) {
        int64_t tt = r % x->ne[1], bb = r / x->ne[1];
        conv_row(x, p, c->wt, K, tt, bb, u, false);
        for (int64_t ch = 0; ch < C; ch++) sv[ch] = silu_f32(u[ch]);
        float *d = (float *)(void *)cpu_row(t, tt, bb, 0);
        const char *g = dy ? cpu_row(dy, tt, bb, 0) : NULL;
        int64_t gn = dy ? dy->nb[0] : 0;
        for (int64_t ch = 2 * n; ch < C; ch++) d[ch] = dy ? silu_back_f32(u[ch], F(g + ch * gn)) : sv[ch];
        for (int64_t h0 = 0; h0 < 2 * n; h0 += hd) {
            bool q = h0 < n;
            double ss = 0, sd = 0;
            for (int64_t ch = h0; ch < h0 + hd; ch++) {
                double xv = sv[ch];
                ss += xv * xv;
                if (dy) sd += xv * (q ? keel_unary_f32(KEEL_OP_SCALE, F(g + ch * gn), a, 0.0f) : F(g + ch * gn));
            }
            if (!dy) {
                float sc = (float)(1.0 / sqrt(ss + t->fp[0]));
                for (int64_t ch = h0; ch < h0 + hd; ch++)
                    d[ch] = q ? keel_unary_f32(KEEL_OP_SCALE, sv[ch] * sc, a, 0.0f) : sv[ch] * sc;
                continue;
            }
            double sc = 1.0 / sqrt(ss + t->fp[0]), f2 = sc * sc * sc * sd;
            for (int64_t ch = h0; ch < h0 + hd; ch++) {
                float gv = q ? keel_unary_f32(KEEL_OP_SCALE, F(g + ch * gn), a, 0.0f) : F(g + ch * gn);
                d[ch] = silu_back_f32(u[ch], (float)(sc * gv - f2 * sv[ch]));
            }
        }
    }
}

static void get_rows_back_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *dy = t->src[0];
    for (int64_t r = b; r < e; r++) {
        float *d = (float *)(void *)cpu_row(t, r, 0, 0);
        for (int64_t i = 0; i < t->ne[0]; i++) d[i] = 0.0f;
        for (int64_t k = c->csr_start[r]; k < c->csr_start[r + 1]; k++) {
            int64_t n = c->csr_items[k];
            const char *s = cpu_row(dy, n % dy->ne[1], n / dy->ne[1], 0);
            for (int64_t i = 0; i < t->ne[0]; i++) d[i] += F(s + i * dy->nb[0]);
        }
        if (t->op == KEEL_OP_GET_ROWS_BACK_ADD) { /* then the ADD: c + the sum */
            const keel_tensor *ct = t->src[2];
            const char *cs = cpu_row(ct, r, 0, 0);
            for (int64_t i = 0; i < t->ne[0]; i++) d[i] = keel_binary_f32(KEEL_OP_ADD, F(cs + i * ct->nb[0]), d[i]);
        }
    }
}

static void get_rows_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *a = t->src[0], *ids = t->src[1];
    int64_t len = cpu_copy_row_len(c->be, t->ne[0]);
    for (int64_t r = b; r < e; r++) {
        int64_t n0 = r % ids->ne[0], n1 = r / ids->ne[0];
        int32_t id;
        memcpy(&id, cpu_row(ids, n1, 0, 0) + n0 * ids->nb[0], 4);
        cpu_copy_row(t, cpu_row(t, n0, n1, 0), a, cpu_row(a, id, 0, 0), len, false);
    }
}

static void fill_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    float v = (float)c->t->fp[0];
    for (int64_t r = b; r < e; r++) {
        float *d = (float *)(void *)cpu_row_flat(c->t, r);
        for (int64_t i = 0; i < c->t->ne[0]; i++) d[i] = v;
    }
}

static void dropout_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *a = t->src[0];
    uint64_t key = keel_dropout_key((uint64_t)t->ip[0], (uint64_t)t->ip[1], (uint64_t)t->ip[2]),
             thr = (uint64_t)t->ip[3];
    float inv = (float)(1.0 / (1.0 - t->fp[0]));
    int64_t n = t->ne[0];
    for (int64_t r = b; r < e; r++) {
        int64_t i1 = r % t->ne[1], i2 = r / t->ne[1] % t->ne[2], i3 = r / t->ne[1] / t->ne[2];
        const char *s = cpu_row(a, i1, i2, i3);
        float *d = (float *)(void *)cpu_row(t, i1, i2, i3);
        for (int64_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, s + i * a->nb[0], 4);
            d[i] = keel_dropout_keep(key, (uint64_t)(r * n + i), thr) ? x * inv : 0.0f;
        }
    }
}

/* GDN_GATE over rows of a, and GDN_GATE_BACK over heads (each head's two sums run over every row,
 * in order, as REPEAT_BACK sums them): the formulas of the ops they replace (keel_unary_f32,
 * keel_binary_f32), each rounding where those ops' results round. */
static void gdn_gate_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *a = t->src[0], *al = t->src[1], *dt = t->src[2], *dy = t->src[3];
    int64_t H = a->ne[0], rows = keel_nrows(a), n = keel_nelements(a);
#define HEAD(x, h) F(cpu_row_flat(x, 0) + (h) * (x)->nb[0]) /* one value a head: a row of H */
    if (t->op == KEEL_OP_GDN_GATE) {
        for (int64_t r = b; r < e; r++) {
            const char *s = cpu_row_flat(a, r);
            char *d = cpu_row_flat(t, r);
            for (int64_t h = 0; h < H; h++) {
                float x = keel_binary_f32(KEEL_OP_ADD, F(s + h * a->nb[0]), HEAD(dt, h));
                float nexp = keel_unary_f32(KEEL_OP_NEG, keel_unary_f32(KEEL_OP_EXP, HEAD(al, h), 0, 0), 0, 0);
                W(d + 4 * h) = keel_unary_f32(KEEL_OP_SOFTPLUS, x, 0, 0) * nexp;
            }
        }
        return;
    }
    float *da = (float *)t->data;
    for (int64_t h = b; h < e; h++) {
        float ex = keel_unary_f32(KEEL_OP_EXP, HEAD(al, h), 0, 0), nexp = keel_unary_f32(KEEL_OP_NEG, ex, 0, 0);
        double s_n = 0, s_dt = 0;
        for (int64_t r = 0; r < rows; r++) {
            float x = keel_binary_f32(KEEL_OP_ADD, F(cpu_row_flat(a, r) + h * a->nb[0]), HEAD(dt, h));
            float d = F(cpu_row_flat(dy, r) + h * dy->nb[0]);
            float dx = (d * nexp) * keel_unary_f32(KEEL_OP_SIGMOID, x, 0, 0);
            da[r * H + h] = dx;
            s_n += d * keel_unary_f32(KEEL_OP_SOFTPLUS, x, 0, 0);
            s_dt += dx;
        }
        da[n + h] = keel_unary_f32(KEEL_OP_NEG, (float)s_n, 0, 0) * ex;
        da[n + H + h] = (float)s_dt;
    }
#undef HEAD
}

/* SIGMOID_MUL and SIGMOID_MUL_BACK over rows of x: keel_unary_f32's SIGMOID, MUL's products and
 * SIGMOID_BACK's formula, so the bits of the ops they replace. */
static void sigmoid_mul_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *x = t->src[0], *g = t->src[1], *dy = t->src[2];
    int64_t n = x->ne[0], all = keel_nelements(x);
    for (int64_t r = b; r < e; r++) {
        int64_t i1 = r % x->ne[1], i2 = r / x->ne[1] % x->ne[2], i3 = r / x->ne[1] / x->ne[2];
        const char *xs = cpu_row(x, i1, i2, i3), *gs = cpu_row(g, i1, i2, i3);
        if (t->op == KEEL_OP_SIGMOID_MUL && t->type == KEEL_BF16) { /* the float32 result rounded, as CAST does */
            uint16_t *d = (uint16_t *)(void *)cpu_row(t, i1, i2, i3);
            for (int64_t i = 0; i < n; i++)
                d[i] = keel_cvt_f32_to_bf16(F(xs + i * x->nb[0]) *
                                            keel_unary_f32(KEEL_OP_SIGMOID, F(gs + i * g->nb[0]), 0, 0));
            continue;
        }
        if (t->op == KEEL_OP_SIGMOID_MUL) {
            float *d = (float *)(void *)cpu_row(t, i1, i2, i3);
            for (int64_t i = 0; i < n; i++)
                d[i] = F(xs + i * x->nb[0]) * keel_unary_f32(KEEL_OP_SIGMOID, F(gs + i * g->nb[0]), 0, 0);
            continue;
        }
        const char *ds = cpu_row(dy, i1, i2, i3);
        float *dx = (float *)t->data + r * n, *dg = (float *)t->data + all + r * n;
        for (int64_t i = 0; i < n; i++) {
            float s = keel_unary_f32(KEEL_OP_SIGMOID, F(gs + i * g->nb[0]), 0, 0), d = F(ds + i * dy->nb[0]);
            dx[i] = d * s;
            dg[i] = (d * F(xs + i * x->nb[0])) * (s * keel_unary_f32(KEEL_OP_SCALE, s, -1.0f, 1.0f));
        }
    }
}

/* SWIGLU and SWIGLU_BACK over rows of the gate: silu_f32, silu_back_f32 and MUL's product. */
static void swiglu_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t, *g = t->src[0], *u = t->src[1], *dy = t->src[2];
    bool back = t->op == KEEL_OP_SWIGLU_BACK;
    int64_t n = g->ne[0], all = keel_nelements(g);
    for (int64_t r = b; r < e; r++) {
        int64_t i1 = r % g->ne[1], i2 = r / g->ne[1] % g->ne[2], i3 = r / g->ne[1] / g->ne[2];
        const char *gs = cpu_row(g, i1, i2, i3), *us = cpu_row(u, i1, i2, i3);
        if (!back && t->type == KEEL_BF16) { /* the float32 result rounded, as CAST rounds it */
            uint16_t *d = (uint16_t *)(void *)cpu_row(t, i1, i2, i3);
            for (int64_t i = 0; i < n; i++)
                d[i] = keel_cvt_f32_to_bf16(silu_f32(F(gs + i * g->nb[0])) * F(us + i * u->nb[0]));
            continue;
        }
        if (!back) {
            float *d = (float *)(void *)cpu_row(t, i1, i2, i3);
            for (int64_t i = 0; i < n; i++) d[i] = silu_f32(F(gs + i * g->nb[0])) * F(us + i * u->nb[0]);
            continue;
        }
        const char *ds = cpu_row(dy, i1, i2, i3);
        if (t->type == KEEL_BF16) { /* each float32 value rounded, as CAST rounds it */
            uint16_t *dg = (uint16_t *)t->data + r * n, *du = (uint16_t *)t->data + all + r * n;
            for (int64_t i = 0; i < n; i++) {
                float x = F(gs + i * g->nb[0]), d = F(ds + i * dy->nb[0]);
                dg[i] = keel_cvt_f32_to_bf16(silu_back_f32(x, d * F(us + i * u->nb[0])));
                du[i] = keel_cvt_f32_to_bf16(d * silu_f32(x));
            }
            continue;
        }
        float *dg = (float *)t->data + r * n, *du = (float *)t->data + all + r * n;
        for (int64_t i = 0; i < n; i++) {
            float x = F(gs + i * g->nb[0]), d = F(ds + i * dy->nb[0]);
            dg[i] = silu_back_f32(x, d * F(us + i * u->nb[0]));
            du[i] = d * silu_f32(x);
        }
    }
}

static void adamw_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const keel_tensor *t = c->t;
    float *p = t->data;
    const float *g = t->src[1]->data;
    float *m = t->src[2]->data, *v = t->src[3]->data;
    /* the decayed weights' bf16 copies, elements [ip3, ip2) */
    uint16_t *cp = t->op == KEEL_OP_ADAMW_SHADOW ? t->src[5]->data : NULL;
    int64_t c0 = t->op == KEEL_OP_ADAMW_SHADOW ? t->ip[3] : 0;
    float lr = (float)t->fp[0], b1 = (float)t->fp[1], b2 = (float)t->fp[2], eps = (float)t->fp[3],
          gs = (float)c->adamw_f;
    float bc1 = (float)(1.0 - pow(t->fp[1], (double)t->ip[0])), bc2 = (float)(1.0 - pow(t->fp[2], (double)t->ip[0]));
    for (int seg = 0; seg < 2; seg++) { /* the decayed elements [0, ip2), then the rest */
        float decay = seg ? 1.0f : (float)(1.0 - t->fp[0] * t->fp[4]);
        int64_t lo = seg ? (b > t->ip[2] ? b : t->ip[2]) : b, hi = seg ? e : (e < t->ip[2] ? e : t->ip[2]);
        for (int64_t i = lo; i < hi; i++) {
            float gi = g[i] * gs;
            float mi = b1 * m[i] + (1.0f - b1) * gi;
            float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            p[i] = p[i] * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
            if (cp && !seg && i >= c0) cp[i - c0] = keel_cvt_f32_to_bf16(p[i]); /* as CAST rounds the weight */
        }
    }
}

/* SUM_SQ's first level: block j's float64 sum of squares (four running sums, then their sum: a
 * fixed order for any thread count). */
static void sum_sq_task(void *arg, int64_t b, int64_t e, int th) {
    (void)th;
    node_ctx *c = arg;
    const float *x = c->t->src[0]->data;
    int64_t n = keel_nelements(c->t->src[0]);
    for (int64_t j = b; j < e; j++) {
        int64_t lo = j * KEEL_SUM_SQ_BLOCK, hi = lo + KEEL_SUM_SQ_BLOCK < n ? lo + KEEL_SUM_SQ_BLOCK : n, i = lo;
        double s[4] = {0, 0, 0, 0};
        for (; i + 4 <= hi; i += 4)
            for (int k = 0; k < 4; k++) s[k] += (double)x[i + k] * x[i + k];
        for (; i < hi; i++) s[0] += (double)x[i] * x[i];
        c->partial[j] = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

static int mul_mat_into(keel_backend *be, const keel_tensor *t, bool accumulate) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            keel_gemm_args g = {.M = t->ne[0],
                                .N = t->ne[1],
                                .K = a->ne[0],
                                .A = cpu_row(a, 0, i2 / r2, i3 / r3),
                                .a_m = a->nb[1],
                                .a_k = a->nb[0],
                                .B = cpu_row(b, 0, i2, i3),
                                .b_k = b->nb[0],
                                .b_n = b->nb[1],
                                .C = (float *)(void *)cpu_row(t, 0, i2, i3),
                                .c_m = t->nb[0],
                                .c_n = t->nb[1],
                                .accumulate = accumulate,
                                .a_bf16 = a->type == KEEL_BF16,
                                .b_bf16 = b->type == KEEL_BF16};
            if (keel_cpu_gemm(cpu_pool(be), &g)) return -1;
        }
    return 0;
}

static int mul_mat(keel_backend *be, const keel_tensor *t) { return mul_mat_into(be, t, false); }

/* MUL_MAT_ADD: the addend copied into the result, the product added to it */
static int mul_mat_add(keel_backend *be, const keel_tensor *t) {
    return cpu_copy(be, t, t->src[2], false) || mul_mat_into(be, t, true) ? -1 : 0;
}

/* OUT_PROD: r[i,j] = sum_k a[i,k] b[j,k], summed over the group of source matrices of each result
 * matrix in a fixed order (g3 outer, g2 inner). */
static int out_prod(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    int64_t r2 = a->ne[2] / t->ne[2], r3 = a->ne[3] / t->ne[3];
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            bool first = true;
            for (int64_t g3 = 0; g3 < r3; g3++)
                for (int64_t g2 = 0; g2 < r2; g2++) {
                    int64_t s2 = i2 * r2 + g2, s3 = i3 * r3 + g3;
                    keel_gemm_args g = {.M = t->ne[0],
                                        .N = t->ne[1],
                                        .K = a->ne[1],
                                        .A = cpu_row(a, 0, s2, s3),
                                        .a_m = a->nb[0],
                                        .a_k = a->nb[1],
                                        .B = cpu_row(b, 0, s2, s3),
                                        .b_k = b->nb[1],
                                        .b_n = b->nb[0],
                                        .C = (float *)(void *)cpu_row(t, 0, i2, i3),
                                        .c_m = t->nb[0],
                                        .c_n = t->nb[1],
                                        .accumulate = !first,
                                        .a_bf16 = a->type == KEEL_BF16,
                                        .b_bf16 = b->type == KEEL_BF16};
                    if (keel_cpu_gemm(cpu_pool(be), &g)) return -1;
                    first = false;
                }
        }
    return 0;
}

/* Products of bf16 operands, read as they are: by the bf16 kernel (the float32 kernel's bits but
 * for subnormals, gemm.h) or widened to float32 as they are packed. Float32 sums; a bf16 result is
 * rounded to nearest even once, by the copy path, from a float32 one. */
static int product_bf16(keel_backend *be, const keel_tensor *t, int (*product)(keel_backend *, const keel_tensor *)) {
    if (t->type != KEEL_BF16) return product(be, t);
    keel_tensor out = {0};
    if (cpu_f32_temp(be, t, &out, false)) return -1;
    int rc = product(be, &out) || cpu_copy(be, t, &out, false);
    free(out.data);
    return rc ? -1 : 0;
}

int cpu_node(keel_backend *be, const keel_tensor *t) {
    node_ctx c = {.be = be, .t = t};
    keel_pool *pool = cpu_pool(be);
    const keel_tensor *a = t->src[0], *b = t->src[1];
    switch (keel_op_get(t->op)->family) { /* families first */
    case FAM_UNARY:
        keel_pool_for(pool, keel_nrows(t), unary_task, &c);
        return 0;
    case FAM_BINARY:
        keel_pool_for(pool, keel_nrows(t), binary_task, &c);
        return 0;
    case FAM_COPY:
        return keel_backend_run_copy_family(be, t);
    default:
        break;
    }
    switch (t->op) {
    case KEEL_OP_GET_ROWS:
        if (keel_backend_read_ids(be, t, NULL)) return -1;
        keel_pool_for(pool, keel_nelements(b), get_rows_task, &c);
        return 0;
    case KEEL_OP_GET_ROWS_BACK:
    case KEEL_OP_GET_ROWS_BACK_ADD: {
        int32_t *idv;
        if (keel_backend_read_ids(be, t, &idv)) return -1;
        int64_t R = t->ne[1], N = keel_nelements(b);
        c.csr_start = malloc((size_t)(R + 1) * sizeof(int64_t));
        c.csr_items = malloc((size_t)(N ? N : 1) * sizeof(int64_t));
        int ok = c.csr_start && c.csr_items;
        if (ok) keel_rows_by_id(idv, N, R, c.csr_start, c.csr_items);
        if (ok) keel_pool_for(pool, R, get_rows_back_task, &c);
        free(idv), free(c.csr_start), free(c.csr_items);
        return ok ? 0 : keel_fail("cpu: out of memory in '%s'", t->name);
    }
    case KEEL_OP_FILL:
        keel_pool_for(pool, keel_nrows(t), fill_task, &c);
        return 0;
    case KEEL_OP_REPEAT:
    case KEEL_OP_REPEAT_BACK:
        if (t->op == KEEL_OP_REPEAT_BACK && a->ne[0] == t->ne[0]) /* without it, the slower path */
            c.acc = malloc((size_t)(keel_pool_size(pool) * t->ne[0]) * sizeof(double));
        keel_pool_for(pool, keel_nrows(t), repeat_task, &c);
        free(c.acc);
        return 0;
    case KEEL_OP_SUM:
    case KEEL_OP_CROSS_ENTROPY_LOSS: {
        if (t->op == KEEL_OP_CROSS_ENTROPY_LOSS && keel_backend_ce_divisor(be, t, &c.ce_div)) return -1;
        int64_t R = keel_nrows(a);
        c.partial = malloc((size_t)R * sizeof(double));
        if (!c.partial) return keel_fail("cpu: out of memory in '%s'", t->name);
        keel_pool_for(pool, R, row_task, &c);
        double s = 0;
        for (int64_t r = 0; r < R; r++) s += c.partial[r]; /* fixed order */
        free(c.partial);
        W(t->data) = (float)(t->op == KEEL_OP_SUM ? s : s / c.ce_div);
        return 0;
    }
    case KEEL_OP_CROSS_ENTROPY_LOSS_BACK:
        if (keel_backend_ce_divisor(be, t, &c.ce_div)) return -1;
        keel_pool_for(pool, keel_nrows(a), row_task, &c);
        return 0;
    case KEEL_OP_SUM_ROWS:
    case KEEL_OP_MEAN:
    case KEEL_OP_RMS_NORM:
    case KEEL_OP_L2_NORM:
    case KEEL_OP_RMS_NORM_BACK:
    case KEEL_OP_L2_NORM_BACK:
    case KEEL_OP_SOFT_MAX:
    case KEEL_OP_SOFT_MAX_CAUSAL:
    case KEEL_OP_SOFT_MAX_BACK:
    case KEEL_OP_SILU_BACK:
    case KEEL_OP_SIGMOID_BACK:
    case KEEL_OP_ROPE:
    case KEEL_OP_ROPE_BACK:
        keel_pool_for(pool, keel_nrows(a), row_task, &c);
        return 0;
    case KEEL_OP_GDN_GATE:
        keel_pool_for(pool, keel_nrows(a), gdn_gate_task, &c);
        return 0;
    case KEEL_OP_SIGMOID_MUL:
    case KEEL_OP_SIGMOID_MUL_BACK:
        keel_pool_for(pool, keel_nrows(a), sigmoid_mul_task, &c);
        return 0;
    case KEEL_OP_GDN_GATE_BACK:
        keel_pool_for(pool, a->ne[0], gdn_gate_task, &c);
        return 0;
    case KEEL_OP_SWIGLU:
    case KEEL_OP_SWIGLU_BACK:
        keel_pool_for(pool, keel_nrows(a), swiglu_task, &c);
        return 0;
    case KEEL_OP_DROPOUT:
        keel_pool_for(pool, keel_nrows(t), dropout_task, &c);
        return 0;
    case KEEL_OP_MUL_MAT:
        return a->type == KEEL_BF16 ? product_bf16(be, t, mul_mat) : mul_mat(be, t);
    case KEEL_OP_MUL_MAT_ADD: /* a float32 result (the shape rule) */
        return mul_mat_add(be, t);
    case KEEL_OP_OUT_PROD:
        return a->type == KEEL_BF16 ? product_bf16(be, t, out_prod) : out_prod(be, t);
    case KEEL_OP_CONV1D:
    case KEEL_OP_CONV1D_BACK_INPUT: {
        c.wt = conv_taps(b);
        if (t->type == KEEL_BF16) c.rows = malloc((size_t)(keel_pool_size(pool) * t->ne[0]) * sizeof(float));
        bool ok = c.wt && (t->type != KEEL_BF16 || c.rows);
        if (ok) keel_pool_for(pool, t->ne[1] * t->ne[2], conv_task, &c);
        free(c.wt), free(c.rows);
        return ok ? 0 : keel_fail("cpu: out of memory in '%s'", t->name);
    }
    case KEEL_OP_CONV1D_BACK_WEIGHT:
        keel_pool_for(pool, (t->ne[1] + CONV_CB - 1) / CONV_CB, conv_task, &c);
        return 0;
    case KEEL_OP_RMS_NORM_W:
    case KEEL_OP_GATED_RMS_NORM:
        keel_pool_for(pool, keel_nrows(a), norm_w_task, &c);
        return 0;
    case KEEL_OP_RMS_NORM_W_BACK:
    case KEEL_OP_RMS_NORM_W_BACK_ADD:
    case KEEL_OP_GATED_RMS_NORM_BACK:
    case KEEL_OP_QK_NORM_ROPE:
    case KEEL_OP_QK_NORM_ROPE_BACK: {
        bool rows = t->op == KEEL_OP_GATED_RMS_NORM_BACK || t->op == KEEL_OP_QK_NORM_ROPE ||
                    t->op == KEEL_OP_QK_NORM_ROPE_BACK,
             terms = t->op != KEEL_OP_QK_NORM_ROPE && t->op != KEEL_OP_QK_NORM_ROPE_BACK;
        /* a row a thread (QK_NORM_ROPE with a bf16 result: two, the row before and after its rotation) */
        int64_t per = t->op == KEEL_OP_QK_NORM_ROPE && t->type == KEEL_BF16 ? 2 : 1;
        c.rows = rows ? malloc((size_t)(keel_pool_size(pool) * per * a->ne[0]) * sizeof(float)) : NULL;
        c.terms = terms ? malloc((size_t)(keel_nelements(a) ? keel_nelements(a) : 1) * sizeof(float)) : NULL;
        bool ok = (!rows || c.rows) && (!terms || c.terms);
        if (ok) keel_pool_for(pool, keel_nrows(a), norm_w_task, &c);
        if (ok && terms) keel_pool_for(pool, a->ne[0], norm_w_dw_task, &c);
        free(c.rows), free(c.terms);
        return ok ? 0 : keel_fail("cpu: out of memory in '%s'", t->name);
    }
    case KEEL_OP_GDN_CONV:
    case KEEL_OP_GDN_CONV_BACK: {
        c.wt = conv_taps(b);
        c.rows = malloc((size_t)(keel_pool_size(pool) * 2 * a->ne[0]) * sizeof(float));
        if (c.wt && c.rows) keel_pool_for(pool, a->ne[1] * a->ne[2], gdn_conv_task, &c);
        bool ok = c.wt && c.rows;
        free(c.wt), free(c.rows);
        return ok ? 0 : keel_fail("cpu: out of memory in '%s'", t->name);
    }
    case KEEL_OP_GATED_DELTA_NET:
    case KEEL_OP_GATED_DELTA_NET_STATE:
        return cpu_gdn_forward(be, t);
    case KEEL_OP_GATED_DELTA_NET_BACK:
        return cpu_gdn_backward(be, t);
    case KEEL_OP_LINEAR_CROSS_ENTROPY:
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK:
        return cpu_linear_ce(be, t);
    case KEEL_OP_FLASH_ATTN:
    case KEEL_OP_FLASH_ATTN_BACK:
        return cpu_flash_attn(be, t);
    case KEEL_OP_SUM_SQ: {
        int64_t R = (keel_nelements(a) + KEEL_SUM_SQ_BLOCK - 1) / KEEL_SUM_SQ_BLOCK;
        c.partial = malloc((size_t)(R ? R : 1) * sizeof(double));
        if (!c.partial) return keel_fail("cpu: out of memory in '%s'", t->name);
        keel_pool_for(pool, R, sum_sq_task, &c);
        double s = 0;
        for (int64_t r = 0; r < R; r++) s += c.partial[r]; /* the second level: block order */
        free(c.partial);
        W(t->data) = (float)s;
        return 0;
    }
    case KEEL_OP_ADAMW:
    case KEEL_OP_ADAMW_SHADOW:
        if (keel_adamw_factor(F(t->src[4]->data), t->fp[5], t->ip[1], &c.adamw_f))
            keel_pool_for(pool, keel_nelements(t), adamw_task, &c);
        return 0;
    default:
        return keel_fail("cpu: no kernel for %s", keel_op_get(t->op)->name);
    }
}
