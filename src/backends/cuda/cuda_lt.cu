/* keel: every matrix product of the CUDA backend through cuBLASLt. A product is described once per
 * shape (operations, sizes, types, leading dimensions, batch and strides, and the alignment of
 * each pointer, which the heuristic takes into account), its algorithm chosen then among cuBLASLt's
 * heuristic's answers (its first, or for the shapes of LT_PREFS the answer measured offline to be
 * faster: never by timing at run time, so a shape gets the same algorithm in every run of a build)
 * and kept in a cache with the descriptors. The workspace is the node's
 * planned scratch, KEEL_CUDA_LT_WORKSPACE bytes. With one algorithm, one workspace and one stream
 * cuBLASLt gives the same bits every run. The algorithm a node's products ran is what
 * cuda_last_kernel reports to the tracer, so two traces show when two runs chose differently. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"

enum { LT_KEY = 22, LT_SLOTS = 1024 };

enum { LT_ANSWERS = 16 }; /* the heuristic's answers asked for where more than its first is wanted (8 come back) */

struct cuda_lt_entry {
    int64_t key[LT_KEY];
    bool used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulAlgo_t algo;
    char what[96];
    int n_alt, pick; /* KEEL_CUDA_LT_SURVEY only: the heuristic's answers, alt[pick] = algo */
    cublasLtMatmulAlgo_t *alt;
};

/* the largest power of two (up to 256) dividing the address */
static int64_t align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int64_t a = 1;
    while (a < 256 && !(u & (uintptr_t)a)) a <<= 1;
    return a;
}

static uint64_t hash_key(const int64_t *k) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < LT_KEY; i++) h = (h ^ (uint64_t)k[i]) * 1099511628211ull;
    return h;
}

static int layout(cublasLtMatrixLayout_t *l, cudaDataType_t dt, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                  int64_t stride, const keel_tensor *t) {
    int32_t bc = (int32_t)batch;
    return cublas_check(cublasLtMatrixLayoutCreate(l, dt, (uint64_t)rows, (uint64_t)cols, ld), "cublasLt layout", t) ||
           (batch > 1 &&
            (cublas_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc),
                          "cublasLt batch", t) ||
             cublas_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof stride),
                          "cublasLt batch stride", t)));
}

static void describe_algo(const cublasLtMatmulAlgo_t *algo, char *out, size_t n) {
    int32_t id = 0;
    uint32_t tile = 0, stages = 0, splitk = 0, red = 0, swz = 0, custom = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    snprintf(out, n, "cublasLt algo %d tile %u stages %u split-k %u reduction %u swizzle %u custom %u", (int)id, tile,
             stages, splitk, red, swz, custom);
}

static void entry_destroy(cuda_lt_entry *e) {
    free(e->alt);
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->a) cublasLtMatrixLayoutDestroy(e->a);
    if (e->b) cublasLtMatrixLayoutDestroy(e->b);
    if (e->c) cublasLtMatrixLayoutDestroy(e->c);
    if (e->d) cublasLtMatrixLayoutDestroy(e->d);
    memset(e, 0, sizeof *e);
}

/* Measured preferences among the heuristic's answers (bf16 operands, compute capability 9.0). For
 * these shapes (the Qwen3.5-0.8B step at batch 8, window 1024: its projections, their gradients and
 * the fused LM head's three products) cuBLASLt's first answer on the H200 (cuBLAS 13.0) is mostly a
 * 256 x 128 tile; another of its answers ran 3-60% faster, timed offline by KEEL_CUDA_LT_SURVEY
 * (docs/h200-log.md, "cuBLASLt's answers timed"). Where the heuristic's answers include the configuration
 * named here, the product takes it; otherwise (another shape, GPU or library) the first answer.
 * The choice depends on the shape alone, as before: the same algorithm in every run, with or
 * without recompute. ta, tb, c (an addend), m, n and k as cuda_gemm has them. */
typedef struct {
    int8_t ta, tb, c;
    int64_t m, n, k;
    int32_t algo, tile, custom, splitk;
} lt_pref;
static const lt_pref LT_PREFS[] = {
    /* forward: W^T x, and W^T x + the residual */
    {1, 0, 0, 6144, 8192, 1024, 66, 201, 2, 1},
    {1, 0, 0, 4096, 8192, 1024, 66, 29, 1, 1},
    {1, 0, 0, 3584, 8192, 1024, 66, 20, 1, 1},
    {1, 0, 0, 2048, 8192, 1024, 66, 20, 1, 1},
    {1, 0, 0, 512, 8192, 1024, 66, 20, 1, 1},
    {1, 0, 0, 32, 8192, 1024, 66, 318, 3, 1},
    {1, 0, 1, 1024, 8192, 3584, 66, 201, 2, 1},
    {1, 0, 1, 1024, 8192, 2048, 66, 20, 1, 1},
    /* backward: W dy (plus the gradient so far), and dW */
    {0, 0, 0, 3584, 8192, 1024, 66, 20, 1, 1},
    {0, 0, 0, 2048, 8192, 1024, 66, 20, 1, 1},
    {0, 0, 0, 1024, 8192, 2048, 66, 20, 1, 1},
    {0, 0, 0, 1024, 8192, 512, 66, 20, 1, 1},
    {0, 0, 1, 1024, 8192, 6144, 66, 20, 1, 1},
    {0, 0, 1, 1024, 8192, 4096, 66, 20, 1, 1},
    {0, 0, 1, 1024, 8192, 3584, 66, 20, 1, 1},
    {0, 0, 1, 1024, 8192, 512, 66, 20, 1, 1},
    {0, 0, 1, 1024, 8192, 32, 66, 20, 3, 1},
    {0, 1, 0, 1024, 32, 8192, 66, 16, 1, 6},
    /* the fused LM head, a chunk of 2048 tokens: the logits, dx, dW */
    {1, 0, 0, 248320, 2048, 1024, 66, 201, 2, 1},
    {0, 0, 0, 1024, 2048, 248320, 66, 23, 4, 2},
    {0, 1, 0, 1024, 248320, 2048, 66, 29, 1, 1},
};

/* The preference for g's shape, or NULL */
static const lt_pref *pref_of(const cuda_impl *im, const cuda_gemm *g) {
    if (im->sm != 90 || g->dta != CUDA_R_16BF || g->dtb != CUDA_R_16BF || g->batch != 1) return NULL;
    for (size_t i = 0; i < sizeof LT_PREFS / sizeof *LT_PREFS; i++) {
        const lt_pref *p = &LT_PREFS[i];
        if (p->ta == (g->ta ? 1 : 0) && p->tb == (g->tb ? 1 : 0) && p->c == (g->c != NULL) && p->m == g->m &&
            p->n == g->n && p->k == g->k)
            return p;
    }
    return NULL;
}

static bool algo_is(const cublasLtMatmulAlgo_t *a, const lt_pref *p) {
    int32_t id = -1;
    uint32_t tile = 0, custom = 0, splitk = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    return id == p->algo && (int32_t)tile == p->tile && (int32_t)custom == p->custom && (int32_t)splitk == p->splitk;
}

/* The answer a product takes: the preference p among the heuristic's n answers, else the first */
static int pick_of(const lt_pref *p, const cublasLtMatmulHeuristicResult_t *r, int n) {
    for (int j = 0; p && j < n; j++)
        if (r[j].state == CUBLAS_STATUS_SUCCESS && algo_is(&r[j].algo, p)) return j;
    return 0;
}

/* The cached descriptors and algorithm of a product, made on first use. */
static cuda_lt_entry *lookup(keel_backend *be, const cuda_gemm *g, const keel_tensor *t) {
    cuda_impl *im = cuda_im(be);
    const void *c = g->c ? g->c : g->d;
    int64_t k[LT_KEY] = {g->ta,          g->tb,          g->m,        g->n,          g->k,   g->dta,
                         g->dtb,         g->dtd,         g->lda,      g->ldb,        g->ldd, g->batch,
                         g->sa,          g->sb,          g->sd,       g->c != NULL,  g->ldc, g->sc,
                         align_of(g->a), align_of(g->b), align_of(c), align_of(g->d)};
    if (!im->lt_cache && !(im->lt_cache = (cuda_lt_entry *)calloc(LT_SLOTS, sizeof(cuda_lt_entry)))) {
        keel_fail("out of memory (cuBLASLt cache)");
        return NULL;
    }
    uint64_t h = hash_key(k);
    cuda_lt_entry *e = NULL;
    for (int probe = 0; probe < LT_SLOTS; probe++) {
        cuda_lt_entry *s = &im->lt_cache[(h + (uint64_t)probe) % LT_SLOTS];
        if (!s->used) {
            e = s;
            break;
        }
        if (!memcmp(s->key, k, sizeof k)) return s;
    }
    if (!e) { /* full: a graph with more than LT_SLOTS shapes; start again */
        for (int i = 0; i < LT_SLOTS; i++) entry_destroy(&im->lt_cache[i]);
        e = &im->lt_cache[h % LT_SLOTS];
    }
    memcpy(e->key, k, sizeof k);
    cublasOperation_t ta = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t dtc = g->c ? g->dtc : g->dtd;
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = KEEL_CUDA_LT_WORKSPACE;
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasLtMatmulHeuristicResult_t all[LT_ANSWERS];
    int n_res = 0;
    /* the heuristic's first answer alone, unless a preference or the survey looks further */
    const lt_pref *pr = pref_of(im, g);
    int n_ask = pr || im->lt_survey ? LT_ANSWERS : 1;
    bool bad =
        cublas_check(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLt descriptor", t) ||
        cublas_check(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "cublasLt",
                     t) ||
        cublas_check(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "cublasLt",
                     t) ||
        layout(&e->a, g->dta, g->ta ? g->k : g->m, g->ta ? g->m : g->k, g->lda, g->batch, g->sa, t) ||
        layout(&e->b, g->dtb, g->tb ? g->n : g->k, g->tb ? g->k : g->n, g->ldb, g->batch, g->sb, t) ||
        layout(&e->c, dtc, g->m, g->n, g->c ? g->ldc : g->ldd, g->batch, g->c ? g->sc : g->sd, t) ||
        layout(&e->d, g->dtd, g->m, g->n, g->ldd, g->batch, g->sd, t) ||
        cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLt preference", t) ||
        cublas_check(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
            "cublasLt preference", t);
    for (int i = 0; i < 4 && !bad; i++) { /* the pointers' alignments: the key's last four */
        uint32_t al = (uint32_t)k[LT_KEY - 4 + i];
        bad = cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof al),
                           "cublasLt preference", t);
    }
    bad = bad ||
          cublas_check(cublasLtMatmulAlgoGetHeuristic(im->lt, e->op, e->a, e->b, e->c, e->d, pref, n_ask, all, &n_res),
                       "cublasLtMatmulAlgoGetHeuristic", t);
    int pick = bad ? 0 : pick_of(pr, all, n_res);
    const cublasLtMatmulHeuristicResult_t *res = &all[pick];
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!bad && (n_res < 1 || res->state != CUBLAS_STATUS_SUCCESS)) {
        keel_fail("cuda: %s '%s': cuBLASLt has no algorithm for a %lld x %lld x %lld product (batch %lld)",
                  keel_op_get(t->op)->name, t->name, (long long)g->m, (long long)g->n, (long long)g->k,
                  (long long)g->batch);
        bad = true;
    }
    if (bad) {
        entry_destroy(e);
        return NULL;
    }
    e->algo = res->algo;
    describe_algo(&e->algo, e->what, sizeof e->what);
    if (im->lt_survey && n_res > 1 && (e->alt = (cublasLtMatmulAlgo_t *)calloc((size_t)n_res, sizeof *e->alt))) {
        for (int i = 0; i < n_res; i++) e->alt[i] = all[i].algo;
        e->n_alt = n_res, e->pick = pick;
    }
    e->used = true;
    return e;
}

/* KEEL_CUDA_LT_SURVEY=1, a diagnostic: the first time a shape runs (eagerly, not in a graph's
 * capture: with KEEL_CUDA_GRAPH=0), each of the heuristic's answers is timed on the node's own
 * operands (10 runs after 2), its result written to a buffer of its own, and printed to stderr, the
 * answer taken marked; the product then runs with that answer, as it would without the survey. For
 * choosing algorithms offline (LT_PREFS), never at run time. */
static void survey(keel_backend *be, cuda_lt_entry *e, const cuda_gemm *g, void *workspace, const keel_tensor *t) {
    cuda_impl *im = cuda_im(be);
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(im->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
    size_t es = g->dtd == CUDA_R_16BF ? 2 : 4;
    size_t bytes = ((size_t)(g->batch > 1 ? g->sd * (g->batch - 1) : 0) + (size_t)g->ldd * (size_t)g->n) * es;
    void *tmp = NULL;
    cudaEvent_t e0, e1;
    if (cudaMalloc(&tmp, bytes) != cudaSuccess) return;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    const float one = 1.0f;
    const void *c = g->c ? g->c : g->d;
    for (int i = 0; i < e->n_alt; i++) {
        char what[96];
        describe_algo(&e->alt[i], what, sizeof what);
        bool ok = true;
        float ms = 0;
        for (int r = 0; r < 12 && ok; r++) {
            if (r == 2) cudaEventRecord(e0, im->stream);
            ok = cublasLtMatmul(im->lt, e->op, &one, g->a, e->a, g->b, e->b, &g->beta, c, e->c, tmp, e->d, &e->alt[i],
                                workspace, KEEL_CUDA_LT_WORKSPACE, im->stream) == CUBLAS_STATUS_SUCCESS;
        }
        cudaEventRecord(e1, im->stream);
        if (ok && cudaEventSynchronize(e1) == cudaSuccess) cudaEventElapsedTime(&ms, e0, e1);
        fprintf(stderr, "lt-survey %s %s%s %lld x %lld x %lld batch %lld%s: #%d %s %.2f us%s\n",
                keel_op_get(t->op)->name, g->ta ? "T" : "N", g->tb ? "T" : "N", (long long)g->m, (long long)g->n,
                (long long)g->k, (long long)g->batch, g->c ? " +C" : "", i, what, ok ? 1000.0 * ms / 10 : -1.0,
                i == e->pick ? " (taken)" : "");
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(tmp);
    free(e->alt), e->alt = NULL, e->n_alt = 0;
}

int cuda_gemm_run(keel_backend *be, const cuda_gemm *g, void *workspace, const keel_tensor *t) {
    if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX || g->batch > INT32_MAX)
        return keel_fail("cuda: %s '%s': a product dimension exceeds cuBLASLt's 32-bit limit", keel_op_get(t->op)->name,
                         t->name);
    cuda_lt_entry *e = lookup(be, g, t);
    if (!e) return -1;
    if (e->n_alt) survey(be, e, g, workspace, t);
    cuda_impl *im = cuda_im(be);
    size_t used = strlen(im->last_kernel);
    if (!strstr(im->last_kernel, e->what) && used + strlen(e->what) + 3 < sizeof im->last_kernel)
        snprintf(im->last_kernel + used, sizeof im->last_kernel - used, "%s%s", used ? "; " : "", e->what);
    const float one = 1.0f;
    return cublas_check(cublasLtMatmul(im->lt, e->op, &one, g->a, e->a, g->b, e->b, &g->beta, g->c ? g->c : g->d, e->c,
                                       g->d, e->d, &e->algo, workspace, KEEL_CUDA_LT_WORKSPACE, im->stream),
                        "cublasLtMatmul", t);
}

void cuda_lt_free(cuda_impl *im) {
    for (int i = 0; im->lt_cache && i < LT_SLOTS; i++) entry_destroy(&im->lt_cache[i]);
    free(im->lt_cache);
    im->lt_cache = NULL;
    if (im->lt) cublasLtDestroy(im->lt);
    im->lt = NULL;
}
