/* keel: one way to build a model's step. Every command that runs the model forward (and
 * backward, and AdamW) builds it here: the model's parameters and inputs, the forward graph and
 * the outputs a caller reads, the backward pass, the recompute rewrite, AdamW, the plan bound to
 * a backend with the positions written once, and one free for all of it.
 *
 *   keel_step *st = keel_step_build(&opts);    graph only: a caller may append nodes (the trainer's
 *   keel_step_adamw(st, ...);                  accumulation and gradient norm) before placing it
 *   keel_step_place(st, be);                   plan + session; positions 0..T-1 a column; moments zeroed
 *   keel_checkpoint_load(ck, st->m, be) / keel_qwen35_init_weights(st->m, be, seed)
 *   keel_step_run(st, ids, targets, cb, ud);   as often as needed
 *   keel_step_free(st);
 */
#ifndef KEEL_STEP_H
#define KEEL_STEP_H

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "model/lora.h"
#include "model/qwen35.h"
#include "recompute/recompute.h"
#include "train/optim.h"

/* --precision: f32, keel's parity mode; bf16, mixed precision (float32 master weights, gradients,
 * moments and residual stream; the projections' operands bf16 copies, their sums float32). */
typedef enum { KEEL_PRECISION_F32, KEEL_PRECISION_BF16 } keel_precision;
/* "f32" or "bf16"; -1 with a message naming --precision. */
int keel_precision_parse(const char *s, keel_precision *out);
const char *keel_precision_name(keel_precision p);

typedef struct {
    const keel_qwen35_config *cfg;
    keel_type type; /* of parameters and activations: F32 (cpu, cuda), F64 (ref) */
    int64_t batch, window;
    bool logits_only;                     /* no targets and no loss: the logits are the output */
    bool backward;                        /* the gradient of every parameter flagged PARAM */
    const keel_recompute_mode *recompute; /* NULL: off */
    bool keep_logits;                     /* the logits stay readable after a run */
    bool keep_hidden;                     /* so do every hidden state and the final norm's output */
    const char *freeze;                   /* POSIX extended regex: parameters it matches get no gradient */
    bool weights_only;                    /* only the parameters, placed (save, export, decoding); no inputs */
    const keel_lora_opts *lora;           /* LoRA adapters to train beside the selected weights (base frozen) */
    const keel_adapter *adapter;          /* or a saved PEFT adapter's modules (evaluation: no dropout) */
    bool base_bf16;                       /* the base's matrices stored in bf16 (a frozen base: with lora) */
    keel_precision precision;             /* of the products (KEEL_PRECISION_F32: parity) */
    bool gdn_float32; /* bf16: the delta rule's float32 variant all the same (keel_qwen35's gdn_float32) */
    /* bf16 with recompute off: the matrices' bf16 copies kept by AdamW (ADAMW_SHADOW writes them as it
     * updates the weights; SHADOW reads them) instead of a CAST of every weight in every step; the same
     * bits. Needs keel_step_adamw over every parameter (no LoRA, no freeze), and keel_step_sync_copies
     * after the weights are written (init, load, resume). keel_step_copies_wanted says when. */
    bool weight_copies;
} keel_step_opts;

typedef struct {
    keel_ctx *ctx;
    keel_qwen35 *m;
    keel_tensor *ids, *tgt, *pos; /* [T,B], [T,B] (NULL when logits_only), [T,B]; all NULL when weights_only */
    keel_qwen35_out out;
    keel_graph *g;
    int clones;                  /* nodes the recompute rewrite added */
    int n_frozen;                /* parameters the freeze pattern matched */
    int n_opt;                   /* AdamW (keel_step_adamw): the parameters it updates, */
    keel_tensor **opt_p;         /* which they are, */
    keel_optim opt;              /* their moments, the gradients' sum of squares and the update node */
    const keel_adapter *adapter; /* the adapter keel_step_load reads (opts.adapter) */
    keel_tensor *copies;         /* opts.weight_copies: the bf16 copies (ADAMW_SHADOW's c), else NULL; */
    int64_t copies_start;        /* the parameter group's element where they start */
    keel_backend *be;            /* after keel_step_place */
    keel_session *s;
} keel_step;

/* NULL with a message. */
keel_step *keel_step_build(const keel_step_opts *o);
/* A step of any graph (one op to time, one op's test case): an empty step; the caller makes its
 * tensors in st->ctx, names the outputs with keel_step_set_outputs, then keel_step_place. */
keel_step *keel_step_custom(void);
int keel_step_set_outputs(keel_step *st, keel_tensor *const *outputs, int n);
/* The gradient of the model's i-th parameter (NULL when it has none: frozen, or no backward). */
keel_tensor *keel_step_grad(const keel_step *st, int i);
/* Appends AdamW (keel_adamw_attach: one update node over the parameters, gradients and moments
 * laid out back to back) for params[i] with gradient grads[i]; params NULL: every parameter of the
 * model with its own gradient. clip 0: none; divisor: the micro-batches x ranks the gradients sum.
 * Set its step and learning rate before each update with keel_adamw_set(st->opt.adamw, ...). */
int keel_step_adamw(keel_step *st, keel_tensor *const *params, keel_tensor *const *grads, int n, double lr,
                    double weight_decay, double clip, int64_t divisor);
/* Whether a step of these options keeps the weights' bf16 copies in AdamW (opts.weight_copies): bf16
 * mixed precision, float32 weights, a backward with recompute off, every parameter trained (no LoRA,
 * no adapter, no freeze, no bf16 base). Recompute keeps the CASTs: there the copies would be 2 bytes a
 * weight more memory all the time, where with recompute off the CASTs' results are alive through the
 * step anyway. */
bool keel_step_copies_wanted(const keel_step_opts *o);
/* Makes the bf16 copies from the weights as they are on the device (after keel_qwen35_init_weights,
 * keel_step_load, a resume): the bits CAST gives. No-op without copies. */
int keel_step_sync_copies(keel_step *st);
/* Plans and binds the graph on be (which the caller keeps and frees), writes the positions and
 * zeroes AdamW's moments. */
int keel_step_place(keel_step *st, keel_backend *be);
/* The weights, after keel_step_place: the checkpoint's, then the adapter's factors when the step
 * was built with opts.adapter. */
int keel_step_load(keel_step *st, const keel_checkpoint *ck);
/* The parameters a training step updates: the model's PARAM-flagged parameters, or with LoRA
 * the adapters' factors. Returns their count and sets *out to a malloc'ed array; -1 if out of memory. */
int keel_step_trainable(const keel_step *st, keel_tensor ***out);
/* Writes ids and targets (B*T each; targets ignored when logits_only) and runs the whole graph,
 * calling cb after every node. */
int keel_step_run(keel_step *st, const int32_t *ids, const int32_t *targets, keel_node_cb cb, void *ud);
/* Writes ids and targets only (for callers that run node ranges themselves). */
int keel_step_write_batch(keel_step *st, const int32_t *ids, const int32_t *targets);
/* Writes the positions [T,B] of packed windows (each example from 0; keel_step_place wrote 0..T-1). */
int keel_step_write_positions(keel_step *st, const int32_t *pos);
void keel_step_free(keel_step *st);

#endif
