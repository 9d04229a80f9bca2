/* The cpu GEMM against a float64 product, on shapes that cross every blocking boundary: several
 * k blocks (KC 512), several column blocks of packed B (768) and ragged edges of every tile, for
 * each layout keel's graph produces (A and B read along or across rows, C strided, accumulate).
 * Also: 1, 2 and 3 threads give the same bits, and so do the AVX-512 and AVX2 kernels (both sum
 * each element over k in order with one FMA per step), where the CPU has them. And the copy
 * path's blocked transpose (CONT of a TRANSPOSE view, rows and columns not multiples of its
 * 16 x 64 blocks) moves every element where the float64 reference does. */
#include "unit.h"

#include "backends/cpu/gemm.h"
#include "backends/cpu/threadpool.h"

static void fill(float *x, int64_t n, uint64_t st) {
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 40) / 16777216.0 - 0.5);
    }
}

typedef struct {
    int64_t M, N, K;
    bool a_rows_m, b_rows_n, c_rows_n, accumulate; /* whether m (n) is the fast index of A (B, C) */
} shape;

/* C = (C0 +) A B with the layout's strides on nt threads and the named kernel; returns C. A (B)
 * holds floats, or bf16 values (uint16_t) when a16 (b16). */
static float *run_typed(const shape *s, const void *A, const void *B, const float *C0, int nt, const char *isa,
                        bool a16, bool b16) {
    setenv("KEEL_GEMM_ISA", isa, 1);
    float *C = malloc((size_t)(s->M * s->N) * 4);
    memcpy(C, C0, (size_t)(s->M * s->N) * 4);
    int64_t ea = a16 ? 2 : 4, eb = b16 ? 2 : 4;
    keel_gemm_args g = {s->M,
                        s->N,
                        s->K,
                        A,
                        s->a_rows_m ? ea : s->K * ea,
                        s->a_rows_m ? s->M * ea : ea,
                        B,
                        s->b_rows_n ? s->N * eb : eb,
                        s->b_rows_n ? eb : s->K * eb,
                        C,
                        s->c_rows_n ? s->N * 4 : 4,
                        s->c_rows_n ? 4 : s->M * 4,
                        s->accumulate,
                        a16,
                        b16};
    keel_pool *p = keel_pool_new(nt);
    assert_int_equal(keel_cpu_gemm(p, &g), 0);
    keel_pool_free(p);
    unsetenv("KEEL_GEMM_ISA");
    return C;
}

static float *run(const shape *s, const float *A, const float *B, const float *C0, int nt, const char *isa) {
    return run_typed(s, A, B, C0, nt, isa, false, false);
}

static void against_float64(void **st) {
    (void)st;
    static const shape shapes[] = {
        {77, 3900, 1100, false, false, false, false}, /* 3 k blocks, 6 column blocks, ragged tiles */
        {130, 45, 1030, true, true, false, true},     /* A and B read across rows, accumulate */
        {33, 7700, 520, false, true, true, false},    /* C strided (n fast), 11 column blocks */
        {1, 1, 1, false, false, false, false},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const shape *s = &shapes[k];
        float *A = malloc((size_t)(s->M * s->K) * 4), *B = malloc((size_t)(s->K * s->N) * 4),
              *C0 = malloc((size_t)(s->M * s->N) * 4);
        fill(A, s->M * s->K, 1 + k), fill(B, s->K * s->N, 7 + k), fill(C0, s->M * s->N, 13 + k);
        float *C = run(s, A, B, C0, 2, "");
        double worst = 0;
        for (int64_t m = 0; m < s->M; m++)
            for (int64_t n = 0; n < s->N; n++) {
                double ref = s->accumulate ? C0[s->c_rows_n ? m * s->N + n : n * s->M + m] : 0, mag = 0;
                for (int64_t i = 0; i < s->K; i++) {
                    double a = A[s->a_rows_m ? i * s->M + m : m * s->K + i],
                           b = B[s->b_rows_n ? i * s->N + n : n * s->K + i];
                    ref += a * b, mag += fabs(a * b);
                }
                double got = C[s->c_rows_n ? m * s->N + n : n * s->M + m], err = fabs(got - ref) / (mag + 1e-30);
                if (err > worst) worst = err;
            }
        /* float32 accumulation over K terms: each step rounds by at most 2^-24 of the running sum */
        if (!(worst < 1e-6 * sqrt((double)s->K))) fail_msg("shape %zu: relative error %.3e against float64", k, worst);
        for (int nt = 1; nt <= 3; nt += 2) { /* the same bits on 1 and 3 threads */
            float *Ct = run(s, A, B, C0, nt, "");
            assert_memory_equal(C, Ct, (size_t)(s->M * s->N) * 4);
            free(Ct);
        }
        float *C2 = run(s, A, B, C0, 2, "avx2"); /* the AVX2 kernel: the same bits as the AVX-512 one */
        if (strcmp(keel_cpu_gemm_kernel(), "portable 16x6")) assert_memory_equal(C, C2, (size_t)(s->M * s->N) * 4);
        free(C2), free(C), free(A), free(B), free(C0);
    }
}

/* bf16 copies of x, and x set to their values. */
static uint16_t *to_bf16(float *x, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = keel_f32_to_bf16(x[i]), x[i] = keel_bf16_to_f32(h[i]);
    return h;
}

/* bf16 operands give the bits of the float32 kernel on float32 copies of them: on the AVX-512 BF16
 * kernel where the CPU has it (the same FMA order, pairs of k summed upper half first), and on each
 * float32 kernel, both operands or only A widened as they are packed. Shapes with even and odd K
 * (odd: a zero-padded last pair, rows not 4-byte aligned), K sliced (over 2048), both packing
 * layouts, accumulate; 1 and 3 threads. Subnormal inputs: zero on the bf16 kernel, kept when widened. */
static void bf16_operands(void **st) {
    (void)st;
    bool kernel = keel_cpu_gemm_bf16_kernel() != NULL;
    if (!kernel) printf("bf16_operands: this CPU has no AVX-512 BF16 kernel; the widened ones are tested\n");
    setenv("KEEL_GEMM_ISA", "avx512", 1); /* the float32 AVX-512 kernel asked for: no bf16 kernel */
    assert_null(keel_cpu_gemm_bf16_kernel());
    unsetenv("KEEL_GEMM_ISA");
    static const char *const isas[] = {"avx512", "avx2", "portable"};
    static const shape shapes[] = {
        {77, 3900, 1100, false, false, false, false}, /* MUL_MAT's layout: k contiguous, 3 k blocks */
        {77, 1000, 1101, false, false, false, true},  /* odd K */
        {130, 45, 1030, true, true, false, true},     /* OUT_PROD's layout: m and n contiguous */
        {33, 7700, 521, false, true, true, false},    /* odd K, mixed layouts, C strided */
        {40, 300, 4099, false, false, false, false},  /* K in slices of 4 blocks, odd */
        {1, 1, 1, false, false, false, false},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const shape *s = &shapes[k];
        float *A = malloc((size_t)(s->M * s->K) * 4), *B = malloc((size_t)(s->K * s->N) * 4),
              *C0 = malloc((size_t)(s->M * s->N) * 4);
        fill(A, s->M * s->K, 3 + k), fill(B, s->K * s->N, 9 + k), fill(C0, s->M * s->N, 17 + k);
        uint16_t *A16 = to_bf16(A, s->M * s->K), *B16 = to_bf16(B, s->K * s->N);
        for (size_t v = 0; v < sizeof isas / sizeof *isas; v++) { /* each float32 kernel: widened */
            /* the portable kernel (scalar, and unoptimised under the sanitizers) on the smaller shapes */
            if (!strcmp(isas[v], "portable") && (double)s->M * (double)s->N * (double)s->K > 5e7) continue;
            float *Cf = run(s, A, B, C0, 2, isas[v]);
            for (int nt = 1; nt <= 3; nt += 2) {
                float *Cw = run_typed(s, A16, B16, C0, nt, isas[v], true, true),
                      *Ca = run_typed(s, A16, B, C0, nt, isas[v], true, false);
                assert_memory_equal(Cw, Cf, (size_t)(s->M * s->N) * 4);
                assert_memory_equal(Ca, Cf, (size_t)(s->M * s->N) * 4);
                free(Cw), free(Ca);
            }
            free(Cf);
        }
        float *Cf = run(s, A, B, C0, 2, "avx512");
        for (int nt = 1; kernel && nt <= 3; nt++) {
            float *Cb = run_typed(s, A16, B16, C0, nt, "", true, true);
            for (int64_t i = 0; i < s->M * s->N; i++)
                if (memcmp(&Cb[i], &Cf[i], 4))
                    fail_msg("shape %zu, %d thread(s): element %lld is %.9g, the float32 kernel's %.9g", k, nt,
                             (long long)i, Cb[i], Cf[i]);
            free(Cb);
        }
        free(Cf), free(A), free(B), free(C0), free(A16), free(B16);
    }
    /* a subnormal input: the instruction reads it as zero, where the float32 kernel keeps it */
    shape s = {16, 12, 2, false, false, false, false};
    float A[16 * 2] = {0}, B[2 * 12], C0[16 * 12] = {0};
    uint16_t A16[16 * 2] = {0}, B16[2 * 12];
    for (int i = 0; i < 24; i++) B[i] = 1.0f, B16[i] = 0x3f80;
    A16[0] = 0x0040, A[0] = 0x1p-127f; /* A(0, 0) */
    float *Cw = run_typed(&s, A16, B16, C0, 1, "avx512", true, true), *Cf = run(&s, A, B, C0, 1, "avx512");
    assert_true(Cf[0] == 0x1p-127f);
    assert_memory_equal(Cw, Cf, sizeof C0);
    free(Cw), free(Cf);
    if (!kernel) return;
    float *Cb = run_typed(&s, A16, B16, C0, 1, "", true, true);
    assert_memory_equal(Cb, C0, sizeof C0);
    free(Cb);
}

static void transpose_copy(void **st) {
    (void)st;
    static const int64_t shapes[][2] = {{150, 70}, {65, 17}, {1000, 3}, {3, 1000}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int64_t n0 = shapes[k][0], n1 = shapes[k][1];
        keel_ctx *ctx = keel_ctx_new();
        keel_tensor *x = keel_set_flags(keel_new_2d(ctx, KEEL_F32, n0, n1), KEEL_FLAG_INPUT);
        keel_tensor *y = keel_cont(ctx, keel_transpose(ctx, x));
        keel_graph *g = keel_graph_build(ctx, &y, 1);
        double *xv = malloc((size_t)(n0 * n1) * sizeof *xv);
        for (int64_t i = 0; i < n0 * n1; i++) xv[i] = (double)i * 0.5 - 7;
        double *vals[1] = {xv};
        keel_tensor *leaves[1] = {x};
        double *r = run_graph("cpu", g, leaves, vals, 1, y);
        for (int64_t i1 = 0; i1 < n0; i1++)
            for (int64_t i0 = 0; i0 < n1; i0++) assert_true(r[i1 * n1 + i0] == xv[i0 * n0 + i1]);
        free(r), free(xv);
        keel_graph_free(g);
        keel_ctx_free(ctx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(against_float64), cmocka_unit_test(bf16_operands),
                                       cmocka_unit_test(transpose_copy)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
