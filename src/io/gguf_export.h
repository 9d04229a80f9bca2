/* keel: a Qwen3.5 checkpoint as a GGUF file for llama.cpp's `qwen35` architecture (and so for
 * Ollama and LM Studio). llama.cpp computes the same model with its own conventions, which the
 * export bridges:
 *   - the (1 + w) RMSNorm weights are stored as 1 + w (llama.cpp multiplies by the weight); the
 *     DeltaNet output norm, a plain weight, is stored as is;
 *   - A_log is stored as A = -exp(A_log), dt_bias as the ssm_dt bias, the conv weight [C,1,K] as
 *     [C,K];
 *   - DeltaNet value heads are reordered from grouped by key head (value head h reads key head
 *     h / (Hv/Hk), transformers' order) to tiled (key head h % Hk, what ggml's broadcast gives),
 *     in every tensor that has a value-head axis;
 *   - the tokenizer travels as tokenizer.ggml.* (byte-level BPE: tokens, types, merges, the
 *     pre-tokenizer named by its regex, special ids, chat template), or, for a model trained on
 *     bytes, a 256-token byte vocabulary.
 * What llama.cpp cannot compute the same way is refused with a message naming it. */
#ifndef KEEL_GGUF_EXPORT_H
#define KEEL_GGUF_EXPORT_H

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "io/gguf.h"
#include "model/qwen35.h"

typedef struct {
    keel_ggml_type type;   /* for the matrices; norms, biases, A and the conv stay float32 */
    const char *tokenizer; /* a tokenizer.json to use instead of the checkpoint folder's; NULL: the folder's */
    bool byte_vocab;       /* no tokenizer: the model was trained on bytes (known without this flag when the
                              vocabulary is 256 or keel train's trainer_state.json says "bytes") */
    const char *name;      /* general.name; NULL: the folder's name */
    void (*progress)(void *ud, int done, int total);
    void *ud;
} keel_gguf_export_opts;

/* Checks that llama.cpp can run this config exactly; -1 with a message naming what it cannot. */
int keel_gguf_check_config(const keel_qwen35_config *c);

/* Writes m's parameters (as loaded on be from checkpoint ck) to out_path. */
int keel_gguf_export(const keel_checkpoint *ck, const keel_qwen35 *m, keel_backend *be, const char *out_path,
                     const keel_gguf_export_opts *o);

#endif
