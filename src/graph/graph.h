/* keel: graphs. A graph is the list of op nodes needed for some outputs, in a topological order
 * (sources before users; among sources, in source order), plus the leaves they read. */
#ifndef KEEL_GRAPH_H
#define KEEL_GRAPH_H

#include "tensor/tensor.h"

typedef struct keel_graph {
    keel_ctx *ctx;
    keel_tensor **nodes;
    int64_t n_nodes, cap_nodes;
    keel_tensor **leafs;
    int64_t n_leafs, cap_leafs;
    int64_t n_forward;   /* nodes before the backward pass was appended (== n_nodes without one) */
    keel_tensor **grads; /* by tensor id: the gradient of that tensor, after keel_build_backward */
    int64_t n_grads;
    uint8_t *visited; /* by tensor id */
    int64_t n_visited;
} keel_graph;

keel_graph *keel_graph_new(keel_ctx *ctx);
void keel_graph_free(keel_graph *g);
/* Add t and everything it depends on that the graph does not hold yet. -1 on error. */
int keel_graph_expand(keel_graph *g, keel_tensor *t);
keel_graph *keel_graph_build(keel_ctx *ctx, keel_tensor *const *outputs, int n_outputs);
/* Node or leaf by name, or NULL. */
keel_tensor *keel_graph_find(const keel_graph *g, const char *name);
/* The gradient of t (after keel_build_backward), or NULL. */
keel_tensor *keel_graph_grad(const keel_graph *g, const keel_tensor *t);

#endif
