/* keel: what the rest of keel (C code) may ask of the CUDA backend beyond the backend interface. */
#ifndef KEEL_CUDA_API_H
#define KEEL_CUDA_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"

/* The backend's one stream (a cudaStream_t), for work that must be ordered with its kernels. */
void *keel_cuda_stream(keel_backend *be);
/* The most device memory the backend had allocated at once, in bytes. */
size_t keel_cuda_peak_bytes(keel_backend *be);
/* The scratch (working memory beyond its result) the kernel of node takes on this backend, from
 * shapes, types and strides alone: sessions reserve the largest of their graph's before running it,
 * and `keel info` adds it to the plan. */
size_t keel_cuda_scratch_bytes(const keel_tensor *node);
/* The block node `reader` of g reads from an earlier node, *writer, that made it (the plan's
 * keel_carry_fn): the delta rule's chunk states, made by its forward, read by its backward. */
size_t keel_cuda_carry_bytes(const keel_graph *g, int64_t reader, int64_t *writer);
#ifdef __cplusplus
}
#endif

#endif
