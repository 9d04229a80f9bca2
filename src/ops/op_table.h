/* keel: THE op table. Every op keel knows is one row here; the enum, the names, arities, shape
 * rules, backward rules and the op-test coverage all come from this list.
 *
 * X(ID, family, arity, flags, grad_srcs, index_srcs, params)
 *   family    what kind of kernel computes it (keel_op_family below): shape rules and every
 *             backend dispatch by family first, and an op of a family needs no case of its own
 *             there (a unary op: its row, its constructor, its backward rule, its formula in
 *             ops/scalar_f32.h and ref.c, its test cases)
 *   flags     OPF_* below
 *   grad_srcs bit mask of the sources that receive a gradient (0: the op has none; then the
 *             reason is given by op_nograd_reason in ops.c)
 *   index_srcs bit mask of the sources that hold int32 indices (ids, positions, targets), not values
 *   params    the parameter layout (ip[] integers, fp[] reals), for readers and `keel ops`
 */
#ifndef KEEL_OP_TABLE_H
#define KEEL_OP_TABLE_H

/* one row a line: */
// clang-format off
#define KEEL_OP_TABLE(X)                                                                                               \
    X(NONE, LEAF, 0, OPF_LEAF, 0, 0, "leaf: parameter, input or constant")                                                      \
    X(VIEW, VIEW, 1, OPF_VIEW, 1, 0,                                                                                   \
      "ip0-3 ne, ip4-7 nb (bytes), ip8 offset (bytes from src0 element 0), ip9 its type (0: src0's; another only "    \
      "over a backward op's packed result, a part stored in that type, and then not differentiable)")                 \
    X(RESHAPE, VIEW, 1, OPF_VIEW, 1, 0, "ip0-3 ne (src0 contiguous)")                                                           \
    X(PERMUTE, VIEW, 1, OPF_VIEW, 1, 0, "ip0-3: src dim i becomes dim ip[i]")                                                   \
    X(TRANSPOSE, VIEW, 1, OPF_VIEW, 1, 0, "swaps dims 0 and 1")                                                                 \
    X(CPY, COPY, 2, OPF_INPLACE1, 1, 0, "copies src0 into src1 (same shape, any types); result aliases src1")                   \
    X(CONT, COPY, 1, 0, 1, 0, "contiguous copy")                                                                                \
    X(DUP, COPY, 1, 0, 1, 0, "copy, same type")                                                                                 \
    X(CAST, COPY, 1, 0, 1, 0, "ip0 type (keel_type): contiguous copy converted to it (to bf16/f16: nearest even)")           \
    X(SHADOW, OWN, 2, OPF_VIEW, 2, 0,                                                                                  \
      "src0 bf16, src1 float32 of one shape: src0 itself (no computation), which holds CAST(src1, bf16) (ADAMW keeps " \
      "it so: a window of its c); src1 takes the gradient, as from that CAST")                                       \
    X(GET_ROWS, OWN, 2, 0, 1, 2, "src0 [D,R], src1 i32 [N0,N1] -> [D,N0,N1]")                                                  \
    X(GET_ROWS_BACK, OWN, 2, OPF_BACKWARD, 0, 2, "src0 dy [D,N0,N1], src1 i32 ids -> [D,ip0]: sum rows")                       \
    X(GET_ROWS_BACK_ADD, OWN, 3, OPF_BACKWARD, 0, 2,                                                                   \
      "src0 dy [D,N0,N1], src1 i32 ids, src2 c [D,R] -> c + GET_ROWS_BACK(dy, ids) (autodiff's where the rows' sums " \
      "join a gradient so far, a tied embedding's: the ADD after GET_ROWS_BACK in one pass, its bits)")               \
    X(ACC, COPY, 2, OPF_INPLACE0_OPT, 3, 0,                                                                                     \
      "ip0-2 window nb1..3, ip3 offset (bytes), ip4 inplace: src0 with src1 added in the window")                      \
    X(SET, COPY, 2, OPF_INPLACE0_OPT, 3, 0,                                                                                     \
      "ip0-2 window nb1..3, ip3 offset (bytes), ip4 inplace: src0 with the window set to src1")                        \
    X(FILL, OWN, 0, 0, 0, 0, "ip0-3 ne, fp0 value")                                                                            \
    X(REPEAT, OWN, 1, 0, 1, 0, "ip0-3 ne: tile src0 (each ne divides the target)")                                             \
    X(REPEAT_BACK, OWN, 1, 0, 1, 0, "ip0-3 ne: sum src0 over its tiles")                                                       \
    X(CONCAT, COPY, 2, 0, 3, 0,                                                                                        \
      "ip0 dim; ip1 result type: 0 the sources', or bf16 for float32 sources (each value rounded as CAST rounds it)") \
    X(ADD, BINARY, 2, 0, 3, 0, "src1 broadcast over src0")                                                                        \
    X(SUB, BINARY, 2, 0, 3, 0, "src1 broadcast over src0")                                                                        \
    X(MUL, BINARY, 2, 0, 3, 0, "src1 broadcast over src0")                                                                        \
    X(DIV, BINARY, 2, 0, 3, 0, "src1 broadcast over src0")                                                                        \
    X(SCALE, UNARY, 1, 0, 1, 0, "fp0 s, fp1 b: s*x + b")                                                                         \
    X(SQR, UNARY, 1, 0, 1, 0, "")                                                                                                \
    X(SQRT, UNARY, 1, 0, 1, 0, "")                                                                                               \
    X(EXP, UNARY, 1, 0, 1, 0, "")                                                                                                \
    X(LOG, UNARY, 1, 0, 1, 0, "")                                                                                                \
    X(NEG, UNARY, 1, 0, 1, 0, "")                                                                                                \
    X(SUM, OWN, 1, 0, 1, 0, "all elements -> [1]")                                                                             \
    X(SUM_ROWS, ROWS, 1, 0, 1, 0, "over dim 0 -> [1,ne1,ne2,ne3]")                                                              \
    X(MEAN, ROWS, 1, 0, 1, 0, "over dim 0 -> [1,ne1,ne2,ne3]")                                                                  \
    X(MUL_MAT, MATMUL, 2, 0, 3, 0,                                                                                     \
      "src0 [K,M,a2,a3], src1 [K,N,b2,b3] -> [M,N,b2,b3]; b2%a2 == 0, b3%a3 == 0; bf16 sources: ip0 the result's "     \
      "type (f32 or bf16; sums in float32)")                                                                           \
    X(MUL_MAT_ADD, MATMUL, 3, 0, 7, 0,                                                                                 \
      "src0 [K,M,a2,a3], src1 [K,N,b2,b3], src2 c [M,N,b2,b3] -> MUL_MAT(src0, src1) + c (a residual added where "    \
      "the product is made: cuda through cuBLASLt's C input); c has the result's type; bf16 sources: ip0 the "      \
      "result's type (f32)")                                                                                           \
    X(OUT_PROD, MATMUL, 2, 0, 3, 0,                                                                                    \
      "src0 [I,K,n2,n3], src1 [J,K,n2,n3] -> [I,J,ip0,ip1], summing groups of n2/ip0; bf16 sources: ip2 the "          \
      "result's type")                                                                                                 \
    X(RMS_NORM, ROWS, 1, 0, 1, 0, "fp0 eps: x * rsqrt(mean(x^2) + eps) over dim 0")                                             \
    X(RMS_NORM_BACK, ROWS, 2, OPF_BACKWARD, 0, 0, "src0 x, src1 dy, fp0 eps")                                                   \
    X(L2_NORM, ROWS, 1, 0, 1, 0, "fp0 eps: x * rsqrt(sum(x^2) + eps) over dim 0")                                               \
    X(L2_NORM_BACK, ROWS, 2, OPF_BACKWARD, 0, 0, "src0 x, src1 dy, fp0 eps")                                                    \
    X(SOFT_MAX, ROWS, 1, 0, 1, 0, "fp0 scale: softmax(scale*x) over dim 0")                                                     \
    X(SOFT_MAX_CAUSAL, ROWS, 2, 0, 1, 2,                                                                                       \
      "src0 scores [Tk,Tq,H,B], src1 i32 positions [Tq,B]; fp0 scale: softmax(scale*x) over the keys of the query's "  \
      "example, o+t-pos[t] .. o+t (o = Tk-Tq, from 0); the rest 0")                                                      \
    X(SOFT_MAX_BACK, ROWS, 2, OPF_BACKWARD, 0, 0, "src0 y, src1 dy, fp0 scale")                                                 \
    X(FLASH_ATTN, OWN, 4, 0, 7, 8,                                                                                     \
      "q [D,H,Tq,B], k [D,KV,Tk,B], v [Dv,KV,Tk,B] (one type), i32 positions [Tq,B]; fp0 scale, ip0 the result's "    \
      "type for bf16 q, k, v (f32; f64 for the oracle) -> packed [o [Dv,H,Tq,B] | lse [H,Tq,B]] in q's type (bf16: " \
      "ip0's): softmax(scale q.k) over the keys SOFT_MAX_CAUSAL gives the "                                           \
      "query, query head h reading kv head h/(H/KV); lse = log of the softmax's sum (flash attention: no scores)")     \
    X(FLASH_ATTN_BACK, OWN, 6, OPF_BACKWARD, 0, 8,                                                                     \
      "q, k, v, positions, the forward's packed [o | lse], its gradient [do | dlse] or [do] (dlse 0); params as "  \
      "FLASH_ATTN -> packed "                                                                                          \
      "[dq | dk | dv] (q's, k's, v's shapes) in the forward's result type")                                                                         \
    X(ROPE, OWN, 2, 0, 1, 2,                                                                                                   \
      "src0 [D,H,T,B], src1 i32 positions [T] or [T,B]; ip0 n_rot, fp0 theta (rotate-half; float32 frequencies as "   \
      "transformers)")                                                                                                 \
    X(ROPE_BACK, OWN, 2, OPF_BACKWARD, 0, 2, "src0 dy, src1 positions; ip0 n_rot, fp0 theta")                                  \
    X(SILU, UNARY, 1, 0, 1, 0, "")                                                                                               \
    X(SILU_BACK, OWN, 2, OPF_BACKWARD, 0, 0, "src0 x, src1 dy")                                                                \
    X(SWIGLU, OWN, 2, 0, 3, 0,                                                                                         \
      "src0 gate, src1 up, one shape: silu(gate) * up, the SILU and MUL it replaces; ip0 result type (0: the sources', " \
      "bf16 for float32 sources: the float32 result rounded, the CAST it replaces)")                                   \
    X(SWIGLU_BACK, OWN, 3, OPF_BACKWARD, 0, 0, "src0 gate, src1 up, src2 dy -> packed [d gate | d up], each src0's shape; ip0 its " \
      "type: 0 the sources', or bf16 (float32 sources, each float32 value rounded as CAST rounds it)")             \
    X(SIGMOID, UNARY, 1, 0, 1, 0, "")                                                                                            \
    X(SIGMOID_BACK, OWN, 2, OPF_BACKWARD, 0, 0,                                                                        \
      "src0 y (SIGMOID's result), src1 dy -> dy * (y * (1 - y)): the SCALE and the two MULs of SIGMOID's old rule, "  \
      "formula by formula")                                                                                            \
    X(SOFTPLUS, UNARY, 1, 0, 1, 0, "log(1+exp(x)); x when x > 20 (as torch)")                                                    \
    X(SIGMOID_MUL, OWN, 2, 0, 3, 0,                                                                                    \
      "src0 x, src1 gate (x's shape) -> x * sigmoid(gate) (attention's output gate: the SIGMOID and MUL it replaces, " \
      "formula by formula); ip0 result type (0: the sources', bf16 for float32 sources: the float32 result rounded, "  \
      "the CAST it replaces)")                                                                                         \
    X(SIGMOID_MUL_BACK, OWN, 3, OPF_BACKWARD, 0, 0,                                                                    \
      "x, gate, dy -> packed [dx | dgate], each x's shape: dy sigmoid(gate) and SIGMOID_BACK(sigmoid(gate), dy x), " \
      "the bits of MUL's and SIGMOID's rules")                                                                         \
    X(DROPOUT, OWN, 1, 0, 1, 0,                                                                                                \
      "fp0 p, ip0 seed, ip1 stream, ip2 counter, ip3 threshold: x/(1-p) where ops/dropout_mask.h keeps it, else 0")     \
    X(CONV1D, OWN, 3, 0, 3, 4,                                                                                                 \
      "src0 x [C,T,B], src1 w [K,C], src2 i32 positions [T,B]: causal depthwise, no bias; y[t] reads x[t-d] for "      \
      "d <= pos[t] only")                                                                                              \
    X(CONV1D_BACK_INPUT, OWN, 3, OPF_BACKWARD, 0, 4, "src0 dy [C,T,B], src1 w [K,C], src2 positions -> dx; ip0 its type: 0 dy's, or " \
      "bf16 (float32 dy: each float32 sum rounded as CAST rounds it; autodiff's, where dx only feeds a bf16 product)") \
    X(CONV1D_BACK_WEIGHT, OWN, 3, OPF_BACKWARD, 0, 4, "src0 x [C,T,B], src1 dy, src2 positions, ip0 K -> dw [K,C]")           \
    X(RMS_NORM_W, OWN, 2, 0, 3, 0,                                                                                     \
      "src0 x, src1 w [ne0]; fp0 eps, ip0 1: the 1 + w form: rms_norm(x) * w (or * (1 + w)), the RMS_NORM, MUL (and " \
      "SCALE of w) it replaces, formula by formula; ip1 the result's type: 0 x's, or bf16 (float32 x, each value "   \
      "rounded as CAST rounds it)")                                                                                    \
    X(RMS_NORM_W_BACK, OWN, 3, OPF_BACKWARD, 0, 0,                                                                     \
      "x, w, dy; params as RMS_NORM_W -> packed [dx (x's shape) | dw (ne0 values)], dw the float64 sum over rows of "  \
      "the float32 products dy rms_norm(x), as each backend's REPEAT_BACK sums MUL's products (the same bits); ip1 "  \
      "bf16 (float32 x): [dx | dx rounded as CAST rounds it, bf16 in keel_bf16_part_floats(x's) floats | dw] "         \
      "(autodiff's, where dx goes on to a bf16 product's rule)")                                                      \
    X(RMS_NORM_W_BACK_ADD, OWN, 4, OPF_BACKWARD, 0, 0,                                                                 \
      "x, w, dy, g (x's shape and type); params as RMS_NORM_W -> RMS_NORM_W_BACK's packed result with g + dx in "     \
      "place of dx, added as ADD adds (autodiff's: the gradient so far of a residual stream, added where dx is made)") \
    X(QK_NORM_ROPE, OWN, 3, 0, 3, 4,                                                                                   \
      "src0 x [D,H,T,B], src1 w [D], src2 i32 positions [T] or [T,B]; fp0 eps, fp1 theta, ip0 1: the 1 + w form, "    \
      "ip1 n_rot: ROPE(RMS_NORM_W(x, w)), the ops it replaces formula by formula (attention's q and k); ip2 the "      \
      "result's type: 0 x's, or bf16 (float32 x, each value rounded as CAST rounds it)")                              \
    X(QK_NORM_ROPE_BACK, OWN, 4, OPF_BACKWARD, 0, 4,                                                                   \
      "x, w, positions, dy; params as QK_NORM_ROPE -> packed [dx | g rms_norm(x), whose rows sum to dw], g = "         \
      "ROPE_BACK(dy), each x's shape")                                                                                 \
    X(GATED_RMS_NORM, OWN, 3, 0, 7, 0,                                                                                 \
      "src0 x, src1 w [ne0], src2 z (x's shape); fp0 eps: rms_norm(x) * w * silu(z) (the DeltaNet's output norm: "     \
      "the RMS_NORM, MUL, SILU, MUL it replaces, formula by formula); ip1 the result's type, as RMS_NORM_W's")      \
    X(GATED_RMS_NORM_BACK, OWN, 4, OPF_BACKWARD, 0, 0,                                                                 \
      "x, w, z, dy -> packed [dx | dz (each x's shape) | dw (ne0 values)], dw summed from (dy silu(z)) rms_norm(x) "   \
      "as RMS_NORM_W_BACK sums it; ip1 bf16 (float32 x): dz rounded as CAST rounds it, bf16 in "                     \
      "keel_bf16_part_floats(x's) floats (autodiff's, where dz goes only to bf16 products)")                          \
    X(GDN_CONV, OWN, 3, 0, 3, 4,                                                                                       \
      "src0 x [C,T,B], src1 w [K,C], src2 i32 positions [T,B]; ip0 n, ip1 d, fp0 eps, fp1 s: y = silu(CONV1D(x)), "   \
      "then channels [0,2n) L2-normalised per d channels (x / sqrt(sum x^2 + eps)) and [0,n) times s (the DeltaNet's " \
      "conv, SiLU, q/k norms and q scale: the ops it replaces, formula by formula)")                                  \
    X(GDN_CONV_BACK, OWN, 4, OPF_BACKWARD, 0, 4,                                                                       \
      "x, w, positions, dy; params as GDN_CONV -> the gradient of the conv's output [C,T,B] (the conv recomputed)")    \
    X(GDN_GATE, OWN, 3, 0, 7, 0,                                                                                       \
      "src0 a [H,N..], src1 A_log, src2 dt_bias (H elements each) -> softplus(a + dt_bias) * -exp(A_log) (the "       \
      "DeltaNet's decay gate: the ADD, SOFTPLUS, EXP, NEG and MUL it replaces, formula by formula)")                  \
    X(GDN_GATE_BACK, OWN, 4, OPF_BACKWARD, 0, 0,                                                                       \
      "a, A_log, dt_bias, dy -> packed [da (a's shape) | dA_log [H] | ddt_bias [H]]: the bits of the old rules' ops, " \
      "the two sums over a's rows as REPEAT_BACK makes them on each backend")                                          \
    X(GATED_DELTA_NET, OWN, 6, 0, 31, 32,                                                                              \
      "q,k [Dk,Hk,T,B], v [Dv,Hv,T,B], g,beta [Hv,T,B], i32 positions [T,B] -> o [Dv,Hv,T,B]; the state is 0 "         \
      "before a step at position 0; ip0: the CUDA kernels' products, 0 float32 on the CUDA cores, 1 the tensor "     \
      "cores in split TF32 (about float32's precision), 2 the tensor cores in split bf16 (16 bits), 3 the "         \
      "forward as 2 and the backward's products on one bf16 part (8 bits; the bf16 mode) (other backends: "         \
      "float32 or float64 whatever ip0 says)")                                                                      \
    X(GATED_DELTA_NET_BACK, OWN, 7, OPF_BACKWARD, 0, 32,                                                               \
      "q,k,v,g,beta,positions,do; ip0 as GATED_DELTA_NET -> packed [a row a token: dq|dk|dv (per value head)] then dg, dbeta (keel_gdn_back_layout)")\
    X(GATED_DELTA_NET_STATE, OWN, 7, 0, 0, 32,                                                                         \
      "q,k,v,g,beta,positions as GATED_DELTA_NET, S0 [Dv,Dk,Hv,B] -> packed [o | final state] (decoding)")             \
    X(CROSS_ENTROPY_LOSS, OWN, 2, 0, 1, 2,                                                                                     \
      "src0 logits [V,N..], src1 i32 targets [N..] (< 0: no loss) -> sum of -log p(target) / D [1]; fp0 D (0: the "   \
      "count of targets >= 0)")                                                                                        \
    X(CROSS_ENTROPY_LOSS_BACK, OWN, 3, OPF_BACKWARD, 0, 2, "logits, targets, dloss [1] -> dlogits; fp0 D as the loss's")        \
    X(LINEAR_CROSS_ENTROPY, OWN, 3, 0, 3, 4,                                                                           \
      "src0 x [D,N..], src1 W [D,V], src2 i32 targets [N..] (< 0: no loss) -> [1]: CROSS_ENTROPY_LOSS of the "         \
      "logits W^T x, ip0 tokens at a time (float32 sums; bf16 x, W: bf16 operands and logits); fp0 D as its; "      \
      "ip1 1: packed [dx | dW | loss], the backward's result for dloss 1 made from the same logits (ip2 1: "       \
      "skipped, zeros)")                                                                                            \
    X(LINEAR_CROSS_ENTROPY_BACK, OWN, 4, OPF_BACKWARD, 0, 4,                                                           \
      "x, W, targets, dloss [1] -> packed [dx | dW] (float32 for bf16 x, W, whose logits' gradient g is rounded to " \
      "bf16 on every backend); ip0 chunk, fp0 D; the logits made again a chunk at a time")                            \
    X(SUM_SQ, OWN, 1, 0, 0, 0,                                                                                  \
      "contiguous float32 x -> [1]: the sum of squares in a fixed two-level order, float64 sums of blocks of "         \
      "KEEL_SUM_SQ_BLOCK elements, then of the blocks' sums (each level in its backend's fixed order)")              \
    X(ADAMW, OWN, 5, OPF_INPLACE0 | OPF_SIDE_EFFECT, 0, 0,                                                             \
      "p,g,m,v (contiguous float32, one shape), s [1] = SUM_SQ of the gradients; fp0 lr fp1 beta1 fp2 beta2 fp3 eps "  \
      "fp4 wd fp5 clip (0: none); ip0 step (1-based), ip1 divisor d, ip2 decay end (elements [0, ip2) decay): "        \
      "with n = sqrt(s) / d, g times min(1, clip / n) / d; no element changes when n is not finite")                  \
    X(ADAMW_SHADOW, OWN, 6, OPF_INPLACE0 | OPF_SIDE_EFFECT, 0, 0,                                                      \
      "ADAMW's sources and parameters, ip3, and c (contiguous bf16 [ip2 - ip3]): ADAMW's update, then c[i - ip3] = "   \
      "p[i] rounded as CAST rounds it for ip3 <= i < ip2 (decayed weights' bf16 copies that SHADOW reads); nothing "  \
      "changes when n is not finite")

enum {
    OPF_LEAF = 1 << 0,         /* no computation */
    OPF_VIEW = 1 << 1,         /* result is a view of src0: no kernel, no bytes of its own */
    OPF_INPLACE0 = 1 << 2,     /* result always aliases src0 */
    OPF_INPLACE0_OPT = 1 << 3, /* result aliases src0 when ip4 != 0 */
    OPF_INPLACE1 = 1 << 4,     /* result aliases src1 */
    OPF_SIDE_EFFECT = 1 << 5,  /* writes sources other than its result (never recomputed) */
    OPF_BACKWARD = 1 << 6,     /* exists to express a gradient */
};

/* Op families: ops whose kernels share one shape rule and one dispatch. */
typedef enum {
    FAM_LEAF,   /* no computation */
    FAM_VIEW,   /* a view of src0 */
    FAM_COPY,   /* the backend's one copy path: CPY, CONT, DUP, ACC, SET, CONCAT */
    FAM_UNARY,  /* y = f(x) elementwise, same shape and type (ops/scalar_f32.h: keel_unary_f32) */
    FAM_BINARY, /* y = f(a, b) elementwise, b broadcast over a (keel_binary_f32) */
    FAM_ROWS,   /* computed independently per row along dim 0 (norms, softmax, row sums) */
    FAM_MATMUL, /* matrix products */
    FAM_OWN,    /* a kernel of its own */
} keel_op_family;

typedef enum {
#define KEEL_OP_ENUM(id, family, arity, flags, grad, index, doc) KEEL_OP_##id,
    KEEL_OP_TABLE(KEEL_OP_ENUM)
#undef KEEL_OP_ENUM
        KEEL_OP_COUNT
} keel_op;

// clang-format on
#endif
