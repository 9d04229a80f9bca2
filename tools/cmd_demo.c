/* keel demo: trains a small Qwen3.5-family model (Gated DeltaNet and gated attention layers) from
 * scratch on a public-domain book, byte by byte, on the cpu backend with keel's autodiff and its
 * AdamW op; prints the held-out loss before and after and a generated sample. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autodiff/autodiff.h"
#include "backend/backend.h"
#include "cli.h"
#include "model/qwen35.h"
#include "ops/ops.h"
#include "util/error.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = len > 0 ? malloc((size_t)len) : NULL;
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
    fclose(f);
    *n = b ? (size_t)len : 0;
    return b;
}

typedef struct {
    keel_backend *be;
    keel_session *s;
    keel_graph *g;
    keel_tensor *ids, *tgt, *pos, *loss, *logits;
    int64_t T, B;
} trainer;

static void fill_batch(const unsigned char *text, size_t lo, size_t hi, int64_t T, int64_t B, uint64_t *rng,
                       int32_t *ids, int32_t *tgt, size_t fixed_stride) {
    for (int64_t b = 0; b < B; b++) {
        size_t span = hi - lo - (size_t)T - 1;
        size_t start = lo + (fixed_stride ? (size_t)b * fixed_stride % span : (size_t)(rng_next(rng) % span));
        for (int64_t t = 0; t < T; t++) {
            ids[b * T + t] = text[start + (size_t)t];
            tgt[b * T + t] = text[start + (size_t)t + 1];
        }
    }
}

static double forward_loss(trainer *tr, const int32_t *ids, const int32_t *tgt) {
    keel_tensor_write(tr->be, tr->ids, ids, KEEL_I32);
    keel_tensor_write(tr->be, tr->tgt, tgt, KEEL_I32);
    if (tr->be->compute(tr->be, tr->g, 0, tr->g->n_forward, NULL, NULL)) return NAN;
    float l;
    keel_tensor_read(tr->be, tr->loss, &l, KEEL_F32);
    return l;
}

static double eval_loss(trainer *tr, const unsigned char *text, size_t lo, size_t hi, int rounds) {
    int64_t n = tr->T * tr->B;
    int32_t *ids = malloc((size_t)n * 4), *tgt = malloc((size_t)n * 4);
    double sum = 0;
    for (int r = 0; r < rounds; r++) {
        uint64_t dummy = 0;
        fill_batch(text, lo + (size_t)r * 7919, hi, tr->T, tr->B, &dummy, ids, tgt, (hi - lo) / (size_t)(tr->B + 1));
        sum += forward_loss(tr, ids, tgt);
    }
    free(ids), free(tgt);
    return sum / rounds;
}

int cmd_demo(int argc, char **argv) {
    const char *path = "assets/moby-dick.txt";
    long long steps = 300, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--text") == 0 && v) path = v, i++;
        else if (strcmp(a, "--steps") == 0) { if ((steps = cli_int(a, v, 1)) < 0) return 2; i++; }
        else if (strcmp(a, "--threads") == 0) { if ((threads = cli_int(a, v, 1)) < 0) return 2; i++; }
        else {
            fprintf(stderr, "usage: keel demo [--text FILE] [--steps N] [--threads N]\nkeel demo: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    size_t n_text;
    unsigned char *text = read_file(path, &n_text);
    if (!text) {
        fprintf(stderr, "keel demo: cannot read '%s'%s\n", path,
                strcmp(path, "assets/moby-dick.txt") == 0 ? " (run scripts/fetch-assets.sh, or pass --text FILE)" : "");
        return 1;
    }
    const int64_t T = 128, B = 8;
    if (n_text < (size_t)(40 * T)) {
        fprintf(stderr, "keel demo: '%s' has %zu bytes; need at least %lld\n", path, n_text, (long long)(40 * T));
        free(text);
        return 1;
    }
    size_t split = n_text - n_text / 20; /* last 5% held out */
    keel_qwen35_config c = {.vocab = 256, .hidden = 128, .layers = 4, .ffn = 320, .heads = 4, .kv_heads = 2,
                            .head_dim = 32, .lk_heads = 2, .lv_heads = 4, .lk_dim = 32, .lv_dim = 32, .conv_kernel = 4,
                            .rope_theta = 10000.0, .partial_rotary = 0.25, .rms_eps = 1e-6, .tied = true};
    c.full_attention[3] = 1;
    keel_ctx *ctx = keel_ctx_new();
    keel_qwen35 *m = keel_qwen35_new(ctx, &c, KEEL_F32);
    trainer tr = {.T = T, .B = B};
    tr.be = keel_backend_new("cpu", (int)threads);
    tr.ids = keel_set_flags(keel_new_2d(ctx, KEEL_I32, T, B), KEEL_FLAG_INPUT);
    tr.tgt = keel_set_flags(keel_new_2d(ctx, KEEL_I32, T, B), KEEL_FLAG_INPUT);
    tr.pos = keel_set_flags(keel_new_1d(ctx, KEEL_I32, T), KEEL_FLAG_INPUT);
    keel_qwen35_out out;
    if (!m || !tr.be || keel_qwen35_forward(ctx, m, tr.ids, tr.pos, tr.tgt, &out)) {
        fprintf(stderr, "keel demo: %s\n", keel_last_error());
        return 1;
    }
    tr.loss = out.loss, tr.logits = out.logits;
    out.logits->flags |= KEEL_FLAG_OUTPUT;
    keel_tensor *outs[2] = {out.loss, out.logits};
    tr.g = keel_graph_build(ctx, outs, 2);
    if (!tr.g || keel_build_backward(tr.g, out.loss)) { fprintf(stderr, "keel demo: %s\n", keel_last_error()); return 1; }
    /* AdamW steps appended after the backward pass; lr and step are set per run */
    keel_tensor **opt = calloc((size_t)m->n_params, sizeof *opt), **mom = calloc((size_t)m->n_params * 2, sizeof *mom);
    int64_t n_weights = 0;
    for (int i = 0; i < m->n_params; i++) {
        keel_tensor *p = m->params[i];
        n_weights += keel_nelements(p);
        mom[2 * i] = keel_set_flags(keel_new(ctx, KEEL_F32, 4, p->ne), KEEL_FLAG_INPUT);
        mom[2 * i + 1] = keel_set_flags(keel_new(ctx, KEEL_F32, 4, p->ne), KEEL_FLAG_INPUT);
        double wd = p->ne[1] > 1 ? 0.01 : 0.0; /* no decay on norms, biases and gates */
        opt[i] = keel_adamw(ctx, p, keel_graph_grad(tr.g, p), mom[2 * i], mom[2 * i + 1], 1e-3, 0.9, 0.95, 1e-8, wd, 1);
        if (!opt[i] || keel_graph_expand(tr.g, opt[i])) { fprintf(stderr, "keel demo: %s\n", keel_last_error()); return 1; }
        opt[i]->flags |= KEEL_FLAG_OUTPUT;
    }
    tr.s = keel_session_new(tr.be, tr.g, NULL);
    if (!tr.s) { fprintf(stderr, "keel demo: %s\n", keel_last_error()); return 1; }
    double **init = keel_qwen35_init_values(m, 1);
    for (int i = 0; i < m->n_params; i++) {
        keel_tensor_write(tr.be, m->params[i], init[i], KEEL_F64);
        double *z = calloc((size_t)keel_nelements(m->params[i]), sizeof(double));
        keel_tensor_write(tr.be, mom[2 * i], z, KEEL_F64);
        keel_tensor_write(tr.be, mom[2 * i + 1], z, KEEL_F64);
        free(z), free(init[i]);
    }
    free(init);
    int32_t posv[T], *ids = malloc((size_t)(T * B) * 4), *tgt = malloc((size_t)(T * B) * 4);
    for (int t = 0; t < T; t++) posv[t] = t;
    keel_tensor_write(tr.be, tr.pos, posv, KEEL_I32);

    printf("keel demo: training a Qwen3.5-family model from scratch on %s (%zu bytes, last 5%% held out)\n", path, n_text);
    printf("model: %lld layers (3 Gated DeltaNet + 1 gated attention per 4), hidden %lld, %lld parameters, byte vocabulary\n",
           (long long)c.layers, (long long)c.hidden, (long long)n_weights);
    printf("training: %lld steps of %lld x %lld tokens, AdamW, warm-up then cosine, cpu backend, %lld threads, plan %.1f MiB\n",
           steps, (long long)B, (long long)T, threads, (double)tr.s->plan->total_bytes / 1048576.0);
    double before = eval_loss(&tr, text, split, n_text, 4);
    printf("held-out loss before: %.4f (%.3f bits/byte)\n", before, before / log(2.0));
    fflush(stdout);
    uint64_t rng = 2024;
    double t0 = now_s(), lr_max = 3e-3, lr_min = 3e-4, warm = 20, ema = 0;
    for (long long step = 1; step <= steps; step++) {
        double lr = step <= warm ? lr_max * (double)step / warm
                                 : lr_min + 0.5 * (lr_max - lr_min) * (1 + cos(3.141592653589793 * (double)(step - warm) / (double)(steps - warm + 1)));
        for (int i = 0; i < m->n_params; i++) opt[i]->fp[0] = lr, opt[i]->ip[0] = step;
        fill_batch(text, 0, split, T, B, &rng, ids, tgt, 0);
        keel_tensor_write(tr.be, tr.ids, ids, KEEL_I32);
        keel_tensor_write(tr.be, tr.tgt, tgt, KEEL_I32);
        if (keel_session_run(tr.s, NULL, NULL)) { fprintf(stderr, "keel demo: %s\n", keel_last_error()); return 1; }
        float l;
        keel_tensor_read(tr.be, tr.loss, &l, KEEL_F32);
        if (!isfinite(l)) { fprintf(stderr, "keel demo: loss is %f at step %lld\n", l, step); return 1; }
        ema = step == 1 ? l : 0.9 * ema + 0.1 * l;
        if (step % 25 == 0 || step == steps) {
            double el = now_s() - t0;
            printf("step %4lld  loss %.4f  lr %.2e  %6.0f tokens/s  %5.1fs\n", step, ema, lr, (double)(step * T * B) / el, el);
            fflush(stdout);
        }
    }
    double after = eval_loss(&tr, text, split, n_text, 4);
    printf("held-out loss after:  %.4f (%.3f bits/byte), was %.4f\n", after, after / log(2.0), before);
    /* a sample: greedy-ish sampling (temperature 0.7) from a prompt, one full window per byte */
    const char *prompt = "Call me Ishmael. ";
    int64_t len = (int64_t)strlen(prompt);
    char sample[T + 1];
    memcpy(sample, prompt, (size_t)len);
    float *logits = malloc((size_t)(256 * T * B) * sizeof(float));
    uint64_t srng = 7;
    while (len < T) {
        for (int64_t t = 0; t < T * B; t++) ids[t] = t % T < len ? (unsigned char)sample[t % T] : ' ', tgt[t] = 0;
        forward_loss(&tr, ids, tgt);
        keel_tensor_read(tr.be, tr.logits, logits, KEEL_F32);
        const float *lg = logits + (size_t)(len - 1) * 256;
        double mx = -INFINITY, z = 0, pr[256];
        for (int k = 0; k < 256; k++) mx = fmax(mx, lg[k] / 0.7);
        for (int k = 0; k < 256; k++) z += pr[k] = exp(lg[k] / 0.7 - mx);
        double u = (double)(rng_next(&srng) % 1000000) / 1e6 * z;
        int pick = 255;
        for (int k = 0; k < 256; k++) if ((u -= pr[k]) <= 0) { pick = k; break; }
        sample[len++] = (char)(pick >= 32 && pick < 127 ? pick : pick == '\n' ? ' ' : '?');
    }
    sample[len] = 0;
    printf("sample: %s\n", sample);
    free(logits), free(ids), free(tgt), free(opt), free(mom), free(text);
    keel_session_free(tr.s);
    keel_graph_free(tr.g);
    keel_qwen35_free(m);
    keel_backend_free(tr.be);
    keel_ctx_free(ctx);
    return after < before ? 0 : 1;
}
