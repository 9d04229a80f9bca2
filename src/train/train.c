#define _DEFAULT_SOURCE /* isatty, fileno */
#include "train/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "autodiff/autodiff.h"
#include "dist/collective.h"
#include "io/checkpoint.h"
#include "ops/ops.h"
#include "recompute/recompute.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace.h"
#include "dist/grad_sync.h"
#include "train/optim.h"
#include "train/step.h"
#include "train/data.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/file.h"

volatile sig_atomic_t keel_train_stop = 0;

typedef struct {
    const keel_train_opts *o;
    keel_step *st; /* the model, its step graph and session, AdamW (keel_step) */
    keel_backend *be;
    keel_tensor *sumsq;                            /* the squared gradient norm */
    keel_tensor **train_p, **grad, **acc, **acc_w; /* per trainable parameter (acc_w: the ACC into acc) */
    int n_train;
    int64_t end_fb, end_norm; /* node ranges: [0,end_fb) forward+backward(+accumulate), then the norm, then AdamW */
    int64_t step, position, tokens;
    keel_checkpoint *src;
    keel_coll *coll;      /* NULL: one process */
    keel_grad_sync *sync; /* the gradient buckets, with more than one rank */
    int rank, world;
    char tok_dir[4096], tok_file[4096]; /* the tokenizer trained with (tok_file empty: bytes) */
} trainer;

/* The node callback of a training run: the tracer (one step), and the gradient buckets' all-reduce
 * started as the backward pass completes them (the last micro-batch of a step, several ranks). */
typedef struct {
    keel_tracer *tr;
    keel_grad_sync *sync;
} step_cb;

static int on_node(keel_backend *be, const keel_tensor *node, int64_t index, void *ud) {
    step_cb *c = ud;
    if (c->tr && keel_tracer_node(be, node, index, c->tr)) return 1;
    if (c->sync && keel_grad_sync_node(c->sync, index)) return 1;
    return 0;
}

static double lr_at(const keel_train_opts *o, int64_t step) {
    if (o->warmup > 0 && step <= o->warmup) return o->lr * (double)step / (double)o->warmup;
    double span = (double)(o->steps - o->warmup), prog = span > 0 ? (double)(step - o->warmup) / span : 1.0;
    return o->lr_min + 0.5 * (o->lr - o->lr_min) * (1.0 + cos(3.141592653589793 * fmin(1.0, prog)));
}

/* ---- the trainer's state beside the checkpoint ---- */

static int write_state(const char *tmp_dir, void *ud) {
    trainer *t = ud;
    char path[4400];
    keel_st_entry *e = calloc((size_t)(2 * t->n_train), sizeof *e);
    char **names = calloc((size_t)(2 * t->n_train), sizeof *names);
    void **bufs = calloc((size_t)(2 * t->n_train), sizeof *bufs);
    int rc = 0;
    for (int i = 0; i < 2 * t->n_train && !rc; i++) {
        keel_tensor *mv = t->st->mom[i];
        size_t bytes = (size_t)keel_nelements(mv) * 4;
        bufs[i] = malloc(bytes);
        names[i] = malloc(KEEL_NAME_MAX + 8);
        if (!bufs[i] || !names[i] || keel_tensor_read(t->be, mv, bufs[i], KEEL_F32)) {
            rc = -1;
            break;
        }
        snprintf(names[i], KEEL_NAME_MAX + 8, "%s.%s", i % 2 ? "v" : "m", t->train_p[i / 2]->name);
        e[i] = (keel_st_entry){
            .name = names[i], .n_dims = 1, .shape = {keel_nelements(mv)}, .raw = bufs[i], .raw_dtype = "F32"};
    }
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp_dir);
    if (!rc) rc = keel_st_write(path, e, 2 * t->n_train);
    for (int i = 0; i < 2 * t->n_train; i++) free(bufs[i]), free(names[i]);
    free(e), free(names), free(bufs);
    if (rc) return rc;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", (double)t->step);
    cJSON_AddNumberToObject(j, "position", (double)t->position);
    cJSON_AddNumberToObject(j, "tokens", (double)t->tokens);
    cJSON_AddNumberToObject(j, "seed", (double)t->o->seed);
    cJSON_AddNumberToObject(j, "window", (double)t->o->window);
    cJSON_AddNumberToObject(j, "batch", (double)t->o->batch);
    cJSON_AddNumberToObject(j, "accum", (double)t->o->accum);
    cJSON_AddNumberToObject(j, "world", (double)t->world);
    cJSON_AddStringToObject(j, "vocabulary", t->tok_file[0] ? "tokenizer" : "bytes");
    cJSON_AddItemToObject(j, "options", keel_train_opts_json(t->o)); /* what --resume continues with */
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp_dir);
    FILE *f = fopen(path, "w");
    bool ok = f && txt && fputs(txt, f) >= 0;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok, ok = fclose(f) == 0 && ok;
    free(txt);
    if (!ok) return keel_fail("%s: cannot write the trainer state", path);
    /* the tokenizer travels with the weights, so the checkpoint is complete for generate, eval
     * and export: tokenizer.json, and its config and chat template when they are beside it */
    static const char *files[] = {"tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"};
    char src[4200];
    if (t->tok_file[0]) {
        snprintf(path, sizeof path, "%s/tokenizer.json", tmp_dir);
        if (keel_copy_file(t->tok_file, path)) return -1;
        for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
            struct stat st;
            snprintf(src, sizeof src, "%s/%s", t->tok_dir, files[i]);
            snprintf(path, sizeof path, "%s/%s", tmp_dir, files[i]);
            if (stat(src, &st) == 0 && keel_copy_file(src, path)) return -1;
        }
    }
    return 0;
}

static int save(trainer *t) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoint", t->o->out_dir);
    return keel_checkpoint_save_ex(dir, t->st->m, t->be, KEEL_F32, NULL, false, write_state, t);
}

static int read_state(trainer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return keel_fail("--resume %s: no trainer_state.json (is it a checkpoint keel train wrote?)", dir);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!j) return keel_fail("%s: invalid JSON", path);
    struct {
        const char *k;
        int64_t *dst;
        int64_t want;
        const char *flag;
    } f2[] = {
        {"step", &t->step, -1, NULL},
        {"position", &t->position, -1, NULL},
        {"tokens", &t->tokens, -1, NULL},
        {"window", NULL, t->o->window, "--window"},
        {"batch", NULL, t->o->batch, "--batch"},
        {"accum", NULL, t->o->accum, "--accum"},
        {"seed", NULL, (int64_t)t->o->seed, "--seed"},
        {"world", NULL, t->world, "--nproc (ranks)"},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof f2 / sizeof f2[0] && !rc; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, f2[i].k);
        if (!cJSON_IsNumber(v)) {
            rc = keel_fail("%s: \"%s\" missing", path, f2[i].k);
            break;
        }
        if (f2[i].dst)
            *f2[i].dst = (int64_t)v->valuedouble;
        else if ((int64_t)v->valuedouble != f2[i].want)
            rc = keel_fail("--resume %s: the run used %s %lld, this one %lld (a resumed run must match)", dir,
                           f2[i].flag, (long long)v->valuedouble, (long long)f2[i].want);
    }
    cJSON_Delete(j);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    keel_st_file *st = keel_st_open(path);
    if (!st) return -1;
    for (int i = 0; i < 2 * t->n_train && !rc; i++) {
        char nm[KEEL_NAME_MAX + 8];
        snprintf(nm, sizeof nm, "%s.%s", i % 2 ? "v" : "m", t->train_p[i / 2]->name);
        const keel_st_tensor *x = keel_st_find(st, nm);
        if (!x || strcmp(x->dtype, "F32") || x->nbytes != (size_t)keel_nelements(t->st->mom[i]) * 4)
            rc = keel_fail("%s: optimizer state '%s' missing or of the wrong size (--freeze must match the run)", path,
                           nm);
        else
            rc = t->be->write(t->be, t->st->mom[i]->data, x->data, x->nbytes);
    }
    keel_st_close(st);
    return rc;
}

/* ---- building ---- */

static int build(trainer *t, const keel_qwen35_config *cfg) {
    const keel_train_opts *o = t->o;
    keel_recompute_mode rm;
    if (keel_recompute_parse(o->recompute, &rm)) return -1;
    keel_step_opts so = {.cfg = cfg,
                         .type = KEEL_F32,
                         .batch = o->batch,
                         .window = o->window,
                         .backward = true,
                         .recompute = &rm,
                         .freeze = o->freeze};
    if (!(t->st = keel_step_build(&so))) return -1;
    if (o->freeze) printf("frozen: %d parameter tensors match '%s'\n", t->st->n_frozen, o->freeze);
    keel_qwen35 *m = t->st->m;
    int n = m->n_params;
    t->train_p = calloc((size_t)n, sizeof *t->train_p), t->grad = calloc((size_t)n, sizeof *t->grad);
    t->acc = calloc((size_t)n, sizeof *t->acc), t->acc_w = calloc((size_t)n, sizeof *t->acc_w);
    if (!t->train_p || !t->grad || !t->acc || !t->acc_w) return keel_fail("out of memory");
    for (int i = 0; i < n; i++) {
        keel_tensor *p = m->params[i];
        if (!(p->flags & KEEL_FLAG_PARAM)) continue;
        keel_tensor *gr = keel_step_grad(t->st, i);
        if (!gr) return keel_fail("parameter '%s' gets no gradient", p->name);
        t->train_p[t->n_train] = p, t->grad[t->n_train] = gr, t->n_train++;
    }
    if (t->n_train == 0) return keel_fail("every parameter is frozen: nothing to train");
    keel_graph *g = t->st->g;
    keel_tensor **G = t->grad;
    if (o->accum > 1) { /* micro-batch gradients summed in place into persistent buffers */
        for (int i = 0; i < t->n_train; i++) {
            keel_tensor *p = t->train_p[i];
            t->acc[i] = keel_set_name(keel_set_flags(keel_new(t->st->ctx, KEEL_F32, 4, p->ne), KEEL_FLAG_INPUT),
                                      "accum.%s", p->name);
            keel_tensor *a = keel_acc(t->st->ctx, t->acc[i], t->grad[i], t->acc[i]->nb[1], t->acc[i]->nb[2],
                                      t->acc[i]->nb[3], 0, true);
            if (!a || keel_graph_expand(g, a)) return -1;
            a->flags |= KEEL_FLAG_OUTPUT;
            t->acc_w[i] = a;
        }
        G = t->acc;
    }
    t->end_fb = g->n_nodes;
    for (int i = 0; i < t->n_train; i++) { /* the global gradient norm, summed in parameter order */
        keel_tensor *sq = keel_sum(t->st->ctx, keel_sqr(t->st->ctx, G[i]));
        t->sumsq = i ? keel_add(t->st->ctx, t->sumsq, sq) : sq;
    }
    if (!t->sumsq || keel_graph_expand(g, t->sumsq)) return -1;
    t->sumsq->flags |= KEEL_FLAG_OUTPUT;
    t->end_norm = g->n_nodes;
    if (keel_step_adamw(t->st, t->train_p, G, t->n_train, o->lr, o->weight_decay)) return -1;
    return keel_step_place(t->st, t->be);
}

static int init_weights(trainer *t) {
    if (t->src) return keel_checkpoint_load(t->src, t->st->m, t->be);
    return keel_qwen35_init_weights(t->st->m, t->be, t->o->seed);
}

static int zero(keel_backend *be, keel_tensor *x) { return be->fill_bytes(be, x->data, 0, keel_nbytes(x)); }

static double eval_loss(trainer *t, const keel_dataset *d) {
    int64_t T = t->o->window, B = t->o->batch, W = d->n_eval > T ? (d->n_eval - 1) / T : 0;
    if (W < B) return NAN;
    int32_t *ids = malloc((size_t)(T * B) * 4), *tgt = malloc((size_t)(T * B) * 4);
    double sum = 0;
    int64_t nb = 0;
    for (int64_t w = 0; w + B <= W && nb < t->o->eval_batches; w += B, nb++) {
        for (int64_t b = 0; b < B; b++) {
            memcpy(ids + b * T, d->eval + (w + b) * T, (size_t)T * 4);
            memcpy(tgt + b * T, d->eval + (w + b) * T + 1, (size_t)T * 4);
        }
        float l = NAN;
        if (keel_tensor_write(t->be, t->st->ids, ids, KEEL_I32) ||
            keel_tensor_write(t->be, t->st->tgt, tgt, KEEL_I32) ||
            t->be->compute(t->be, t->st->g, 0, t->st->g->n_forward, NULL, NULL) ||
            keel_tensor_read(t->be, t->st->out.loss, &l, KEEL_F32))
            break;
        sum += l;
    }
    free(ids), free(tgt);
    return nb ? sum / (double)nb : NAN;
}

/* The first parameter whose gradient holds a NaN or an infinity. */
static const char *first_nonfinite(trainer *t) {
    for (int i = 0; i < t->n_train; i++) {
        keel_tensor *g = t->o->accum > 1 ? t->acc[i] : t->grad[i];
        double *v = keel_tensor_read_f64(t->be, g);
        bool bad = false;
        for (int64_t j = 0; v && j < keel_nelements(g) && !bad; j++) bad = !isfinite(v[j]);
        free(v);
        if (bad) return t->train_p[i]->name;
    }
    return NULL;
}

int keel_train_run(const keel_train_opts *o) {
    trainer t = {.o = o};
    keel_tokenizer *tok = NULL;
    keel_dataset d = {0};
    FILE *metrics = NULL;
    int result = 1;
    keel_qwen35_config cfg;
    bool mm;
    const char *from = o->resume_dir ? o->resume_dir : o->model_dir;
    int coll_failed = 0;
    t.coll = keel_coll_from_env(o->dist_timeout, &coll_failed);
    if (coll_failed) goto fail;
    t.rank = keel_coll_rank(t.coll), t.world = keel_coll_size(t.coll);
    bool lead = t.rank == 0; /* only rank 0 prints, evaluates, writes metrics and checkpoints */
    if (!lead && !freopen("/dev/null", "w", stdout)) goto fail;
    if (!o->out_dir) {
        keel_fail("--out DIR is required");
        goto fail;
    }
    if (!o->n_data) {
        keel_fail("--data PATH is required");
        goto fail;
    }
    if (!!o->model_dir + !!o->preset + !!o->init_config + !!o->resume_dir != 1) {
        keel_fail("give exactly one of --model DIR, --preset NAME, --init CONFIG.json, --resume DIR");
        goto fail;
    }
    if (from) {
        if (!(t.src = keel_checkpoint_open(from))) goto fail;
        cfg = t.src->cfg;
    } else if (o->preset ? keel_qwen35_preset(o->preset, &cfg) : keel_hf_config_read_file(o->init_config, &cfg, &mm)) {
        goto fail;
    }
    { /* --out and its parents */
        char pth[4096];
        snprintf(pth, sizeof pth, "%s", o->out_dir);
        for (char *q = pth + 1; *q; q++)
            if (*q == '/') {
                *q = 0;
                mkdir(pth, 0755);
                *q = '/';
            }
        if (mkdir(pth, 0755) && errno != EEXIST) {
            keel_fail("--out %s: %s", o->out_dir, strerror(errno));
            goto fail;
        }
    }
    /* the tokenizer: given, or the model folder's, or bytes */
    bool tok_failed;
    tok = keel_tokenizer_for(o->tokenizer, from, &tok_failed);
    if (tok_failed) goto fail;
    if (tok) { /* where it came from, to copy it into every checkpoint */
        if (o->tokenizer)
            snprintf(t.tok_file, sizeof t.tok_file, "%s", o->tokenizer);
        else
            snprintf(t.tok_file, sizeof t.tok_file, "%.4000s/tokenizer.json", from);
        snprintf(t.tok_dir, sizeof t.tok_dir, "%s", t.tok_file);
        char *slash = strrchr(t.tok_dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(t.tok_dir, sizeof t.tok_dir, ".");
    }
    if (tok && keel_tokenizer_vocab_size(tok) > cfg.vocab) {
        keel_fail("the tokenizer has %d tokens, the model's vocabulary only %lld", keel_tokenizer_vocab_size(tok),
                  (long long)cfg.vocab);
        goto fail;
    }
    if (!tok && cfg.vocab < 256) {
        keel_fail("byte-level data needs a vocabulary of at least 256 (the model has %lld)", (long long)cfg.vocab);
        goto fail;
    }
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/tokens.cache", o->out_dir);
    if (keel_dataset_load(&d, o->data, o->n_data, tok, o->eval_fraction, o->seed, cache)) goto fail;
    int64_t W = keel_dataset_windows(&d, o->window);
    if (W < 1) {
        keel_fail("--window %lld is longer than the training data (%lld tokens)", (long long)o->window,
                  (long long)d.n_train);
        goto fail;
    }
    if (W < o->batch) {
        keel_fail("the training data has %lld windows of %lld tokens, fewer than --batch %lld", (long long)W,
                  (long long)o->window, (long long)o->batch);
        goto fail;
    }
    printf("data: %lld documents, %lld training tokens (%lld windows), %lld held out (%lld documents)%s; %s\n",
           (long long)d.n_docs, (long long)d.n_train, (long long)W, (long long)d.n_eval, (long long)d.n_eval_docs,
           d.cached ? " (cached)" : "", tok ? "model tokenizer" : "byte vocabulary");
    t.be = keel_backend_new(o->backend, (int)o->threads);
    if (!t.be || build(&t, &cfg) || init_weights(&t)) goto fail;
    const char *coll_name = NULL;
    if (t.world >
        1) { /* buckets of 25 MiB (KEEL_DIST_BUCKET_BYTES), in the order the backward pass completes the gradients */
        if (keel_coll_attach_backend(t.coll, t.be, &coll_name)) goto fail;
        const char *bb = getenv("KEEL_DIST_BUCKET_BYTES");
        long long bucket = bb && *bb ? atoll(bb) : 25ll << 20;
        if (bucket <= 0) {
            keel_fail("KEEL_DIST_BUCKET_BYTES='%s': expected a positive number of bytes", bb);
            goto fail;
        }
        t.sync = keel_grad_sync_new(t.coll, t.be, t.st->g, o->accum > 1 ? t.acc : t.grad,
                                    o->accum > 1 ? t.acc_w : t.grad, t.n_train, (size_t)bucket);
        if (!t.sync) goto fail;
    }
    if (o->resume_dir && read_state(&t, o->resume_dir)) goto fail;
    int64_t n_par = 0, n_tr = 0;
    for (int i = 0; i < t.st->m->n_params; i++) n_par += keel_nelements(t.st->m->params[i]);
    for (int i = 0; i < t.n_train; i++) n_tr += keel_nelements(t.train_p[i]);
    printf(
        "model: %lld layers, %lld parameters (%lld trained), %s backend, %lld threads, recompute %s, plan %.1f MiB\n",
        (long long)cfg.layers, (long long)n_par, (long long)n_tr, t.be->name, (long long)o->threads, o->recompute,
        (double)t.st->s->plan->total_bytes / 1048576.0);
    if (t.world > 1)
        printf("data parallel: %d ranks, batch %lld per rank, global batch %lld x %lld tokens per step; gradients in "
               "%d buckets, "
               "summed by the %s as the backward pass completes them\n",
               t.world, (long long)o->batch, (long long)(o->batch * t.world * o->accum), (long long)o->window,
               keel_grad_sync_n_buckets(t.sync), coll_name);
    if (t.step >= o->steps) {
        keel_fail("the checkpoint is at step %lld already; --steps %lld is the total", (long long)t.step,
                  (long long)o->steps);
        goto fail;
    }
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", o->out_dir);
    metrics = fopen(lead ? mp : "/dev/null", t.step ? "a" : "w");
    if (!metrics) {
        keel_fail("%s: %s", mp, strerror(errno));
        goto fail;
    }
    int32_t *ids = malloc((size_t)(o->window * o->batch) * 4), *tgt = malloc((size_t)(o->window * o->batch) * 4);
    bool tty = isatty(fileno(stdout));
    if (lead && t.step == 0 && d.n_eval > o->window) {
        double el = eval_loss(&t, &d);
        if (isfinite(el)) {
            printf("step %6lld  eval loss %.4f  perplexity %.2f\n", 0LL, el, exp(el));
            fprintf(metrics, "{\"step\": 0, \"tokens\": 0, \"eval_loss\": %.9g, \"eval_ppl\": %.9g}\n", el, exp(el));
        }
    }
    double t0 = keel_now_s();
    int64_t start_step = t.step, tokens_per_step = o->window * o->batch * o->accum * t.world;
    result = 0;
    for (int64_t step = t.step + 1; step <= o->steps; step++) {
        const char *df = getenv(
            "KEEL_DIST_FAULT"); /* exit:RANK:STEP or hang:RANK:STEP, before the step's first collective: the other ranks must notice */
        if (df && t.world > 1) {
            int fr = -1;
            long long fs = -1;
            char kind[8] = "";
            if (sscanf(df, "%4[a-z]:%d:%lld", kind, &fr, &fs) == 3 && fr == t.rank && fs == step) {
                fprintf(stderr, "keel train: rank %d: KEEL_DIST_FAULT: %s at step %lld\n", t.rank, kind, fs);
                if (!strcmp(kind, "hang"))
                    for (;;) pause();
                _exit(9);
            }
        }
        if (o->accum > 1)
            for (int i = 0; i < t.n_train; i++)
                if (zero(t.be, t.acc[i])) {
                    result = 1;
                    break;
                }
        double loss = 0;
        for (int64_t micro = 0; micro < o->accum && !result; micro++) {
            /* rank r takes the r-th share of the global micro-batch: the samples of one process with
             * --accum world, so the sum over ranks equals its accumulated gradient bit for bit */
            keel_dataset_batch(&d, o->window, o->batch, o->seed, t.position + (int64_t)t.rank * o->batch, ids, tgt);
            t.position += o->batch * t.world;
            keel_tracer *tr = o->trace && lead && step == o->trace_step && micro == 0
                                  ? keel_tracer_new(o->trace_data || o->trace_sample > 0, (size_t)o->trace_max_bytes)
                                  : NULL;
            if (tr) tr->sample = o->trace_sample;
            float l = NAN;
            step_cb cb = {tr, micro == o->accum - 1 ? t.sync : NULL};
            if (cb.sync) keel_grad_sync_begin(cb.sync);
            if (keel_tensor_write(t.be, t.st->ids, ids, KEEL_I32) ||
                keel_tensor_write(t.be, t.st->tgt, tgt, KEEL_I32) || (tr && keel_tracer_begin(tr, t.be, t.st->g)) ||
                t.be->compute(t.be, t.st->g, 0, t.end_fb, cb.tr || cb.sync ? on_node : NULL, &cb) ||
                (cb.sync && keel_grad_sync_finish(cb.sync)) || keel_tensor_read(t.be, t.st->out.loss, &l, KEEL_F32))
                result = 1;
            if (tr && !result) {
                if (keel_trace_write(tr, o->trace))
                    result = 1;
                else
                    printf("trace of step %lld (%lld nodes) written to %s\n", (long long)step, (long long)tr->n,
                           o->trace);
            }
            keel_tracer_free(tr);
            loss += l;
        }
        if (result) break;
        if (t.world > 1 && keel_coll_allreduce_sum_f64(t.coll, &loss, 1)) {
            result = 1;
            break;
        }
        loss /= (double)(o->accum * t.world);
        float sumsq = NAN;
        if (t.be->compute(t.be, t.st->g, t.end_fb, t.end_norm, NULL, NULL) ||
            keel_tensor_read(t.be, t.sumsq, &sumsq, KEEL_F32)) {
            result = 1;
            break;
        }
        double norm = sqrt((double)sumsq) / (double)(o->accum * t.world);
        if (!isfinite(loss) || !isfinite(norm)) {
            const char *bad = first_nonfinite(&t);
            keel_fail("step %lld: the loss is %g and the gradient norm %g; first non-finite gradient: %s (no "
                      "checkpoint written for this step)",
                      (long long)step, loss, norm, bad ? bad : "(none: the loss itself)");
            result = 1;
            break;
        }
        double clip_f = o->clip > 0 && norm > o->clip ? o->clip / norm : 1.0, lr = lr_at(o, step);
        keel_adamw_set(t.st->opt, t.n_train, step, lr, clip_f / (double)(o->accum * t.world));
        if (t.be->compute(t.be, t.st->g, t.end_norm, t.st->g->n_nodes, NULL, NULL)) {
            result = 1;
            break;
        }
        t.step = step;
        t.tokens += tokens_per_step;
        double el = keel_now_s() - t0, tps = (double)((step - start_step) * tokens_per_step) / el,
               eta = el / (double)(step - start_step) * (double)(o->steps - step);
        fprintf(metrics,
                "{\"step\": %lld, \"tokens\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                "\"tokens_per_s\": %.1f, \"elapsed_s\": %.2f}\n",
                (long long)step, (long long)t.tokens, loss, lr, norm, tps, el);
        if (tty)
            printf("\rstep %6lld/%lld  loss %.4f  lr %.2e  %7.0f tok/s  elapsed %6.1fs  eta %6.1fs ", (long long)step,
                   (long long)o->steps, loss, lr, tps, el, eta);
        else if (step % 10 == 0 || step == o->steps || step == start_step + 1)
            printf("step %6lld/%lld  loss %.4f  lr %.2e  grad norm %.3f  %7.0f tok/s  elapsed %.1fs  eta %.1fs\n",
                   (long long)step, (long long)o->steps, loss, lr, norm, tps, el, eta);
        fflush(stdout);
        bool last = step == o->steps, stop = keel_train_stop || (o->stop_at > 0 && step == o->stop_at);
        if (lead && ((o->eval_every > 0 && step % o->eval_every == 0) || last)) {
            double ev = eval_loss(&t, &d);
            if (isfinite(ev)) {
                if (tty) printf("\n");
                printf("step %6lld  eval loss %.4f  perplexity %.2f\n", (long long)step, ev, exp(ev));
                fprintf(metrics, "{\"step\": %lld, \"tokens\": %lld, \"eval_loss\": %.9g, \"eval_ppl\": %.9g}\n",
                        (long long)step, (long long)t.tokens, ev, exp(ev));
            }
        }
        fflush(metrics);
        if (lead && ((o->save_every > 0 && step % o->save_every == 0) || last || stop)) {
            if (save(&t)) {
                result = 1;
                break;
            }
            if (tty) printf("\n");
            printf("saved %s/checkpoint (step %lld)\n", o->out_dir, (long long)step);
        }
        if (stop && !last) {
            printf("%s after step %lld; resume with --resume %s/checkpoint\n",
                   keel_train_stop ? "interrupted: stopped" : "stopped (--stop-at)", (long long)step, o->out_dir);
            result = keel_train_stop ? 130 : 0;
            break;
        }
    }
    free(ids), free(tgt);
fail:
    if (result == 1) fprintf(stderr, "keel train: %s\n", keel_last_error());
    if (metrics) fclose(metrics);
    keel_dataset_free(&d);
    keel_tokenizer_free(tok);
    keel_step_free(t.st);
    keel_backend_free(t.be);
    keel_checkpoint_close(t.src);
    keel_coll_free(t.coll);
    keel_grad_sync_free(t.sync);
    free(t.train_p), free(t.grad), free(t.acc), free(t.acc_w);
    return result;
}
