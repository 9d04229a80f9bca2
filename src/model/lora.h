/* keel: LoRA adapters in the model (PEFT's LoRA): beside a targeted linear weight W, two factors
 * A [r x in] and B [out x r], and the layer computes W x + s B A drop(x), s = alpha / r
 * (alpha / sqrt(r) with rsLoRA), drop = inverted dropout of probability p on the adapter's input
 * only. The base weights lose their PARAM flag (frozen: no gradient, no optimizer state); A and B
 * are the parameters. Initialised as PEFT does (A uniform in +-1/sqrt(in), B zero, so training
 * starts from the base model exactly), saved and loaded in PEFT's format (adapter_config.json +
 * adapter_model.safetensors, names "base_model.model.<module>.lora_A.weight"). */
#ifndef KEEL_LORA_H
#define KEEL_LORA_H

#include <stdbool.h>

#include "backend/backend.h"
#include "io/adapter.h"
#include "model/qwen35.h"

typedef struct {
    int64_t rank;         /* r > 0 */
    double alpha;         /* lora_alpha */
    bool rslora;          /* s = alpha / sqrt(r) instead of alpha / r */
    double dropout;       /* p in [0, 1): 0 for evaluation and generation */
    uint64_t seed;        /* of the dropout masks */
    const char *targets;  /* POSIX ERE searched in module names ("model.layers.3.mlp.up_proj"); NULL: all */
    char *const *modules; /* or exactly these weights (keel names, "model.layers.3.mlp.up_proj.weight") */
    int n_modules;
} keel_lora_opts;

typedef struct {
    keel_tensor *W, *A, *B; /* A ne [in, r], B ne [r, out]: the checkpoint's [r, in], [out, r] reversed */
    char module[KEEL_NAME_MAX];
} keel_lora_module;

struct keel_lora {
    keel_lora_opts o; /* targets and modules are not kept */
    double scale;
    keel_lora_module *mod;
    int n;
    keel_tensor **params; /* A and B of each module, in module order */
    int n_params;
};

/* The weights LoRA may target: every linear projection of the decoder layers (attention q, k, v,
 * o; DeltaNet in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj; MLP gate, up, down). Adds an
 * adapter to each one the options select (in parameter order) and freezes every base parameter.
 * -1 naming what is wrong (no weight matched, a module that is not a targetable weight). */
int keel_lora_attach(keel_ctx *ctx, keel_qwen35 *m, const keel_lora_opts *o);
void keel_lora_free(struct keel_lora *l);
/* y (= W x) plus W's adapter applied to x, or y itself when W has none. */
keel_tensor *keel_lora_linear(keel_ctx *ctx, const keel_qwen35 *m, const keel_tensor *W, keel_tensor *x,
                              keel_tensor *y);
/* PEFT's initialisation, from a seed: A_i uniform in +-1/sqrt(in) (kaiming_uniform with a =
 * sqrt(5), as nn.Linear and PEFT), B zero. */
int keel_lora_init_weights(const keel_qwen35 *m, keel_backend *be, uint64_t seed);
/* Writes adapter_model.safetensors (float32) and adapter_config.json into dir, each fsynced.
 * multimodal: the names of a Qwen3_5ForConditionalGeneration base (model.language_model.layers...);
 * base: the base model's path for base_model_name_or_path (may be NULL). */
int keel_lora_write(const char *dir, const keel_qwen35 *m, keel_backend *be, bool multimodal, const char *base);
/* The options that rebuild an adapter's modules (rank, alpha, rsLoRA, the targeted weights, no
 * dropout); *names holds the weights' names (free with keel_lora_names_free). */
int keel_lora_opts_from_adapter(const keel_adapter *a, keel_lora_opts *o, char ***names);
void keel_lora_names_free(char **names, int n);
/* Loads every module's A and B from the adapter: the adapter must hold exactly the model's modules
 * at its rank; -1 naming the tensor otherwise. */
int keel_lora_load(const keel_qwen35 *m, keel_backend *be, const keel_adapter *a);

#endif
