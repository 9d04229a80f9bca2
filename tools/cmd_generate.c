/* keel generate: sample text from a checkpoint. This version runs the whole window forward for
 * every new token (the prefix is recomputed); incremental decoding with the attention KV cache and
 * the DeltaNet states is still to come. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "cli.h"
#include "io/checkpoint.h"
#include "ops/ops.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

typedef struct { double p; int32_t id; } cand;
static int by_p(const void *a, const void *b) {
    double x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return (x < y) - (x > y);
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *prompt = "";
    long long max_tokens = 64, seed = 1, threads = 2;
    double temp = 0.8, top_p = 0.95;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) model = v, i++;
        else if (!strcmp(a, "--tokenizer") && v) tokp = v, i++;
        else if (!strcmp(a, "--prompt") && v) prompt = v, i++;
        else if (!strcmp(a, "--max-tokens")) { if ((max_tokens = cli_int(a, v, 1)) < 0) return 2; i++; }
        else if (!strcmp(a, "--seed")) { if ((seed = cli_int(a, v, 0)) < 0) return 2; i++; }
        else if (!strcmp(a, "--threads")) { if ((threads = cli_int(a, v, 1)) < 0) return 2; i++; }
        else if (!strcmp(a, "--temperature") && v) temp = atof(v), i++;
        else if (!strcmp(a, "--top-p") && v) top_p = atof(v), i++;
        else {
            fprintf(stderr, "usage: keel generate --model DIR --prompt TEXT [--max-tokens N] [--temperature X] [--top-p P] [--seed N] [--tokenizer FILE]\n"
                            "keel generate: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    if (!model || temp < 0 || top_p <= 0 || top_p > 1) { fprintf(stderr, "keel generate: --model DIR is required; --temperature >= 0; 0 < --top-p <= 1\n"); return 2; }
    keel_checkpoint *ck = keel_checkpoint_open(model);
    if (!ck) { fprintf(stderr, "keel generate: %s\n", keel_last_error()); return 1; }
    char tp[4200];
    struct stat st;
    snprintf(tp, sizeof tp, "%s/tokenizer.json", model);
    keel_tokenizer *tok = tokp ? keel_tokenizer_load(tokp) : stat(tp, &st) == 0 ? keel_tokenizer_load(tp) : NULL;
    if ((tokp || stat(tp, &st) == 0) && !tok) { fprintf(stderr, "keel generate: %s\n", keel_last_error()); return 1; }
    int32_t *pids = NULL;
    size_t np = 0;
    if (tok) {
        if (keel_tokenizer_encode(tok, prompt, strlen(prompt), &pids, &np)) { fprintf(stderr, "keel generate: %s\n", keel_last_error()); return 1; }
    } else {
        np = strlen(prompt);
        pids = malloc((np + 1) * sizeof *pids);
        for (size_t i = 0; i < np; i++) pids[i] = (unsigned char)prompt[i];
    }
    if (np == 0) { pids = realloc(pids, sizeof *pids), pids[0] = 0, np = 1; } /* start from end-of-text */
    int64_t T = (int64_t)np + max_tokens, V = ck->cfg.vocab;
    keel_ctx *ctx = keel_ctx_new();
    keel_qwen35 *m = keel_qwen35_new(ctx, &ck->cfg, KEEL_F32);
    keel_tensor *ids = keel_set_flags(keel_new_2d(ctx, KEEL_I32, T, 1), KEEL_FLAG_INPUT);
    keel_tensor *pos = keel_set_flags(keel_new_1d(ctx, KEEL_I32, T), KEEL_FLAG_INPUT);
    keel_qwen35_out out;
    keel_backend *be = keel_backend_new("cpu", (int)threads);
    keel_graph *g = NULL;
    keel_session *s = NULL;
    int rc = 1;
    if (!m || keel_qwen35_forward(ctx, m, ids, pos, NULL, &out) || !(g = keel_graph_build(ctx, &out.logits, 1)) ||
        !(s = keel_session_new(be, g, NULL)) || keel_checkpoint_load(ck, m, be)) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        goto done;
    }
    int32_t *buf = calloc((size_t)T, sizeof *buf), *pv = malloc((size_t)T * sizeof *pv);
    float *logits = malloc((size_t)(V * T) * sizeof *logits);
    cand *c = malloc((size_t)V * sizeof *c);
    memcpy(buf, pids, np * sizeof *buf);
    for (int64_t i = 0; i < T; i++) pv[i] = (int32_t)i;
    keel_tensor_write(be, pos, pv, KEEL_I32);
    uint64_t r = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    int64_t len = (int64_t)np;
    while (len < T) {
        if (keel_tensor_write(be, ids, buf, KEEL_I32) || keel_session_run(s, NULL, NULL) || keel_tensor_read(be, out.logits, logits, KEEL_F32)) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            break;
        }
        const float *lg = logits + (len - 1) * V;
        int32_t next = 0;
        if (temp == 0) {
            for (int64_t k = 1; k < V; k++) if (lg[k] > lg[next]) next = (int32_t)k;
        } else {
            double mx = -INFINITY, z = 0, cum = 0;
            for (int64_t k = 0; k < V; k++) mx = fmax(mx, lg[k] / temp);
            for (int64_t k = 0; k < V; k++) c[k] = (cand){exp(lg[k] / temp - mx), (int32_t)k}, z += c[k].p;
            qsort(c, (size_t)V, sizeof *c, by_p);
            int64_t keep = 0;
            while (keep < V && cum < top_p * z) cum += c[keep++].p;
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            double u = (double)(r >> 11) / 9007199254740992.0 * cum;
            next = c[keep - 1].id;
            for (int64_t k = 0; k < keep; k++) if ((u -= c[k].p) <= 0) { next = c[k].id; break; }
        }
        buf[len++] = next;
    }
    if (len == T) {
        char *text = NULL;
        size_t tl = 0;
        if (tok && keel_tokenizer_decode(tok, buf, (size_t)len, &text, &tl) == 0) fwrite(text, 1, tl, stdout);
        else for (int64_t i = 0; i < len; i++) putchar(buf[i] >= 32 && buf[i] < 127 ? buf[i] : buf[i] == '\n' ? '\n' : '?');
        putchar('\n');
        free(text);
        rc = 0;
    }
    free(buf), free(pv), free(logits), free(c);
done:
    free(pids);
    keel_session_free(s);
    keel_graph_free(g);
    keel_qwen35_free(m);
    keel_ctx_free(ctx);
    keel_backend_free(be);
    keel_tokenizer_free(tok);
    keel_checkpoint_close(ck);
    return rc;
}
