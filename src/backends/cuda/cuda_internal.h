/* keel: internals shared by the CUDA backend's files (compiled by nvcc only). Kernels take
 * tensors as `kt` values: device address, shape and byte strides, so every kernel handles any
 * view. Element and row indices are 64-bit (32-bit division where the sizes allow it); elementwise,
 * copy and row launches use grid-stride loops over a 1-D grid, so no grid dimension limits the row
 * count or width. */
#ifndef KEEL_CUDA_INTERNAL_H
#define KEEL_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
#include "backends/kernel_common.h"
#include "backends/op_profile.h"
#include "ops/ops.h"
#include "util/error.h"
}

typedef struct {
    char *p;
    int64_t ne[4], nb[4];
    int type;
    int contig; /* plain row-major: flat element e is at e * element size (kernels skip index math) */
} kt;

static inline kt kt_of(const keel_tensor *t) {
    kt k;
    k.p = (char *)t->data;
    for (int i = 0; i < 4; i++) k.ne[i] = t->ne[i], k.nb[i] = t->nb[i];
    k.type = (int)t->type;
    k.contig = keel_is_contiguous(t);
    return k;
}

/* Address of element (i0, i1, i2, i3). */
__device__ static inline char *kt_at(const kt &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return t.p + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}
/* Element e of t in flat (dim 0 fastest) order, as four indices. */
__device__ static inline void kt_unflat(const kt &t, int64_t e, int64_t *i) {
    if (e < 0x7fffffff && t.ne[0] < 0x7fffffff && t.ne[1] < 0x7fffffff && t.ne[2] < 0x7fffffff) {
        /* 32-bit division is several times cheaper than 64-bit on the GPU */
        uint32_t x = (uint32_t)e, n0 = (uint32_t)t.ne[0], n1 = (uint32_t)t.ne[1], n2 = (uint32_t)t.ne[2];
        i[0] = x % n0, x /= n0;
        i[1] = x % n1, x /= n1;
        i[2] = x % n2, i[3] = x / n2;
        return;
    }
    i[0] = e % t.ne[0], e /= t.ne[0];
    i[1] = e % t.ne[1], e /= t.ne[1];
    i[2] = e % t.ne[2], i[3] = e / t.ne[2];
}
__device__ static inline float ldf(const char *p) { return *(const float *)p; }
/* Element e (flat order) of an int32 tensor: ids, targets */
__device__ static inline int32_t kt_i32(const kt &t, int64_t e) {
    if (t.contig) return ((const int32_t *)t.p)[e];
    int64_t i[4];
    kt_unflat(t, e, i);
    return *(const int32_t *)kt_at(t, i[0], i[1], i[2], i[3]);
}
/* Position (t, b) of an i32 positions tensor [T] or [T,B]; below 0 counts as 0 (ops/ops.h). */
__device__ static inline int64_t pos_at(const kt &p, int64_t t, int64_t b) {
    int32_t v = *(const int32_t *)(p.p + t * p.nb[0] + (p.ne[1] == 1 ? 0 : b * p.nb[1]));
    return v < 0 ? 0 : v;
}
__device__ static inline void stf(char *p, float v) { *(float *)p = v; }

/* Threads of a row block (a power of two: the reduction tree assumes it), and the block's sum and
 * max over a fixed tree in shared memory sh[KEEL_CUDA_RT]: every thread ends with the same bits. */
#define KEEL_CUDA_RT 256

__device__ static inline double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = KEEL_CUDA_RT / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__device__ static inline float block_max(float v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = KEEL_CUDA_RT / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = fmax(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = (float)sh[0];
    __syncthreads();
    return r;
}

#define GRID_STRIDE(e, n)                                                                                              \
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < (n); e += (int64_t)gridDim.x * blockDim.x)

/* Elementwise work on whole contiguous tensors whose data start on 16-byte boundaries goes 4
 * elements a thread through 16-byte loads and stores (launched with vec_blocks threads): one
 * scalar access a thread reached about 40% of the H200's memory bandwidth. VEC_LOOP walks the
 * groups of 4; VEC_TAIL gives the last n % 4 elements to the first threads. */
#define VEC_LOOP(q, n) GRID_STRIDE(q, (n) / 4)
__device__ static inline int64_t vec_tail_start(int64_t n) {
    return n / 4 * 4 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ static inline int64_t grid_threads() { return (int64_t)gridDim.x * blockDim.x; }
#define VEC_TAIL(e, n) for (int64_t e = vec_tail_start(n); e < (n); e += grid_threads())
static inline bool vec_ok(const void *p) { return ((uintptr_t)p & 15) == 0; }

#define KEEL_CUDA_HP_SLOTS 64
#define KEEL_CUDA_HP_BYTES 64

typedef struct cuda_lt_entry cuda_lt_entry;
typedef struct cuda_graphs cuda_graphs;

/* RoPE's n_rot / 2 float64 frequencies (keel_rope_freq, worked out on the host), uploaded once a
 * (n_rot, theta) and kept, so that no node uploads (an upload from pageable memory waits for the
 * stream) */
typedef struct {
    int64_t n_rot;
    double theta;
    double *dev;
    /* n_pos > 0: instead, the float cos and sin of positions [0, n_pos) (rope_cs) */
    int64_t n_pos;
    float2 *cs;
} cuda_rope_table;

typedef struct {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cuda_lt_entry *lt_cache;           /* cuda_lt.cu: descriptors and algorithm by product shape */
    int sm;                            /* compute capability, 10 major + minor (cuda_lt.cu's measured preferences) */
    int lt_survey;                     /* KEEL_CUDA_LT_SURVEY=1: time the heuristic's answers of each new shape */
    char last_kernel[KEEL_KERNEL_MAX]; /* the algorithms the running node's products chose */
    int sync_each_node;                /* KEEL_CUDA_SYNC=1: wait after every node so an error names its node */
    /* Hopper's warpgroup products (cuda_wgmma.cuh) for the kernels that have them: on a device of
     * compute capability 9.0 unless KEEL_CUDA_WGMMA=0 (the mma.sync kernels, for comparisons) */
    int wgmma;
    /* KEEL_CUDA_PROFILE=1: GPU time per op, printed when the backend is freed (NULL: off) */
    keel_op_profile *profile;
    cudaEvent_t ev0, ev1;
    /* KEEL_CUDA_GRAPH_TIME=1: the GPU time from a run's first graph replay to its last, printed when
     * the run ends (against the kernels' own times: the gaps between them) */
    int graph_time, gt_pending;
    int64_t gt_from, gt_to;
    cudaEvent_t gt0, gt1;
    /* live allocations, for the peak-memory figure */
    void **live_p;
    size_t *live_n;
    int64_t n_live, cap_live;
    size_t in_use, peak;
    /* No host round trip inside a run: ids are checked on the device. A kernel that meets an id
     * outside its range skips it and takes the smallest such node index here (atomicMin; the index
     * of the node being launched is `node`); compute() copies it out with the run's last work and,
     * when set, the host check of that node's ids (keel_backend_read_ids) makes the message. */
    unsigned *bad_node;      /* device */
    unsigned *bad_node_host; /* pinned */
    unsigned node;
    /* The divisor of the cross-entropy node that runs (worked out on the device from its targets;
     * one slot: nodes run one after another on the stream) */
    double *ce_div;
    cuda_rope_table *rope;
    int n_rope, cap_rope;
    cuda_graphs *graphs; /* cuda_graph.cu: runs of nodes captured and replayed; NULL when off */
    /* ADAMW's scalars that change every step (the learning rate, and the bias corrections of the
     * step; cuda_ops.cu), a slot of device memory a node: uploaded when a run starts and read there
     * by the kernel, so that the node's launch is the same every step and a step is one graph */
    void *hp_dev;                                   /* KEEL_CUDA_HP_SLOTS slots of KEEL_CUDA_HP_BYTES */
    const keel_tensor *hp_node[KEEL_CUDA_HP_SLOTS]; /* the node a slot is for */
    uint64_t hp_used[KEEL_CUDA_HP_SLOTS], run;      /* the run a slot was last uploaded in */
} cuda_impl;

static inline cuda_impl *cuda_im(keel_backend *be) { return (cuda_impl *)be->impl; }

/* Blocks for n items of a 1-D grid-stride launch with `threads` threads. */
static inline unsigned cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 8) b = 65535LL * 8; /* grid-stride loops do the rest */
    return (unsigned)b;
}

/* Blocks of 256 threads for VEC_LOOP over n elements. */
static inline unsigned vec_blocks(int64_t n) { return cuda_blocks(n / 4 > 0 ? n / 4 : 1, 256); }

/* A failed CUDA call or launch: an error naming what and where; -1. */
int cuda_check(cudaError_t e, const char *what, const keel_tensor *t);
int cublas_check(cublasStatus_t s, const char *what, const keel_tensor *t);
/* Node t's scratch of n bytes, the block the memory plan gave it in the session's arena from
 * keel_cuda_scratch_bytes (valid while t runs); more than that is an error naming the node (a size
 * rule below is wrong), never a cudaMalloc in the middle of a step. NULL with an error. */
void *cuda_scratch(keel_backend *be, size_t n, const keel_tensor *t);
/* The scratch bytes of the nodes whose kernels live in other files (the sizes their kernels ask
 * for: one formula each, used by both) */
size_t cuda_matmul_scratch(const keel_tensor *t);
size_t cuda_linear_ce_scratch(const keel_tensor *t);
size_t cuda_gdn_scratch(const keel_tensor *t);
size_t cuda_gdn_carry(const keel_graph *g, int64_t reader, int64_t *writer);
int cuda_carry_setting(void);
size_t cuda_flash_attn_scratch(const keel_tensor *t);
/* A product through cuBLASLt (cuda_lt.cu), column-major as cuBLAS sees it: D (m x n, ldd) = op(A)
 * op(B) + beta C, op(A) m x k (ta: A stored k x m), op(B) k x n (tb: B stored n x k), float32
 * sums; C NULL: C is D; batch > 1: strided batches (elements). */
typedef struct {
    bool ta, tb;
    int64_t m, n, k;
    const void *a, *b, *c;
    void *d;
    cudaDataType_t dta, dtb, dtc, dtd;
    int64_t lda, ldb, ldc, ldd;
    int64_t batch, sa, sb, sc, sd;
    float beta;
} cuda_gemm;
/* A product without an addend or batches: D (m x n, ldd) = op(A) op(B) (+ beta D). */
static inline cuda_gemm cuda_gemm_plain(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                                        cudaDataType_t dta, int64_t lda, const void *b, cudaDataType_t dtb, int64_t ldb,
                                        void *d, cudaDataType_t dtd, int64_t ldd, float beta) {
    cuda_gemm g = {};
    g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
    g.a = a, g.dta = dta, g.lda = lda;
    g.b = b, g.dtb = dtb, g.ldb = ldb;
    g.d = d, g.dtd = dtd, g.ldd = ldd;
    g.batch = 1, g.beta = beta;
    return g;
}
/* Its workspace: KEEL_CUDA_LT_WORKSPACE bytes of the node's scratch (in every product node's rule). */
#define KEEL_CUDA_LT_WORKSPACE ((size_t)32 << 20)
int cuda_gemm_run(keel_backend *be, const cuda_gemm *g, void *workspace, const keel_tensor *t);
void cuda_lt_free(cuda_impl *im);

/* Host -> device bytes on the backend's stream (host memory may be reused on return). */
int cuda_upload(keel_backend *be, void *dst, const void *host, size_t n, const keel_tensor *t);

/* The copy path (cuda_copy.cu): dst <- src (same shape), converting types; accumulate adds.
 * With ids (GET_ROWS) the source row of dst row (i1, i2) is ids[i1, i2]. */
int cuda_copy(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate);
int cuda_copy_rows(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, const keel_tensor *ids);

int cuda_node(keel_backend *be, const keel_tensor *t);
/* Node t, index `index` of its graph, launched on the stream (views: nothing); an error names the node */
int cuda_launch_node(keel_backend *be, const keel_tensor *t, int64_t index);
/* ADAMW node t's slot of device scalars (cuda_ops.cu): its index, -1 when it has none yet; and the
 * upload of the scalars of every ADAMW node among graph g's nodes [from, to) when a run starts. */
int cuda_adamw_slot(const cuda_impl *im, const keel_tensor *t);
int cuda_adamw_upload(keel_backend *be, const keel_graph *g, int64_t from, int64_t to);
/* cuda_graph.cu: nodes [from, to) of g, each run of nodes that launch exactly as they did the last
 * time replayed from a CUDA graph (captured the second time it is seen), the others launched one by
 * one; KEEL_CUDA_GRAPH=0 turns it off (im->graphs stays NULL). */
int cuda_graphs_init(cuda_impl *im);
void cuda_graphs_free(cuda_impl *im);
int cuda_graphs_run(keel_backend *be, const keel_graph *g, int64_t from, int64_t to);
int cuda_matmul(keel_backend *be, const keel_tensor *t);
int cuda_out_prod(keel_backend *be, const keel_tensor *t);
int cuda_gdn_forward(keel_backend *be, const keel_tensor *t);
int cuda_gdn_backward(keel_backend *be, const keel_tensor *t);
int cuda_linear_ce(keel_backend *be, const keel_tensor *t);
/* FLASH_ATTN and its backward (cuda_attention.cu); heads of up to 256 */
int cuda_flash_attn(keel_backend *be, const keel_tensor *t);
bool cuda_flash_attn_supports(const keel_tensor *t);
/* One block of KEEL_CUDA_RT threads: *out = (the R float64 partials summed in a fixed tree) / div
 * (or / *divp when divp is given: a divisor worked out on the device). */
__global__ void k_finish_sum(float *out, const double *partial, int64_t R, double div, const double *divp);
/* The cross-entropy node t's targets checked on the device and its divisor into im->ce_div: fp0, or
 * when fp0 is 0 the count of targets >= 0 (1 when there is none); a target at or above the class
 * count marks t in im->bad_node. */
int cuda_ce_divisor(keel_backend *be, const keel_tensor *t);

#endif
