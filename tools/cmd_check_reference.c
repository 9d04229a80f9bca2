/* keel check-reference: runs the inputs of DIR/reference.safetensors through each checkpoint in
 * DIR, forward and backward, and compares logits, loss, every hidden state and every parameter
 * gradient with the float64 values transformers computed: relative error ||x - ref|| / ||ref||. */
#include <cjson/cJSON.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "cli.h"
#include "cli_flags.h"
#include "io/adapter.h"
#include "io/checkpoint.h"
#include "recompute/recompute.h"
#include "trace/trace.h"
#include "ops/ops.h"
#include "train/step.h"
#include "util/error.h"
#include "util/file.h"

typedef struct {
    int pass, fail, above_peer;
    double worst_value, worst_grad;
} tally;

static double rel_err(const double *x, const keel_st_tensor *r, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = keel_st_get(r, i), d = x[i] - v;
        if (!isfinite(x[i])) return INFINITY;
        num += d * d, den += v * v;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Tolerances. float64 (ref): 1e-10. float32: no worse than the peer on this model, when the
 * fixture says how good the peer is (DIR/peer-f32.json: transformers' float32 run against its own
 * float64 reference, tests/fixtures/tools/peer_errors.py): values (logits, loss, hidden
 * states) within the peer's worst value error, gradients within its worst gradient error, from
 * its run on the same kind of device. Without that file, fixed values: 2e-5 and 1e-4. Tensor by
 * tensor, keel's errors above the peer's own on that tensor are counted and named (not failed). */
typedef struct {
    const cJSON *errors; /* name -> the peer's relative error on that tensor, or NULL */
    double value, grad;  /* the tolerances */
    const char *why;     /* "peer", "fixed", "float64" or "1.5x peer" */
    double per_tensor;   /* > 0 (bf16): each tensor's tolerance is this times the peer's error on it */
} tolerances;

/* The tolerance of one tensor: per tensor from the peer's errors (bf16), else by kind. -1: the
 * peer has no error for it (the check fails, naming it). */
static double tol_of(const tolerances *tl, const char *name, bool is_grad) {
    if (!(tl->per_tensor > 0)) return is_grad ? tl->grad : tl->value;
    const cJSON *pe = tl->errors ? cJSON_GetObjectItemCaseSensitive(tl->errors, name) : NULL;
    return cJSON_IsNumber(pe) && pe->valuedouble >= 0 ? tl->per_tensor * pe->valuedouble : -1;
}

static int compare(keel_backend *be, const keel_tensor *t, const keel_st_file *ref, const char *name,
                   const tolerances *tl, tally *ty, bool is_grad) {
    const keel_st_tensor *r = keel_st_find(ref, name);
    if (!r) {
        printf("  %-58s missing from the reference\n", name);
        ty->fail++;
        return -1;
    }
    if (keel_st_numel(r) != keel_nelements(t)) {
        printf("  %-58s %lld elements, reference has %lld  FAIL\n", name, (long long)keel_nelements(t),
               (long long)keel_st_numel(r));
        ty->fail++;
        return -1;
    }
    double *x = keel_tensor_read_f64(be, t);
    if (!x) return -1;
    double e = rel_err(x, r, keel_nelements(t));
    free(x);
    double tol = tol_of(tl, name, is_grad);
    bool ok = e <= tol;
    if (tol < 0) printf("  %-58s the peer's file has no error for it  FAIL\n", name);
    const cJSON *pe = tl->errors ? cJSON_GetObjectItemCaseSensitive(tl->errors, name) : NULL;
    bool above = cJSON_IsNumber(pe) && e > pe->valuedouble;
    printf("  %-58s rel err %.3e  (tol %.2e %s)  %s", name, e, tol, tl->why, ok ? "PASS" : "FAIL");
    if (above) printf("   [above the peer's %.2e on this tensor]", pe->valuedouble), ty->above_peer++;
    printf("\n");
    if (ok)
        ty->pass++;
    else
        ty->fail++;
    if (is_grad)
        ty->worst_grad = fmax(ty->worst_grad, e);
    else
        ty->worst_value = fmax(ty->worst_value, e);
    return ok ? 0 : -1;
}

typedef struct {
    const char *path;
    bool data;
    size_t max_bytes;
} trace_opts;

static int check_one(const char *ckpt_dir, const char *backend, int threads, const keel_recompute_mode *rm,
                     const trace_opts *to, const keel_st_file *ref, const cJSON *peer, const keel_adapter *ad,
                     keel_precision prec, tally *ty) {
    keel_checkpoint *ck = keel_checkpoint_open(ckpt_dir);
    if (!ck) {
        fprintf(stderr, "keel check-reference: %s\n", keel_last_error());
        return -1;
    }
    const keel_st_tensor *ids_t = keel_st_find(ref, "input_ids"), *tgt_t = keel_st_find(ref, "targets");
    if (!ids_t || !tgt_t || ids_t->n_dims != 2 || keel_st_numel(ids_t) != keel_st_numel(tgt_t)) {
        fprintf(stderr, "keel check-reference: %s: needs input_ids and targets of one shape [B,T]\n", ref->path);
        keel_checkpoint_close(ck);
        return -1;
    }
    int64_t B = ids_t->shape[0], T = ids_t->shape[1];
    keel_backend *be = keel_backend_new(backend, threads);
    if (!be) {
        fprintf(stderr, "keel check-reference: %s\n", keel_last_error());
        keel_checkpoint_close(ck);
        return -1;
    }
    keel_type type = be->native_type;
    keel_step *st = NULL;
    int rc = -1;
    tolerances tl = {.value = type == KEEL_F64 ? 1e-10 : 2e-5,
                     .grad = type == KEEL_F64 ? 1e-10 : 1e-4,
                     .why = type == KEEL_F64 ? "float64" : "fixed"};
    if (prec == KEEL_PRECISION_BF16 || (type == KEEL_F32 && peer)) {
        /* float32: the peer's run on the same kind of device (its GPU run for cuda). bf16: its GPU
         * run on every backend: keel's mixed precision is one policy everywhere (bf16 operands,
         * float32 sums), while PyTorch's CPU autocast is another than its CUDA one, which is the
         * mixed precision people train with */
        const cJSON *dev =
            be->on_device || prec == KEEL_PRECISION_BF16 ? cJSON_GetObjectItemCaseSensitive(peer, "cuda") : NULL;
        if (!dev) dev = cJSON_GetObjectItemCaseSensitive(peer, "cpu");
        const cJSON *wv = cJSON_GetObjectItemCaseSensitive(dev, "worst_value"),
                    *wg = cJSON_GetObjectItemCaseSensitive(dev, "worst_gradient");
        if (!cJSON_IsNumber(wv) || !cJSON_IsNumber(wg) || !(wv->valuedouble > 0) || !(wg->valuedouble > 0)) {
            keel_fail("peer-%s.json: no positive worst_value / worst_gradient for this device",
                      keel_precision_name(prec));
            goto done;
        }
        tl.value = wv->valuedouble, tl.grad = wg->valuedouble, tl.why = "peer";
        tl.errors = cJSON_GetObjectItemCaseSensitive(dev, "errors");
        if (prec == KEEL_PRECISION_BF16) tl.per_tensor = 1.5, tl.why = "1.5x peer";
    }
    keel_step_opts so = {.cfg = &ck->cfg,
                         .type = type,
                         .batch = B,
                         .window = T,
                         .backward = true,
                         .recompute = rm,
                         .keep_hidden = true,
                         .adapter = ad,
                         .precision = prec};
    if (!(st = keel_step_build(&so)) || keel_step_place(st, be) || keel_step_load(st, ck)) goto done;
    const keel_qwen35_out out = st->out;
    {
        int32_t *iv = malloc((size_t)(B * T) * 4), *tv = malloc((size_t)(B * T) * 4);
        for (int64_t i = 0; iv && tv && i < B * T; i++)
            iv[i] = (int32_t)keel_st_get(ids_t, i), tv[i] = (int32_t)keel_st_get(tgt_t, i);
        int w = iv && tv ? keel_step_write_batch(st, iv, tv) : keel_fail("out of memory for the fixture's batch");
        free(iv), free(tv);
        keel_tracer *tr = to->path ? keel_tracer_new(to->data, to->max_bytes) : NULL;
        if (w || (tr && keel_tracer_begin(tr, be, st->g)) ||
            keel_session_run(st->s, tr ? keel_tracer_node : NULL, tr)) {
            keel_tracer_free(tr);
            goto done;
        }
        if (tr) {
            int wr = keel_trace_write(tr, to->path);
            if (!wr) printf("trace of %lld nodes written to %s\n", (long long)tr->n, to->path);
            keel_tracer_free(tr);
            if (wr) goto done;
        }
    }
    printf("%s%s%s on %s (%s%s, %s weights, %lld layers, B=%lld T=%lld, recompute %s)\n", ckpt_dir,
           ad ? " + adapter " : "", ad ? ad->dir : "", backend, keel_type_name(type),
           prec == KEEL_PRECISION_BF16 ? ", bf16 products" : "", ck->dtype[0] ? ck->dtype : "stored",
           (long long)ck->cfg.layers, (long long)B, (long long)T, rm->text);
    compare(be, out.logits, ref, "logits", &tl, ty, false);
    compare(be, out.loss, ref, "loss", &tl, ty, false);
    for (int i = 0; i < ck->cfg.layers; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "hidden.%d", i);
        compare(be, out.hidden[i], ref, nm, &tl, ty, false);
    }
    { /* the last hidden state: transformers reports it after the final norm; say which matched */
        char nm[32];
        snprintf(nm, sizeof nm, "hidden.%lld", (long long)ck->cfg.layers);
        const keel_st_tensor *r = keel_st_find(ref, nm);
        double *pre = keel_tensor_read_f64(be, out.hidden[ck->cfg.layers]),
               *post = keel_tensor_read_f64(be, out.normed);
        if (r && pre && post && keel_st_numel(r) == keel_nelements(out.normed)) {
            double e_pre = rel_err(pre, r, keel_nelements(out.normed)),
                   e_post = rel_err(post, r, keel_nelements(out.normed));
            double e = fmin(e_pre, e_post), tol_v = tol_of(&tl, nm, false);
            printf("  %-58s rel err %.3e  (tol %.2e %s)  %s   [taken %s the final norm; the other side: %.1e]\n", nm, e,
                   tol_v, tl.why, e <= tol_v ? "PASS" : "FAIL", e_post <= e_pre ? "after" : "before",
                   fmax(e_pre, e_post));
            if (e <= tol_v)
                ty->pass++;
            else
                ty->fail++;
            ty->worst_value = fmax(ty->worst_value, e);
        } else {
            printf("  %-58s missing from the reference or of another size  FAIL\n", nm);
            ty->fail++;
        }
        free(pre), free(post);
    }
    /* the gradients of what trains: every parameter, or with an adapter its factors (the base is frozen) */
    keel_tensor **tp = NULL;
    int n_tp = keel_step_trainable(st, &tp);
    for (int p = 0; p < n_tp; p++) {
        char nm[KEEL_NAME_MAX + 8];
        snprintf(nm, sizeof nm, "grad.%s", tp[p]->name);
        compare(be, keel_graph_grad(st->g, tp[p]), ref, nm, &tl, ty, true);
    }
    free(tp);
    if (n_tp < 0) goto done;
    rc = 0;
done:
    if (rc) fprintf(stderr, "keel check-reference: %s: %s\n", ckpt_dir, keel_last_error());
    keel_step_free(st);
    keel_backend_free(be);
    keel_checkpoint_close(ck);
    return rc;
}

static int is_checkpoint(const char *dir) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", dir);
    return stat(p, &st) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int cmd_check_reference(int argc, char **argv) {
    const char *dir = NULL, *backends = "cpu", *only = NULL, *rmode = "off", *adapter_dir = NULL, *prec_s = "f32";
    trace_opts to = {.max_bytes = 256u << 20};
    long long threads = 2;
    long long max_bytes = 256ll << 20;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &dir, .meta = "DIR",
         .help = "reference.safetensors and checkpoint folders (peer-f32.json: the peer's errors)", .required = true},
        {"--backend", CLI_STR, &backends, .meta = "B[,B...]", .help = "ref, cpu, cuda (default cpu)"},
        {"--checkpoint", CLI_STR, &only, .meta = "SUBDIR",
         .help = "only this checkpoint (default: every folder in DIR)"},
        {"--recompute", CLI_STR, &rmode, .meta = "MODE", .help = "off, full, every:N, layers:i,j (default off)"},
        {"--adapter", CLI_STR, &adapter_dir, .meta = "DIR",
         .help = "a PEFT LoRA adapter beside the weights (the reference then holds its factors' gradients)"},
        {"--precision", CLI_STR, &prec_s, .meta = "f32|bf16",
         .help = "bf16: mixed precision, each tensor within 1.5x of PyTorch autocast's error (DIR/peer-bf16.json) "
                 "(default f32)"},
        {"--threads", CLI_INT, &threads, 1, 1024, .meta = "N", .help = "cpu threads (default 2)"},
        {"--trace", CLI_STR, &to.path, .meta = "FILE", .help = "write a trace of the run for keel diff"},
        {"--trace-data", CLI_BOOL, &to.data, .help = "store each node's output in the trace"},
        {"--trace-max-bytes", CLI_INT, &max_bytes, 0, 9e15, .meta = "N",
         .help = "bytes of such data (default 256 MiB)"},
    };
    const cli_spec spec = {"keel check-reference",
                           "run DIR/reference.safetensors through each checkpoint in DIR and compare with transformers",
                           flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    to.max_bytes = (size_t)max_bytes;
    keel_recompute_mode rm;
    keel_precision prec;
    if (keel_recompute_parse(rmode, &rm) || keel_precision_parse(prec_s, &prec)) {
        fprintf(stderr, "keel check-reference: %s\n", keel_last_error());
        return 2;
    }
    char refp[4096];
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    keel_st_file *ref = keel_st_open(refp);
    if (!ref) {
        fprintf(stderr, "keel check-reference: %s\n", keel_last_error());
        return 2;
    }
    cJSON *peer = NULL; /* the peer's errors in this precision, when the fixture has them (bf16: required) */
    snprintf(refp, sizeof refp, "%s/peer-%s.json", dir, keel_precision_name(prec));
    struct stat pst;
    if ((stat(refp, &pst) == 0 || prec == KEEL_PRECISION_BF16) && !(peer = keel_read_json(refp))) {
        fprintf(stderr, "keel check-reference: %s%s\n", keel_last_error(),
                prec == KEEL_PRECISION_BF16 ? " (--precision bf16 is judged against PyTorch autocast's errors: "
                                              "tests/fixtures/tools/peer_errors.py DIR OUT bf16)"
                                            : "");
        keel_st_close(ref);
        return 2;
    }
    if (peer && prec == KEEL_PRECISION_BF16)
        printf("bf16 tolerances: each tensor within 1.5x of the peer's own error on it (%s, transformers %s)\n", refp,
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(peer, "transformers"))
                   ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(peer, "transformers"))
                   : "?");
    else if (peer)
        printf("float32 tolerances: no worse than the peer's worst value and gradient errors (%s, transformers %s)\n",
               refp,
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(peer, "transformers"))
                   ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(peer, "transformers"))
                   : "?");
    char *subs[64];
    int n_sub = 0;
    if (only) {
        subs[n_sub++] = strdup(only);
    } else {
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)) && n_sub < 64) {
            char p[4096];
            if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
            if (e->d_name[0] != '.' && is_checkpoint(p)) subs[n_sub++] = strdup(e->d_name);
        }
        if (d) closedir(d);
        qsort(subs, (size_t)n_sub, sizeof *subs, cmp_str);
    }
    if (n_sub == 0) {
        fprintf(stderr, "keel check-reference: no checkpoint folder (with config.json) in %s\n", dir);
        keel_st_close(ref);
        return 2;
    }
    if (to.path && (n_sub != 1 || strchr(backends, ','))) {
        fprintf(stderr, "keel check-reference: --trace needs one --checkpoint and one --backend\n");
        for (int i = 0; i < n_sub; i++) free(subs[i]);
        keel_st_close(ref);
        return 2;
    }
    keel_adapter *ad = adapter_dir ? keel_adapter_open(adapter_dir) : NULL;
    if (adapter_dir && !ad) {
        fprintf(stderr, "keel check-reference: %s\n", keel_last_error());
        for (int i = 0; i < n_sub; i++) free(subs[i]);
        keel_st_close(ref);
        cJSON_Delete(peer);
        return 2;
    }
    tally ty = {0};
    int errors = 0;
    char bl[128];
    snprintf(bl, sizeof bl, "%s", backends);
    for (char *b = strtok(bl, ","); b; b = strtok(NULL, ","))
        for (int i = 0; i < n_sub; i++) {
            char p[4096];
            if (subs[i][0] == '/')
                snprintf(p, sizeof p, "%s", subs[i]); /* an absolute --checkpoint */
            else
                snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
            if (check_one(p, b, (int)threads, &rm, &to, ref, peer, ad, prec, &ty)) errors++;
        }
    for (int i = 0; i < n_sub; i++) free(subs[i]);
    keel_adapter_close(ad);
    keel_st_close(ref);
    cJSON_Delete(peer);
    printf("worst relative error: values %.3e, gradients %.3e\n", ty.worst_value, ty.worst_grad);
    if (peer) printf("tensors whose error is above the peer's own on that tensor: %d\n", ty.above_peer);
    printf("%s: %d passed, %d failed%s\n", ty.fail || errors ? "FAIL" : "PASS", ty.pass, ty.fail,
           errors ? " (and errors above)" : "");
    return ty.fail || errors ? 1 : 0;
}
