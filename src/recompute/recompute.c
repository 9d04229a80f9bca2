#include "recompute/recompute.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/error.h"

int keel_recompute_parse(const char *s, keel_recompute_mode *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->text, sizeof m->text, "%s", s);
    if (strcmp(s, "off") == 0) {
        m->kind = KEEL_RC_OFF;
        return 0;
    }
    if (strcmp(s, "full") == 0) {
        m->kind = KEEL_RC_FULL;
        return 0;
    }
    if (strncmp(s, "every:", 6) == 0) {
        char *end;
        long n = strtol(s + 6, &end, 10);
        if (*end || n < 1 || end == s + 6) return keel_fail("--recompute '%s': every:N needs an integer N >= 1", s);
        m->kind = KEEL_RC_EVERY;
        m->every = (int)n;
        return 0;
    }
    if (strncmp(s, "layers:", 7) == 0) {
        m->kind = KEEL_RC_LAYERS;
        const char *p = s + 7;
        if (!*p) return keel_fail("--recompute '%s': layers: needs a list like layers:1,3", s);
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= KEEL_RECOMPUTE_MAX_LAYERS || (*end && *end != ','))
                return keel_fail("--recompute '%s': layers: takes comma-separated layer numbers", s);
            m->layers[v] = 1;
            p = *end ? end + 1 : end;
        }
        return 0;
    }
    return keel_fail("--recompute '%s': expected off, full, every:N or layers:i,j,...", s);
}

typedef struct {
    keel_graph *g;
    uint8_t *keep;       /* by id: forward tensors never recomputed */
    uint8_t *is_forward; /* by id */
    keel_tensor **clone; /* by id: the clone of a forward tensor */
    keel_tensor **out;   /* the new node list */
    int64_t n_out, cap_out, n_clones;
} rc_state;

static int push(rc_state *st, keel_tensor *t) {
    if (st->n_out == st->cap_out) {
        st->cap_out = st->cap_out ? 2 * st->cap_out : 1024;
        keel_tensor **o = realloc(st->out, (size_t)st->cap_out * sizeof *o);
        if (!o) return keel_fail("out of memory rewriting the graph");
        st->out = o;
    }
    st->out[st->n_out++] = t;
    return 0;
}

static keel_tensor *clone_of(rc_state *st, keel_tensor *s) {
    if (st->keep[s->id] || !st->is_forward[s->id]) return s;
    if (st->clone[s->id]) return st->clone[s->id];
    const keel_op_info *info = keel_op_get(s->op);
    keel_tensor *src[KEEL_MAX_SRC];
    for (int k = 0; k < info->arity; k++) {
        src[k] = clone_of(st, s->src[k]);
        if (!src[k]) return NULL;
    }
    keel_tensor *c = s->op == KEEL_OP_FILL
                         ? keel_fill(st->g->ctx, s->type, s->ne, s->fp[0])
                         : keel_op_new(st->g->ctx, s->op, src, info->arity, s->ip, KEEL_MAX_IP, s->fp, KEEL_MAX_FP);
    if (!c) return NULL;
    keel_set_name(c, "%.*s@recompute", KEEL_NAME_MAX - 11, s->name);
    if (push(st, c)) return NULL;
    st->clone[s->id] = c; /* ids of clones are new: the tables are sized for them below */
    st->n_clones++;
    return c;
}

int64_t keel_recompute_apply(keel_graph *g, const keel_layer_map *lm, const keel_recompute_mode *m) {
    if (m->kind == KEEL_RC_OFF) return 0;
    if (!g->grads) return keel_fail("recompute: the graph has no backward pass");
    int64_t n_ids = keel_ctx_count(g->ctx);
    /* every clone is a new tensor: at most one per forward node */
    int64_t cap = n_ids + g->n_forward + 16;
    rc_state st = {.g = g};
    st.keep = calloc((size_t)cap, 1);
    st.is_forward = calloc((size_t)cap, 1);
    st.clone = calloc((size_t)cap, sizeof *st.clone);
    if (!st.keep || !st.is_forward || !st.clone) {
        free(st.keep), free(st.is_forward), free(st.clone);
        return keel_fail("out of memory");
    }
    for (int64_t i = 0; i < g->n_forward; i++) st.is_forward[g->nodes[i]->id] = 1;
    /* What is kept: everything outside the layers, persistent tensors, ops with side effects or
     * in-place writes, the chosen layer boundaries, and all of the layers not listed. */
    for (int64_t i = 0; i < g->n_forward; i++) {
        keel_tensor *t = g->nodes[i];
        const keel_op_info *info = keel_op_get(t->op);
        bool in_layer = false, layer_kept = false;
        for (int l = 0; l < lm->n_layers; l++)
            if (t->id >= lm->first_id[l] && t->id < lm->end_id[l]) {
                in_layer = true;
                layer_kept = m->kind == KEEL_RC_LAYERS && !m->layers[l];
            }
        bool persistent =
            t->flags & (KEEL_FLAG_OUTPUT | KEEL_FLAG_LOSS | KEEL_FLAG_PARAM | KEEL_FLAG_INPUT | KEEL_FLAG_CHECKPOINT);
        bool effects = (info->flags & (OPF_SIDE_EFFECT | OPF_INPLACE0 | OPF_INPLACE1)) ||
                       ((info->flags & OPF_INPLACE0_OPT) && t->ip[4]);
        if (!in_layer || layer_kept || persistent || effects) st.keep[t->id] = 1;
    }
    for (int l = 0; l <= lm->n_layers; l++) {
        keel_tensor *b = lm->boundary[l];
        if (!b) continue;
        bool keep =
            m->kind == KEEL_RC_FULL || m->kind == KEEL_RC_LAYERS || (m->kind == KEEL_RC_EVERY && l % m->every == 0);
        if (keep || l == 0 || l == lm->n_layers) st.keep[b->id] = 1;
        if (keep) b->flags |= KEEL_FLAG_CHECKPOINT;
    }
    int rc = 0;
    for (int64_t i = 0; i < g->n_forward && !rc; i++) rc = push(&st, g->nodes[i]);
    /* Backward: each source that is a recomputable forward tensor becomes its clone, made just
     * before its first backward use. */
    for (int64_t i = g->n_forward; i < g->n_nodes && !rc; i++) {
        keel_tensor *b = g->nodes[i];
        int arity = keel_op_get(b->op)->arity, alias = keel_op_alias_src(b);
        for (int k = 0; k < arity && !rc; k++) {
            keel_tensor *old = b->src[k], *c = clone_of(&st, old);
            if (!c) {
                rc = -1;
                break;
            }
            if (c == old) continue;
            b->src[k] = c;
            if (k == alias) { /* a view or in-place result follows its source to the clone's bytes */
                b->view_offs = c->view_offs + (b->view_offs - old->view_offs);
                b->view_src = keel_root(c);
            }
        }
        if (!rc) rc = push(&st, b);
    }
    if (!rc) {
        free(g->nodes);
        g->nodes = st.out;
        g->n_nodes = g->cap_nodes = st.n_out;
        st.out = NULL;
        /* the visited marks must cover the clones */
        int64_t n = keel_ctx_count(g->ctx) + 1024;
        uint8_t *v = realloc(g->visited, (size_t)n);
        if (v) {
            memset(v + g->n_visited, 0, (size_t)(n - g->n_visited));
            for (int64_t i = 0; i < g->n_nodes; i++) v[g->nodes[i]->id] = 1;
            g->visited = v;
            g->n_visited = n;
        }
    }
    free(st.out);
    free(st.keep), free(st.is_forward), free(st.clone);
    return rc ? -1 : st.n_clones;
}
