/* keel: the backward rule of every differentiable op. A rule receives the node t and dy (the
 * gradient of t, shaped like t) and hands each source that wants one its contribution. Ops with
 * no rule say why in the op table (ops.c, nograd). */
#include "autodiff/autodiff.h"
#include "ops/ops.h"
#include "util/error.h"

#define WANT(i) keel_grad_wanted(acc, i)
#define ADD(i, x)                                                                                                      \
    do {                                                                                                               \
        if (WANT(i) && keel_grad_add(acc, i, (x))) return -1;                                                          \
    } while (0)

/* dy summed down to the shape of a broadcast source. */
static keel_tensor *reduce_to(keel_ctx *ctx, keel_tensor *dy, const keel_tensor *like) {
    return keel_same_shape(dy, like) ? dy : keel_repeat_back(ctx, dy, like->ne);
}

static keel_tensor *contiguous(keel_ctx *ctx, keel_tensor *x) { return keel_is_contiguous(x) ? x : keel_cont(ctx, x); }

static int r_view(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    (void)ctx; /* (a view of another type lies over a backward op's result, which takes no gradient) */
    return keel_grad_add_window(acc, 0, dy, t->ip[5], t->ip[6], t->ip[7], t->ip[8]);
}
static int r_reshape(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_reshape(ctx, contiguous(ctx, dy), t->src[0]->ne));
    return 0;
}
static int r_permute(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    int inv[4];
    for (int i = 0; i < 4; i++) inv[t->ip[i]] = i;
    ADD(0, keel_cont(ctx, keel_permute(ctx, dy, inv[0], inv[1], inv[2], inv[3])));
    return 0;
}
static int r_transpose(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    (void)t;
    ADD(0, keel_cont(ctx, keel_transpose(ctx, dy)));
    return 0;
}
/* a copy's gradient to source i: dy, or across types (CPY, CAST) dy in the source's gradient type */
static int copied_grad(keel_ctx *ctx, keel_tensor *t, int i, keel_tensor *dy, keel_grad_acc *acc) {
    keel_type want = keel_grad_type(t->src[i]->type);
    ADD(i, dy->type == want ? contiguous(ctx, dy) : keel_cast(ctx, dy, want));
    return 0;
}
static int r_copy(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    return copied_grad(ctx, t, 0, dy, acc);
}
/* the optimizer's bf16 copy of src1: src1's gradient as from the CAST it stands for */
static int r_shadow(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    return copied_grad(ctx, t, 1, dy, acc);
}
static int r_get_rows(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_get_rows_back(ctx, dy, t->src[1], t->src[0]->ne[1]));
    return 0;
}
static keel_tensor *window_view(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy) {
    const keel_tensor *b = t->src[1];
    return keel_cont(
        ctx, keel_view_4d(ctx, dy, b->ne[0], b->ne[1], b->ne[2], b->ne[3], t->ip[0], t->ip[1], t->ip[2], t->ip[3]));
}
static int r_acc(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, dy);
    ADD(1, window_view(ctx, t, dy));
    return 0;
}
static int r_set(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    if (WANT(0))
        ADD(0, keel_set(ctx, dy, keel_zeros_like(ctx, t->src[1]), t->ip[0], t->ip[1], t->ip[2], t->ip[3], false));
    ADD(1, window_view(ctx, t, dy));
    return 0;
}
static int r_repeat(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_repeat_back(ctx, dy, t->src[0]->ne));
    return 0;
}
static int r_repeat_back(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_repeat(ctx, dy, t->src[0]->ne));
    return 0;
}
static int r_concat(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    keel_tensor *a = t->src[0], *b = t->src[1];
    int d = (int)t->ip[0];
    ADD(0, keel_cont(ctx, keel_view(ctx, dy, a->ne, dy->nb, 0)));
    ADD(1, keel_cont(ctx, keel_view(ctx, dy, b->ne, dy->nb, a->ne[d] * dy->nb[d])));
    return 0;
}
static int r_add(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, dy);
    ADD(1, reduce_to(ctx, dy, t->src[1]));
    return 0;
}
static int r_sub(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, dy);
    if (WANT(1)) ADD(1, reduce_to(ctx, keel_neg(ctx, dy), t->src[1]));
    return 0;
}
static int r_mul(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    if (WANT(0)) ADD(0, keel_mul(ctx, dy, t->src[1]));
    if (WANT(1)) ADD(1, reduce_to(ctx, keel_mul(ctx, dy, t->src[0]), t->src[1]));
    return 0;
}
static int r_div(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    if (WANT(0)) ADD(0, keel_div(ctx, dy, t->src[1]));
    if (WANT(1)) /* d(a/b)/db = -(a/b)/b */
        ADD(1, reduce_to(ctx, keel_neg(ctx, keel_div(ctx, keel_mul(ctx, dy, t), t->src[1])), t->src[1]));
    return 0;
}
static int r_scale(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_scale(ctx, dy, t->fp[0], 0.0));
    return 0;
}
static int r_sqr(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_mul(ctx, dy, keel_scale(ctx, t->src[0], 2.0, 0.0)));
    return 0;
}
static int r_sqrt(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_div(ctx, keel_scale(ctx, dy, 0.5, 0.0), t));
    return 0;
}
static int r_exp(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_mul(ctx, dy, t));
    return 0;
}
static int r_log(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_div(ctx, dy, t->src[0]));
    return 0;
}
static int r_neg(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    (void)t;
    ADD(0, keel_neg(ctx, dy));
    return 0;
}
static int r_silu(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_op_new(ctx, KEEL_OP_SILU_BACK, (keel_tensor *const[]){t->src[0], dy}, 2, NULL, 0, NULL, 0));
    return 0;
}
/* A packed backward result's parts, end to end, to sources 0 .. n-1: part i shaped like source i */
static int add_parts(keel_ctx *ctx, keel_tensor *t, keel_tensor *pk, int n, keel_grad_acc *acc) {
    if (!pk) return -1;
    int64_t es = (int64_t)keel_type_size(pk->type), at = 0;
    for (int i = 0; i < n; i++) {
        const keel_tensor *x = t->src[i];
        if (WANT(i))
            ADD(i, keel_view_4d(ctx, pk, x->ne[0], x->ne[1], x->ne[2], x->ne[3], x->ne[0] * es,
                                x->ne[0] * x->ne[1] * es, x->ne[0] * x->ne[1] * x->ne[2] * es, at * es));
        at += keel_nelements(x);
    }
    return 0;
}
/* d gate = silu'(gate) (dy * up), d up = dy * silu(gate): one op for both, viewed apart; both in
 * bf16 where both go only to bf16 products (mixed precision's gate and up projections): the bits of
 * the float32 ones and the CASTs of their products' rules, in half the bytes */
static int r_swiglu(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    int64_t bf = keel_grad_bf16_ok(acc, 0) && keel_grad_bf16_ok(acc, 1) && dy->type == KEEL_F32 ? KEEL_BF16 : 0;
    return add_parts(ctx, t,
                     keel_op_new(ctx, KEEL_OP_SWIGLU_BACK, (keel_tensor *const[]){t->src[0], t->src[1], dy}, 3,
                                 (int64_t[]){bf}, 1, NULL, 0),
                     2, acc);
}
/* dy * (y * (1 - y)) in one op, the bits of the SCALE and two MULs this rule made before */
static int r_sigmoid(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_sigmoid_back(ctx, t, dy));
    return 0;
}
/* dx and dgate from one op, viewed apart: MUL's rule's products and SIGMOID_BACK, their bits */
static int r_sigmoid_mul(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    return add_parts(ctx, t,
                     keel_op_new(ctx, KEEL_OP_SIGMOID_MUL_BACK, (keel_tensor *const[]){t->src[0], t->src[1], dy}, 3,
                                 NULL, 0, NULL, 0),
                     2, acc);
}
/* da, dA_log and ddt_bias from one op, viewed apart (the bits of the ADD, SOFTPLUS, EXP, NEG and
 * MUL rules' ops, which made ten nodes) */
static int r_gdn_gate(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    return add_parts(ctx, t,
                     keel_op_new(ctx, KEEL_OP_GDN_GATE_BACK,
                                 (keel_tensor *const[]){t->src[0], t->src[1], t->src[2], dy}, 4, NULL, 0, NULL, 0),
                     3, acc);
}
static int r_softplus(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_mul(ctx, dy, keel_sigmoid(ctx, t->src[0])));
    return 0;
}
/* the same mask and scale applied to dy: DROPOUT with the forward's parameters (its counter is
 * set with the forward's by keel_dropout_set_counter) */
static int r_dropout(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_op_new(ctx, KEEL_OP_DROPOUT, (keel_tensor *const[]){dy}, 1, t->ip, 4, t->fp, 1));
    return 0;
}
static int r_sum(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    keel_tensor *a = t->src[0];
    keel_tensor *d = t->op == KEEL_OP_MEAN ? keel_scale(ctx, dy, 1.0 / (double)a->ne[0], 0.0) : dy;
    ADD(0, keel_repeat(ctx, d, a->ne));
    return 0;
}
/* dy's bf16 copy where the norm's backward that made dy made one (norm_bf16_part): dy is the dx part
 * (offset 0, in order) of an RMS_NORM_W_BACK(_ADD) with its bf16 part, dx rounded as CAST rounds it,
 * which follows dx in the packed result; else NULL */
static keel_tensor *bf16_copy_of(keel_ctx *ctx, keel_tensor *dy) {
    keel_tensor *p = dy->op == KEEL_OP_VIEW ? dy->src[0] : NULL;
    if (!p || (p->op != KEEL_OP_RMS_NORM_W_BACK && p->op != KEEL_OP_RMS_NORM_W_BACK_ADD) || p->ip[1] != KEEL_BF16 ||
        dy->ip[8] != 0 || dy->type != KEEL_F32 || !keel_is_contiguous(dy) ||
        keel_nelements(dy) != keel_nelements(p->src[0]))
        return NULL;
    return keel_view_4d_as(ctx, p, KEEL_BF16, dy->ne[0], dy->ne[1], dy->ne[2], dy->ne[3], dy->ne[0] * 2,
                           dy->ne[0] * dy->ne[1] * 2, dy->ne[0] * dy->ne[1] * dy->ne[2] * 2,
                           keel_nelements(dy) * (int64_t)sizeof(float));
}
static int r_mul_mat(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    keel_tensor *a = t->src[0], *b = t->src[1];
    if (a->type == KEEL_BF16) { /* mixed precision: dy as a bf16 operand, the gradients float32 sums */
        keel_tensor *d16 = dy->type == KEEL_BF16 ? dy : bf16_copy_of(ctx, dy);
        if (!d16) d16 = keel_cast(ctx, dy, KEEL_BF16);
        if (WANT(0)) ADD(0, keel_out_prod_to(ctx, b, d16, a->ne[2], a->ne[3], KEEL_F32));
        if (WANT(1)) ADD(1, keel_mul_mat_to(ctx, keel_transpose(ctx, a), d16, KEEL_F32));
        return 0;
    }
    /* da[k,m] = sum_n b[k,n] dy[m,n], over each group of broadcast matrices */
    if (WANT(0)) ADD(0, keel_out_prod(ctx, b, dy, a->ne[2], a->ne[3]));
    /* db[k,n] = sum_m a[k,m] dy[m,n]: the product reads a transposed through the view's strides
     * (every backend's MUL_MAT takes any strides), so no transposed copy of a weight is made */
    if (WANT(1)) ADD(1, keel_mul_mat(ctx, keel_transpose(ctx, a), dy));
    return 0;
}
/* a b + c: the product's gradients, and c's is dy itself (as ADD's) */
static int r_mul_mat_add(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    if (r_mul_mat(ctx, t, dy, acc)) return -1;
    if (WANT(2)) ADD(2, dy);
    return 0;
}
static int r_out_prod(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    keel_tensor *a = t->src[0], *b = t->src[1];
    /* da[i,k] = sum_j dy[i,j] b[j,k];  db[j,k] = sum_i dy[i,j] a[i,k] */
    if (WANT(0)) ADD(0, keel_mul_mat(ctx, keel_transpose(ctx, dy), b));
    if (WANT(1)) ADD(1, keel_mul_mat(ctx, dy, a));
    return 0;
}
/* The gradient of n elements of a packed result t from byte `offset` on, from dy, the gradient of the
 * whole result, where only those elements are read: the form the accumulator gives it then, an ACC
 * of their gradient (of t's type, contiguous, in order) into zeros (keel_grad_add_window); NULL for
 * any other. */
static keel_tensor *packed_part_grad(const keel_tensor *t, keel_tensor *dy, int64_t offset, int64_t n) {
    if (dy->op != KEEL_OP_ACC || dy->src[0]->op != KEEL_OP_FILL || dy->src[0]->fp[0] != 0.0 || dy->ip[3] != offset)
        return NULL;
    keel_tensor *x = dy->src[1];
    if (keel_nelements(x) != n || x->type != t->type || !keel_is_contiguous(x)) return NULL;
    for (int d = 1; d < 4; d++) /* the window's strides those of x: its elements in order */
        if (x->ne[d] > 1 && dy->ip[d - 1] != x->nb[d]) return NULL;
    return x;
}
/* The gradient of the loss element of a packed LINEAR_CROSS_ENTROPY (ip1): its last element */
static keel_tensor *packed_loss_grad(const keel_tensor *t, keel_tensor *dy) {
    return packed_part_grad(t, dy, (keel_nelements(t) - 1) * (int64_t)keel_type_size(t->type), 1);
}
static int r_linear_ce(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    keel_tensor *x = t->src[0], *w = t->src[1], *pk;
    if (t->ip[1]) { /* the result holds the gradients for a unit dloss: views of it when dloss is the seed, 1 */
        if (!(dy = packed_loss_grad(t, dy)))
            return keel_fail("'%s' (LINEAR_CROSS_ENTROPY with gradients): only its loss, the last element, is "
                             "differentiable, and a gradient reaches its other elements (differentiate the loss "
                             "view, or build keel_linear_cross_entropy)",
                             t->name);
        pk = dy->op == KEEL_OP_FILL && dy->fp[0] == 1.0 ? t : NULL;
    } else {
        pk = NULL;
    }
    if (!pk)
        pk = keel_op_new(ctx, KEEL_OP_LINEAR_CROSS_ENTROPY_BACK, (keel_tensor *const[]){x, w, t->src[2], dy}, 4, t->ip,
                         1, t->fp, 1);
    if (!pk) return -1;
    int64_t es = (int64_t)keel_type_size(pk->type), nx = keel_nelements(x);
    if (WANT(0))
        ADD(0, keel_view_4d(ctx, pk, x->ne[0], x->ne[1], x->ne[2], x->ne[3], x->ne[0] * es, x->ne[0] * x->ne[1] * es,
                            nx * es, 0));
    if (WANT(1)) ADD(1, keel_view_2d(ctx, pk, w->ne[0], w->ne[1], w->ne[0] * es, nx * es));
    return 0;
}
static int r_norm(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    int back = t->op == KEEL_OP_RMS_NORM ? KEEL_OP_RMS_NORM_BACK : KEEL_OP_L2_NORM_BACK;
    ADD(0, keel_op_new(ctx, back, (keel_tensor *const[]){t->src[0], dy}, 2, NULL, 0, t->fp, 1));
    return 0;
}
static int r_soft_max(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_op_new(ctx, KEEL_OP_SOFT_MAX_BACK, (keel_tensor *const[]){t, dy}, 2, NULL, 0, t->fp, 1));
    return 0;
}
static int r_rope(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_op_new(ctx, KEEL_OP_ROPE_BACK, (keel_tensor *const[]){dy, t->src[1]}, 2, t->ip, 1, t->fp, 1));
    return 0;
}
/* The bf16 part of the plain and the gated norm's backward (ip1), where a bf16 product's rule would
 * otherwise CAST a float32 part, so that it reads the bf16 values made with the float32 ones, the same
 * bits without a pass over the float32 tensor: the gated norm's dz where z goes only to a bf16
 * product (the DeltaNet's z projection), dz then in bf16 alone; and a copy of the plain norm's dx
 * where x is a bf16 product plus the residual (MUL_MAT_ADD), the residual stream, whose rule reads
 * the copy (bf16_copy_of) while dx goes on in float32 to the residual before it. */
static int64_t norm_bf16_part(const keel_tensor *t, keel_grad_acc *acc) {
    const keel_tensor *x = t->src[0];
    if (x->type != KEEL_F32 || t->op == KEEL_OP_QK_NORM_ROPE) return 0;
    if (t->op == KEEL_OP_GATED_RMS_NORM) return keel_grad_bf16_ok(acc, 2) ? KEEL_BF16 : 0;
    return WANT(0) && x->op == KEEL_OP_MUL_MAT_ADD && x->src[0]->type == KEEL_BF16 ? KEEL_BF16 : 0;
}
/* RMS_NORM_W, GATED_RMS_NORM and QK_NORM_ROPE: one backward op for dx (and dz) and dw. The first two
 * sum dw themselves, as REPEAT_BACK sums MUL's products over rows (no tensor of the products, no pass
 * to read it back); QK_NORM_ROPE_BACK gives the terms, which REPEAT_BACK sums (for the 1 + w form,
 * SCALE's rule's dw * 1 + 0 only where no sum was made: see below). Where x has a gradient so far (a
 * residual stream: the layer's output passes it back), the plain norm's backward adds it to dx as it
 * writes dx (RMS_NORM_W_BACK_ADD), the bits of the ADD keel_grad_add would make, without that pass
 * over three tensors of the stream's size. */
static int r_norm_w(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    bool gated = t->op == KEEL_OP_GATED_RMS_NORM, rope = t->op == KEEL_OP_QK_NORM_ROPE, three = gated || rope;
    keel_tensor *x = t->src[0], *w = t->src[1], *so_far = three ? NULL : keel_grad_so_far(acc, 0);
    keel_tensor *src[4] = {x, w, three ? t->src[2] : dy, three ? dy : so_far};
    int back = gated    ? KEEL_OP_GATED_RMS_NORM_BACK
               : rope   ? KEEL_OP_QK_NORM_ROPE_BACK
               : so_far ? KEEL_OP_RMS_NORM_W_BACK_ADD
                        : KEEL_OP_RMS_NORM_W_BACK;
    int64_t bf = norm_bf16_part(t, acc), ips[2] = {t->ip[0], bf}; /* QK_NORM_ROPE's: its own (ip1 n_rot) */
    keel_tensor *pk = keel_op_new(ctx, back, src, three || so_far ? 4 : 3, rope ? t->ip : ips, 2, t->fp, rope ? 2 : 1);
    if (!pk) return -1;
    int64_t es = (int64_t)keel_type_size(pk->type), n = keel_nelements(x), np = gated ? 3 : 2;
    keel_tensor *part[3];
    for (int k = 0; k < (rope ? np : np - 1); k++) /* the parts of x's shape (dw: below), dz maybe bf16 */
        part[k] = gated && k == 1 && bf
                      ? keel_view_4d_as(ctx, pk, KEEL_BF16, x->ne[0], x->ne[1], x->ne[2], x->ne[3], x->ne[0] * 2,
                                        x->ne[0] * x->ne[1] * 2, x->ne[0] * x->ne[1] * x->ne[2] * 2, n * es)
                      : keel_view_4d(ctx, pk, x->ne[0], x->ne[1], x->ne[2], x->ne[3], x->ne[0] * es,
                                     x->ne[0] * x->ne[1] * es, x->ne[0] * x->ne[1] * x->ne[2] * es, k * n * es);
    if (so_far) {
        if (keel_grad_set(acc, 0, part[0])) return -1;
    } else if (WANT(0)) {
        ADD(0, part[0]);
    }
    if (WANT(1)) {
        /* the 1 + w form: SCALE's rule passes dw on as dw * 1 + 0, whose only effect is -0 -> +0; sums
         * over rows (the backward op's own, a REPEAT_BACK's) start from +0 on every backend, so they hold
         * no -0 and that SCALE (a launch a norm, tens a step) is left out after one: the same bits (a
         * NaN's payload aside). The op's own dw is copied out of its packed result here: a weight's
         * gradient that is a view gets that copy at the graph's end, which would keep the whole packed
         * result (dx, dz) alive until then (3.5 GiB more at the 0.8B's bf16 peak with recompute full). */
        keel_tensor *dw =
            rope ? reduce_to(ctx, part[1], w) /* else the packed result's last w values */
                 : keel_cont(ctx, keel_view_4d(ctx, pk, w->ne[0], w->ne[1], w->ne[2], w->ne[3], w->ne[0] * es,
                                               w->ne[0] * w->ne[1] * es, w->ne[0] * w->ne[1] * w->ne[2] * es,
                                               (keel_nelements(pk) - keel_nelements(w)) * es));
        ADD(1, t->ip[0] && rope && dw->op != KEEL_OP_REPEAT_BACK ? keel_scale(ctx, dw, 1.0, 0.0) : dw);
    }
    if (gated && WANT(2)) ADD(2, part[1]);
    return 0;
}
/* CONV1D's gradients given the gradient du of its output (x, w, pos: its sources); x's in bf16
 * where it goes only to a bf16 product (the DeltaNet's input projection) */
static int conv1d_grads(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos, keel_tensor *du,
                        keel_grad_acc *acc) {
    int64_t bf = keel_grad_bf16_ok(acc, 0) && du->type == KEEL_F32 ? KEEL_BF16 : 0;
    if (WANT(0))
        ADD(0, keel_op_new(ctx, KEEL_OP_CONV1D_BACK_INPUT, (keel_tensor *const[]){du, w, pos}, 3, (int64_t[]){bf}, 1,
                           NULL, 0));
    if (WANT(1))
        ADD(1, keel_op_new(ctx, KEEL_OP_CONV1D_BACK_WEIGHT, (keel_tensor *const[]){x, du, pos}, 3,
                           (int64_t[]){w->ne[0]}, 1, NULL, 0));
    return 0;
}
static int r_conv1d(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    return conv1d_grads(ctx, t->src[0], t->src[1], t->src[2], dy, acc);
}
/* the conv output's gradient (GDN_CONV_BACK), then CONV1D's on it */
static int r_gdn_conv(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    keel_tensor *x = t->src[0], *w = t->src[1], *pos = t->src[2];
    keel_tensor *du =
        keel_op_new(ctx, KEEL_OP_GDN_CONV_BACK, (keel_tensor *const[]){x, w, pos, dy}, 4, t->ip, 2, t->fp, 2);
    return du ? conv1d_grads(ctx, x, w, pos, du, acc) : -1;
}
static int r_gdn(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    keel_tensor *q = t->src[0], *v = t->src[2];
    int64_t Dk = q->ne[0], Hk = q->ne[1], T = q->ne[2], B = q->ne[3], Dv = v->ne[0], Hv = v->ne[1], r = Hv / Hk;
    keel_tensor *src[7] = {t->src[0], t->src[1], t->src[2], t->src[3], t->src[4], t->src[5], dy};
    keel_tensor *pk = keel_op_new(ctx, KEEL_OP_GATED_DELTA_NET_BACK, src, 7, t->ip, 1, NULL, 0);
    if (!pk) return -1;
    /* a token's row of the packed gradient holds its dq, dk, dv (keel_gdn_back_layout): windows of
     * it, read where they lie */
    keel_gdn_back_layout L = keel_gdn_back_layout_of(Dk, Dv, Hv, T, B);
    int64_t es = (int64_t)keel_type_size(pk->type), ng = Hv * T * B;
    for (int which = 0; which < 2; which++) { /* dq, dk: per value head, summed over each key head's group */
        if (!WANT(which)) continue;
        keel_tensor *sum;
        if (r == 1) {
            sum = keel_view_4d(ctx, pk, Dk, Hv, T, B, Dk * es, L.row * es, L.row * T * es, which * L.dk * es);
        } else { /* value head hv = hk*r + j: a key head's r value heads lie side by side in a token's row,
                  * so [Dk, r, Hk, T*B] is a view of the packed result; REPEAT_BACK sums over j in
                  * order in float64 (the sums of the two CONTs and SUM_ROWS it replaces, without them) */
            keel_tensor *g4 =
                keel_view_4d(ctx, pk, Dk, r, Hk, T * B, Dk * es, r * Dk * es, L.row * es, which * L.dk * es);
            sum = keel_reshape_4d(ctx, keel_repeat_back(ctx, g4, (const int64_t[]){Dk, 1, Hk, T * B}), Dk, Hk, T, B);
        }
        ADD(which, sum);
    }
    if (WANT(2)) ADD(2, keel_view_4d(ctx, pk, Dv, Hv, T, B, Dv * es, L.row * es, L.row * T * es, L.dv * es));
    /* dg and dbeta are contiguous blocks of it: read where they lie, as dv is */
    if (WANT(3)) ADD(3, keel_view_4d(ctx, pk, Hv, T, B, 1, Hv * es, Hv * T * es, ng * es, L.dg * es));
    if (WANT(4)) ADD(4, keel_view_4d(ctx, pk, Hv, T, B, 1, Hv * es, Hv * T * es, ng * es, L.db * es));
    return 0;
}
/* FLASH_ATTN: one backward op for dq, dk and dv from the whole packed gradient [do | dlse], or from do
 * alone where only o is read (the model's case: no zero FILL of [do | dlse] and ACC of do into it,
 * 0.07 ms a layer at the 0.8B shape, batch 8) */
static int r_flash_attn(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    const keel_tensor *v = t->src[2];
    keel_tensor *d_o = packed_part_grad(t, dy, 0, v->ne[0] * t->src[0]->ne[1] * t->src[0]->ne[2] * t->src[0]->ne[3]);
    keel_tensor *src[6] = {t->src[0], t->src[1], t->src[2], t->src[3], t, d_o ? d_o : contiguous(ctx, dy)};
    keel_tensor *pk = keel_op_new(ctx, KEEL_OP_FLASH_ATTN_BACK, src, 6, t->ip, 1, t->fp, 1);
    if (!pk) return -1;
    int64_t es = (int64_t)keel_type_size(pk->type), at = 0;
    for (int i = 0; i < 3; i++) {
        const keel_tensor *x = t->src[i];
        keel_tensor *g = WANT(i) ? keel_view_4d(ctx, pk, x->ne[0], x->ne[1], x->ne[2], x->ne[3], x->ne[0] * es,
                                                x->ne[0] * x->ne[1] * es, x->ne[0] * x->ne[1] * x->ne[2] * es, at * es)
                                 : NULL;
        /* bf16 sources take float32 gradients (as the products' rule gives them; the oracle's mixed
         * runs compute in float64 and round here) */
        if (g && g->type != keel_grad_type(x->type)) g = keel_cast(ctx, g, keel_grad_type(x->type));
        if (WANT(i)) ADD(i, g);
        at += keel_nelements(x);
    }
    return 0;
}
static int r_cross_entropy(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc) {
    ADD(0, keel_op_new(ctx, KEEL_OP_CROSS_ENTROPY_LOSS_BACK, (keel_tensor *const[]){t->src[0], t->src[1], dy}, 3, NULL,
                       0, t->fp, 1)); /* the loss's divisor */
    return 0;
}

static const keel_grad_rule RULES[KEEL_OP_COUNT] = {
    [KEEL_OP_VIEW] = r_view,
    [KEEL_OP_RESHAPE] = r_reshape,
    [KEEL_OP_PERMUTE] = r_permute,
    [KEEL_OP_TRANSPOSE] = r_transpose,
    [KEEL_OP_CPY] = r_copy,
    [KEEL_OP_CONT] = r_copy,
    [KEEL_OP_DUP] = r_copy,
    [KEEL_OP_CAST] = r_copy,
    [KEEL_OP_SHADOW] = r_shadow,
    [KEEL_OP_GET_ROWS] = r_get_rows,
    [KEEL_OP_ACC] = r_acc,
    [KEEL_OP_SET] = r_set,
    [KEEL_OP_REPEAT] = r_repeat,
    [KEEL_OP_REPEAT_BACK] = r_repeat_back,
    [KEEL_OP_CONCAT] = r_concat,
    [KEEL_OP_ADD] = r_add,
    [KEEL_OP_SUB] = r_sub,
    [KEEL_OP_MUL] = r_mul,
    [KEEL_OP_DIV] = r_div,
    [KEEL_OP_SCALE] = r_scale,
    [KEEL_OP_SQR] = r_sqr,
    [KEEL_OP_SQRT] = r_sqrt,
    [KEEL_OP_EXP] = r_exp,
    [KEEL_OP_LOG] = r_log,
    [KEEL_OP_NEG] = r_neg,
    [KEEL_OP_SUM] = r_sum,
    [KEEL_OP_SUM_ROWS] = r_sum,
    [KEEL_OP_MEAN] = r_sum,
    [KEEL_OP_MUL_MAT] = r_mul_mat,
    [KEEL_OP_MUL_MAT_ADD] = r_mul_mat_add,
    [KEEL_OP_LINEAR_CROSS_ENTROPY] = r_linear_ce,
    [KEEL_OP_OUT_PROD] = r_out_prod,
    [KEEL_OP_RMS_NORM] = r_norm,
    [KEEL_OP_L2_NORM] = r_norm,
    [KEEL_OP_SOFT_MAX] = r_soft_max,
    [KEEL_OP_SOFT_MAX_CAUSAL] = r_soft_max, /* masked entries are 0 in y: SOFT_MAX_BACK needs no mask */
    [KEEL_OP_FLASH_ATTN] = r_flash_attn,
    [KEEL_OP_ROPE] = r_rope,
    [KEEL_OP_SILU] = r_silu,
    [KEEL_OP_SWIGLU] = r_swiglu,
    [KEEL_OP_SIGMOID] = r_sigmoid,
    [KEEL_OP_SOFTPLUS] = r_softplus,
    [KEEL_OP_GDN_GATE] = r_gdn_gate,
    [KEEL_OP_SIGMOID_MUL] = r_sigmoid_mul,
    [KEEL_OP_DROPOUT] = r_dropout,
    [KEEL_OP_CONV1D] = r_conv1d,
    [KEEL_OP_RMS_NORM_W] = r_norm_w,
    [KEEL_OP_GATED_RMS_NORM] = r_norm_w,
    [KEEL_OP_QK_NORM_ROPE] = r_norm_w,
    [KEEL_OP_GDN_CONV] = r_gdn_conv,
    [KEEL_OP_GATED_DELTA_NET] = r_gdn,
    [KEEL_OP_CROSS_ENTROPY_LOSS] = r_cross_entropy,
};

keel_grad_rule keel_grad_rule_of(int op) { return op >= 0 && op < KEEL_OP_COUNT ? RULES[op] : NULL; }
