/* keel: the memory plan. One plan serves every backend: it places each root tensor (a tensor that
 * owns bytes) at an offset in one arena, reusing the space of activations after their last use.
 * Views and in-place results take their root's bytes. A node's working memory (the scratch its
 * backend's kernel takes beyond the result) is one more block of the arena, live while that node
 * runs only, so it shares the peak with what is live then rather than adding its largest to the
 * whole step's. A carried block (keel_carry_fn) is live from the node that writes it to the later
 * node that reads it. Every placement is 256-byte aligned. */
#ifndef KEEL_PLAN_H
#define KEEL_PLAN_H

#include "graph/graph.h"

/* The scratch bytes a backend's kernel of `node` takes (0: none), from shapes, types and strides alone. */
typedef size_t (*keel_scratch_fn)(void *ud, const keel_tensor *node);
/* A backend's carried block for node `reader` of the graph: the bytes (0: none) of what an earlier
 * node, *writer (its index), makes that the reader's kernel would otherwise make again, decided
 * from the node sequence alone. The plan keeps the block from the writer to the reader (one reader
 * a writer: a later claim on the same writer gets none) and sets both nodes' carry_peer before it
 * asks scratch_bytes, whose rule may then leave out of each node's scratch what the block holds. */
typedef size_t (*keel_carry_fn)(void *ud, const keel_graph *g, int64_t reader, int64_t *writer);

typedef struct {
    size_t guard_bytes;            /* extra bytes before and after every tensor (tests fill and check them) */
    int no_reuse;                  /* never reuse freed space (debugging) */
    keel_scratch_fn scratch_bytes; /* NULL: the nodes need no scratch (ref, cpu) */
    keel_carry_fn carry;           /* NULL: nothing carried (its ud: scratch_ud) */
    void *scratch_ud;
} keel_plan_opts;

typedef struct {
    size_t *offset; /* by tensor id: arena offset of a root, SIZE_MAX when not placed */
    int64_t n_offset;
    size_t total_bytes;      /* arena size: the planned peak */
    size_t persistent_bytes; /* leaves and outputs (parameters, gradients, optimizer state, inputs) */
    size_t peak_activation_bytes;
    int64_t peak_node; /* the node during which the activations (its scratch included) reach their peak */
    size_t *scratch_offset, *scratch_size; /* by tensor id: a node's scratch block (size 0: none) */
    size_t scratch_max;                    /* the largest node scratch, and its node (-1: none) */
    int64_t scratch_max_node;
    size_t *carry_offset, *carry_size; /* by the reader's tensor id: a carried block (size 0: none) */
    int64_t *carry_from;               /* by the reader's tensor id: the writer's node index */
    int64_t n_carried;
    size_t guard_bytes;
    int64_t n_roots;
} keel_plan;

keel_plan *keel_plan_make(const keel_graph *g, const keel_plan_opts *opts);
void keel_plan_free(keel_plan *p);
/* The activations (non-persistent roots) live while node `at` runs, largest first: up to max of
 * them in out; returns how many there are (-1 with an error). With at = the plan's peak_node: what
 * makes the peak. */
int64_t keel_plan_live_at(const keel_graph *g, int64_t at, const keel_tensor **out, int64_t max);
/* The carried blocks live while node `at` runs (written at or before it, read at or after it): their
 * bytes, and their count in *n. */
size_t keel_plan_carried_at(const keel_graph *g, const keel_plan *p, int64_t at, int64_t *n);
/* Set t->data for every tensor of the graph, t->scratch for nodes with scratch and t->carry for
 * both nodes of a carried block, from the arena's base address. */
void keel_plan_bind(const keel_plan *p, const keel_graph *g, void *base);

#endif
