#include "unit.h"

/* The gradient through a VIEW is a real zero FILL plus an in-place ACC into the window; inf or NaN
 * outside the window must not leak into the gradient (x*0 would turn inf into NaN). */
static void view_gradient_is_fill_plus_acc(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 8, 4), "x"), KEEL_FLAG_PARAM);
    keel_tensor *v = keel_view_2d(ctx, x, 8, 2, x->nb[1], x->nb[1]); /* rows 1 and 2 */
    keel_tensor *loss = keel_sum(ctx, keel_sqr(ctx, v));
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), 0);
    keel_tensor *gx = keel_graph_find(g, "grad.x");
    assert_non_null(gx);
    assert_ptr_equal(gx, keel_graph_grad(g, x));
    assert_int_equal(gx->op, KEEL_OP_ACC);
    assert_int_equal(gx->ip[4], 1); /* in place */
    assert_int_equal(gx->src[0]->op, KEEL_OP_FILL);
    double xv[32];
    for (int i = 0; i < 32; i++) xv[i] = i < 8 || i >= 24 ? INFINITY : 0.5 * i;
    double *vals[1] = {xv};
    keel_tensor *leaves[1] = {x};
    for (int b = 0; b < 2; b++) {
        double *r = run_graph(b ? "ref" : "cpu", g, leaves, vals, 1, gx);
        for (int i = 0; i < 32; i++) assert_true(r[i] == (i < 8 || i >= 24 ? 0.0 : 2 * xv[i]));
        free(r);
    }
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* A window of a bf16 tensor: its strides are in bf16 bytes, its gradient float32, so the window goes
 * into the gradient at twice them. x -> bf16 -> elements 1 and 5 of rows 1 and 2 (a strided window,
 * shape [1, 2, 2]) -> float32 -> sum of squares: dx = 2 x there, 0 elsewhere (the values exact in
 * bf16). With the strides left in bf16 bytes the ACC writes other elements. */
static void bf16_view_gradient(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 8, 4), "x"), KEEL_FLAG_PARAM);
    keel_tensor *b = keel_cast(ctx, x, KEEL_BF16);
    int64_t e = b->nb[0], row = b->nb[1]; /* 2 and 16 bytes */
    keel_tensor *v = keel_view_4d(ctx, b, 1, 2, 2, 1, 4 * e, row, 2 * row, row + e);
    keel_tensor *loss = keel_sum(ctx, keel_sqr(ctx, keel_cast(ctx, v, KEEL_F32)));
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), 0);
    keel_tensor *gx = keel_graph_grad(g, x);
    assert_non_null(gx);
    assert_int_equal(gx->type, KEEL_F32);
    double xv[32];
    for (int i = 0; i < 32; i++) xv[i] = 0.25 * (i - 13);
    double *vals[1] = {xv};
    keel_tensor *leaves[1] = {x};
    for (int be = 0; be < 2; be++) {
        double *r = run_graph(be ? "ref" : "cpu", g, leaves, vals, 1, gx);
        for (int i = 0; i < 32; i++) { /* elements 1 and 5 of rows 1 and 2: 9, 13, 17, 21 */
            bool in = i >= 8 && i < 24 && (i % 8 == 1 || i % 8 == 5);
            assert_true(r[i] == (in ? 2 * xv[i] : 0.0));
        }
        free(r);
    }
    keel_graph_free(g);
    /* a window that starts inside an element has no place in the float32 gradient: refused, named */
    keel_tensor *odd = keel_view_4d(ctx, b, 1, 2, 2, 1, 4 * e, row, 2 * row, row + 1);
    keel_tensor *l2 = keel_sum(ctx, keel_sqr(ctx, keel_cast(ctx, odd, KEEL_F32)));
    g = keel_graph_build(ctx, &l2, 1);
    assert_int_not_equal(keel_build_backward(g, l2), 0);
    assert_non_null(strstr(keel_last_error(), "not whole 2-byte elements"));
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* A tensor used several times sums its contributions: d/dx (x*x + x) = 2x + 1. */
static void multiple_uses_sum(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_1d(ctx, KEEL_F32, 5), "x"), KEEL_FLAG_PARAM);
    keel_tensor *loss = keel_sum(ctx, keel_add(ctx, keel_mul(ctx, x, x), x));
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), 0);
    double xv[5] = {-2, -0.5, 0, 1.5, 3};
    double *vals[1] = {xv};
    keel_tensor *leaves[1] = {x};
    double *r = run_graph("cpu", g, leaves, vals, 1, keel_graph_grad(g, x));
    for (int i = 0; i < 5; i++) assert_true(r[i] == 2 * xv[i] + 1);
    free(r);
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* Products of one input (a layer's q, k and v projections) give its gradient as one accumulation
 * in the products themselves: the second contribution is MUL_MAT_ADD with the first as its addend,
 * the third with the second's, no ADD. Values: dx = sum_i Wi^T 1 = (row sums of the Ws), exact. */
static void products_accumulate_in_place(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 4, 3), "x"), KEEL_FLAG_PARAM);
    keel_tensor *w[3], *sum = NULL;
    for (int i = 0; i < 3; i++) {
        w[i] = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 4, 2 + i), KEEL_FLAG_INPUT);
        keel_tensor *y = keel_sum(ctx, keel_mul_mat(ctx, w[i], x));
        sum = sum ? keel_add(ctx, sum, y) : y;
    }
    keel_graph *g = keel_graph_build(ctx, &sum, 1);
    assert_int_equal(keel_build_backward(g, sum), 0);
    keel_tensor *gx = keel_graph_grad(g, x);
    int fused = 0;
    for (keel_tensor *t = gx; t && t->op == KEEL_OP_MUL_MAT_ADD; t = t->src[2]) fused++;
    assert_int_equal(fused, 2);
    for (int64_t i = 0; i < g->n_nodes; i++) /* the backward adds no ADD of a product's result */
        if (g->nodes[i]->op == KEEL_OP_ADD) assert_true(g->nodes[i]->src[1]->op != KEEL_OP_MUL_MAT);
    double xv[12], wv[3][16], want[4] = {0};
    for (int i = 0; i < 12; i++) xv[i] = 0.25 * i - 1;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4 * (2 + i); j++) wv[i][j] = 0.5 * ((j * 7 + i) % 5) - 1, want[j % 4] += wv[i][j];
    double *vals[4] = {xv, wv[0], wv[1], wv[2]};
    keel_tensor *leaves[4] = {x, w[0], w[1], w[2]};
    for (int b = 0; b < 2; b++) {
        double *r = run_graph(b ? "ref" : "cpu", g, leaves, vals, 4, gx);
        for (int i = 0; i < 12; i++) assert_true(r[i] == want[i % 4]);
        free(r);
    }
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* The packed LM head (keel_linear_cross_entropy_with_grads) differentiated as the loss itself: x's
 * and W's gradients come from the forward's own result, with no LINEAR_CROSS_ENTROPY_BACK in the
 * graph (the logits are made once), and equal, bit for bit on each backend, those of the plain op
 * and its backward; a scaled loss, or the loss used twice, goes through LINEAR_CROSS_ENTROPY_BACK; a
 * gradient reaching the packed result's other elements is refused, naming the node. */
static keel_graph *head_graph(keel_ctx *ctx, int kind, keel_tensor **xw) {
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 6, 5), "x"), KEEL_FLAG_PARAM);
    keel_tensor *w = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 6, 9), "w"), KEEL_FLAG_PARAM);
    keel_tensor *tg = keel_set_flags(keel_set_name(keel_new_1d(ctx, KEEL_I32, 5), "tg"), KEEL_FLAG_INPUT);
    keel_tensor *loss = kind == 0 ? keel_linear_cross_entropy(ctx, x, w, tg, 2)
                                  : keel_linear_cross_entropy_with_grads(ctx, x, w, tg, 2);
    if (kind == 2) loss = keel_scale(ctx, loss, 0.5, 0.0);
    if (kind == 3) loss = keel_sum(ctx, loss->view_src); /* every element of the packed result */
    if (kind == 4) loss = keel_add(ctx, loss, loss);     /* the loss used twice: dloss 2 */
    xw[0] = x, xw[1] = w, xw[2] = tg;
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_non_null(g);
    if (kind == 3) {
        assert_int_equal(keel_build_backward(g, loss), -1);
        assert_non_null(strstr(keel_last_error(), "only its loss, the last element, is differentiable"));
        return g;
    }
    assert_int_equal(keel_build_backward(g, loss), 0);
    int back = 0;
    for (int64_t i = 0; i < g->n_nodes; i++) back += g->nodes[i]->op == KEEL_OP_LINEAR_CROSS_ENTROPY_BACK;
    assert_int_equal(back, kind == 1 ? 0 : 1);
    return g;
}

static void packed_head_gradients(void **st) {
    (void)st;
    double xv[30], wv[54], tv[5] = {3, 0, -1, 8, 5};
    for (int i = 0; i < 30; i++) xv[i] = 0.1 * ((i * 7) % 11) - 0.5;
    for (int i = 0; i < 54; i++) wv[i] = 0.2 * ((i * 5) % 13) - 1.2;
    for (int b = 0; b < 2; b++) {
        double *r[5][2];
        for (int kind = 0; kind < 5; kind++) {
            if (kind == 3) continue;
            keel_ctx *ctx = keel_ctx_new();
            keel_tensor *xw[3];
            keel_graph *g = head_graph(ctx, kind, xw);
            double *vals[3] = {xv, wv, tv};
            for (int j = 0; j < 2; j++)
                r[kind][j] = run_graph(b ? "ref" : "cpu", g, xw, vals, 3, keel_graph_grad(g, xw[j]));
            keel_graph_free(g);
            keel_ctx_free(ctx);
        }
        for (int j = 0; j < 2; j++) {
            for (int i = 0; i < (j ? 54 : 30); i++) {
                assert_true(r[1][j][i] == r[0][j][i]);       /* the views: the backward's bits */
                assert_true(r[2][j][i] == 0.5 * r[0][j][i]); /* a loss scaled by 0.5 */
                assert_true(r[4][j][i] == 2.0 * r[0][j][i]); /* used twice */
            }
            for (int kind = 0; kind < 5; kind++)
                if (kind != 3) free(r[kind][j]);
        }
    }
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *xw[3];
    keel_graph_free(head_graph(ctx, 3, xw));
    keel_ctx_free(ctx);
}

/* Windows in place: the delta rule's q, k and v viewed from one tensor s, as the model views them
 * from the conv's output. Its backward writes dq, dk, dv in s's layout, so s's gradient is that
 * result as it lies (a VIEW of GATED_DELTA_NET_BACK, no FILL, no ACC); where the windows do not tile
 * s (v from a tensor of its own), or do not lie in s's layout (key heads shared by two value heads:
 * dq and dk are sums, and the rows of the result are wider than s's), they go through a FILL and
 * ACCs as before. Every way gives x's gradient of the same graph with q, k and v copied out of s
 * (CONT: no window of the result reaches s), value for value on cpu and ref. */
enum { GW_DK = 4, GW_DV = 3, GW_HV = 2, GW_T = 5, GW_B = 2 };
typedef enum { GW_TILED, GW_V_OWN, GW_SHARED_KEYS, GW_LEAF } gw_kind; /* GW_LEAF: the parameter viewed itself */
static keel_graph *gdn_windows_graph(keel_ctx *ctx, gw_kind kind, bool copies, keel_tensor **leaves) {
    int64_t Hk = kind == GW_SHARED_KEYS ? 1 : GW_HV, kd = GW_DK * Hk, C = 2 * kd + GW_DV * GW_HV, es = 4;
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_3d(ctx, KEEL_F32, C, GW_T, GW_B), "x"), KEEL_FLAG_PARAM);
    keel_tensor *xv = keel_set_flags(keel_new_4d(ctx, KEEL_F32, GW_DV, GW_HV, GW_T, GW_B), KEEL_FLAG_PARAM);
    keel_tensor *g = keel_set_flags(keel_new_3d(ctx, KEEL_F32, GW_HV, GW_T, GW_B), KEEL_FLAG_INPUT);
    keel_tensor *beta = keel_set_flags(keel_new_3d(ctx, KEEL_F32, GW_HV, GW_T, GW_B), KEEL_FLAG_INPUT);
    keel_tensor *pos = keel_set_flags(keel_new_2d(ctx, KEEL_I32, GW_T, GW_B), KEEL_FLAG_INPUT);
    keel_tensor *s = kind == GW_LEAF ? x : keel_scale(ctx, x, 0.5, 0.0);
    keel_tensor *q = keel_view_4d(ctx, s, GW_DK, Hk, GW_T, GW_B, GW_DK * es, C * es, C * GW_T * es, 0);
    keel_tensor *k = keel_view_4d(ctx, s, GW_DK, Hk, GW_T, GW_B, GW_DK * es, C * es, C * GW_T * es, kd * es);
    keel_tensor *v = keel_view_4d(ctx, s, GW_DV, GW_HV, GW_T, GW_B, GW_DV * es, C * es, C * GW_T * es, 2 * kd * es);
    if (copies) q = keel_cont(ctx, q), k = keel_cont(ctx, k), v = keel_cont(ctx, v);
    if (kind == GW_V_OWN) v = keel_scale(ctx, xv, 1.0, 0.0);
    keel_tensor *o = keel_gated_delta_net(ctx, q, k, v, g, beta, pos, KEEL_GDN_FLOAT32);
    keel_tensor *loss = keel_add(ctx, keel_sum(ctx, keel_sqr(ctx, o)), keel_sum(ctx, xv));
    keel_graph *gr = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(gr, loss), 0);
    leaves[0] = x, leaves[1] = xv, leaves[2] = g, leaves[3] = beta, leaves[4] = pos;
    return gr;
}

static double *gdn_windows_run(const char *backend, keel_graph *g, keel_tensor **lv) {
    int n = (int)keel_nelements(lv[0]), nv = (int)keel_nelements(lv[1]), ng = (int)keel_nelements(lv[2]);
    double *xs = malloc((size_t)n * sizeof *xs), *vs = malloc((size_t)nv * sizeof *vs),
           *gs = malloc((size_t)ng * sizeof *gs), *bs = malloc((size_t)ng * sizeof *bs), ps[GW_T * GW_B];
    for (int i = 0; i < n; i++) xs[i] = 0.1 * ((i * 37) % 17) - 0.85; /* never 0 */
    for (int i = 0; i < nv; i++) vs[i] = 0.05 * ((i * 11) % 7) - 0.175;
    for (int i = 0; i < ng; i++) gs[i] = -0.1 - 0.05 * (i % 5), bs[i] = 0.2 + 0.1 * (i % 6);
    for (int i = 0; i < GW_T * GW_B; i++) ps[i] = i % GW_T < 3 ? i % GW_T : i % GW_T - 3; /* a start inside */
    double *vals[5] = {xs, vs, gs, bs, ps};
    double *r = run_graph(backend, g, lv, vals, 5, keel_graph_grad(g, lv[0]));
    free(xs), free(vs), free(gs), free(bs);
    return r;
}

/* the backward's nodes of op `op` */
static int back_ops(const keel_graph *g, keel_op op) {
    int n = 0;
    for (int64_t i = g->n_forward; i < g->n_nodes; i++) n += g->nodes[i]->op == (int)op;
    return n;
}

static void windows_in_place(void **st) {
    (void)st;
    for (gw_kind kind = GW_TILED; kind <= GW_LEAF; kind++) {
        keel_ctx *ctx = keel_ctx_new(), *cc = keel_ctx_new();
        keel_tensor *lv[5], *lc[5];
        keel_graph *g = gdn_windows_graph(ctx, kind, false, lv), *oracle = gdn_windows_graph(cc, kind, true, lc);
        int fills = back_ops(g, KEEL_OP_FILL), accs = back_ops(g, KEEL_OP_ACC);
        keel_tensor *gx = keel_graph_grad(g, lv[0]), *sg = gx->src[0]; /* x's gradient is SCALE's of s's */
        if (kind == GW_LEAF) { /* held until the backward ends; the parameter's gradient a copy of the view */
            assert_int_equal(gx->op, KEEL_OP_CONT);
            assert_int_equal(sg->op, KEEL_OP_VIEW);
            assert_int_equal(sg->src[0]->op, KEEL_OP_GATED_DELTA_NET_BACK);
            assert_int_equal(accs, 0);
        } else if (kind == GW_TILED) {
            assert_int_equal(sg->op, KEEL_OP_VIEW);
            assert_int_equal(sg->src[0]->op, KEEL_OP_GATED_DELTA_NET_BACK);
            assert_int_equal(accs, 0);
        } else {
            assert_int_equal(sg->op, KEEL_OP_ACC);
            assert_int_equal(accs, kind == GW_V_OWN ? 2 : 3);
        }
        assert_int_equal(fills, 1 + (kind != GW_TILED && kind != GW_LEAF)); /* the loss's gradient, then s's */
        int64_t n = keel_nelements(lv[0]), C = lv[0]->ne[0], v0 = C - GW_DV * GW_HV;
        for (int b = 0; b < 2; b++) {
            double *r = gdn_windows_run(b ? "ref" : "cpu", g, lv),
                   *want = gdn_windows_run(b ? "ref" : "cpu", oracle, lc);
            for (int64_t i = 0; i < n; i++) {
                assert_true(r[i] == want[i]);
                assert_true(r[i] != 0.0 || (kind == GW_V_OWN && i % C >= v0)); /* every window reached */
            }
            free(r), free(want);
        }
        keel_graph_free(g), keel_graph_free(oracle);
        keel_ctx_free(ctx), keel_ctx_free(cc);
    }
}

/* Halves: s = x / 2 read as [4, 2, 6] (runs of 4 of its rows of 8, as attention's q and gate lie in
 * the q projection's rows) and two windows of every other run. Both used: s's gradient is their two
 * gradients side by side, one CONCAT, no FILL or ACC for s; one used (or windows that are not halves
 * of each other): a FILL and an ACC, as before. Against the analytic gradient, exact:
 * loss = sum(q^2) + sum(g c), so dx = (q's rows: 2 q = x, g's: c) / 2. */
static void halves_side_by_side(void **st) {
    (void)st;
    for (int kind = 0; kind < 3; kind++) { /* 0: both halves, 1: q alone, 2: g a run of 2, not a half */
        keel_ctx *ctx = keel_ctx_new();
        keel_tensor *x = keel_set_flags(keel_set_name(keel_new_3d(ctx, KEEL_F32, 8, 3, 2), "x"), KEEL_FLAG_PARAM);
        keel_tensor *c = keel_set_flags(keel_new_3d(ctx, KEEL_F32, kind == 2 ? 2 : 4, 3, 2), KEEL_FLAG_INPUT);
        keel_tensor *s = keel_scale(ctx, x, 0.5, 0.0);
        int64_t es = 4, w = kind == 2 ? 2 : 4;
        keel_tensor *q = keel_view_3d(ctx, s, 4, 3, 2, 8 * es, 24 * es, 0);
        keel_tensor *gw = keel_view_3d(ctx, s, w, 3, 2, 8 * es, 24 * es, 4 * es);
        keel_tensor *loss = keel_sum(ctx, keel_sqr(ctx, q));
        if (kind != 1) loss = keel_add(ctx, loss, keel_sum(ctx, keel_mul(ctx, gw, c)));
        keel_graph *g = keel_graph_build(ctx, &loss, 1);
        assert_int_equal(keel_build_backward(g, loss), 0);
        keel_tensor *sg = keel_graph_grad(g, x)->src[0]; /* x's gradient is SCALE's of s's */
        assert_int_equal(back_ops(g, KEEL_OP_CONCAT), kind == 0);
        assert_int_equal(back_ops(g, KEEL_OP_FILL), kind == 0 ? 1 : 2); /* the loss's gradient, then s's */
        assert_int_equal(sg->op, kind == 0 ? KEEL_OP_RESHAPE : KEEL_OP_ACC);
        double xv[48], cv[24];
        for (int i = 0; i < 48; i++) xv[i] = 0.25 * ((i * 7) % 11) - 1.25;
        for (int i = 0; i < 24; i++) cv[i] = 0.5 * (i % 5) - 1;
        double *vals[2] = {xv, cv};
        keel_tensor *leaves[2] = {x, c}; /* c: not in q alone's graph */
        for (int b = 0; b < 2; b++) {
            double *r = run_graph(b ? "ref" : "cpu", g, leaves, vals, kind == 1 ? 1 : 2, keel_graph_grad(g, x));
            for (int i = 0; i < 48; i++) {
                int col = i % 8, row = i / 8; /* row: (t, b) */
                double want = col < 4 ? xv[i] : kind != 1 && col - 4 < w ? cv[row * w + col - 4] : 0.0;
                assert_true(r[i] == 0.5 * want);
            }
            free(r);
        }
        keel_graph_free(g);
        keel_ctx_free(ctx);
    }
}

/* Gradients in bf16: gate, up (SwiGLU's sources) and a conv's input, each a float32 product of bf16
 * operands that nothing else reads, get bf16 gradients from SWIGLU_BACK and CONV1D_BACK_INPUT (the
 * products' rules then round nothing); a fourth product read as two halves (attention's q and gate)
 * gets its gradient in bf16 from the halves' CONCAT. Marked as outputs (read beside the backward),
 * the same tensors take float32 gradients and CASTs. x's and the conv weight's gradients: the same
 * bits, on cpu and ref. */
static keel_graph *bf16_grads_graph(keel_ctx *ctx, bool outputs, keel_tensor **lv) {
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_3d(ctx, KEEL_F32, 8, 5, 2), "x"), KEEL_FLAG_PARAM);
    keel_tensor *cw = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 4, 8), "cw"), KEEL_FLAG_PARAM);
    keel_tensor *pos = keel_set_flags(keel_new_2d(ctx, KEEL_I32, 5, 2), KEEL_FLAG_INPUT);
    keel_tensor *w[4], *y[4], *xb = keel_cast(ctx, x, KEEL_BF16);
    for (int i = 0; i < 4; i++) {
        w[i] = keel_set_flags(keel_new_2d(ctx, KEEL_BF16, 8, i < 2 ? 12 : 8), KEEL_FLAG_INPUT);
        y[i] = keel_mul_mat_to(ctx, w[i], xb, KEEL_F32);
        if (outputs) keel_set_flags(y[i], KEEL_FLAG_OUTPUT);
    }
    keel_tensor *s = keel_swiglu(ctx, y[0], y[1]), *c = keel_conv1d(ctx, y[2], cw, pos);
    /* y[3] as [2, 2, 10]: runs of 2 of its rows of 8, every other one q, the rest the gate */
    keel_tensor *q = keel_view_3d(ctx, y[3], 2, 2, 10, 4 * 4, 8 * 4, 0),
                *gt = keel_view_3d(ctx, y[3], 2, 2, 10, 4 * 4, 8 * 4, 2 * 4);
    keel_tensor *loss = keel_add(ctx, keel_sum(ctx, keel_sqr(ctx, s)), keel_sum(ctx, keel_sqr(ctx, c)));
    loss = keel_add(ctx, loss, keel_sum(ctx, keel_mul(ctx, keel_sqr(ctx, q), gt)));
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), 0);
    lv[0] = x, lv[1] = cw, lv[2] = pos, lv[3] = w[0], lv[4] = w[1], lv[5] = w[2], lv[6] = w[3];
    return g;
}

static void bf16_gradients(void **st) {
    (void)st;
    keel_ctx *ctx[2] = {keel_ctx_new(), keel_ctx_new()};
    keel_tensor *lv[2][7];
    keel_graph *g[2];
    for (int o = 0; o < 2; o++) {
        g[o] = bf16_grads_graph(ctx[o], o == 1, lv[o]);
        int bf = 0;
        for (int64_t i = g[o]->n_forward; i < g[o]->n_nodes; i++) {
            const keel_tensor *t = g[o]->nodes[i];
            if (t->op == KEEL_OP_SWIGLU_BACK || t->op == KEEL_OP_CONV1D_BACK_INPUT || t->op == KEEL_OP_CONCAT)
                bf += t->type == KEEL_BF16;
        }
        assert_int_equal(back_ops(g[o], KEEL_OP_CONCAT), 1);
        assert_int_equal(bf, o ? 0 : 3);
        assert_int_equal(back_ops(g[o], KEEL_OP_CAST), o ? 4 : 0); /* dy of the four products */
    }
    double xs[80], cs[32], ps[10], ws[4][96];
    for (int i = 0; i < 80; i++) xs[i] = 0.07 * ((i * 13) % 23) - 0.75;
    for (int i = 0; i < 32; i++) cs[i] = 0.1 * ((i * 5) % 9) - 0.35;
    for (int i = 0; i < 10; i++) ps[i] = i < 5 ? i : (i - 5) % 3; /* a window; examples of 3 and 2 */
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 96; i++) ws[k][i] = 0.05 * ((i * 7 + k) % 11) - 0.24;
    double *vals[7] = {xs, cs, ps, ws[0], ws[1], ws[2], ws[3]};
    for (int b = 0; b < 2; b++)
        for (int p = 0; p < 2; p++) { /* x's gradient, then the conv weight's */
            double *r[2];
            for (int o = 0; o < 2; o++)
                r[o] = run_graph(b ? "ref" : "cpu", g[o], lv[o], vals, 7, keel_graph_grad(g[o], lv[o][p]));
            for (int i = 0; i < (p ? 32 : 80); i++) assert_true(r[0][i] == r[1][i] && r[0][i] != 0.0);
            free(r[0]), free(r[1]);
        }
    for (int o = 0; o < 2; o++) keel_graph_free(g[o]), keel_ctx_free(ctx[o]);
}

/* The gradients of lv[0] (x: 40 values) and lv[1] (w: 8) in two graphs of the same leaves (lv0, lv1)
 * on the same values: the same bits on cpu, each non-zero; on ref within rel (the float32 sums one
 * graph rounds twice and the other once) */
static void same_x_w_grads(keel_graph **g, keel_tensor **lv0, keel_tensor **lv1, double **vals, int n, double rel) {
    keel_tensor **lv[2] = {lv0, lv1};
    for (int b = 0; b < 2; b++)
        for (int p = 0; p < 2; p++) { /* x's gradient, then w's */
            double *v[2];
            for (int o = 0; o < 2; o++)
                v[o] = run_graph(b ? "ref" : "cpu", g[o], lv[o], vals, n, keel_graph_grad(g[o], lv[o][p]));
            for (int i = 0; i < (p ? 8 : 40); i++)
                assert_true(b ? fabs(v[0][i] - v[1][i]) <= rel * fabs(v[1][i]) : v[0][i] == v[1][i] && v[0][i] != 0.0);
            free(v[0]), free(v[1]);
        }
}

/* A residual stream: y = W rms_norm(x) (1 + w) + x. x's gradient so far (the addend's, dy) is added
 * where the norm's dx is made (RMS_NORM_W_BACK_ADD: no ADD in the backward), and the 1 + w weight's
 * gradient is the norm backward's own sum over rows, copied out of its packed result by the rule (no
 * REPEAT_BACK, no SCALE by 1, no copy at the graph's end); the values are, bit for bit on cpu, those
 * of the same model built with x's other use first (a RESHAPE made before the norm), whose gradient
 * goes the plain way: RMS_NORM_W_BACK, then ADD of the two contributions (on ref, which stores float32
 * tensors' values rounded, within one rounding: the fused op rounds g + dx once, the pair twice). */
static keel_graph *residual_graph(keel_ctx *ctx, bool plain, keel_tensor **lv) {
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 8, 5), "x"), KEEL_FLAG_PARAM);
    keel_tensor *w = keel_set_flags(keel_set_name(keel_new_1d(ctx, KEEL_F32, 8), "w"), KEEL_FLAG_PARAM);
    keel_tensor *W = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 8, 8), "W"), KEEL_FLAG_INPUT);
    keel_tensor *r = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 8, 5), "r"), KEEL_FLAG_INPUT);
    keel_tensor *xr = plain ? keel_reshape_2d(ctx, x, 8, 5) : NULL; /* made before the norm */
    keel_tensor *h = keel_rms_norm_w(ctx, x, w, 1e-6, true);
    keel_tensor *y = plain ? keel_add(ctx, xr, keel_mul_mat(ctx, W, h)) : keel_mul_mat_add(ctx, W, h, x);
    keel_tensor *loss = keel_sum(ctx, keel_mul(ctx, y, r));
    lv[0] = x, lv[1] = w, lv[2] = W, lv[3] = r;
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), 0);
    return g;
}

static void residual_norm_adds_in_place(void **st) {
    (void)st;
    keel_ctx *ctx[2] = {keel_ctx_new(), keel_ctx_new()};
    keel_tensor *lv[2][4];
    keel_graph *g[2];
    for (int o = 0; o < 2; o++) {
        g[o] = residual_graph(ctx[o], o == 1, lv[o]);
        assert_int_equal(back_ops(g[o], KEEL_OP_RMS_NORM_W_BACK_ADD), o ? 0 : 1);
        assert_int_equal(back_ops(g[o], KEEL_OP_RMS_NORM_W_BACK), o ? 1 : 0);
        assert_int_equal(back_ops(g[o], KEEL_OP_ADD), o ? 1 : 0);
        assert_int_equal(back_ops(g[o], KEEL_OP_SCALE), 0);
        assert_int_equal(back_ops(g[o], KEEL_OP_REPEAT_BACK), 0);
        keel_tensor *dw = keel_graph_grad(g[o], lv[o][1]);
        assert_int_equal(dw->op, KEEL_OP_CONT);
        assert_int_equal(dw->src[0]->view_src->op, o ? KEEL_OP_RMS_NORM_W_BACK : KEEL_OP_RMS_NORM_W_BACK_ADD);
    }
    double xs[40], ws[8], Ws[64], rs[40];
    for (int i = 0; i < 40; i++) xs[i] = 0.13 * ((i * 7) % 17) - 1.1, rs[i] = 0.2 * ((i * 3) % 7) - 0.6;
    for (int i = 0; i < 8; i++) ws[i] = 0.05 * i - 0.2;
    for (int i = 0; i < 64; i++) Ws[i] = 0.1 * ((i * 5) % 13) - 0.6;
    double *vals[4] = {xs, ws, Ws, rs};
    same_x_w_grads(g, lv[0], lv[1], vals, 4, 1e-6); /* ref: g + dx rounded once, not twice (a few float32 ulps) */
    for (int o = 0; o < 2; o++) keel_graph_free(g[o]), keel_ctx_free(ctx[o]);
}

/* Mixed precision's norms hand their bf16 gradients on without CASTs. (a) A residual stream h1 = W1
 * n1 + x (W1 bf16, MUL_MAT_ADD), then h2 = W2 rms_norm(h1) + h1: the norm's backward (RMS_NORM_W_BACK_ADD)
 * also keeps dh1 in bf16 (ip1), which W1's rule reads through a bf16 view, where the same model with
 * h1 reshaped before its norm (no MUL_MAT_ADD under the norm) CASTs it. (b) A gated norm whose z is a
 * bf16 product's alone (reshaped, as the model's heads): its backward makes dz in bf16 (ip1), where z
 * marked an output takes it in float32 and a CAST. x's and the weights' gradients: the same bits on cpu (on ref, the reshaped
 * model's two roundings of h1's sum against one, as in residual_norm_adds_in_place). */
static keel_graph *bf16_parts_graph(keel_ctx *ctx, bool plain, keel_tensor **lv) {
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 8, 5), "x"), KEEL_FLAG_PARAM);
    keel_tensor *w = keel_set_flags(keel_set_name(keel_new_1d(ctx, KEEL_F32, 8), "w"), KEEL_FLAG_PARAM);
    keel_tensor *W1 = keel_set_flags(keel_new_2d(ctx, KEEL_BF16, 8, 8), KEEL_FLAG_INPUT);
    keel_tensor *W2 = keel_set_flags(keel_new_2d(ctx, KEEL_BF16, 8, 8), KEEL_FLAG_INPUT);
    keel_tensor *Wz = keel_set_flags(keel_new_2d(ctx, KEEL_BF16, 8, 8), KEEL_FLAG_INPUT);
    keel_tensor *r = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 8, 5), KEEL_FLAG_INPUT);
    keel_tensor *xb = keel_cast(ctx, keel_rms_norm_w(ctx, x, w, 1e-6, true), KEEL_BF16);
    keel_tensor *h1 = keel_mul_mat_add(ctx, W1, xb, x);
    keel_tensor *h1n = plain ? keel_reshape_2d(ctx, h1, 8, 5) : h1; /* plain: made before the norm */
    keel_tensor *n2 = keel_cast(ctx, keel_rms_norm_w(ctx, h1n, w, 1e-6, true), KEEL_BF16);
    keel_tensor *h2 = keel_mul_mat_add(ctx, W2, n2, h1);
    keel_tensor *z = keel_mul_mat_to(ctx, Wz, xb, KEEL_F32);
    if (plain) keel_set_flags(z, KEEL_FLAG_OUTPUT);
    keel_tensor *zh = keel_reshape_2d(ctx, z, 8, 5); /* z as the model's: a RESHAPE */
    keel_tensor *gn = keel_gated_rms_norm(ctx, h2, w, zh, 1e-6);
    keel_tensor *loss = keel_sum(ctx, keel_mul(ctx, gn, r));
    lv[0] = x, lv[1] = w, lv[2] = W1, lv[3] = W2, lv[4] = Wz, lv[5] = r;
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), 0);
    return g;
}

static void norm_backward_bf16_parts(void **st) {
    (void)st;
    keel_ctx *ctx[2] = {keel_ctx_new(), keel_ctx_new()};
    keel_tensor *lv[2][6];
    keel_graph *g[2];
    for (int o = 0; o < 2; o++) {
        g[o] = bf16_parts_graph(ctx[o], o == 1, lv[o]);
        int parts = 0, views = 0;
        for (int64_t i = g[o]->n_forward; i < g[o]->n_nodes; i++) {
            const keel_tensor *t = g[o]->nodes[i];
            if (t->op == KEEL_OP_RMS_NORM_W_BACK_ADD || t->op == KEEL_OP_GATED_RMS_NORM_BACK)
                parts += t->ip[1] == KEEL_BF16;
            views += t->op == KEEL_OP_VIEW && t->type == KEEL_BF16;
        }
        /* dh1's copy and dz in bf16, each read through a bf16 view */
        assert_int_equal(parts, o ? 0 : 2);
        assert_int_equal(views, o ? 0 : 2);
        assert_int_equal(back_ops(g[o], KEEL_OP_CAST), o ? 3 : 1); /* h2's dy; plain: dh1's and dz's too */
    }
    double xs[40], ws[8], W[3][64], rs[40];
    for (int i = 0; i < 40; i++) xs[i] = 0.13 * ((i * 7) % 17) - 1.1, rs[i] = 0.2 * ((i * 3) % 7) - 0.6;
    for (int i = 0; i < 8; i++) ws[i] = 0.05 * i - 0.2;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 64; i++) W[k][i] = 0.0625 * ((i * 5 + 3 * k) % 13) - 0.375; /* bf16 values */
    double *vals[6] = {xs, ws, W[0], W[1], W[2], rs};
    same_x_w_grads(g, lv[0], lv[1], vals, 6, 1e-6);
    for (int o = 0; o < 2; o++) keel_graph_free(g[o]), keel_ctx_free(ctx[o]);
}

static void errors(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_new_1d(ctx, KEEL_F32, 5); /* not a parameter */
    keel_tensor *loss = keel_sum(ctx, x);
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), -1);
    assert_non_null(strstr(keel_last_error(), "does not depend on any parameter"));
    keel_graph_free(g);
    /* a view of a non-contiguous tensor cannot take a window gradient: clear message */
    keel_tensor *p = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 4, 6), KEEL_FLAG_PARAM);
    keel_tensor *tp = keel_transpose(ctx, p);
    keel_tensor *v = keel_view_2d(ctx, tp, 2, 2, tp->nb[1], 0);
    loss = keel_sum(ctx, keel_cont(ctx, v));
    g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), -1);
    assert_non_null(strstr(keel_last_error(), "non-contiguous"));
    keel_graph_free(g);
    /* a view of another type: only over a backward op's packed result, through which no gradient flows */
    keel_tensor *xp = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 8, 2), KEEL_FLAG_PARAM);
    keel_tensor *w = keel_set_flags(keel_new_1d(ctx, KEEL_F32, 8), KEEL_FLAG_PARAM);
    keel_tensor *dy = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 8, 2), KEEL_FLAG_INPUT);
    assert_null(keel_view_4d_as(ctx, xp, KEEL_BF16, 16, 1, 1, 1, 32, 32, 32, 0));
    assert_non_null(strstr(keel_last_error(), "over a backward op's packed result"));
    int64_t ip[2] = {0, KEEL_BF16};
    double eps = 1e-6;
    keel_tensor *pk = keel_op_new(ctx, KEEL_OP_RMS_NORM_W_BACK, (keel_tensor *const[]){xp, w, dy}, 3, ip, 2, &eps, 1);
    assert_int_equal(keel_nelements(pk), 16 + keel_bf16_part_floats(16) + 8); /* [dx | bf16 dx | dw] */
    keel_tensor *v16 = keel_view_4d_as(ctx, pk, KEEL_BF16, 16, 1, 1, 1, 32, 32, 32, 16 * 4);
    assert_non_null(v16);
    /* past the end; float32 over bf16 */
    assert_null(keel_view_4d_as(ctx, pk, KEEL_BF16, 16, 1, 1, 1, 32, 32, 32, (16 + 8) * 4 + 2));
    assert_null(keel_view_4d_as(ctx, v16, KEEL_F32, 8, 1, 1, 1, 32, 32, 32, 0));
    assert_non_null(strstr(keel_last_error(), "a float32 view of a bf16 tensor"));
    loss = keel_sum(ctx, keel_cast(ctx, v16, KEEL_F32));
    g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), -1);
    assert_non_null(strstr(keel_last_error(), "does not depend on any parameter")); /* a backward op's: none */
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(view_gradient_is_fill_plus_acc),
        cmocka_unit_test(bf16_view_gradient),
        cmocka_unit_test(multiple_uses_sum),
        cmocka_unit_test(products_accumulate_in_place),
        cmocka_unit_test(packed_head_gradients),
        cmocka_unit_test(windows_in_place),
        cmocka_unit_test(halves_side_by_side),
        cmocka_unit_test(bf16_gradients),
        cmocka_unit_test(residual_norm_adds_in_place),
        cmocka_unit_test(norm_backward_bf16_parts),
        cmocka_unit_test(errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
