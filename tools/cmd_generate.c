/* keel generate: sample text from a checkpoint with incremental decoding: the prompt runs once,
 * then each new token runs alone against the attention layers' key/value cache and the DeltaNet
 * layers' recurrent and convolution states. --verify also runs the whole sequence through the
 * ordinary forward pass and checks that both give the same choices and logits. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "tokenizer/tokenizer.h"
#include "train/step.h"
#include "util/error.h"

typedef struct {
    double p;
    int32_t id;
} cand;
static int by_p(const void *a, const void *b) {
    double x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return (x < y) - (x > y);
}

typedef struct {
    keel_ctx *ctx;
    keel_qwen35 *m;
    keel_backend *be;
    float *k[KEEL_QWEN35_MAX_LAYERS], *v[KEEL_QWEN35_MAX_LAYERS], *S[KEEL_QWEN35_MAX_LAYERS],
        *conv[KEEL_QWEN35_MAX_LAYERS];
    int64_t seen; /* tokens in the caches */
} decoder;

static keel_tensor *leaf(keel_ctx *ctx, int64_t a, int64_t b, int64_t c, int64_t d) {
    return keel_set_flags(keel_new_4d(ctx, KEEL_F32, a, b, c, d), KEEL_FLAG_INPUT);
}

/* Runs n tokens from position dec->seen; writes the last position's logits. */
static int run_tokens(decoder *d, const int32_t *ids, int64_t n, float *last_logits) {
    const keel_qwen35_config *c = &d->m->cfg;
    int64_t C = 2 * c->lk_heads * c->lk_dim + c->lv_heads * c->lv_dim, K = c->conv_kernel;
    keel_qwen35_cache in = {0}, out;
    keel_tensor *ti = keel_set_flags(keel_new_2d(d->ctx, KEEL_I32, n, 1), KEEL_FLAG_INPUT);
    keel_tensor *tp = keel_set_flags(keel_new_1d(d->ctx, KEEL_I32, n), KEEL_FLAG_INPUT);
    for (int i = 0; i < c->layers; i++) {
        if (c->full_attention[i]) {
            if (d->seen)
                in.k[i] = leaf(d->ctx, c->head_dim, c->kv_heads, d->seen, 1),
                in.v[i] = leaf(d->ctx, c->head_dim, c->kv_heads, d->seen, 1);
        } else {
            in.S[i] = leaf(d->ctx, c->lv_dim, c->lk_dim, c->lv_heads, 1);
            in.conv[i] = leaf(d->ctx, C, K - 1, 1, 1);
        }
    }
    keel_tensor *logits = keel_qwen35_forward_cached(d->ctx, d->m, ti, tp, &in, &out);
    if (!logits) return -1;
    keel_tensor *outs[4 * KEEL_QWEN35_MAX_LAYERS + 1];
    int no = 0;
    outs[no++] = logits;
    for (int i = 0; i < c->layers; i++) {
        keel_tensor *x[4] = {out.k[i], out.v[i], out.S[i], out.conv[i]};
        for (int j = 0; j < 4; j++)
            if (x[j]) outs[no++] = x[j];
    }
    keel_graph *g = keel_graph_build(d->ctx, outs, no);
    keel_session *s = g ? keel_session_new(d->be, g, NULL) : NULL;
    int rc = -1;
    if (!s) goto done;
    int32_t *pv = malloc((size_t)n * sizeof *pv);
    for (int64_t i = 0; i < n; i++) pv[i] = (int32_t)(d->seen + i);
    rc = keel_tensor_write(d->be, ti, ids, KEEL_I32) || keel_tensor_write(d->be, tp, pv, KEEL_I32);
    free(pv);
    for (int i = 0; i < c->layers && !rc; i++) {
        if (c->full_attention[i]) {
            if (d->seen)
                rc = keel_tensor_write(d->be, in.k[i], d->k[i], KEEL_F32) ||
                     keel_tensor_write(d->be, in.v[i], d->v[i], KEEL_F32);
        } else {
            rc = keel_tensor_write(d->be, in.S[i], d->S[i], KEEL_F32) ||
                 keel_tensor_write(d->be, in.conv[i], d->conv[i], KEEL_F32);
        }
    }
    if (rc || keel_session_run(s, NULL, NULL)) {
        rc = -1;
        goto done;
    }
    float *all = malloc((size_t)keel_nelements(logits) * sizeof *all);
    rc = keel_tensor_read(d->be, logits, all, KEEL_F32);
    memcpy(last_logits, all + (n - 1) * c->vocab, (size_t)c->vocab * sizeof *all);
    free(all);
    for (int i = 0; i < c->layers && !rc; i++) { /* the new state, back to the host */
        keel_tensor *x[4] = {out.k[i], out.v[i], out.S[i], out.conv[i]};
        float **dst[4] = {&d->k[i], &d->v[i], &d->S[i], &d->conv[i]};
        for (int j = 0; j < 4 && !rc; j++) {
            if (!x[j]) continue;
            *dst[j] = realloc(*dst[j], (size_t)keel_nelements(x[j]) * sizeof(float));
            rc = keel_tensor_read(d->be, x[j], *dst[j], KEEL_F32);
        }
    }
    d->seen += n;
done:
    keel_session_free(s);
    keel_graph_free(g);
    return rc ? -1 : 0;
}

static int32_t pick(const float *lg, int64_t V, double temp, double top_p, uint64_t *r, cand *c) {
    int32_t next = 0;
    if (temp == 0) {
        for (int64_t k = 1; k < V; k++)
            if (lg[k] > lg[next]) next = (int32_t)k;
        return next;
    }
    double mx = -INFINITY, z = 0, cum = 0;
    for (int64_t k = 0; k < V; k++) mx = fmax(mx, lg[k] / temp);
    for (int64_t k = 0; k < V; k++) c[k] = (cand){exp(lg[k] / temp - mx), (int32_t)k}, z += c[k].p;
    qsort(c, (size_t)V, sizeof *c, by_p);
    int64_t keep = 0;
    while (keep < V && cum < top_p * z) cum += c[keep++].p;
    *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
    double u = (double)(*r >> 11) / 9007199254740992.0 * cum;
    next = c[keep - 1].id;
    for (int64_t k = 0; k < keep; k++)
        if ((u -= c[k].p) <= 0) {
            next = c[k].id;
            break;
        }
    return next;
}

/* The ordinary forward pass over the whole sequence: logits at every position. */
static float *full_logits(decoder *d, const int32_t *ids, int64_t T) {
    keel_tensor *ti = keel_set_flags(keel_new_2d(d->ctx, KEEL_I32, T, 1), KEEL_FLAG_INPUT);
    keel_tensor *tp = keel_set_flags(keel_new_1d(d->ctx, KEEL_I32, T), KEEL_FLAG_INPUT);
    keel_qwen35_out out;
    if (keel_qwen35_forward(d->ctx, d->m, ti, tp, NULL, &out)) return NULL;
    keel_graph *g = keel_graph_build(d->ctx, &out.logits, 1);
    keel_session *s = g ? keel_session_new(d->be, g, NULL) : NULL;
    float *lg = NULL;
    int32_t *pv = malloc((size_t)T * sizeof *pv);
    for (int64_t i = 0; i < T; i++) pv[i] = (int32_t)i;
    if (s && !keel_tensor_write(d->be, ti, ids, KEEL_I32) && !keel_tensor_write(d->be, tp, pv, KEEL_I32) &&
        !keel_session_run(s, NULL, NULL)) {
        lg = malloc((size_t)keel_nelements(out.logits) * sizeof *lg);
        if (keel_tensor_read(d->be, out.logits, lg, KEEL_F32)) free(lg), lg = NULL;
    }
    free(pv);
    keel_session_free(s);
    keel_graph_free(g);
    return lg;
}

/* "1,2,3" -> ids; -1 with a message naming the bad entry. */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    while (*ids && *s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(*ids), *ids = NULL;
            return keel_fail("--prompt-ids: '%s' is not a list of token ids (N,N,...)", s);
        }
        if (*n == cap) {
            int32_t *g = realloc(*ids, (cap *= 2) * sizeof **ids);
            if (!g) break;
            *ids = g;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return *ids ? 0 : keel_fail("out of memory");
}

/* The prompt's logits at every position, with its ids, as safetensors (input_ids [T], logits [T,V]). */
static int dump_logits(decoder *d, const int32_t *ids, int64_t T, const char *path) {
    float *lg = full_logits(d, ids, T);
    if (!lg) return -1;
    keel_st_entry e[2] = {
        {.name = "input_ids", .type = KEEL_I32, .n_dims = 1, .shape = {T}, .raw = ids, .raw_dtype = "I32"},
        {.name = "logits",
         .type = KEEL_F32,
         .n_dims = 2,
         .shape = {T, d->m->cfg.vocab},
         .raw = lg,
         .raw_dtype = "F32"}};
    int rc = keel_st_write(path, e, 2);
    free(lg);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *prompt = "", *backend = "cpu", *prompt_ids = NULL, *dump = NULL;
    bool print_ids = false;
    long long max_tokens = 64, seed = 1, threads = 2;
    double temp = 0.8, top_p = 0.95;
    bool verify = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v)
            model = v, i++;
        else if (!strcmp(a, "--tokenizer") && v)
            tokp = v, i++;
        else if (!strcmp(a, "--prompt") && v)
            prompt = v, i++;
        else if (!strcmp(a, "--backend") && v)
            backend = v, i++;
        else if (!strcmp(a, "--max-tokens")) {
            if ((max_tokens = cli_int(a, v, 1)) < 0) return 2;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if ((seed = cli_int(a, v, 0)) < 0) return 2;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if ((threads = cli_int(a, v, 1)) < 0) return 2;
            i++;
        } else if (!strcmp(a, "--temperature") && v)
            temp = atof(v), i++;
        else if (!strcmp(a, "--top-p") && v)
            top_p = atof(v), i++;
        else if (!strcmp(a, "--verify"))
            verify = true;
        else if (!strcmp(a, "--prompt-ids") && v)
            prompt_ids = v, i++;
        else if (!strcmp(a, "--print-ids"))
            print_ids = true;
        else if (!strcmp(a, "--dump-logits") && v)
            dump = v, i++;
        else {
            fprintf(stderr,
                    "usage: keel generate --model DIR --prompt TEXT [--max-tokens N] [--temperature X] [--top-p P] "
                    "[--seed N]\n"
                    "                     [--tokenizer FILE] [--backend cpu|cuda|ref] [--threads N] [--verify]\n"
                    "                     [--prompt-ids N,N,...] [--print-ids] [--dump-logits FILE.safetensors]\n"
                    "keel generate: unknown or incomplete option '%s'\n",
                    a);
            return 2;
        }
    }
    if (!model || temp < 0 || top_p <= 0 || top_p > 1) {
        fprintf(stderr, "keel generate: --model DIR is required; --temperature >= 0; 0 < --top-p <= 1\n");
        return 2;
    }
    keel_checkpoint *ck = keel_checkpoint_open(model);
    if (!ck) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        return 1;
    }
    bool tok_failed;
    keel_tokenizer *tok = keel_tokenizer_for(tokp, model, &tok_failed);
    if (tok_failed) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        keel_checkpoint_close(ck);
        return 1;
    }
    int32_t *pids = NULL;
    size_t np = 0;
    if (prompt_ids) {
        if (parse_ids(prompt_ids, &pids, &np)) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            keel_tokenizer_free(tok);
            keel_checkpoint_close(ck);
            return 2;
        }
    } else if (tok) {
        if (keel_tokenizer_encode(tok, prompt, strlen(prompt), &pids, &np)) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            return 1;
        }
    } else {
        np = strlen(prompt);
        pids = malloc((np + 1) * sizeof *pids);
        for (size_t i = 0; i < np; i++) pids[i] = (unsigned char)prompt[i];
    }
    if (np == 0) {
        pids = realloc(pids, sizeof *pids), pids[0] = tok ? keel_tokenizer_added_id(tok, "<|endoftext|>") : 0, np = 1;
    }
    int64_t V = ck->cfg.vocab, T = (int64_t)np + max_tokens;
    for (size_t i = 0; i < np; i++)
        if (pids[i] < 0 || pids[i] >= V) {
            fprintf(stderr, "keel generate: prompt token %d is outside the model's vocabulary %lld\n", pids[i],
                    (long long)V);
            return 1;
        }
    decoder d = {.be = keel_backend_new(backend, (int)threads)};
    keel_step_opts wo = {.cfg = &ck->cfg, .type = KEEL_F32, .weights_only = true};
    keel_step *ws =
        d.be ? keel_step_build(&wo) : NULL; /* the weights, placed once; decoding graphs share its context */
    if (ws && keel_step_place(ws, d.be)) keel_step_free(ws), ws = NULL;
    if (ws) d.ctx = ws->ctx, d.m = ws->m;
    int rc = 1;
    int32_t *seq = calloc((size_t)T, sizeof *seq);
    float *lg = malloc((size_t)V * sizeof *lg), *lg_all = malloc((size_t)(V * T) * sizeof *lg_all);
    cand *c = malloc((size_t)V * sizeof *c);
    if (!ws || keel_checkpoint_load(ck, d.m, d.be)) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        goto done;
    }
    for (int i = 0; i < d.m->n_params; i++) d.m->params[i]->flags |= KEEL_FLAG_BOUND;
    const keel_qwen35_config *cf = &ck->cfg;
    int64_t C = 2 * cf->lk_heads * cf->lk_dim + cf->lv_heads * cf->lv_dim;
    for (int i = 0; i < cf->layers; i++)
        if (!cf->full_attention[i]) {
            d.S[i] = calloc((size_t)(cf->lv_dim * cf->lk_dim * cf->lv_heads), sizeof(float));
            d.conv[i] = calloc((size_t)(C * (cf->conv_kernel - 1)), sizeof(float));
        }
    memcpy(seq, pids, np * sizeof *seq);
    uint64_t r = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    int64_t len = (int64_t)np;
    if (run_tokens(&d, seq, len, lg)) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        goto done;
    }
    while (len < T) {
        memcpy(lg_all + len * V, lg, (size_t)V * sizeof *lg); /* the logits that chose token len */
        seq[len] = pick(lg, V, temp, top_p, &r, c);
        len++;
        if (len < T && run_tokens(&d, &seq[len - 1], 1, lg)) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            goto done;
        }
    }
    if (dump && dump_logits(&d, pids, (int64_t)np, dump)) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        goto done;
    }
    char *text = NULL;
    size_t tl = 0;
    if (print_ids)
        for (int64_t i = 0; i < len; i++) printf("%d%c", seq[i], i + 1 < len ? ',' : '\n');
    else if (tok && keel_tokenizer_decode(tok, seq, (size_t)len, &text, &tl) == 0)
        fwrite(text, 1, tl, stdout);
    else
        for (int64_t i = 0; i < len; i++) putchar(seq[i] >= 32 && seq[i] < 127 ? seq[i] : seq[i] == '\n' ? '\n' : '?');
    if (!print_ids) putchar('\n');
    free(text);
    rc = 0;
    if (verify) { /* the same sequence through the ordinary forward pass */
        float *full = full_logits(&d, seq, T);
        double worst = 0;
        int64_t differ = 0;
        for (int64_t p = (int64_t)np; p < T && full; p++) {
            const float *a = full + (p - 1) * V, *b = lg_all + p * V;
            double num = 0, den = 0;
            int32_t ia = 0, ib = 0;
            for (int64_t k = 0; k < V; k++) {
                num += ((double)a[k] - b[k]) * ((double)a[k] - b[k]), den += (double)a[k] * a[k];
                if (a[k] > a[ia]) ia = (int32_t)k;
                if (b[k] > b[ib]) ib = (int32_t)k;
            }
            worst = fmax(worst, sqrt(num / den));
            differ += ia != ib;
        }
        printf("verify: incremental vs full forward over %lld generated positions: worst relative logits error %.2e, "
               "%lld positions whose top token differs\n",
               (long long)(T - (int64_t)np), worst, (long long)differ);
        if (!full || worst > 1e-5 || differ) rc = 1;
        free(full);
    }
done:
    for (int i = 0; i < KEEL_QWEN35_MAX_LAYERS; i++) free(d.k[i]), free(d.v[i]), free(d.S[i]), free(d.conv[i]);
    free(seq), free(lg), free(lg_all), free(c), free(pids);
    keel_step_free(ws);
    keel_backend_free(d.be);
    keel_tokenizer_free(tok);
    keel_checkpoint_close(ck);
    return rc;
}
