#include "train/step.h"

#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff/autodiff.h"
#include "ops/ops.h"
#include "util/error.h"

/* Frozen parameters lose the PARAM flag, so the backward pass gives them no gradient. */
static int freeze(keel_step *st, const char *pattern) {
    regex_t re;
    int e = regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB);
    if (e) {
        char msg[256];
        regerror(e, &re, msg, sizeof msg);
        return keel_fail("--freeze '%s': %s", pattern, msg);
    }
    for (int i = 0; i < st->m->n_params; i++)
        if (regexec(&re, st->m->params[i]->name, 0, NULL, 0) == 0)
            st->m->params[i]->flags &= ~(uint32_t)KEEL_FLAG_PARAM, st->n_frozen++;
    regfree(&re);
    return st->n_frozen ? 0 : keel_fail("--freeze '%s' matches no parameter", pattern);
}

bool keel_step_copies_wanted(const keel_step_opts *o) {
    return o->precision == KEEL_PRECISION_BF16 && o->type == KEEL_F32 && o->backward && !o->logits_only &&
           !o->weights_only && (!o->recompute || o->recompute->kind == KEEL_RC_OFF) && !o->lora && !o->adapter &&
           !o->freeze && !o->base_bf16;
}

/* The bf16 copies of the matrices: one leaf laid out as AdamW's group lays the decayed parameters out
 * (keel_adamw_decayed_layout over every parameter, the list keel_step_adamw is then given), and a view
 * of it for each matrix, which the model reads through SHADOW */
static int make_copies(keel_step *st, const keel_step_opts *o) {
    if (!keel_step_copies_wanted(o))
        return keel_fail("the weights' bf16 copies need --precision bf16 with recompute off and every parameter "
                         "trained (no LoRA, no adapter, no freeze)");
    keel_qwen35 *m = st->m;
    int64_t *off = malloc((size_t)m->n_params * sizeof *off);
    m->copy = calloc((size_t)m->n_params, sizeof *m->copy);
    if (!off || !m->copy) {
        free(off);
        return keel_fail("out of memory");
    }
    int64_t n = keel_adamw_decayed_layout(m->params, m->n_params, off);
    if (n < 0) {
        free(off);
        return -1;
    }
    /* an untied input embedding is read by GET_ROWS alone, in float32: no copy. It is the first
     * parameter, so the copies start at the next matrix (the conv weights, also float32 where read,
     * are few and between copied matrices: they keep theirs) */
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i] == m->embed && !m->cfg.tied) off[i] = -1;
    st->copies_start = n;
    for (int i = 0; i < m->n_params; i++)
        if (off[i] >= 0 && off[i] < st->copies_start) st->copies_start = off[i];
    st->copies =
        st->copies_start < n
            ? keel_set_flags(keel_set_name(keel_new_1d(st->ctx, KEEL_BF16, n - st->copies_start), "adamw.bf16_copies"),
                             KEEL_FLAG_INPUT)
            : NULL;
    for (int i = 0; st->copies && i < m->n_params; i++) {
        const keel_tensor *p = m->params[i];
        if (off[i] < 0) continue;
        m->copy[i] =
            keel_view_2d(st->ctx, st->copies, p->ne[0], p->ne[1], p->ne[0] * 2, (off[i] - st->copies_start) * 2);
        if (!m->copy[i]) break;
        keel_set_name(m->copy[i], "%s.bf16", p->name);
    }
    bool ok = st->copies != NULL;
    if (!ok) keel_fail("the weights' bf16 copies: the model has no matrix to copy");
    for (int i = 0; ok && i < m->n_params; i++) ok = off[i] < 0 || m->copy[i];
    free(off);
    return ok ? 0 : -1;
}

keel_step *keel_step_build(const keel_step_opts *o) {
    keel_step *st = calloc(1, sizeof *st);
    if (!st) {
        keel_fail("out of memory");
        return NULL;
    }
    st->ctx = keel_ctx_new();
    if (o->base_bf16 && !o->lora && !o->adapter) {
        keel_fail("a bf16 base is frozen: it needs LoRA adapters (--lora-rank)");
        goto fail;
    }
    if (o->lora && (o->adapter || o->freeze)) {
        keel_fail(o->freeze ? "--freeze with LoRA: the base is frozen already, only the adapters train"
                            : "LoRA options and a saved adapter together");
        goto fail;
    }
    st->m = st->ctx ? keel_qwen35_new_ex(st->ctx, o->cfg, o->type, o->base_bf16 ? KEEL_BF16 : o->type) : NULL;
    if (!st->m) goto fail;
    if (o->precision == KEEL_PRECISION_BF16) st->m->operand_type = KEEL_BF16;
    st->m->gdn_float32 = o->gdn_float32;
    if (o->weight_copies && make_copies(st, o)) goto fail;
    st->m->head_grads_in_forward = o->backward;
    if (o->lora && keel_lora_attach(st->ctx, st->m, o->lora)) goto fail;
    if (o->adapter) {
        keel_lora_opts lo = {0};
        char **names = NULL;
        int rc = keel_lora_opts_from_adapter(o->adapter, &lo, &names);
        rc = rc || keel_lora_attach(st->ctx, st->m, &lo);
        keel_lora_names_free(names, lo.n_modules);
        if (rc) goto fail;
        st->adapter = o->adapter;
    }
    if (o->weights_only) {
        int n = st->m->n_params, nl = st->m->lora ? st->m->lora->n_params : 0;
        keel_tensor **all = malloc((size_t)(n + nl) * sizeof *all);
        if (!all) {
            keel_fail("out of memory");
            goto fail;
        }
        memcpy(all, st->m->params, (size_t)n * sizeof *all);
        if (nl) memcpy(all + n, st->m->lora->params, (size_t)nl * sizeof *all);
        st->g = keel_graph_build(st->ctx, all, n + nl);
        free(all);
        if (!st->g) goto fail;
        return st;
    }
    if (keel_qwen35_inputs(st->ctx, o->window, o->batch, &st->ids, o->logits_only ? NULL : &st->tgt, &st->pos) ||
        keel_qwen35_forward(st->ctx, st->m, st->ids, st->pos, st->tgt, &st->out))
        goto fail;
    if (o->freeze && freeze(st, o->freeze)) goto fail;
    /* the outputs, in the order that fixes the node order: the loss (or the logits), then what the
     * caller reads */
    keel_tensor *outs[KEEL_QWEN35_MAX_LAYERS + 4];
    int n = 0;
    outs[n++] = o->logits_only ? st->out.logits : st->out.loss;
    if (!o->logits_only && (o->keep_logits || o->keep_hidden)) outs[n++] = st->out.logits;
    if (o->keep_hidden) {
        outs[n++] = st->out.normed;
        for (int64_t i = 0; i <= o->cfg->layers; i++) outs[n++] = st->out.hidden[i];
    }
    st->g = keel_graph_build(st->ctx, outs, n);
    if (!st->g) goto fail;
    if (o->backward && (o->logits_only ? keel_fail("a backward pass needs the loss (logits_only is set)")
                                       : keel_build_backward(st->g, st->out.loss)))
        goto fail;
    if (o->recompute && (st->clones = keel_recompute_apply(st->g, &st->out.layers, o->recompute)) < 0) goto fail;
    return st;
fail:
    keel_step_free(st);
    return NULL;
}

keel_step *keel_step_custom(void) {
    keel_step *st = calloc(1, sizeof *st);
    if (st && !(st->ctx = keel_ctx_new())) free(st), st = NULL;
    if (!st) keel_fail("out of memory");
    return st;
}

int keel_step_set_outputs(keel_step *st, keel_tensor *const *outputs, int n) {
    if (st->g) return keel_fail("the step's graph is built already");
    return (st->g = keel_graph_build(st->ctx, outputs, n)) ? 0 : -1;
}

keel_tensor *keel_step_grad(const keel_step *st, int i) { return keel_graph_grad(st->g, st->m->params[i]); }

int keel_step_adamw(keel_step *st, keel_tensor *const *params, keel_tensor *const *grads, int n, double lr,
                    double weight_decay, double clip, int64_t divisor) {
    if (!params) n = st->m->n_params;
    st->opt_p = calloc((size_t)n, sizeof *st->opt_p);
    keel_tensor **gr = calloc((size_t)n, sizeof *gr);
    if (!st->opt_p || !gr) {
        free(gr);
        return keel_fail("out of memory");
    }
    for (int i = 0; i < n; i++) {
        st->opt_p[i] = params ? params[i] : st->m->params[i];
        gr[i] = grads ? grads[i] : keel_graph_grad(st->g, st->opt_p[i]);
        if (!gr[i]) {
            free(gr);
            return keel_fail("parameter '%s' gets no gradient", st->opt_p[i]->name);
        }
    }
    st->n_opt = n;
    bool all = n == st->m->n_params; /* the copies' layout is that of every parameter in the model's order */
    for (int i = 0; all && i < n; i++) all = st->opt_p[i] == st->m->params[i];
    if (st->copies && !all) {
        free(gr);
        return keel_fail("the weights' bf16 copies need AdamW over every parameter of the model, in its order");
    }
    int rc = keel_adamw_attach(st->ctx, st->g, st->opt_p, gr, n, st->copies, st->copies_start, lr, weight_decay, clip,
                               divisor, &st->opt);
    free(gr);
    return rc;
}

int keel_step_place(keel_step *st, keel_backend *be) {
    st->be = be;
    st->s = keel_session_new(be, st->g, NULL);
    if (!st->s) return -1;
    if (!st->pos) return 0;
    int64_t T = st->pos->ne[0], B = st->pos->ne[1];
    int32_t *pv = malloc((size_t)(T * B) * sizeof *pv);
    if (!pv) return keel_fail("out of memory");
    for (int64_t i = 0; i < T * B; i++) pv[i] = (int32_t)(i % T); /* one example per column */
    int rc = keel_tensor_write(be, st->pos, pv, KEEL_I32);
    free(pv);
    for (int i = 0; i < 2 * st->n_opt && !rc; i++)
        rc = be->fill_bytes(be, st->opt.mom[i]->data, 0, keel_nbytes(st->opt.mom[i]));
    return rc ? -1 : 0;
}

int keel_step_sync_copies(keel_step *st) {
    if (!st->copies) return 0;
    const keel_qwen35 *m = st->m;
    /* each copy the graph reads (a placed view: its data set by the plan) made by the backend's copy
     * path, which CAST runs: CAST's bits, on the device. A copy nothing reads (the conv weights', read
     * in float32) is not placed and stays as it is until ADAMW_SHADOW writes it. */
    for (int i = 0; i < m->n_params; i++)
        if (m->copy[i] && m->copy[i]->data && st->be->copy(st->be, m->copy[i], m->params[i], false)) return -1;
    return 0;
}

int keel_step_load(keel_step *st, const keel_checkpoint *ck) {
    if (keel_checkpoint_load(ck, st->m, st->be) || keel_step_sync_copies(st)) return -1;
    return st->adapter ? keel_lora_load(st->m, st->be, st->adapter) : 0;
}

int keel_step_trainable(const keel_step *st, keel_tensor ***out) {
    const keel_qwen35 *m = st->m;
    int n = m->lora ? m->lora->n_params : 0;
    for (int i = 0; !m->lora && i < m->n_params; i++) n += (m->params[i]->flags & KEEL_FLAG_PARAM) != 0;
    *out = malloc((size_t)(n ? n : 1) * sizeof **out);
    if (!*out) return keel_fail("out of memory");
    if (m->lora) {
        memcpy(*out, m->lora->params, (size_t)n * sizeof **out);
        return n;
    }
    for (int i = 0, k = 0; i < m->n_params; i++)
        if (m->params[i]->flags & KEEL_FLAG_PARAM) (*out)[k++] = m->params[i];
    return n;
}

int keel_step_write_batch(keel_step *st, const int32_t *ids, const int32_t *targets) {
    if (keel_tensor_write(st->be, st->ids, ids, KEEL_I32)) return -1;
    return st->tgt && targets ? keel_tensor_write(st->be, st->tgt, targets, KEEL_I32) : 0;
}

int keel_precision_parse(const char *s, keel_precision *out) {
    if (s && !strcmp(s, "f32"))
        *out = KEEL_PRECISION_F32;
    else if (s && !strcmp(s, "bf16"))
        *out = KEEL_PRECISION_BF16;
    else
        return keel_fail("--precision '%s': expected f32 or bf16", s ? s : "");
    return 0;
}

const char *keel_precision_name(keel_precision p) { return p == KEEL_PRECISION_BF16 ? "bf16" : "f32"; }

int keel_step_write_positions(keel_step *st, const int32_t *pos) {
    return st->pos ? keel_tensor_write(st->be, st->pos, pos, KEEL_I32) : 0;
}

int keel_step_run(keel_step *st, const int32_t *ids, const int32_t *targets, keel_node_cb cb, void *ud) {
    return keel_step_write_batch(st, ids, targets) || keel_session_run(st->s, cb, ud) ? -1 : 0;
}

void keel_step_free(keel_step *st) {
    if (!st) return;
    keel_session_free(st->s);
    keel_graph_free(st->g);
    keel_qwen35_free(st->m);
    keel_ctx_free(st->ctx);
    free(st->opt_p), free(st->opt.mom);
    free(st);
}
