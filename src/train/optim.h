/* keel: the optimiser's part of a training graph. */
#ifndef KEEL_OPTIM_H
#define KEEL_OPTIM_H

#include "graph/graph.h"

/* Appends to g one AdamW update (betas 0.9/0.95, eps 1e-8, decoupled weight decay on matrices
 * only: none on norms, gates and biases) per parameter params[i] with gradient grads[i]. The
 * moments are new float32 input leaves named "m.<param>" and "v.<param>", returned in mom[2i] and
 * mom[2i+1] (the caller zeroes them or loads saved ones); the updates, outputs of g, in opt[i]
 * (set the step with keel_adamw_set before each run). -1 with an error. */
int keel_adamw_attach(keel_ctx *ctx, keel_graph *g, keel_tensor *const *params, keel_tensor *const *grads, int n,
                      double lr, double weight_decay, keel_tensor **mom, keel_tensor **opt);

/* Sets what changes from one update to the next on n AdamW nodes: the 1-based step (bias
 * correction), the learning rate, and the factor the gradients are multiplied by first (clipping,
 * and the 1/N of a sum over N micro-batches or ranks). */
void keel_adamw_set(keel_tensor *const *opt, int n, int64_t step, double lr, double grad_scale);

#endif
