#include "train/decode.h"

#include <stdlib.h>
#include <string.h>

#include "model/qwen35.h"
#include "ops/ops.h"
#include "train/step.h"
#include "util/error.h"

struct keel_decoder {
    keel_step *w; /* the weights, placed once; decoding graphs are built in its context */
    keel_ctx *ctx;
    keel_qwen35 *m;
    keel_backend *be;
    float *k[KEEL_QWEN35_MAX_LAYERS], *v[KEEL_QWEN35_MAX_LAYERS], *S[KEEL_QWEN35_MAX_LAYERS],
        *conv[KEEL_QWEN35_MAX_LAYERS];
    int64_t seen; /* tokens in the caches */
};

static keel_tensor *leaf(keel_ctx *ctx, int64_t a, int64_t b, int64_t c, int64_t d) {
    return keel_set_flags(keel_new_4d(ctx, KEEL_F32, a, b, c, d), KEEL_FLAG_INPUT);
}

static bool has_deltanet(const keel_qwen35_config *c) {
    for (int i = 0; i < c->layers; i++)
        if (!c->full_attention[i]) return true;
    return false;
}

/* Runs n tokens from position dec->seen; writes the last position's logits. */
int keel_decoder_run(keel_decoder *d, const int32_t *ids, int64_t n, float *last_logits) {
    const keel_qwen35_config *c = &d->m->cfg;
    int64_t C = 2 * c->lk_heads * c->lk_dim + c->lv_heads * c->lv_dim, K = c->conv_kernel;
    keel_qwen35_cache in = {0}, out;
    keel_tensor *ti = keel_set_flags(keel_new_2d(d->ctx, KEEL_I32, n, 1), KEEL_FLAG_INPUT);
    keel_tensor *tp = keel_set_flags(keel_new_2d(d->ctx, KEEL_I32, n, 1), KEEL_FLAG_INPUT);
    /* the convolution reads [its K-1 cached inputs | the new tokens]: their positions */
    in.conv_pos = keel_set_flags(keel_new_2d(d->ctx, KEEL_I32, K - 1 + n, 1), KEEL_FLAG_INPUT);
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
    int32_t *pv = malloc((size_t)(K - 1 + n) * sizeof *pv);
    if (!pv) {
        keel_fail("out of memory");
        goto done;
    }
    for (int64_t i = 0; i < K - 1 + n; i++) { /* cached inputs from before the start: 0 (never read) */
        int64_t p = d->seen - (K - 1) + i;
        pv[i] = (int32_t)(p < 0 ? 0 : p);
    }
    rc = keel_tensor_write(d->be, ti, ids, KEEL_I32) || keel_tensor_write(d->be, tp, pv + (K - 1), KEEL_I32) ||
         (has_deltanet(c) && keel_tensor_write(d->be, in.conv_pos, pv, KEEL_I32));
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
    rc = all ? keel_tensor_read(d->be, logits, all, KEEL_F32)
             : keel_fail("out of memory for %lld logits", (long long)keel_nelements(logits));
    if (!rc) memcpy(last_logits, all + (n - 1) * c->vocab, (size_t)c->vocab * sizeof *all);
    free(all);
    for (int i = 0; i < c->layers && !rc; i++) { /* the new state, back to the host */
        keel_tensor *x[4] = {out.k[i], out.v[i], out.S[i], out.conv[i]};
        float **dst[4] = {&d->k[i], &d->v[i], &d->S[i], &d->conv[i]};
        for (int j = 0; j < 4 && !rc; j++) {
            if (!x[j]) continue;
            float *grown = realloc(*dst[j], (size_t)keel_nelements(x[j]) * sizeof(float));
            if (!grown) { /* the old state stays the decoder's, freed with it */
                rc = keel_fail("out of memory for layer %d's decoding state", i);
                break;
            }
            *dst[j] = grown;
            rc = keel_tensor_read(d->be, x[j], *dst[j], KEEL_F32);
        }
    }
    d->seen += n;
done:
    keel_session_free(s);
    keel_graph_free(g);
    return rc ? -1 : 0;
}

keel_decoder *keel_decoder_new(const keel_checkpoint *ck, const keel_adapter *ad, keel_backend *be) {
    keel_decoder *d = calloc(1, sizeof *d);
    if (!d) {
        keel_fail("out of memory");
        return NULL;
    }
    d->be = be;
    keel_step_opts wo = {.cfg = &ck->cfg, .type = KEEL_F32, .weights_only = true, .adapter = ad};
    if (!(d->w = keel_step_build(&wo)) || keel_step_place(d->w, be) || keel_step_load(d->w, ck)) {
        keel_decoder_free(d);
        return NULL;
    }
    d->ctx = d->w->ctx, d->m = d->w->m;
    for (int i = 0; i < d->m->n_params; i++)
        d->m->params[i]->flags |= KEEL_FLAG_BOUND; /* placed: later graphs reuse them */
    for (int i = 0; d->m->lora && i < d->m->lora->n_params; i++) d->m->lora->params[i]->flags |= KEEL_FLAG_BOUND;
    const keel_qwen35_config *cf = &ck->cfg;
    int64_t C = 2 * cf->lk_heads * cf->lk_dim + cf->lv_heads * cf->lv_dim;
    for (int i = 0; i < cf->layers; i++)
        if (!cf->full_attention[i]) { /* DeltaNet states start at zero */
            d->S[i] = calloc((size_t)(cf->lv_dim * cf->lk_dim * cf->lv_heads), sizeof(float));
            d->conv[i] = calloc((size_t)(C * (cf->conv_kernel - 1)), sizeof(float));
            if (!d->S[i] || !d->conv[i]) {
                keel_decoder_free(d);
                keel_fail("out of memory for the decoding state");
                return NULL;
            }
        }
    return d;
}

void keel_decoder_free(keel_decoder *d) {
    if (!d) return;
    for (int i = 0; i < KEEL_QWEN35_MAX_LAYERS; i++) free(d->k[i]), free(d->v[i]), free(d->S[i]), free(d->conv[i]);
    keel_step_free(d->w);
    free(d);
}

/* The ordinary forward pass over the whole sequence: logits at every position. */
float *keel_decoder_full_logits(keel_decoder *d, const int32_t *ids, int64_t T) {
    keel_tensor *ti = keel_set_flags(keel_new_2d(d->ctx, KEEL_I32, T, 1), KEEL_FLAG_INPUT);
    keel_tensor *tp = keel_set_flags(keel_new_1d(d->ctx, KEEL_I32, T), KEEL_FLAG_INPUT);
    keel_qwen35_out out;
    if (keel_qwen35_forward(d->ctx, d->m, ti, tp, NULL, &out)) return NULL;
    keel_graph *g = keel_graph_build(d->ctx, &out.logits, 1);
    keel_session *s = g ? keel_session_new(d->be, g, NULL) : NULL;
    float *lg = NULL;
    int32_t *pv = malloc((size_t)T * sizeof *pv);
    if (!pv) keel_fail("out of memory for %lld positions", (long long)T);
    for (int64_t i = 0; pv && i < T; i++) pv[i] = (int32_t)i;
    if (s && pv && !keel_tensor_write(d->be, ti, ids, KEEL_I32) && !keel_tensor_write(d->be, tp, pv, KEEL_I32) &&
        !keel_session_run(s, NULL, NULL)) {
        lg = malloc((size_t)keel_nelements(out.logits) * sizeof *lg);
        if (!lg) keel_fail("out of memory for %lld logits", (long long)keel_nelements(out.logits));
        if (lg && keel_tensor_read(d->be, out.logits, lg, KEEL_F32)) free(lg), lg = NULL;
    }
    free(pv);
    keel_session_free(s);
    keel_graph_free(g);
    return lg;
}
