/* keel: decoding, for generation: the prompt runs once, then each new token runs alone against
 * the attention layers' key/value cache and the DeltaNet layers' recurrent and convolution states
 * (keel_qwen35_forward_cached), on weights placed once (a weights-only keel_step). The ordinary
 * forward pass over a whole sequence is here too, to check the decoder against it. */
#ifndef KEEL_DECODE_H
#define KEEL_DECODE_H

#include "backend/backend.h"
#include "io/adapter.h"
#include "io/checkpoint.h"

typedef struct keel_decoder keel_decoder;

/* The checkpoint's weights on be (which the caller keeps and frees), with a PEFT LoRA adapter
 * beside them when ad is not NULL (kept by the caller too), empty caches. NULL with a message. */
keel_decoder *keel_decoder_new(const keel_checkpoint *ck, const keel_adapter *ad, keel_backend *be);
void keel_decoder_free(keel_decoder *d);
/* Runs n tokens from the position after those seen so far; writes the last position's logits (vocab floats). */
int keel_decoder_run(keel_decoder *d, const int32_t *ids, int64_t n, float *last_logits);
/* The ordinary forward pass over ids[0..T): logits [T x vocab] (malloc'd), or NULL with a message. */
float *keel_decoder_full_logits(keel_decoder *d, const int32_t *ids, int64_t T);

#endif
