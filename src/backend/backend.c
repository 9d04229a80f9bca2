#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/error.h"
#include "util/faults.h"

void keel_backend_free(keel_backend *be) {
    if (be) be->destroy(be);
}

int keel_backend_read_fault(keel_backend *be) { return keel_fault_copy_row_limit(&be->fault_row_limit); }

int keel_backend_callback_failed(const keel_tensor *t) {
    char msg[1536];
    snprintf(msg, sizeof msg, "%s", keel_last_error());
    return keel_fail("%s (in the node callback after '%s')", msg[0] ? msg : "run stopped", t->name);
}

static size_t node_scratch(void *be, const keel_tensor *node) {
    return ((keel_backend *)be)->scratch_bytes((keel_backend *)be, node);
}

static size_t node_carry(void *be, const keel_graph *g, int64_t reader, int64_t *writer) {
    return ((keel_backend *)be)->carry_bytes((keel_backend *)be, g, reader, writer);
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
    keel_plan_opts o = opts ? *opts : (keel_plan_opts){0};
    if (be->scratch_bytes) o.scratch_bytes = node_scratch, o.scratch_ud = be;
    if (be->carry_bytes) o.carry = node_carry, o.scratch_ud = be;
    s->plan = keel_plan_make(g, &o);
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
    for (int k = 0; k < g->n_groups; k++) { /* kernels over a group's flat tensor read the gaps: zero */
        const keel_tensor *f = g->groups[k].flat;
        if (be->fill_bytes(be, (char *)s->arena + s->plan->offset[f->id], 0, keel_nbytes(f))) {
            keel_session_free(s);
            return NULL;
        }
    }
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

unsigned char *keel_tensor_read_raw_flat(keel_backend *be, const keel_tensor *t, size_t *n_bytes) {
    size_t span = keel_nbytes(t), es = keel_type_size(t->type);
    int64_t n = keel_nelements(t);
    bool flat = keel_is_contiguous(t); /* already in flat order: the span is the result */
    unsigned char *raw = malloc(span ? span : 1), *out = flat ? raw : malloc((size_t)n * es + 1);
    if (!raw || !out || be->read(be, raw, t->data, span)) {
        free(raw);
        if (out != raw) free(out);
        keel_fail("cannot read '%s' from the %s backend", t->name, be->name);
        return NULL;
    }
    if (!flat) {
        int64_t k = 0;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                    for (int64_t i0 = 0; i0 < t->ne[0]; i0++, k++)
                        memcpy(out + (size_t)k * es,
                               raw + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], es);
        free(raw);
    }
    *n_bytes = (size_t)n * es;
    return out;
}
