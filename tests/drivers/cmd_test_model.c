/* keel test-model: the whole-model gradient check. A Qwen3.5-shaped layer pair (Gated DeltaNet
 * layer + gated attention layer, SwiGLU MLPs, tied head, cross-entropy) with random weights:
 * every parameter's analytic gradient on ref (float64) against five-point central differences
 * (h = 1e-4 max(1,|x|): the l2-normalised DeltaNet keys curve too fast for the op suite's 1e-3),
 * then the cpu backend's float32 gradients against ref's (and 1 vs 2 threads, bitwise). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "cli_flags.h"
#include "graph/graph.h"
#include "model/qwen35.h"
#include "ops/ops.h"
#include "train/step.h"
#include "util/error.h"

#define FD_PER_PARAM 12

static keel_step *build(keel_backend *be, const keel_qwen35_config *c, keel_type type, int64_t T, int64_t B) {
    keel_step_opts so = {.cfg = c, .type = type, .batch = B, .window = T, .backward = true};
    keel_step *st = keel_step_build(&so);
    if (st && keel_step_place(st, be)) keel_step_free(st), st = NULL;
    return st;
}

/* The weights (float64 values, rounded once to the step's type) and a batch. */
static int set_inputs(keel_step *r, keel_backend *be, double **vals, const int32_t *ids, const int32_t *tgt) {
    for (int i = 0; i < r->m->n_params; i++)
        if (keel_tensor_write(be, r->m->params[i], vals[i], KEEL_F64)) return -1;
    return keel_step_write_batch(r, ids, tgt);
}

static double loss_of(const keel_step *r, keel_backend *be) {
    double v = NAN;
    keel_tensor_read(be, r->out.loss, &v, KEEL_F64);
    return v;
}

int cmd_test_model(int argc, char **argv) {
    const cli_spec spec = {"keel test-model",
                           "whole-model gradient check: a Qwen3.5 layer pair against finite differences", NULL, 0};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    keel_qwen35_config c = {.vocab = 37,
                            .hidden = 16,
                            .layers = 2,
                            .ffn = 24,
                            .heads = 4,
                            .kv_heads = 2,
                            .head_dim = 8,
                            .lk_heads = 2,
                            .lv_heads = 4,
                            .lk_dim = 4,
                            .lv_dim = 6,
                            .conv_kernel = 4,
                            .rope_theta = 10000.0,
                            .partial_rotary = 0.5,
                            .rms_eps = 1e-6,
                            .tied = true};
    c.full_attention[1] = 1; /* layer 0: Gated DeltaNet, layer 1: gated attention */
    const int64_t T = 7, B = 2;
    int32_t ids[T * B], tgt[T * B];
    uint64_t st = 12345;
    for (int i = 0; i < T * B; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((st >> 33) % (uint64_t)c.vocab);
        tgt[i] = (int32_t)((st >> 45) % (uint64_t)c.vocab);
    }
    keel_backend *ref = keel_backend_new("ref", 1), *cpu = keel_backend_new("cpu", 1);
    keel_step *R = build(ref, &c, KEEL_F64, T, B), *C = build(cpu, &c, KEEL_F32, T, B);
    if (!R || !C) {
        fprintf(stderr, "keel test-model: %s\n", keel_last_error());
        return 2;
    }
    /* weights scaled up from the 0.02 init so that every path carries signal */
    double **vals = keel_qwen35_init_values(R->m, 7);
    for (int i = 0; i < R->m->n_params; i++) {
        const char *nm = R->m->params[i]->name;
        for (int64_t j = 0; j < keel_nelements(R->m->params[i]); j++) {
            if (strstr(nm, "proj") || strstr(nm, "embed"))
                vals[i][j] *= 15.0;
            else if (strstr(nm, "norm") && !strstr(nm, "linear_attn.norm"))
                vals[i][j] = 0.1 * sin(1.0 + (double)j + i);
        }
    }
    for (int i = 0; i < R->m->n_params; i++) /* the cpu model runs in f32: give both the same values */
        for (int64_t j = 0; j < keel_nelements(R->m->params[i]); j++) vals[i][j] = (float)vals[i][j];
    int fails = 0;
    double worst_fd = 0, worst_cpu = 0;
    if (set_inputs(R, ref, vals, ids, tgt) || keel_session_run(R->s, NULL, NULL) ||
        set_inputs(C, cpu, vals, ids, tgt) || keel_session_run(C->s, NULL, NULL)) {
        fprintf(stderr, "keel test-model: %s\n", keel_last_error());
        return 2;
    }
    printf("Qwen3.5 layer pair (DeltaNet + gated attention), %d parameters, loss ref(f64) %.12f cpu(f32) %.12f\n",
           R->m->n_params, loss_of(R, ref), loss_of(C, cpu));
    double **ga = calloc((size_t)R->m->n_params, sizeof *ga), **gc = calloc((size_t)R->m->n_params, sizeof *gc);
    for (int i = 0; i < R->m->n_params; i++) {
        ga[i] = keel_tensor_read_f64(ref, keel_step_grad(R, i));
        gc[i] = keel_tensor_read_f64(cpu, keel_step_grad(C, i));
    }
    /* 1 vs 2 threads on cpu, bitwise */
    cpu->set_threads(cpu, 2);
    keel_session_run(C->s, NULL, NULL);
    bool same_bits = true;
    for (int i = 0; i < C->m->n_params; i++) {
        double *g2 = keel_tensor_read_f64(cpu, keel_step_grad(C, i));
        if (memcmp(g2, gc[i], (size_t)keel_nelements(C->m->params[i]) * sizeof(double))) same_bits = false;
        free(g2);
    }
    for (int i = 0; i < R->m->n_params; i++) {
        keel_tensor *p = R->m->params[i];
        int64_t n = keel_nelements(p);
        double gmax = 0;
        for (int64_t j = 0; j < n; j++) gmax = fmax(gmax, fabs(ga[i][j]));
        int64_t idx[FD_PER_PARAM];
        int m = 0;
        idx[m++] = 0, idx[m++] = p->ne[0] - 1, idx[m++] = n - 1;
        uint64_t s2 = 99 + (uint64_t)i;
        while (m < FD_PER_PARAM && m < n)
            idx[m++] = (int64_t)(((s2 = s2 * 6364136223846793005ull + 1) >> 33) % (uint64_t)n);
        double worst = 0;
        static const double off[4] = {-2, -1, 1, 2}, wt[4] = {1, -8, 8, -1};
        for (int k = 0; k < m; k++) {
            double x0 = vals[i][idx[k]], h = 1e-4 * fmax(1.0, fabs(x0)), acc = 0, lmax = 1;
            for (int sd = 0; sd < 4; sd++) {
                vals[i][idx[k]] = x0 + off[sd] * h;
                keel_tensor_write(ref, p, vals[i], KEEL_F64);
                ref->compute(ref, R->g, 0, R->g->n_forward, NULL, NULL);
                double l = loss_of(R, ref);
                acc += wt[sd] * l;
                lmax = fmax(lmax, fabs(l));
            }
            vals[i][idx[k]] = x0;
            keel_tensor_write(ref, p, vals[i], KEEL_F64);
            double num = acc / (12 * h), a = ga[i][idx[k]];
            double e = fabs(a - num) / fmax(fmax(fabs(a), fabs(num)), fmax(1e-3 * gmax, 1e-6 * lmax));
            worst = fmax(worst, e);
        }
        double num = 0, den = 0;
        for (int64_t j = 0; j < n; j++)
            num += (gc[i][j] - ga[i][j]) * (gc[i][j] - ga[i][j]), den += ga[i][j] * ga[i][j];
        double e_cpu = den > 0 ? num / den : num;
        bool ok = worst <= 1e-6 && e_cpu <= 1e-7;
        if (!ok) fails++;
        worst_fd = fmax(worst_fd, worst);
        worst_cpu = fmax(worst_cpu, e_cpu);
        printf("grad.%-48s |g|max %.2e  ref vs finite differences: rel err %.1e  cpu(f32) vs ref: nmse %.1e  %s\n",
               p->name, gmax, worst, e_cpu, ok ? "OK" : "FAIL");
    }
    printf("cpu gradients with 1 and 2 threads: %s\n", same_bits ? "bitwise identical" : "DIFFERENT");
    if (!same_bits) fails++;
    printf("worst: finite differences %.2e (limit 1e-6), cpu nmse %.2e (limit 1e-7)\n", worst_fd, worst_cpu);
    printf("%d passed, %d failed\n", R->m->n_params + 1 - fails, fails);
    for (int i = 0; i < R->m->n_params; i++) free(vals[i]), free(ga[i]), free(gc[i]);
    free(vals), free(ga), free(gc);
    keel_step_free(R);
    keel_step_free(C);
    keel_backend_free(ref);
    keel_backend_free(cpu);
    return fails ? 1 : 0;
}
