/* keel: data-parallel gradient synchronisation. The gradients are grouped into buckets in the
 * order the backward pass completes them; a bucket's all-reduce starts from the run's node
 * callback as soon as the node that writes its last gradient has run, so on a GPU with NCCL the
 * communication overlaps the rest of the backward pass; keel_grad_sync_finish starts what is
 * left and waits for everything. Buckets only group the work: every gradient element is summed
 * over the ranks in the same way whatever the bucket, so results do not depend on them. */
#ifndef KEEL_GRAD_SYNC_H
#define KEEL_GRAD_SYNC_H

#include "backend/backend.h"
#include "dist/collective.h"

typedef struct keel_grad_sync keel_grad_sync;

/* bufs[i]: the gradient buffer to sum over ranks; writers[i]: the node of g after which it is
 * final (bufs[i] itself, or the in-place node that last writes it). bucket_bytes: the size a
 * bucket grows to (a larger gradient gets a bucket of its own). KEEL_DIST_VERBOSE=1 prints when
 * each bucket starts. */
keel_grad_sync *keel_grad_sync_new(keel_coll *c, keel_backend *be, const keel_graph *g, keel_tensor *const *bufs,
                                   keel_tensor *const *writers, int n, size_t bucket_bytes);
void keel_grad_sync_free(keel_grad_sync *s);
/* Arms the next run: no bucket started yet. */
void keel_grad_sync_begin(keel_grad_sync *s);
/* The node callback's part: starts the buckets that node `index` of g completes. */
int keel_grad_sync_node(keel_grad_sync *s, int64_t index);
/* Starts the buckets not started yet, in order, and waits for all of them. */
int keel_grad_sync_finish(keel_grad_sync *s);
int keel_grad_sync_n_buckets(const keel_grad_sync *s);
/* Buckets started since keel_grad_sync_begin. */
int keel_grad_sync_started(const keel_grad_sync *s);

#endif
