/* keel test-recompute: activation recompute must cost no accuracy. For the transformers fixture's model
 * and a deeper random one (8 layers, both layer kinds), modes off, full, every:2 and layers:1,3
 * (and 1 vs 2 threads; on cuda, which ignores threads, that is a second run) must give bitwise
 * identical losses, gradients and parameters over 3 AdamW steps; the random model also with packed
 * windows (positions restarting at 0 where an example starts, a different packing each step).
 * Also prints each mode's planned memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "io/checkpoint.h"
#include "ops/ops.h"
#include "recompute/recompute.h"
#include "train/optim.h"
#include "train/step.h"
#include "util/error.h"

#define STEPS 3

static const char *backend_name = "cpu"; /* --backend */
static keel_precision precision;         /* --precision */
static bool packed;                      /* packed windows: examples of 1..9 tokens */

typedef struct {
    uint64_t loss[STEPS], grads[STEPS], params;
    size_t planned, activations;
    int64_t clones;
} outcome;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t hash_tensor(uint64_t h, keel_backend *be, const keel_tensor *t) {
    size_t n = keel_nbytes(t);
    void *buf = malloc(n);
    keel_tensor_read(be, t, buf, t->type);
    h = fnv(h, buf, n);
    free(buf);
    return h;
}

static int run_mode(const keel_qwen35_config *cfg, const keel_checkpoint *ck, const char *mode, int threads,
                    outcome *o) {
    memset(o, 0, sizeof *o);
    keel_recompute_mode rm;
    if (keel_recompute_parse(mode, &rm)) return -1;
    enum { T = 33, B = 2 };
    keel_backend *be = keel_backend_new(backend_name, threads);
    keel_step_opts so = {.cfg = cfg,
                         .type = KEEL_F32,
                         .batch = B,
                         .window = T,
                         .backward = true,
                         .recompute = &rm,
                         .precision = precision};
    /* as keel train builds it: in bf16 with recompute off, the weights' bf16 copies kept by AdamW, so
     * this mode's bits against the others' (CASTs in the step) also prove the copies */
    so.weight_copies = keel_step_copies_wanted(&so);
    keel_step *st = be ? keel_step_build(&so) : NULL;
    int rc = -1;
    if (!st || keel_step_adamw(st, NULL, NULL, 0, 1e-2, 0.01, 0, 1) || keel_step_place(st, be)) goto done;
    const keel_qwen35 *m = st->m;
    o->clones = st->clones;
    o->planned = st->s->plan->total_bytes;
    o->activations = st->s->plan->peak_activation_bytes;
    if (ck) {
        if (keel_checkpoint_load(ck, m, be)) goto done;
    } else {
        double **v = keel_qwen35_init_values(m, 11);
        for (int i = 0; i < m->n_params; i++) {
            for (int64_t j = 0; j < keel_nelements(m->params[i]); j++) v[i][j] *= 10.0; /* more signal than 0.02 */
            keel_tensor_write(be, m->params[i], v[i], KEEL_F64);
            free(v[i]);
        }
        free(v);
    }
    if (keel_step_sync_copies(st)) goto done;
    int32_t iv[T * B], tv[T * B], pv[T * B];
    for (int step = 0; step < STEPS; step++) {
        for (int64_t i = 0; i < T * B; i++) {
            iv[i] = (int32_t)((i * 7 + step * 13 + 3) % cfg->vocab);
            tv[i] = (int32_t)((i * 11 + step * 5 + 1) % cfg->vocab);
            int64_t t = i % T;
            pv[i] = (int32_t)(!packed ? t : t == 0 || (t * 5 + step * 3 + i / T) % 9 == 0 ? 0 : pv[i - 1] + 1);
        }
        keel_adamw_set(st->opt.adamw, step + 1, 1e-2);
        if (keel_step_write_positions(st, pv) || keel_step_run(st, iv, tv, NULL, NULL)) goto done;
        o->loss[step] = hash_tensor(0xcbf29ce484222325ull, be, st->out.loss);
        uint64_t h = 0xcbf29ce484222325ull;
        for (int i = 0; i < m->n_params; i++) h = hash_tensor(h, be, keel_step_grad(st, i));
        o->grads[step] = h;
    }
    o->params = 0xcbf29ce484222325ull;
    for (int i = 0; i < m->n_params; i++) o->params = hash_tensor(o->params, be, m->params[i]);
    rc = 0;
done:
    if (rc) fprintf(stderr, "keel test-recompute: %s: %s\n", mode, keel_last_error());
    keel_step_free(st);
    keel_backend_free(be);
    return rc;
}

static int check_model(const char *what, const keel_qwen35_config *cfg, const keel_checkpoint *ck, int *pass,
                       int *fail) {
    static const struct {
        const char *mode;
        int threads;
    } runs[] = {
        {"off", 2}, {"full", 2}, {"every:2", 2}, {"layers:1,3", 2}, {"off", 1}, {"full", 1},
    };
    outcome base, o;
    printf("%s\n%-12s %7s %12s %12s %7s  %s\n", what, "mode", "threads", "planned", "activations", "clones",
           "loss, gradients (3 steps), parameters vs off");
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        outcome *x = r == 0 ? &base : &o;
        if (run_mode(cfg, ck, runs[r].mode, runs[r].threads, x)) {
            (*fail)++;
            continue;
        }
        bool same = true;
        for (int k = 0; k < STEPS; k++) same = same && x->loss[k] == base.loss[k] && x->grads[k] == base.grads[k];
        same = same && x->params == base.params;
        bool rewrote = strcmp(runs[r].mode, "off") == 0 || x->clones > 0;
        printf("%-12s %7d %9.2f MiB %9.2f MiB %7lld  %s\n", runs[r].mode, runs[r].threads,
               (double)x->planned / 1048576.0, (double)x->activations / 1048576.0, (long long)x->clones,
               r == 0            ? "(the reference)"
               : same && rewrote ? "bitwise identical"
               : !rewrote        ? "NOT REWRITTEN"
                                 : "DIFFERENT");
        if (r > 0) {
            if (same && rewrote)
                (*pass)++;
            else
                (*fail)++;
        }
    }
    return 0;
}

int cmd_test_recompute(int argc, char **argv) {
    const char *fixture = NULL, *prec_s = "f32";
    const cli_flag flags[] = {
        {"--fixture", CLI_STR, &fixture, .meta = "CHECKPOINT", .help = "also check this checkpoint's model"},
        {"--backend", CLI_STR, &backend_name, .meta = "B", .help = "ref, cpu or cuda (default cpu)"},
        {"--precision", CLI_STR, &prec_s, .meta = "f32|bf16", .help = "bf16: mixed-precision products (default f32)"},
    };
    const cli_spec spec = {"keel test-recompute",
                           "recompute modes off, full, every:2, layers:1,3 give bitwise identical training", flags,
                           (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    if (keel_precision_parse(prec_s, &precision)) {
        fprintf(stderr, "keel test-recompute: %s\n", keel_last_error());
        return 2;
    }
    int pass = 0, fail = 0;
    printf("backend %s, precision %s\n", backend_name, prec_s);
    if (fixture) {
        keel_checkpoint *ck = keel_checkpoint_open(fixture);
        if (!ck) {
            fprintf(stderr, "keel test-recompute: %s\n", keel_last_error());
            return 2;
        }
        check_model(fixture, &ck->cfg, ck, &pass, &fail);
        keel_checkpoint_close(ck);
    }
    keel_qwen35_config c = {.vocab = 97,
                            .hidden = 32,
                            .layers = 8,
                            .ffn = 48,
                            .heads = 4,
                            .kv_heads = 2,
                            .head_dim = 8,
                            .lk_heads = 2,
                            .lv_heads = 4,
                            .lk_dim = 8,
                            .lv_dim = 8,
                            .conv_kernel = 4,
                            .rope_theta = 10000.0,
                            .partial_rotary = 0.5,
                            .rms_eps = 1e-6,
                            .tied = false};
    for (int i = 0; i < 8; i++) c.full_attention[i] = (i + 1) % 4 == 0;
    check_model("random 8-layer model (6 Gated DeltaNet + 2 gated attention layers, untied head)", &c, NULL, &pass,
                &fail);
    packed = true;
    check_model("the random model on packed windows (examples of 1 to 9 tokens)", &c, NULL, &pass, &fail);
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
