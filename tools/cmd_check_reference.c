/* keel check-reference: runs the inputs of DIR/reference.safetensors through each checkpoint in
 * DIR, forward and backward, and compares logits, loss, every hidden state and every parameter
 * gradient with the float64 values transformers computed: relative error ||x - ref|| / ||ref||.
 * DIR may also be a set of fixtures (its subfolders, each one such DIR: the same model at other
 * seeds), judged together: each tensor's error pooled over the fixtures (below, "A set of
 * fixtures"). */
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

/* A fixture's errors, kept for a set's pooled verdict: per tensor, in the order first compared,
 * keel's worst error over the fixture's checkpoints and its tolerance on this fixture alone, and
 * whether that tolerance comes from the peer's errors (a random quantity like keel's own, pooled)
 * or is fixed (float64, or no peer file: every fixture within it). */
typedef struct {
    char name[KEEL_NAME_MAX + 8];
    double err, tol;
    bool peer;
} rec;
/* A run with a recs records its errors for the set and prints no line a tensor; without one, it
 * prints them (a single fixture). */
typedef struct {
    rec *r;
    int n, cap;
    bool failed; /* a tensor missing or of another size, or a run that did not finish */
} recs;

static void record(recs *rs, const char *name, double err, double tol, bool peer) {
    if (!rs) return;
    for (int i = 0; i < rs->n; i++)
        if (!strcmp(rs->r[i].name, name)) { /* another checkpoint of the fixture: its worse error */
            rs->r[i].err = isnan(err) || err > rs->r[i].err ? err : rs->r[i].err;
            return;
        }
    if (rs->n == rs->cap) {
        int c = rs->cap * 2 + 64;
        rec *nr = realloc(rs->r, (size_t)c * sizeof *nr);
        if (!nr) {
            rs->failed = true;
            return;
        }
        rs->r = nr, rs->cap = c;
    }
    rec *r = &rs->r[rs->n++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->err = err, r->tol = tol, r->peer = peer;
}

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
                   const tolerances *tl, tally *ty, bool is_grad, recs *rs) {
    const keel_st_tensor *r = keel_st_find(ref, name);
    if (!r || keel_st_numel(r) != keel_nelements(t)) {
        if (!r)
            printf("  %-58s missing from the reference\n", name);
        else
            printf("  %-58s %lld elements, reference has %lld  FAIL\n", name, (long long)keel_nelements(t),
                   (long long)keel_st_numel(r));
        ty->fail++;
        if (rs) rs->failed = true;
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
    record(rs, name, e, tol, tl->errors != NULL);
    if (above) ty->above_peer++;
    if (!rs) {
        printf("  %-58s rel err %.3e  (tol %.2e %s)  %s", name, e, tol, tl->why, ok ? "PASS" : "FAIL");
        if (above) printf("   [above the peer's %.2e on this tensor]", pe->valuedouble);
        printf("\n");
    }
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
                     keel_precision prec, tally *ty, recs *rs) {
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
    if (!rs)
        printf("%s%s%s on %s (%s%s, %s weights, %lld layers, B=%lld T=%lld, recompute %s)\n", ckpt_dir,
               ad ? " + adapter " : "", ad ? ad->dir : "", backend, keel_type_name(type),
               prec == KEEL_PRECISION_BF16 ? ", bf16 products" : "", ck->dtype[0] ? ck->dtype : "stored",
               (long long)ck->cfg.layers, (long long)B, (long long)T, rm->text);
    compare(be, out.logits, ref, "logits", &tl, ty, false, rs);
    compare(be, out.loss, ref, "loss", &tl, ty, false, rs);
    for (int i = 0; i < ck->cfg.layers; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "hidden.%d", i);
        compare(be, out.hidden[i], ref, nm, &tl, ty, false, rs);
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
            if (!rs)
                printf("  %-58s rel err %.3e  (tol %.2e %s)  %s   [taken %s the final norm; the other side: %.1e]\n",
                       nm, e, tol_v, tl.why, e <= tol_v ? "PASS" : "FAIL", e_post <= e_pre ? "after" : "before",
                       fmax(e_pre, e_post));
            record(rs, nm, e, tol_v, tl.errors != NULL);
            if (e <= tol_v)
                ty->pass++;
            else
                ty->fail++;
            ty->worst_value = fmax(ty->worst_value, e);
        } else {
            printf("  %-58s missing from the reference or of another size  FAIL\n", nm);
            ty->fail++;
            if (rs) rs->failed = true;
        }
        free(pre), free(post);
    }
    /* the gradients of what trains: every parameter, or with an adapter its factors (the base is frozen) */
    keel_tensor **tp = NULL;
    int n_tp = keel_step_trainable(st, &tp);
    for (int p = 0; p < n_tp; p++) {
        char nm[KEEL_NAME_MAX + 8];
        snprintf(nm, sizeof nm, "grad.%s", tp[p]->name);
        compare(be, keel_graph_grad(st->g, tp[p]), ref, nm, &tl, ty, true, rs);
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

static bool has_file(const char *dir, const char *name) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The folders of dir (in name order, at most `most`) that hold `file` */
static int folders_with(const char *dir, const char *file, char **out, int most) {
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && n < most) {
        char p[4096];
        if (e->d_name[0] == '.' || snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (has_file(p, file)) out[n++] = strdup(e->d_name);
    }
    if (d) closedir(d);
    qsort(out, (size_t)n, sizeof *out, cmp_str);
    return n;
}

/* One fixture: its reference, the peer's errors in the precision checked (when it has them; bf16:
 * required) and its checkpoint folders (or only one) */
typedef struct {
    char dir[4096];
    keel_st_file *ref;
    cJSON *peer;
    char *subs[64];
    int n_sub;
} fixture;

/* dir/name into out (n bytes); -1 (printed, naming the path) when it does not fit */
static int path_join(char *out, size_t n, const char *dir, const char *name) {
    if (snprintf(out, n, "%s/%s", dir, name) < (int)n) return 0;
    fprintf(stderr, "keel check-reference: %s/%s: the path is too long\n", dir, name);
    return -1;
}

static void fixture_close(fixture *f) {
    for (int i = 0; i < f->n_sub; i++) free(f->subs[i]);
    keel_st_close(f->ref);
    cJSON_Delete(f->peer);
    memset(f, 0, sizeof *f);
}

static const char *peer_version(const cJSON *peer) {
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(peer, "transformers"));
    return v ? v : "?";
}

/* 0: opened; -1: an error, printed. say: print the tolerances' line */
static int fixture_open(fixture *f, const char *dir, keel_precision prec, const char *only, bool say) {
    memset(f, 0, sizeof *f);
    char p[4200], pn[32];
    if (snprintf(f->dir, sizeof f->dir, "%s", dir) >= (int)sizeof f->dir ||
        path_join(p, sizeof p, dir, "reference.safetensors"))
        return -1;
    if (!(f->ref = keel_st_open(p))) {
        fprintf(stderr, "keel check-reference: %s\n", keel_last_error());
        return -1;
    }
    snprintf(pn, sizeof pn, "peer-%s.json", keel_precision_name(prec));
    if (path_join(p, sizeof p, dir, pn)) {
        fixture_close(f);
        return -1;
    }
    struct stat pst;
    if ((stat(p, &pst) == 0 || prec == KEEL_PRECISION_BF16) && !(f->peer = keel_read_json(p))) {
        fprintf(stderr, "keel check-reference: %s%s\n", keel_last_error(),
                prec == KEEL_PRECISION_BF16 ? " (--precision bf16 is judged against PyTorch autocast's errors: "
                                              "tests/fixtures/tools/peer_errors.py DIR OUT bf16)"
                                            : "");
        fixture_close(f);
        return -1;
    }
    if (say && f->peer && prec == KEEL_PRECISION_BF16)
        printf("bf16 tolerances: each tensor within 1.5x of the peer's own error on it (%s, transformers %s)\n", p,
               peer_version(f->peer));
    else if (say && f->peer)
        printf("float32 tolerances: no worse than the peer's worst value and gradient errors (%s, transformers %s)\n",
               p, peer_version(f->peer));
    if (only)
        f->subs[f->n_sub++] = strdup(only);
    else
        f->n_sub = folders_with(dir, "config.json", f->subs, 64);
    if (f->n_sub == 0) {
        fprintf(stderr, "keel check-reference: no checkpoint folder (with config.json) in %s\n", dir);
        fixture_close(f);
        return -1;
    }
    return 0;
}

/* Runs every checkpoint of fixture f on backend b. Returns the runs that did not finish. */
static int check_fixture(const fixture *f, const char *b, int threads, const keel_recompute_mode *rm,
                         const trace_opts *to, const keel_adapter *ad, keel_precision prec, tally *ty, recs *rs) {
    int errors = 0;
    for (int i = 0; i < f->n_sub; i++) {
        char p[8300];
        if (f->subs[i][0] == '/')
            snprintf(p, sizeof p, "%s", f->subs[i]); /* an absolute --checkpoint */
        else
            snprintf(p, sizeof p, "%s/%s", f->dir, f->subs[i]);
        if (check_one(p, b, threads, rm, to, f->ref, f->peer, ad, prec, ty, rs)) {
            errors++;
            if (rs) rs->failed = true;
        }
    }
    return errors;
}

/* A set of fixtures (the same model and inputs' shape at other seeds) judged together. On one
 * fixture, a tensor's error against the peer's is one draw of each: on the shared config's seeds 1
 * to 7, PyTorch autocast's own errors on layer 0's 4-element A_log gradient move between 0.33 and
 * 1.73 (on the loss, 1.8e-4 to 1.7e-3), and keel's bf16 run, whose error pooled over the seeds is
 * 0.70x PyTorch's at worst on every backend, landed above 1.5x PyTorch's on 3 of the 7, while a
 * variant with a real loss of precision (the delta rule's products in one bf16 part: 2.4x
 * PyTorch's, pooled) passed on 3. So a set is judged tensor by tensor on the RMS over its
 * fixtures: a tensor's pooled error, the root mean square of its errors (each fixture's worst over
 * its checkpoints), within the root mean square of its tolerances where those are the peer's
 * (bf16: 1.5x the peer's error on that tensor; float32: the peer's worst error of its kind); a
 * fixed tolerance (float64, or no peer file) holds on every fixture. On one fixture this is the
 * single fixture's rule. The per-fixture results are printed too, and the tensors above their
 * tolerance on a fixture alone named. */
static double rms_add(double acc, double x) { return acc + x * x; }

static int check_set(const char *dir, char **names, int n_fx, const char *backends, int threads,
                     const keel_recompute_mode *rm, keel_precision prec) {
    tally ty = {0};
    int errors = 0;
    char bl[128];
    snprintf(bl, sizeof bl, "%s", backends);
    recs *rs = calloc((size_t)n_fx, sizeof *rs);
    if (!rs) {
        fprintf(stderr, "keel check-reference: out of memory\n");
        return 2;
    }
    double worst_ratio = 0;
    char worst_name[KEEL_NAME_MAX + 80] = "";
    for (char *b = strtok(bl, ","); b; b = strtok(NULL, ",")) {
        printf("%s on %s: %d fixtures, %s, each tensor's error pooled over them\n", dir, b, n_fx,
               keel_precision_name(prec));
        for (int f = 0; f < n_fx; f++) {
            char p[4096];
            free(rs[f].r);
            memset(&rs[f], 0, sizeof rs[f]);
            fixture fx;
            if (path_join(p, sizeof p, dir, names[f]) || fixture_open(&fx, p, prec, NULL, false)) {
                rs[f].failed = true, errors++;
                continue;
            }
            tally alone = {0};
            errors += check_fixture(&fx, b, threads, rm, &(trace_opts){0}, NULL, prec, &alone, &rs[f]);
            printf("  %-12s alone: %d passed, %d failed", names[f], alone.pass, alone.fail);
            int shown = 0;
            for (int i = 0; i < rs[f].n; i++)
                if (!(rs[f].r[i].err <= rs[f].r[i].tol) && shown++ < 3) {
                    printf("%s%s", shown == 1 ? "; above alone (error / tolerance): " : ", ", rs[f].r[i].name);
                    if (rs[f].r[i].tol > 0)
                        printf(" %.2f", rs[f].r[i].err / rs[f].r[i].tol);
                    else
                        printf(" (no tolerance)");
                }
            if (shown > 3) printf(" and %d more", shown - 3);
            printf("\n");
            fixture_close(&fx);
        }
        printf("  pooled (RMS over the %d fixtures where the tolerance is the peer's; else each within it):\n", n_fx);
        for (int i = 0; !rs[0].failed && i < rs[0].n; i++) {
            const rec *r0 = &rs[0].r[i];
            double se = 0, st = 0, me = 0, mt = INFINITY;
            bool ok = true;
            for (int f = 0; f < n_fx && ok; f++) {
                const rec *r = NULL;
                for (int j = 0; !rs[f].failed && j < rs[f].n && !r; j++)
                    if (!strcmp(rs[f].r[j].name, r0->name)) r = &rs[f].r[j];
                if (!r || !(r->tol >= 0)) {
                    printf("  %-58s %s %s  FAIL\n", r0->name, r ? "no peer's error for it in" : "missing from",
                           names[f]);
                    ok = false;
                    break;
                }
                se = rms_add(se, r->err), st = rms_add(st, r->tol);
                me = isnan(r->err) || r->err > me ? r->err : me, mt = fmin(mt, r->tol);
            }
            if (!ok) {
                ty.fail++;
                continue;
            }
            double e = r0->peer ? sqrt(se / n_fx) : me, tol = r0->peer ? sqrt(st / n_fx) : mt;
            bool pass = e <= tol;
            printf("  %-58s rel err %.3e  (tol %.2e, %s)  %s", r0->name, e, tol, r0->peer ? "RMS" : "each fixture",
                   pass ? "PASS" : "FAIL");
            if (tol > 0) printf("   [%.2f of the tolerance]", e / tol);
            printf("\n");
            if (pass)
                ty.pass++;
            else
                ty.fail++;
            if (tol > 0 && !(e / tol <= worst_ratio))
                worst_ratio = e / tol, snprintf(worst_name, sizeof worst_name, "%s on %s", r0->name, b);
        }
        for (int f = 0; f < n_fx; f++)
            if (rs[f].failed || rs[f].n != rs[0].n) {
                printf("  %-58s %d tensors compared, %d in %s%s  FAIL\n", names[f], rs[f].n, rs[0].n, names[0],
                       rs[f].failed ? " (a run or a tensor failed)" : "");
                ty.fail++;
            }
    }
    for (int f = 0; f < n_fx; f++) free(rs[f].r);
    free(rs);
    printf("worst pooled error: %.3f of its tolerance (%s)\n", worst_ratio, worst_name);
    printf("%s: %d passed, %d failed%s\n", ty.fail || errors ? "FAIL" : "PASS", ty.pass, ty.fail,
           errors ? " (and errors above)" : "");
    return ty.fail || errors ? 1 : 0;
}

int cmd_check_reference(int argc, char **argv) {
    const char *dir = NULL, *backends = "cpu", *only = NULL, *rmode = "off", *adapter_dir = NULL, *prec_s = "f32";
    trace_opts to = {.max_bytes = 256u << 20};
    long long threads = 2;
    long long max_bytes = 256ll << 20;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &dir, .meta = "DIR",
         .help = "reference.safetensors and checkpoint folders (peer-f32.json: the peer's errors); or a folder of "
                 "such fixtures (the same model at other seeds), judged together",
         .required = true},
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
    if (!has_file(dir, "reference.safetensors")) { /* a set of fixtures? */
        char *names[64];
        int n_fx = folders_with(dir, "reference.safetensors", names, 64);
        int rc = 2;
        if (n_fx == 0)
            fprintf(stderr, "keel check-reference: %s: no reference.safetensors in it, nor in a folder of it\n", dir);
        else if (only || adapter_dir || to.path)
            fprintf(stderr, "keel check-reference: %s: a set of fixtures is checked whole: --%s is for one fixture\n",
                    dir,
                    only          ? "checkpoint"
                    : adapter_dir ? "adapter"
                                  : "trace");
        else
            rc = check_set(dir, names, n_fx, backends, (int)threads, &rm, prec);
        for (int i = 0; i < n_fx; i++) free(names[i]);
        return rc;
    }
    fixture fx;
    if (fixture_open(&fx, dir, prec, only, true)) return 2;
    if (to.path && (fx.n_sub != 1 || strchr(backends, ','))) {
        fprintf(stderr, "keel check-reference: --trace needs one --checkpoint and one --backend\n");
        fixture_close(&fx);
        return 2;
    }
    keel_adapter *ad = adapter_dir ? keel_adapter_open(adapter_dir) : NULL;
    if (adapter_dir && !ad) {
        fprintf(stderr, "keel check-reference: %s\n", keel_last_error());
        fixture_close(&fx);
        return 2;
    }
    tally ty = {0};
    int errors = 0;
    char bl[128];
    snprintf(bl, sizeof bl, "%s", backends);
    for (char *b = strtok(bl, ","); b; b = strtok(NULL, ","))
        errors += check_fixture(&fx, b, (int)threads, &rm, &to, ad, prec, &ty, NULL);
    bool peer = fx.peer != NULL;
    keel_adapter_close(ad);
    fixture_close(&fx);
    printf("worst relative error: values %.3e, gradients %.3e\n", ty.worst_value, ty.worst_grad);
    if (peer) printf("tensors whose error is above the peer's own on that tensor: %d\n", ty.above_peer);
    printf("%s: %d passed, %d failed%s\n", ty.fail || errors ? "FAIL" : "PASS", ty.pass, ty.fail,
           errors ? " (and errors above)" : "");
    return ty.fail || errors ? 1 : 0;
}
