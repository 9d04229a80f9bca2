/* keel: the optimiser's part of a training graph. */
#ifndef KEEL_OPTIM_H
#define KEEL_OPTIM_H

#include "graph/graph.h"

/* The optimizer step as the graph holds it. */
typedef struct {
    keel_tensor **mom;  /* m, v of params[i] at 2i, 2i + 1: float32 input leaves "m.<param>", "v.<param>" */
    keel_tensor *sumsq; /* SUM_SQ of the gradients, an output of the graph (the norm: sqrt(sumsq) / divisor) */
    keel_tensor *adamw; /* the one ADAMW node */
} keel_optim;

/* Appends AdamW (betas 0.9/0.95, eps 1e-8, decoupled weight decay on matrices only: none on norms,
 * gates and biases) over params[i] with gradients grads[i]: four groups laid out back to back by
 * the plan (parameters, gradients, m, v; the decayed parameters first), the gradients' SUM_SQ, and
 * one ADAMW node over the groups' flat tensors that clips to `clip` (0: none), divides the summed
 * gradients by `divisor` (micro-batches x ranks) and changes nothing when the norm is not finite;
 * with `copies` (NULL: none), it also writes the decayed parameters' bf16 copies there from element
 * copies_start of the group on (below).
 * The caller zeroes the moments or loads saved ones, and sets the step with keel_adamw_set before
 * each run. -1 with an error. */
int keel_adamw_attach(keel_ctx *ctx, keel_graph *g, keel_tensor *const *params, keel_tensor *const *grads, int n,
                      keel_tensor *copies, int64_t copies_start, double lr, double weight_decay, double clip,
                      int64_t divisor, keel_optim *out);

/* The layout keel_adamw_attach gives the decayed parameters (the matrices, ne[1] > 1) of params[0..n)
 * in the parameters' group, in float32 elements from its start: off[i] for params[i] (-1 for the
 * others), and the decayed elements' end (the returned count, padding included). `copies`, when
 * given to keel_adamw_attach, is bf16 of that count less copies_start (the decayed elements before it
 * get no copy: an untied input embedding, which only GET_ROWS reads), and params[i]'s bf16 copy its
 * elements from off[i] - copies_start on (ADAMW_SHADOW writes them; keel_shadow reads them): a
 * mismatch is an error there. -1 (with an error) when out of memory. */
int64_t keel_adamw_decayed_layout(keel_tensor *const *params, int n, int64_t *off);

/* What changes from one update to the next: the 1-based step (bias correction) and the learning
 * rate. */
void keel_adamw_set(keel_tensor *adamw, int64_t step, double lr);

#endif
