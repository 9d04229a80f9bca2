/* keel: op metadata and graph-building constructors. Constructors check shapes against the op's
 * shape rule and return NULL (with keel_last_error() set) on a mismatch; a NULL source makes the
 * result NULL too, so a whole builder can be checked once at the end. */
#ifndef KEEL_OPS_H
#define KEEL_OPS_H

#include "graph/graph.h"
#include "ops/op_table.h"
#include "tensor/tensor.h"

typedef struct {
    const char *name; /* "MUL_MAT" */
    int arity;
    keel_op_family family;
    int flags;          /* OPF_* */
    int grad_srcs;      /* bit i: src i receives a gradient */
    int index_srcs;     /* bit i: src i holds int32 indices */
    const char *params; /* parameter layout */
    const char *nograd; /* why the op has no gradient (NULL when it has one) */
} keel_op_info;

const keel_op_info *keel_op_get(int op);
/* KEEL_OP_* for a name (case-insensitive) or -1. */
int keel_op_from_name(const char *name);
/* Index of the source whose bytes the result aliases, or -1 (not a view, not in place). */
int keel_op_alias_src(const keel_tensor *t);

/* The window of an ACC or SET result t: src1's shape at t's data + offset, with the parameter
 * strides (a transient tensor for kernels; never part of a graph). */
keel_tensor keel_acc_window(const keel_tensor *t);

/* The generic constructor: every typed one below calls it, and recompute clones nodes with it. */
keel_tensor *keel_op_new(keel_ctx *ctx, int op, keel_tensor *const *src, int n_src, const int64_t *ip, int n_ip,
                         const double *fp, int n_fp);
/* FILL has no sources: its type and shape are parameters. */
keel_tensor *keel_fill(keel_ctx *ctx, keel_type type, const int64_t ne[4], double value);
keel_tensor *keel_zeros_like(keel_ctx *ctx, const keel_tensor *t);

keel_tensor *keel_view(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4], const int64_t nb[4], int64_t offset);
keel_tensor *keel_view_1d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t offset);
keel_tensor *keel_view_2d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t nb1, int64_t offset);
keel_tensor *keel_view_3d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t nb1,
                          int64_t nb2, int64_t offset);
keel_tensor *keel_view_4d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                          int64_t nb1, int64_t nb2, int64_t nb3, int64_t offset);
/* A view of another element type than a's (strides in its bytes), over a backward op's packed
 * result only: a part of it stored in that type (RMS_NORM_W_BACK's bf16 part). Not differentiable.
 * Not float32 over another type (VIEW's ip9 0 means src0's type); a's own type: keel_view_4d. */
keel_tensor *keel_view_4d_as(keel_ctx *ctx, keel_tensor *a, keel_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3, int64_t nb1, int64_t nb2, int64_t nb3, int64_t offset);
/* The float32 elements of a packed result that hold a bf16 part of n values: n / 2 rounded up, then
 * to a multiple of 4 (16 bytes, so the part after it stays aligned) */
int64_t keel_bf16_part_floats(int64_t n);
keel_tensor *keel_reshape(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4]);
keel_tensor *keel_reshape_2d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1);
keel_tensor *keel_reshape_3d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2);
keel_tensor *keel_reshape_4d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
keel_tensor *keel_permute(keel_ctx *ctx, keel_tensor *a, int ax0, int ax1, int ax2, int ax3);
keel_tensor *keel_transpose(keel_ctx *ctx, keel_tensor *a);

keel_tensor *keel_cpy(keel_ctx *ctx, keel_tensor *a, keel_tensor *b);
/* A contiguous copy of a in another real type: a result of its own, planned like any node (a
 * bf16 weight's float32 copy lives only as long as its readers). */
keel_tensor *keel_cast(keel_ctx *ctx, keel_tensor *a, keel_type type);
keel_tensor *keel_cont(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_dup(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_get_rows(keel_ctx *ctx, keel_tensor *a, keel_tensor *ids);
keel_tensor *keel_get_rows_back(keel_ctx *ctx, keel_tensor *dy, keel_tensor *ids, int64_t n_rows);
/* c + keel_get_rows_back(dy, ids, rows of c) in one op, bitwise the ADD of the two (a tied
 * embedding's gradient: the head's part so far, plus the input side's rows) */
keel_tensor *keel_get_rows_back_add(keel_ctx *ctx, keel_tensor *dy, keel_tensor *ids, keel_tensor *c);
keel_tensor *keel_acc(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t nb1, int64_t nb2, int64_t nb3,
                      int64_t offset, bool inplace);
keel_tensor *keel_set(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t nb1, int64_t nb2, int64_t nb3,
                      int64_t offset, bool inplace);
keel_tensor *keel_repeat(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4]);
keel_tensor *keel_repeat_back(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4]);
keel_tensor *keel_concat(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int dim);
/* type: 0 (a's and b's), or KEEL_BF16 for float32 sources, each value rounded as CAST rounds it */
keel_tensor *keel_concat_to(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int dim, int64_t type);

keel_tensor *keel_add(keel_ctx *ctx, keel_tensor *a, keel_tensor *b);
keel_tensor *keel_sub(keel_ctx *ctx, keel_tensor *a, keel_tensor *b);
keel_tensor *keel_mul(keel_ctx *ctx, keel_tensor *a, keel_tensor *b);
keel_tensor *keel_div(keel_ctx *ctx, keel_tensor *a, keel_tensor *b);
keel_tensor *keel_scale(keel_ctx *ctx, keel_tensor *a, double s, double b);
keel_tensor *keel_unary(keel_ctx *ctx, int op, keel_tensor *a);
keel_tensor *keel_sqr(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_sqrt(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_exp(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_log(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_neg(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_silu(keel_ctx *ctx, keel_tensor *a);
/* silu(gate) * up in one op (the MLP's SwiGLU): bitwise the SILU then MUL it replaces, with no
 * silu(gate) tensor kept for the backward */
keel_tensor *keel_swiglu(keel_ctx *ctx, keel_tensor *gate, keel_tensor *up);
/* The same, float32 gate and up, the result rounded to bf16 (nearest even): bitwise keel_cast(keel_swiglu(),
 * KEEL_BF16), without the float32 result (mixed precision: the down projection's operand). Its gradient
 * is float32, as a bf16 tensor's is. */
keel_tensor *keel_swiglu_bf16(keel_ctx *ctx, keel_tensor *gate, keel_tensor *up);
keel_tensor *keel_sigmoid(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_softplus(keel_ctx *ctx, keel_tensor *a);
/* x * sigmoid(gate) in one op, forward and backward (attention's output gate): bitwise the SIGMOID
 * and MUL it replaces, with no sigmoid(gate) tensor kept for the backward */
keel_tensor *keel_sigmoid_mul(keel_ctx *ctx, keel_tensor *x, keel_tensor *gate);
/* The same, float32 x and gate, the result rounded to bf16: bitwise keel_cast(keel_sigmoid_mul(), KEEL_BF16),
 * without the float32 result (mixed precision: the output projection's operand) */
keel_tensor *keel_sigmoid_mul_bf16(keel_ctx *ctx, keel_tensor *x, keel_tensor *gate);
/* dy * (y * (1 - y)) for y = sigmoid(x): SIGMOID's gradient in one pass (its rule's op) */
keel_tensor *keel_sigmoid_back(keel_ctx *ctx, keel_tensor *y, keel_tensor *dy);
/* The DeltaNet's decay gate g = softplus(a + dt_bias) * -exp(A_log), a [H,T,B], A_log and dt_bias one
 * value a head: one op, bitwise the ADD, SOFTPLUS, EXP, NEG and MUL it replaces, forward and backward
 * (its gradient op sums over a's rows as REPEAT_BACK does on each backend) */
keel_tensor *keel_gdn_gate(keel_ctx *ctx, keel_tensor *a, keel_tensor *A_log, keel_tensor *dt_bias);
keel_tensor *keel_sum(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_sum_rows(keel_ctx *ctx, keel_tensor *a);
keel_tensor *keel_mean(keel_ctx *ctx, keel_tensor *a);

/* Inverted dropout: each element kept with probability 1-p and scaled by 1/(1-p), else 0. The
 * mask is a function of (seed, stream, the counter, the element's index) (ops/dropout_mask.h):
 * give each dropout site its own stream, and set the counter before each run so that every
 * micro-batch draws new masks while recompute and the backward pass reuse the forward's. */
keel_tensor *keel_dropout(keel_ctx *ctx, keel_tensor *a, double p, uint64_t seed, uint64_t stream);
/* Sets the counter of every DROPOUT node of g (the forward's, its recompute clones', the backward's). */
void keel_dropout_set_counter(keel_graph *g, int64_t counter);
/* Sets the probability of every DROPOUT node of g (0 for evaluation with the training graph). */
void keel_dropout_set_p(keel_graph *g, double p);
keel_tensor *keel_mul_mat(keel_ctx *ctx, keel_tensor *a, keel_tensor *b);
keel_tensor *keel_out_prod(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t ne2, int64_t ne3);
/* Products of bf16 operands summed in float32, the result in `out` (KEEL_F32, or KEEL_BF16 rounded
 * to nearest even; keel_mul_mat and keel_out_prod of bf16 operands give float32): weight gradients
 * and residual updates stay float32 (mixed precision). */
keel_tensor *keel_mul_mat_to(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, keel_type out);
keel_tensor *keel_out_prod_to(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t ne2, int64_t ne3, keel_type out);
/* a b + c: MUL_MAT with an addend of the result's shape and type (for bf16 operands the result
 * takes c's type: float32, or float64 on the oracle), added where the product is made (a residual
 * update in one pass: cuBLASLt's C input on cuda). */
keel_tensor *keel_mul_mat_add(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, keel_tensor *c);
keel_tensor *keel_rms_norm(keel_ctx *ctx, keel_tensor *a, double eps);
keel_tensor *keel_l2_norm(keel_ctx *ctx, keel_tensor *a, double eps);
keel_tensor *keel_soft_max(keel_ctx *ctx, keel_tensor *a, double scale);
/* Attention's softmax over keys [Tk, Tq, ...]: query t (key index o + t, o = Tk - Tq) sees the keys
 * of its own example only, o + t - pos[t] .. o + t (from 0 at the earliest): causal, and
 * block-diagonal where positions restart at 0 (packed examples). Positions below 0 count as 0. */
keel_tensor *keel_soft_max_causal(keel_ctx *ctx, keel_tensor *a, keel_tensor *pos, double scale);
/* Rotary embedding at positions pos [T] or [T,B] (i32; like every op that reads positions, one below 0
 * counts as 0). */
keel_tensor *keel_rope(keel_ctx *ctx, keel_tensor *a, keel_tensor *pos, int64_t n_rot, double theta);
/* ROPE's frequency for pair f of n_rot rotary dims, as transformers computes it: in float32,
 * 1 / theta^((2f)/n_rot). Part of the op's definition, shared by every backend. */
double keel_rope_freq(double theta, int64_t n_rot, int64_t f);
/* Causal depthwise convolution over T; output t reads the inputs t-d for d <= pos[t] only, so it
 * never reaches back past the start of its example (positions [T,B] restart at 0 per example). */
keel_tensor *keel_conv1d(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos);
/* rms_norm(x) * w, or with one_plus rms_norm(x) * (1 + w) (Qwen3.5's norms), w one weight per
 * element of a row: formula for formula keel_rms_norm, keel_mul (and keel_scale(w, 1, 1)); its
 * backward gives dx and the products whose row sums are dw. */
keel_tensor *keel_rms_norm_w(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, double eps, bool one_plus);
/* The same with its result in `out` (bf16 from a float32 x: each float32 value rounded as CAST
 * rounds it, the bits of keel_cast of the float32 result; mixed precision's product operands) */
keel_tensor *keel_rms_norm_w_to(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, double eps, bool one_plus,
                                keel_type out);
/* keel_rope(keel_rms_norm_w(x, w, eps, one_plus), pos, n_rot, theta) as one op, formula for formula
 * those two (attention's q and k norms and rotation); its backward rotates dy back and gives dx and
 * the products whose row sums are dw. */
keel_tensor *keel_qk_norm_rope(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos, double eps,
                               bool one_plus, int64_t n_rot, double theta);
/* The same with its result in `out`, as keel_rms_norm_w_to (mixed precision's attention operands) */
keel_tensor *keel_qk_norm_rope_to(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos, double eps,
                                  bool one_plus, int64_t n_rot, double theta, keel_type out);
/* Causal softmax attention without the score matrix: q [D,H,Tq,B], k [D,KV,Tk,B], v [Dv,KV,Tk,B]
 * (one type), query head h reading kv head h/(H/KV), each query over the keys of its example (the
 * mask of keel_soft_max_causal, positions [Tq,B]); scale multiplies q.k. Returns the packed
 * [o [Dv,H,Tq,B] | lse [H,Tq,B]] (lse: log of the softmax's sum, what the backward needs; o is the
 * first Dv*H*Tq*B elements) in q's type, or `out` (f32, or f64 for the oracle) when q is bf16. */
keel_tensor *keel_flash_attn(keel_ctx *ctx, keel_tensor *q, keel_tensor *k, keel_tensor *v, keel_tensor *pos,
                             double scale, keel_type out);
/* rms_norm(x) * w * silu(z) over rows of x (w one weight per element of a row, z x's shape): the
 * Gated DeltaNet's output norm as one op, formula for formula keel_rms_norm, keel_mul, keel_silu,
 * keel_mul; its backward gives dx, dz and the products whose row sums are dw. */
keel_tensor *keel_gated_rms_norm(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *z, double eps);
/* The same with its result in `out`, as keel_rms_norm_w_to */
keel_tensor *keel_gated_rms_norm_to(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *z, double eps,
                                    keel_type out);
/* The Gated DeltaNet's input path in one op: y = silu(keel_conv1d(x, w, pos)) [C,T,B], then each
 * head of `head` channels among the first 2 n_qk (q, then k) divided by sqrt(sum of squares + eps),
 * and the first n_qk (q) times q_scale. Its backward gives the conv output's gradient from the
 * conv recomputed; CONV1D's backward ops take it from there. */
keel_tensor *keel_gdn_conv(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos, int64_t n_qk, int64_t head,
                           double eps, double q_scale);
/* How the CUDA kernels of the delta rule take their per-chunk products (the op's ip0; the other
 * backends compute in float32 or float64 whatever it says) */
enum {
    KEEL_GDN_FLOAT32 = 0,    /* float32 on the CUDA cores (the float32 mode) */
    KEEL_GDN_SPLIT_TF32 = 1, /* the tensor cores, operands split in two TF32 parts: about float32's precision */
    KEEL_GDN_SPLIT_BF16 = 2, /* the tensor cores, operands split in two bf16 parts (16 bits), float32 sums */
    KEEL_GDN_BF16_GRAD = 3,  /* the forward as SPLIT_BF16; the backward's products on one bf16 part of each
                              * operand (8 bits), float32 sums (on CUDA, the scratch arrays only those
                              * products read kept as that rounding: the same bits, half the bytes) */
};
/* The gated delta rule; the state is reset to 0 before every step whose position is 0 (<= 0): a
 * packed example starts from a fresh state, as it would alone. products: a KEEL_GDN_ value. */
keel_tensor *keel_gated_delta_net(keel_ctx *ctx, keel_tensor *q, keel_tensor *k, keel_tensor *v, keel_tensor *g,
                                  keel_tensor *beta, keel_tensor *pos, int products);
/* GATED_DELTA_NET_BACK's packed result: for each token (t, b) a row of (2 Dk + Dv) Hv elements,
 * [dq of every value head | dk of every value head | dv of every value head] (dq and dk per value
 * head: the rule sums a key head's group), then dg [Hv,T,B] and dbeta [Hv,T,B]. With as many key
 * heads as value heads the row is the layout of the q, k and v channels the model views out of the
 * conv's output (keel_gdn_conv), so that output's gradient is this block as it lies (autodiff takes
 * such windows in place: no zero fill and no accumulation into it). Offsets in elements: dq(i, hv,
 * t, b) at (b T + t) row + hv Dk + i, dk there + dk, dv(j, hv, t, b) at (b T + t) row + dv + hv Dv
 * + j, dg(hv, t, b) at dg + (b T + t) Hv + hv, dbeta likewise from db. */
typedef struct {
    int64_t row, dk, dv, dg, db;
} keel_gdn_back_layout;
static inline keel_gdn_back_layout keel_gdn_back_layout_of(int64_t Dk, int64_t Dv, int64_t Hv, int64_t T, int64_t B) {
    keel_gdn_back_layout L;
    L.row = (2 * Dk + Dv) * Hv, L.dk = Dk * Hv, L.dv = 2 * Dk * Hv, L.dg = L.row * T * B, L.db = L.dg + Hv * T * B;
    return L;
}
/* Decoding: as keel_gated_delta_net from the state s0 [Dv,Dk,Hv,B] -> packed [o | final state]. */
keel_tensor *keel_gated_delta_net_state(keel_ctx *ctx, keel_tensor *q, keel_tensor *k, keel_tensor *v, keel_tensor *g,
                                        keel_tensor *beta, keel_tensor *pos, keel_tensor *s0);
/* The sum over positions whose target is >= 0 of -log softmax(logits)[target], divided by the number
 * of such positions (a negative target: no loss there, no gradient), or by the divisor set with
 * keel_cross_entropy_set_divisor: a trainer sets the token count of the whole global batch, so that
 * micro-batches and ranks add up to one mean over it. */
keel_tensor *keel_cross_entropy_loss(keel_ctx *ctx, keel_tensor *logits, keel_tensor *targets);
/* The language-model head and its loss in one op: CROSS_ENTROPY_LOSS(W^T x, targets) computed
 * `chunk` tokens at a time, so that no [V, N] logits tensor exists (the logits of one chunk live in
 * the kernel's scratch; its backward makes them again). bf16 x and W: bf16 product operands and
 * logits (rounded as every backend rounds them), float32 sums, float32 gradients. */
keel_tensor *keel_linear_cross_entropy(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *targets,
                                       int64_t chunk);
/* The same loss (a view of the node's last element), from a node that also computes the loss's
 * gradients for a unit upstream gradient while it has each chunk's logits: its result is packed
 * [dx | dW | loss] (ip1), so the backward need not make the logits again. When the backward's
 * seed reaches the loss as it is (1), x and W's gradients are views of that result; any other
 * upstream gradient goes through LINEAR_CROSS_ENTROPY_BACK as the plain op's does. Only the loss
 * element is differentiable. For training graphs. */
keel_tensor *keel_linear_cross_entropy_with_grads(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *targets,
                                                  int64_t chunk);
/* Turns the gradients of every such node of g on or off (off: an evaluation run, the gradient
 * part of the result is zeros and only the loss is computed). */
void keel_linear_cross_entropy_set_grads(keel_graph *g, bool on);
/* Sets the divisor of every CROSS_ENTROPY_LOSS (and LINEAR_CROSS_ENTROPY) node of g and its backward
 * (0: each one's own count). */
void keel_cross_entropy_set_divisor(keel_graph *g, double divisor);
/* The sum of the squares of x's elements (contiguous float32) in SUM_SQ's fixed two-level order. */
keel_tensor *keel_sum_sq(keel_ctx *ctx, keel_tensor *x);
/* AdamW, in place on p, m and v (contiguous float32, one shape; in training, a group's flat
 * tensors): s = keel_sum_sq(g) gives the gradient norm sqrt(s) / divisor, the gradient is used
 * times min(1, clip / norm) / divisor (clip 0: no clipping), weight decay wd applies to elements
 * [0, decay_end), and when the norm is not finite nothing is written. c: NULL (ADAMW), or bf16
 * [decay_end - c_start] (ADAMW_SHADOW), which then holds the decayed elements of p from c_start on
 * rounded to bf16 (the copies SHADOW reads). Set lr and step per step (keel_adamw_set in
 * train/optim.h). */
keel_tensor *keel_adamw(keel_ctx *ctx, keel_tensor *p, keel_tensor *g, keel_tensor *m, keel_tensor *v, keel_tensor *s,
                        keel_tensor *c, int64_t c_start, double lr, double beta1, double beta2, double eps, double wd,
                        double clip, int64_t step, int64_t divisor, int64_t decay_end);
/* A bf16 copy of the float32 weight w that the optimizer keeps: `copy` (a window of ADAMW's c, which
 * ADAMW rewrites after each update as CAST(w, bf16) would make it), read as it is, with w taking the
 * gradient as CAST's rule gives it. No computation in the step: the casts of every step become one
 * write of 2 bytes a weight inside ADAMW. Whoever writes w otherwise must write `copy` too. */
keel_tensor *keel_shadow(keel_ctx *ctx, keel_tensor *copy, keel_tensor *w);

#endif
