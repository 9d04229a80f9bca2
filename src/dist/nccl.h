/* keel: the NCCL side of the collectives (builds with the cuda backend and NCCL only). Gradient
 * buffers are summed on the GPU on a stream of their own that first waits for everything queued
 * on the cuda backend's stream, so the sums overlap the rest of the backward pass. The
 * communicator is non-blocking: every wait polls with the timeout, and on timeout or an NCCL
 * error the communicator is aborted and the rank fails with a message. */
#ifndef KEEL_NCCL_H
#define KEEL_NCCL_H

#include "backend/backend.h"

#define KEEL_NCCL_ID_BYTES 128

typedef struct keel_nccl keel_nccl;

int keel_nccl_unique_id(unsigned char id[KEEL_NCCL_ID_BYTES]);
keel_nccl *keel_nccl_new(keel_backend *be, int rank, int size, const unsigned char id[KEEL_NCCL_ID_BYTES],
                         double timeout_s);
void keel_nccl_free(keel_nccl *n);
/* Starts the in-place sum of the contiguous float32 tensors over ranks (one NCCL group). */
int keel_nccl_allreduce(keel_nccl *n, keel_tensor *const *ts, int count);
/* Waits for the started sums and makes the backend's stream wait for them too. */
int keel_nccl_wait(keel_nccl *n);

#endif
