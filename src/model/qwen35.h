/* keel: the Qwen3.5 text model (DESIGN.md, "The model"): config -> parameters -> forward graph.
 * Parameters are leaves flagged PARAM and named as in a text-layout Hugging Face checkpoint
 * ("model.layers.3.self_attn.q_proj.weight"); shapes are the checkpoint's, reversed (dim 0 fastest). */
#ifndef KEEL_QWEN35_H
#define KEEL_QWEN35_H

#include "backend/backend.h"
#include "recompute/recompute.h"
#include "tensor/tensor.h"

#define KEEL_QWEN35_MAX_LAYERS 256

typedef struct {
    int64_t vocab, hidden, layers, ffn;
    int64_t heads, kv_heads, head_dim;                       /* gated full attention */
    int64_t lk_heads, lv_heads, lk_dim, lv_dim, conv_kernel; /* Gated DeltaNet */
    double rope_theta, partial_rotary, rms_eps;
    bool tied;
    uint8_t full_attention[KEEL_QWEN35_MAX_LAYERS]; /* per layer: 1 gated attention, 0 DeltaNet */
} keel_qwen35_config;

typedef struct {
    keel_tensor *in_norm, *post_norm, *gate, *up, *down;
    /* gated attention */
    keel_tensor *q, *k, *v, *o, *q_norm, *k_norm;
    /* Gated DeltaNet */
    keel_tensor *qkv, *z, *b, *a, *conv, *A_log, *dt_bias, *norm, *out;
} keel_qwen35_layer;

/* Tokens of one chunk of the fused LM head + loss (mixed precision). Its scratch on cuda (the bf16
 * logits, then their gradient in their place, 2 bytes a logit: 248,320 x 2048 x 2 = 0.95 GiB for
 * Qwen3.5's vocabulary) is among the largest of a step; a chunk of 2048 tokens reads and writes
 * the float32 dW (0.95 GiB) half as often as one of 1024. The chunk decides dW's order of sums, so
 * it is one constant: every recompute mode must give the same bits. */
#define KEEL_LM_HEAD_CHUNK 2048

typedef struct {
    keel_qwen35_config cfg;
    keel_tensor *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    keel_qwen35_layer layer[KEEL_QWEN35_MAX_LAYERS];
    keel_tensor **params; /* in checkpoint order */
    int n_params;
    keel_type matrix_type; /* of the matrices but the LM head's (keel_qwen35_new_ex) */
    /* the type of the projections' operands: the activations' (parity), or KEEL_BF16 (mixed precision:
     * bf16 copies of the float32 weights and inputs, made where they are used, so recompute makes them
     * again; float32 sums and results) */
    keel_type operand_type;
    /* bf16 training graphs: the fused head computes its gradients in the forward, while it has
     * each chunk's logits (keel_linear_cross_entropy_with_grads); set by whoever builds a backward */
    bool head_grads_in_forward;
    /* mixed precision with the delta rule's float32 variant rather than its split-bf16 products
     * (test-model's mixed pair: it holds the mixed graph's roundings to ref's, which the split
     * products' 2^-16 would move across bf16 boundaries; that variant has its own oracles) */
    bool gdn_float32;
    struct keel_lora *lora; /* LoRA adapters (model/lora.h), NULL: none */
    /* per params[i]: its bf16 copy kept by the optimizer, which the bf16 graph reads through SHADOW in
     * place of a CAST (keel_step_opts.weight_copies; the step builder fills it, keel_qwen35_free frees
     * it); NULL (the array or an entry): a CAST */
    keel_tensor **copy;
} keel_qwen35;

/* Named configurations: "tiny" (the shared fixture's shape), "small" (the demo's: 4 layers of
 * hidden 128, byte vocabulary), "0.8b" (Qwen3.5-0.8B's shape). -1 for an unknown name. */
int keel_qwen35_preset(const char *name, keel_qwen35_config *c);
/* Checks a config; -1 with a message naming the field. */
int keel_qwen35_config_check(const keel_qwen35_config *c);
/* Parameter leaves of the given type. NULL with an error. Free with keel_qwen35_free. */
keel_qwen35 *keel_qwen35_new(keel_ctx *ctx, const keel_qwen35_config *c, keel_type type);
/* The same with the matrices (the projections, an untied input embedding; not the convolution, not
 * the LM head's matrix) of matrix_type: a frozen base stored in bf16. Each use reads a float32 copy (CAST) made where it is used, which
 * recompute makes again, so only the bf16 copy stays resident when activations are recomputed. */
keel_qwen35 *keel_qwen35_new_ex(keel_ctx *ctx, const keel_qwen35_config *c, keel_type type, keel_type matrix_type);
void keel_qwen35_free(keel_qwen35 *m);

typedef struct {
    keel_tensor *logits;                             /* [V, T, B] */
    keel_tensor *loss;                               /* [1], when targets were given */
    keel_tensor *hidden[KEEL_QWEN35_MAX_LAYERS + 1]; /* hidden[0] embeddings, hidden[i] after layer i */
    keel_tensor *normed;                             /* after the final norm */
    keel_layer_map layers;                           /* for activation recompute */
} keel_qwen35_out;

/* The input leaves of a forward graph: ids, targets and positions [T, B] (i32), named input_ids,
 * targets and positions; tgt may be NULL when no loss is wanted. Positions count from 0 at the
 * start of each example: where they restart, attention, the DeltaNet convolution and its state
 * start afresh, so packed examples never see each other (0..T-1 per column: one example). */
int keel_qwen35_inputs(keel_ctx *ctx, int64_t T, int64_t B, keel_tensor **ids, keel_tensor **tgt, keel_tensor **pos);

/* Forward graph for ids [T, B] (i32), positions [T, B] (i32), targets [T, B] (i32, or NULL). */
int keel_qwen35_forward(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *ids, keel_tensor *pos, keel_tensor *targets,
                        keel_qwen35_out *out);

/* Decoding state per layer: attention layers k, v [head_dim, kv_heads, T_seen, 1] (after the
 * norms and RoPE); DeltaNet layers S [Dv, Dk, Hv, 1] and conv [C, K-1, 1] (the last K-1 inputs
 * of the causal convolution). */
typedef struct {
    keel_tensor *k[KEEL_QWEN35_MAX_LAYERS], *v[KEEL_QWEN35_MAX_LAYERS];
    keel_tensor *S[KEEL_QWEN35_MAX_LAYERS], *conv[KEEL_QWEN35_MAX_LAYERS];
    keel_tensor *conv_pos; /* in: i32 [K-1+T, 1], the positions of [conv inputs | new tokens] */
} keel_qwen35_cache;

/* Forward for decoding (batch 1): ids [T,1] at positions pos [T,1], continuing from `in` (attention
 * k/v NULL when nothing was seen yet; DeltaNet S and conv always given, zeros at the start, and
 * conv_pos when the model has DeltaNet layers).
 * Fills `out` with the state after these tokens and returns the logits [V,T,1]. */
keel_tensor *keel_qwen35_forward_cached(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *ids, keel_tensor *pos,
                                        const keel_qwen35_cache *in, keel_qwen35_cache *out);

/* Values for every parameter from a seed, shaped like transformers' initialisation (normal(0,
 * 0.02) projections and embeddings, zero (1+w) norms, unit gated norm and dt_bias, A_log =
 * log U(0,16], conv U(-1/sqrt(K), 1/sqrt(K)) as PyTorch's Conv1d default). vals[i] has keel_nelements(params[i]) values. */
double **keel_qwen35_init_values(const keel_qwen35 *m, uint64_t seed);
/* Fresh weights on a backend: parameter i gets keel_qwen35_init_values' values seeded with
 * seed * 1000003 + i (so `keel init --seed N` and `keel train --preset ... --seed N` agree), one
 * tensor's values at a time, sent as float32 to float32 parameters (no staging copy). */
int keel_qwen35_init_weights(const keel_qwen35 *m, keel_backend *be, uint64_t seed);

#endif
