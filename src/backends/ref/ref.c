/* keel: the reference backend. Naive loops over any strides, every value through a float64
 * accumulator: the oracle the other backends are checked against. Slow on purpose, obviously
 * right; it never honours KEEL_FAULT. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host_memory.h"
#include "backends/kernel_common.h"
#include "ops/ops.h"
#include "ops/dropout_mask.h"
#include "tensor/convert.h"
#include "util/error.h"

static inline char *at(const keel_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (char *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static double get(const keel_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return keel_load_value(t->type, at(t, i0, i1, i2, i3));
}

static void put(const keel_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v) {
    keel_store_value(t->type, at(t, i0, i1, i2, i3), v);
}

/* Flat (contiguous-order) element access, for tensors of any strides. */
static void unflat(const keel_tensor *t, int64_t i, int64_t *c) {
    c[0] = i % t->ne[0];
    i /= t->ne[0];
    c[1] = i % t->ne[1];
    i /= t->ne[1];
    c[2] = i % t->ne[2];
    c[3] = i / t->ne[2];
}
static double getf(const keel_tensor *t, int64_t i) {
    int64_t c[4];
    unflat(t, i, c);
    return get(t, c[0], c[1], c[2], c[3]);
}
static void putf(const keel_tensor *t, int64_t i, double v) {
    int64_t c[4];
    unflat(t, i, c);
    put(t, c[0], c[1], c[2], c[3], v);
}

#define FOR4(t)                                                                                                        \
    for (int64_t i3 = 0; i3 < (t)->ne[3]; i3++)                                                                        \
        for (int64_t i2 = 0; i2 < (t)->ne[2]; i2++)                                                                    \
            for (int64_t i1 = 0; i1 < (t)->ne[1]; i1++)                                                                \
                for (int64_t i0 = 0; i0 < (t)->ne[0]; i0++)

/* THE copy routine of this backend. */
static int ref_copy(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate) {
    (void)be;
    if (!keel_same_shape(dst, src)) return keel_fail("ref copy: shapes differ ('%s' <- '%s')", dst->name, src->name);
    FOR4(dst) {
        double v = get(src, i0, i1, i2, i3);
        if (accumulate) v += get(dst, i0, i1, i2, i3);
        put(dst, i0, i1, i2, i3, v);
    }
    return 0;
}

/* The window of an ACC/SET result: src1's shape at the parameter strides and offset. */

/* d silu(x) = d s (1 + x (1 - s)), s = sigmoid(x): SILU_BACK and SWIGLU_BACK */
static double silu_back(double x, double d) {
    double s = 1.0 / (1.0 + exp(-x));
    return d * s * (1.0 + x * (1.0 - s));
}

static double unary(int op, double x, const double *fp) {
    switch (op) {
    case KEEL_OP_SCALE:
        return fp[0] * x + fp[1];
    case KEEL_OP_SQR:
        return x * x;
    case KEEL_OP_SQRT:
        return sqrt(x);
    case KEEL_OP_EXP:
        return exp(x);
    case KEEL_OP_LOG:
        return log(x);
    case KEEL_OP_NEG:
        return -x;
    case KEEL_OP_SILU:
        return x / (1.0 + exp(-x));
    case KEEL_OP_SIGMOID:
        return 1.0 / (1.0 + exp(-x));
    case KEEL_OP_SOFTPLUS:
        return x > 20.0 ? x : log1p(exp(x));
    default:
        return NAN;
    }
}

static double binary(int op, double a, double b) {
    switch (op) {
    case KEEL_OP_ADD:
        return a + b;
    case KEEL_OP_SUB:
        return a - b;
    case KEEL_OP_MUL:
        return a * b;
    case KEEL_OP_DIV:
        return a / b;
    default:
        return NAN;
    }
}

/* RMS_NORM_W and GATED_RMS_NORM and their backward over rows: a = x / sqrt(mean x^2 + eps), w' = w
 * or 1 + w, y = a w' (times silu(z)); the backward gives dx (RMS_NORM_BACK of dy silu(z) w'; plus g
 * for RMS_NORM_W_BACK_ADD), dz (silu' of dy a w') and dw, the sum over rows of (dy silu(z)) a. The
 * backward's bf16 part (ip1: dz, or a copy of dx) holds the float32 value rounded, as CAST of the
 * float32 part would round it. */
static void put_bf16_part(const keel_tensor *t, int64_t N, int64_t e, double v) {
    keel_store_value(KEEL_BF16, (char *)t->data + N * (int64_t)sizeof(float) + e * 2, (double)(float)v);
}
static int ref_norm_w(const keel_tensor *t) {
    bool gated = t->op == KEEL_OP_GATED_RMS_NORM || t->op == KEEL_OP_GATED_RMS_NORM_BACK;
    bool back = t->op == KEEL_OP_RMS_NORM_W_BACK || t->op == KEEL_OP_RMS_NORM_W_BACK_ADD ||
                t->op == KEEL_OP_GATED_RMS_NORM_BACK;
    const keel_tensor *x = t->src[0], *w = t->src[1], *z = gated ? t->src[2] : NULL;
    const keel_tensor *g = t->op == KEEL_OP_RMS_NORM_W_BACK_ADD ? t->src[3] : NULL;
    const keel_tensor *dy = back ? t->src[gated ? 3 : 2] : NULL;
    int64_t n = x->ne[0], N = keel_nelements(x);
    double *dw = dy ? calloc((size_t)(n ? n : 1), sizeof *dw) : NULL;
    if (dy && !dw) return keel_fail("ref: out of memory in '%s'", t->name);
    for (int64_t r = 0; r < N / n; r++) {
        int64_t i1 = r % x->ne[1], i2 = (r / x->ne[1]) % x->ne[2], i3 = r / (x->ne[1] * x->ne[2]);
        double ss = 0, sd = 0;
        for (int64_t i = 0; i < n; i++) {
            double xv = get(x, i, i1, i2, i3), zv = z ? get(z, i, i1, i2, i3) : 0.0;
            double sg = z ? zv / (1.0 + exp(-zv)) : 1.0, wv = get(w, i, 0, 0, 0) + (t->ip[0] ? 1.0 : 0.0);
            ss += xv * xv;
            if (dy) sd += xv * (get(dy, i, i1, i2, i3) * sg * wv);
        }
        double sc = 1.0 / sqrt(ss / (double)n + t->fp[0]);
        for (int64_t i = 0; i < n; i++) {
            double xv = get(x, i, i1, i2, i3), zv = z ? get(z, i, i1, i2, i3) : 0.0;
            double sg = z ? zv / (1.0 + exp(-zv)) : 1.0, wv = get(w, i, 0, 0, 0) + (t->ip[0] ? 1.0 : 0.0);
            double a = xv * sc;
            if (!dy) {
                put(t, i, i1, i2, i3, a * wv * sg);
                continue;
            }
            double d = get(dy, i, i1, i2, i3), db = d * sg;
            int64_t e = r * n + i;
            double dx = (g ? get(g, i, i1, i2, i3) : 0.0) + (sc * (db * wv) - sc * sc * sc * xv * sd / (double)n);
            putf(t, e, dx);
            if (z && t->ip[1])
                put_bf16_part(t, N, e, silu_back(zv, d * (a * wv)));
            else if (z)
                putf(t, N + e, silu_back(zv, d * (a * wv)));
            else if (t->ip[1])
                put_bf16_part(t, N, e, dx);
            dw[i] += db * a;
        }
    }
    for (int64_t i = 0; dw && i < n; i++) putf(t, keel_nelements(t) - n + i, dw[i]); /* the last n */
    free(dw);
    return 0;
}

/* QK_NORM_ROPE and its backward over rows, in float64: y = rms_norm(x) * (w or 1 + w), then ROPE's
 * rotation of the first n_rot elements (pairs f, f + n_rot/2, the angle pos * freq_f). The
 * backward rotates dy back (the angle negated) into g, then RMS_NORM_W_BACK's formula with g. */
static void ref_rotate(double *v, int64_t nr, double theta, double pos, double dir) {
    for (int64_t f = 0; f < nr / 2; f++) {
        double ang = pos * keel_rope_freq(theta, nr, f), c = cos(ang), s = dir * sin(ang);
        double x1 = v[f], x2 = v[f + nr / 2];
        v[f] = x1 * c - x2 * s, v[f + nr / 2] = x2 * c + x1 * s;
    }
}
static int ref_qk_norm_rope(const keel_tensor *t) {
    const keel_tensor *x = t->src[0], *w = t->src[1], *p = t->src[2];
    const keel_tensor *dy = t->op == KEEL_OP_QK_NORM_ROPE_BACK ? t->src[3] : NULL;
    int64_t n = x->ne[0], N = keel_nelements(x), nr = t->ip[1];
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) return keel_fail("ref: out of memory in '%s'", t->name);
    for (int64_t r = 0; r < N / n; r++) {
        int64_t i1 = r % x->ne[1], i2 = (r / x->ne[1]) % x->ne[2], i3 = r / (x->ne[1] * x->ne[2]);
        double pos = fmax(get(p, i2, p->ne[1] == 1 ? 0 : i3, 0, 0), 0.0), ss = 0, sd = 0;
        for (int64_t i = 0; i < n; i++) ss += get(x, i, i1, i2, i3) * get(x, i, i1, i2, i3);
        double sc = 1.0 / sqrt(ss / (double)n + t->fp[0]);
#define QW(i) (get(w, i, 0, 0, 0) + (t->ip[0] ? 1.0 : 0.0))
        if (!dy) {
            for (int64_t i = 0; i < n; i++) v[i] = get(x, i, i1, i2, i3) * sc * QW(i);
            ref_rotate(v, nr, t->fp[1], pos, 1.0);
            for (int64_t i = 0; i < n; i++) put(t, i, i1, i2, i3, v[i]);
            continue;
        }
        for (int64_t i = 0; i < n; i++) v[i] = get(dy, i, i1, i2, i3);
        ref_rotate(v, nr, t->fp[1], pos, -1.0); /* g */
        for (int64_t i = 0; i < n; i++) sd += get(x, i, i1, i2, i3) * v[i] * QW(i);
        for (int64_t i = 0; i < n; i++) {
            double xv = get(x, i, i1, i2, i3);
            putf(t, r * n + i, sc * (v[i] * QW(i)) - sc * sc * sc * xv * sd / (double)n);
            putf(t, N + r * n + i, v[i] * xv * sc);
        }
#undef QW
    }
    free(v);
    return 0;
}

/* FLASH_ATTN and its backward from the definitions, a query row at a time: s_j = scale q.k_j over
 * the row's keys lo..hi (SOFT_MAX_CAUSAL's), p = softmax(s), o = sum p_j v_j, lse = log sum e^s.
 * Backward, with (do, dlse) the packed gradient: dp_j = do.v_j, ds_j = p_j (dp_j - sum_i p_i dp_i
 * + dlse); dq = scale sum ds_j k_j, dk_j += scale ds_j q, dv_j += p_j do. The given [o | lse] is
 * not read: the oracle recomputes everything from q, k and v. */
static int ref_flash_attn(const keel_tensor *t) {
    const keel_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2], *pos = t->src[3];
    const keel_tensor *dy = t->op == KEEL_OP_FLASH_ATTN_BACK ? t->src[5] : NULL;
    int64_t D = q->ne[0], H = q->ne[1], Tq = q->ne[2], B = q->ne[3], KV = k->ne[1], Tk = k->ne[2], Dv = v->ne[0];
    int64_t nq = D * H * Tq * B, nk = D * KV * Tk * B, no = Dv * H * Tq * B;
    double sc = t->fp[0], *p = malloc((size_t)(2 * Tk) * sizeof(double)), *dp = p ? p + Tk : NULL;
    double *dkv = dy ? calloc((size_t)(nk + Dv * KV * Tk * B), sizeof(double)) : NULL;
    if (!p || (dy && !dkv)) {
        free(p), free(dkv);
        return keel_fail("ref: out of memory in '%s'", t->name);
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t tt = 0; tt < Tq; tt++)
            for (int64_t h = 0; h < H; h++) {
                int64_t kh = h / (H / KV), hi = tt + Tk - Tq, lo = hi - (int64_t)fmax(get(pos, tt, b, 0, 0), 0.0);
                if (lo < 0) lo = 0;
                double mx = -INFINITY, z = 0;
                for (int64_t j = lo; j <= hi; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += get(q, d, h, tt, b) * get(k, d, kh, j, b);
                    p[j] = sc * s;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = lo; j <= hi; j++) z += exp(p[j] - mx);
                for (int64_t j = lo; j <= hi; j++) p[j] = exp(p[j] - mx) / z;
                int64_t row = (b * Tq + tt) * H + h;
                if (!dy) {
                    for (int64_t e = 0; e < Dv; e++) {
                        double o = 0;
                        for (int64_t j = lo; j <= hi; j++) o += p[j] * get(v, e, kh, j, b);
                        putf(t, row * Dv + e, o);
                    }
                    putf(t, no + row, mx + log(z));
                    continue;
                }
                double delta = 0, dlse = keel_nelements(dy) > no ? getf(dy, no + row) : 0.0; /* [do] alone: dlse 0 */
                for (int64_t j = lo; j <= hi; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < Dv; e++) s += getf(dy, row * Dv + e) * get(v, e, kh, j, b);
                    dp[j] = s;
                    delta += p[j] * s;
                }
                for (int64_t d = 0; d < D; d++) {
                    double g = 0;
                    for (int64_t j = lo; j <= hi; j++) g += p[j] * (dp[j] - delta + dlse) * get(k, d, kh, j, b);
                    putf(t, row * D + d, sc * g);
                }
                for (int64_t j = lo; j <= hi; j++) {
                    double ds = p[j] * (dp[j] - delta + dlse);
                    int64_t kr = (b * Tk + j) * KV + kh;
                    for (int64_t d = 0; d < D; d++) dkv[kr * D + d] += sc * ds * get(q, d, h, tt, b);
                    for (int64_t e = 0; e < Dv; e++) dkv[nk + kr * Dv + e] += p[j] * getf(dy, row * Dv + e);
                }
            }
    if (dy)
        for (int64_t i = 0; i < nk + Dv * KV * Tk * B; i++) putf(t, nq + i, dkv[i]);
    free(p), free(dkv);
    return 0;
}

/* GDN_CONV and its backward, per (position, example): u = the conv output (CONV1D's taps), s =
 * silu(u); the first 2n channels, in heads of d, divided by r = sqrt(sum s^2 + eps) and the first
 * n times the scale a. The backward gives du = silu'(u) ds, ds = (a g - s (s . a g) / r^2) / r over
 * a head (dy's own for the others). */
static int ref_gdn_conv(const keel_tensor *t) {
    const keel_tensor *x = t->src[0], *w = t->src[1], *p = t->src[2];
    const keel_tensor *dy = t->op == KEEL_OP_GDN_CONV_BACK ? t->src[3] : NULL;
    int64_t C = x->ne[0], K = w->ne[0], n = t->ip[0], hd = t->ip[1];
    double *u = malloc((size_t)C * 2 * sizeof *u), *sv = u + C;
    if (!u) return keel_fail("ref: out of memory in '%s'", t->name);
    for (int64_t bb = 0; bb < x->ne[2]; bb++)
        for (int64_t tt = 0; tt < x->ne[1]; tt++) {
            for (int64_t ch = 0; ch < C; ch++) {
                double acc = 0;
                for (int64_t j = 0; j < K; j++) {
                    int64_t d = K - 1 - j, ts = tt - d;
                    if (ts >= 0 && (double)d <= get(p, tt, bb, 0, 0))
                        acc += get(w, j, ch, 0, 0) * get(x, ch, ts, bb, 0);
                }
                u[ch] = acc, sv[ch] = acc / (1.0 + exp(-acc));
            }
            for (int64_t ch = 2 * n; ch < C; ch++)
                put(t, ch, tt, bb, 0, dy ? silu_back(u[ch], get(dy, ch, tt, bb, 0)) : sv[ch]);
            for (int64_t h0 = 0; h0 < 2 * n; h0 += hd) {
                double a = h0 < n ? t->fp[1] : 1.0, ss = 0, sd = 0;
                for (int64_t ch = h0; ch < h0 + hd; ch++) {
                    ss += sv[ch] * sv[ch];
                    if (dy) sd += sv[ch] * (a * get(dy, ch, tt, bb, 0));
                }
                double r = 1.0 / sqrt(ss + t->fp[0]);
                for (int64_t ch = h0; ch < h0 + hd; ch++) {
                    if (!dy) {
                        put(t, ch, tt, bb, 0, a * (sv[ch] * r));
                        continue;
                    }
                    double g = a * get(dy, ch, tt, bb, 0);
                    put(t, ch, tt, bb, 0, silu_back(u[ch], r * g - r * r * r * sv[ch] * sd));
                }
            }
        }
    free(u);
    return 0;
}

/* The state's decay before step t: exp(g), or 0 where an example starts (position <= 0), which
 * resets the state: S = 0 S + k d^T, and the backward's dS flowing into the past is 0 too. */
static double gdn_decay(const keel_tensor *g, const keel_tensor *pos, int64_t hv, int64_t t, int64_t b) {
    return get(pos, t, b, 0, 0) <= 0 ? 0.0 : exp(get(g, hv, t, b, 0));
}

/* Gated delta rule, one (batch, value head) lane, forward: S (Dk x Dv) from s0 (or 0) to the final
 * state, o_out [T][Dv] the outputs; u a work row of Dv */
static void gdn_lane_forward(const keel_tensor *q, const keel_tensor *k, const keel_tensor *v, const keel_tensor *g,
                             const keel_tensor *beta, const keel_tensor *pos, const keel_tensor *s0, int64_t b,
                             int64_t hv, double *S, double *o_out, double *u) {
    int64_t Dk = q->ne[0], Hk = q->ne[1], T = q->ne[2], Dv = v->ne[0], Hv = v->ne[1];
    int64_t hk = hv / (Hv / Hk);
    for (int64_t i = 0; i < Dk; i++)
        for (int64_t j = 0; j < Dv; j++) S[i * Dv + j] = s0 ? get(s0, j, i, hv, b) : 0.0;
    for (int64_t t = 0; t < T; t++) {
        double eg = gdn_decay(g, pos, hv, t, b), bt = get(beta, hv, t, b, 0);
        for (int64_t i = 0; i < Dk * Dv; i++) S[i] *= eg;
        for (int64_t j = 0; j < Dv; j++) {
            double s = 0;
            for (int64_t i = 0; i < Dk; i++) s += S[i * Dv + j] * get(k, i, hk, t, b);
            u[j] = bt * (get(v, j, hv, t, b) - s);
        }
        for (int64_t i = 0; i < Dk; i++) {
            double ki = get(k, i, hk, t, b);
            for (int64_t j = 0; j < Dv; j++) S[i * Dv + j] += ki * u[j];
        }
        for (int64_t j = 0; j < Dv; j++) {
            double s = 0;
            for (int64_t i = 0; i < Dk; i++) s += S[i * Dv + j] * get(q, i, hk, t, b);
            o_out[t * Dv + j] = s;
        }
    }
}

static int ref_gdn(const keel_tensor *t) {
    const keel_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2], *g = t->src[3], *beta = t->src[4];
    int64_t Dk = q->ne[0], T = q->ne[2], B = q->ne[3], Dv = v->ne[0], Hv = v->ne[1];
    /* S, then u (a step's Dv update) */
    double *S = malloc((size_t)(Dk * Dv + Dv) * sizeof *S), *o = malloc((size_t)(T * Dv) * sizeof *o);
    if (!S || !o) {
        free(S);
        free(o);
        return keel_fail("ref: out of memory in '%s'", t->name);
    }
    double *u = S + Dk * Dv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t hv = 0; hv < Hv; hv++) {
            if (t->op == KEEL_OP_GATED_DELTA_NET_STATE) { /* packed: o, then the final state */
                gdn_lane_forward(q, k, v, g, beta, t->src[5], t->src[6], b, hv, S, o, u);
                for (int64_t tt = 0; tt < T; tt++)
                    for (int64_t j = 0; j < Dv; j++) putf(t, ((b * T + tt) * Hv + hv) * Dv + j, o[tt * Dv + j]);
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++)
                        putf(t, Dv * Hv * T * B + ((b * Hv + hv) * Dk + i) * Dv + j, S[i * Dv + j]);
                continue;
            }
            gdn_lane_forward(q, k, v, g, beta, t->src[5], NULL, b, hv, S, o, u);
            for (int64_t tt = 0; tt < T; tt++)
                for (int64_t j = 0; j < Dv; j++) put(t, j, hv, tt, b, o[tt * Dv + j]);
        }
    free(S);
    free(o);
    return 0;
}

/* Backpropagation through the recurrence, one lane at a time, straight from the definition:
 * keep every state (this is the oracle; memory is no concern at test sizes). */
static int ref_gdn_back(const keel_tensor *t) {
    const keel_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2], *g = t->src[3], *beta = t->src[4],
                      *pos = t->src[5], *dO = t->src[6];
    int64_t Dk = q->ne[0], Hk = q->ne[1], T = q->ne[2], B = q->ne[3], Dv = v->ne[0], Hv = v->ne[1];
    int64_t r = Hv / Hk, n = Dk * Dv;
    keel_gdn_back_layout P = keel_gdn_back_layout_of(Dk, Dv, Hv, T, B);
    double *Sall = malloc((size_t)((T + 1) * n) * sizeof(double));
    double *dS = malloc((size_t)n * sizeof(double)), *dd = malloc((size_t)Dv * sizeof(double)),
           *d = malloc((size_t)Dv * sizeof(double)), *du = malloc((size_t)Dv * sizeof(double));
    if (!Sall || !dS || !dd || !d || !du) {
        free(Sall), free(dS), free(dd), free(d), free(du);
        return keel_fail("ref: out of memory in '%s'", t->name);
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t hv = 0; hv < Hv; hv++) {
            int64_t hk = hv / r;
            /* forward, keeping S_t (after step t) in Sall[t+1] */
            memset(Sall, 0, (size_t)n * sizeof(double));
            for (int64_t tt = 0; tt < T; tt++) {
                double *S0 = Sall + tt * n, *S1 = Sall + (tt + 1) * n;
                double eg = gdn_decay(g, pos, hv, tt, b), bt = get(beta, hv, tt, b, 0);
                for (int64_t i = 0; i < n; i++) S1[i] = eg * S0[i];
                for (int64_t j = 0; j < Dv; j++) {
                    double s = 0;
                    for (int64_t i = 0; i < Dk; i++) s += S1[i * Dv + j] * get(k, i, hk, tt, b);
                    d[j] = bt * (get(v, j, hv, tt, b) - s);
                }
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++) S1[i * Dv + j] += get(k, i, hk, tt, b) * d[j];
            }
            memset(dS, 0, (size_t)n * sizeof(double));
            for (int64_t tt = T - 1; tt >= 0; tt--) {
                double *Sp = Sall + tt * n, *St = Sall + (tt + 1) * n;
                double eg = gdn_decay(g, pos, hv, tt, b), bt = get(beta, hv, tt, b, 0);
                /* recompute u = (eg Sp)^T k and d */
                for (int64_t j = 0; j < Dv; j++) {
                    double s = 0;
                    for (int64_t i = 0; i < Dk; i++) s += eg * Sp[i * Dv + j] * get(k, i, hk, tt, b);
                    du[j] = s; /* u */
                    d[j] = bt * (get(v, j, hv, tt, b) - s);
                }
                /* o = St^T q */
                for (int64_t i = 0; i < Dk; i++) {
                    double s = 0;
                    for (int64_t j = 0; j < Dv; j++) s += St[i * Dv + j] * get(dO, j, hv, tt, b);
                    putf(t, (b * T + tt) * P.row + hv * Dk + i, s); /* dq first in a token's row */
                }
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++) dS[i * Dv + j] += get(q, i, hk, tt, b) * get(dO, j, hv, tt, b);
                /* St = Sa + k d^T */
                double dbeta = 0;
                for (int64_t j = 0; j < Dv; j++) {
                    double s = 0;
                    for (int64_t i = 0; i < Dk; i++) s += dS[i * Dv + j] * get(k, i, hk, tt, b);
                    dd[j] = s;
                    dbeta += s * (get(v, j, hv, tt, b) - du[j]);
                    putf(t, (b * T + tt) * P.row + P.dv + hv * Dv + j, bt * s);
                }
                for (int64_t i = 0; i < Dk; i++) {
                    double s1 = 0, s2 = 0;
                    for (int64_t j = 0; j < Dv; j++) {
                        s1 += dS[i * Dv + j] * d[j];
                        s2 += eg * Sp[i * Dv + j] * (-bt * dd[j]);
                    }
                    putf(t, (b * T + tt) * P.row + P.dk + hv * Dk + i, s1 + s2);
                }
                /* u = Sa^T k: dSa += k du^T with du = -beta dd */
                for (int64_t i = 0; i < Dk; i++)
                    for (int64_t j = 0; j < Dv; j++) dS[i * Dv + j] += get(k, i, hk, tt, b) * (-bt * dd[j]);
                /* Sa = eg Sp */
                double dg = 0;
                for (int64_t i = 0; i < n; i++) dg += eg * Sp[i] * dS[i];
                for (int64_t i = 0; i < n; i++) dS[i] *= eg;
                putf(t, P.dg + (b * T + tt) * Hv + hv, dg);
                putf(t, P.db + (b * T + tt) * Hv + hv, dbeta);
            }
        }
    free(Sall), free(dS), free(dd), free(d), free(du);
    return 0;
}

/* LINEAR_CROSS_ENTROPY and its backward from the definition: every token's logits W^T x in
 * float64 (with bf16 x and W rounded to float32, then to bf16), the loss as CROSS_ENTROPY_LOSS's;
 * the backward's dx = W g and dW = sum over tokens of x g^T, with g = (softmax - onehot) dloss / D.
 * The packed result: dx in x's layout, then dW [D, V] (and with ip1, the forward's: those for
 * dloss 1, then the loss; ip2: zeros and the loss). */
static int ref_linear_ce(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *x = t->src[0], *w = t->src[1], *tg = t->src[2];
    int64_t D = x->ne[0], N1 = x->ne[1], N = x->ne[1] * x->ne[2], V = w->ne[1];
    bool fwd = t->op == KEEL_OP_LINEAR_CROSS_ENTROPY, back = !fwd || (t->ip[1] && !t->ip[2]);
    double div, total = 0;
    if (keel_backend_ce_divisor(be, t, &div)) return -1;
    double k = back ? (fwd ? 1.0 : getf(t->src[3], 0)) / div : 0.0;
    if (fwd && t->ip[1] && t->ip[2]) /* gradients skipped: zeros */
        for (int64_t i = 0; i < N * D + D * V; i++) putf(t, i, 0.0);
    double *z = malloc((size_t)V * sizeof *z), *dw = back ? calloc((size_t)(D * V), sizeof *dw) : NULL;
    if (!z || (back && !dw)) {
        free(z), free(dw);
        return keel_fail("ref: out of memory in '%s'", t->name);
    }
    for (int64_t n = 0; n < N; n++) {
        int64_t n1 = n % N1, n2 = n / N1, y = (int64_t)getf(tg, n);
        if (y < 0) { /* no loss here */
            for (int64_t d = 0; back && d < D; d++) putf(t, n * D + d, 0.0);
            continue;
        }
        double mx = -INFINITY, Z = 0;
        for (int64_t v = 0; v < V; v++) {
            double s = 0;
            for (int64_t d = 0; d < D; d++) s += get(w, d, v, 0, 0) * get(x, d, n1, n2, 0);
            if (x->type == KEEL_BF16) s = keel_cvt_f32_to_bf16_f32((float)s); /* logits in bf16, as every backend */
            z[v] = s, mx = fmax(mx, s);
        }
        for (int64_t v = 0; v < V; v++) Z += exp(z[v] - mx);
        if (fwd) total += log(Z) + mx - z[y];
        if (!back) continue;
        for (int64_t v = 0; v < V; v++) z[v] = (exp(z[v] - mx) / Z - (v == y ? 1.0 : 0.0)) * k;
        if (x->type == KEEL_BF16) /* g rounded to float32, then to bf16, as every backend */
            for (int64_t v = 0; v < V; v++) z[v] = keel_cvt_f32_to_bf16_f32((float)z[v]);
        for (int64_t d = 0; d < D; d++) {
            double s = 0, xd = get(x, d, n1, n2, 0);
            for (int64_t v = 0; v < V; v++) s += get(w, d, v, 0, 0) * z[v], dw[v * D + d] += xd * z[v];
            putf(t, n * D + d, s);
        }
    }
    if (fwd) putf(t, t->ip[1] ? N * D + D * V : 0, total / div);
    for (int64_t i = 0; back && i < D * V; i++) putf(t, N * D + i, dw[i]);
    free(z), free(dw);
    return 0;
}

static int ref_node(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    switch (keel_op_get(t->op)->family) { /* families first */
    case FAM_UNARY:
        FOR4(t) put(t, i0, i1, i2, i3, unary(t->op, get(a, i0, i1, i2, i3), t->fp));
        return 0;
    case FAM_BINARY:
        FOR4(t)
        put(t, i0, i1, i2, i3,
            binary(t->op, get(a, i0, i1, i2, i3), get(b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3])));
        return 0;
    default:
        break;
    }
    switch (t->op) {
    case KEEL_OP_CPY:
    case KEEL_OP_CONT:
    case KEEL_OP_DUP:
    case KEEL_OP_CAST:
        return ref_copy(be, t, a, false);
    case KEEL_OP_GET_ROWS: {
        for (int64_t n1 = 0; n1 < b->ne[1]; n1++)
            for (int64_t n0 = 0; n0 < b->ne[0]; n0++) {
                int64_t r = (int64_t)get(b, n0, n1, 0, 0);
                if (r < 0 || r >= a->ne[1])
                    return keel_fail("GET_ROWS '%s': id %lld at [%lld,%lld] outside [0,%lld)", t->name, (long long)r,
                                     (long long)n0, (long long)n1, (long long)a->ne[1]);
                keel_tensor d = *t, s = *a;
                d.ne[1] = d.ne[2] = d.ne[3] = s.ne[1] = s.ne[2] = s.ne[3] = 1;
                d.data = at(t, 0, n0, n1, 0);
                s.data = at(a, 0, r, 0, 0);
                int rc = ref_copy(be, &d, &s, false);
                if (rc) return rc;
            }
        return 0;
    }
    case KEEL_OP_GET_ROWS_BACK:
    case KEEL_OP_GET_ROWS_BACK_ADD: /* the rows' sums, then (ADD) c plus them */
        FOR4(t) put(t, i0, i1, i2, i3, 0.0);
        for (int64_t n1 = 0; n1 < b->ne[1]; n1++)
            for (int64_t n0 = 0; n0 < b->ne[0]; n0++) {
                int64_t r = (int64_t)get(b, n0, n1, 0, 0);
                if (r < 0 || r >= t->ne[1])
                    return keel_fail("%s '%s': id %lld outside [0,%lld)", keel_op_get(t->op)->name, t->name,
                                     (long long)r, (long long)t->ne[1]);
                for (int64_t i = 0; i < t->ne[0]; i++) put(t, i, r, 0, 0, get(t, i, r, 0, 0) + get(a, i, n0, n1, 0));
            }
        if (t->op == KEEL_OP_GET_ROWS_BACK_ADD)
            FOR4(t) put(t, i0, i1, i2, i3, get(t->src[2], i0, i1, i2, i3) + get(t, i0, i1, i2, i3));
        return 0;
    case KEEL_OP_ACC:
    case KEEL_OP_SET: {
        if (!t->ip[4]) {
            int rc = ref_copy(be, t, a, false);
            if (rc) return rc;
        }
        keel_tensor w = keel_acc_window(t);
        return ref_copy(be, &w, b, t->op == KEEL_OP_ACC);
    }
    case KEEL_OP_FILL:
        FOR4(t) put(t, i0, i1, i2, i3, t->fp[0]);
        return 0;
    case KEEL_OP_REPEAT:
        FOR4(t) put(t, i0, i1, i2, i3, get(a, i0 % a->ne[0], i1 % a->ne[1], i2 % a->ne[2], i3 % a->ne[3]));
        return 0;
    case KEEL_OP_REPEAT_BACK:
        FOR4(t) put(t, i0, i1, i2, i3, 0.0);
        FOR4(a) {
            int64_t j0 = i0 % t->ne[0], j1 = i1 % t->ne[1], j2 = i2 % t->ne[2], j3 = i3 % t->ne[3];
            put(t, j0, j1, j2, j3, get(t, j0, j1, j2, j3) + get(a, i0, i1, i2, i3));
        }
        return 0;
    case KEEL_OP_CONCAT: {
        int d = (int)t->ip[0];
        keel_tensor w = *t;
        memcpy(w.ne, a->ne, sizeof w.ne);
        int rc = ref_copy(be, &w, a, false);
        if (rc) return rc;
        memcpy(w.ne, b->ne, sizeof w.ne);
        w.data = (char *)t->data + a->ne[d] * t->nb[d];
        return ref_copy(be, &w, b, false);
    }
    case KEEL_OP_DROPOUT: {
        uint64_t key = keel_dropout_key((uint64_t)t->ip[0], (uint64_t)t->ip[1], (uint64_t)t->ip[2]);
        double inv = 1.0 / (1.0 - t->fp[0]);
        FOR4(t) {
            uint64_t e = (uint64_t)(i0 + t->ne[0] * (i1 + t->ne[1] * (i2 + t->ne[2] * i3)));
            put(t, i0, i1, i2, i3, keel_dropout_keep(key, e, (uint64_t)t->ip[3]) ? get(a, i0, i1, i2, i3) * inv : 0.0);
        }
        return 0;
    }
    case KEEL_OP_SWIGLU:
        FOR4(t) put(t, i0, i1, i2, i3, unary(KEEL_OP_SILU, get(a, i0, i1, i2, i3), t->fp) * get(b, i0, i1, i2, i3));
        return 0;
    case KEEL_OP_SWIGLU_BACK: {
        const keel_tensor *dy = t->src[2];
        int64_t n = keel_nelements(a);
        for (int64_t e = 0; e < n; e++) {
            double g = getf(a, e), d = getf(dy, e);
            putf(t, e, silu_back(g, d * getf(b, e)));
            putf(t, n + e, d * unary(KEEL_OP_SILU, g, t->fp));
        }
        return 0;
    }
    case KEEL_OP_SILU_BACK:
        FOR4(t) put(t, i0, i1, i2, i3, silu_back(get(a, i0, i1, i2, i3), get(b, i0, i1, i2, i3)));
        return 0;
    case KEEL_OP_SIGMOID_MUL:
        FOR4(t) put(t, i0, i1, i2, i3, get(a, i0, i1, i2, i3) * unary(KEEL_OP_SIGMOID, get(b, i0, i1, i2, i3), t->fp));
        return 0;
    case KEEL_OP_SIGMOID_MUL_BACK: { /* [dx | dgate]: d sigmoid(g) = s (1 - s) */
        const keel_tensor *dy = t->src[2];
        int64_t n = keel_nelements(a);
        for (int64_t e = 0; e < n; e++) {
            double s = unary(KEEL_OP_SIGMOID, getf(b, e), t->fp), d = getf(dy, e);
            putf(t, e, d * s);
            putf(t, n + e, d * getf(a, e) * (s * (1.0 - s)));
        }
        return 0;
    }
    case KEEL_OP_SIGMOID_BACK:
        FOR4(t) {
            double y = get(a, i0, i1, i2, i3);
            put(t, i0, i1, i2, i3, get(b, i0, i1, i2, i3) * (y * (1.0 - y)));
        }
        return 0;
    case KEEL_OP_GDN_GATE: /* softplus(a + dt_bias) * -exp(A_log) */
        FOR4(t) {
            double x = get(a, i0, i1, i2, i3) + getf(t->src[2], i0);
            put(t, i0, i1, i2, i3, unary(KEEL_OP_SOFTPLUS, x, t->fp) * -exp(getf(b, i0)));
        }
        return 0;
    case KEEL_OP_GDN_GATE_BACK: { /* [da | dA_log | ddt_bias]: d softplus(x) = sigmoid(x) */
        const keel_tensor *dt = t->src[2], *dy = t->src[3];
        int64_t H = a->ne[0], n = keel_nelements(a);
        double *sum = calloc((size_t)(2 * H), sizeof(double)); /* float64 sums, whatever t's type */
        if (!sum) return keel_fail("ref: out of memory in '%s'", t->name);
        FOR4(a) {
            double x = get(a, i0, i1, i2, i3) + getf(dt, i0), e = exp(getf(b, i0)), d = get(dy, i0, i1, i2, i3);
            double dx = d * -e * unary(KEEL_OP_SIGMOID, x, t->fp);
            putf(t, i0 + H * (i1 + a->ne[1] * (i2 + a->ne[2] * i3)), dx);
            sum[i0] -= d * unary(KEEL_OP_SOFTPLUS, x, t->fp) * e;
            sum[H + i0] += dx;
        }
        for (int64_t i = 0; i < 2 * H; i++) putf(t, n + i, sum[i]);
        free(sum);
        return 0;
    }
    case KEEL_OP_SUM: {
        double s = 0;
        FOR4(a) s += get(a, i0, i1, i2, i3);
        put(t, 0, 0, 0, 0, s);
        return 0;
    }
    case KEEL_OP_SUM_ROWS:
    case KEEL_OP_MEAN:
    case KEEL_OP_RMS_NORM:
    case KEEL_OP_L2_NORM:
    case KEEL_OP_RMS_NORM_BACK:
    case KEEL_OP_L2_NORM_BACK:
    case KEEL_OP_SOFT_MAX:
    case KEEL_OP_SOFT_MAX_CAUSAL:
    case KEEL_OP_SOFT_MAX_BACK:
        for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                    int64_t n = a->ne[0];
                    double s = 0, sd = 0;
                    for (int64_t i = 0; i < n; i++) {
                        double x = get(a, i, i1, i2, i3);
                        if (t->op == KEEL_OP_SUM_ROWS || t->op == KEEL_OP_MEAN)
                            s += x;
                        else
                            s += x * x;
                        if (t->op == KEEL_OP_RMS_NORM_BACK || t->op == KEEL_OP_L2_NORM_BACK ||
                            t->op == KEEL_OP_SOFT_MAX_BACK)
                            sd += x * get(b, i, i1, i2, i3);
                    }
                    switch (t->op) {
                    case KEEL_OP_SUM_ROWS:
                        put(t, 0, i1, i2, i3, s);
                        break;
                    case KEEL_OP_MEAN:
                        put(t, 0, i1, i2, i3, s / (double)n);
                        break;
                    case KEEL_OP_RMS_NORM:
                    case KEEL_OP_L2_NORM: {
                        double m = t->op == KEEL_OP_RMS_NORM ? s / (double)n : s, sc = 1.0 / sqrt(m + t->fp[0]);
                        for (int64_t i = 0; i < n; i++) put(t, i, i1, i2, i3, get(a, i, i1, i2, i3) * sc);
                        break;
                    }
                    case KEEL_OP_RMS_NORM_BACK:
                    case KEEL_OP_L2_NORM_BACK: {
                        double dn = t->op == KEEL_OP_RMS_NORM_BACK ? (double)n : 1.0;
                        double sc = 1.0 / sqrt(s / dn + t->fp[0]);
                        for (int64_t i = 0; i < n; i++)
                            put(t, i, i1, i2, i3,
                                sc * get(b, i, i1, i2, i3) - sc * sc * sc * get(a, i, i1, i2, i3) * sd / dn);
                        break;
                    }
                    case KEEL_OP_SOFT_MAX:
                    case KEEL_OP_SOFT_MAX_CAUSAL: { /* over keys lo .. hi; the others 0 */
                        int64_t lo = 0, hi = n - 1;
                        if (t->op == KEEL_OP_SOFT_MAX_CAUSAL) {
                            hi = i1 + (n - a->ne[1]);
                            lo = hi - (int64_t)fmax(get(b, i1, i3, 0, 0), 0.0);
                            if (lo < 0) lo = 0;
                        }
                        double mx = -INFINITY, z = 0;
                        for (int64_t i = lo; i <= hi; i++) mx = fmax(mx, t->fp[0] * get(a, i, i1, i2, i3));
                        for (int64_t i = lo; i <= hi; i++) z += exp(t->fp[0] * get(a, i, i1, i2, i3) - mx);
                        for (int64_t i = 0; i < n; i++)
                            put(t, i, i1, i2, i3,
                                i >= lo && i <= hi ? exp(t->fp[0] * get(a, i, i1, i2, i3) - mx) / z : 0.0);
                        break;
                    }
                    case KEEL_OP_SOFT_MAX_BACK:
                        for (int64_t i = 0; i < n; i++)
                            put(t, i, i1, i2, i3, t->fp[0] * get(a, i, i1, i2, i3) * (get(b, i, i1, i2, i3) - sd));
                        break;
                    }
                }
        return 0;
    case KEEL_OP_MUL_MAT:
    case KEEL_OP_MUL_MAT_ADD: {
        int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
        FOR4(t) {
            double s = 0;
            for (int64_t k = 0; k < a->ne[0]; k++) s += get(a, k, i0, i2 / r2, i3 / r3) * get(b, k, i1, i2, i3);
            if (t->op == KEEL_OP_MUL_MAT_ADD) s += get(t->src[2], i0, i1, i2, i3);
            put(t, i0, i1, i2, i3, s);
        }
        return 0;
    }
    case KEEL_OP_OUT_PROD: {
        int64_t r2 = a->ne[2] / t->ne[2], r3 = a->ne[3] / t->ne[3];
        FOR4(t) {
            double s = 0;
            for (int64_t g3 = 0; g3 < r3; g3++)
                for (int64_t g2 = 0; g2 < r2; g2++)
                    for (int64_t k = 0; k < a->ne[1]; k++)
                        s += get(a, i0, k, i2 * r2 + g2, i3 * r3 + g3) * get(b, i1, k, i2 * r2 + g2, i3 * r3 + g3);
            put(t, i0, i1, i2, i3, s);
        }
        return 0;
    }
    case KEEL_OP_ROPE:
    case KEEL_OP_ROPE_BACK: {
        int64_t nr = t->ip[0], h = nr / 2;
        double dir = t->op == KEEL_OP_ROPE ? 1.0 : -1.0;
        FOR4(t) {
            double x = get(a, i0, i1, i2, i3);
            if (i0 >= nr) {
                put(t, i0, i1, i2, i3, x);
                continue;
            }
            int64_t f = i0 % h;
            /* positions below 0 count as 0, as in every op that reads them (ops/ops.h) */
            double ang = fmax(get(b, i2, b->ne[1] == 1 ? 0 : i3, 0, 0), 0.0) * keel_rope_freq(t->fp[0], nr, f);
            double c = cos(ang), s = dir * sin(ang);
            double y = i0 < h ? x * c - get(a, i0 + h, i1, i2, i3) * s : x * c + get(a, i0 - h, i1, i2, i3) * s;
            put(t, i0, i1, i2, i3, y);
        }
        return 0;
    }
    case KEEL_OP_CONV1D:
    case KEEL_OP_CONV1D_BACK_INPUT: {
        /* tap j reads d = K-1-j steps back from output position to, when d <= pos[to] */
        const keel_tensor *p = t->src[2];
        int64_t K = b->ne[0], T = a->ne[1];
        FOR4(t) {
            double s = 0;
            for (int64_t j = 0; j < K; j++) {
                int64_t d = K - 1 - j, tt = t->op == KEEL_OP_CONV1D ? i1 - d : i1 + d,
                        to = t->op == KEEL_OP_CONV1D ? i1 : tt;
                if (tt >= 0 && tt < T && (double)d <= get(p, to, i2, 0, 0))
                    s += get(b, j, i0, 0, 0) * get(a, i0, tt, i2, 0);
            }
            put(t, i0, i1, i2, i3, s);
        }
        return 0;
    }
    case KEEL_OP_CONV1D_BACK_WEIGHT: {
        const keel_tensor *p = t->src[2];
        int64_t K = t->ne[0];
        FOR4(t) {
            double s = 0;
            for (int64_t bb = 0; bb < a->ne[2]; bb++)
                for (int64_t tt = 0; tt < a->ne[1]; tt++) {
                    int64_t d = K - 1 - i0, ts = tt - d;
                    if (ts >= 0 && (double)d <= get(p, tt, bb, 0, 0))
                        s += get(b, i1, tt, bb, 0) * get(a, i1, ts, bb, 0);
                }
            put(t, i0, i1, i2, i3, s);
        }
        return 0;
    }
    case KEEL_OP_GDN_CONV:
    case KEEL_OP_GDN_CONV_BACK:
        return ref_gdn_conv(t);
    case KEEL_OP_RMS_NORM_W:
    case KEEL_OP_RMS_NORM_W_BACK:
    case KEEL_OP_RMS_NORM_W_BACK_ADD:
    case KEEL_OP_GATED_RMS_NORM:
    case KEEL_OP_GATED_RMS_NORM_BACK:
        return ref_norm_w(t);
    case KEEL_OP_QK_NORM_ROPE:
    case KEEL_OP_QK_NORM_ROPE_BACK:
        return ref_qk_norm_rope(t);
    case KEEL_OP_FLASH_ATTN:
    case KEEL_OP_FLASH_ATTN_BACK:
        return ref_flash_attn(t);
    case KEEL_OP_GATED_DELTA_NET:
    case KEEL_OP_GATED_DELTA_NET_STATE:
        return ref_gdn(t);
    case KEEL_OP_GATED_DELTA_NET_BACK:
        return ref_gdn_back(t);
    case KEEL_OP_LINEAR_CROSS_ENTROPY:
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK:
        return ref_linear_ce(be, t);
    case KEEL_OP_CROSS_ENTROPY_LOSS:
    case KEEL_OP_CROSS_ENTROPY_LOSS_BACK: {
        int64_t V = a->ne[0], N = keel_nrows(a);
        double total = 0, dl = t->op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK ? getf(t->src[2], 0) : 0, D;
        if (keel_backend_ce_divisor(be, t, &D)) return -1;
        for (int64_t r = 0; r < N; r++) {
            int64_t c[4];
            c[0] = 0, c[1] = r % a->ne[1], c[2] = (r / a->ne[1]) % a->ne[2], c[3] = r / (a->ne[1] * a->ne[2]);
            int64_t y = (int64_t)getf(b, r);
            if (y < 0) { /* no loss here */
                if (t->op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK)
                    for (int64_t i = 0; i < V; i++) put(t, i, c[1], c[2], c[3], 0.0);
                continue;
            }
            double mx = -INFINITY, z = 0;
            for (int64_t i = 0; i < V; i++) mx = fmax(mx, get(a, i, c[1], c[2], c[3]));
            for (int64_t i = 0; i < V; i++) z += exp(get(a, i, c[1], c[2], c[3]) - mx);
            if (t->op == KEEL_OP_CROSS_ENTROPY_LOSS) {
                total += log(z) + mx - get(a, y, c[1], c[2], c[3]);
            } else {
                for (int64_t i = 0; i < V; i++)
                    put(t, i, c[1], c[2], c[3],
                        (exp(get(a, i, c[1], c[2], c[3]) - mx) / z - (i == y ? 1.0 : 0.0)) * dl / D);
            }
        }
        if (t->op == KEEL_OP_CROSS_ENTROPY_LOSS) put(t, 0, 0, 0, 0, total / D);
        return 0;
    }
    case KEEL_OP_SUM_SQ: { /* float64 throughout: any order is the oracle's */
        double s = 0;
        FOR4(a) s += get(a, i0, i1, i2, i3) * get(a, i0, i1, i2, i3);
        put(t, 0, 0, 0, 0, s);
        return 0;
    }
    case KEEL_OP_ADAMW:
    case KEEL_OP_ADAMW_SHADOW: {
        const keel_tensor *gr = t->src[1], *m = t->src[2], *v = t->src[3];
        double lr = t->fp[0], b1 = t->fp[1], b2 = t->fp[2], eps = t->fp[3], f;
        double bc1 = 1.0 - pow(b1, (double)t->ip[0]), bc2 = 1.0 - pow(b2, (double)t->ip[0]);
        /* the op table's definition, stated again here (not optimizer_step.h's helper): the oracle */
        double norm = sqrt(get(t->src[4], 0, 0, 0, 0)) / (double)t->ip[1], clip = t->fp[5];
        if (isnan(norm) || isinf(norm)) return 0; /* nothing changes */
        f = (clip > 0 && norm > clip ? clip / norm : 1.0) / (double)t->ip[1];
        FOR4(t) {
            int64_t e = i0 + t->ne[0] * (i1 + t->ne[1] * (i2 + t->ne[2] * i3));
            double gg = get(gr, i0, i1, i2, i3) * f, wd = e < t->ip[2] ? t->fp[4] : 0.0;
            double mm = b1 * get(m, i0, i1, i2, i3) + (1 - b1) * gg;
            double vv = b2 * get(v, i0, i1, i2, i3) + (1 - b2) * gg * gg;
            double p = get(a, i0, i1, i2, i3);
            p = p * (1 - lr * wd) - lr * (mm / bc1) / (sqrt(vv / bc2) + eps);
            put(m, i0, i1, i2, i3, mm);
            put(v, i0, i1, i2, i3, vv);
            put(t, i0, i1, i2, i3, p);
            /* the bf16 copy of the stored value, as CAST makes it from the weight */
            if (t->op == KEEL_OP_ADAMW_SHADOW && e >= t->ip[3] && e < t->ip[2])
                putf(t->src[5], e - t->ip[3], get(t, i0, i1, i2, i3));
        }
        return 0;
    }
    default:
        return keel_fail("ref: no kernel for %s", keel_op_get(t->op)->name);
    }
}

static bool ref_supports(keel_backend *be, const keel_tensor *t) {
    (void)be;
    (void)t;
    return true; /* every op, every type */
}

static int ref_compute(keel_backend *be, const keel_graph *g, int64_t from, int64_t to, keel_node_cb cb, void *ud) {
    for (int64_t i = from; i < to; i++) {
        const keel_tensor *t = g->nodes[i];
        if (!(keel_op_get(t->op)->flags & OPF_VIEW)) {
            int rc = ref_node(be, t);
            if (rc) return rc;
        }
        if (cb && cb(be, t, i, ud)) return keel_backend_callback_failed(t);
    }
    return 0;
}

static int ref_set_threads(keel_backend *be, int n) {
    (void)be;
    (void)n;
    return 0;
}

static void ref_destroy(keel_backend *be) { free(be); }

keel_backend *keel_backend_ref_new(void) {
    keel_backend *be = calloc(1, sizeof *be);
    if (!be) return NULL;
    be->name = "ref";
    be->native_type = KEEL_F64, be->oracle = true;
    be->n_threads = 1;
    be->supports = ref_supports;
    be->alloc = keel_host_alloc;
    be->free = keel_host_free;
    be->write = keel_host_write;
    be->read = keel_host_read;
    be->fill_bytes = keel_host_fill_bytes;
    be->copy = ref_copy;
    be->compute = ref_compute;
    be->set_threads = ref_set_threads;
    be->destroy = ref_destroy;
    return be;
}
