/* keel: reverse-mode autodiff. keel_build_backward walks a forward graph from its loss in reverse
 * and appends the gradient of every tensor that needs one, using each op's rule (rules.c).
 *
 * Accumulation order (fixed, so gradients are deterministic): nodes are visited in reverse
 * execution order; each node hands its sources their contributions in source order; a tensor's
 * contributions are summed left to right in the order they arrive. A contribution through a VIEW
 * goes into a zero-filled gradient buffer (a real FILL) by an in-place ACC into the view's window,
 * unless the windows lie in one tensor as they lie in the base and tile its rows: then that tensor's
 * first bytes are the base's gradient (autodiff.c, windows in place; the same values). */
#ifndef KEEL_AUTODIFF_H
#define KEEL_AUTODIFF_H

#include "graph/graph.h"

/* Appends the backward pass to g. Afterwards keel_graph_grad(g, t) is the gradient of t, and each
 * parameter's gradient is an output node named "grad.<parameter name>". */
int keel_build_backward(keel_graph *g, keel_tensor *loss);

/* The type of a tensor's gradient: its own, except that a bf16 tensor (a product operand in mixed
 * precision) has a float32 gradient, so that weight gradients are never rounded to bf16 before they
 * are summed. */
keel_type keel_grad_type(keel_type t);

/* ---- for the rules ---- */
typedef struct keel_grad_acc keel_grad_acc;
typedef int (*keel_grad_rule)(keel_ctx *ctx, keel_tensor *t, keel_tensor *dy, keel_grad_acc *acc);

/* Does source i of the node being differentiated need a gradient? */
bool keel_grad_wanted(const keel_grad_acc *acc, int src);
/* May source i's gradient come in bf16? Where it only ever becomes a bf16 product operand (a float32
 * product of bf16 operands that only this node reads): the contribution rounded as CAST rounds it
 * gives the bits the product's rule makes from a float32 one, without that float32 tensor. */
bool keel_grad_bf16_ok(const keel_grad_acc *acc, int src);
/* Add a contribution (shaped like source i; bf16 where keel_grad_bf16_ok) to source i's gradient. */
int keel_grad_add(keel_grad_acc *acc, int src, keel_tensor *contrib);
/* Source i's gradient so far, for a rule that adds it where its own contribution is made (then
 * hands the sum to keel_grad_set): contiguous, shaped like the source, in its gradient type, f32 or
 * f64; NULL where there is none such (the rule then adds its contribution as usual). */
keel_tensor *keel_grad_so_far(keel_grad_acc *acc, int src);
/* Source i's gradient becomes g, which already holds keel_grad_so_far's tensor summed in. */
int keel_grad_set(keel_grad_acc *acc, int src, keel_tensor *g);
/* Add dy into the window (strides nb1..3, byte offset) of source i's gradient. */
int keel_grad_add_window(keel_grad_acc *acc, int src, keel_tensor *dy, int64_t nb1, int64_t nb2, int64_t nb3,
                         int64_t offset);

/* The rule of an op, or NULL (rules.c). */
keel_grad_rule keel_grad_rule_of(int op);

#endif
