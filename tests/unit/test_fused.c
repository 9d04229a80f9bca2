/* The fused ops are the ops they replace, bit for bit, on the float32 backends (cpu, and cuda where
 * a GPU is present; ref keeps a fused op's intermediates in float64, the ops' in their tensors):
 * GDN_CONV against CONV1D, SILU, L2_NORM and SCALE, SWIGLU against SILU and MUL, GATED_RMS_NORM
 * against RMS_NORM, MUL, SILU and MUL; their values and the gradients of sum(y * r) for a random r,
 * so the backward ops are held to the backward ops of the sequence too. Packed examples (positions
 * restarting inside a column) and heads of 4 and of 32 channels (the cuda backend's generic and
 * dense kernels). */
#include "unit.h"

#include "util/rng.h"

static const char *BACKENDS[] = {"cpu", "cuda"};

/* uniform in [-2, 2), float32 values */
static double *randoms(int64_t n, uint64_t seed) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)(float)(4.0 * keel_uniform01(&seed) - 2.0);
    return v;
}

/* Run both graphs' outputs on one backend and require identical doubles (float32 values read out
 * exactly), element by element. */
static void same_bits(const char *be, keel_graph *g1, keel_graph *g2, keel_tensor **l1, keel_tensor **l2, double **vals,
                      int nl, keel_tensor **o1, keel_tensor **o2, int no, const char *const *what) {
    for (int k = 0; k < no; k++) {
        double *a = run_graph(be, g1, l1, vals, nl, o1[k]), *b = run_graph(be, g2, l2, vals, nl, o2[k]);
        int64_t n = keel_nelements(o1[k]), diff = 0;
        for (int64_t i = 0; i < n; i++) diff += a[i] != b[i];
        printf("%-5s %-34s %lld elements, %lld differ\n", be, what[k], (long long)n, (long long)diff);
        assert_int_equal(diff, 0);
        free(a), free(b);
    }
}

static bool backend_present(const char *name) {
    keel_backend *be = keel_backend_new(name, 1);
    if (!be) return false;
    keel_backend_free(be);
    return true;
}

/* same_bits on every backend present, then both graphs and their contexts freed */
static void compare_and_free(keel_graph **g, keel_ctx **cx, keel_tensor **l0, keel_tensor **l1, double **vals, int nl,
                             keel_tensor **o0, keel_tensor **o1, int no, const char *const *what) {
    for (int b = 0; b < 2; b++)
        if (backend_present(BACKENDS[b])) same_bits(BACKENDS[b], g[0], g[1], l0, l1, vals, nl, o0, o1, no, what);
    for (int f = 0; f < 2; f++) {
        keel_graph_free(g[f]);
        keel_ctx_free(cx[f]);
    }
}

/* x [C,T,B], w [K,C], positions; n channels of q and of k in heads of hd */
static void gdn_conv_case(int64_t C, int64_t T, int64_t B, int64_t n, int64_t hd) {
    const int64_t K = 4;
    const double eps = 1e-6, qs = 1.0 / sqrt((double)hd);
    keel_tensor *x[2], *w[2], *pos[2], *r[2], *loss[2], *y[2];
    keel_graph *g[2];
    keel_ctx *cx[2];
    for (int f = 0; f < 2; f++) { /* f = 0: the fused op; 1: the ops it replaces */
        keel_ctx *ctx = cx[f] = keel_ctx_new();
        x[f] = keel_set_flags(keel_set_name(keel_new_3d(ctx, KEEL_F32, C, T, B), "x"), KEEL_FLAG_PARAM);
        w[f] = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, K, C), "w"), KEEL_FLAG_PARAM);
        pos[f] = keel_set_name(keel_new_2d(ctx, KEEL_I32, T, B), "pos");
        r[f] = keel_set_name(keel_new_3d(ctx, KEEL_F32, C, T, B), "r");
        if (f == 0) {
            y[f] = keel_gdn_conv(ctx, x[f], w[f], pos[f], n, hd, eps, qs);
        } else {
            keel_tensor *s = keel_silu(ctx, keel_conv1d(ctx, x[f], w[f], pos[f]));
            int64_t es = 4, H = n / hd;
            keel_tensor *q = keel_view_4d(ctx, s, hd, H, T, B, hd * es, C * es, C * T * es, 0);
            keel_tensor *k = keel_view_4d(ctx, s, hd, H, T, B, hd * es, C * es, C * T * es, n * es);
            q = keel_reshape_3d(ctx, keel_scale(ctx, keel_l2_norm(ctx, q, eps), qs, 0.0), n, T, B);
            k = keel_reshape_3d(ctx, keel_l2_norm(ctx, k, eps), n, T, B);
            keel_tensor *v = keel_view_3d(ctx, s, C - 2 * n, T, B, C * es, C * T * es, 2 * n * es);
            y[f] = keel_concat(ctx, keel_concat(ctx, q, k, 0), keel_cont(ctx, v), 0);
        }
        y[f]->flags |= KEEL_FLAG_OUTPUT;
        loss[f] = keel_sum(ctx, keel_mul(ctx, y[f], r[f]));
        g[f] = keel_graph_build(ctx, &loss[f], 1);
        assert_non_null(g[f]);
        assert_int_equal(keel_build_backward(g[f], loss[f]), 0);
    }
    double *xv = randoms(C * T * B, 1), *wv = randoms(K * C, 2), *rv = randoms(C * T * B, 3);
    double *pv = malloc((size_t)(T * B) * sizeof *pv);
    for (int64_t b = 0; b < B; b++) /* examples of 5 positions from the column's start, then 3 */
        for (int64_t t = 0; t < T; t++) pv[b * T + t] = t < 5 ? (double)t : (double)((t - 5) % 3);
    double *vals[4] = {xv, wv, pv, rv};
    keel_tensor *l0[4] = {x[0], w[0], pos[0], r[0]}, *l1[4] = {x[1], w[1], pos[1], r[1]};
    keel_tensor *o0[3] = {y[0], keel_graph_grad(g[0], x[0]), keel_graph_grad(g[0], w[0])},
                *o1[3] = {y[1], keel_graph_grad(g[1], x[1]), keel_graph_grad(g[1], w[1])};
    const char *what[3] = {"GDN_CONV value", "GDN_CONV gradient of x", "GDN_CONV gradient of w"};
    compare_and_free(g, cx, l0, l1, vals, 4, o0, o1, 3, what);
    free(xv), free(wv), free(rv), free(pv);
}

static void gdn_conv_is_its_ops(void **st) {
    (void)st;
    gdn_conv_case(40, 12, 2, 8, 4);    /* the generic kernels */
    gdn_conv_case(256, 12, 2, 64, 32); /* cuda's dense kernels */
}

static void swiglu_is_its_ops(void **st) {
    (void)st;
    const int64_t n0 = 36, n1 = 5;
    keel_tensor *gt[2], *up[2], *r[2], *y[2], *loss[2];
    keel_graph *g[2];
    keel_ctx *cx[2];
    for (int f = 0; f < 2; f++) {
        keel_ctx *ctx = cx[f] = keel_ctx_new();
        gt[f] = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, n0, n1), "gate"), KEEL_FLAG_PARAM);
        up[f] = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, n0, n1), "up"), KEEL_FLAG_PARAM);
        r[f] = keel_set_name(keel_new_2d(ctx, KEEL_F32, n0, n1), "r");
        y[f] = f == 0 ? keel_swiglu(ctx, gt[f], up[f]) : keel_mul(ctx, keel_silu(ctx, gt[f]), up[f]);
        y[f]->flags |= KEEL_FLAG_OUTPUT;
        loss[f] = keel_sum(ctx, keel_mul(ctx, y[f], r[f]));
        g[f] = keel_graph_build(ctx, &loss[f], 1);
        assert_int_equal(keel_build_backward(g[f], loss[f]), 0);
    }
    double *gv = randoms(n0 * n1, 4), *uv = randoms(n0 * n1, 5), *rv = randoms(n0 * n1, 6);
    double *vals[3] = {gv, uv, rv};
    keel_tensor *l0[3] = {gt[0], up[0], r[0]}, *l1[3] = {gt[1], up[1], r[1]};
    keel_tensor *o0[3] = {y[0], keel_graph_grad(g[0], gt[0]), keel_graph_grad(g[0], up[0])},
                *o1[3] = {y[1], keel_graph_grad(g[1], gt[1]), keel_graph_grad(g[1], up[1])};
    const char *what[3] = {"SWIGLU value", "SWIGLU gradient of gate", "SWIGLU gradient of up"};
    compare_and_free(g, cx, l0, l1, vals, 3, o0, o1, 3, what);
    free(gv), free(uv), free(rv);
}

/* GATED_RMS_NORM against RMS_NORM, MUL by w, SILU of z and MUL: rows of 128 (the DeltaNet's heads)
 * and of 24 (the fixture's). */
static void gated_rms_norm_case(int64_t n, int64_t rows) {
    const double eps = 1e-6;
    keel_tensor *x[2], *w[2], *z[2], *r[2], *y[2], *loss[2];
    keel_graph *g[2];
    keel_ctx *cx[2];
    for (int f = 0; f < 2; f++) {
        keel_ctx *ctx = cx[f] = keel_ctx_new();
        x[f] = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, n, rows), "x"), KEEL_FLAG_PARAM);
        w[f] = keel_set_flags(keel_set_name(keel_new_1d(ctx, KEEL_F32, n), "w"), KEEL_FLAG_PARAM);
        z[f] = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, n, rows), "z"), KEEL_FLAG_PARAM);
        r[f] = keel_set_name(keel_new_2d(ctx, KEEL_F32, n, rows), "r");
        y[f] = f == 0 ? keel_gated_rms_norm(ctx, x[f], w[f], z[f], eps)
                      : keel_mul(ctx, keel_mul(ctx, keel_rms_norm(ctx, x[f], eps), w[f]), keel_silu(ctx, z[f]));
        y[f]->flags |= KEEL_FLAG_OUTPUT;
        loss[f] = keel_sum(ctx, keel_mul(ctx, y[f], r[f]));
        g[f] = keel_graph_build(ctx, &loss[f], 1);
        assert_int_equal(keel_build_backward(g[f], loss[f]), 0);
    }
    double *xv = randoms(n * rows, 7), *wv = randoms(n, 8), *zv = randoms(n * rows, 9), *rv = randoms(n * rows, 10);
    double *vals[4] = {xv, wv, zv, rv};
    keel_tensor *l0[4] = {x[0], w[0], z[0], r[0]}, *l1[4] = {x[1], w[1], z[1], r[1]};
    keel_tensor *o0[4] = {y[0], keel_graph_grad(g[0], x[0]), keel_graph_grad(g[0], w[0]), keel_graph_grad(g[0], z[0])},
                *o1[4] = {y[1], keel_graph_grad(g[1], x[1]), keel_graph_grad(g[1], w[1]), keel_graph_grad(g[1], z[1])};
    const char *what[4] = {"GATED_RMS_NORM value", "GATED_RMS_NORM gradient of x", "GATED_RMS_NORM gradient of w",
                           "GATED_RMS_NORM gradient of z"};
    compare_and_free(g, cx, l0, l1, vals, 4, o0, o1, 4, what);
    free(xv), free(wv), free(zv), free(rv);
}

static void gated_rms_norm_is_its_ops(void **st) {
    (void)st;
    gated_rms_norm_case(128, 40);
    gated_rms_norm_case(24, 33);
}

/* Bad shapes and parameters: no node, and a message naming what is wrong. */
static void gdn_conv_rejects_bad_input(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_new_3d(ctx, KEEL_F32, 40, 6, 2), *w = keel_new_2d(ctx, KEEL_F32, 4, 40),
                *pos = keel_new_2d(ctx, KEEL_I32, 6, 2), *pos_bad = keel_new_2d(ctx, KEEL_I32, 5, 2),
                *w_bad = keel_new_2d(ctx, KEEL_F32, 4, 39), *x4 = keel_new_4d(ctx, KEEL_F32, 40, 6, 2, 2);
    struct {
        keel_tensor *x, *w, *pos;
        int64_t n, d;
        double eps;
        const char *want;
    } bad[] = {{x, w, pos, 6, 4, 1e-6, "want a multiple of the head"},
               {x, w, pos, 24, 4, 1e-6, "2n <= 40 channels"},
               {x, w, pos, 8, 0, 1e-6, "want a multiple of the head"},
               {x, w, pos, 8, 4, -1.0, "eps -1 must be >= 0"},
               {x, w, pos_bad, 8, 4, 1e-6, "positions must be i32 [T,B]"},
               {x, w_bad, pos, 8, 4, 1e-6, "want x [C,T,B] and w [K,C]"},
               {x4, w, pos, 8, 4, 1e-6, "want x [C,T,B] and w [K,C]"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        keel_tensor *y = keel_gdn_conv(ctx, bad[i].x, bad[i].w, bad[i].pos, bad[i].n, bad[i].d, bad[i].eps, 0.5);
        printf("bad input %zu: %s\n", i, y ? "(accepted)" : keel_last_error());
        assert_null(y);
        assert_non_null(strstr(keel_last_error(), bad[i].want));
    }
    assert_non_null(keel_gdn_conv(ctx, x, w, pos, 8, 4, 1e-6, 0.5));
    keel_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gdn_conv_is_its_ops),
        cmocka_unit_test(swiglu_is_its_ops),
        cmocka_unit_test(gated_rms_norm_is_its_ops),
        cmocka_unit_test(gdn_conv_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
