/* keel: graphs. A graph is the list of op nodes needed for some outputs, in a topological order
 * (sources before users; among sources, in source order), plus the leaves they read. */
#ifndef KEEL_GRAPH_H
#define KEEL_GRAPH_H

#include "tensor/tensor.h"

/* A contiguous group: the plan places its members back to back, each at a 256-byte boundary (the
 * gaps zero), inside the bytes of `flat`, a 1-D float32 leaf spanning them all, so that one kernel
 * can walk every member as one array (the optimizer's parameters, gradients and moments). */
typedef struct {
    keel_tensor *flat;
    keel_tensor **members;
    int64_t *offset; /* bytes from flat's first byte to each member's */
    int n;
} keel_group;

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
    keel_group *groups; /* keel_graph_group */
    int n_groups;
} keel_graph;

keel_graph *keel_graph_new(keel_ctx *ctx);
void keel_graph_free(keel_graph *g);
/* Add t and everything it depends on that the graph does not hold yet. -1 on error. */
int keel_graph_expand(keel_graph *g, keel_tensor *t);
keel_graph *keel_graph_build(keel_ctx *ctx, keel_tensor *const *outputs, int n_outputs);
/* A group of n float32 root tensors, contiguous, that no other group holds: returns its flat leaf
 * (named `name`), which nodes read or write as the members' bytes. Every node that writes a member
 * must come before the first node that reads the flat tensor (the plan checks). NULL with an error. */
keel_tensor *keel_graph_group(keel_graph *g, keel_tensor *const *members, int n, const char *name);
/* The group's layout: member i at byte offset[i] (NULL: not wanted), each at the next KEEL_ALIGN
 * boundary after the one before; returns the bytes up to the last member's end. */
int64_t keel_group_layout(keel_tensor *const *members, int n, int64_t *offset);
/* Node or leaf by name, or NULL. */
keel_tensor *keel_graph_find(const keel_graph *g, const char *name);
/* The gradient of t (after keel_build_backward), or NULL. */
keel_tensor *keel_graph_grad(const keel_graph *g, const keel_tensor *t);

#endif
