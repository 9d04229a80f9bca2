/* keel: the op test cases: shape families for every op of the table. Rows of 1, 31, 1024, 1025,
 * 4096 and 4097 elements, more than 65535 rows, transposed, permuted and strided (offset) views. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "testops/testops.h"

typedef struct {
    op_case *v;
    int n, cap;
} case_list;

static const int64_t WIDTHS[] = {1, 31, 1024, 1025, 4096, 4097};
#define N_WIDTHS (int)(sizeof WIDTHS / sizeof WIDTHS[0])

static op_case *C(case_list *l, int op) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    op_case *c = &l->v[l->n++];
    memset(c, 0, sizeof *c);
    c->op = op;
    return c;
}

static case_input *I(op_case *c, keel_type t, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    case_input *in = &c->in[c->n_in++];
    memset(in, 0, sizeof *in);
    in->type = t;
    in->ne[0] = n0, in->ne[1] = n1, in->ne[2] = n2, in->ne[3] = n3;
    return in;
}

static case_input *IDX(op_case *c, int64_t n0, int64_t n1, int64_t max) {
    case_input *in = I(c, KEEL_I32, n0, n1, 1, 1);
    in->dom = DOM_INDEX;
    in->index_max = max;
    return in;
}

/* positions [T,B] of packed examples of up to max_len tokens (DOM_SEGMENTS) */
static case_input *SEG(op_case *c, int64_t T, int64_t B, int64_t max_len) {
    case_input *in = IDX(c, T, B, max_len);
    in->dom = DOM_SEGMENTS;
    return in;
}

static void P(op_case *c, int n_ip, const int64_t *ip, int n_fp, const double *fp) {
    c->n_ip = n_ip;
    c->n_fp = n_fp;
    for (int i = 0; i < n_ip; i++) c->ip[i] = ip[i];
    for (int i = 0; i < n_fp; i++) c->fp[i] = fp[i];
}

/* Unary and binary elementwise-style ops over the common families. */
static void rows_family(case_list *l, int op, int n_in, case_domain dom, const int64_t *ip, int n_ip, const double *fp,
                        int n_fp) {
    for (int w = 0; w < N_WIDTHS; w++) {
        op_case *c = C(l, op);
        for (int i = 0; i < n_in; i++) I(c, KEEL_F32, WIDTHS[w], 3, 1, 1)->dom = dom;
        P(c, n_ip, ip, n_fp, fp);
    }
    op_case *c = C(l, op); /* more than 65535 rows */
    for (int i = 0; i < n_in; i++) I(c, KEEL_F32, 2, 65537, 1, 1)->dom = dom;
    P(c, n_ip, ip, n_fp, fp);
    /* half rows: rows of 64 (16-byte aligned) strided apart, cuda's unary rows_vec path */
    static const case_view views[] = {VIEW_TRANSPOSED, VIEW_PERMUTED, VIEW_STRIDED, VIEW_HALF_ROWS};
    static const int64_t shapes[][4] = {{33, 17, 1, 1}, {5, 7, 3, 2}, {31, 5, 2, 1}, {64, 9, 2, 3}};
    for (int v = 0; v < 4; v++) {
        c = C(l, op);
        for (int i = 0; i < n_in; i++) {
            case_input *in = I(c, KEEL_F32, shapes[v][0], shapes[v][1], shapes[v][2], shapes[v][3]);
            in->dom = dom;
            in->view = (i == 0 || v == 2) ? views[v] : VIEW_NONE;
        }
        P(c, n_ip, ip, n_fp, fp);
    }
}

static void binary_family(case_list *l, int op) {
    case_domain d2 = op == KEEL_OP_DIV ? DOM_POSITIVE : DOM_NORMAL;
    rows_family(l, op, 2, DOM_NORMAL, NULL, 0, NULL, 0);
    for (int i = l->n - 11; i < l->n; i++) l->v[i].in[1].dom = d2;
    static const int64_t bshape[][4] = {{31, 1, 1, 1}, {1, 6, 1, 1}, {31, 3, 1, 1}, {1, 1, 2, 1}, {4097, 1, 1, 1}};
    static const int64_t ashape[][4] = {{31, 6, 2, 1}, {31, 6, 2, 1}, {31, 6, 2, 1}, {31, 6, 2, 2}, {4097, 3, 1, 1}};
    for (int s = 0; s < 5; s++) {
        op_case *c = C(l, op);
        I(c, KEEL_F32, ashape[s][0], ashape[s][1], ashape[s][2], ashape[s][3]);
        I(c, KEEL_F32, bshape[s][0], bshape[s][1], bshape[s][2], bshape[s][3])->dom = d2;
    }
}

static void window_family(case_list *l, int op) {
    /* b covers rows 1.. of a: ACC(type=f32,ne_a=[W,17],ne_b=[W,16]) */
    for (int w = 0; w < N_WIDTHS; w++) {
        int64_t W = WIDTHS[w], R = W >= 4096 ? 17 : 5;
        for (int inplace = 0; inplace < 2; inplace++) {
            if (inplace && w % 2) continue;
            op_case *c = C(l, op);
            I(c, KEEL_F32, W, R, 1, 1);
            I(c, KEEL_F32, W, R - 1, 1, 1);
            P(c, 5, (int64_t[]){W, W * R, W * R, W, inplace}, 0, NULL);
            c->ip_elems = 0xf;
        }
    }
    op_case *c = C(l, op); /* more than 65535 rows */
    I(c, KEEL_F32, 2, 65540, 1, 1);
    I(c, KEEL_F32, 2, 65537, 1, 1);
    P(c, 5, (int64_t[]){2, 2 * 65540, 2 * 65540, 2 * 2, 0}, 0, NULL);
    c->ip_elems = 0xf;
    /* a strided window (every other row, offset) with a transposed b */
    c = C(l, op);
    I(c, KEEL_F32, 64, 10, 2, 1);
    I(c, KEEL_F32, 31, 4, 2, 1)->view = VIEW_TRANSPOSED;
    P(c, 5, (int64_t[]){64 * 2, 64 * 10, 64 * 20, 3 + 64, 0}, 0, NULL);
    c->ip_elems = 0xf;
    /* every other row from the 5th element: rows of 32 on 16-byte boundaries (the cuda backend's
     * 4-elements-a-thread path for strided rows) */
    c = C(l, op);
    I(c, KEEL_F32, 64, 10, 2, 1);
    I(c, KEEL_F32, 32, 4, 2, 1);
    P(c, 5, (int64_t[]){64 * 2, 64 * 10, 64 * 20, 4 + 64, 0}, 0, NULL);
    c->ip_elems = 0xf;
    c = C(l, op); /* wide strided window */
    I(c, KEEL_F32, 4100, 6, 1, 1);
    I(c, KEEL_F32, 4097, 3, 1, 1)->view = VIEW_STRIDED;
    P(c, 5, (int64_t[]){4100 * 2, 4100 * 6, 4100 * 6, 4100 + 3, 0}, 0, NULL);
    c->ip_elems = 0xf;
}

static void copy_family(case_list *l, int op) {
    static const keel_type types[] = {KEEL_F32, KEEL_F16, KEEL_BF16};
    for (int w = 0; w < N_WIDTHS; w++) {
        for (int ty = 0; ty < 3; ty++) {
            if (ty && w != 1 && w != 5) continue;
            op_case *c = C(l, op);
            I(c, types[ty], WIDTHS[w], 3, 1, 1)->view = w % 2 ? VIEW_TRANSPOSED : VIEW_NONE;
            c->keep_types = ty != 0;
            if (op == KEEL_OP_CPY) { /* f32 -> each type, into a contiguous or strided target */
                c->in[0].type = KEEL_F32;
                I(c, types[ty], WIDTHS[w], 3, 1, 1)->view = w == 5 ? VIEW_STRIDED : VIEW_NONE;
                c->no_grad_mask = 2;
            }
        }
    }
    op_case *c = C(l, op);
    I(c, KEEL_F32, 3, 65537, 1, 1);
    if (op == KEEL_OP_CPY) I(c, KEEL_F32, 3, 65537, 1, 1), c->no_grad_mask = 2;
    c = C(l, op);
    I(c, KEEL_F32, 5, 7, 3, 2)->view = VIEW_PERMUTED;
    if (op == KEEL_OP_CPY) I(c, KEEL_F32, 5, 7, 3, 2)->view = VIEW_TRANSPOSED, c->no_grad_mask = 2;
    c = C(l, op);
    I(c, KEEL_F32, 4097, 3, 2, 1)->view = VIEW_STRIDED;
    if (op == KEEL_OP_CPY) I(c, KEEL_F32, 4097, 3, 2, 1), c->no_grad_mask = 2;
    if (op == KEEL_OP_CPY) { /* bf16 and f16 sources, i32 copies */
        c = C(l, op);
        I(c, KEEL_BF16, 1025, 3, 1, 1);
        I(c, KEEL_F32, 1025, 3, 1, 1);
        c->keep_types = true, c->no_grad_mask = 3;
        c = C(l, op);
        I(c, KEEL_F16, 31, 3, 1, 1)->view = VIEW_TRANSPOSED;
        I(c, KEEL_F32, 31, 3, 1, 1);
        c->keep_types = true, c->no_grad_mask = 3;
        c = C(l, op);
        IDX(c, 4097, 2, 1000);
        IDX(c, 4097, 2, 1000);
        c->keep_types = true;
    }
}

/* CAST into the case's working type (float64 on the oracle, float32 elsewhere), then a SQR so the
 * gradient reaching CAST varies: CAST's backward rule, with views, under the gradient tiers. */
static keel_tensor *build_cast_same(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    (void)c;
    return keel_sqr(ctx, keel_cast(ctx, x[0], x[0]->type));
}

/* Composite, model-shaped: one projection of width 2*W split per head into [q | gate] views,
 * each used differently downstream (q through RMS_NORM, gate through SIGMOID), W = 2048. */
static keel_tensor *build_qgate(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    int64_t hd = c->ip[0], H = c->ip[1], T = c->in[0].ne[1];
    int64_t es = (int64_t)keel_type_size(x[0]->type);
    keel_tensor *q = keel_view_3d(ctx, x[0], hd, H, T, 2 * hd * es, 2 * hd * H * es, 0);
    keel_tensor *gate = keel_view_3d(ctx, x[0], hd, H, T, 2 * hd * es, 2 * hd * H * es, hd * es);
    keel_tensor *qn = keel_rms_norm(ctx, q, 1e-6);
    return keel_mul(ctx, qn, keel_sigmoid(ctx, gate));
}

/* Mixed precision: both operands rounded to bf16 (CAST), the product summed in float32 and given
 * in float32 (ip[0] of the case: the result type); its backward rounds dy to bf16 and gives float32
 * gradients, which reach the float32 inputs through CAST's rule. */
static keel_tensor *build_mm_bf16(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    keel_tensor *y =
        keel_mul_mat_to(ctx, keel_cast(ctx, x[0], KEEL_BF16), keel_cast(ctx, x[1], KEEL_BF16), (keel_type)c->ip[0]);
    return y && y->type == KEEL_BF16 ? keel_cast(ctx, y, KEEL_F32) : y;
}

/* The mixed-precision LM head: x and W rounded to bf16 (CAST), LINEAR_CROSS_ENTROPY on them; its
 * float32 gradients reach the float32 inputs through CAST's rule. */
static keel_tensor *build_lce_bf16(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    return keel_linear_cross_entropy(ctx, keel_cast(ctx, x[0], KEEL_BF16), keel_cast(ctx, x[1], KEEL_BF16), x[2],
                                     c->ip[0]);
}

/* The packed LM head's loss (keel_linear_cross_entropy_with_grads) of chunk ip0, on x and W as they
 * are (float32) or, when the case's ip1 is 1, rounded to bf16 by CAST */
static keel_tensor *build_lce_grads(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    bool bf = c->ip[1] == 1;
    return keel_linear_cross_entropy_with_grads(ctx, bf ? keel_cast(ctx, x[0], KEEL_BF16) : x[0],
                                                bf ? keel_cast(ctx, x[1], KEEL_BF16) : x[1], x[2], c->ip[0]);
}

/* SUM_SQ of all but the first element: a contiguous start 4 bytes past a 16-byte boundary */
static keel_tensor *build_sum_sq_unaligned(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    (void)c;
    int64_t es = (int64_t)keel_type_size(x[0]->type);
    return keel_sum_sq(ctx, keel_view_1d(ctx, x[0], keel_nelements(x[0]) - 1, es));
}

/* REPEAT_BACK of a [516, 300] view from element 1 of its input (contiguous, not on a 16-byte boundary:
 * cuda's 4-wide pass 1 with 4-byte loads) to [516] */
static keel_tensor *build_repeat_back_unaligned(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    (void)c;
    int64_t es = (int64_t)keel_type_size(x[0]->type);
    keel_tensor *v = keel_view_2d(ctx, x[0], 516, 300, 516 * es, es);
    return v ? keel_repeat_back(ctx, v, (const int64_t[]){516, 1, 1, 1}) : NULL;
}

/* SHADOW over the weight's own bf16 CAST (input w), read back in w's type (the gradient harness
 * weighs a result of w's type) */
static keel_tensor *build_shadow_of_cast(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    (void)c;
    return keel_cast(ctx, keel_shadow(ctx, keel_cast(ctx, x[0], KEEL_BF16), x[0]), x[0]->type);
}

/* ADAMW (or ADAMW_SHADOW, the bf16 copies c the last input) as training builds it: s is the SUM_SQ of
 * the gradients themselves (inputs p, g, m, v[, c]) */
static keel_tensor *build_adamw_own_norm(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    keel_tensor *src[6] = {x[0], x[1], x[2], x[3], keel_sum_sq(ctx, x[1]), x[4]};
    return src[4] ? keel_op_new(ctx, c->op, src, c->op == KEEL_OP_ADAMW ? 5 : 6, c->ip, c->n_ip, c->fp, c->n_fp) : NULL;
}

/* ADAMW (or ADAMW_SHADOW) whose s is not finite: the SUM_SQ of LOG of values with exact zeros (inputs p,
 * g, m, v, x[, c]) */
static keel_tensor *build_adamw_nonfinite(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    keel_tensor *src[6] = {x[0], x[1], x[2], x[3], keel_sum_sq(ctx, keel_log(ctx, x[4])), x[5]};
    return src[4] ? keel_op_new(ctx, c->op, src, c->op == KEEL_OP_ADAMW ? 5 : 6, c->ip, c->n_ip, c->fp, c->n_fp) : NULL;
}

/* FLASH_ATTN_BACK on the forward's own packed output (its o and lse are what the backward reads):
 * inputs q, k, v, positions, dy */
static keel_tensor *build_fa_back(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    keel_tensor *o = keel_flash_attn(ctx, x[0], x[1], x[2], x[3], c->fp[0], x[4]->type);
    keel_tensor *src[6] = {x[0], x[1], x[2], x[3], o, x[4]};
    return o ? keel_op_new(ctx, KEEL_OP_FLASH_ATTN_BACK, src, 6, o->ip, 1, c->fp, 1) : NULL;
}
/* mixed precision: q, k, v rounded to bf16 (CAST) and their float32 gradients through CAST's rule */
static keel_tensor *build_fa_bf16(keel_ctx *ctx, const op_case *c, keel_tensor **x) {
    keel_tensor *b[3];
    for (int i = 0; i < 3; i++) b[i] = keel_cast(ctx, x[i], KEEL_BF16);
    return keel_flash_attn(ctx, b[0], b[1], b[2], x[3], c->fp[0], x[0]->type);
}

int keel_cases_all(op_case **out) {
    case_list l = {0};
    op_case *c;
    for (int op = 1; op < KEEL_OP_COUNT; op++) {
        switch (op) {
        case KEEL_OP_VIEW: {
            /* strided windows, including a view of a view, narrow and wide */
            c = C(&l, op);
            I(c, KEEL_F32, 31, 6, 1, 1);
            P(c, 9, (int64_t[]){20, 3, 1, 1, 1, 31 * 2, 31 * 2 * 3, 31 * 2 * 3, 31 + 2}, 0, NULL);
            c->ip_elems = 0x1f0;
            c = C(&l, op);
            I(c, KEEL_F32, 8194, 5, 1, 1);
            P(c, 9, (int64_t[]){4097, 5, 1, 1, 1, 8194, 8194 * 5, 8194 * 5, 4097}, 0, NULL);
            c->ip_elems = 0x1f0;
            c = C(&l, op);
            I(c, KEEL_F32, 4096, 3, 1, 1);
            P(c, 9, (int64_t[]){4096, 2, 1, 1, 1, 4096, 4096 * 2, 4096 * 2, 4096}, 0, NULL);
            c->ip_elems = 0x1f0;
            c = C(&l, op);
            I(c, KEEL_F32, 2 * 2048, 5, 1, 1);
            P(c, 2, (int64_t[]){256, 8}, 0, NULL);
            /* (the forward moves no rows; the backward joins q's and gate's gradients, the halves of
             * x's rows, by a CONCAT, then copies the result whole as x's own gradient: rows of 2 W) */
            c->build = build_qgate;
            c->name = "VIEW([q|gate] per-head interleave, W=2048)";
            c = C(&l, op);
            I(c, KEEL_F32, 2 * 64, 3, 1, 1);
            P(c, 2, (int64_t[]){16, 4}, 0, NULL);
            c->build = build_qgate;
            c->name = "VIEW([q|gate] per-head interleave, W=64)";
            break;
        }
        case KEEL_OP_RESHAPE:
            c = C(&l, op);
            I(&l.v[l.n - 1], KEEL_F32, 4097, 6, 1, 1);
            P(c, 4, (int64_t[]){4097 * 2, 3, 1, 1}, 0, NULL);
            c = C(&l, op);
            I(c, KEEL_F32, 31, 4, 3, 1);
            P(c, 4, (int64_t[]){4, 31, 3, 1}, 0, NULL);
            break;
        case KEEL_OP_PERMUTE:
            c = C(&l, op);
            I(c, KEEL_F32, 5, 7, 3, 2);
            P(c, 4, (int64_t[]){2, 0, 3, 1}, 0, NULL);
            c = C(&l, op);
            I(c, KEEL_F32, 4097, 3, 2, 1);
            P(c, 4, (int64_t[]){1, 0, 2, 3}, 0, NULL);
            break;
        case KEEL_OP_TRANSPOSE:
            c = C(&l, op);
            I(c, KEEL_F32, 31, 17, 2, 1);
            c = C(&l, op);
            I(c, KEEL_F32, 4097, 3, 1, 1);
            break;
        case KEEL_OP_CPY:
        case KEEL_OP_CONT:
        case KEEL_OP_DUP:
            copy_family(&l, op);
            break;
        case KEEL_OP_SHADOW: /* the optimizer's bf16 copy read as it is; the float32 weight takes the gradient */
            for (int s = 0; s < 2; s++) {
                c = C(&l, op);
                I(c, KEEL_BF16, s ? 4097 : 33, s ? 2 : 17, 1, 1);
                I(c, KEEL_F32, s ? 4097 : 33, s ? 2 : 17, 1, 1);
                c->keep_types = true;
            }
            /* as a step builds it, the copy being the weight's CAST (so the oracle's is its own): the
             * gradient reaches the weight, float32 (float64 on ref) */
            c = C(&l, op);
            I(c, KEEL_F32, 65, 9, 1, 1);
            c->build = build_shadow_of_cast, c->name = "CAST(SHADOW(CAST(w, bf16), w), w's type)", c->tol = 2e-5;
            c->no_fd = "bf16 rounding of the value (steps)";
            break;
        case KEEL_OP_CAST: { /* every pair of real types, views and a wide row */
            static const keel_type ty[] = {KEEL_F32, KEEL_BF16, KEEL_F16};
            for (int s = 0; s < 3; s++)
                for (int d = 0; d < 3; d++) {
                    if (s == d && s) continue;
                    c = C(&l, op);
                    I(c, ty[s], s + d == 1 ? 1025 : 31, 3, 2, 1)->view = d == 2 ? VIEW_TRANSPOSED : VIEW_NONE;
                    P(c, 1, (int64_t[]){ty[d]}, 0, NULL);
                    c->keep_types = true;
                }
            c = C(&l, op);
            I(c, KEEL_F32, 5, 7, 3, 2)->view = VIEW_PERMUTED;
            P(c, 1, (int64_t[]){KEEL_F32}, 0, NULL);
            c->keep_types = true;
            for (int v = 0; v < 2; v++) { /* the gradient rule (same-type CAST), plain and transposed */
                c = C(&l, op);
                I(c, KEEL_F32, v ? 33 : 1025, 3, 1, 1)->view = v ? VIEW_TRANSPOSED : VIEW_NONE;
                c->build = build_cast_same;
                c->name = v ? "CAST(to the working type, transposed [33,3])" : "CAST(to the working type, [1025,3])";
            }
            break;
        }
        case KEEL_OP_GET_ROWS:
            for (int w = 0; w < N_WIDTHS; w++) {
                c = C(&l, op);
                I(c, KEEL_F32, WIDTHS[w], 11, 1, 1);
                IDX(c, 7, 2, 11);
            }
            c = C(&l, op);
            I(c, KEEL_F32, 2, 70000, 1, 1);
            IDX(c, 65537, 1, 70000);
            c->width = 2; /* the copy path moves rows of 2 (65537 is the ids' length): no fault expected */
            c = C(&l, op);
            I(c, KEEL_BF16, 33, 9, 1, 1);
            IDX(c, 5, 1, 9);
            c->keep_types = true;
            c = C(&l, op);
            I(c, KEEL_F32, 31, 9, 1, 1)->view = VIEW_STRIDED;
            IDX(c, 5, 1, 9);
            break;
        case KEEL_OP_GET_ROWS_BACK:
            for (int w = 0; w < N_WIDTHS; w += 2) {
                c = C(&l, op);
                I(c, KEEL_F32, WIDTHS[w], 7, 2, 1);
                IDX(c, 7, 2, 5);
                P(c, 1, (int64_t[]){5}, 0, NULL);
            }
            c = C(&l, op);
            I(c, KEEL_F32, 2, 65537, 1, 1);
            IDX(c, 65537, 1, 70000);
            P(c, 1, (int64_t[]){70000}, 0, NULL);
            c = C(&l, op); /* a strided dy, rows wider than a block's 4 x 256 registers, ids repeated */
            I(c, KEEL_F32, 1100, 9, 2, 1)->view = VIEW_STRIDED;
            IDX(c, 9, 2, 3);
            P(c, 1, (int64_t[]){3}, 0, NULL);
            break;
        case KEEL_OP_GET_ROWS_BACK_ADD: /* as GET_ROWS_BACK's, plus an addend (transposed once, strided once) */
            for (int w = 0; w < N_WIDTHS; w += 2) {
                c = C(&l, op);
                I(c, KEEL_F32, WIDTHS[w], 7, 2, 1);
                IDX(c, 7, 2, 5);
                I(c, KEEL_F32, WIDTHS[w], 5, 1, 1)->view = w == 2 ? VIEW_STRIDED : VIEW_NONE;
            }
            c = C(&l, op);
            I(c, KEEL_F32, 2, 65537, 1, 1);
            IDX(c, 65537, 1, 70000);
            I(c, KEEL_F32, 2, 70000, 1, 1);
            c = C(&l, op); /* a strided dy, rows wider than a block's 4 x 256 registers, ids repeated */
            I(c, KEEL_F32, 1100, 9, 2, 1)->view = VIEW_STRIDED;
            IDX(c, 9, 2, 3);
            I(c, KEEL_F32, 1100, 3, 1, 1);
            c = C(&l, op); /* rows of 64 strided apart (cuda's rows_vec pass over the addend) */
            I(c, KEEL_F32, 64, 9, 2, 1);
            IDX(c, 9, 2, 40);
            I(c, KEEL_F32, 64, 40, 1, 1)->view = VIEW_HALF_ROWS;
            c = C(&l, op);
            I(c, KEEL_F32, 24, 9, 1, 1);
            IDX(c, 9, 1, 31);
            I(c, KEEL_F32, 24, 31, 1, 1)->view = VIEW_TRANSPOSED;
            break;
        case KEEL_OP_ACC:
        case KEEL_OP_SET:
            window_family(&l, op);
            break;
        case KEEL_OP_FILL:
            for (int w = 0; w < N_WIDTHS; w++) {
                c = C(&l, op);
                P(c, 4, (int64_t[]){WIDTHS[w], 3, 1, 1}, 1, (double[]){-1.25});
            }
            c = C(&l, op);
            P(c, 4, (int64_t[]){2, 65537, 1, 1}, 1, (double[]){0.5});
            c = C(&l, op); /* zeros: the cuda backend's memset */
            P(c, 4, (int64_t[]){6144, 33, 2, 1}, 1, (double[]){0.0});
            break;
        case KEEL_OP_REPEAT:
        case KEEL_OP_REPEAT_BACK: {
            static const int64_t small[][4] = {
                {31, 1, 1, 1}, {1, 5, 1, 1}, {3, 2, 1, 1}, {4097, 1, 1, 1}, {2, 1, 1, 1}};
            static const int64_t big[][4] = {
                {31, 4, 1, 1}, {31, 5, 1, 1}, {6, 4, 3, 2}, {4097, 3, 1, 1}, {2, 65537, 1, 1}};
            for (int s = 0; s < 5; s++) {
                c = C(&l, op);
                const int64_t *in = op == KEEL_OP_REPEAT ? small[s] : big[s],
                              *to = op == KEEL_OP_REPEAT ? big[s] : small[s];
                I(c, KEEL_F32, in[0], in[1], in[2], in[3])->view = s == 2 ? VIEW_TRANSPOSED : VIEW_NONE;
                P(c, 4, to, 0, NULL);
            }
            /* wide results summed over many rows (a norm weight's gradient): cuda's 16-byte pass 1
             * (a multiple of 4 wide) and its pass 2 of 4 elements a block (512 wide or more), with a
             * last block of fewer (514) */
            static const int64_t wide[][4] = {{1024, 300, 1, 1}, {516, 4100, 1, 1}, {514, 70, 2, 1}};
            for (int s = 0; op == KEEL_OP_REPEAT_BACK && s < 3; s++) {
                c = C(&l, op);
                I(c, KEEL_F32, wide[s][0], wide[s][1], wide[s][2], wide[s][3]);
                P(c, 4, (int64_t[]){wide[s][0], 1, 1, 1}, 0, NULL);
            }
            if (op == KEEL_OP_REPEAT_BACK) { /* the same sums from an input not on a 16-byte boundary */
                c = C(&l, op);
                I(c, KEEL_F32, 516 * 300 + 1, 1, 1, 1);
                c->build = build_repeat_back_unaligned, c->name = "REPEAT_BACK(516 x 300 from element 1)";
            }
            /* the delta rule's dq, dk summed over the value heads of a key head (r of them side by side
             * in a token's row): dimension 1 of a view whose rows lie apart, half rows and strided */
            for (int s = 0; op == KEEL_OP_REPEAT_BACK && s < 2; s++) {
                c = C(&l, op);
                I(c, KEEL_F32, 16, 2, 3, 40)->view = s ? VIEW_STRIDED : VIEW_HALF_ROWS;
                P(c, 4, (int64_t[]){16, 1, 3, 40}, 0, NULL);
            }
            break;
        }
        case KEEL_OP_CONCAT:
            for (int d = 0; d < 4; d++) {
                c = C(&l, op);
                int64_t a[4] = {5, 4, 3, 2}, b[4] = {5, 4, 3, 2};
                b[d] = 2;
                I(c, KEEL_F32, a[0], a[1], a[2], a[3])->view = d == 1 ? VIEW_PERMUTED : VIEW_NONE;
                I(c, KEEL_F32, b[0], b[1], b[2], b[3]);
                P(c, 1, (int64_t[]){d}, 0, NULL);
            }
            c = C(&l, op);
            I(c, KEEL_F32, 4096, 3, 1, 1);
            I(c, KEEL_F32, 1, 3, 1, 1);
            P(c, 1, (int64_t[]){0}, 0, NULL);
            /* two gradients side by side as the backward joins halves (attention's q and gate): rows of
             * 16 every 32 (cuda's 16-byte copies of strided rows) */
            c = C(&l, op);
            I(c, KEEL_F32, 16, 1, 37, 2);
            I(c, KEEL_F32, 16, 1, 37, 2);
            P(c, 1, (int64_t[]){1}, 0, NULL);
            /* the bf16 result (the halves' gradient going to a bf16 product): each float32 value rounded
             * once, as CAST rounds it; strided rows of 16, a wide row, views */
            for (int s = 0; s < 3; s++) {
                static const int64_t sh[][4] = {{16, 1, 37, 2}, {4097, 3, 1, 1}, {5, 4, 3, 2}};
                c = C(&l, op);
                c->keep_types = true, c->tol = 2e-5, c->no_fd = "bf16 rounding of the result";
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 2 ? VIEW_PERMUTED : VIEW_NONE;
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 2 ? VIEW_TRANSPOSED : VIEW_NONE;
                P(c, 2, (int64_t[]){s == 1 ? 0 : 1, KEEL_BF16}, 0, NULL);
            }
            break;
        case KEEL_OP_ADD:
        case KEEL_OP_SUB:
        case KEEL_OP_MUL:
        case KEEL_OP_DIV:
            binary_family(&l, op);
            break;
        case KEEL_OP_SCALE:
            rows_family(&l, op, 1, DOM_NORMAL, NULL, 0, (double[]){-1.5, 0.25}, 2);
            break;
        case KEEL_OP_SQRT:
        case KEEL_OP_LOG:
            rows_family(&l, op, 1, DOM_POSITIVE, NULL, 0, NULL, 0);
            break;
        case KEEL_OP_SQR:
        case KEEL_OP_EXP:
        case KEEL_OP_NEG:
        case KEEL_OP_SILU:
        case KEEL_OP_SIGMOID:
        case KEEL_OP_SUM:
        case KEEL_OP_SUM_ROWS:
        case KEEL_OP_MEAN:
        case KEEL_OP_SILU_BACK:
        case KEEL_OP_SIGMOID_BACK:
        case KEEL_OP_SIGMOID_MUL:
        case KEEL_OP_SIGMOID_MUL_BACK:
        case KEEL_OP_SWIGLU:
        case KEEL_OP_SWIGLU_BACK:
            rows_family(&l, op, keel_op_get(op)->arity, DOM_NORMAL, NULL, 0, NULL, 0);
            if (op != KEEL_OP_SWIGLU && op != KEEL_OP_SWIGLU_BACK && op != KEEL_OP_SIGMOID_MUL) break;
            /* the bf16 result (mixed precision's down- and output-projection operands; backward: the
             * gate and up projections' dy): the float32 value rounded once (2e-5); wide rows, more than
             * 65535 rows, views, a 4-D shape whose size is no multiple of 4 */
            for (int s = 0; s < 5; s++) {
                static const int64_t sh[][4] = {
                    {4097, 3, 1, 1}, {2, 65537, 1, 1}, {33, 17, 1, 1}, {5, 7, 3, 2}, {64, 5, 1, 1}};
                c = C(&l, op);
                c->keep_types = true, c->tol = 2e-5, c->no_fd = "bf16 rounding of the result";
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 2 ? VIEW_TRANSPOSED : VIEW_NONE;
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 3 ? VIEW_PERMUTED : VIEW_NONE;
                if (op == KEEL_OP_SWIGLU_BACK)
                    I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 4 ? VIEW_TRANSPOSED : VIEW_NONE;
                P(c, 1, (int64_t[]){KEEL_BF16}, 0, NULL);
            }
            if (op == KEEL_OP_SIGMOID_MUL) { /* attention's gate: half rows (cuda's 4-wide groups of strided rows) */
                c = C(&l, op);
                c->keep_types = true, c->tol = 2e-5, c->no_fd = "bf16 rounding of the result";
                I(c, KEEL_F32, 64, 40, 1, 1);
                I(c, KEEL_F32, 64, 40, 1, 1)->view = VIEW_HALF_ROWS;
                P(c, 1, (int64_t[]){KEEL_BF16}, 0, NULL);
            }
            break;
        case KEEL_OP_SOFTPLUS:
            rows_family(&l, op, 1, DOM_NORMAL, NULL, 0, NULL, 0);
            c = C(&l, op); /* both sides of torch's threshold (x > 20: x) */
            I(c, KEEL_F32, 64, 2, 1, 1)->scale = 12.0;
            break;
        case KEEL_OP_DROPOUT: { /* p 0 keeps all, 0.9 drops most; views and a wide row */
            static const double ps[] = {0.1, 0.5, 0.0, 0.9, 0.25};
            static const int64_t sh[][4] = {
                {64, 3, 1, 1}, {4097, 2, 1, 1}, {6, 4, 3, 2}, {17, 17, 2, 1}, {5, 65537, 1, 1}};
            for (int s = 0; s < 5; s++) {
                c = C(&l, op);
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 3   ? VIEW_TRANSPOSED
                                                                               : s == 2 ? VIEW_PERMUTED
                                                                                        : VIEW_NONE;
                P(c, 4, (int64_t[]){1234 + s, 7 * s + 1, 3 + s, (int64_t)llround(ps[s] * 4294967296.0)}, 1,
                  (double[]){ps[s]});
            }
            break;
        }
        case KEEL_OP_RMS_NORM:
        case KEEL_OP_L2_NORM:
        case KEEL_OP_RMS_NORM_BACK:
        case KEEL_OP_L2_NORM_BACK:
            rows_family(&l, op, keel_op_get(op)->arity, DOM_NORMAL, NULL, 0, (double[]){1e-6}, 1);
            break;
        case KEEL_OP_SOFT_MAX:
            rows_family(&l, op, 1, DOM_NORMAL, NULL, 0, (double[]){0.7}, 1);
            break;
        case KEEL_OP_SOFT_MAX_CAUSAL: {
            /* keys, queries, heads, batch, longest example: one example a column (plain causal),
             * packed examples, more keys than queries (decoding), a transposed view */
            static const int64_t sh[][5] = {{1, 1, 2, 1, 1},       {31, 31, 2, 2, 7}, {1024, 5, 2, 1, 4000},
                                            {4097, 3, 1, 1, 2000}, {64, 64, 3, 2, 9}, {1025, 1025, 1, 1, 5000},
                                            {17, 17, 2, 1, 5},     {40, 40, 1, 3, 1}};
            for (int s = 0; s < 8; s++) {
                c = C(&l, op);
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 6 ? VIEW_TRANSPOSED : VIEW_NONE;
                SEG(c, sh[s][1], sh[s][3], sh[s][4]);
                P(c, 0, NULL, 1, (double[]){s % 2 ? 0.125 : 1.0});
            }
            break;
        }
        case KEEL_OP_FLASH_ATTN:
        case KEEL_OP_FLASH_ATTN_BACK: {
            /* D, H, KV, Tq, Tk, B, Dv, longest example, score scale x 1/sqrt(D) (x 1/4), variant:
             * 1 bf16 q, k, v as they are, 2 bf16 by CAST (the model's; its gradient), 3 q a
             * permuted view. One example a column and packed ones; more keys than queries (a
             * cache); GQA groups of 1, 2 and 4; heads of 256 (the model's) and odd sizes; lengths
             * around the cuda kernels' 64-row tiles; bf16 cases of 2 and 3 examples (cuda's backward
             * in slabs of examples: gpu-check's attn stage sets KEEL_CUDA_FA_DS_BYTES to split them). float32: within 1e-10 of float64 (NMSE);
             * bf16 operands: 1e-4 (the plan's tier for a bf16 intermediate, P for P.V) */
            static const int64_t sh[][10] = {
                {4, 1, 1, 5, 5, 1, 4, 5, 4, 0},          {16, 4, 2, 33, 33, 2, 16, 10, 4, 0},
                {8, 2, 1, 7, 12, 1, 5, 100, 4, 3},       {256, 4, 1, 20, 20, 1, 256, 20, 4, 0},
                {32, 8, 2, 70, 70, 1, 32, 1000, 12, 0},  {64, 2, 2, 129, 129, 2, 64, 50, 4, 0},
                {256, 4, 1, 130, 130, 2, 256, 77, 4, 0}, {64, 4, 2, 65, 80, 1, 64, 1000, 4, 0},
                {24, 2, 1, 9, 9, 2, 24, 4, 4, 1},        {256, 4, 1, 70, 70, 1, 256, 40, 4, 1},
                {64, 2, 1, 129, 129, 1, 64, 1000, 4, 1}, {256, 4, 1, 66, 66, 1, 256, 30, 4, 2},
                {16, 2, 1, 20, 20, 2, 16, 7, 4, 2},      {128, 4, 2, 40, 100, 2, 128, 30, 6, 1},
                {64, 4, 2, 65, 65, 3, 64, 40, 4, 1}};
            for (int s = 0; s < 15; s++) {
                const int64_t *x = sh[s];
                bool bf = x[9] == 1, cast = x[9] == 2;
                if (cast && op == KEEL_OP_FLASH_ATTN_BACK) continue;
                c = C(&l, op);
                keel_type ty = bf ? KEEL_BF16 : KEEL_F32;
                I(c, ty, x[0], x[1], x[3], x[5])->view = x[9] == 3 ? VIEW_PERMUTED : VIEW_NONE;
                I(c, ty, x[0], x[2], x[4], x[5]);
                I(c, ty, x[6], x[2], x[4], x[5]);
                SEG(c, x[3], x[5], x[7]);
                if (op == KEEL_OP_FLASH_ATTN_BACK) {
                    I(c, KEEL_F32, (x[6] + 1) * x[1] * x[3] * x[5], 1, 1, 1);
                    c->build = build_fa_back;
                }
                P(c, 0, NULL, 1, (double[]){(double)x[8] / 4.0 / sqrt((double)x[0])});
                c->tol = bf || cast ? 1e-4 : 1e-10;
                if (bf) c->keep_types = true;
                if (cast) c->build = build_fa_bf16, c->no_fd = "bf16 rounding of q, k and v";
                if (x[3] * x[4] * x[0] > 400000)
                    c->no_fd = "large: each backend against ref's backward, proven on the small cases";
                static char names[2][15][128]; /* built cases name themselves */
                if (c->build) {
                    char *nm = names[op == KEEL_OP_FLASH_ATTN_BACK][s];
                    snprintf(nm, 128, "%s(D=%lld,H=%lld,KV=%lld,Tq=%lld,Tk=%lld,B=%lld,Dv=%lld,scale=%g%s)",
                             keel_op_get(op)->name, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3],
                             (long long)x[4], (long long)x[5], (long long)x[6], c->fp[0], cast ? ",bf16 by CAST" : "");
                    c->name = nm;
                }
            }
            /* the backward from do alone (dlse 0: the model's case, only o read), float32 and bf16
             * operands at the model's head size, one example a column and packed ones */
            for (int s = 0; op == KEEL_OP_FLASH_ATTN_BACK && s < 2; s++) {
                const int64_t *x = sh[s ? 9 : 3];
                c = C(&l, op);
                keel_type ty = s ? KEEL_BF16 : KEEL_F32;
                I(c, ty, x[0], x[1], x[3], x[5]);
                I(c, ty, x[0], x[2], x[4], x[5]);
                I(c, ty, x[6], x[2], x[4], x[5]);
                SEG(c, x[3], x[5], x[7]);
                I(c, KEEL_F32, x[6] * x[1] * x[3] * x[5], 1, 1, 1);
                c->build = build_fa_back, c->tol = s ? 1e-4 : 1e-10, c->keep_types = s;
                c->name =
                    s ? "FLASH_ATTN_BACK(bf16 D=256,H=4,Tq=70,do alone)" : "FLASH_ATTN_BACK(D=256,H=4,Tq=20,do alone)";
                P(c, 0, NULL, 1, (double[]){(double)x[8] / 4.0 / sqrt((double)x[0])});
            }
            break;
        }
        case KEEL_OP_SOFT_MAX_BACK:
            rows_family(&l, op, 2, DOM_NORMAL, NULL, 0, (double[]){0.7}, 1);
            break;
        case KEEL_OP_ROPE:
        case KEEL_OP_ROPE_BACK: {
            static const int64_t sh[][5] = {
                {32, 4, 7, 2, 32}, {256, 2, 5, 1, 64}, {4098, 1, 3, 1, 1024}, {4, 65537, 1, 1, 4}, {128, 2, 9, 1, 128}};
            for (int s = 0; s < 5; s++) {
                c = C(&l, op);
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], sh[s][3])->view = s == 4 ? VIEW_PERMUTED : VIEW_NONE;
                IDX(c, sh[s][2], 1, s == 1 ? 20000 : 64);
                P(c, 1, (int64_t[]){sh[s][4]}, 1, (double[]){s == 1 ? 1e7 : 10000.0});
            }
            c = C(&l, op); /* positions per column [T,B]: packed examples */
            I(c, KEEL_F32, 32, 3, 9, 2);
            SEG(c, 9, 2, 4);
            P(c, 1, (int64_t[]){16}, 1, (double[]){10000.0});
            break;
        }
        case KEEL_OP_MUL_MAT:
        case KEEL_OP_OUT_PROD: {
            /* a [K,M], b [K,N] (MUL_MAT); a [I,K], b [J,K] (OUT_PROD) */
            static const int64_t mm[][8] = {
                {1, 3, 1, 1, 1, 2, 1, 1},
                {31, 5, 1, 1, 31, 3, 1, 1},
                {1024, 7, 1, 1, 1024, 4, 1, 1},
                {1025, 9, 1, 1, 1025, 3, 1, 1},
                {4096, 3, 1, 1, 4096, 2, 1, 1},
                {4097, 5, 1, 1, 4097, 3, 1, 1},
                {300, 130, 1, 1, 300, 70, 1, 1},
                {64, 96, 1, 1, 64, 80, 1, 1},
                {16, 8, 2, 2, 16, 5, 6, 2},
                {4, 3, 1, 1, 4, 65537, 1, 1},
                /* one weight against every matrix of b / a group summed into one result: the
                 * cuda backend's single wide product (cuda_matmul.cu, merges) */
                {64, 48, 1, 1, 64, 40, 3, 2},
            };
            /* bf16 operands (the oracle reads them exactly), float32 sums: a float32 result within
             * float32 rounding of float64 (1e-9), a bf16 result one rounding away (2e-5) */
            static const int sel[] = {1, 3, 6, 8, 10, 7};
            for (int k = 0; k < 6; k++)
                for (int rt = 0; rt < 2; rt++) {
                    const int64_t *x = mm[sel[k]];
                    keel_type out_t = rt ? KEEL_BF16 : KEEL_F32;
                    c = C(&l, op);
                    c->keep_types = true, c->tol = rt ? 2e-5 : 1e-9;
                    if (op == KEEL_OP_MUL_MAT) {
                        I(c, KEEL_BF16, x[0], x[1], x[2], x[3])->view = sel[k] == 7 ? VIEW_TRANSPOSED : VIEW_NONE;
                        I(c, KEEL_BF16, x[4], x[5], x[6], x[7])->view = sel[k] == 8 ? VIEW_PERMUTED : VIEW_NONE;
                        P(c, 1, (int64_t[]){out_t}, 0, NULL);
                    } else {
                        I(c, KEEL_BF16, x[1], x[0], x[6], x[7])->view = sel[k] == 7 ? VIEW_TRANSPOSED : VIEW_NONE;
                        I(c, KEEL_BF16, x[5], x[4], x[6], x[7]);
                        P(c, 3, (int64_t[]){x[2], x[3], out_t}, 0, NULL);
                    }
                }
            /* bf16 at the b and a projections' shapes at batch 8 x 1024 tokens, where cuda takes a measured
             * preference among cuBLASLt's answers (cuda_lt.cu, LT_PREFS): the forward W^T x (32 x 8192 x
             * 1024) and the weight gradient (1024 x 32 x 8192); the other preferred shapes cost the
             * float64 oracle minutes */
            c = C(&l, op);
            c->keep_types = true, c->tol = 1e-9;
            if (op == KEEL_OP_MUL_MAT) {
                I(c, KEEL_BF16, 1024, 32, 1, 1);
                I(c, KEEL_BF16, 1024, 8192, 1, 1);
                P(c, 1, (int64_t[]){KEEL_F32}, 0, NULL);
            } else {
                I(c, KEEL_BF16, 1024, 8192, 1, 1);
                I(c, KEEL_BF16, 32, 8192, 1, 1);
                P(c, 3, (int64_t[]){1, 1, KEEL_F32}, 0, NULL);
            }
            if (op == KEEL_OP_MUL_MAT) /* the mixed-precision gradient rule, plain and broadcast */
                for (int k = 0; k < 4; k++) {
                    const int64_t *x = mm[(int[]){1, 6, 8, 10}[k]];
                    c = C(&l, op);
                    I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                    I(c, KEEL_F32, x[4], x[5], x[6], x[7])->view = k == 1 ? VIEW_TRANSPOSED : VIEW_NONE;
                    P(c, 1, (int64_t[]){k == 3 ? KEEL_BF16 : KEEL_F32}, 0, NULL);
                    c->build = build_mm_bf16, c->tol = 2e-5;
                    c->no_fd = "bf16 rounding of the operands and of dy";
                    static char names[4][96];
                    snprintf(
                        names[k], sizeof names[k], "MUL_MAT(bf16 operands -> %s, [%lld,%lld]x[%lld,%lld], grad rule)",
                        k == 3 ? "bf16" : "f32", (long long)x[0], (long long)x[1], (long long)x[4], (long long)x[5]);
                    c->name = names[k];
                }
            for (int s = 0; s < 11; s++) {
                c = C(&l, op);
                const int64_t *x = mm[s];
                if (op == KEEL_OP_MUL_MAT) {
                    I(c, KEEL_F32, x[0], x[1], x[2], x[3])->view = s == 7 ? VIEW_TRANSPOSED : VIEW_NONE;
                    I(c, KEEL_F32, x[4], x[5], x[6], x[7])->view = s == 8   ? VIEW_PERMUTED
                                                                   : s == 1 ? VIEW_STRIDED
                                                                            : VIEW_NONE;
                } else { /* same sizes, K moved to dim 1; groups of the broadcast case summed */
                    I(c, KEEL_F32, x[1], x[0], x[6], x[7])->view = s == 7 ? VIEW_TRANSPOSED : VIEW_NONE;
                    I(c, KEEL_F32, x[5], x[4], x[6], x[7])->view = s == 1 ? VIEW_STRIDED : VIEW_NONE;
                    P(c, 2, (int64_t[]){x[2], x[3]}, 0, NULL);
                }
            }
            break;
        }
        case KEEL_OP_MUL_MAT_ADD: {
            /* a [K,M,a2,a3], b [K,N,b2,b3], c [M,N,b2,b3]: c laid out as the result (cuda: cuBLASLt's C
             * input) or viewed (cuda: copied into the result first); a broadcast over b (grouped
             * queries) and one weight against every matrix of b; bf16 operands with a float32 addend */
            static const int64_t mm[][8] = {
                {1, 3, 1, 1, 1, 2, 1, 1},        {31, 5, 1, 1, 31, 3, 1, 1}, {1025, 9, 1, 1, 1025, 3, 1, 1},
                {300, 130, 1, 1, 300, 70, 1, 1}, {16, 8, 2, 2, 16, 5, 6, 2}, {64, 48, 1, 1, 64, 40, 3, 2},
                {4, 3, 1, 1, 4, 65537, 1, 1},
            };
            for (int s = 0; s < 7; s++)
                for (int bf = 0; bf < 2; bf++) {
                    const int64_t *x = mm[s];
                    if (bf && s % 2) continue;
                    c = C(&l, op);
                    keel_type ty = bf ? KEEL_BF16 : KEEL_F32;
                    I(c, ty, x[0], x[1], x[2], x[3])->view = s == 3 ? VIEW_TRANSPOSED : VIEW_NONE;
                    I(c, ty, x[4], x[5], x[6], x[7])->view = s == 4 ? VIEW_PERMUTED : VIEW_NONE;
                    I(c, KEEL_F32, x[1], x[5], x[6], x[7])->view = s == 1 || s == 5 ? VIEW_STRIDED : VIEW_NONE;
                    if (bf) {
                        c->keep_types = true, c->tol = 1e-9;
                        P(c, 1, (int64_t[]){KEEL_F32}, 0, NULL);
                    }
                }
            /* bf16 with K <= 32: the DeltaNet gate projections' input gradient (a weight [1024, 16]
             * transposed), N odd, K = 5 with a plain a, M of 1100; and the b and a projections' input
             * gradient at batch 8 x 1024 tokens (1024 x 8192 x 32 with the gradient so far as C), a shape
             * of cuda_lt.cu's LT_PREFS */
            static const int64_t sk[][6] = {{16, 1024, 16, 64, 2, 1},
                                            {16, 64, 16, 333, 1, 1},
                                            {5, 12, 5, 70, 2, 1},
                                            {16, 1100, 16, 40, 1, 1},
                                            {32, 1024, 32, 8192, 1, 1}};
            for (int s = 0; s < 5; s++) {
                const int64_t *x = sk[s];
                c = C(&l, op);
                c->keep_types = true, c->tol = 1e-9;
                if (s == 2)
                    I(c, KEEL_BF16, x[0], x[1], 1, 1);
                else
                    I(c, KEEL_BF16, x[0], x[1], 1, 1)->view = VIEW_TRANSPOSED;
                I(c, KEEL_BF16, x[2], x[3], x[4], x[5]);
                I(c, KEEL_F32, x[1], x[3], x[4], x[5]);
                P(c, 1, (int64_t[]){KEEL_F32}, 0, NULL);
            }
            break;
        }
        case KEEL_OP_CONV1D:
        case KEEL_OP_CONV1D_BACK_INPUT:
        case KEEL_OP_CONV1D_BACK_WEIGHT: {
            /* C, T, B, longest example (a window's worth: one example a column; short: packed), taps;
             * the 6th to 9th dense with C % 4 == 0, the cuda backend's 4-channels-a-thread kernels, the
             * 9th large enough that the weight gradient's chunks of terms (3 each) hold several
             * positions and an example column's end (301) falls inside one; then, dense too, taps of 3
             * and 6 (the cuda kernels keep a window of 4 or 8 taps in registers, the first unused where
             * K is fewer) over tiles of rows (64 in cuda's 4-channel kernel) that split examples */
            static const int64_t sh[][5] = {{1, 5, 1, 5, 4},    {31, 9, 2, 3, 4},      {4097, 3, 1, 3, 4},
                                            {8, 70, 2, 6, 4},   {3, 1, 1, 1, 4},       {16, 40, 3, 100, 4},
                                            {64, 37, 2, 9, 4},  {12, 300, 2, 1000, 4}, {1024, 301, 2, 40, 4},
                                            {64, 50, 2, 20, 3}, {32, 90, 1, 45, 6}};
            for (int s = 0; s < 11; s++) {
                c = C(&l, op);
                if (s == 8) c->no_fd = "large: each backend against ref's backward, proven on the small cases";
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], 1)->view = s == 3 ? VIEW_STRIDED : VIEW_NONE;
                if (op == KEEL_OP_CONV1D_BACK_WEIGHT) {
                    I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], 1);
                    SEG(c, sh[s][1], sh[s][2], sh[s][3]);
                    P(c, 1, (int64_t[]){sh[s][4]}, 0, NULL);
                } else {
                    I(c, KEEL_F32, sh[s][4], sh[s][0], 1, 1)->view = s == 1 ? VIEW_TRANSPOSED : VIEW_NONE;
                    SEG(c, sh[s][1], sh[s][2], sh[s][3]);
                }
            }
            /* the input gradient's bf16 result (mixed precision's DeltaNet input projection dy): the
             * float32 sums rounded once (2e-5); dense (cuda's 4 channels a thread), a viewed dy, a
             * transposed w, the 0.8B's channel count */
            for (int s = 1; op == KEEL_OP_CONV1D_BACK_INPUT && s < 11; s += s < 5 ? 2 : 3) {
                c = C(&l, op);
                c->keep_types = true, c->tol = 2e-5, c->no_fd = "bf16 rounding of the result";
                I(c, KEEL_F32, sh[s][0], sh[s][1], sh[s][2], 1)->view = s == 3 ? VIEW_STRIDED : VIEW_NONE;
                I(c, KEEL_F32, sh[s][4], sh[s][0], 1, 1)->view = s == 1 ? VIEW_TRANSPOSED : VIEW_NONE;
                SEG(c, sh[s][1], sh[s][2], sh[s][3]);
                P(c, 1, (int64_t[]){KEEL_BF16}, 0, NULL);
            }
            break;
        }
        case KEEL_OP_RMS_NORM_W:
        case KEEL_OP_RMS_NORM_W_BACK:
        case KEEL_OP_RMS_NORM_W_BACK_ADD:
        case KEEL_OP_GATED_RMS_NORM:
        case KEEL_OP_GATED_RMS_NORM_BACK: {
            /* row length, rows (3 dims), eps (1e-6 x): the DeltaNet's heads of 128 and the fixture's 24;
             * short, odd and wide rows (1025: past a warp's row on cuda); x and z viewed; eps large;
             * RMS_NORM_W with w and with 1 + w, alternately; rows of 200, 300 and 1024 (the 0.8B's
             * hidden size): cuda's variants that keep up to 8, 16 and 32 elements a lane in registers */
            static const int64_t sh[][5] = {
                {4, 3, 1, 1, 1},        {128, 16, 5, 2, 1},  {24, 4, 7, 2, 1},  {33, 7, 2, 1, 1},  {1025, 3, 1, 1, 1},
                {16, 5, 3, 1, 1000000}, {2, 65537, 1, 1, 1}, {200, 3, 2, 1, 1}, {300, 7, 1, 1, 1}, {1024, 5, 2, 1, 1}};
            for (int s = 0; s < 10; s++) {
                const int64_t *x = sh[s];
                c = C(&l, op);
                if (x[1] > 60000)
                    c->no_fd = "many rows: each backend against ref's backward, proven on the small cases";
                bool gated = op == KEEL_OP_GATED_RMS_NORM || op == KEEL_OP_GATED_RMS_NORM_BACK;
                I(c, KEEL_F32, x[0], x[1], x[2], x[3])->view = s == 3 ? VIEW_STRIDED : VIEW_NONE;
                I(c, KEEL_F32, x[0], 1, 1, 1);
                if (gated) I(c, KEEL_F32, x[0], x[1], x[2], x[3])->view = s == 2 ? VIEW_PERMUTED : VIEW_NONE;
                if (op == KEEL_OP_GATED_RMS_NORM_BACK || op == KEEL_OP_RMS_NORM_W_BACK ||
                    op == KEEL_OP_RMS_NORM_W_BACK_ADD)
                    I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                if (op == KEEL_OP_RMS_NORM_W_BACK_ADD) /* the addend: strided and permuted views among them */
                    I(c, KEEL_F32, x[0], x[1], x[2], x[3])->view = s == 1   ? VIEW_STRIDED
                                                                   : s == 2 ? VIEW_PERMUTED
                                                                            : VIEW_NONE;
                P(c, gated ? 0 : 1, (int64_t[]){s % 2}, 1, (double[]){1e-6 * (double)x[4]});
            }
            { /* rows not one stride apart (dims 1 and 2 swapped): cuda's row copies placed by index */
                bool gated = op == KEEL_OP_GATED_RMS_NORM || op == KEEL_OP_GATED_RMS_NORM_BACK;
                c = C(&l, op);
                I(c, KEEL_F32, 128, 6, 5, 2)->view = VIEW_ROWS_SWAPPED;
                I(c, KEEL_F32, 128, 1, 1, 1);
                if (gated) I(c, KEEL_F32, 128, 6, 5, 2)->view = VIEW_ROWS_SWAPPED;
                if (op == KEEL_OP_GATED_RMS_NORM_BACK || op == KEEL_OP_RMS_NORM_W_BACK ||
                    op == KEEL_OP_RMS_NORM_W_BACK_ADD)
                    I(c, KEEL_F32, 128, 6, 5, 2)->view = VIEW_ROWS_SWAPPED;
                if (op == KEEL_OP_RMS_NORM_W_BACK_ADD) I(c, KEEL_F32, 128, 6, 5, 2)->view = VIEW_ROWS_SWAPPED;
                P(c, gated ? 0 : 1, (int64_t[]){1}, 1, (double[]){1e-6});
            }
            /* the forward's bf16 result (ip1; mixed precision's product operands): the float32 value
             * rounded once (2e-5); the 0.8B's rows of 1024 and heads of 128, a strided x, odd rows */
            for (int s = 1; (op == KEEL_OP_RMS_NORM_W || op == KEEL_OP_GATED_RMS_NORM) && s < 10; s += 2) {
                const int64_t *x = sh[s];
                bool gated = op == KEEL_OP_GATED_RMS_NORM;
                c = C(&l, op);
                c->keep_types = true, c->tol = 2e-5, c->no_fd = "bf16 rounding of the result";
                I(c, KEEL_F32, x[0], x[1], x[2], x[3])->view = s == 3 ? VIEW_STRIDED : VIEW_NONE;
                I(c, KEEL_F32, x[0], 1, 1, 1);
                if (gated) I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                P(c, 2, (int64_t[]){gated ? 0 : 1, KEEL_BF16}, 1, (double[]){1e-6 * (double)x[4]});
            }
            break;
        }
        case KEEL_OP_QK_NORM_ROPE:
        case KEEL_OP_QK_NORM_ROPE_BACK: {
            /* D, H, T, B, n_rot, longest example (0: positions [T] up to 64), theta, eps (1e-6 x),
             * the 1 + w form, view of x: attention's heads of 256 with a quarter rotated and
             * theta 1e7 (the 0.8B's), all rotated, w as is, eps large, a strided view, and more
             * than 65535 rows; then, for the forward, its bf16 result on the same shapes (ip2; mixed
             * precision's attention operands): the float32 value rounded once (2e-5; cuda's
             * row-in-registers kernel, its general one for the strided x, the wide grid) */
            static const int64_t sh[][10] = {
                {256, 8, 5, 2, 64, 3, 10000000, 1, 1, 0}, {32, 4, 7, 2, 32, 0, 10000, 1, 1, 0},
                {24, 2, 9, 1, 8, 0, 10000, 1, 0, 0},      {128, 2, 65, 1, 128, 40, 1000000, 1000000, 1, 0},
                {34, 3, 4, 2, 16, 0, 10000, 1, 1, 1},     {4, 65537, 1, 1, 4, 0, 10000, 1, 1, 0}};
            for (int s = 0; s < (op == KEEL_OP_QK_NORM_ROPE ? 12 : 6); s++) {
                const int64_t *x = sh[s % 6];
                bool bf = s >= 6;
                c = C(&l, op);
                if (bf)
                    c->keep_types = true, c->tol = 2e-5, c->no_fd = "bf16 rounding of the result";
                else if (x[1] > 60000)
                    c->no_fd = "many rows: each backend against ref's backward, proven on the small cases";
                I(c, KEEL_F32, x[0], x[1], x[2], x[3])->view = x[9] ? VIEW_STRIDED : VIEW_NONE;
                I(c, KEEL_F32, x[0], 1, 1, 1)->scale = 0.3;
                if (x[5])
                    SEG(c, x[2], x[3], x[5]);
                else
                    IDX(c, x[2], 1, 64);
                if (op == KEEL_OP_QK_NORM_ROPE_BACK) I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                P(c, bf ? 3 : 2, (int64_t[]){x[8], x[4], KEEL_BF16}, 2, (double[]){1e-6 * (double)x[7], (double)x[6]});
            }
            /* heads of 256, a quarter rotated, rows not one stride apart (dims 1 and 2 swapped) */
            c = C(&l, op);
            I(c, KEEL_F32, 256, 4, 6, 2)->view = VIEW_ROWS_SWAPPED;
            I(c, KEEL_F32, 256, 1, 1, 1)->scale = 0.3;
            IDX(c, 6, 1, 64);
            if (op == KEEL_OP_QK_NORM_ROPE_BACK) I(c, KEEL_F32, 256, 4, 6, 2)->view = VIEW_ROWS_SWAPPED;
            P(c, 2, (int64_t[]){1, 64}, 2, (double[]){1e-6, 10000000.0});
            break;
        }
        case KEEL_OP_GDN_CONV:
        case KEEL_OP_GDN_CONV_BACK: {
            /* C, T, B, K, n (channels of q and of k), head, longest example, eps (1e-6 x), q scale
             * (x 1/8): q, k and v; no v (2n = C); no q or k (n 0); the fixture's (16-channel heads,
             * 32 + 32 + 96) packed and not; the 0.8B model's heads of 128 (dense, C % 4 == 0: the
             * cuda backend's dense path, a lane's 4 channels; as are heads of 32, 64 and 96, a lane's
             * 1, 2 and 3: each its own compiled kernel there); eps large against the squares; a
             * row of 4097 channels; dense with taps of 3 and 6 (cuda's windows of 4 and 8 taps).
             * The input viewed strided, the weight transposed. */
            static const int64_t sh[][9] = {{14, 5, 1, 4, 4, 2, 5, 1, 8},         {40, 9, 2, 4, 16, 8, 4, 1, 3},
                                            {12, 6, 3, 3, 6, 6, 6, 1, 8},         {3, 7, 1, 2, 0, 1, 2, 1, 8},
                                            {160, 70, 2, 4, 32, 16, 30, 1, 2},    {160, 65, 1, 4, 32, 16, 1000, 1, 2},
                                            {768, 33, 2, 4, 256, 128, 9, 1, 1},   {24, 10, 2, 4, 8, 4, 10, 1000000, 8},
                                            {4097, 3, 1, 4, 2048, 1024, 3, 1, 1}, {200, 40, 3, 4, 64, 32, 7, 1, 8},
                                            {256, 20, 2, 4, 64, 64, 1000, 1, 3},  {256, 40, 2, 3, 64, 32, 13, 1, 8},
                                            {192, 37, 2, 6, 64, 64, 1000, 1, 8},  {288, 21, 2, 4, 96, 96, 1000, 1, 8}};
            for (int s = 0; s < (int)(sizeof sh / sizeof sh[0]); s++) {
                const int64_t *x = sh[s];
                c = C(&l, op);
                if (x[0] > 1000) c->no_fd = "large: each backend against ref's backward, proven on the small cases";
                I(c, KEEL_F32, x[0], x[1], x[2], 1)->view = s == 1 ? VIEW_STRIDED : VIEW_NONE;
                I(c, KEEL_F32, x[3], x[0], 1, 1)->view = s == 2 ? VIEW_TRANSPOSED : VIEW_NONE;
                SEG(c, x[1], x[2], x[6]);
                if (op == KEEL_OP_GDN_CONV_BACK) I(c, KEEL_F32, x[0], x[1], x[2], 1);
                P(c, 2, (int64_t[]){x[4], x[5]}, 2, (double[]){1e-6 * (double)x[7], (double)x[8] / 8.0});
            }
            break;
        }
        case KEEL_OP_GDN_GATE:
        case KEEL_OP_GDN_GATE_BACK: {
            /* heads, rows (T, B): the 0.8B model's 16 heads; fewer than 64 rows (cuda sums them in a
             * thread), more than 65535, and 600,000 (cuda's chunks of 2 rows); one head, one row; a
             * wide a (softplus's threshold: x > 20 is x) strided, transposed, A_log and dt_bias viewed
             * strided, dy permuted */
            static const int64_t sh[][3] = {{16, 40, 2}, {4, 7, 3},  {2, 70000, 1}, {2, 600000, 1},
                                            {1, 1, 1},   {31, 5, 2}, {16, 33, 4},   {8, 9, 2}};
            for (int s = 0; s < (int)(sizeof sh / sizeof sh[0]); s++) {
                const int64_t *x = sh[s];
                c = C(&l, op);
                if (x[1] * x[2] > 65535)
                    c->no_fd = "large: each backend against ref's backward, proven on the small cases";
                case_input *a = I(c, KEEL_F32, x[0], x[1], x[2], 1);
                a->view = s == 5 ? VIEW_STRIDED : s == 7 ? VIEW_TRANSPOSED : VIEW_NONE;
                a->scale = s == 6 ? 12.0 : 1.0;
                I(c, KEEL_F32, x[0], 1, 1, 1)->view = s == 1 ? VIEW_STRIDED : VIEW_NONE;
                I(c, KEEL_F32, x[0], 1, 1, 1)->view = s == 5 ? VIEW_STRIDED : VIEW_NONE;
                if (op == KEEL_OP_GDN_GATE_BACK)
                    I(c, KEEL_F32, x[0], x[1], x[2], 1)->view = s == 2 ? VIEW_PERMUTED : VIEW_NONE;
            }
            break;
        }
        case KEEL_OP_GATED_DELTA_NET:
        case KEEL_OP_GATED_DELTA_NET_STATE:
        case KEEL_OP_GATED_DELTA_NET_BACK: {
            /* Dk, Hk, T, B, Dv, Hv, longest example (>= T: one example a column; less: packed) */
            /* Dk = 160 > 128: the cuda kernels' 8-registers-a-lane variant */
            static const int64_t sh[][7] = {{4, 1, 5, 1, 3, 1, 5}, {8, 2, 130, 2, 6, 4, 40}, {16, 1, 65, 1, 16, 2, 65},
                                            {5, 2, 3, 1, 7, 2, 2}, {160, 1, 20, 1, 3, 2, 7}, {8, 1, 70, 2, 9, 1, 1000}};
            for (int s = 0; s < 6; s++) {
                const int64_t *x = sh[s];
                c = C(&l, op);
                case_input *q = I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                case_input *k = I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                q->scale = k->scale = 1.0 / (double)x[0];
                q->view = s == 3 ? VIEW_PERMUTED : VIEW_NONE;
                I(c, KEEL_F32, x[4], x[5], x[2], x[3])->view = s == 3 ? VIEW_STRIDED : VIEW_NONE;
                I(c, KEEL_F32, x[5], x[2], x[3], 1)->dom = DOM_GATE;
                I(c, KEEL_F32, x[5], x[2], x[3], 1)->dom = DOM_UNIT;
                SEG(c, x[2], x[3], x[6]);
                if (op == KEEL_OP_GATED_DELTA_NET_BACK) I(c, KEEL_F32, x[4], x[5], x[2], x[3]);
                if (op == KEEL_OP_GATED_DELTA_NET_STATE) I(c, KEEL_F32, x[4], x[0], x[5], x[3])->scale = 0.3;
            }
            /* The chunked kernels (chunks of 64 steps): lengths around and across chunk edges, the
             * 0.8B model's heads (128) and the fixture's (16 / 24, 2 key heads for 4 value heads),
             * gates down to -30 (scale 20), beta exactly 0 and 1 at random, packed and unpacked.
             * Columns: Dk, Hk, T, B, Dv, Hv, longest example, gate scale, view of q. The long ones
             * skip finite differences (each sample is four float64 runs of the whole recurrence):
             * the small cases above prove ref's backward; here every backend is held to it. */
            static const int64_t ch[][9] = {
                {128, 1, 1, 1, 128, 1, 1, 1, 0},       {128, 1, 63, 1, 128, 1, 1000, 20, 0},
                {128, 1, 64, 1, 128, 2, 1000, 1, 0},   {16, 2, 65, 2, 24, 4, 30, 20, 1},
                {16, 2, 65, 1, 24, 4, 1000, 1, 0},     {16, 2, 129, 3, 24, 4, 70, 1, 0},
                {128, 1, 1024, 1, 128, 1, 300, 20, 0}, {128, 1, 1031, 1, 128, 1, 2000, 1, 1}};
            /* and on the tensor cores (not for decoding), in split TF32 (ip0 1) and in split bf16 (ip0 2,
             * the bf16 mode's variant): T of 1, a whole chunk, GQA with views and packed examples, several
             * chunks and columns, a long permuted one with a partial last chunk (ref and cpu ignore ip0:
             * these cost CI time there, so not all 8). Bounds: split TF32, float32's; split bf16, 16 bits
             * of each operand: about 1e-10 where nothing cancels, 4.5e-8 measured on the backward's T = 1
             * case with inputs whose one scalar dO.u cancels (the label seeds the inputs: those were
             * another label's); one bf16 part alone (8 bits) gave 1e-5 to 2.6e-4. The backward also in ip0
             * 3, the bf16 mode's (the backward's products in one bf16 part; its forward runs ip0 2's
             * kernels): held to the bf16 bound, 1e-4. Not as forward cases: the gradient tier
             * would run ref's float64 backward of each again (ref ignores ip0), half a minute of CI. */
            static const int tc_rows[] = {0, 2, 3, 5, 7};
            int n_ch = op == KEEL_OP_GATED_DELTA_NET_STATE ? 8 : op == KEEL_OP_GATED_DELTA_NET_BACK ? 23 : 18;
            for (int s = 0; s < n_ch; s++) {
                const int64_t *x = ch[s < 8 ? s : tc_rows[(s - 8) % 5]];
                c = C(&l, op);
                if (s >= 8) {
                    int64_t products = s < 13 ? KEEL_GDN_SPLIT_TF32 : s < 18 ? KEEL_GDN_SPLIT_BF16 : KEEL_GDN_BF16_GRAD;
                    P(c, 1, &products, 0, NULL), c->tol = s < 13 ? 1e-10 : s < 18 ? 1e-6 : 1e-4;
                }
                case_input *q = I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                case_input *k = I(c, KEEL_F32, x[0], x[1], x[2], x[3]);
                q->scale = k->scale = 1.0 / sqrt((double)x[0]);
                q->view = x[8] ? VIEW_PERMUTED : VIEW_NONE;
                I(c, KEEL_F32, x[4], x[5], x[2], x[3]);
                case_input *g = I(c, KEEL_F32, x[5], x[2], x[3], 1);
                g->dom = DOM_GATE, g->scale = (double)x[7];
                I(c, KEEL_F32, x[5], x[2], x[3], 1)->dom = DOM_UNIT_EDGES;
                SEG(c, x[2], x[3], x[6]);
                if (op == KEEL_OP_GATED_DELTA_NET_BACK) I(c, KEEL_F32, x[4], x[5], x[2], x[3]);
                if (op == KEEL_OP_GATED_DELTA_NET_STATE) I(c, KEEL_F32, x[4], x[0], x[5], x[3])->scale = 0.3;
                if (x[2] >= 1024) c->no_fd = "long: each backend against ref's backward, proven on the short cases";
            }
            break;
        }
        case KEEL_OP_CROSS_ENTROPY_LOSS:
        case KEEL_OP_CROSS_ENTROPY_LOSS_BACK:
            for (int w = 1; w < N_WIDTHS; w++) {
                c = C(&l, op);
                I(c, KEEL_F32, WIDTHS[w], 3, 2, 1)->scale = 3.0;
                IDX(c, 3, 2, WIDTHS[w]);
                if (op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK) I(c, KEEL_F32, 1, 1, 1, 1)->dom = DOM_POSITIVE;
            }
            c = C(&l, op);
            I(c, KEEL_F32, 3, 65537, 1, 1);
            IDX(c, 65537, 1, 3);
            if (op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK) I(c, KEEL_F32, 1, 1, 1, 1);
            c = C(&l, op);
            I(c, KEEL_F32, 33, 17, 1, 1)->view = VIEW_TRANSPOSED;
            IDX(c, 17, 1, 33);
            if (op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK) I(c, KEEL_F32, 1, 1, 1, 1);
            /* targets with no loss (negative): their own count as the divisor, a divisor given (a
             * global batch's), and every target ignored (a loss of 0, no NaN) */
            for (int k = 0; k < 3; k++) {
                c = C(&l, op);
                I(c, KEEL_F32, k == 1 ? 1025 : 31, 7, 2, 1)->scale = 3.0;
                IDX(c, 7, 2, k == 1 ? 1025 : 31)->dom = DOM_INDEX_OR_IGNORED;
                if (k == 2) c->in[1].index_max = 1, c->in[1].dom = DOM_INDEX_OR_IGNORED;
                if (op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK) I(c, KEEL_F32, 1, 1, 1, 1)->dom = DOM_POSITIVE;
                P(c, 0, NULL, 1, (double[]){k == 1 ? 23.0 : 0.0});
            }
            break;
        case KEEL_OP_LINEAR_CROSS_ENTROPY:
        case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK: {
            /* D, N1, N2, V, chunk (tokens at a time: less than, dividing, not dividing, more than
             * N), divisor (0: the count), views, and bf16 x, W (float32 results; the logits in bf16:
             * even Vs (4-byte pairs on cuda), one over three segments of 4096, and an odd one over two) */
            static const int64_t sh[][6] = {{31, 7, 2, 33, 4, 0},  {16, 5, 1, 1025, 2, 0}, {8, 70, 1, 5, 64, 23},
                                            {64, 3, 2, 300, 6, 0}, {5, 9, 1, 17, 100, 0},  {33, 4, 1, 4097, 3, 7},
                                            {24, 6, 2, 40, 5, 0},  {1, 3, 1, 7, 1, 0},     {12, 5, 1, 4099, 2, 0},
                                            {12, 3, 2, 8194, 4, 0}};
            for (int s = 0; s < 10; s++) {
                const int64_t *x = sh[s];
                bool bf = s == 3 || s == 6 || s >= 8;
                c = C(&l, op);
                keel_type ty = bf ? KEEL_BF16 : KEEL_F32;
                I(c, ty, x[0], x[1], x[2], 1)->view = s == 4 ? VIEW_TRANSPOSED : VIEW_NONE;
                I(c, ty, x[0], x[3], 1, 1)->view = s == 5 ? VIEW_TRANSPOSED : VIEW_NONE;
                c->in[1].scale = 3.0 / sqrt((double)x[0]);
                IDX(c, x[1], x[2], x[3])->dom = s % 2 ? DOM_INDEX_OR_IGNORED : DOM_INDEX;
                if (op == KEEL_OP_LINEAR_CROSS_ENTROPY_BACK) I(c, KEEL_F32, 1, 1, 1, 1)->dom = DOM_POSITIVE;
                P(c, 1, (int64_t[]){x[4]}, 1, (double[]){(double)x[5] + (s == 5 ? 0.5 : 0.0)});
                /* bf16: the logits (float32 sums of exact products) and the backward's g each rounded
                 * once to bf16 on every backend (tensor/convert.h): a backend's float32 sum an ulp from
                 * ref's may round to the other bf16 neighbour, one bf16 ulp (2^-8) off, so the plan's
                 * tier of one bf16 rounding (2e-5), forward and backward. A backend that skips a
                 * rounding is within it too (the cpu without the logits' rounding: loss 5e-7, packed
                 * 1.8e-5): test-model's 1e-7 comparison of the mixed-precision layer pair is what
                 * catches that (27 tensors fail) */
                if (bf) c->keep_types = true, c->tol = 2e-5;
                if (op == KEEL_OP_LINEAR_CROSS_ENTROPY) { /* the same, packed [dx | dW | loss] (ip1): the
                                                           * gradients for dloss 1; the last shape with them
                                                           * skipped (ip2: zeros) */
                    op_case *pc = C(&l, op);
                    c = &l.v[l.n - 2]; /* C may have moved the list */
                    *pc = *c;
                    pc->ip[1] = 1, pc->ip[2] = s == 7, pc->n_ip = 3;
                }
            }
            if (op == KEEL_OP_LINEAR_CROSS_ENTROPY) /* the mixed-precision gradient: through CAST */
                for (int s = 0; s < 2; s++) {
                    c = C(&l, op);
                    I(c, KEEL_F32, 24, 6, 2, 1);
                    I(c, KEEL_F32, 24, 40, 1, 1)->scale = 0.6;
                    IDX(c, 6, 2, 40)->dom = s ? DOM_INDEX_OR_IGNORED : DOM_INDEX;
                    P(c, 1, (int64_t[]){s ? 5 : 12}, 0, NULL);
                    c->build = build_lce_bf16, c->tol = 2e-5, c->no_fd = "bf16 rounding of x and W";
                    c->name = s ? "LINEAR_CROSS_ENTROPY(bf16 x and W by CAST, chunk 5, ignored targets, grad rule)"
                                : "LINEAR_CROSS_ENTROPY(bf16 x and W by CAST, chunk 12, grad rule)";
                }
            /* the packed form's loss (keel_linear_cross_entropy_with_grads): k 0, 1 the loss itself is
             * what the gradient harness differentiates (the seed 1 reaches it: x's and W's gradients are
             * views of the forward's result), k 2, 3 the harness's weighted sum of it (any other dloss:
             * LINEAR_CROSS_ENTROPY_BACK); float32 (finite differences on ref) and bf16 by CAST */
            if (op == KEEL_OP_LINEAR_CROSS_ENTROPY)
                for (int k = 0; k < 4; k++) {
                    bool bf = k % 2;
                    c = C(&l, op);
                    I(c, KEEL_F32, 24, 6, 2, 1);
                    I(c, KEEL_F32, 24, 40, 1, 1)->scale = 0.6;
                    IDX(c, 6, 2, 40)->dom = k < 2 ? DOM_INDEX_OR_IGNORED : DOM_INDEX;
                    P(c, 2, (int64_t[]){k < 2 ? 5 : 12, bf}, 0, NULL);
                    c->build = build_lce_grads, c->loss_out = k < 2;
                    if (bf) c->tol = 2e-5, c->no_fd = "bf16 rounding of x and W";
                    static const char *names[4] = {
                        "LINEAR_CROSS_ENTROPY(packed, the loss differentiated: views, chunk 5, ignored targets)",
                        "LINEAR_CROSS_ENTROPY(packed, bf16 by CAST, the loss differentiated: views, chunk 5, ignored "
                        "targets)",
                        "LINEAR_CROSS_ENTROPY(packed, a weighted loss: the backward op, chunk 12)",
                        "LINEAR_CROSS_ENTROPY(packed, bf16 by CAST, a weighted loss: the backward op, chunk 12)"};
                    c->name = names[k];
                }
            break;
        }
        case KEEL_OP_SUM_SQ: /* two blocks and a tail; a width's rows; an unaligned start (the scalar path) */
            for (int k = 0; k < 4; k++) {
                static const int64_t shape[4][2] = {{1031, 130}, {7, 3}, {4099, 17}, {1031, 130}};
                c = C(&l, op);
                I(c, KEEL_F32, shape[k][0], shape[k][1], 1, 1)->scale = k == 2 ? 1e3 : 1.0;
                c->tol = 1e-13; /* a float64 sum rounded once to float32 */
                if (k == 3) c->build = build_sum_sq_unaligned, c->name = "SUM_SQ(1031 x 130 from element 1)";
            }
            for (int w = 0; w < N_WIDTHS; w += 3) {
                c = C(&l, op);
                I(c, KEEL_F32, WIDTHS[w], 2, 1, 1);
                c->tol = 1e-13;
            }
            break;
        case KEEL_OP_ADAMW:
        case KEEL_OP_ADAMW_SHADOW:
            /* k 0: the norm given, no clipping, every element decayed; 1: the gradients' own SUM_SQ,
             * clipped to 0.5 (their norm is larger), a divisor of 2, a decay of lr x wd = 5e-3 on the
             * first half only (large enough that decaying the rest fails the tolerance);
             * 2: a non-finite norm (SUM_SQ of LOG(0)): nothing may change. ADAMW_SHADOW: the same, and
             * the decayed elements' bf16 copies (the runner checks each is the backend's own updated
             * weight rounded as CAST rounds it, bit for bit, and all within 2e-5 of the oracle's) */
            for (int w = 0; w < N_WIDTHS; w += 2)
                for (int k = 0; k < 3; k++) {
                    /* c0: the first element with a copy (an untied embedding before it has none); n / 4 is a
                     * multiple of 4 for some widths (cuda's 4-wide stores) and not for others */
                    int64_t n = WIDTHS[w] * 3, decay_end = k == 1 ? n / 2 + 1 : n, c0 = k == 1 ? n / 4 : k;
                    c = C(&l, op);
                    I(c, KEEL_F32, WIDTHS[w], 3, 1, 1);
                    I(c, KEEL_F32, WIDTHS[w], 3, 1, 1);
                    I(c, KEEL_F32, WIDTHS[w], 3, 1, 1)->scale = 0.1;
                    I(c, KEEL_F32, WIDTHS[w], 3, 1, 1)->dom = DOM_SMALL;
                    if (k == 0) I(c, KEEL_F32, 1, 1, 1, 1)->dom = DOM_POSITIVE;
                    if (k == 2) I(c, KEEL_F32, 64, 1, 1, 1)->dom = DOM_UNIT_EDGES;
                    if (op == KEEL_OP_ADAMW_SHADOW) {
                        I(c, KEEL_BF16, decay_end - c0, 1, 1, 1);
                        c->keep_types = true; /* the copies are bf16 on every backend */
                        c->copies_exact = k != 2;
                    }
                    P(c, op == KEEL_OP_ADAMW ? 3 : 4, (int64_t[]){3, k == 1 ? 2 : 1, decay_end, c0}, 6,
                      (double[]){k == 1 ? 1e-2 : 1e-3, 0.9, 0.999, 1e-8, k == 1 ? 0.5 : 0.1, k == 1 ? 0.5 : 0.0});
                    c->tol = 1e-9; /* float32 arithmetic on values of about 1 */
                    if (k) c->build = k == 1 ? build_adamw_own_norm : build_adamw_nonfinite;
                    if (k)
                        c->name = k == 1 ? (op == KEEL_OP_ADAMW
                                                ? "ADAMW(s = SUM_SQ(g), clip 0.5, divisor 2, decay on the first half)"
                                                : "ADAMW_SHADOW(s = SUM_SQ(g), clip 0.5, divisor 2, decay on the first "
                                                  "half, copies of its last half)")
                                         : (op == KEEL_OP_ADAMW
                                                ? "ADAMW(s = SUM_SQ(LOG(0 ...)): not finite, nothing changes)"
                                                : "ADAMW_SHADOW(s = SUM_SQ(LOG(0 ...)): not finite, nothing changes)");
                }
            break;
        default:
            break;
        }
    }
    *out = l.v;
    return l.n;
}
