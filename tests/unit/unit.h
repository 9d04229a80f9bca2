/* Shared includes for keel's cmocka unit tests. */
#ifndef KEEL_UNIT_H
#define KEEL_UNIT_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff/autodiff.h"
#include "backend/backend.h"
#include "graph/graph.h"
#include "ops/ops.h"
#include "plan/plan.h"
#include "tensor/tensor.h"
#include "util/error.h"

/* Run a graph on a backend with the given leaf values (f64, flat) and return the output (f64). */
static inline double *run_graph(const char *backend, keel_graph *g, keel_tensor **leaves, double **vals, int n,
                                keel_tensor *out) {
    keel_backend *be = keel_backend_new(backend, 2);
    assert_non_null(be);
    keel_session *s = keel_session_new(be, g, NULL);
    assert_non_null(s);
    for (int i = 0; i < n; i++) assert_int_equal(keel_tensor_write(be, leaves[i], vals[i], KEEL_F64), 0);
    assert_int_equal(keel_session_run(s, NULL, NULL), 0);
    double *r = keel_tensor_read_f64(be, out);
    assert_non_null(r);
    keel_session_free(s);
    keel_backend_free(be);
    return r;
}
#endif
