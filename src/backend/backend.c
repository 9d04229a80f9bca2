#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/error.h"

keel_backend *keel_backend_ref_new(void);
keel_backend *keel_backend_cpu_new(int n_threads);
#ifdef KEEL_HAVE_CUDA
keel_backend *keel_backend_cuda_new(void);
#endif

const char *keel_backend_list(void) {
#ifdef KEEL_HAVE_CUDA
    return "ref,cpu,cuda";
#else
    return "ref,cpu";
#endif
}

keel_backend *keel_backend_new(const char *name, int n_threads) {
    keel_backend *be = NULL;
    if (strcmp(name, "ref") == 0)
        be = keel_backend_ref_new();
    else if (strcmp(name, "cpu") == 0)
        be = keel_backend_cpu_new(n_threads);
#ifdef KEEL_HAVE_CUDA
    else if (strcmp(name, "cuda") == 0)
        be = keel_backend_cuda_new();
#endif
    else {
        keel_fail("unknown backend '%s' (this build has: %s)", name, keel_backend_list());
        return NULL;
    }
    return be;
}

void keel_backend_free(keel_backend *be) {
    if (be) be->destroy(be);
}

int keel_backend_read_fault(keel_backend *be) {
    be->fault_row_limit = 0;
    const char *f = getenv("KEEL_FAULT");
    if (!f || !*f) return 0;
    long long n = 0;
    char tail;
    if (sscanf(f, "copy-row-limit:%lld%c", &n, &tail) != 1 || n <= 0)
        return keel_fail("KEEL_FAULT='%s': expected copy-row-limit:N with N > 0", f);
    be->fault_row_limit = n;
    return 0;
}

int keel_backend_read_ids(keel_backend *be, const keel_tensor *t, const keel_tensor *ids, int64_t limit,
                          const char *what, int32_t **out) {
    int64_t n = keel_nelements(ids);
    int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) return keel_fail("out of memory reading the ids of '%s'", t->name);
    if (keel_tensor_read(be, ids, v, KEEL_I32)) {
        free(v);
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        if (v[i] < 0 || v[i] >= limit) {
            int rc = keel_fail("%s '%s': %s %d at flat index %lld outside [0,%lld)", keel_op_get(t->op)->name, t->name,
                               what, v[i], (long long)i, (long long)limit);
            free(v);
            return rc;
        }
    if (out)
        *out = v;
    else
        free(v);
    return 0;
}

void keel_rows_by_id(const int32_t *ids, int64_t n, int64_t R, int64_t *start, int64_t *items) {
    for (int64_t r = 0; r <= R; r++) start[r] = 0;
    for (int64_t i = 0; i < n; i++) start[ids[i] + 1]++;
    for (int64_t r = 0; r < R; r++) start[r + 1] += start[r];   /* start[r]: where group r begins */
    for (int64_t i = 0; i < n; i++) items[start[ids[i]]++] = i; /* ascending i; start[r] ends at group r's end */
    for (int64_t r = R; r > 0; r--) start[r] = start[r - 1];    /* ... which is where group r + 1 begins */
    start[0] = 0;
}

int keel_backend_callback_failed(const keel_tensor *t) {
    char msg[1536];
    snprintf(msg, sizeof msg, "%s", keel_last_error());
    return keel_fail("%s (in the node callback after '%s')", msg[0] ? msg : "run stopped", t->name);
}

/* Sources that hold integer indices rather than values. */
static bool is_index_src(int op, int i) {
    return i == 1 &&
           (op == KEEL_OP_GET_ROWS || op == KEEL_OP_GET_ROWS_BACK || op == KEEL_OP_ROPE || op == KEEL_OP_ROPE_BACK ||
            op == KEEL_OP_CROSS_ENTROPY_LOSS || op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK);
}

bool keel_backend_f32_supports(const keel_tensor *t) {
    const keel_op_info *info = keel_op_get(t->op);
    if (info->flags & OPF_VIEW) return true;
    switch (t->op) {
    case KEEL_OP_CPY:
    case KEEL_OP_CONT:
    case KEEL_OP_DUP:
    case KEEL_OP_CONCAT:
    case KEEL_OP_ACC:
    case KEEL_OP_SET:
        return true;
    case KEEL_OP_GET_ROWS:
        return t->src[1]->type == KEEL_I32;
    default:
        break;
    }
    if (t->type != KEEL_F32) return false;
    for (int i = 0; i < info->arity; i++) {
        keel_type want = is_index_src(t->op, i) ? KEEL_I32 : KEEL_F32;
        if (t->src[i]->type != want) return false;
    }
    return true;
}

int keel_backend_run_acc_set(keel_backend *be, const keel_tensor *t) {
    if (!t->ip[4] && be->copy(be, t, t->src[0], false)) return -1;
    keel_tensor w = keel_acc_window(t);
    return be->copy(be, &w, t->src[1], t->op == KEEL_OP_ACC);
}

int keel_backend_run_concat(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    int d = (int)t->ip[0];
    keel_tensor w = *t;
    memcpy(w.ne, a->ne, sizeof w.ne);
    if (be->copy(be, &w, a, false)) return -1;
    memcpy(w.ne, b->ne, sizeof w.ne);
    w.data = (char *)t->data + a->ne[d] * t->nb[d];
    return be->copy(be, &w, b, false);
}

keel_session *keel_session_new(keel_backend *be, keel_graph *g, const keel_plan_opts *opts) {
    for (int64_t i = 0; i < g->n_nodes; i++) {
        const keel_tensor *t = g->nodes[i];
        if (!be->supports(be, t)) {
            char buf[64];
            keel_fail("backend %s has no kernel for %s (%s, %s) at node '%s'", be->name, keel_op_get(t->op)->name,
                      keel_type_name(t->type), keel_shape_str(t->ne, buf, sizeof buf), t->name);
            return NULL;
        }
    }
    keel_session *s = calloc(1, sizeof *s);
    if (!s) {
        keel_fail("out of memory");
        return NULL;
    }
    s->be = be;
    s->g = g;
    s->plan = keel_plan_make(g, opts);
    if (!s->plan) {
        free(s);
        return NULL;
    }
    s->arena = be->alloc(be, s->plan->total_bytes ? s->plan->total_bytes : KEEL_ALIGN);
    if (!s->arena) {
        keel_fail("backend %s: cannot allocate %zu bytes for the graph", be->name, s->plan->total_bytes);
        keel_plan_free(s->plan);
        free(s);
        return NULL;
    }
    keel_plan_bind(s->plan, g, s->arena);
    return s;
}

void keel_session_free(keel_session *s) {
    if (!s) return;
    s->be->free(s->be, s->arena);
    keel_plan_free(s->plan);
    free(s);
}

int keel_session_run(keel_session *s, keel_node_cb cb, void *ud) {
    return s->be->compute(s->be, s->g, 0, s->g->n_nodes, cb, ud);
}

/* Strided or converting transfers stage the host bytes in a contiguous scratch tensor on the
 * backend and let the backend's one copy routine do the rest. */
static int staged(keel_backend *be, keel_tensor *t, void *host, keel_type host_type, bool to_backend) {
    keel_tensor tmp = *t;
    tmp.type = host_type;
    keel_set_contiguous_strides(&tmp);
    size_t n = keel_nbytes(&tmp);
    tmp.data = be->alloc(be, n);
    if (!tmp.data) return keel_fail("backend %s: cannot allocate %zu staging bytes for '%s'", be->name, n, t->name);
    int rc;
    if (to_backend) {
        rc = be->write(be, tmp.data, host, n);
        if (!rc) rc = be->copy(be, t, &tmp, false);
    } else {
        rc = be->copy(be, &tmp, t, false);
        if (!rc) rc = be->read(be, host, tmp.data, n);
    }
    be->free(be, tmp.data);
    return rc;
}

int keel_tensor_write(keel_backend *be, keel_tensor *t, const void *host, keel_type host_type) {
    if (!t->data) return keel_fail("tensor '%s' has no memory (is it in the graph?)", t->name);
    if (host_type == t->type && keel_is_contiguous(t)) return be->write(be, t->data, host, keel_nbytes(t));
    return staged(be, t, (void *)host, host_type, true);
}

int keel_tensor_read(keel_backend *be, const keel_tensor *t, void *host, keel_type host_type) {
    if (!t->data) return keel_fail("tensor '%s' has no memory (is it in the graph?)", t->name);
    if (host_type == t->type && keel_is_contiguous(t)) return be->read(be, host, t->data, keel_nbytes(t));
    return staged(be, (keel_tensor *)t, host, host_type, false);
}

double *keel_tensor_read_f64(keel_backend *be, const keel_tensor *t) {
    double *d = malloc((size_t)keel_nelements(t) * sizeof *d);
    if (!d) {
        keel_fail("out of memory reading '%s'", t->name);
        return NULL;
    }
    if (keel_tensor_read(be, t, d, KEEL_F64)) {
        free(d);
        return NULL;
    }
    return d;
}
