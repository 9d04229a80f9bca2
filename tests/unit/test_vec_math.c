/* The cpu backend's vector row helpers (src/backends/cpu/vec_math.h) against float64 libm:
 * keel_expf_fast within 2 ulp over every float exponent that gives a normal result, subnormal
 * results within one unit of the smallest subnormal, the edges (overflow to +inf, underflow to 0,
 * NaN kept); max and float64 sums of rows whose lengths cross the lane count, against serial
 * float64 loops. */
#include "unit.h"

#include "backends/cpu/vec_math.h"

/* distance in units of the last place between a float and the float64 value it approximates */
static double ulps(float got, double want) {
    double ulp = ldexp(1.0, ilogb(want) - 23);
    if (fabs(want) < 0x1p-126) ulp = 0x1p-149; /* subnormal spacing */
    return fabs((double)got - want) / ulp;
}

static void exp_against_float64(void **st) {
    (void)st;
    double worst = 0;
    float worst_x = 0;
    /* a dense sweep of [-104, 89], every 2^-12, plus the float neighbourhood of each integer */
    for (double xd = -104.0; xd <= 89.0; xd += 0x1p-12) {
        float x = (float)xd;
        double want = exp((double)x);
        float got = keel_expf_fast(x);
        if (want > 3.4028234663852886e38) {
            assert_true(isinf(got) && got > 0);
            continue;
        }
        double e = ulps(got, want);
        if (e > worst) worst = e, worst_x = x;
    }
    printf("keel_expf_fast: worst %.2f ulp at x = %.9g\n", worst, (double)worst_x);
    assert_true(worst <= 2.0);
    assert_true(keel_expf_fast(0.0f) == 1.0f);
    assert_true(keel_expf_fast(-200.0f) == 0.0f);
    assert_true(keel_expf_fast(-INFINITY) == 0.0f);
    assert_true(isinf(keel_expf_fast(100.0f)));
    assert_true(isinf(keel_expf_fast(INFINITY)));
    assert_true(isnan(keel_expf_fast(NAN)));
}

static void rows_against_serial(void **st) {
    (void)st;
    static const int64_t lens[] = {0, 1, 15, 16, 17, 33, 1000, 248320};
    float *x = malloc(248320 * sizeof *x), *y = malloc(248320 * sizeof *y);
    uint64_t s = 7;
    for (int64_t i = 0; i < 248320; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / 16777216.0 * 40.0 - 30.0);
    }
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        int64_t n = lens[k];
        float mx = -INFINITY;
        double sum = 0, asum = 0;
        for (int64_t i = 0; i < n; i++) mx = fmaxf(mx, x[i]), sum += x[i], asum += fabs(x[i]);
        assert_true(keel_max_row(x, n) == mx);
        assert_true(fabs(keel_sum_row_f64(x, n) - sum) <= 1e-15 * asum);
        memcpy(y, x, (size_t)n * sizeof *y);
        keel_exp_row(y, mx, n);
        for (int64_t i = 0; i < n; i++) assert_true(ulps(y[i], exp((double)(x[i] - mx))) <= 2.0);
    }
    x[5] = NAN; /* skipped, as fmaxf skips it */
    float mx = -INFINITY;
    for (int64_t i = 0; i < 40; i++) mx = i == 5 ? mx : fmaxf(mx, x[i]);
    assert_true(keel_max_row(x, 40) == mx);
    free(x), free(y);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(exp_against_float64), cmocka_unit_test(rows_against_serial)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
