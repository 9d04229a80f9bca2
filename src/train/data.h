/* keel: training data. Text files, folders of them, and JSON Lines files with a "text" field
 * become documents; documents become token ids (the model's tokenizer, or bytes when there is
 * none) joined by the end-of-text token, split into a training and a held-out stream by document,
 * and cached next to the output. Batches are windows of T tokens (and the next T as targets) in a
 * deterministic shuffled order: sample p of the run is always the same window for the same seed. */
#ifndef KEEL_TRAIN_DATA_H
#define KEEL_TRAIN_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct {
    int32_t *train, *eval;
    int64_t n_train, n_eval;
    int64_t n_docs, n_eval_docs;
    int32_t eot;
    bool cached; /* loaded from the cache */
} keel_dataset;

/* tok NULL: bytes, with 0 as end-of-text. cache_path NULL: no cache. */
int keel_dataset_load(keel_dataset *d, const char *const *paths, int n_paths, keel_tokenizer *tok, double eval_fraction,
                      uint64_t seed, const char *cache_path);
void keel_dataset_free(keel_dataset *d);

/* Windows of the training stream: ids and targets [T, B] for samples p .. p+B-1. */
int64_t keel_dataset_windows(const keel_dataset *d, int64_t T);
void keel_dataset_batch(const keel_dataset *d, int64_t T, int64_t B, uint64_t seed, int64_t p, int32_t *ids,
                        int32_t *tgt);

#endif
