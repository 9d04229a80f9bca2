#include "unit.h"

#include "autodiff/autodiff.h"
#include "dist/grad_sync.h"

/* Three parameters whose gradients the backward pass completes at different nodes. */
typedef struct {
    keel_ctx *ctx;
    keel_graph *g;
    keel_tensor *p[3], *grad[3];
    int64_t at[3]; /* node index of each gradient */
} model;

static void build(model *m) {
    m->ctx = keel_ctx_new();
    int64_t ne[3][2] = {{8, 4}, {8, 4}, {64, 8}};
    for (int i = 0; i < 3; i++)
        m->p[i] =
            keel_set_flags(keel_set_name(keel_new_2d(m->ctx, KEEL_F32, ne[i][0], ne[i][1]), "p%d", i), KEEL_FLAG_PARAM);
    keel_tensor *x = keel_set_flags(keel_new_2d(m->ctx, KEEL_F32, 8, 3), KEEL_FLAG_INPUT);
    keel_tensor *h = keel_mul_mat(m->ctx, m->p[0], x); /* [4,3] */
    h = keel_silu(m->ctx, keel_add(m->ctx, h, keel_mul_mat(m->ctx, m->p[1], x)));
    keel_tensor *loss =
        keel_add(m->ctx, keel_sum(m->ctx, keel_sqr(m->ctx, h)), keel_sum(m->ctx, keel_sqr(m->ctx, m->p[2])));
    m->g = keel_graph_build(m->ctx, &loss, 1);
    assert_non_null(m->g);
    assert_int_equal(keel_build_backward(m->g, loss), 0);
    for (int i = 0; i < 3; i++) {
        m->grad[i] = keel_graph_grad(m->g, m->p[i]);
        assert_non_null(m->grad[i]);
        m->at[i] = -1;
        for (int64_t k = 0; k < m->g->n_nodes; k++)
            if (m->g->nodes[k] == m->grad[i]) m->at[i] = k;
        assert_true(m->at[i] >= 0);
    }
}

static void done(model *m) {
    keel_graph_free(m->g);
    keel_ctx_free(m->ctx);
}

/* Buckets start in completion order, each right after the node that completes it. */
static void buckets_follow_the_backward_pass(void **st) {
    (void)st;
    model m;
    build(&m);
    keel_grad_sync *s = keel_grad_sync_new(NULL, NULL, m.g, m.grad, m.grad, 3, 1); /* every gradient its own bucket */
    assert_non_null(s);
    assert_int_equal(keel_grad_sync_n_buckets(s), 3);
    int64_t sorted[3] = {m.at[0], m.at[1], m.at[2]};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (sorted[j] < sorted[i]) {
                int64_t x = sorted[i];
                sorted[i] = sorted[j], sorted[j] = x;
            }
    keel_grad_sync_begin(s);
    for (int64_t k = 0; k < m.g->n_nodes; k++) {
        assert_int_equal(keel_grad_sync_node(s, k), 0);
        int want = (k >= sorted[0]) + (k >= sorted[1]) + (k >= sorted[2]);
        assert_int_equal(keel_grad_sync_started(s), want);
    }
    assert_int_equal(keel_grad_sync_finish(s), 0);
    keel_grad_sync_begin(s); /* a second run starts from nothing; finish starts all */
    assert_int_equal(keel_grad_sync_started(s), 0);
    assert_int_equal(keel_grad_sync_finish(s), 0);
    assert_int_equal(keel_grad_sync_started(s), 3);
    keel_grad_sync_free(s);
    /* a large bucket takes every gradient, ready when the last one is */
    s = keel_grad_sync_new(NULL, NULL, m.g, m.grad, m.grad, 3, 1 << 20);
    assert_int_equal(keel_grad_sync_n_buckets(s), 1);
    keel_grad_sync_begin(s);
    assert_int_equal(keel_grad_sync_node(s, sorted[2] - 1), 0);
    assert_int_equal(keel_grad_sync_started(s), 0);
    assert_int_equal(keel_grad_sync_node(s, sorted[2]), 0);
    assert_int_equal(keel_grad_sync_started(s), 1);
    keel_grad_sync_free(s);
    done(&m);
}

/* A buffer NCCL could not take as one block is refused by name. */
static void non_contiguous_gradient_refused(void **st) {
    (void)st;
    model m;
    build(&m);
    keel_tensor *bufs[3] = {m.grad[0], keel_transpose(m.ctx, m.grad[1]), m.grad[2]};
    assert_null(keel_grad_sync_new(NULL, NULL, m.g, bufs, m.grad, 3, 1));
    assert_non_null(strstr(keel_last_error(), "must be contiguous float32"));
    keel_tensor *writers[3] = {m.grad[0], keel_sqr(m.ctx, m.grad[1]), m.grad[2]}; /* a node outside the graph */
    assert_null(keel_grad_sync_new(NULL, NULL, m.g, m.grad, writers, 3, 1));
    assert_non_null(strstr(keel_last_error(), "is not written by a node of the graph"));
    done(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(buckets_follow_the_backward_pass),
                                       cmocka_unit_test(non_contiguous_gradient_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
