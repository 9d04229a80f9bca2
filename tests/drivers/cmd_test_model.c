/* keel test-model: the whole-model gradient check. A Qwen3.5-shaped layer pair (Gated DeltaNet
 * layer + gated attention layer, SwiGLU MLPs, tied head, cross-entropy) with random weights:
 * every parameter's analytic gradient on ref (float64) against five-point central differences
 * (h = 1e-4 max(1,|x|): the l2-normalised DeltaNet keys curve too fast for the op suite's 1e-3),
 * then the cpu (or cuda) backend's float32 gradients against ref's (and 1 vs 2 threads, bitwise).
 * Then the same pair with LoRA adapters on every projection (rank 3, dropout 0.25 with a fixed
 * mask): the adapters' factors are the parameters checked, the base frozen. Then packing: windows
 * holding several examples (positions restarting at 0, padding after) give the loss and every
 * gradient of running each example alone, summed (ref float64 and the float32 backend). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "cli_flags.h"
#include "graph/graph.h"
#include "model/lora.h"
#include "model/qwen35.h"
#include "ops/ops.h"
#include "train/step.h"
#include "util/error.h"

#define FD_PER_PARAM 12

static keel_precision g_prec; /* of the next builds (the bf16 check sets it) */

/* In mixed precision the delta rule runs its float32 variant here: its split-bf16 products (the
 * bf16 step's, about 2^-16 of each product on cuda; cpu has no such variant) move the float32
 * values that meet later bf16 roundings by more than float32 sums do, so some land on the other side
 * of a bf16 boundary than ref's float64 ones, and the pair's few elements make each such flip a
 * gradient error of 2e-7 to 5e-7 (cuda, found at 9da225b; the sixteenth session's run, before the
 * split variant, passed: layer 0's in_proj_qkv, input norm and the embedding, through the conv's bf16
 * input gradient). The split variant is held to float64 by
 * test-ops and to PyTorch's autocast by check-reference --precision bf16. */
static keel_step *build(keel_backend *be, const keel_qwen35_config *c, keel_type type, int64_t T, int64_t B,
                        const keel_lora_opts *lora) {
    keel_step_opts so = {.cfg = c,
                         .type = type,
                         .batch = B,
                         .window = T,
                         .backward = true,
                         .lora = lora,
                         .precision = g_prec,
                         .gdn_float32 = true};
    keel_step *st = keel_step_build(&so);
    if (st && keel_step_place(st, be)) keel_step_free(st), st = NULL;
    return st;
}

/* Every parameter (the base's, then the adapters') as one list: values are written to all, the
 * trainable ones are checked. */
typedef struct {
    keel_tensor **all;
    int n_all;
    keel_tensor **tr;
    int n_tr;
} plist;

static int params_of(const keel_step *st, plist *p) {
    const keel_qwen35 *m = st->m;
    int nl = m->lora ? m->lora->n_params : 0;
    p->n_all = m->n_params + nl;
    p->all = malloc((size_t)p->n_all * sizeof *p->all);
    if (!p->all) return -1;
    memcpy(p->all, m->params, (size_t)m->n_params * sizeof *p->all);
    if (nl) memcpy(p->all + m->n_params, m->lora->params, (size_t)nl * sizeof *p->all);
    p->n_tr = keel_step_trainable(st, &p->tr);
    return p->n_tr < 0 ? -1 : 0;
}

static double loss_of(const keel_step *r, keel_backend *be) {
    double v = NAN;
    keel_tensor_read(be, r->out.loss, &v, KEEL_F64);
    return v;
}

/* One model: ref (float64) gradients of every trainable parameter against five-point central
 * differences, and the other backend's float32 gradients against ref's. In mixed precision
 * (g_prec bf16) the bf16 roundings make the loss a step function, so finite differences are
 * skipped and the other backend is held to ref's mixed-precision run as tightly as in float32
 * (nmse 1e-7): the same roundings of the same values, but where a float32 intermediate lands on the
 * other side of a bf16 boundary than ref's float64 one. Returns failures, or -1. */
static int check(const char *label, const keel_qwen35_config *c, const keel_lora_opts *lora, const char *other,
                 int *n_checks) {
    const int64_t T = 7, B = 2;
    int32_t ids[T * B], tgt[T * B];
    uint64_t st = 12345;
    for (int i = 0; i < T * B; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((st >> 33) % (uint64_t)c->vocab);
        tgt[i] = (int32_t)((st >> 45) % (uint64_t)c->vocab);
    }
    keel_backend *ref = keel_backend_new("ref", 1), *cpu = keel_backend_new(other, 1);
    keel_step *R = ref ? build(ref, c, KEEL_F64, T, B, lora) : NULL,
              *C = cpu ? build(cpu, c, KEEL_F32, T, B, lora) : NULL;
    plist pr = {0}, pc = {0};
    if (!R || !C || params_of(R, &pr) || params_of(C, &pc)) {
        fprintf(stderr, "keel test-model: %s\n", keel_last_error());
        return -1;
    }
    /* weights scaled up from the 0.02 init so that every path carries signal */
    double **vals = keel_qwen35_init_values(R->m, 7);
    vals = realloc(vals, (size_t)pr.n_all * sizeof *vals);
    for (int i = 0; i < R->m->n_params; i++) {
        const char *nm = R->m->params[i]->name;
        for (int64_t j = 0; j < keel_nelements(R->m->params[i]); j++) {
            if (strstr(nm, "proj") || strstr(nm, "embed"))
                vals[i][j] *= 15.0;
            else if (strstr(nm, "norm") && !strstr(nm, "linear_attn.norm"))
                vals[i][j] = 0.1 * sin(1.0 + (double)j + i);
        }
    }
    for (int i = R->m->n_params; i < pr.n_all; i++) { /* adapters: A as PEFT draws it, B non-zero (else dA = 0) */
        int64_t n = keel_nelements(pr.all[i]);
        vals[i] = malloc((size_t)n * sizeof **vals);
        double bound = 1.0 / sqrt((double)pr.all[i]->ne[0]);
        for (int64_t j = 0; j < n; j++)
            vals[i][j] = (strstr(pr.all[i]->name, "lora_A") ? bound : 0.5) * sin(0.7 * (double)j + 3.0 * i);
    }
    for (int i = 0; i < pr.n_all; i++) /* the f32 model: give both the same values */
        for (int64_t j = 0; j < keel_nelements(pr.all[i]); j++) vals[i][j] = (float)vals[i][j];
    int fails = 0;
    double worst_fd = 0, worst_cpu = 0;
    int rc = 0;
    for (int i = 0; i < pr.n_all && !rc; i++)
        rc = keel_tensor_write(ref, pr.all[i], vals[i], KEEL_F64) ||
             keel_tensor_write(cpu, pc.all[i], vals[i], KEEL_F64);
    if (rc || keel_step_write_batch(R, ids, tgt) || keel_session_run(R->s, NULL, NULL) ||
        keel_step_write_batch(C, ids, tgt) || keel_session_run(C->s, NULL, NULL)) {
        fprintf(stderr, "keel test-model: %s\n", keel_last_error());
        return -1;
    }
    printf("%s: %d trainable parameter tensors, loss ref(f64) %.12f %s(f32) %.12f\n", label, pr.n_tr, loss_of(R, ref),
           other, loss_of(C, cpu));
    double **ga = calloc((size_t)pr.n_tr, sizeof *ga), **gc = calloc((size_t)pr.n_tr, sizeof *gc);
    for (int i = 0; i < pr.n_tr; i++) {
        ga[i] = keel_tensor_read_f64(ref, keel_graph_grad(R->g, pr.tr[i]));
        gc[i] = keel_tensor_read_f64(cpu, keel_graph_grad(C->g, pc.tr[i]));
    }
    bool same_bits = true, threads = strcmp(other, "cpu") == 0; /* 1 vs 2 threads on cpu, bitwise */
    if (threads) {
        cpu->set_threads(cpu, 2);
        keel_session_run(C->s, NULL, NULL);
        for (int i = 0; i < pc.n_tr; i++) {
            double *g2 = keel_tensor_read_f64(cpu, keel_graph_grad(C->g, pc.tr[i]));
            if (memcmp(g2, gc[i], (size_t)keel_nelements(pc.tr[i]) * sizeof(double))) same_bits = false;
            free(g2);
        }
    }
    bool mixed = g_prec == KEEL_PRECISION_BF16;
    double lim_cpu = 1e-7;
    for (int i = 0; i < pr.n_tr; i++) {
        keel_tensor *p = pr.tr[i];
        int vi = 0;
        while (pr.all[vi] != p) vi++;
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
        for (int k = 0; k < m && !mixed; k++) {
            double x0 = vals[vi][idx[k]], h = 1e-4 * fmax(1.0, fabs(x0)), acc = 0, lmax = 1;
            for (int sd = 0; sd < 4; sd++) {
                vals[vi][idx[k]] = x0 + off[sd] * h;
                keel_tensor_write(ref, p, vals[vi], KEEL_F64);
                ref->compute(ref, R->g, 0, R->g->n_forward, NULL, NULL);
                double l = loss_of(R, ref);
                acc += wt[sd] * l;
                lmax = fmax(lmax, fabs(l));
            }
            vals[vi][idx[k]] = x0;
            keel_tensor_write(ref, p, vals[vi], KEEL_F64);
            double num = acc / (12 * h), a = ga[i][idx[k]];
            double e = fabs(a - num) / fmax(fmax(fabs(a), fabs(num)), fmax(1e-3 * gmax, 1e-6 * lmax));
            worst = fmax(worst, e);
        }
        double num = 0, den = 0;
        for (int64_t j = 0; j < n; j++)
            num += (gc[i][j] - ga[i][j]) * (gc[i][j] - ga[i][j]), den += ga[i][j] * ga[i][j];
        double e_cpu = den > 0 ? num / den : num;
        bool ok = worst <= 1e-6 && e_cpu <= lim_cpu && gmax > 0; /* a zero gradient would check nothing */
        if (!ok) fails++;
        worst_fd = fmax(worst_fd, worst);
        worst_cpu = fmax(worst_cpu, e_cpu);
        printf("grad.%-48s |g|max %.2e  ref vs finite differences: rel err %.1e  %s(f32) vs ref: nmse %.1e  %s\n",
               p->name, gmax, worst, other, e_cpu, ok ? "OK" : "FAIL");
    }
    if (threads) printf("cpu gradients with 1 and 2 threads: %s\n", same_bits ? "bitwise identical" : "DIFFERENT");
    if (!same_bits) fails++;
    if (mixed)
        printf("%s, worst: %s nmse %.2e against ref's mixed-precision run (limit %.0e)\n", label, other, worst_cpu,
               lim_cpu);
    else
        printf("%s, worst: finite differences %.2e (limit 1e-6), %s nmse %.2e (limit 1e-7)\n", label, worst_fd, other,
               worst_cpu);
    *n_checks += pr.n_tr + threads;
    for (int i = 0; i < pr.n_all; i++) free(vals[i]);
    for (int i = 0; i < pr.n_tr; i++) free(ga[i]), free(gc[i]);
    free(vals), free(ga), free(gc), free(pr.all), free(pr.tr), free(pc.all), free(pc.tr);
    keel_step_free(R);
    keel_step_free(C);
    keel_backend_free(ref);
    keel_backend_free(cpu);
    return fails;
}

/* Packed windows against each example alone. Column 0 packs examples of 5, 3 and 6 inputs and two
 * padding positions, column 1 examples of 9 and 7: ids and targets random, every target counted,
 * the cross-entropy divided by one fixed count in every run, so that the packed loss is the sum of
 * the examples' losses and its gradients the sums of theirs. Relative error: per parameter, the
 * largest difference over the largest gradient; limit 0 leaves it unchecked (printed). ref's call
 * keeps its sums in *truth; a later backend's packed gradients are then also held to the pair
 * check's nmse against them (cuBLAS picks other summation orders for other shapes, so on cuda the
 * packed and the alone float32 runs differ by float32 rounding, amplified; against float64 both are
 * as close as an unpacked run). Returns failures, or -1. */
static int check_packing(const keel_qwen35_config *c, const char *backend, double limit, double ***truth,
                         int *n_checks) {
    enum { T = 16, B = 2, NE = 5 };
    static const int col[NE] = {0, 0, 0, 1, 1}, len[NE] = {5, 3, 6, 9, 7};
    int32_t ids[T * B], tgt[T * B], pos[T * B], ex_ids[NE][T], ex_tgt[NE][T], ex_pos[NE][T];
    uint64_t rs = 777;
    int o[B] = {0, 0};
    for (int e = 0; e < NE; e++) {
        for (int i = 0; i < len[e]; i++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            int at = col[e] * T + o[col[e]] + i;
            ex_ids[e][i] = ids[at] = (int32_t)((rs >> 33) % (uint64_t)c->vocab);
            ex_tgt[e][i] = tgt[at] = (int32_t)((rs >> 45) % (uint64_t)c->vocab);
            ex_pos[e][i] = pos[at] = i;
        }
        o[col[e]] += len[e];
    }
    for (int b = 0; b < B; b++)
        for (int i = o[b]; i < T; i++) ids[b * T + i] = 0, tgt[b * T + i] = -100, pos[b * T + i] = i - o[b];
    double D = 30.0; /* the counted targets of the packed batch */
    keel_backend *be = keel_backend_new(backend, 1);
    keel_type type = strcmp(backend, "ref") ? KEEL_F32 : KEEL_F64;
    keel_step *P = be ? build(be, c, type, T, B, NULL) : NULL, *A[NE] = {0};
    int rc = !P;
    for (int e = 0; e < NE && !rc; e++) rc = !(A[e] = build(be, c, type, len[e], 1, NULL));
    double **vals = rc ? NULL : keel_qwen35_init_values(P->m, 11);
    for (int i = 0; vals && i < P->m->n_params; i++)
        for (int64_t j = 0; j < keel_nelements(P->m->params[i]); j++) {
            const char *nm = P->m->params[i]->name;
            if (strstr(nm, "proj") || strstr(nm, "embed")) vals[i][j] *= 15.0;
            vals[i][j] = (float)vals[i][j];
        }
    rc = rc || !vals;
    for (int i = 0; !rc && i < P->m->n_params; i++) {
        rc = keel_tensor_write(be, P->m->params[i], vals[i], KEEL_F64);
        for (int e = 0; e < NE && !rc; e++) rc = keel_tensor_write(be, A[e]->m->params[i], vals[i], KEEL_F64);
    }
    keel_cross_entropy_set_divisor(P->g, D);
    rc = rc || keel_step_write_positions(P, pos) || keel_step_run(P, ids, tgt, NULL, NULL);
    double lp = rc ? NAN : loss_of(P, be), la = 0;
    for (int e = 0; e < NE && !rc; e++) {
        keel_cross_entropy_set_divisor(A[e]->g, D);
        rc = keel_step_write_positions(A[e], ex_pos[e]) || keel_step_run(A[e], ex_ids[e], ex_tgt[e], NULL, NULL);
        la += loss_of(A[e], be);
    }
    if (rc) {
        fprintf(stderr, "keel test-model: %s\n", keel_last_error());
        return -1;
    }
    int fails = 0;
    double e_loss = fabs(lp - la) / fabs(la), worst = e_loss, worst_nmse = 0;
    if (limit > 0 && !(e_loss <= limit)) fails++;
    bool keep = !*truth;
    if (keep) *truth = calloc((size_t)P->m->n_params + 1, sizeof **truth); /* NULL-terminated */
    printf("packing on %s: loss of the packed batch %.15g, sum of the examples alone %.15g: rel err %.1e\n", backend,
           lp, la, e_loss);
    for (int i = 0; i < P->m->n_params; i++) {
        keel_tensor *p = P->m->params[i];
        int64_t n = keel_nelements(p);
        double *gp = keel_tensor_read_f64(be, keel_graph_grad(P->g, p)), *ga = calloc((size_t)n, sizeof *ga);
        for (int e = 0; e < NE && gp && ga; e++) {
            double *g = keel_tensor_read_f64(be, keel_graph_grad(A[e]->g, A[e]->m->params[i]));
            for (int64_t j = 0; g && j < n; j++) ga[j] += g[j];
            free(g);
        }
        double dmax = 0, gmax = 0;
        for (int64_t j = 0; gp && ga && j < n; j++)
            dmax = fmax(dmax, fabs(gp[j] - ga[j])), gmax = fmax(gmax, fabs(ga[j]));
        double e = gmax > 0 ? dmax / gmax : 1.0; /* a zero gradient would check nothing */
        bool ok = gp && ga && (limit == 0 || e <= limit);
        if (!keep && gp) { /* against float64 */
            double num = 0, den = 0;
            for (int64_t j = 0; j < n; j++)
                num += (gp[j] - (*truth)[i][j]) * (gp[j] - (*truth)[i][j]), den += (*truth)[i][j] * (*truth)[i][j];
            double nm = den > 0 ? num / den : 1.0;
            worst_nmse = fmax(worst_nmse, nm);
            if (!(nm <= 1e-7))
                ok = false, printf("packing on %s: grad.%s nmse %.1e > 1e-7  FAIL\n", backend, p->name, nm);
        }
        fails += !ok;
        worst = fmax(worst, e);
        if (limit > 0 && e > limit)
            printf("packing on %s: grad.%s rel err %.1e > %.0e  FAIL\n", backend, p->name, e, limit);
        if (keep) (*truth)[i] = ga, ga = NULL;
        free(gp), free(ga);
    }
    if (limit > 0)
        printf("packing on %s: loss and %d gradients of a packed batch equal the examples' alone: worst rel err %.2e "
               "(limit %.0e)  %s\n",
               backend, P->m->n_params, worst, limit, fails ? "FAIL" : "OK");
    else
        printf("packing on %s: packed vs alone, worst rel err %.2e (float32 rounding of shape-dependent products)\n",
               backend, worst);
    if (!keep)
        printf(
            "packing on %s: %d packed gradients vs float64 (ref's examples alone): worst nmse %.2e (limit 1e-7)  %s\n",
            backend, P->m->n_params, worst_nmse, fails ? "FAIL" : "OK");
    *n_checks += 1 + P->m->n_params;
    for (int i = 0; i < P->m->n_params; i++) free(vals[i]);
    free(vals);
    keel_step_free(P);
    for (int e = 0; e < NE; e++) keel_step_free(A[e]);
    keel_backend_free(be);
    return fails;
}

int cmd_test_model(int argc, char **argv) {
    const char *other = "cpu";
    const cli_flag flags[] = {
        {"--backend", CLI_STR, &other, .meta = "cpu|cuda",
         .help = "the float32 backend compared with ref (default cpu)"},
    };
    const cli_spec spec = {"keel test-model",
                           "whole-model gradient check: a Qwen3.5 layer pair, and the pair with LoRA adapters, against "
                           "finite differences",
                           flags, (int)(sizeof flags / sizeof *flags)};
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
    /* LoRA of rank 3 on every projection, alpha 6, dropout 0.25 on the adapters' input (a fixed mask) */
    keel_lora_opts lora = {.rank = 3, .alpha = 6.0, .dropout = 0.25, .seed = 5};
    int n_checks = 0;
    int f1 = check("Qwen3.5 layer pair (DeltaNet + gated attention)", &c, NULL, other, &n_checks);
    int f2 = f1 < 0 ? -1 : check("the pair with LoRA adapters (rank 3, dropout 0.25)", &c, &lora, other, &n_checks);
    /* packing: three layers (DeltaNet, attention, DeltaNet), so a DeltaNet layer also reads what
     * attention mixed; float64 on ref to 1e-12, float32 to 1e-6 */
    keel_qwen35_config c3 = c;
    c3.layers = 3;
    double **truth = NULL; /* ref's gradients of the examples alone, summed */
    int f3 = f2 < 0 ? -1 : check_packing(&c3, "ref", 1e-12, &truth, &n_checks);
    /* cpu: the 1e-6 between packed and alone; cuda (cuBLAS: shape-dependent orders): against
     * float64 only */
    int f4 = f3 < 0 ? -1 : check_packing(&c3, other, strcmp(other, "cpu") ? 0 : 1e-6, &truth, &n_checks);
    for (int i = 0; truth && truth[i]; i++) free(truth[i]);
    free(truth);
    /* mixed precision: the pair with bf16 operands and the fused LM head, the other backend against ref */
    g_prec = KEEL_PRECISION_BF16;
    int f5 =
        f4 < 0 ? -1 : check("the pair in mixed precision (bf16 operands, fused LM head)", &c, NULL, other, &n_checks);
    g_prec = KEEL_PRECISION_F32;
    if (f1 < 0 || f2 < 0 || f3 < 0 || f4 < 0 || f5 < 0) return 2;
    int fails = f1 + f2 + f3 + f4 + f5;
    printf("%d passed, %d failed\n", n_checks - fails, fails);
    return fails ? 1 : 0;
}
