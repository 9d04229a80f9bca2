/* keel: the CUDA backend: device buffers (cudaMalloc, 256-byte aligned), transfers on one stream,
 * a per-node callback, and the kernels in cuda_copy.cu (the one copy path), cuda_ops.cu,
 * cuda_matmul.cu (cuBLAS, float32 compute, TF32 off), cuda_gdn.cu and cuda_attention.cu. Every CUDA call and launch
 * is checked; an error names the op and node. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_api.h"
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_wgmma.cuh"

int cuda_check(cudaError_t e, const char *what, const keel_tensor *t) {
    if (e == cudaSuccess) return 0;
    if (t)
        return keel_fail("cuda: %s failed: %s (%s) at %s node '%s'", what, cudaGetErrorString(e), cudaGetErrorName(e),
                         keel_op_get(t->op)->name, t->name);
    return keel_fail("cuda: %s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int cublas_check(cublasStatus_t s, const char *what, const keel_tensor *t) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    return keel_fail("cuda: %s failed: cuBLAS status %d at %s node '%s'", what, (int)s,
                     t ? keel_op_get(t->op)->name : "-", t ? t->name : "-");
}

static void *cuda_alloc(keel_backend *be, size_t bytes) {
    cuda_impl *im = cuda_im(be);
    size_t n = (bytes + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN;
    if (!n) n = KEEL_ALIGN;
    if (im->n_live == im->cap_live) {
        int64_t cap = im->cap_live ? 2 * im->cap_live : 64;
        void **p = (void **)realloc(im->live_p, (size_t)cap * sizeof *p);
        if (p) im->live_p = p;
        size_t *s = (size_t *)realloc(im->live_n, (size_t)cap * sizeof *s);
        if (s) im->live_n = s;
        if (!p || !s) {
            keel_fail("out of memory");
            return NULL;
        }
        im->cap_live = cap;
    }
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, n);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError(); /* a failed cudaMalloc leaves its error for the next check: clear it */
        cudaMemGetInfo(&fr, &tot);
        keel_fail("cuda: cannot allocate %zu bytes (%.2f GiB) on the GPU: %s (free %.2f of %.2f GiB)", n,
                  (double)n / (1 << 30), cudaGetErrorString(e), (double)fr / (1 << 30), (double)tot / (1 << 30));
        return NULL;
    }
    im->live_p[im->n_live] = d, im->live_n[im->n_live++] = n;
    im->in_use += n;
    if (im->in_use > im->peak) im->peak = im->in_use;
    return d;
}

static void cuda_free(keel_backend *be, void *p) {
    if (!p) return;
    cuda_impl *im = cuda_im(be);
    cudaStreamSynchronize(im->stream); /* kernels queued on the stream may still use it */
    for (int64_t i = 0; i < im->n_live; i++)
        if (im->live_p[i] == p) {
            im->in_use -= im->live_n[i];
            im->live_p[i] = im->live_p[im->n_live - 1], im->live_n[i] = im->live_n[im->n_live - 1];
            im->n_live--;
            break;
        }
    cudaFree(p);
}

int cuda_upload(keel_backend *be, void *dst, const void *host, size_t n, const keel_tensor *t) {
    cuda_impl *im = cuda_im(be);
    /* from pageable memory the copy is staged before it returns, so `host` may be reused */
    if (cuda_check(cudaMemcpyAsync(dst, host, n, cudaMemcpyHostToDevice, im->stream), "host-to-device copy", t))
        return -1;
    return cuda_check(cudaStreamSynchronize(im->stream), "host-to-device copy", t);
}

static int cuda_write(keel_backend *be, void *dst, const void *host, size_t n) {
    return cuda_upload(be, dst, host, n, NULL);
}

static int cuda_read(keel_backend *be, void *host, const void *src, size_t n) {
    cuda_impl *im = cuda_im(be);
    if (cuda_check(cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, im->stream), "device-to-host copy", NULL))
        return -1;
    return cuda_check(cudaStreamSynchronize(im->stream), "device-to-host copy", NULL);
}

static int cuda_fill_bytes(keel_backend *be, void *dst, int byte, size_t n) {
    return cuda_check(cudaMemsetAsync(dst, byte, n, cuda_im(be)->stream), "memset", NULL);
}

static size_t cuda_node_scratch_bytes(keel_backend *be, const keel_tensor *t) {
    (void)be;
    return keel_cuda_scratch_bytes(t);
}

static size_t cuda_node_carry_bytes(keel_backend *be, const keel_graph *g, int64_t reader, int64_t *writer) {
    (void)be;
    return keel_cuda_carry_bytes(g, reader, writer);
}

void *cuda_scratch(keel_backend *be, size_t n, const keel_tensor *t) {
    (void)be;
    if (t->scratch && n <= t->scratch_bytes) return t->scratch;
    keel_fail("cuda: %s node '%s' asks for %zu bytes of scratch, %zu planned (keel_cuda_scratch_bytes is wrong for it)",
              keel_op_get(t->op)->name, t->name, n, t->scratch_bytes);
    return NULL;
}

static bool cuda_supports(keel_backend *be, const keel_tensor *t) {
    (void)be;
    switch (t->op) {
    case KEEL_OP_GATED_DELTA_NET:
    case KEEL_OP_GATED_DELTA_NET_BACK:
    case KEEL_OP_GATED_DELTA_NET_STATE:
        /* a chunk's rows of q and k and the state's column blocks live in shared memory: Dk <= 256 */
        if (t->src[0]->ne[0] > 256) return false;
        break;
    case KEEL_OP_FLASH_ATTN:
    case KEEL_OP_FLASH_ATTN_BACK:
        if (!cuda_flash_attn_supports(t)) return false;
        break;
    default:
        break;
    }
    return keel_backend_f32_supports(t);
}

int cuda_launch_node(keel_backend *be, const keel_tensor *t, int64_t index) {
    cuda_impl *im = cuda_im(be);
    im->last_kernel[0] = 0; /* a view runs no kernel: it reports none */
    if (keel_op_get(t->op)->flags & OPF_VIEW) return 0;
    im->node = (unsigned)index;
    if (cuda_node(be, t)) {
        char msg[1536];
        snprintf(msg, sizeof msg, "%s", keel_last_error());
        if (strstr(msg, t->name)) return -1;
        return keel_fail("%s (%s node '%s')", msg, keel_op_get(t->op)->name, t->name);
    }
    return cuda_check(cudaGetLastError(), "kernel launch", t);
}

/* After the run's last work: the node a kernel found a bad id in, named by the host check of its ids */
static int bad_ids(keel_backend *be, const keel_graph *g) {
    cuda_impl *im = cuda_im(be);
    unsigned n = *im->bad_node_host;
    if (n == UINT_MAX) return 0;
    if ((int64_t)n >= g->n_nodes)
        return keel_fail("cuda: a kernel reported a bad id at node %u of %lld", n, (long long)g->n_nodes);
    const keel_tensor *t = g->nodes[n];
    if (keel_backend_read_ids(be, t, NULL)) return -1;
    return keel_fail("cuda: %s node '%s': a kernel met an id outside its range, which the host does not find in its "
                     "ids now",
                     keel_op_get(t->op)->name, t->name);
}

static int cuda_compute(keel_backend *be, const keel_graph *g, int64_t from, int64_t to, keel_node_cb cb, void *ud) {
    cuda_impl *im = cuda_im(be);
    if (cuda_check(cudaMemsetAsync(im->bad_node, 0xff, sizeof *im->bad_node, im->stream), "memset", NULL)) return -1;
    if (cuda_adamw_upload(be, g, from, to)) return -1;
    im->gt_pending = 0; /* KEEL_CUDA_GRAPH_TIME: this run's replays only */
    if (im->graphs && !cb && !im->profile && !im->sync_each_node) {
        if (cuda_graphs_run(be, g, from, to)) return -1;
    } else {
        for (int64_t i = from; i < to; i++) {
            const keel_tensor *t = g->nodes[i];
            bool kernel = !(keel_op_get(t->op)->flags & OPF_VIEW);
            if (kernel && im->profile) cudaEventRecord(im->ev0, im->stream);
            if (cuda_launch_node(be, t, i)) return -1;
            if (kernel && im->profile) {
                float ms = 0;
                cudaEventRecord(im->ev1, im->stream);
                if (cuda_check(cudaEventSynchronize(im->ev1), "kernel", t)) return -1;
                cudaEventElapsedTime(&ms, im->ev0, im->ev1);
                keel_op_profile_add(im->profile, t, ms);
            }
            /* a callback that reads the node's bytes waits through be->read on the same stream */
            if (kernel && im->sync_each_node && cuda_check(cudaStreamSynchronize(im->stream), "kernel", t)) return -1;
            if (cb && cb(be, t, i, ud)) return keel_backend_callback_failed(t);
        }
    }
    cudaError_t e =
        cudaMemcpyAsync(im->bad_node_host, im->bad_node, sizeof *im->bad_node, cudaMemcpyDeviceToHost, im->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(im->stream);
    if (e != cudaSuccess)
        return keel_fail(
            "cuda: a kernel of nodes %lld..%lld failed: %s (%s); run with KEEL_CUDA_SYNC=1 to name the node",
            (long long)from, (long long)to - 1, cudaGetErrorString(e), cudaGetErrorName(e));
    if (im->gt_pending) { /* KEEL_CUDA_GRAPH_TIME */
        float ms = 0;
        im->gt_pending = 0;
        if (cuda_check(cudaEventElapsedTime(&ms, im->gt0, im->gt1), "event", NULL)) return -1;
        fprintf(stderr, "cuda: graph replays of nodes %lld..%lld: %.3f ms of GPU time\n", (long long)im->gt_from,
                (long long)im->gt_to - 1, ms);
    }
    return bad_ids(be, g);
}

static const char *cuda_last_kernel(keel_backend *be) { return cuda_im(be)->last_kernel; }

static int cuda_set_threads(keel_backend *be, int n) {
    (void)be;
    if (n < 1) return keel_fail("thread count must be >= 1 (got %d)", n);
    return 0; /* host threads do not change GPU results or speed */
}

static void cuda_profile_reset(keel_backend *be) {
    cuda_impl *im = cuda_im(be);
    if (im->profile) keel_op_profile_reset(im->profile);
}

static void cuda_destroy(keel_backend *be) {
    cuda_impl *im = cuda_im(be);
    cudaStreamSynchronize(im->stream);
    if (im->profile) {
        keel_op_profile_print(im->profile, stderr, "cuda profile (KEEL_CUDA_PROFILE)", "GPU time");
        keel_op_profile_free(im->profile);
        cudaEventDestroy(im->ev0), cudaEventDestroy(im->ev1);
    }
    if (im->graph_time) cudaEventDestroy(im->gt0), cudaEventDestroy(im->gt1);
    for (int64_t i = 0; i < im->n_live; i++) cudaFree(im->live_p[i]);
    for (int i = 0; i < im->n_rope; i++) cudaFree(im->rope[i].dev), cudaFree(im->rope[i].cs);
    cuda_graphs_free(im);
    cudaFree(im->bad_node), cudaFree(im->ce_div), cudaFree(im->hp_dev), cudaFreeHost(im->bad_node_host);
    free(im->rope);
    cuda_lt_free(im);
    if (im->stream) cudaStreamDestroy(im->stream);
    free(im->live_p), free(im->live_n);
    free(im);
    free(be);
}

size_t keel_cuda_peak_bytes(keel_backend *be) { return cuda_im(be)->peak; }
void *keel_cuda_stream(keel_backend *be) { return (void *)cuda_im(be)->stream; }

/* Whether this binary carries the sm_90a code (the kernels' wgmma bodies, cuda_wgmma.cuh): the device
 * runs the sm_90a machine code if there is some, else the PTX compiled without them */
__global__ void k_wgmma_probe(int *has) {
#ifdef KEEL_WGMMA_BODY
    *has = 1;
#else
    *has = 0;
#endif
}
static int wgmma_probe(cudaStream_t st, int *has) {
    int *d = NULL;
    int r = cuda_check(cudaMalloc(&d, sizeof *d), "cudaMalloc", NULL);
    if (!r) {
        k_wgmma_probe<<<1, 1, 0, st>>>(d);
        r = cuda_check(cudaGetLastError(), "wgmma probe launch", NULL) ||
            cuda_check(cudaMemcpyAsync(has, d, sizeof *has, cudaMemcpyDeviceToHost, st), "wgmma probe copy", NULL) ||
            cuda_check(cudaStreamSynchronize(st), "wgmma probe", NULL);
    }
    cudaFree(d);
    return r;
}

extern "C" keel_backend *keel_backend_cuda_new(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        keel_fail("cuda: no usable CUDA device (%s); this build has backends ref,cpu,cuda",
                  e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
        return NULL;
    }
    int dev = 0;
    const char *ds = getenv("KEEL_CUDA_DEVICE");
    /* one process per GPU: the launcher's local rank picks the GPU unless KEEL_CUDA_DEVICE does */
    const char *lr = getenv("KEEL_LOCAL_RANK");
    if (!lr || !*lr) lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!lr || !*lr) lr = getenv("SLURM_LOCALID");
    if ((!ds || !*ds) && lr && *lr) dev = atoi(lr) % n;
    if (ds && *ds) {
        char *end;
        long v = strtol(ds, &end, 10);
        if (*end || v < 0 || v >= n) {
            keel_fail("KEEL_CUDA_DEVICE='%s': expected a device number in [0,%d)", ds, n);
            return NULL;
        }
        dev = (int)v;
    }
    keel_backend *be = (keel_backend *)calloc(1, sizeof *be);
    cuda_impl *im = (cuda_impl *)calloc(1, sizeof *im);
    if (!be || !im) {
        free(be), free(im);
        keel_fail("out of memory");
        return NULL;
    }
    be->name = "cuda";
    be->native_type = KEEL_F32, be->on_device = true, be->peak_bytes = keel_cuda_peak_bytes;
    be->n_threads = 1;
    be->impl = im;
    const char *sy = getenv("KEEL_CUDA_SYNC");
    im->sync_each_node = sy && *sy && strcmp(sy, "0") != 0;
    im->profile = keel_op_profile_from_env("KEEL_CUDA_PROFILE");
    const char *wg = getenv("KEEL_CUDA_WGMMA"), *ls = getenv("KEEL_CUDA_LT_SURVEY"),
               *gt = getenv("KEEL_CUDA_GRAPH_TIME");
    im->graph_time = gt && strcmp(gt, "1") == 0;
    int cc_major = 0, cc_minor = 0, has_wg = 0;
    if (keel_backend_read_fault(be) ||
        (cuda_carry_setting() < 0 &&
         keel_fail("KEEL_CUDA_CARRY='%s': expected 0 (off) or 1 (on, the default)", getenv("KEEL_CUDA_CARRY"))) ||
        (wg && *wg && strcmp(wg, "0") != 0 && strcmp(wg, "1") != 0 &&
         keel_fail("KEEL_CUDA_WGMMA='%s': expected 0 (off) or 1 (on where the device has them, the default)", wg)) ||
        (ls && *ls && strcmp(ls, "0") != 0 && strcmp(ls, "1") != 0 &&
         keel_fail("KEEL_CUDA_LT_SURVEY='%s': expected 0 (off, the default) or 1 (time cuBLASLt's answers)", ls)) ||
        (gt && *gt && strcmp(gt, "0") != 0 && strcmp(gt, "1") != 0 &&
         keel_fail("KEEL_CUDA_GRAPH_TIME='%s': expected 0 (off, the default) or 1 (print a run's graph replay time)",
                   gt)) ||
        cuda_check(cudaSetDevice(dev), "cudaSetDevice", NULL) ||
        cuda_check(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev), "device attribute",
                   NULL) ||
        cuda_check(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev), "device attribute",
                   NULL) ||
        cuda_check(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking), "stream creation", NULL) ||
        /* products through cuBLASLt (cuda_lt.cu): CUBLAS_COMPUTE_32F, so float32 products use no TF32
         * tensor cores; one stream, one algorithm a shape */
        cublas_check(cublasLtCreate(&im->lt), "cublasLtCreate", NULL) ||
        cuda_check(cudaMalloc(&im->bad_node, sizeof *im->bad_node), "cudaMalloc", NULL) ||
        cuda_check(cudaMalloc(&im->ce_div, sizeof *im->ce_div), "cudaMalloc", NULL) ||
        cuda_check(cudaMalloc(&im->hp_dev, KEEL_CUDA_HP_SLOTS * KEEL_CUDA_HP_BYTES), "cudaMalloc", NULL) ||
        cuda_check(cudaMallocHost(&im->bad_node_host, sizeof *im->bad_node_host), "cudaMallocHost", NULL) ||
        cuda_graphs_init(im) || (cc_major == 9 && cc_minor == 0 && wgmma_probe(im->stream, &has_wg)) ||
        (im->profile && (cuda_check(cudaEventCreate(&im->ev0), "event", NULL) ||
                         cuda_check(cudaEventCreate(&im->ev1), "event", NULL))) ||
        (im->graph_time && (cuda_check(cudaEventCreate(&im->gt0), "event", NULL) ||
                            cuda_check(cudaEventCreate(&im->gt1), "event", NULL)))) {
        cudaFree(im->bad_node), cudaFree(im->ce_div), cudaFree(im->hp_dev), cudaFreeHost(im->bad_node_host);
        cuda_graphs_free(im);
        cuda_lt_free(im);
        if (im->stream) cudaStreamDestroy(im->stream);
        keel_op_profile_free(im->profile);
        free(im), free(be);
        return NULL;
    }
    /* the sm_90a code (wgmma) runs on compute capability 9.0 only, where the binary has it */
    im->wgmma = has_wg && !(wg && strcmp(wg, "0") == 0);
    im->sm = 10 * cc_major + cc_minor;
    im->lt_survey = ls && strcmp(ls, "1") == 0;
    be->supports = cuda_supports;
    be->scratch_bytes = cuda_node_scratch_bytes;
    be->carry_bytes = cuda_node_carry_bytes;
    be->last_kernel = cuda_last_kernel;
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->write = cuda_write;
    be->read = cuda_read;
    be->fill_bytes = cuda_fill_bytes;
    be->copy = cuda_copy;
    be->compute = cuda_compute;
    be->set_threads = cuda_set_threads;
    be->destroy = cuda_destroy;
    be->profile_reset = cuda_profile_reset;
    return be;
}
