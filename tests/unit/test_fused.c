/* The fused ops are the ops they replace, bit for bit, on the float32 backends (cpu, and cuda where
 * a GPU is present; ref keeps a fused op's intermediates in float64, the ops' in their tensors):
 * GDN_CONV against CONV1D, SILU, L2_NORM and SCALE; SWIGLU against SILU and MUL; GATED_RMS_NORM
 * against RMS_NORM, MUL, SILU and MUL; RMS_NORM_W against RMS_NORM and MUL (and SCALE of w); QK_NORM_ROPE
 * against RMS_NORM_W and ROPE (its bf16 result against the fused op's float32 one and CAST); GDN_GATE
 * against ADD, SOFTPLUS, EXP, NEG and MUL; SIGMOID_MUL against SIGMOID and MUL (its bf16 result
 * against them and CAST); SIGMOID_BACK against SCALE, MUL and MUL, GET_ROWS_BACK_ADD
 * against GET_ROWS_BACK and ADD, RMS_NORM_W_BACK_ADD against RMS_NORM_W_BACK and ADD, FLASH_ATTN_BACK
 * from do alone against the same from [do | 0] (values: backward ops). Each
 * pair is built twice from the same inputs; their values and the gradients of sum(y * r) for a
 * random r must match element for element, so the backward ops are held to the backward ops of the
 * sequence too. */
#include "unit.h"

#include "util/rng.h"

/* ref too where a pair's two sides round alike there (with_ref): its float32 results then CAST */
static const char *BACKENDS[] = {"cpu", "cuda", "ref"};
static bool with_ref;

/* uniform in [-2, 2), float32 values */
static double *randoms(int64_t n, uint64_t seed) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)(float)(4.0 * keel_uniform01(&seed) - 2.0);
    return v;
}

static bool backend_present(const char *name) {
    keel_backend *be = keel_backend_new(name, 1);
    if (!be) return false;
    keel_backend_free(be);
    return true;
}

/* The fused op (fused) or the ops it replaces on inputs in[], with parameters p. */
typedef keel_tensor *(*pair_build)(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p);

#define MAX_IN 4

/* Inputs of shapes ne[] (float32, each a parameter; i32: positions [T,B] of packed examples, 5
 * positions from each column's start, then examples of 3); both graphs on every backend present. */
static void check_pair_of(const char *name, int n_in, const int64_t (*ne)[4], const keel_type *ty, pair_build build,
                          const double *p, bool grads) {
    keel_graph *g[2];
    keel_ctx *cx[2];
    keel_tensor *in[2][MAX_IN + 1], *out[2][MAX_IN + 1];
    int n_out = 1;
    for (int f = 0; f < 2; f++) {
        keel_ctx *ctx = cx[f] = keel_ctx_new();
        for (int i = 0; i < n_in; i++) {
            in[f][i] = keel_new_4d(ctx, ty[i], ne[i][0], ne[i][1], ne[i][2], ne[i][3]);
            if (ty[i] == KEEL_F32) keel_set_flags(in[f][i], KEEL_FLAG_PARAM);
        }
        keel_tensor *y = build(ctx, in[f], f == 0, p);
        assert_non_null(y);
        y->flags |= KEEL_FLAG_OUTPUT;
        keel_tensor *r = in[f][n_in] = keel_new_4d(ctx, KEEL_F32, y->ne[0], y->ne[1], y->ne[2], y->ne[3]);
        keel_tensor *loss = keel_sum(ctx, keel_mul(ctx, y, r));
        g[f] = keel_graph_build(ctx, &loss, 1);
        n_out = 1;
        out[f][0] = y;
        if (!grads) continue; /* a backward op: its values only */
        assert_int_equal(keel_build_backward(g[f], loss), 0);
        for (int i = 0; i < n_in; i++)
            if (ty[i] == KEEL_F32) out[f][n_out++] = keel_graph_grad(g[f], in[f][i]);
    }
    double *vals[MAX_IN + 1];
    for (int i = 0; i <= n_in; i++) {
        keel_tensor *t = in[0][i];
        int64_t n = keel_nelements(t);
        if (t->type == KEEL_F32) {
            vals[i] = randoms(n, (uint64_t)(i + 1));
            continue;
        }
        vals[i] = malloc((size_t)n * sizeof(double));
        for (int64_t e = 0; e < n; e++) {
            int64_t tt = e % t->ne[0];
            vals[i][e] = tt < 5 ? (double)tt : (double)((tt - 5) % 3);
        }
    }
    for (int b = 0; b < (with_ref ? 3 : 2); b++) {
        if (!backend_present(BACKENDS[b])) continue;
        for (int k = 0; k < n_out; k++) {
            double *x = run_graph(BACKENDS[b], g[0], in[0], vals, n_in + 1, out[0][k]),
                   *y = run_graph(BACKENDS[b], g[1], in[1], vals, n_in + 1, out[1][k]);
            int64_t n = keel_nelements(out[0][k]), diff = 0;
            for (int64_t e = 0; e < n; e++) diff += x[e] != y[e];
            char what[32];
            snprintf(what, sizeof what, k ? "gradient of input %d" : "value", k - 1);
            printf("%-5s %-16s %-20s %8lld elements, %lld differ\n", BACKENDS[b], name, what, (long long)n,
                   (long long)diff);
            assert_int_equal(diff, 0);
            free(x), free(y);
        }
    }
    for (int i = 0; i <= n_in; i++) free(vals[i]);
    for (int f = 0; f < 2; f++) {
        keel_graph_free(g[f]);
        keel_ctx_free(cx[f]);
    }
}

static void check_pair(const char *name, int n_in, const int64_t (*ne)[4], const keel_type *ty, pair_build build,
                       const double *p) {
    check_pair_of(name, n_in, ne, ty, build, p, true);
}

/* in: x [C,T,B], w [K,C], positions [T,B]; p: n channels of q and of k, heads of p[1] */
static keel_tensor *gdn_conv_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    int64_t n = (int64_t)p[0], hd = (int64_t)p[1], C = in[0]->ne[0], T = in[0]->ne[1], B = in[0]->ne[2], es = 4;
    double eps = 1e-6, qs = 1.0 / sqrt((double)hd);
    if (fused) return keel_gdn_conv(ctx, in[0], in[1], in[2], n, hd, eps, qs);
    keel_tensor *s = keel_silu(ctx, keel_conv1d(ctx, in[0], in[1], in[2]));
    keel_tensor *q = keel_view_4d(ctx, s, hd, n / hd, T, B, hd * es, C * es, C * T * es, 0);
    keel_tensor *k = keel_view_4d(ctx, s, hd, n / hd, T, B, hd * es, C * es, C * T * es, n * es);
    q = keel_reshape_3d(ctx, keel_scale(ctx, keel_l2_norm(ctx, q, eps), qs, 0.0), n, T, B);
    k = keel_reshape_3d(ctx, keel_l2_norm(ctx, k, eps), n, T, B);
    keel_tensor *v = keel_view_3d(ctx, s, C - 2 * n, T, B, C * es, C * T * es, 2 * n * es);
    return keel_concat(ctx, keel_concat(ctx, q, k, 0), keel_cont(ctx, v), 0);
}

static void gdn_conv_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[3] = {KEEL_F32, KEEL_F32, KEEL_I32};
    const int64_t generic[3][4] = {{40, 12, 2, 1}, {4, 40, 1, 1}, {12, 2, 1, 1}}, /* heads of 4: generic kernels */
        dense[3][4] = {{256, 12, 2, 1}, {4, 256, 1, 1}, {12, 2, 1, 1}};           /* heads of 32: cuda's dense ones */
    check_pair("GDN_CONV", 3, generic, ty, gdn_conv_pair, (const double[]){8, 4});
    check_pair("GDN_CONV", 3, dense, ty, gdn_conv_pair, (const double[]){64, 32});
}

static keel_tensor *swiglu_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    (void)p;
    return fused ? keel_swiglu(ctx, in[0], in[1]) : keel_mul(ctx, keel_silu(ctx, in[0]), in[1]);
}

static void swiglu_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[2] = {KEEL_F32, KEEL_F32};
    const int64_t ne[2][4] = {{36, 5, 1, 1}, {36, 5, 1, 1}};
    check_pair("SWIGLU", 2, ne, ty, swiglu_pair, NULL);
}

/* in: x, w [ne0], z (x's shape) */
static keel_tensor *gated_rms_norm_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    (void)p;
    if (fused) return keel_gated_rms_norm(ctx, in[0], in[1], in[2], 1e-6);
    return keel_mul(ctx, keel_mul(ctx, keel_rms_norm(ctx, in[0], 1e-6), in[1]), keel_silu(ctx, in[2]));
}

static void gated_rms_norm_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[3] = {KEEL_F32, KEEL_F32, KEEL_F32};
    const int64_t heads[3][4] = {{128, 40, 1, 1}, {128, 1, 1, 1}, {128, 40, 1, 1}}, /* the DeltaNet's heads */
        fixture[3][4] = {{24, 33, 1, 1}, {24, 1, 1, 1}, {24, 33, 1, 1}},
                  /* rows enough that dw's sums take chunks of 2 rows in groups of 8, the last group 6 chunks */
        many[3][4] = {{128, 4150, 2, 1}, {128, 1, 1, 1}, {128, 4150, 2, 1}};
    check_pair("GATED_RMS_NORM", 3, heads, ty, gated_rms_norm_pair, NULL);
    check_pair("GATED_RMS_NORM", 3, many, ty, gated_rms_norm_pair, NULL);
    check_pair("GATED_RMS_NORM", 3, fixture, ty, gated_rms_norm_pair, NULL);
}

/* in: x, w [ne0]; p[0]: the 1 + w form */
static keel_tensor *rms_norm_w_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    if (fused) return keel_rms_norm_w(ctx, in[0], in[1], 1e-6, p[0] != 0);
    return keel_mul(ctx, keel_rms_norm(ctx, in[0], 1e-6), p[0] != 0 ? keel_scale(ctx, in[1], 1.0, 1.0) : in[1]);
}

static void rms_norm_w_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[2] = {KEEL_F32, KEEL_F32};
    /* rows of 1024 (the 0.8B model's hidden size), 256 (its attention heads' q and k norms), 24 */
    const int64_t hidden[2][4] = {{1024, 9, 1, 1}, {1024, 1, 1, 1}}, heads[2][4] = {{256, 20, 1, 1}, {256, 1, 1, 1}},
                  small[2][4] = {{24, 7, 1, 1}, {24, 1, 1, 1}},
                  /* dw's sums in chunks of 2 rows, groups of 8, the last group 6 chunks (cuda) */
        many[2][4] = {{1024, 550, 2, 1}, {1024, 1, 1, 1}};
    check_pair("RMS_NORM_W 1+w", 2, hidden, ty, rms_norm_w_pair, (const double[]){1});
    check_pair("RMS_NORM_W 1+w", 2, many, ty, rms_norm_w_pair, (const double[]){1});
    check_pair("RMS_NORM_W", 2, many, ty, rms_norm_w_pair, (const double[]){0});
    check_pair("RMS_NORM_W 1+w", 2, heads, ty, rms_norm_w_pair, (const double[]){1});
    check_pair("RMS_NORM_W", 2, small, ty, rms_norm_w_pair, (const double[]){0});
}

/* in: x [D,H,T,B], w [D], positions [T,B]; p: n_rot, theta, and 1 for the bf16 result (ip2) against the
 * ops then CAST, each read back as float32 */
static keel_tensor *qk_norm_rope_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    int64_t nr = (int64_t)p[0];
    if (p[2] != 0 && fused)
        return keel_cast(ctx, keel_qk_norm_rope_to(ctx, in[0], in[1], in[2], 1e-6, true, nr, p[1], KEEL_BF16),
                         KEEL_F32);
    keel_tensor *y = fused ? keel_qk_norm_rope(ctx, in[0], in[1], in[2], 1e-6, true, nr, p[1])
                           : keel_rope(ctx, keel_rms_norm_w(ctx, in[0], in[1], 1e-6, true), in[2], nr, p[1]);
    return p[2] != 0 ? keel_cast(ctx, keel_cast(ctx, y, KEEL_BF16), KEEL_F32) : y;
}

static void qk_norm_rope_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[3] = {KEEL_F32, KEEL_F32, KEEL_I32};
    /* attention's heads of 256 with 64 dims rotated and theta 1e7 (the 0.8B model's), and the
     * fixture's heads of 32, all rotated */
    const int64_t big[3][4] = {{256, 8, 12, 2}, {256, 1, 1, 1}, {12, 2, 1, 1}},
                  small[3][4] = {{32, 4, 9, 2}, {32, 1, 1, 1}, {9, 2, 1, 1}};
    check_pair("QK_NORM_ROPE", 3, big, ty, qk_norm_rope_pair, (const double[]){64, 1e7, 0});
    check_pair("QK_NORM_ROPE", 3, small, ty, qk_norm_rope_pair, (const double[]){32, 10000, 0});
    check_pair("QK_NORM_ROPE bf16", 3, big, ty, qk_norm_rope_pair, (const double[]){64, 1e7, 1});
    check_pair("QK_NORM_ROPE bf16", 3, small, ty, qk_norm_rope_pair, (const double[]){32, 10000, 1});
}

/* in: a [H,...], A_log [H], dt_bias [H] */
static keel_tensor *gdn_gate_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    (void)p;
    if (fused) return keel_gdn_gate(ctx, in[0], in[1], in[2]);
    return keel_mul(ctx, keel_softplus(ctx, keel_add(ctx, in[0], in[2])), keel_neg(ctx, keel_exp(ctx, in[1])));
}

static void gdn_gate_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[3] = {KEEL_F32, KEEL_F32, KEEL_F32};
    /* the sums over rows as cuda's REPEAT_BACK makes them: 80 rows (a chunk a row; 4 heads or more in
     * groups of 8 chunks, and fewer than 64 groups: a thread's sum), 600 rows (75 groups: a block's
     * tree over them), 21 (a thread's sum), 600,000 rows of 2 heads (chunks of 2 rows, no groups, a
     * block's tree) */
    const int64_t model[3][4] = {{16, 40, 2, 1}, {16, 1, 1, 1}, {16, 1, 1, 1}},
                  wide[3][4] = {{16, 300, 2, 1}, {16, 1, 1, 1}, {16, 1, 1, 1}},
                  few[3][4] = {{4, 7, 3, 1}, {4, 1, 1, 1}, {4, 1, 1, 1}},
                  many[3][4] = {{2, 600000, 1, 1}, {2, 1, 1, 1}, {2, 1, 1, 1}};
    check_pair("GDN_GATE", 3, model, ty, gdn_gate_pair, NULL);
    check_pair("GDN_GATE", 3, wide, ty, gdn_gate_pair, NULL);
    check_pair("GDN_GATE", 3, few, ty, gdn_gate_pair, NULL);
    check_pair("GDN_GATE", 3, many, ty, gdn_gate_pair, NULL);
}

/* in: x, gate; p (bf16): the bf16 result against the ops then CAST, each read back as float32 */
static keel_tensor *sigmoid_mul_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    if (p && fused) return keel_cast(ctx, keel_sigmoid_mul_bf16(ctx, in[0], in[1]), KEEL_F32);
    keel_tensor *y = fused ? keel_sigmoid_mul(ctx, in[0], in[1]) : keel_mul(ctx, in[0], keel_sigmoid(ctx, in[1]));
    return p ? keel_cast(ctx, keel_cast(ctx, y, KEEL_BF16), KEEL_F32) : y;
}

static void sigmoid_mul_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[2] = {KEEL_F32, KEEL_F32};
    const int64_t heads[2][4] = {{256, 4, 6, 2}, {256, 4, 6, 2}}, odd[2][4] = {{7, 5, 3, 1}, {7, 5, 3, 1}};
    const double bf16 = 1;
    check_pair("SIGMOID_MUL", 2, heads, ty, sigmoid_mul_pair, NULL);
    check_pair("SIGMOID_MUL", 2, odd, ty, sigmoid_mul_pair, NULL);
    check_pair("SIGMOID_MUL bf16", 2, heads, ty, sigmoid_mul_pair, &bf16);
    check_pair("SIGMOID_MUL bf16", 2, odd, ty, sigmoid_mul_pair, &bf16);
}

/* in: x, dy: SIGMOID_BACK of sigmoid(x) against the SCALE and two MULs of SIGMOID's old rule */
static keel_tensor *sigmoid_back_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    (void)p;
    keel_tensor *y = keel_sigmoid(ctx, in[0]);
    if (fused) return keel_sigmoid_back(ctx, y, in[1]);
    return keel_mul(ctx, in[1], keel_mul(ctx, y, keel_scale(ctx, y, -1.0, 1.0)));
}

static void sigmoid_back_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[2] = {KEEL_F32, KEEL_F32};
    const int64_t dense[2][4] = {{256, 8, 6, 2}, {256, 8, 6, 2}}, odd[2][4] = {{7, 5, 3, 1}, {7, 5, 3, 1}};
    check_pair_of("SIGMOID_BACK", 2, dense, ty, sigmoid_back_pair, NULL, false);
    check_pair_of("SIGMOID_BACK", 2, odd, ty, sigmoid_back_pair, NULL, false);
}

/* in: dy [D,N0,N1], ids [N0,N1] (ids 0..4, repeated), c [D,R]: the rows' sums added to c */
static keel_tensor *get_rows_back_add_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    (void)p;
    if (fused) return keel_get_rows_back_add(ctx, in[0], in[1], in[2]);
    return keel_add(ctx, in[2], keel_get_rows_back(ctx, in[0], in[1], in[2]->ne[1]));
}

static void get_rows_back_add_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[3] = {KEEL_F32, KEEL_I32, KEEL_F32};
    const int64_t wide[3][4] = {{1100, 12, 2, 1}, {12, 2, 1, 1}, {1100, 7, 1, 1}},
                  dense[3][4] = {{256, 12, 2, 1}, {12, 2, 1, 1}, {256, 9, 1, 1}};
    check_pair_of("GET_ROWS_BACK_ADD", 3, wide, ty, get_rows_back_add_pair, NULL, false);
    check_pair_of("GET_ROWS_BACK_ADD", 3, dense, ty, get_rows_back_add_pair, NULL, false);
}

/* in: x [D,R], w [D], dy, g (x's shape); p[0]: the 1 + w form. Unfused: ADD(g, dx) as autodiff's
 * keel_grad_add adds (the gradient so far, then the contribution), and dw after it. */
static keel_tensor *norm_back_add_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    int64_t one = p[0] != 0, n = keel_nelements(in[0]), D = in[0]->ne[0];
    double eps = 1e-6;
    if (fused)
        return keel_op_new(ctx, KEEL_OP_RMS_NORM_W_BACK_ADD, (keel_tensor *const[]){in[0], in[1], in[2], in[3]}, 4,
                           &one, 1, &eps, 1);
    keel_tensor *pk =
        keel_op_new(ctx, KEEL_OP_RMS_NORM_W_BACK, (keel_tensor *const[]){in[0], in[1], in[2]}, 3, &one, 1, &eps, 1);
    keel_tensor *dx = keel_add(ctx, keel_reshape_4d(ctx, in[3], n, 1, 1, 1), keel_view_1d(ctx, pk, n, 0));
    return keel_concat(ctx, dx, keel_view_1d(ctx, pk, D, n * 4), 0);
}

static void norm_back_add_is_its_ops(void **st) {
    (void)st;
    const keel_type ty[4] = {KEEL_F32, KEEL_F32, KEEL_F32, KEEL_F32};
    /* rows of 1024 (the 0.8B's residual stream: cuda's pipelined kernel), 33 (its register kernel) */
    const int64_t hidden[4][4] = {{1024, 9, 1, 1}, {1024, 1, 1, 1}, {1024, 9, 1, 1}, {1024, 9, 1, 1}},
                  odd[4][4] = {{33, 7, 1, 1}, {33, 1, 1, 1}, {33, 7, 1, 1}, {33, 7, 1, 1}};
    check_pair_of("RMS_NORM_W_BACK_ADD", 4, hidden, ty, norm_back_add_pair, (const double[]){1}, false);
    check_pair_of("RMS_NORM_W_BACK_ADD", 4, odd, ty, norm_back_add_pair, (const double[]){0}, false);
}

/* The norms' backward with its bf16 part (ip1) against the same op without it, its part then CAST:
 * [dx | the bf16 part read back as float32 | dw]. p[0]: 0 RMS_NORM_W_BACK, 1 RMS_NORM_W_BACK_ADD (the
 * part: dx's copy), 2 GATED_RMS_NORM_BACK (the part: dz, in place of the float32 dz); p[1]: the 1 + w
 * form (not the gated norm's). in: x, w, then dy (and g), or z and dy. */
static keel_tensor *norm_back_bf16_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    int op = p[0] == 0   ? KEEL_OP_RMS_NORM_W_BACK
             : p[0] == 1 ? KEEL_OP_RMS_NORM_W_BACK_ADD
                         : KEEL_OP_GATED_RMS_NORM_BACK;
    int64_t ip[2] = {p[0] == 2 ? 0 : (int64_t)p[1], fused ? KEEL_BF16 : 0}, n = keel_nelements(in[0]), D = in[0]->ne[0];
    double eps = 1e-6;
    keel_tensor *pk = keel_op_new(ctx, op, in, p[0] == 0 ? 3 : 4, ip, 2, &eps, 1);
    keel_tensor *dx = keel_view_1d(ctx, pk, n, 0), *dw = keel_view_1d(ctx, pk, D, (keel_nelements(pk) - D) * 4);
    keel_tensor *part = fused ? keel_view_4d_as(ctx, pk, KEEL_BF16, n, 1, 1, 1, 2 * n, 2 * n, 2 * n, n * 4)
                              : keel_cast(ctx, p[0] == 2 ? keel_view_1d(ctx, pk, n, n * 4) : dx, KEEL_BF16);
    return keel_concat(ctx, keel_concat(ctx, dx, keel_cast(ctx, part, KEEL_F32), 0), dw, 0);
}

static void norm_back_bf16_part_is_cast(void **st) {
    (void)st;
    with_ref = true; /* ref's bf16 part is its float32 part rounded, as its CAST rounds it */
    const keel_type ty[4] = {KEEL_F32, KEEL_F32, KEEL_F32, KEEL_F32};
    /* rows of 1024 (the residual stream: cuda's kernel that sums dw itself, PM 32), 128 (the DeltaNet's
     * gated norm, PM 4) and 33 (its register kernel; 231 values, an odd count, in the bf16 part) */
    const int64_t hidden[4][4] = {{1024, 9, 1, 1}, {1024, 1, 1, 1}, {1024, 9, 1, 1}, {1024, 9, 1, 1}},
                  heads[4][4] = {{128, 16, 3, 2}, {128, 1, 1, 1}, {128, 16, 3, 2}, {128, 16, 3, 2}},
                  odd[4][4] = {{33, 7, 1, 1}, {33, 1, 1, 1}, {33, 7, 1, 1}, {33, 7, 1, 1}};
    check_pair_of("RMS_NORM_W_BACK bf16", 3, hidden, ty, norm_back_bf16_pair, (const double[]){0, 1}, false);
    check_pair_of("RMS_NORM_W_BACK bf16", 3, odd, ty, norm_back_bf16_pair, (const double[]){0, 0}, false);
    check_pair_of("..._BACK_ADD bf16", 4, hidden, ty, norm_back_bf16_pair, (const double[]){1, 1}, false);
    check_pair_of("..._BACK_ADD bf16", 4, odd, ty, norm_back_bf16_pair, (const double[]){1, 0}, false);
    check_pair_of("GATED_..._BACK bf16", 4, heads, ty, norm_back_bf16_pair, (const double[]){2, 0}, false);
    check_pair_of("GATED_..._BACK bf16", 4, odd, ty, norm_back_bf16_pair, (const double[]){2, 0}, false);
    with_ref = false;
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
    keel_tensor *w2 = keel_new_1d(ctx, KEEL_F32, 39), *z2 = keel_new_2d(ctx, KEEL_F32, 40, 11);
    assert_null(keel_rms_norm_w(ctx, x, w2, 1e-6, true));
    assert_non_null(strstr(keel_last_error(), "one weight per element of a row (40)"));
    assert_null(keel_gated_rms_norm(ctx, x, keel_new_1d(ctx, KEEL_F32, 40), z2, 1e-6));
    assert_non_null(strstr(keel_last_error(), "z must be shaped like x"));
    keel_ctx_free(ctx);
}

/* in: q [D,H,T,B], k and v [D,KV,T,B], positions [T,B]: FLASH_ATTN_BACK from do alone (the model's
 * backward, where only o is read) against the same from [do | 0] (values: a backward op) */
static keel_tensor *fa_back_pair(keel_ctx *ctx, keel_tensor **in, bool fused, const double *p) {
    (void)p;
    keel_tensor *o = keel_flash_attn(ctx, in[0], in[1], in[2], in[3], 0.25, KEEL_F32);
    if (!o) return NULL;
    int64_t n_o = in[2]->ne[0] * in[0]->ne[1] * in[0]->ne[2] * in[0]->ne[3];
    keel_tensor *d = keel_scale(ctx, keel_view_1d(ctx, o, n_o, 0), 0.5, 0.25); /* a gradient of o */
    keel_tensor *dy =
        fused ? d
              : keel_concat(ctx, d, keel_fill(ctx, KEEL_F32, (int64_t[]){keel_nelements(o) - n_o, 1, 1, 1}, 0.0), 0);
    keel_tensor *src[6] = {in[0], in[1], in[2], in[3], o, dy};
    return keel_op_new(ctx, KEEL_OP_FLASH_ATTN_BACK, src, 6, o->ip, 1, o->fp, 1);
}

static void flash_attn_back_from_do_alone(void **st) {
    (void)st;
    const keel_type ty[4] = {KEEL_F32, KEEL_F32, KEEL_F32, KEEL_I32};
    const int64_t small[4][4] = {{16, 4, 20, 2}, {16, 2, 20, 2}, {16, 2, 20, 2}, {20, 2, 1, 1}},
                  model[4][4] = {{256, 4, 70, 1}, {256, 1, 70, 1}, {256, 1, 70, 1}, {70, 1, 1, 1}};
    check_pair_of("FLASH_ATTN_BACK", 4, small, ty, fa_back_pair, NULL, false);
    check_pair_of("FLASH_ATTN_BACK", 4, model, ty, fa_back_pair, NULL, false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flash_attn_back_from_do_alone),
        cmocka_unit_test(gdn_conv_is_its_ops),
        cmocka_unit_test(swiglu_is_its_ops),
        cmocka_unit_test(gated_rms_norm_is_its_ops),
        cmocka_unit_test(rms_norm_w_is_its_ops),
        cmocka_unit_test(qk_norm_rope_is_its_ops),
        cmocka_unit_test(gdn_gate_is_its_ops),
        cmocka_unit_test(sigmoid_back_is_its_ops),
        cmocka_unit_test(get_rows_back_add_is_its_ops),
        cmocka_unit_test(sigmoid_mul_is_its_ops),
        cmocka_unit_test(norm_back_add_is_its_ops),
        cmocka_unit_test(norm_back_bf16_part_is_cast),
        cmocka_unit_test(gdn_conv_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
