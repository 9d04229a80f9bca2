/* keel: ids out of range, on every backend. GET_ROWS, GET_ROWS_BACK(_ADD) and the cross-entropy ops read
 * int32 ids or targets; one outside its range must make the run fail with a message naming the node,
 * the value and where it is (never a wild read, never a loss computed from garbage), and the backend
 * must run the next, valid, batch as if nothing had happened. The CUDA backend checks ids on the
 * device and names the node after the run; the others check them on the host before the kernel. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "ops/ops.h"
#include "testops/testops.h"
#include "util/error.h"

typedef enum { BAD_GET_ROWS, BAD_GET_ROWS_BACK, BAD_GET_ROWS_BACK_ADD, BAD_CE, BAD_LINEAR_CE, BAD_COUNT } bad_kind;

static const int bad_op[BAD_COUNT] = {KEEL_OP_GET_ROWS, KEEL_OP_GET_ROWS_BACK, KEEL_OP_GET_ROWS_BACK_ADD,
                                      KEEL_OP_CROSS_ENTROPY_LOSS, KEEL_OP_LINEAR_CROSS_ENTROPY};

/* The node under test over 3 ids of which ids[1] is the one varied; 5 rows (classes) everywhere */
static keel_tensor *build(keel_ctx *ctx, bad_kind k, keel_tensor **vals, keel_tensor **ids) {
    *ids = keel_set_flags(keel_new_1d(ctx, KEEL_I32, 3), KEEL_FLAG_INPUT);
    switch (k) {
    case BAD_GET_ROWS:
        *vals = keel_new_2d(ctx, KEEL_F32, 4, 5);
        return keel_get_rows(ctx, *vals, *ids);
    case BAD_GET_ROWS_BACK:
        *vals = keel_new_2d(ctx, KEEL_F32, 4, 3);
        return keel_get_rows_back(ctx, *vals, *ids, 5);
    case BAD_GET_ROWS_BACK_ADD:
        *vals = keel_new_2d(ctx, KEEL_F32, 4, 3);
        return keel_get_rows_back_add(ctx, *vals, *ids,
                                      keel_set_flags(keel_new_2d(ctx, KEEL_F32, 4, 5), KEEL_FLAG_INPUT));
    case BAD_CE:
        *vals = keel_new_2d(ctx, KEEL_F32, 5, 3);
        return keel_cross_entropy_loss(ctx, *vals, *ids);
    default: {
        *vals = keel_new_2d(ctx, KEEL_F32, 4, 3);
        keel_tensor *w = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 4, 5), KEEL_FLAG_INPUT);
        keel_tensor *out = keel_linear_cross_entropy(ctx, *vals, w, *ids, 2);
        if (out) keel_set_name(w, "bad_ids.w");
        return out;
    }
    }
}

/* One kind on one backend: a run with ids[1] = bad fails naming the node and the value (or, a
 * negative target, runs: no loss there), then a run with it valid succeeds. 1 on an unexpected outcome. */
static int check(keel_backend *be, bad_kind k, int32_t bad) {
    bool want_error = bad >= 0 || k <= BAD_GET_ROWS_BACK_ADD;
    const char *op = keel_op_get(bad_op[k])->name;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *vals, *ids, *out = ctx ? build(ctx, k, &vals, &ids) : NULL;
    keel_graph *g = NULL;
    keel_session *s = NULL;
    int fail = 1;
    char msg[512] = "";
    if (out) {
        keel_set_flags(vals, KEEL_FLAG_INPUT);
        keel_set_name(out, "bad_ids.%s", op);
        out->flags |= KEEL_FLAG_OUTPUT;
        g = keel_graph_build(ctx, &out, 1);
    }
    if (g) s = keel_session_new(be, g, NULL);
    if (!s) {
        printf("bad ids %s %s: HARNESS ERROR (%s)\n", op, be->name, keel_last_error());
        goto done;
    }
    /* every leaf: ones, the ids {0, bad, 2} */
    for (int64_t i = 0; i < g->n_leafs; i++) {
        keel_tensor *l = g->leafs[i];
        if (l == ids) continue;
        float one[64];
        for (int j = 0; j < 64; j++) one[j] = 1.0f;
        if (keel_nelements(l) > 64 || keel_tensor_write(be, l, one, KEEL_F32)) goto done;
    }
    int32_t v[3] = {0, bad, 2};
    if (keel_tensor_write(be, ids, v, KEEL_I32)) goto done;
    int rc = keel_session_run(s, NULL, NULL);
    snprintf(msg, sizeof msg, "%s", rc ? keel_last_error() : "(no error)");
    char want_v[64], want_n[96];
    snprintf(want_v, sizeof want_v, "%s %d ", k >= BAD_CE ? "target" : "id", bad);
    snprintf(want_n, sizeof want_n, "%s 'bad_ids.%s'", op, op);
    bool named = want_error ? rc && strstr(msg, want_v) && strstr(msg, want_n) && strstr(msg, "outside [0,5)") : !rc;
    v[1] = 1;
    bool after = keel_tensor_write(be, ids, v, KEEL_I32) == 0 && keel_session_run(s, NULL, NULL) == 0;
    fail = !(named && after);
    printf("bad ids %s %s: %s (%s%s)\n", op, be->name, fail ? "FAIL" : "OK", msg,
           after ? "; the next run with valid ids passed" : "; the next run with valid ids FAILED");
done:
    keel_session_free(s);
    keel_graph_free(g);
    keel_ctx_free(ctx);
    return fail;
}

int keel_test_bad_ids(keel_backend *be, const char *ops) {
    int failures = 0;
    for (int k = 0; k < BAD_COUNT; k++) {
        if (!keel_testops_listed(ops, keel_op_get(bad_op[k])->name)) continue;
        failures += check(be, (bad_kind)k, 5);  /* one past the last row (class) */
        failures += check(be, (bad_kind)k, -7); /* negative: an error for ids; a target with no loss is fine */
    }
    return failures;
}
