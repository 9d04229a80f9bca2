#define _DEFAULT_SOURCE /* isatty, fileno */
#include "train/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "autodiff/autodiff.h"
#include "dist/collective.h"
#include "io/adapter.h"
#include "io/checkpoint.h"
#include "io/run_folder.h"
#include "ops/ops.h"
#include "recompute/recompute.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace.h"
#include "dist/grad_sync.h"
#include "train/optim.h"
#include "train/step.h"
#include "train/data.h"
#include "train/trainer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/faults.h"
#include "util/file.h"

volatile sig_atomic_t keel_train_stop = 0;

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

/* ---- building ---- */

static int build(trainer *t, const keel_qwen35_config *cfg) {
    const keel_train_opts *o = t->o;
    keel_recompute_mode rm;
    if (keel_recompute_parse(o->recompute, &rm)) return -1;
    bool bf16 = strcmp(o->base_dtype, "bf16") == 0;
    if (!bf16 && strcmp(o->base_dtype, "f32") != 0)
        return keel_fail("--base-dtype '%s': expected f32 or bf16", o->base_dtype);
    keel_lora_opts lo = {.rank = o->lora_rank,
                         .alpha = o->lora_alpha > 0 ? o->lora_alpha : (double)o->lora_rank,
                         .dropout = o->lora_dropout,
                         .seed = o->seed,
                         .targets = o->lora_targets};
    if (!o->lora_rank && (o->lora_alpha > 0 || o->lora_dropout > 0 || o->lora_targets || bf16))
        return keel_fail("--lora-alpha, --lora-dropout, --lora-targets and --base-dtype bf16 need --lora-rank");
    keel_precision prec;
    if (keel_precision_parse(o->precision, &prec)) return -1;
    keel_step_opts so = {.cfg = cfg,
                         .precision = prec,
                         .type = KEEL_F32,
                         .batch = o->batch,
                         .window = o->window,
                         .backward = true,
                         .recompute = &rm,
                         .freeze = o->freeze,
                         .lora = o->lora_rank ? &lo : NULL,
                         .base_bf16 = bf16};
    so.weight_copies = keel_step_copies_wanted(&so); /* bf16, recompute off: AdamW keeps the bf16 copies */
    if (!(t->st = keel_step_build(&so))) return -1;
    if (o->freeze) printf("frozen: %d parameter tensors match '%s'\n", t->st->n_frozen, o->freeze);
    const struct keel_lora *l = t->st->m->lora;
    if (l)
        printf("lora: rank %lld, alpha %g (scale %g), dropout %g, %d modules adapted, base frozen in %s\n",
               (long long)lo.rank, lo.alpha, l->scale, lo.dropout, l->n, bf16 ? "bf16" : "f32");
    if (l && bf16 && rm.kind == KEEL_RC_OFF)
        printf("note: a bf16 base saves memory with --recompute full or every:N; with recompute off every "
               "layer's float32 copies stay alive for the backward pass\n");
    int n = keel_step_trainable(t->st, &t->train_p);
    if (n < 0) return -1;
    t->grad = calloc((size_t)n + 1, sizeof *t->grad);
    t->acc = calloc((size_t)n + 1, sizeof *t->acc), t->acc_w = calloc((size_t)n + 1, sizeof *t->acc_w);
    if (!t->grad || !t->acc || !t->acc_w) return keel_fail("out of memory");
    for (int i = 0; i < n; i++) {
        keel_tensor *gr = keel_graph_grad(t->st->g, t->train_p[i]);
        if (!gr) return keel_fail("parameter '%s' gets no gradient", t->train_p[i]->name);
        t->grad[i] = gr;
    }
    t->n_train = n;
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
    /* then the gradients' norm and the update, on the device: a step whose norm is not finite
     * changes nothing there, and the host hears of it after */
    if (keel_step_adamw(t->st, t->train_p, G, t->n_train, o->lr, o->weight_decay, o->clip, o->accum * t->world))
        return -1;
    return keel_step_place(t->st, t->be);
}

static int init_weights(trainer *t) {
    if (t->src ? keel_checkpoint_load(t->src, t->st->m, t->be) : keel_qwen35_init_weights(t->st->m, t->be, t->o->seed))
        return -1;
    return keel_lora_init_weights(t->st->m, t->be, t->o->seed); /* --resume loads the saved ones after */
}

static int zero(keel_backend *be, keel_tensor *x) { return be->fill_bytes(be, x->data, 0, keel_nbytes(x)); }

/* The held-out loss: the mean over every counted target of the first eval_batches batches (each
 * batch's mean weighted by its count of targets). */
static double eval_loss(trainer *t, const keel_dataset *d) {
    int64_t T = t->o->window, B = t->o->batch, W = keel_dataset_eval_windows(d, T);
    if (W < B) return NAN;
    int32_t *ids = malloc((size_t)(T * B) * 4), *tgt = malloc((size_t)(T * B) * 4), *pos = malloc((size_t)(T * B) * 4);
    if (!ids || !tgt || !pos) {
        free(ids), free(tgt), free(pos);
        return NAN;
    }
    double sum = 0;
    int64_t nb = 0, counted = 0;
    keel_dropout_set_p(t->st->g, 0.0);                    /* evaluation: the adapters see their whole input */
    keel_cross_entropy_set_divisor(t->st->g, 0);          /* each batch's own count */
    keel_linear_cross_entropy_set_grads(t->st->g, false); /* only the loss */
    for (int64_t w = 0; w + B <= W && nb < t->o->eval_batches; w += B, nb++) {
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++)
            n += keel_dataset_window(d, true, w + b, T, ids + b * T, tgt + b * T, pos + b * T);
        float l = NAN;
        if (keel_step_write_batch(t->st, ids, tgt) || keel_step_write_positions(t->st, pos) ||
            t->be->compute(t->be, t->st->g, 0, t->st->g->n_forward, NULL, NULL) ||
            keel_tensor_read(t->be, t->st->out.loss, &l, KEEL_F32))
            break;
        sum += (double)l * (double)n, counted += n;
    }
    keel_dropout_set_p(t->st->g, t->o->lora_dropout);
    keel_linear_cross_entropy_set_grads(t->st->g, true);
    free(ids), free(tgt), free(pos);
    return counted ? sum / (double)counted : NAN;
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

/* ---- setup: ranks, model, tokenizer, data, backend, step graph, resume, metrics ---- */

/* Whether path is a folder an interrupted save left in dir (dir/checkpoint.old.*). */
static bool leftover_of(const char *dir, const char *path) {
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash)
        *slash = 0;
    else
        snprintf(parent, sizeof parent, ".");
    struct stat a, b; /* the same folder, however the two paths spell it */
    return strncmp(base, "checkpoint.old.", 15) == 0 && stat(parent, &a) == 0 && stat(dir, &b) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* A resumed run continues metrics.jsonl from its checkpoint's step: lines a killed run wrote after
 * that step are dropped (they will be written again, identically), so the file reads as one run.
 * Rewritten whole, synced, renamed. */
static int trim_metrics(const char *path, int64_t step) {
    size_t n;
    struct stat sb;
    if (stat(path, &sb) != 0) return 0; /* resumed into a new --out */
    char *text = keel_read_file(path, &n);
    if (!text) return -1;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644); /* never through a planted link */
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !f) close(fd);
    bool ok = f != NULL;
    for (char *line = text, *next; ok && line < text + n && *line; line = next) {
        next = strchr(line, '\n');
        if (!next) break; /* a line a killed run left unfinished */
        next++;
        const char *k = strstr(line, "\"step\": ");
        if (k && k < next && atoll(k + 8) > step) continue;
        ok = fwrite(line, 1, (size_t)(next - line), f) == (size_t)(next - line);
    }
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok, ok = fclose(f) == 0 && ok;
    free(text);
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return keel_fail("%s: cannot rewrite it for the resumed run: %s", path, strerror(errno));
    }
    return 0;
}

static int setup(trainer *t) {
    const keel_train_opts *o = t->o;
    keel_qwen35_config cfg;
    bool mm;
    const char *from = o->resume_dir ? o->resume_dir : o->model_dir;
    int coll_failed = 0;
    t->coll = keel_coll_from_env(o->dist_timeout, &coll_failed);
    if (coll_failed) return -1;
    t->rank = keel_coll_rank(t->coll), t->world = keel_coll_size(t->coll);
    t->lead = t->rank == 0; /* only rank 0 prints, evaluates, writes metrics and checkpoints */
    if (!t->lead && !freopen("/dev/null", "w", stdout)) return -1;
    if (!o->out_dir) {
        keel_fail("--out DIR is required");
        return -1;
    }
    if (!o->n_data) {
        keel_fail("--data PATH is required");
        return -1;
    }
    if (o->trace && o->trace_step > o->steps) {
        keel_fail("--trace-step %lld is after the run's last step (--steps %lld)", (long long)o->trace_step,
                  (long long)o->steps);
        return -1;
    }
    if (o->batch * o->window > INT32_MAX) { /* both are range-checked flags: the product cannot overflow */
        keel_fail("--batch %lld x --window %lld = %lld tokens per micro-batch; keel supports up to %d",
                  (long long)o->batch, (long long)o->window, (long long)(o->batch * o->window), INT32_MAX);
        return -1;
    }
    if (!!o->model_dir + !!o->preset + !!o->init_config + !!o->resume_dir != 1) {
        keel_fail("give exactly one of --model DIR, --preset NAME, --init CONFIG.json, --resume DIR");
        return -1;
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
            return -1;
        }
    }
    if (t->lead && keel_run_lock(o->out_dir, &t->lock_fd)) return -1; /* one run per --out, for its whole life */
    if (t->lead && o->resume_dir && t->world == 1 && leftover_of(o->out_dir, o->resume_dir)) {
        /* resuming from the old checkpoint an interrupted swap left: it becomes OUT/checkpoint again */
        snprintf(t->from_buf, sizeof t->from_buf, "%s/checkpoint", o->out_dir);
        if (rename(o->resume_dir, t->from_buf) != 0 || keel_fsync_dir(o->out_dir)) {
            keel_fail("%s: cannot move %s back into place: %s", t->from_buf, o->resume_dir, strerror(errno));
            return -1;
        }
        from = t->from_buf;
    }
    if (t->lead) { /* leftovers of killed saves: no live run owns them, since we hold the lock */
        int n_clean = 0;
        if (keel_run_clean(o->out_dir, from, &n_clean)) return -1;
        if (n_clean) printf("removed %d leftover folder(s) of interrupted saves from %s\n", n_clean, o->out_dir);
    }
    if (o->lora_rank && !o->model_dir && !o->resume_dir) {
        keel_fail("--lora-rank needs --model DIR: the checkpoint the adapters are trained on");
        return -1;
    }
    if (o->lora_rank && keel_trainer_base_of(t, o->model_dir, from)) return -1;
    if (from) {
        if (!(t->src = keel_checkpoint_open(o->lora_rank ? t->base_dir : from))) return -1;
        cfg = t->src->cfg;
    } else if (o->preset ? keel_qwen35_preset(o->preset, &cfg) : keel_hf_config_read_file(o->init_config, &cfg, &mm)) {
        return -1;
    }
    /* the tokenizer: given, or the model folder's, or bytes */
    bool tok_failed;
    t->tok = keel_tokenizer_for(o->tokenizer, from, &tok_failed);
    if (tok_failed) return -1;
    if (t->tok) { /* where it came from, to copy it into every checkpoint */
        if (o->tokenizer)
            snprintf(t->tok_file, sizeof t->tok_file, "%s", o->tokenizer);
        else
            snprintf(t->tok_file, sizeof t->tok_file, "%.4000s/tokenizer.json", from);
        snprintf(t->tok_dir, sizeof t->tok_dir, "%s", t->tok_file);
        char *slash = strrchr(t->tok_dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(t->tok_dir, sizeof t->tok_dir, ".");
    }
    if (t->tok && keel_tokenizer_vocab_size(t->tok) > cfg.vocab) {
        keel_fail("the tokenizer has %d tokens, the model's vocabulary only %lld", keel_tokenizer_vocab_size(t->tok),
                  (long long)cfg.vocab);
        return -1;
    }
    if (!t->tok && cfg.vocab < 256) {
        keel_fail("byte-level data needs a vocabulary of at least 256 (the model has %lld)", (long long)cfg.vocab);
        return -1;
    }
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/tokens.cache", o->out_dir);
    if (strcmp(o->train_on, "responses") && strcmp(o->train_on, "all")) {
        keel_fail("--train-on '%s': expected responses or all", o->train_on);
        return -1;
    }
    keel_data_opts dopt = {
        .format = o->data_format, .skip_bad_lines = o->skip_bad_lines, .train_on_all = !strcmp(o->train_on, "all")};
    if (keel_chat_setup(o->chat_template, t->tok ? t->tok_file : NULL, &t->chat, &dopt)) return -1;
    if (keel_dataset_load(&t->data, o->data, o->n_data, t->tok, o->eval_fraction, o->seed, cache, &dopt)) return -1;
    int bounds = keel_doc_boundaries(o->doc_boundaries, t->data.jsonl);
    keel_overlong overlong;
    if (bounds < 0 || keel_overlong_parse(o->overlong, &overlong)) return -1;
    if (bounds) {
        if (keel_dataset_pack(&t->data, o->window, o->seed, !o->no_pack, overlong)) return -1;
        keel_data_report_packing(&t->data, o->window, !o->no_pack);
    }
    int64_t W = keel_dataset_windows(&t->data, o->window);
    if (W < 1) {
        keel_fail("--window %lld is longer than the training data (%lld tokens)", (long long)o->window,
                  (long long)t->data.n_train);
        return -1;
    }
    if (W < o->batch) {
        keel_fail("the training data has %lld windows of %lld tokens, fewer than --batch %lld", (long long)W,
                  (long long)o->window, (long long)o->batch);
        return -1;
    }
    printf("data: %lld documents, %lld training tokens (%lld windows), %lld held out (%lld documents)%s; %s\n",
           (long long)t->data.n_docs, (long long)t->data.n_train, (long long)W, (long long)t->data.n_eval,
           (long long)t->data.n_eval_docs, t->data.cached ? " (cached)" : "",
           t->tok ? "model tokenizer" : "byte vocabulary");
    if (t->data.n_pc || t->data.n_chat || t->data.n_bad_lines || t->data.train_mask)
        printf("data: %lld prompt/completion examples, %lld conversations, %lld bad lines skipped; the loss counts "
               "%lld of the %lld training targets (%s)\n",
               (long long)t->data.n_pc, (long long)t->data.n_chat, (long long)t->data.n_bad_lines,
               (long long)t->data.n_trained, (long long)t->data.n_targets,
               t->data.train_mask ? "the completions and the assistant's turns" : "all");
    t->be = keel_backend_new(o->backend, (int)o->threads);
    if (!t->be || build(t, &cfg) || init_weights(t)) return -1;
    const char *coll_name = NULL;
    if (t->world >
        1) { /* buckets of 25 MiB (KEEL_DIST_BUCKET_BYTES), in the order the backward pass completes the gradients */
        if (keel_coll_attach_backend(t->coll, t->be, &coll_name)) return -1;
        const char *bb = getenv("KEEL_DIST_BUCKET_BYTES");
        long long bucket = bb && *bb ? atoll(bb) : 25ll << 20;
        if (bucket <= 0) {
            keel_fail("KEEL_DIST_BUCKET_BYTES='%s': expected a positive number of bytes", bb);
            return -1;
        }
        t->sync = keel_grad_sync_new(t->coll, t->be, t->st->g, o->accum > 1 ? t->acc : t->grad,
                                     o->accum > 1 ? t->acc_w : t->grad, t->n_train, (size_t)bucket);
        if (!t->sync) return -1;
    }
    if (o->resume_dir && keel_trainer_read_state(t, from)) return -1;
    if (keel_step_sync_copies(t->st)) return -1; /* the weights are final now: their bf16 copies */
    int64_t n_par = 0, n_tr = 0;
    for (int i = 0; i < t->st->m->n_params; i++) n_par += keel_nelements(t->st->m->params[i]);
    for (int i = 0; i < t->n_train; i++) n_tr += keel_nelements(t->train_p[i]);
    printf("model: %lld layers, %lld parameters (%lld trained), %s backend, %lld threads, precision %s, recompute %s, "
           "plan %.1f MiB\n",
           (long long)cfg.layers, (long long)n_par, (long long)n_tr, t->be->name, (long long)o->threads, o->precision,
           o->recompute, (double)t->st->s->plan->total_bytes / 1048576.0);
    if (t->st->copies) /* in the plan above: they take the place of a CAST of every matrix in every step */
        printf("bf16 copies of the matrices kept by AdamW: %.1f MiB\n", (double)keel_nbytes(t->st->copies) / 1048576.0);
    if (t->world > 1)
        printf("data parallel: %d ranks, batch %lld per rank, global batch %lld x %lld tokens per step; gradients in "
               "%d buckets, "
               "summed by the %s as the backward pass completes them\n",
               t->world, (long long)o->batch, (long long)(o->batch * t->world * o->accum), (long long)o->window,
               keel_grad_sync_n_buckets(t->sync), coll_name);
    if (t->step >= o->steps) {
        keel_fail("the checkpoint is at step %lld already; --steps %lld is the total", (long long)t->step,
                  (long long)o->steps);
        return -1;
    }
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", o->out_dir);
    if (t->lead && t->step && trim_metrics(mp, t->step)) return -1;
    t->metrics = fopen(t->lead ? mp : "/dev/null", t->step ? "a" : "w");
    if (!t->metrics) {
        keel_fail("%s: %s", mp, strerror(errno));
        return -1;
    }
    t->ids = malloc((size_t)(o->window * o->batch) * 4), t->tgt = malloc((size_t)(o->window * o->batch) * 4);
    t->pos = malloc((size_t)(o->window * o->batch) * 4);
    if (!t->ids || !t->tgt || !t->pos) return keel_fail("out of memory for a batch");
    t->tty = isatty(fileno(stdout));
    if (t->lead && t->step == 0 && t->data.n_eval > o->window) {
        double el = eval_loss(t, &t->data);
        if (isfinite(el)) {
            printf("step %6lld  eval loss %.4f  perplexity %.2f\n", 0LL, el, exp(el));
            fprintf(t->metrics, "{\"step\": 0, \"tokens\": 0, \"eval_loss\": %.9g, \"eval_ppl\": %.9g}\n", el, exp(el));
        }
    }
    t->t0 = keel_now_s();
    t->start_step = t->step;
    return 0;
}

/* ---- one optimizer step: the micro-batches (forward + backward, gradients summed), the ranks'
 * sum, the gradient norm, the checks, AdamW ---- */

static int step_once(trainer *t, int64_t step, double *loss_out, double *norm_out, double *lr_out) {
    const keel_train_opts *o = t->o;
    if (t->world > 1 && keel_fault_dist_step(t->rank, step)) return -1; /* before the step's first collective */
    if (o->accum > 1)
        for (int i = 0; i < t->n_train; i++)
            if (zero(t->be, t->acc[i])) return -1;
    /* The loss is the mean over the targets the loss counts in the whole global batch (every
     * micro-batch of every rank): each micro-batch's sum is divided by that count / (accum x ranks),
     * so that the usual 1 / (accum x ranks) of their sum is the mean over the global batch. Every
     * rank counts every rank's share (the data order is the same everywhere). */
    int64_t counted = 0;
    for (int64_t k = 0; k < o->accum * t->world; k++)
        counted += keel_dataset_batch(&t->data, o->window, o->batch, o->seed, t->position + k * o->batch, t->ids,
                                      t->tgt, t->pos);
    keel_cross_entropy_set_divisor(t->st->g, counted ? (double)counted / (double)(o->accum * t->world)
                                                     : 1.0 / (double)(o->accum * t->world));
    t->trained += counted;
    double loss = 0, lr = lr_at(o, step);
    keel_adamw_set(t->st->opt.adamw, step, lr);
    bool whole = false; /* the last micro-batch's run went on through the update */
    for (int64_t micro = 0; micro < o->accum; micro++) {
        /* rank r takes the r-th share of the global micro-batch: the samples of one process with
         * --accum world, so the sum over ranks equals its accumulated gradient bit for bit */
        keel_dataset_batch(&t->data, o->window, o->batch, o->seed, t->position + (int64_t)t->rank * o->batch, t->ids,
                           t->tgt, t->pos);
        t->position += o->batch * t->world;
        /* dropout masks: one counter per micro-batch of the global batch, so --nproc N draws the
         * masks of one process with --accum N */
        keel_dropout_set_counter(t->st->g, ((step - 1) * o->accum + micro) * t->world + t->rank);
        keel_tracer *tr = o->trace && t->lead && step == o->trace_step && micro == 0
                              ? keel_tracer_new(o->trace_data || o->trace_sample > 0, (size_t)o->trace_max_bytes)
                              : NULL;
        if (tr) tr->sample = o->trace_sample;
        float l = 0;
        bool last = micro == o->accum - 1; /* its loss is read after the update: no wait before it */
        step_cb cb = {tr, last ? t->sync : NULL};
        if (cb.sync) keel_grad_sync_begin(cb.sync);
        /* the last micro-batch's run goes on through the norm and the update when nothing watches its
         * nodes (no trace, no ranks' sum): the whole step one run, one CUDA graph on cuda, the same
         * nodes in the same order as two runs */
        whole = last && !cb.tr && !cb.sync;
        int64_t end = whole ? t->st->g->n_nodes : t->end_fb;
        int rc = keel_step_write_batch(t->st, t->ids, t->tgt) || keel_step_write_positions(t->st, t->pos) ||
                 (tr && keel_tracer_begin(tr, t->be, t->st->g)) ||
                 t->be->compute(t->be, t->st->g, 0, end, cb.tr || cb.sync ? on_node : NULL, &cb) ||
                 (cb.sync && keel_grad_sync_finish(cb.sync)) ||
                 (!last && keel_tensor_read(t->be, t->st->out.loss, &l, KEEL_F32));
        if (tr && !rc) {
            if (keel_trace_write(tr, o->trace))
                rc = 1;
            else
                printf("trace of step %lld (%lld nodes) written to %s\n", (long long)step, (long long)tr->n, o->trace);
        }
        keel_tracer_free(tr);
        if (rc) return -1;
        loss += l;
    }
    /* the norm, the clip factor and the update on the device (the update skipped there when the
     * norm is not finite; run above when the step is one run), then the last micro-batch's loss and
     * the norm read back */
    float sumsq = NAN, l = NAN;
    if ((!whole && t->be->compute(t->be, t->st->g, t->end_fb, t->st->g->n_nodes, NULL, NULL)) ||
        keel_tensor_read(t->be, t->st->out.loss, &l, KEEL_F32) ||
        keel_tensor_read(t->be, t->st->opt.sumsq, &sumsq, KEEL_F32))
        return -1;
    loss += l;
    if (t->world > 1 && keel_coll_allreduce_sum_f64(t->coll, &loss, 1)) return -1;
    loss /= (double)(o->accum * t->world);
    double norm = sqrt((double)sumsq) / (double)(o->accum * t->world);
    if (!isfinite(loss) || !isfinite(norm)) {
        const char *bad = first_nonfinite(t);
        return keel_fail("step %lld: the loss is %g and the gradient norm %g; first non-finite gradient: %s (%s; no "
                         "checkpoint written for this step)",
                         (long long)step, loss, norm, bad ? bad : "(none: the loss itself)",
                         isfinite(norm) ? "the weights were updated" : "the update was skipped");
    }
    t->step = step;
    t->tokens += o->window * o->batch * o->accum * t->world;
    *loss_out = loss, *norm_out = norm, *lr_out = lr;
    return 0;
}

/* ---- logging: metrics.jsonl, the progress line, evaluations ---- */

static void log_step(trainer *t, int64_t step, double loss, double lr, double norm) {
    const keel_train_opts *o = t->o;
    int64_t tokens_per_step = o->window * o->batch * o->accum * t->world;
    double el = keel_now_s() - t->t0, tps = (double)((step - t->start_step) * tokens_per_step) / el,
           eta = el / (double)(step - t->start_step) * (double)(o->steps - step);
    fprintf(t->metrics,
            "{\"step\": %lld, \"tokens\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"tokens_per_s\": %.1f, \"elapsed_s\": %.2f, \"tokens_trained\": %lld}\n",
            (long long)step, (long long)t->tokens, loss, lr, norm, tps, el, (long long)t->trained);
    if (t->tty)
        printf("\rstep %6lld/%lld  loss %.4f  lr %.2e  %7.0f tok/s  elapsed %6.1fs  eta %6.1fs ", (long long)step,
               (long long)o->steps, loss, lr, tps, el, eta);
    else if (step % 10 == 0 || step == o->steps || step == t->start_step + 1)
        printf("step %6lld/%lld  loss %.4f  lr %.2e  grad norm %.3f  %7.0f tok/s  elapsed %.1fs  eta %.1fs\n",
               (long long)step, (long long)o->steps, loss, lr, norm, tps, el, eta);
    fflush(stdout);
}

static void log_eval(trainer *t, int64_t step) {
    double ev = eval_loss(t, &t->data);
    if (!isfinite(ev)) return;
    if (t->tty) printf("\n");
    printf("step %6lld  eval loss %.4f  perplexity %.2f\n", (long long)step, ev, exp(ev));
    fprintf(t->metrics, "{\"step\": %lld, \"tokens\": %lld, \"eval_loss\": %.9g, \"eval_ppl\": %.9g}\n",
            (long long)step, (long long)t->tokens, ev, exp(ev));
}

static void teardown(trainer *t) {
    if (t->metrics) fclose(t->metrics);
    if (t->lock_fd >= 0) close(t->lock_fd);
    free(t->ids), free(t->tgt), free(t->pos);
    keel_dataset_free(&t->data);
    keel_tokenizer_free(t->tok);
    keel_chat_template_free(t->chat);
    keel_step_free(t->st);
    keel_backend_free(t->be);
    keel_checkpoint_close(t->src);
    keel_coll_free(t->coll);
    keel_grad_sync_free(t->sync);
    free(t->train_p), free(t->grad), free(t->acc), free(t->acc_w);
}

int keel_train_run(const keel_train_opts *o) {
    trainer t = {.o = o, .lock_fd = -1};
    int result = setup(&t) ? 1 : 0;
    for (int64_t step = t.step + 1; !result && step <= o->steps; step++) {
        double loss = NAN, norm = NAN, lr = NAN;
        if (step_once(&t, step, &loss, &norm, &lr)) {
            result = 1;
            break;
        }
        log_step(&t, step, loss, lr, norm);
        bool last = step == o->steps, stop = keel_train_stop || (o->stop_at > 0 && step == o->stop_at);
        if (t.lead && ((o->eval_every > 0 && step % o->eval_every == 0) || last)) log_eval(&t, step);
        fflush(t.metrics);
        if (t.lead && ((o->save_every > 0 && step % o->save_every == 0) || last || stop)) { /* the checkpoint */
            if (keel_trainer_save(&t)) {
                result = 1;
                break;
            }
            if (t.tty) printf("\n");
            printf("saved %s/checkpoint (step %lld)\n", o->out_dir, (long long)step);
        }
        if (stop && !last) {
            printf("%s after step %lld; resume with --resume %s\n",
                   keel_train_stop ? "interrupted: stopped" : "stopped (--stop-at)", (long long)step, o->out_dir);
            result = keel_train_stop ? 130 : 0;
            break;
        }
    }
    if (result == 1) fprintf(stderr, "keel train: %s\n", keel_last_error());
    teardown(&t);
    return result;
}
