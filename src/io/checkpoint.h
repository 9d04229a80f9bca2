/* keel: Hugging Face checkpoint folders for the Qwen3.5 family: config.json in either layout
 * (text fields at top level, or under text_config in the multimodal release) and weights in one
 * model.safetensors or shards listed by model.safetensors.index.json, with tensor names in either
 * layout (model.layers.N... or model.language_model.layers.N...; model.visual.* and mtp.* are
 * ignored). */
#ifndef KEEL_CHECKPOINT_H
#define KEEL_CHECKPOINT_H

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/qwen35.h"

typedef struct {
    char *dir;
    keel_qwen35_config cfg;
    bool multimodal; /* names under model.language_model. */
    keel_st_file **files;
    int n_files;
    char dtype[8]; /* dtype of the first text weight ("BF16", "F32", ...) */
} keel_checkpoint;

/* Reads config.json of dir into cfg; -1 with a message naming the file and field. */
int keel_hf_config_read(const char *dir, keel_qwen35_config *cfg, bool *multimodal);
/* The same for a config.json at any path. */
int keel_hf_config_read_file(const char *path, keel_qwen35_config *cfg, bool *multimodal);
/* cfg as the text layout's config.json (Qwen3_5ForCausalLM), malloc'ed; NULL when out of memory. */
char *keel_hf_config_json(const keel_qwen35_config *cfg, keel_type dtype);
keel_checkpoint *keel_checkpoint_open(const char *dir);
void keel_checkpoint_close(keel_checkpoint *c);
/* The tensor stored for a text-layout name ("model.layers.0.mlp.up_proj.weight"), or NULL. */
const keel_st_tensor *keel_checkpoint_find(const keel_checkpoint *c, const char *name);
/* The checkpoint holds exactly the model's tensors (no unknown name, none missing), each of the
 * config's shape and of a dtype keel reads; -1 with a message naming the tensor otherwise. */
int keel_checkpoint_validate(const keel_checkpoint *c, const keel_qwen35 *m);
/* Every value of the model's tensors is finite; -1 with a message naming the first tensor that
 * holds NaN or Inf, how many, and where. */
int keel_checkpoint_check_finite(const keel_checkpoint *c, const keel_qwen35 *m);
/* Writes every parameter of m from the checkpoint to backend be (types converted), after
 * keel_checkpoint_validate. */
int keel_checkpoint_load(const keel_checkpoint *c, const keel_qwen35 *m, keel_backend *be);

/* Writes m's parameters (read from be) as a Hugging Face checkpoint folder: config.json and
 * model.safetensors in `dtype`, in the text layout or (with a multimodal source, whose config and
 * vision tensors are carried over unchanged) the multimodal one. Written to a temporary folder,
 * fsynced, then renamed over out_dir. */
int keel_checkpoint_save(const char *out_dir, const keel_qwen35 *m, keel_backend *be, keel_type dtype,
                         const keel_checkpoint *src, bool multimodal);
/* The same, calling extra(tmp_dir, ud) to add files (a trainer's state) before the folder is
 * swapped into place, so that they land, or not, together. */
int keel_checkpoint_save_ex(const char *out_dir, const keel_qwen35 *m, keel_backend *be, keel_type dtype,
                            const keel_checkpoint *src, bool multimodal, int (*extra)(const char *tmp_dir, void *ud),
                            void *ud);

/* The one way keel writes a folder: fill(tmp_dir, ud) writes its files into a fresh temporary
 * folder beside out_dir, which is fsynced and then swapped into place (an existing out_dir is
 * replaced only once the new one is complete). */
int keel_save_folder(const char *out_dir, int (*fill)(const char *tmp_dir, void *ud), void *ud);
/* Writes text to path and fsyncs it (inside a folder keel_save_folder fills). */
int keel_write_text_synced(const char *path, const char *text);

#endif
