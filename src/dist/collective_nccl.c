#define _DEFAULT_SOURCE /* usleep */
#include "dist/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/cuda/cuda_api.h"
#include "util/clock.h"
#include "util/error.h"

_Static_assert(KEEL_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "the NCCL unique id size");

struct keel_nccl {
    ncclComm_t comm;
    cudaStream_t compute, comm_stream;
    cudaEvent_t queued, done;
    int rank;
    double timeout_s;
    bool pending;
};

static int fail_abort(keel_nccl *n, const char *what, ncclResult_t r) {
    int rc = keel_fail("rank %d: NCCL %s: %s", n->rank, what,
                       r == ncclInProgress ? "did not finish in time (a rank died or hangs?)" : ncclGetErrorString(r));
    ncclCommAbort(n->comm); /* frees the GPU work stuck on the other ranks' behalf */
    n->comm = NULL;
    return rc;
}

/* A non-blocking communicator reports ncclInProgress until an operation is enqueued or done. */
static int settle(keel_nccl *n, ncclResult_t r, const char *what) {
    double t0 = keel_now_s();
    while (r == ncclInProgress) {
        if (keel_now_s() - t0 > n->timeout_s) return fail_abort(n, what, ncclInProgress);
        usleep(100);
        ncclCommGetAsyncError(n->comm, &r);
    }
    return r == ncclSuccess ? 0 : fail_abort(n, what, r);
}

int keel_nccl_unique_id(unsigned char id[KEEL_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return keel_fail("NCCL: cannot make a unique id: %s", ncclGetErrorString(r));
    memcpy(id, u.internal, KEEL_NCCL_ID_BYTES);
    return 0;
}

keel_nccl *keel_nccl_new(keel_backend *be, int rank, int size, const unsigned char id[KEEL_NCCL_ID_BYTES],
                         double timeout_s) {
    keel_nccl *n = calloc(1, sizeof *n);
    if (!n) {
        keel_fail("out of memory");
        return NULL;
    }
    n->rank = rank, n->timeout_s = timeout_s, n->compute = (cudaStream_t)keel_cuda_stream(be);
    if (cudaStreamCreateWithFlags(&n->comm_stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&n->queued, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming) != cudaSuccess) {
        keel_fail("rank %d: cannot create the NCCL stream and events: %s", rank,
                  cudaGetErrorString(cudaGetLastError()));
        keel_nccl_free(n);
        return NULL;
    }
    ncclUniqueId u;
    memcpy(u.internal, id, KEEL_NCCL_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* so that a missing or hung rank times out instead of blocking forever */
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        keel_fail("rank %d: NCCL init of %d ranks: %s", rank, size, ncclGetErrorString(r));
        keel_nccl_free(n);
        return NULL;
    }
    if (settle(n, r, "init")) {
        keel_nccl_free(n);
        return NULL;
    }
    return n;
}

void keel_nccl_free(keel_nccl *n) {
    if (!n) return;
    if (n->comm) {
        if (n->pending)
            ncclCommAbort(n->comm);
        else
            ncclCommDestroy(n->comm);
    }
    if (n->comm_stream) cudaStreamDestroy(n->comm_stream);
    if (n->queued) cudaEventDestroy(n->queued);
    if (n->done) cudaEventDestroy(n->done);
    free(n);
}

int keel_nccl_allreduce(keel_nccl *n, keel_tensor *const *ts, int count) {
    if (!n->comm) return keel_fail("rank %d: the NCCL communicator was aborted", n->rank);
    /* the sums read what the backward pass queued so far on the compute stream */
    if (cudaEventRecord(n->queued, n->compute) != cudaSuccess ||
        cudaStreamWaitEvent(n->comm_stream, n->queued, 0) != cudaSuccess)
        return keel_fail("rank %d: cannot order the NCCL stream: %s", n->rank, cudaGetErrorString(cudaGetLastError()));
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < count && (r == ncclSuccess || r == ncclInProgress); i++)
        r = ncclAllReduce(ts[i]->data, ts[i]->data, (size_t)keel_nelements(ts[i]), ncclFloat32, ncclSum, n->comm,
                          n->comm_stream);
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = e;
    n->pending = true;
    return settle(n, r, "all-reduce");
}

int keel_nccl_wait(keel_nccl *n) {
    if (!n->pending) return 0;
    if (!n->comm) return keel_fail("rank %d: the NCCL communicator was aborted", n->rank);
    if (cudaEventRecord(n->done, n->comm_stream) != cudaSuccess)
        return keel_fail("rank %d: cudaEventRecord: %s", n->rank, cudaGetErrorString(cudaGetLastError()));
    double t0 = keel_now_s();
    for (;;) {
        cudaError_t q = cudaEventQuery(n->done);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady)
            return keel_fail("rank %d: the NCCL stream failed: %s", n->rank, cudaGetErrorString(q));
        ncclResult_t r;
        ncclCommGetAsyncError(n->comm, &r);
        if (r != ncclSuccess && r != ncclInProgress) return fail_abort(n, "all-reduce", r);
        if (keel_now_s() - t0 > n->timeout_s) return fail_abort(n, "all-reduce", ncclInProgress);
        usleep(100);
    }
    n->pending = false;
    /* the optimiser, on the compute stream, reads the sums */
    if (cudaStreamWaitEvent(n->compute, n->done, 0) != cudaSuccess)
        return keel_fail("rank %d: cannot order the compute stream: %s", n->rank,
                         cudaGetErrorString(cudaGetLastError()));
    return 0;
}
