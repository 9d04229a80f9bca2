/* keel: the op test runner (see testops.h). The harness reads and writes tensor bytes itself
 * (raw transfers plus a host-side strided gather, keel_tensor_read_raw_flat) so that the code under test, the copy
 * path included, is never trusted to report on itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>

#include "autodiff/autodiff.h"
#include "backend/backend.h"
#include "ops/ops.h"
#include "tensor/convert.h"
#include "testops/testops.h"
#include "util/error.h"
#include "util/rng.h"

#define GUARD_BYTES 256
#define GUARD_BYTE  0xA5
#define POISON_BYTE 0xFF /* NaN in every real type */
#define DEFAULT_TOL 1e-7
#define FD_REL_TOL  1e-6
#define FD_FLOOR    1e-3 /* relative-error denominator floor, as a fraction of the tensor's largest |gradient| */
#define FD_SAMPLES  64

/* ---- values ---- */

static double normal(uint64_t *s) {
    double u = keel_uniform01(s), v = keel_uniform01(s);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* The value as stored in `type` (what both the oracle and the backend under test receive). */
static double round_to(keel_type type, double v) {
    switch (type) {
    case KEEL_F32:
        return (float)v;
    case KEEL_F16:
        return keel_f16_to_f32(keel_f32_to_f16((float)v));
    case KEEL_BF16:
        return keel_bf16_to_f32(keel_f32_to_bf16((float)v));
    case KEEL_I32:
        return (double)(int32_t)v;
    default:
        return v;
    }
}

static void leaf_shape(const case_input *in, int64_t ne[4]) {
    memcpy(ne, in->ne, 4 * sizeof(int64_t));
    switch (in->view) {
    case VIEW_TRANSPOSED:
        ne[0] = in->ne[1], ne[1] = in->ne[0];
        break;
    case VIEW_PERMUTED:
        ne[0] = in->ne[1], ne[1] = in->ne[2], ne[2] = in->ne[0];
        break;
    case VIEW_STRIDED:
        ne[0] = in->ne[0] + 3, ne[1] = in->ne[1] + 1;
        break;
    case VIEW_ROWS_SWAPPED:
        ne[1] = in->ne[2], ne[2] = in->ne[1];
        break;
    case VIEW_HALF_ROWS:
        ne[0] = 2 * in->ne[0];
        break;
    default:
        break;
    }
}

static double *gen_values(const case_input *in, uint64_t seed, int64_t n) {
    double *v = malloc((size_t)n * sizeof *v);
    uint64_t s = seed;
    double sc = in->scale ? in->scale : 1.0;
    int64_t pos = 0; /* DOM_SEGMENTS */
    for (int64_t i = 0; i < n; i++) {
        double x;
        switch (in->dom) {
        case DOM_POSITIVE:
            x = 0.5 + 1.5 * keel_uniform01(&s);
            break;
        case DOM_INDEX:
            x = (double)(keel_splitmix64(&s) % (uint64_t)in->index_max);
            break;
        case DOM_INDEX_OR_IGNORED: {
            uint64_t u = keel_splitmix64(&s);
            x = u % 3 == 0 ? -100.0 : (double)((u / 3) % (uint64_t)in->index_max);
            break;
        }
        case DOM_GATE:
            x = -0.01 - 1.5 * keel_uniform01(&s);
            break;
        case DOM_UNIT:
            x = 0.05 + 0.9 * keel_uniform01(&s);
            break;
        case DOM_UNIT_EDGES: {
            uint64_t u = keel_splitmix64(&s);
            x = u % 3 == 0 ? 0.0 : u % 3 == 1 ? 1.0 : 0.05 + 0.9 * keel_uniform01(&s);
            break;
        }
        case DOM_SMALL:
            x = 1e-4 * keel_uniform01(&s);
            break;
        case DOM_SEGMENTS: {
            uint64_t u = keel_splitmix64(&s), L = (uint64_t)in->index_max;
            pos = i % in->ne[0] == 0 ? (int64_t)(u % L) : (u % L == 0 || (uint64_t)pos + 1 >= L) ? 0 : pos + 1;
            x = (double)pos;
            break;
        }
        default:
            x = normal(&s);
            break;
        }
        v[i] = round_to(in->type, in->type == KEEL_I32 ? x : x * sc);
    }
    return v;
}

/* ---- host-side tensor access ---- */

/* Whole tensor in flat order as f64: a raw transfer gathered on the host (never the copy path). */
static double *host_read(keel_backend *be, const keel_tensor *t) {
    size_t nb;
    unsigned char *flat = keel_tensor_read_raw_flat(be, t, &nb);
    int64_t n = keel_nelements(t);
    size_t es = keel_type_size(t->type);
    double *out = flat ? malloc((size_t)n * sizeof *out + 1) : NULL;
    for (int64_t i = 0; out && i < n; i++) out[i] = keel_load_value(t->type, flat + (size_t)i * es);
    free(flat);
    return out;
}

static int host_write_leaf(keel_backend *be, keel_tensor *leaf, const double *v) {
    int64_t n = keel_nelements(leaf);
    size_t es = keel_type_size(leaf->type);
    unsigned char *raw = malloc((size_t)n * es);
    if (!raw) return keel_fail("out of memory");
    for (int64_t i = 0; i < n; i++) keel_store_value(leaf->type, raw + i * es, v[i]);
    int rc = be->write(be, leaf->data, raw, (size_t)n * es);
    free(raw);
    return rc;
}

/* ---- one instance of a case on one backend ---- */

typedef struct {
    keel_ctx *ctx;
    keel_graph *g;
    keel_session *s;
    keel_tensor *out, *loss, *weights;
    keel_tensor *leaf[CASE_MAX_IN];
    double *val[CASE_MAX_IN], *wval;
    int n_leaf;
    int64_t width; /* widest row of any tensor of the forward graph */
} inst;

static void inst_free(inst *x) {
    keel_session_free(x->s);
    keel_graph_free(x->g);
    keel_ctx_free(x->ctx);
    for (int i = 0; i < CASE_MAX_IN; i++) free(x->val[i]);
    free(x->wval);
    memset(x, 0, sizeof *x);
}

static bool case_has_grad(const op_case *c) {
    if (c->keep_types || c->op == KEEL_OP_FILL) return false;
    if (keel_op_get(c->op)->flags & OPF_BACKWARD) return false; /* its gradient: a second derivative */
    if (!keel_op_get(c->op)->grad_srcs && keel_op_get(c->op)->nograd) return false; /* none by design (ADAMW) */
    if (c->build) return true;
    /* the packed head's result holds gradients, which have none: its build cases differentiate its loss */
    if (c->op == KEEL_OP_LINEAR_CROSS_ENTROPY && c->ip[1]) return false;
    return keel_op_get(c->op)->grad_srcs != 0;
}

static bool input_is_param(const op_case *c, int i) {
    if (c->in[i].type == KEEL_I32 || (c->no_grad_mask >> i & 1)) return false;
    return c->build || (keel_op_get(c->op)->grad_srcs >> i & 1);
}

static int inst_build(inst *x, keel_backend *be, const op_case *c, uint64_t seed, bool oracle, bool grad) {
    memset(x, 0, sizeof *x);
    x->ctx = keel_ctx_new();
    keel_ctx *ctx = x->ctx;
    keel_tensor *ins[CASE_MAX_IN];
    for (int i = 0; i < c->n_in; i++) {
        const case_input *in = &c->in[i];
        keel_type ty = oracle && !c->keep_types && in->type != KEEL_I32 ? KEEL_F64 : in->type;
        int64_t ne[4];
        leaf_shape(in, ne);
        keel_tensor *lf = keel_new(ctx, ty, 4, ne);
        if (!lf) return -1;
        keel_set_name(lf, "in%d", i);
        lf->flags |= KEEL_FLAG_INPUT;
        if (grad && input_is_param(c, i)) lf->flags |= KEEL_FLAG_PARAM;
        x->leaf[i] = lf;
        x->val[i] = gen_values(in, seed * 131 + (uint64_t)i, keel_nelements(lf));
        switch (in->view) {
        case VIEW_TRANSPOSED:
            ins[i] = keel_transpose(ctx, lf);
            break;
        case VIEW_PERMUTED:
            ins[i] = keel_permute(ctx, lf, 1, 2, 0, 3);
            break;
        case VIEW_ROWS_SWAPPED:
            ins[i] = keel_permute(ctx, lf, 0, 2, 1, 3);
            break;
        case VIEW_STRIDED:
            ins[i] = keel_view_4d(ctx, lf, in->ne[0], in->ne[1], in->ne[2], in->ne[3], lf->nb[1], lf->nb[2], lf->nb[3],
                                  lf->nb[1] + 2 * lf->nb[0]);
            break;
        case VIEW_HALF_ROWS:
            ins[i] = keel_view_4d(ctx, lf, in->ne[0], in->ne[1], in->ne[2], in->ne[3], lf->nb[1], lf->nb[2], lf->nb[3],
                                  in->ne[0] * lf->nb[0]);
            break;
        default:
            ins[i] = lf;
            break;
        }
        if (!ins[i]) return -1;
    }
    x->n_leaf = c->n_in;
    if (c->build) {
        x->out = c->build(ctx, c, ins);
    } else if (c->op == KEEL_OP_FILL) {
        x->out = keel_fill(ctx, oracle ? KEEL_F64 : KEEL_F32, c->ip, c->fp[0]);
    } else {
        int64_t ip[KEEL_MAX_IP];
        int64_t es = c->n_in ? (int64_t)keel_type_size(ins[0]->type) : 4;
        for (int i = 0; i < c->n_ip; i++) ip[i] = (c->ip_elems >> i & 1) ? c->ip[i] * es : c->ip[i];
        x->out = keel_op_new(ctx, c->op, ins, c->n_in, ip, c->n_ip, c->fp, c->n_fp);
    }
    if (!x->out) return -1;
    keel_tensor *outs[3] = {x->out, NULL, NULL};
    int n_out = 1;
    if (keel_op_get(c->op)->flags & OPF_SIDE_EFFECT) outs[n_out++] = ins[2], outs[n_out++] = ins[3];
    if (grad && c->loss_out) {
        x->loss = x->out;
        outs[0] = x->loss;
    } else if (grad) {
        keel_type ty = x->out->type;
        x->weights = keel_set_flags(keel_new(ctx, ty, 4, x->out->ne), KEEL_FLAG_INPUT);
        case_input w = {.type = ty};
        x->wval = gen_values(&w, seed * 131 + 99, keel_nelements(x->weights));
        x->loss = keel_sum(ctx, keel_mul(ctx, x->out, x->weights));
        if (!x->loss) return -1;
        outs[0] = x->loss;
        x->out->flags |= KEEL_FLAG_OUTPUT;
    }
    x->g = keel_graph_build(ctx, outs, n_out);
    if (!x->g) return -1;
    for (int64_t i = 0; i < x->g->n_nodes; i++)
        if (x->g->nodes[i]->ne[0] > x->width) x->width = x->g->nodes[i]->ne[0];
    for (int64_t i = 0; i < x->g->n_leafs; i++)
        if (x->g->leafs[i]->ne[0] > x->width) x->width = x->g->leafs[i]->ne[0];
    if (c->width) x->width = c->width;
    if (grad && keel_build_backward(x->g, x->loss)) return -1;
    keel_plan_opts po = {.guard_bytes = GUARD_BYTES, .no_reuse = 1};
    x->s = keel_session_new(be, x->g, &po);
    return x->s ? 0 : -1;
}

/* Poison everything, lay guard bytes around every placed tensor, write the inputs. */
static int inst_prepare(inst *x, keel_backend *be) {
    keel_plan *p = x->s->plan;
    if (be->fill_bytes(be, x->s->arena, POISON_BYTE, p->total_bytes)) return -1;
    unsigned char guard[GUARD_BYTES];
    memset(guard, GUARD_BYTE, sizeof guard);
    for (int64_t id = 0; id < p->n_offset; id++) {
        if (p->offset[id] == SIZE_MAX) continue;
        keel_tensor *t = keel_ctx_tensor(x->ctx, id);
        size_t sz = (keel_nbytes(t) + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN;
        char *base = (char *)x->s->arena + p->offset[id];
        if (be->write(be, base - GUARD_BYTES, guard, GUARD_BYTES)) return -1;
        if (be->write(be, base + sz, guard, GUARD_BYTES)) return -1;
    }
    for (int i = 0; i < x->n_leaf; i++)
        if (host_write_leaf(be, x->leaf[i], x->val[i])) return -1;
    if (x->weights && host_write_leaf(be, x->weights, x->wval)) return -1;
    return 0;
}

/* The name of the first tensor whose guard bytes were overwritten, or NULL. */
static const char *inst_guards_broken(inst *x, keel_backend *be) {
    keel_plan *p = x->s->plan;
    unsigned char buf[GUARD_BYTES];
    for (int64_t id = 0; id < p->n_offset; id++) {
        if (p->offset[id] == SIZE_MAX) continue;
        keel_tensor *t = keel_ctx_tensor(x->ctx, id);
        size_t sz = (keel_nbytes(t) + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN;
        char *base = (char *)x->s->arena + p->offset[id];
        for (int side = 0; side < 2; side++) {
            if (be->read(be, buf, side ? base + sz : base - GUARD_BYTES, GUARD_BYTES)) return "(read failed)";
            for (int k = 0; k < GUARD_BYTES; k++)
                if (buf[k] != GUARD_BYTE) return t->name;
        }
    }
    return NULL;
}

/* ---- comparisons ---- */

/* A part of a result laid out in rows (the delta rule's dq, dk, dv share each token's row):
 * `rows` runs of `width` elements from `at`, `stride` apart */
typedef struct {
    int64_t at, width, stride, rows;
} strided_part;

static double nmse_strided(const double *x, const double *ref, strided_part p) {
    double num = 0, den = 0;
    for (int64_t r = 0; r < p.rows; r++)
        for (int64_t e = p.at + r * p.stride, i = 0; i < p.width; i++, e++) {
            if (!isfinite(x[e]) && isfinite(ref[e])) return INFINITY;
            double d = x[e] - ref[e];
            num += d * d;
            den += ref[e] * ref[e];
        }
    return den > 0 ? num / den : num;
}
/* --bits: XXH64 (the tracer's hash) of n doubles, seeded with the hash of the parts before them */
static uint64_t bits_hash(const double *x, int64_t n, uint64_t h) {
    return x ? XXH64(x, (size_t)n * sizeof(double), h) : h;
}
#define BITS_SEED 0

static double nmse(const double *x, const double *ref, int64_t n) {
    return nmse_strided(x, ref, (strided_part){0, n, n, 1});
}

/* The parts of a packed result (several tensors end to end), each compared on its own: one NMSE
 * over the whole would let a small part (the delta rule's dg, dbeta beside dq, dk, dv) be wrong
 * unseen. Returns the count (1: not packed) and their sizes, or 0 with the parts in `sp` for a
 * result whose parts are interleaved. */
static int packed_parts(const keel_tensor *t, int64_t *size, strided_part *sp, int *n_sp) {
    const keel_tensor *q = t->src[0], *v = t->src[2];
    switch (t->op) {
    case KEEL_OP_GATED_DELTA_NET_BACK: {
        int64_t Dk = q->ne[0], Dv = v->ne[0], Hv = v->ne[1], T = q->ne[2], B = q->ne[3];
        keel_gdn_back_layout L = keel_gdn_back_layout_of(Dk, Dv, Hv, T, B);
        sp[0] = (strided_part){0, Dk * Hv, L.row, T * B}, sp[1] = (strided_part){L.dk, Dk * Hv, L.row, T * B};
        sp[2] = (strided_part){L.dv, Dv * Hv, L.row, T * B};
        sp[3] = (strided_part){L.dg, Hv * T * B, Hv * T * B, 1},
        sp[4] = (strided_part){L.db, Hv * T * B, Hv * T * B, 1};
        *n_sp = 5;
        return 0;
    }
    case KEEL_OP_GATED_DELTA_NET_STATE:
        size[0] = keel_nelements(v), size[1] = v->ne[0] * q->ne[0] * v->ne[1] * v->ne[3];
        return 2;
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK:
        size[0] = keel_nelements(q), size[1] = keel_nelements(t->src[1]);
        return 2;
    case KEEL_OP_LINEAR_CROSS_ENTROPY: /* packed (ip1): [dx | dW | loss] */
        if (!t->ip[1]) {
            size[0] = 1;
            return 1;
        }
        size[0] = keel_nelements(q), size[1] = keel_nelements(t->src[1]), size[2] = 1;
        return 3;
    case KEEL_OP_SWIGLU_BACK:
    case KEEL_OP_SIGMOID_MUL_BACK:
        size[0] = size[1] = keel_nelements(q);
        return 2;
    case KEEL_OP_GDN_GATE_BACK: /* [da | dA_log | ddt_bias] */
        size[0] = keel_nelements(q), size[1] = size[2] = q->ne[0];
        return 3;
    case KEEL_OP_GATED_RMS_NORM_BACK: /* [dx | dz | dw] */
        size[0] = size[1] = keel_nelements(q), size[2] = q->ne[0];
        return 3;
    case KEEL_OP_FLASH_ATTN:
        size[0] = keel_nelements(v) / v->ne[1] / v->ne[2] * q->ne[1] * q->ne[2], size[1] = size[0] / v->ne[0];
        return 2;
    case KEEL_OP_FLASH_ATTN_BACK:
        size[0] = keel_nelements(q), size[1] = keel_nelements(t->src[1]), size[2] = keel_nelements(v);
        return 3;
    case KEEL_OP_QK_NORM_ROPE_BACK: /* [dx | the terms of dw] */
        size[0] = size[1] = keel_nelements(q);
        return 2;
    case KEEL_OP_RMS_NORM_W_BACK: /* [dx | dw] */
    case KEEL_OP_RMS_NORM_W_BACK_ADD:
        size[0] = keel_nelements(q), size[1] = q->ne[0];
        return 2;
    default:
        size[0] = keel_nelements(t);
        return 1;
    }
}

/* The largest NMSE over the parts of a packed result (the whole, when not packed). */
static double nmse_parts(const keel_tensor *t, const double *x, const double *ref) {
    int64_t size[5], at = 0;
    strided_part sp[5];
    int n_sp = 0, n = packed_parts(t, size, sp, &n_sp);
    double e = 0;
    for (int i = 0; i < n; i++) e = fmax(e, nmse(x + at, ref + at, size[i])), at += size[i];
    for (int i = 0; i < n_sp; i++) e = fmax(e, nmse_strided(x, ref, sp[i])), at += sp[i].width * sp[i].rows;
    return at == keel_nelements(t) ? e : INFINITY; /* parts that do not add up: the harness is wrong, fail */
}

static int64_t first_diff(const double *x, const double *ref, int64_t n, double rel) {
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(x[i] - ref[i]);
        if (!(d <= rel * fmax(1.0, fabs(ref[i])))) return i;
    }
    return -1;
}

/* ---- label ---- */

static const char *view_name(case_view v) {
    switch (v) {
    case VIEW_TRANSPOSED:
        return "transposed";
    case VIEW_PERMUTED:
        return "permuted";
    case VIEW_STRIDED:
        return "strided";
    case VIEW_ROWS_SWAPPED:
        return "rows swapped";
    case VIEW_HALF_ROWS:
        return "half rows";
    default:
        return "";
    }
}

static void make_label(op_case *c) {
    if (c->name) {
        snprintf(c->label, sizeof c->label, "%s", c->name);
        return;
    }
    char *p = c->label;
    size_t left = sizeof c->label;
    int k = snprintf(p, left, "%s(type=", keel_op_get(c->op)->name);
    p += k, left -= (size_t)k;
    keel_type ty = c->n_in ? c->in[0].type : KEEL_F32;
    if (c->op == KEEL_OP_CPY)
        k = snprintf(p, left, "%s->%s", keel_type_name(c->in[0].type), keel_type_name(c->in[1].type));
    else
        k = snprintf(p, left, "%s", keel_type_name(ty));
    p += k, left -= (size_t)k;
    for (int i = 0; i < c->n_in; i++) {
        char buf[64];
        k = snprintf(p, left, ",ne_%c=%s", 'a' + i, keel_shape_str(c->in[i].ne, buf, sizeof buf));
        p += k, left -= (size_t)k;
        if (c->in[i].view) {
            k = snprintf(p, left, ",%c=%s", 'a' + i, view_name(c->in[i].view));
            p += k, left -= (size_t)k;
        }
    }
    if (c->op == KEEL_OP_FILL) {
        char buf[64];
        k = snprintf(p, left, ",ne=%s", keel_shape_str(c->ip, buf, sizeof buf));
        p += k, left -= (size_t)k;
    }
    if ((c->op == KEEL_OP_ACC || c->op == KEEL_OP_SET) && c->ip[4])
        k = snprintf(p, left, ",inplace"), p += k, left -= (size_t)k;
    if (c->op == KEEL_OP_LINEAR_CROSS_ENTROPY && c->ip[1])
        k = snprintf(p, left, c->ip[2] ? ",packed,gradients skipped" : ",packed"), p += k, left -= (size_t)k;
    if (c->op == KEEL_OP_CONCAT) k = snprintf(p, left, ",dim=%lld", (long long)c->ip[0]), p += k, left -= (size_t)k;
    if ((c->op == KEEL_OP_RMS_NORM_W || c->op == KEEL_OP_GATED_RMS_NORM || c->op == KEEL_OP_CONCAT) && c->ip[1])
        k = snprintf(p, left, "->%s", keel_type_name((keel_type)c->ip[1])), p += k, left -= (size_t)k;
    if (c->op == KEEL_OP_QK_NORM_ROPE && c->ip[2])
        k = snprintf(p, left, "->%s", keel_type_name((keel_type)c->ip[2])), p += k, left -= (size_t)k;
    if ((c->op == KEEL_OP_RMS_NORM_W || c->op == KEEL_OP_RMS_NORM_W_BACK || c->op == KEEL_OP_RMS_NORM_W_BACK_ADD) &&
        c->ip[0])
        k = snprintf(p, left, ",1+w"), p += k, left -= (size_t)k;
    if ((c->op == KEEL_OP_GATED_DELTA_NET || c->op == KEEL_OP_GATED_DELTA_NET_BACK) && c->ip[0])
        k = snprintf(p, left,
                     c->ip[0] == KEEL_GDN_BF16_GRAD    ? ",tensor cores split bf16, backward one bf16 part"
                     : c->ip[0] == KEEL_GDN_SPLIT_BF16 ? ",tensor cores split bf16"
                                                       : ",tensor cores split tf32"),
        p += k, left -= (size_t)k;
    if ((c->op == KEEL_OP_SWIGLU || c->op == KEEL_OP_SWIGLU_BACK || c->op == KEEL_OP_CONV1D_BACK_INPUT ||
         c->op == KEEL_OP_SIGMOID_MUL) &&
        c->ip[0])
        k = snprintf(p, left, "->%s", keel_type_name((keel_type)c->ip[0])), p += k, left -= (size_t)k;
    snprintf(p, left, ")");
}

/* ---- the suite ---- */

typedef struct {
    int run, pass, fail, missing;
} counts;

typedef struct {
    const keel_testops_opts *o;
    keel_backend *ref;
    keel_backend *be[4];
    int n_be;
    counts per_be[4];
    counts per_op[KEEL_OP_COUNT][4];
    bool present[KEEL_OP_COUNT][4];
    int failures;
    double worst_fd, worst_nmse[4];
} suite;

bool keel_testops_listed(const char *list, const char *name) {
    if (!list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncasecmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* Records an outcome; under an expected fault, a wide case must fail and a narrow one pass. */
static void outcome(suite *S, int bi, int op, const char *label, int64_t width, bool ok, const char *detail) {
    const keel_testops_opts *o = S->o;
    bool faulted = o->expect_fault > 0 && !S->be[bi]->oracle;
    bool expect_fail = faulted && width > o->expect_fault;
    bool good = ok != expect_fail;
    counts *pb = &S->per_be[bi], *po = &S->per_op[op][bi];
    pb->run++, po->run++;
    if (good)
        pb->pass++, po->pass++;
    else
        pb->fail++, po->fail++, S->failures++;
    const char *verdict = ok ? "OK" : "FAIL";
    if (faulted)
        printf("%s %s: %s (%s; row %lld %s fault limit %lld: %s)\n", label, S->be[bi]->name, verdict, detail,
               (long long)width, width > o->expect_fault ? ">" : "<=", (long long)o->expect_fault,
               good ? "as expected" : "UNEXPECTED");
    else
        printf("%s %s: %s (%s)\n", label, S->be[bi]->name, verdict, detail);
}

static int run_and_read(inst *x, keel_backend *be, double **out, double **side, char *err, size_t errn) {
    if (inst_prepare(x, be) || keel_session_run(x->s, NULL, NULL)) {
        snprintf(err, errn, "run failed: %s", keel_last_error());
        return -1;
    }
    const char *broken = inst_guards_broken(x, be);
    if (broken) {
        snprintf(err, errn, "guard bytes around '%s' overwritten", broken);
        return -1;
    }
    *out = host_read(be, x->out);
    if (side) {
        side[0] = side[1] = side[2] = NULL;
        if (keel_op_get(x->out->op)->flags & OPF_SIDE_EFFECT) {
            side[0] = host_read(be, x->out->src[2]);
            side[1] = host_read(be, x->out->src[3]);
        }
        if (x->out->op == KEEL_OP_ADAMW_SHADOW) side[2] = host_read(be, x->out->src[5]);
    }
    return *out ? 0 : -1;
}

/* ADAMW_SHADOW's bf16 copies c (t's src5) after a run whose updated weights are p: each the backend's
 * own p[ip3 + i] rounded as CAST rounds it, bit for bit (c->copies_exact), or else (a skipped update) the
 * oracle's, which left them as they were. NULL when right, else what is wrong. */
static const char *copies_wrong(const op_case *c, const keel_tensor *t, const double *p, const double *got,
                                const double *oracle) {
    static char why[160];
    int64_t n = keel_nelements(t->src[5]), c0 = t->ip[3]; /* c[i] is p[c0 + i]'s */
    for (int64_t i = 0; i < n; i++) {
        double want =
            c->copies_exact ? (double)keel_cvt_bf16_to_f32(keel_cvt_f32_to_bf16((float)p[c0 + i])) : oracle[i];
        if (!(got[i] == want || (isnan(got[i]) && isnan(want)))) {
            snprintf(why, sizeof why, "bf16 copy %lld is %.9g, %s %.9g", (long long)i, got[i],
                     c->copies_exact ? "the updated weight rounded is" : "unchanged it is", want);
            return why;
        }
    }
    /* and against the oracle's copies (the reference backend's own update, rounded): one bf16 rounding
     * of values about 1e-7 apart, the plan's 2e-5 */
    double e = nmse(got, oracle, n);
    if (c->copies_exact && !(e <= 2e-5)) {
        snprintf(why, sizeof why, "bf16 copies nmse=%.3g against the oracle's > 2e-5", e);
        return why;
    }
    return NULL;
}

static void forward_case(suite *S, op_case *c, uint64_t seed) {
    inst orc;
    if (inst_build(&orc, S->ref, c, seed, true, false)) {
        printf("%s ref(f64): HARNESS ERROR (%s)\n", c->label, keel_last_error());
        S->failures++;
        inst_free(&orc);
        return;
    }
    double *ref_out = NULL, *ref_side[3] = {0};
    char err[512];
    if (run_and_read(&orc, S->ref, &ref_out, ref_side, err, sizeof err)) {
        printf("%s ref(f64): ORACLE FAILED (%s)\n", c->label, err);
        S->failures++;
        inst_free(&orc);
        return;
    }
    int64_t n = keel_nelements(orc.out);
    for (int bi = 0; bi < S->n_be; bi++) {
        keel_backend *be = S->be[bi];
        inst x;
        if (inst_build(&x, be, c, seed, false, false)) {
            bool missing = strstr(keel_last_error(), "no kernel") != NULL;
            if (missing) S->per_be[bi].missing++;
            outcome(S, bi, c->op, c->label, orc.width, false, keel_last_error());
            inst_free(&x);
            continue;
        }
        S->present[c->op][bi] = true;
        double *out = NULL, *side[3] = {0};
        bool ok = run_and_read(&x, be, &out, side, err, sizeof err) == 0;
        if (ok) {
            double e = nmse_parts(orc.out, out, ref_out);
            for (int k = 0; k < 2 && side[0]; k++) e = fmax(e, nmse(side[k], ref_side[k], keel_nelements(x.out)));
            double tol = c->tol > 0 ? c->tol : DEFAULT_TOL;
            ok = e <= tol;
            const char *bad_copies = side[2] ? copies_wrong(c, x.out, out, side[2], ref_side[2]) : NULL;
            if (bad_copies) ok = false;
            if (ok && e > S->worst_nmse[bi]) S->worst_nmse[bi] = e;
            if (ok)
                snprintf(err, sizeof err, "nmse=%.1e", e);
            else if (bad_copies)
                snprintf(err, sizeof err, "%s", bad_copies);
            else
                snprintf(err, sizeof err, "nmse=%.3g > %.0e, first difference at flat index %lld", e, tol,
                         (long long)first_diff(out, ref_out, n, 1e-3));
            /* a thread knob (cpu): 1 and 2 threads give the same bits; otherwise (cuda) a second run does */
            if (ok && S->o->check_threads && !be->oracle) {
                double *out2 = NULL;
                int saved = be->n_threads;
                be->set_threads(be, saved == 1 ? 2 : 1);
                char err2[512];
                bool ok2 = run_and_read(&x, be, &out2, NULL, err2, sizeof err2) == 0;
                be->set_threads(be, saved);
                bool cpu = be->thread_knob;
                if (!ok2 || memcmp(out, out2, (size_t)n * sizeof(double)) != 0) {
                    ok = false;
                    snprintf(err, sizeof err, "%s",
                             cpu ? "1 and 2 threads give different bits" : "two runs give different bits");
                } else {
                    size_t len = strlen(err);
                    snprintf(err + len, sizeof err - len, "%s", cpu ? ", 1t==2t bitwise" : ", 2 runs bitwise");
                }
                free(out2);
            }
            if (ok && S->o->bits && !be->oracle) {
                uint64_t h = bits_hash(out, n, BITS_SEED);
                for (int k = 0; k < 2 && side[0]; k++) h = bits_hash(side[k], keel_nelements(x.out), h);
                size_t len = strlen(err);
                snprintf(err + len, sizeof err - len, ", bits %016llx", (unsigned long long)h);
            }
        }
        outcome(S, bi, c->op, c->label, orc.width, ok, err);
        free(out), free(side[0]), free(side[1]), free(side[2]);
        inst_free(&x);
    }
    free(ref_out), free(ref_side[0]), free(ref_side[1]), free(ref_side[2]);
    inst_free(&orc);
}

/* Reads the gradient of every parameter leaf. */
static int read_grads(inst *x, keel_backend *be, double **g) {
    for (int i = 0; i < x->n_leaf; i++) {
        g[i] = NULL;
        if (!(x->leaf[i]->flags & KEEL_FLAG_PARAM)) continue;
        keel_tensor *gt = keel_graph_grad(x->g, x->leaf[i]);
        if (!gt) return keel_fail("no gradient reached input %d", i);
        g[i] = host_read(be, gt);
        if (!g[i]) return -1;
    }
    return 0;
}

static void grad_case(suite *S, op_case *c, uint64_t seed) {
    inst orc;
    char err[512];
    double *ga[CASE_MAX_IN] = {0};
    /* Tier 1: analytic (ref, f64) against central differences (ref, f64). */
    bool ok1 = inst_build(&orc, S->ref, c, seed, true, true) == 0;
    if (!ok1) snprintf(err, sizeof err, "build: %s", keel_last_error());
    if (ok1 && (inst_prepare(&orc, S->ref) || keel_session_run(orc.s, NULL, NULL) || read_grads(&orc, S->ref, ga))) {
        ok1 = false;
        snprintf(err, sizeof err, "run: %s", keel_last_error());
    }
    double worst = 0;
    int64_t worst_at = -1;
    int worst_in = -1;
    for (int i = 0; i < c->n_in && ok1 && !c->no_fd; i++) {
        if (!ga[i]) continue;
        keel_tensor *lf = orc.leaf[i];
        int64_t n = keel_nelements(lf);
        int64_t idx[FD_SAMPLES + 3];
        int m = 0;
        if (n <= FD_SAMPLES) {
            for (int64_t j = 0; j < n; j++) idx[m++] = j;
        } else { /* first and last element of the widest (first) row, the last element, random others */
            idx[m++] = 0, idx[m++] = lf->ne[0] - 1, idx[m++] = n - 1;
            uint64_t s = seed ^ 0x5eedull;
            while (m < FD_SAMPLES) idx[m++] = (int64_t)(keel_splitmix64(&s) % (uint64_t)n);
        }
        /* Five-point central differences, h = 1e-3 max(1,|x|): truncation O(h^4), roundoff about
         * 1e-16 |L| / h. Relative error per element, with the denominator floored at FD_FLOOR of the
         * tensor's largest analytic |gradient| and at the differences' resolution 1e-6 max(1,|L|). */
        double num[FD_SAMPLES + 3], gmax = 0, lmax = 1;
        for (int64_t j = 0; j < n; j++) gmax = fmax(gmax, fabs(ga[i][j]));
        static const double off[4] = {-2, -1, 1, 2}, wt[4] = {1, -8, 8, -1};
        for (int j = 0; j < m && ok1; j++) {
            double x0 = orc.val[i][idx[j]], h = 1e-3 * fmax(1.0, fabs(x0)), acc = 0;
            for (int side = 0; side < 4 && ok1; side++) {
                orc.val[i][idx[j]] = x0 + off[side] * h;
                if (inst_prepare(&orc, S->ref) || S->ref->compute(S->ref, orc.g, 0, orc.g->n_forward, NULL, NULL)) {
                    ok1 = false;
                    snprintf(err, sizeof err, "fd run: %s", keel_last_error());
                }
                double *l = host_read(S->ref, orc.loss);
                if (l) acc += wt[side] * l[0], lmax = fmax(lmax, fabs(l[0]));
                free(l);
            }
            orc.val[i][idx[j]] = x0;
            num[j] = acc / (12 * h);
        }
        for (int j = 0; j < m && ok1; j++) {
            double a = ga[i][idx[j]], floor = fmax(FD_FLOOR * gmax, 1e-6 * lmax);
            double e = fabs(a - num[j]) / fmax(fmax(fabs(a), fabs(num[j])), floor);
            if (e > worst) worst = e, worst_at = idx[j], worst_in = i;
        }
    }
    if (ok1 && c->no_fd) {
        snprintf(err, sizeof err, "finite differences skipped: %s", c->no_fd);
    } else if (ok1) {
        ok1 = worst <= FD_REL_TOL;
        if (worst > S->worst_fd && ok1) S->worst_fd = worst;
        if (ok1)
            snprintf(err, sizeof err, "analytic vs central differences: worst rel err %.1e", worst);
        else
            snprintf(err, sizeof err, "analytic vs central differences: rel err %.3g at input %c flat index %lld",
                     worst, 'a' + worst_in, (long long)worst_at);
    }
    printf("%s grad ref(f64 vs finite differences): %s (%s)\n", c->label, ok1 ? "OK" : "FAIL", err);
    if (!ok1) S->failures++;
    /* Tier 2: each backend's backward graph against the ref backend's f64 one. */
    for (int bi = 0; bi < S->n_be && ok1; bi++) {
        keel_backend *be = S->be[bi];
        inst x;
        double *gb[CASE_MAX_IN] = {0};
        bool ok = inst_build(&x, be, c, seed, false, true) == 0;
        if (!ok)
            snprintf(err, sizeof err, "build: %s", keel_last_error());
        else
            S->present[c->op][bi] = true;
        if (ok) {
            char e2[512];
            double *dummy = NULL;
            ok = run_and_read(&x, be, &dummy, NULL, e2, sizeof e2) == 0 && read_grads(&x, be, gb) == 0;
            free(dummy);
            if (!ok) snprintf(err, sizeof err, "%s", e2);
        }
        double worst_e = 0;
        for (int i = 0; i < c->n_in && ok; i++) {
            if (!ga[i] || !gb[i]) continue;
            double e = nmse(gb[i], ga[i], keel_nelements(x.leaf[i]));
            if (e > worst_e || isnan(e)) worst_e = isnan(e) ? INFINITY : e;
        }
        double tol = c->tol > 0 ? c->tol : DEFAULT_TOL;
        if (ok) {
            ok = worst_e <= tol;
            snprintf(err, sizeof err, "gradient nmse=%.3g%s", worst_e, ok ? "" : " > tolerance");
            if (ok && worst_e > S->worst_nmse[bi]) S->worst_nmse[bi] = worst_e;
        }
        /* a thread knob (cpu): 1 and 2 threads give the same bits; otherwise (cuda) a second run does */
        if (ok && S->o->check_threads && !be->oracle) {
            double *g2[CASE_MAX_IN] = {0}, *dummy = NULL;
            int saved = be->n_threads;
            be->set_threads(be, saved == 1 ? 2 : 1);
            char e2[512];
            bool ok2 = run_and_read(&x, be, &dummy, NULL, e2, sizeof e2) == 0 && read_grads(&x, be, g2) == 0;
            be->set_threads(be, saved);
            for (int i = 0; i < c->n_in && ok2; i++)
                if (gb[i] && memcmp(gb[i], g2[i], (size_t)keel_nelements(x.leaf[i]) * sizeof(double))) ok2 = false;
            bool cpu = be->thread_knob;
            if (!ok2)
                ok = false, snprintf(err, sizeof err, "%s",
                                     cpu ? "1 and 2 threads give different gradient bits"
                                         : "two runs give different gradient bits");
            else
                strncat(err, cpu ? ", 1t==2t bitwise" : ", 2 runs bitwise", sizeof err - strlen(err) - 1);
            for (int i = 0; i < CASE_MAX_IN; i++) free(g2[i]);
            free(dummy);
        }
        if (ok && S->o->bits && !be->oracle) {
            uint64_t h = BITS_SEED;
            for (int i = 0; i < c->n_in; i++)
                if (gb[i]) h = bits_hash(gb[i], keel_nelements(x.leaf[i]), h);
            size_t len = strlen(err);
            snprintf(err + len, sizeof err - len, ", bits %016llx", (unsigned long long)h);
        }
        char label[400];
        snprintf(label, sizeof label, "%s grad", c->label);
        outcome(S, bi, c->op, label, orc.width, ok, err);
        for (int i = 0; i < CASE_MAX_IN; i++) free(gb[i]);
        inst_free(&x);
    }
    for (int i = 0; i < CASE_MAX_IN; i++) free(ga[i]);
    inst_free(&orc);
}

/* The cases split into o->shards shards of about the same work, so that make check runs them side by
 * side: the selected cases, largest first (by their inputs' elements, which the float64 oracle's time
 * follows; ties in table order), each to the shard with the least so far. From the table alone, so a
 * case is always in the same shard. shard[i]: case i's shard (-1: not selected). -1: out of memory. */
static int shard_cases(const keel_testops_opts *o, const op_case *cases, int n, int *shard) {
    double *cost = calloc((size_t)(n ? n : 1), sizeof *cost), load[64] = {0};
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order), m = 0, N = o->shards > 1 ? o->shards : 1;
    if (!cost || !order) {
        free(cost), free(order);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        shard[i] = keel_testops_listed(o->ops, keel_op_get(cases[i].op)->name) ? 0 : -1;
        if (shard[i] < 0) continue;
        for (int j = 0; j < cases[i].n_in; j++)
            cost[i] += (double)cases[i].in[j].ne[0] * (double)cases[i].in[j].ne[1] * (double)cases[i].in[j].ne[2] *
                       (double)cases[i].in[j].ne[3];
        order[m++] = i;
    }
    for (int a = 1; a < m; a++) /* insertion sort: largest first, stable */
        for (int b = a; b > 0 && cost[order[b]] > cost[order[b - 1]]; b--) {
            int t = order[b];
            order[b] = order[b - 1], order[b - 1] = t;
        }
    for (int a = 0; N > 1 && a < m; a++) {
        int best = 0;
        for (int k = 1; k < N; k++)
            if (load[k] < load[best]) best = k;
        shard[order[a]] = best, load[best] += cost[order[a]] + 1.0;
    }
    free(cost), free(order);
    return 0;
}

int keel_test_ops(const keel_testops_opts *o) {
    suite S = {.o = o};
    S.ref = keel_backend_new("ref", 1);
    const char *list = o->backends ? o->backends : keel_backend_list();
    char buf[128];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *tok = strtok(buf, ","); tok && S.n_be < 4; tok = strtok(NULL, ",")) {
        keel_backend *be = keel_backend_new(tok, 1);
        if (!be && !o->backends) { /* by default, a built backend without its hardware is skipped, said so */
            printf("skipping backend %s: %s\n", tok, keel_last_error());
            continue;
        }
        if (!be) {
            fprintf(stderr, "keel test-ops: %s\n", keel_last_error());
            return -1;
        }
        S.be[S.n_be++] = be;
    }
    op_case *cases;
    int n = keel_cases_all(&cases);
    int n_sel = 0, *shard = malloc((size_t)(n ? n : 1) * sizeof *shard);
    bool sharded = o->shards > 1, in_table[KEEL_OP_COUNT] = {false};
    if (!shard || shard_cases(o, cases, n, shard)) {
        fprintf(stderr, "keel test-ops: out of memory\n");
        free(shard), free(cases);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        op_case *c = &cases[i];
        if (shard[i] < 0) continue;
        in_table[c->op] = true;
        if (sharded && shard[i] != o->shard) continue;
        make_label(c);
        n_sel++;
        /* the inputs' seed comes from the case's label, not its position: a case added to the
         * table never changes the values another case is checked with */
        uint64_t seed = 1469598103934665603ull;
        for (const char *q = c->label; *q; q++) seed = (seed ^ (unsigned char)*q) * 1099511628211ull;
        if (o->grad) {
            if (case_has_grad(c)) grad_case(&S, c, seed);
        } else {
            forward_case(&S, c, seed);
        }
        fflush(stdout);
    }
    /* coverage: op x backend */
    printf("\n%s coverage (op x backend: %s, cases passed/run)\n", o->grad ? "gradient" : "forward",
           o->grad ? "backward rule and backward graph" : "kernel present");
    printf("%-26s", "op");
    for (int b = 0; b < S.n_be; b++) printf(" %-18s", S.be[b]->name);
    printf("\n");
    for (int op = 1; op < KEEL_OP_COUNT; op++) {
        const keel_op_info *info = keel_op_get(op);
        if (!keel_testops_listed(o->ops, info->name)) continue;
        printf("%-26s", info->name);
        for (int b = 0; b < S.n_be; b++) {
            counts *c = &S.per_op[op][b];
            char cell[64];
            if (o->grad && !info->grad_srcs)
                snprintf(cell, sizeof cell, "no gradient");
            else if (info->flags & OPF_VIEW && !o->grad)
                snprintf(cell, sizeof cell, "view %d/%d", c->pass, c->run);
            else if (c->run == 0 && sharded && in_table[op])
                snprintf(cell, sizeof cell, "other shard");
            else if (c->run == 0)
                snprintf(cell, sizeof cell, "MISSING (no case)");
            else
                snprintf(cell, sizeof cell, "%s %d/%d", S.present[op][b] ? (o->grad ? "rule" : "yes") : "MISSING",
                         c->pass, c->run);
            printf(" %-18s", cell);
        }
        if (o->grad && !info->grad_srcs) printf("  (%s)", info->nograd ? info->nograd : "?");
        printf("\n");
        if (!info->grad_srcs || !o->grad) {
            /* every op has a kernel or is a view: a selected op with no case is a failure */
            if (!o->grad)
                for (int b = 0; b < S.n_be; b++)
                    if (S.per_op[op][b].run == 0 && !(sharded && in_table[op])) S.failures++;
        } else {
            if (!keel_grad_rule_of(op)) {
                printf("  %s: differentiable but no backward rule\n", info->name);
                S.failures++;
            }
            for (int b = 0; b < S.n_be; b++)
                if (S.per_op[op][b].run == 0 && !(sharded && in_table[op])) S.failures++;
        }
        if (!info->grad_srcs && !info->nograd) {
            printf("  %s: no gradient and no reason given\n", info->name);
            S.failures++;
        }
    }
    printf("\n");
    if (!o->grad && (!sharded || o->shard == 0)) /* once, in the first shard */
        for (int b = 0; b < S.n_be; b++) S.failures += keel_test_bad_ids(S.be[b], o->ops);
    if (sharded) printf("shard %d of %d (numbered from 0): %d of the selected cases\n", o->shard, o->shards, n_sel);
    for (int b = 0; b < S.n_be; b++)
        printf("%s: %d cases, %d as expected, %d not, %d without a kernel; worst passing nmse %.2e\n", S.be[b]->name,
               S.per_be[b].run, S.per_be[b].pass, S.per_be[b].fail, S.per_be[b].missing, S.worst_nmse[b]);
    if (o->grad) printf("worst passing relative error, analytic vs finite differences (ref, f64): %.2e\n", S.worst_fd);
    if (n_sel == 0) {
        printf("no case matched --op %s%s\n", o->ops ? o->ops : "", sharded ? " in this shard" : "");
        S.failures++;
    }
    free(shard);
    free(cases);
    for (int b = 0; b < S.n_be; b++) keel_backend_free(S.be[b]);
    keel_backend_free(S.ref);
    return S.failures;
}
