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
    if (kind == 4) loss = keel_add(ctx, loss, loss);      /* the loss used twice: dloss 2 */
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
    keel_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(view_gradient_is_fill_plus_acc),
        cmocka_unit_test(multiple_uses_sum),
        cmocka_unit_test(products_accumulate_in_place),
        cmocka_unit_test(packed_head_gradients),
        cmocka_unit_test(errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
