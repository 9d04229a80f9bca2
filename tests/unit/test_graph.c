#include "unit.h"

static void topological_and_named(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_name(keel_new_1d(ctx, KEEL_F32, 4), "x");
    keel_tensor *w = keel_set_name(keel_new_1d(ctx, KEEL_F32, 4), "w");
    keel_tensor *a = keel_mul(ctx, x, w);
    keel_tensor *b = keel_add(ctx, a, x);
    keel_tensor *c = keel_sum(ctx, keel_mul(ctx, b, a));
    keel_graph *g = keel_graph_build(ctx, &c, 1);
    assert_int_equal(g->n_leafs, 2);
    assert_int_equal(g->n_nodes, 4);
    for (int64_t i = 0; i < g->n_nodes; i++) { /* sources come first */
        keel_tensor *t = g->nodes[i];
        for (int k = 0; k < keel_op_get(t->op)->arity; k++) {
            keel_tensor *s = t->src[k];
            if (s->op == KEEL_OP_NONE) continue;
            int64_t j = 0;
            while (g->nodes[j] != s) j++;
            assert_true(j < i);
        }
    }
    /* default names are stable: op name and creation index */
    char want[32];
    snprintf(want, sizeof want, "mul#%lld", (long long)a->id);
    assert_string_equal(a->name, want);
    assert_ptr_equal(keel_graph_find(g, want), a);
    assert_ptr_equal(keel_graph_find(g, "w"), w);
    assert_null(keel_graph_find(g, "nope"));
    /* expanding with something already there adds nothing */
    assert_int_equal(keel_graph_expand(g, b), 0);
    assert_int_equal(g->n_nodes, 4);
    assert_true(c->flags & KEEL_FLAG_OUTPUT);
    /* a NULL output (failed constructor) is an error, not a crash */
    keel_tensor *bad = keel_add(ctx, x, keel_new_1d(ctx, KEEL_F32, 5));
    assert_null(keel_graph_build(ctx, &bad, 1));
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(topological_and_named)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
