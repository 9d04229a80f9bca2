#include <unistd.h>

#include "trace/trace.h"
#include "unit.h"

/* A backend's report of what its kernels chose (cuBLASLt's algorithms on cuda) reaches the trace,
 * survives the file, and keel diff shows it at the first divergence: here the cpu backend with a
 * stand-in report, and a flipped bit in one node of the second run. */
static const char *chose_1(keel_backend *be) {
    (void)be;
    return "algo 1";
}
static const char *chose_2(keel_backend *be) {
    (void)be;
    return "algo 2";
}

static keel_tracer *traced_run(const char *(*chose)(keel_backend *), const char *flip, const char *path) {
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_name(keel_set_flags(keel_new_2d(ctx, KEEL_F32, 4, 3), KEEL_FLAG_INPUT), "x");
    keel_tensor *y = keel_set_name(keel_sqr(ctx, x), "y"), *z = keel_set_name(keel_scale(ctx, y, 2.0, 1.0), "z");
    keel_graph *g = keel_graph_build(ctx, &z, 1);
    keel_backend *be = keel_backend_new("cpu", 1);
    assert_non_null(be);
    be->last_kernel = chose;
    keel_session *s = keel_session_new(be, g, NULL);
    assert_non_null(s);
    double v[12];
    for (int i = 0; i < 12; i++) v[i] = 0.25 * i - 1;
    assert_int_equal(keel_tensor_write(be, x, v, KEEL_F64), 0);
    keel_tracer *tr = keel_tracer_new(true, 1 << 20);
    tr->flip = flip;
    assert_int_equal(keel_tracer_begin(tr, be, g), 0);
    assert_int_equal(keel_session_run(s, keel_tracer_node, tr), 0);
    assert_int_equal(keel_trace_write(tr, path), 0);
    keel_tracer_free(tr);
    keel_session_free(s);
    keel_backend_free(be);
    keel_graph_free(g);
    keel_ctx_free(ctx);
    return keel_trace_read(path);
}

static void kernels_in_traces(void **st) {
    (void)st;
    char pa[] = "/tmp/keel-unit-trace-a.XXXXXX", pb[] = "/tmp/keel-unit-trace-b.XXXXXX";
    int fa = mkstemp(pa), fb = mkstemp(pb);
    assert_true(fa >= 0 && fb >= 0);
    keel_tracer *a = traced_run(chose_1, NULL, pa), *b = traced_run(chose_2, "z", pb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->n, 3);
    assert_string_equal(a->r[0].kernel, ""); /* the leaf ran no kernel */
    assert_string_equal(a->r[2].kernel, "algo 1");
    assert_string_equal(b->r[2].kernel, "algo 2");
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_int_equal(keel_trace_diff(a, b, 0, out), 1);
    fclose(out);
    assert_non_null(strstr(text, "first divergence: node 'z'"));
    assert_non_null(strstr(text, "kernels chosen differently: A 'algo 1', B 'algo 2'"));
    free(text);
    keel_tracer_free(a), keel_tracer_free(b);
    close(fa), close(fb), remove(pa), remove(pb);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(kernels_in_traces)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
