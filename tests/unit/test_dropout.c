/* DROPOUT's mask (ops/dropout_mask.h) as a random source: the dropped fraction is p, pairs of
 * neighbouring elements are independent, and other seeds, streams or counters give independent
 * masks (each within 5 standard deviations over 2^20 draws); then the op in a graph: the backward
 * pass applies the forward's mask (d sum(dropout(x)) / dx = keep / (1-p)), and a new counter set
 * by keel_dropout_set_counter changes both together. */
#include "unit.h"

#include "ops/dropout_mask.h"

#define N (1 << 20)

static void within(double got, double want_p, const char *what) {
    double sd = sqrt(want_p * (1 - want_p) / N);
    printf("%-40s %.5f (expected %.5f, 5 sd = %.5f)\n", what, got, want_p, 5 * sd);
    assert_true(fabs(got - want_p) <= 5 * sd);
}

static void mask_statistics(void **st) {
    (void)st;
    const double ps[] = {0.1, 0.5, 0.9};
    for (int k = 0; k < 3; k++) {
        double p = ps[k];
        uint64_t thr = (uint64_t)llround(p * 4294967296.0), key = keel_dropout_key(42, 3, 7);
        uint64_t other[3] = {keel_dropout_key(43, 3, 7), keel_dropout_key(42, 4, 7), keel_dropout_key(42, 3, 8)};
        int64_t dropped = 0, both = 0, same[3] = {0, 0, 0};
        int prev = 1;
        for (int64_t i = 0; i < N; i++) {
            int keep = keel_dropout_keep(key, (uint64_t)i, thr);
            dropped += !keep;
            if (i % 2) both += !keep && !prev; /* disjoint pairs (0,1), (2,3), ... */
            prev = keep;
            for (int o = 0; o < 3; o++) same[o] += keep == keel_dropout_keep(other[o], (uint64_t)i, thr);
        }
        char what[64];
        snprintf(what, sizeof what, "p %.1f: dropped", p);
        within((double)dropped / N, p, what);
        double pairs = N / 2;
        double sd = sqrt(p * p * (1 - p * p) / pairs);
        printf("p %.1f: both of a pair dropped %.5f (expected %.5f)\n", p, both / pairs, p * p);
        assert_true(fabs(both / pairs - p * p) <= 5 * sd);
        const char *names[3] = {"another seed", "another stream", "another counter"};
        for (int o = 0; o < 3; o++) {
            snprintf(what, sizeof what, "p %.1f: same decision, %s", p, names[o]);
            within((double)same[o] / N, p * p + (1 - p) * (1 - p), what);
        }
    }
}

static void backward_uses_the_forward_mask(void **st) {
    (void)st;
    const double p = 0.3;
    const int n = 4096;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_flags(keel_set_name(keel_new_2d(ctx, KEEL_F32, 64, n / 64), "x"), KEEL_FLAG_PARAM);
    keel_tensor *y = keel_dropout(ctx, x, p, 11, 2);
    keel_tensor *loss = keel_sum(ctx, y);
    keel_graph *g = keel_graph_build(ctx, &loss, 1);
    assert_int_equal(keel_build_backward(g, loss), 0);
    y->flags |= KEEL_FLAG_OUTPUT;
    double *xv = malloc(n * sizeof *xv);
    for (int i = 0; i < n; i++) xv[i] = 1.0 + i % 7;
    double *vals[1] = {xv};
    keel_tensor *leaves[1] = {x};
    int differ = 0;
    int *first = malloc(n * sizeof *first);
    for (int counter = 0; counter < 2; counter++) {
        keel_dropout_set_counter(g, counter * 5);
        for (int b = 0; b < 2; b++) {
            const char *be = b ? "cpu" : "ref";
            double *yv = run_graph(be, g, leaves, vals, 1, y),
                   *gx = run_graph(be, g, leaves, vals, 1, keel_graph_grad(g, x));
            uint64_t key = keel_dropout_key(11, 2, (uint64_t)(counter * 5)), thr = (uint64_t)llround(p * 4294967296.0);
            for (int i = 0; i < n; i++) {
                int keep = keel_dropout_keep(key, (uint64_t)i, thr);
                assert_true(fabs(yv[i] - (keep ? xv[i] / (1 - p) : 0.0)) <= 1e-6 * xv[i]);
                assert_true(fabs(gx[i] - (keep ? 1 / (1 - p) : 0.0)) <= 1e-6);
                if (counter == 0)
                    first[i] = keep;
                else
                    differ += keep != first[i];
            }
            free(yv), free(gx);
        }
    }
    assert_true(differ > n / 4); /* new masks with the new counter (2 x 2p(1-p) n expected) */
    free(first), free(xv);
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(mask_statistics),
                                       cmocka_unit_test(backward_uses_the_forward_mask)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
