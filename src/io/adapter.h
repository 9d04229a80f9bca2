/* keel: LoRA adapters in PEFT's format (a folder with adapter_config.json and
 * adapter_model.safetensors, as PeftModel.save_pretrained writes it), merged into a model's
 * weights: W' = W + s * B A, with s = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora),
 * computed in float64 and rounded once to the parameter's type. Tensor names may carry PEFT's
 * prefix (base_model.model.) and either checkpoint layout (model.layers.N... or
 * model.language_model.layers.N...). What a plain merge cannot express (DoRA, trained biases,
 * embedding adapters, modules saved in full, per-module ranks or alphas) is refused by name. */
#ifndef KEEL_ADAPTER_H
#define KEEL_ADAPTER_H

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/qwen35.h"

typedef struct {
    char *dir;
    int64_t r;
    double alpha, scale;
    bool rslora; /* scale = alpha / sqrt(r) */
    keel_st_file *file;
} keel_adapter;

/* NULL with a message naming the file and what is wrong. */
keel_adapter *keel_adapter_open(const char *dir);
void keel_adapter_close(keel_adapter *a);

/* Adds s * B A to every targeted parameter of m on be. Every lora_A has its lora_B, each pair
 * targets a parameter of m with matching shapes; otherwise -1 naming the tensor. *n_merged (may
 * be NULL) gets the number of parameters changed. */
int keel_adapter_merge(const keel_adapter *a, const keel_qwen35 *m, keel_backend *be, int *n_merged);

/* The stored factor ('A' or 'B') of the parameter named param_name in keel's text layout
 * ("model.layers.3.mlp.up_proj.weight"), whatever prefix and layout the file uses; NULL if absent. */
const keel_st_tensor *keel_adapter_find(const keel_adapter *a, const char *param_name, char which);
/* The parameters the adapter targets (keel's names), each with both factors; -1 naming a tensor
 * that is not a LoRA factor or lacks its partner. *names (and each name) is malloc'ed, also on error. */
int keel_adapter_targets(const keel_adapter *a, char ***names, int *n);

#endif
