#include "graph/graph.h"

#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/error.h"

keel_graph *keel_graph_new(keel_ctx *ctx) {
    keel_graph *g = calloc(1, sizeof *g);
    if (g) g->ctx = ctx;
    return g;
}

void keel_graph_free(keel_graph *g) {
    if (!g) return;
    free(g->nodes);
    free(g->leafs);
    free(g->grads);
    free(g->visited);
    for (int i = 0; i < g->n_groups; i++) free(g->groups[i].members), free(g->groups[i].offset);
    free(g->groups);
    free(g);
}

int64_t keel_group_layout(keel_tensor *const *members, int n, int64_t *offset) {
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        at = (at + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN;
        if (offset) offset[i] = at;
        at += (int64_t)keel_nbytes(members[i]);
    }
    return at;
}

keel_tensor *keel_graph_group(keel_graph *g, keel_tensor *const *members, int n, const char *name) {
    if (n < 1) {
        keel_fail("group '%s': no members", name);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const keel_tensor *t = members[i];
        const char *bad = t->type != KEEL_F32            ? "is not float32"
                          : t->view_src                  ? "is a view (it has no bytes of its own)"
                          : !keel_is_contiguous(t)       ? "is not contiguous"
                          : (t->flags & KEEL_FLAG_BOUND) ? "was placed by another session"
                                                         : NULL;
        for (int k = 0; !bad && k < g->n_groups; k++)
            for (int j = 0; j < g->groups[k].n; j++)
                if (g->groups[k].members[j] == t) bad = "is in another group";
        for (int j = 0; !bad && j < i; j++)
            if (members[j] == t) bad = "is in this group twice";
        if (bad) {
            keel_fail("group '%s': member '%s' %s", name, t->name, bad);
            return NULL;
        }
    }
    int64_t bytes = keel_group_layout(members, n, NULL);
    keel_group *gs = realloc(g->groups, (size_t)(g->n_groups + 1) * sizeof *gs);
    if (!gs) {
        keel_fail("out of memory");
        return NULL;
    }
    g->groups = gs;
    keel_group *gr = &g->groups[g->n_groups];
    *gr = (keel_group){keel_new_1d(g->ctx, KEEL_F32, (bytes + 3) / 4), malloc((size_t)n * sizeof(keel_tensor *)),
                       malloc((size_t)n * sizeof(int64_t)), n};
    if (!gr->flat || !gr->members || !gr->offset) {
        free(gr->members), free(gr->offset);
        keel_fail("out of memory");
        return NULL;
    }
    g->n_groups++;
    for (int i = 0; i < n; i++) gr->members[i] = members[i];
    keel_group_layout(members, n, gr->offset);
    return keel_set_name(gr->flat, "%s", name);
}

static int push(keel_tensor ***arr, int64_t *n, int64_t *cap, keel_tensor *t) {
    if (*n == *cap) {
        int64_t c = *cap ? *cap * 2 : 256;
        keel_tensor **a = realloc(*arr, (size_t)c * sizeof *a);
        if (!a) return keel_fail("out of memory growing a graph");
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = t;
    return 0;
}

static int ensure_visited(keel_graph *g, int64_t id) {
    if (id < g->n_visited) return 0;
    int64_t n = keel_ctx_count(g->ctx) + 1024;
    if (n <= id) n = id + 1024;
    uint8_t *v = realloc(g->visited, (size_t)n);
    if (!v) return keel_fail("out of memory marking graph nodes");
    memset(v + g->n_visited, 0, (size_t)(n - g->n_visited));
    g->visited = v;
    g->n_visited = n;
    return 0;
}

/* Iterative post-order walk: deep models would overflow a recursive one. */
int keel_graph_expand(keel_graph *g, keel_tensor *root) {
    if (!root) return keel_fail("graph: NULL output (an earlier constructor failed: %s)", keel_last_error());
    typedef struct {
        keel_tensor *t;
        int next;
    } frame;
    int64_t n = 0, cap = 64;
    frame *st = malloc((size_t)cap * sizeof *st);
    if (!st) return keel_fail("out of memory walking the graph");
    if (ensure_visited(g, root->id)) {
        free(st);
        return -1;
    }
    if (g->visited[root->id]) {
        free(st);
        return 0;
    }
    g->visited[root->id] = 1;
    st[n++] = (frame){root, 0};
    int rc = 0;
    while (n > 0 && rc == 0) {
        frame *f = &st[n - 1];
        keel_tensor *t = f->t;
        int arity = keel_op_get(t->op)->arity;
        if (f->next < arity) {
            keel_tensor *s = t->src[f->next++];
            if ((rc = ensure_visited(g, s->id))) break;
            if (g->visited[s->id]) continue;
            g->visited[s->id] = 1;
            if (n == cap) {
                cap *= 2;
                frame *ns = realloc(st, (size_t)cap * sizeof *ns);
                if (!ns) {
                    rc = keel_fail("out of memory walking the graph");
                    break;
                }
                st = ns;
            }
            st[n++] = (frame){s, 0};
            continue;
        }
        n--;
        if (t->op == KEEL_OP_NONE)
            rc = push(&g->leafs, &g->n_leafs, &g->cap_leafs, t);
        else
            rc = push(&g->nodes, &g->n_nodes, &g->cap_nodes, t);
    }
    free(st);
    if (g->grads == NULL) g->n_forward = g->n_nodes;
    return rc;
}

keel_graph *keel_graph_build(keel_ctx *ctx, keel_tensor *const *outputs, int n_outputs) {
    keel_graph *g = keel_graph_new(ctx);
    if (!g) {
        keel_fail("out of memory for a graph");
        return NULL;
    }
    for (int i = 0; i < n_outputs; i++) {
        if (keel_graph_expand(g, outputs[i])) {
            keel_graph_free(g);
            return NULL;
        }
        outputs[i]->flags |= KEEL_FLAG_OUTPUT;
    }
    return g;
}

keel_tensor *keel_graph_find(const keel_graph *g, const char *name) {
    for (int64_t i = 0; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i]->name, name) == 0) return g->nodes[i];
    for (int64_t i = 0; i < g->n_leafs; i++)
        if (strcmp(g->leafs[i]->name, name) == 0) return g->leafs[i];
    return NULL;
}

keel_tensor *keel_graph_grad(const keel_graph *g, const keel_tensor *t) {
    if (!g->grads || !t || t->id >= g->n_grads) return NULL;
    return g->grads[t->id];
}
