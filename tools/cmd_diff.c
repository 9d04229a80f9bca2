/* keel diff: the first node where two runs part. Either two trace files, or the one-shot form
 * that runs two configurations of one step in this process (--model DIR, or --case acc: the op
 * case ACC(ne_a=[4096,17], ne_b=[4096,16])) and compares their traces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "io/checkpoint.h"
#include "ops/ops.h"
#include "recompute/recompute.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace.h"
#include "train/step.h"
#include "util/error.h"

typedef struct {
    char recompute[64], backend[16], fault[160];
    int threads;
    keel_precision precision;
} run_config;

/* CONFIG s into c; its precision is `prec` (keel diff --precision) unless s has a precision key */
static int parse_config(const char *s, keel_precision prec, run_config *c) {
    snprintf(c->recompute, sizeof c->recompute, "off");
    snprintf(c->backend, sizeof c->backend, "cpu");
    c->fault[0] = 0;
    c->threads = 2;
    c->precision = prec;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *kv = strtok(buf, ","); kv; kv = strtok(NULL, ",")) {
        char *eq = strchr(kv, '=');
        if (!eq) return keel_fail("config '%s': '%s' is not key=value", s, kv);
        *eq = 0;
        const char *v = eq + 1;
        if (!strcmp(kv, "recompute"))
            snprintf(c->recompute, sizeof c->recompute, "%s", v);
        else if (!strcmp(kv, "backend"))
            snprintf(c->backend, sizeof c->backend, "%s", v);
        else if (!strcmp(kv, "fault"))
            snprintf(c->fault, sizeof c->fault, "%s", v);
        else if (!strcmp(kv, "threads"))
            c->threads = atoi(v);
        else if (!strcmp(kv, "precision")) {
            if (keel_precision_parse(v, &c->precision)) return -1;
        } else
            return keel_fail("config '%s': unknown key '%s' (recompute, threads, backend, fault, precision)", s, kv);
        /* recompute layers:1,3 contains a comma: take the rest of a layers: list */
        if (!strcmp(kv, "recompute") && !strncmp(v, "layers:", 7)) {
            char *rest;
            while ((rest = strtok(NULL, ",")) && !strchr(rest, '='))
                snprintf(c->recompute + strlen(c->recompute), sizeof c->recompute - strlen(c->recompute), ",%s", rest);
            if (rest) return keel_fail("config '%s': put recompute=layers:... last", s);
            break;
        }
    }
    if (c->threads < 1) return keel_fail("config '%s': threads must be >= 1", s);
    return 0;
}

typedef struct {
    const char *model_dir;
    const int32_t *ids, *tgt;
    int64_t T;
    size_t max_bytes;
} job;

/* One configuration: build, fault, recompute, run with the tracer. */
static keel_tracer *run_one(const job *j, const run_config *c) {
    keel_recompute_mode rm;
    if (keel_recompute_parse(c->recompute, &rm)) return NULL;
    keel_backend *be = keel_backend_new(c->backend, c->threads);
    if (!be) return NULL;
    keel_tracer *tr = keel_tracer_new(true, j->max_bytes);
    if (!strncmp(c->fault, "copy-row-limit:", 15)) {
        be->fault_row_limit = atoll(c->fault + 15);
        if (be->fault_row_limit <= 0 || be->oracle) {
            keel_fail("fault '%s': needs N > 0 and a backend other than ref (the oracle ignores faults)", c->fault);
            keel_backend_free(be), keel_tracer_free(tr);
            return NULL;
        }
    } else if (!strncmp(c->fault, "flip:", 5)) {
        tr->flip = c->fault + 5;
    } else if (c->fault[0]) {
        keel_fail("fault '%s': expected copy-row-limit:N or flip:NODE", c->fault);
        keel_backend_free(be), keel_tracer_free(tr);
        return NULL;
    }
    keel_type type = be->native_type;
    keel_checkpoint *ck = NULL;
    keel_step *st = NULL; /* the model's step, or the ACC case's */
    int rc = -1;
    if (j->model_dir) {
        ck = keel_checkpoint_open(j->model_dir);
        if (!ck) goto done;
        keel_step_opts so = {.cfg = &ck->cfg,
                             .type = type,
                             .batch = 1,
                             .window = j->T,
                             .backward = true,
                             .recompute = &rm,
                             .precision = c->precision};
        if (!(st = keel_step_build(&so)) || keel_step_place(st, be) || keel_checkpoint_load(ck, st->m, be) ||
            keel_step_write_batch(st, j->ids, j->tgt))
            goto done;
    } else { /* ACC(type=f32,ne_a=[4096,17,1,1],ne_b=[4096,16,1,1]): rows 1..16 of a get b added */
        if (!(st = keel_step_custom())) goto done;
        keel_ctx *ctx = st->ctx;
        keel_tensor *a = keel_set_name(keel_set_flags(keel_new_2d(ctx, type, 4096, 17), KEEL_FLAG_INPUT), "a");
        keel_tensor *b = keel_set_name(keel_set_flags(keel_new_2d(ctx, type, 4096, 16), KEEL_FLAG_INPUT), "b");
        keel_tensor *out = keel_acc(ctx, a, b, a->nb[1], a->nb[2], a->nb[3], a->nb[1], false);
        if (keel_step_set_outputs(st, &out, 1) || keel_step_place(st, be)) goto done;
        /* values in the tensors' own type: a raw transfer, not the (possibly faulted) copy path */
        size_t es = keel_type_size(type);
        unsigned char *v = malloc(4096 * 17 * es);
        if (!v) {
            keel_fail("out of memory for the flip check's values");
            goto done;
        }
        uint64_t rs = 99;
        for (int i = 0; i < 4096 * 17; i++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            double x = (double)(int)(rs >> 40) / 16777216.0 - 0.5;
            float xf = (float)x;
            if (type == KEEL_F32)
                memcpy(v + (size_t)i * 4, &xf, 4);
            else
                memcpy(v + (size_t)i * 8, &x, 8);
        }
        int w = keel_tensor_write(be, a, v, type) || keel_tensor_write(be, b, v + 4096 * es, type);
        free(v);
        if (w) goto done;
    }
    if (keel_tracer_begin(tr, be, st->g) || keel_session_run(st->s, keel_tracer_node, tr)) goto done;
    if (tr->flip && !tr->flipped) {
        keel_fail("fault flip:%s: no node of that name ran", tr->flip);
        goto done;
    }
    rc = 0;
done:
    keel_step_free(st);
    keel_checkpoint_close(ck);
    keel_backend_free(be);
    if (rc) {
        keel_tracer_free(tr);
        return NULL;
    }
    return tr;
}

static int usage(void) {
    fprintf(stderr,
            "usage: keel diff TRACE_A TRACE_B [--tolerance NMSE]\n"
            "       keel diff --model DIR [--data FILE] [--tokenizer FILE] [--window T] --a CONFIG --b CONFIG "
            "[--tolerance NMSE]\n"
            "       keel diff --case acc --a CONFIG --b CONFIG\n"
            "CONFIG: comma-separated recompute=MODE, threads=N, backend=ref|cpu|cuda, "
            "fault=copy-row-limit:N|flip:NODE, precision=f32|bf16\n");
    return 2;
}

int cmd_diff(int argc, char **argv) {
    const char *files[2] = {0}, *model = NULL, *data = NULL, *tok = NULL, *ca = NULL, *cb = NULL, *kase = NULL,
               *prec = NULL;
    double tol = 0;
    long long T = 32, max_bytes = 512ll << 20;
    int nf = 0;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &files[0], .meta = "TRACE_A",
         .help = "a trace (keel train --trace, keel check-reference --trace)"},
        {NULL, CLI_STR, &files[1], .meta = "TRACE_B",
         .help = "another: the first node whose inputs agree but output does not"},
        {"--tolerance", CLI_DBL, &tol, 0, 1e30, .meta = "NMSE",
         .help = "agreement within this normalised squared error (traces with data)"},
        {"--model", CLI_STR, &model, .meta = "DIR",
         .help = "or run one training step of this checkpoint twice, as --a and --b say"},
        {"--data", CLI_STR, &data, .meta = "FILE", .help = "with --model: the text of the step (default README.md)"},
        {"--tokenizer", CLI_STR, &tok, .meta = "FILE",
         .help = "with --model: tokenizer.json (default: the model's, else bytes)"},
        {"--window", CLI_INT, &T, 2, 1 << 20, .meta = "T", .help = "with --model: tokens (default 32)"},
        {"--case", CLI_STR, &kase, .meta = "acc", .help = "or run the ACC case of the op suite twice"},
        {"--a", CLI_STR, &ca, .meta = "CONFIG",
         .help = "run A: recompute=MODE,threads=N,backend=B,fault=copy-row-limit:N|flip:NODE,precision=P"},
        {"--b", CLI_STR, &cb, .meta = "CONFIG", .help = "run B, the same keys"},
        {"--precision", CLI_STR, &prec, .meta = "f32|bf16",
         .help = "with --model: both runs' precision, unless a CONFIG has its own (default f32)"},
        {"--trace-max-bytes", CLI_INT, &max_bytes, 0, 9e15, .meta = "N",
         .help = "bytes of node data kept per run (default 512 MiB)"},
    };
    const cli_spec spec = {"keel diff", "the first node whose inputs agree but whose output does not", flags,
                           (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    nf = !!files[0] + !!files[1];
    if (nf == 2) {
        keel_tracer *ta = keel_trace_read(files[0]), *tb = ta ? keel_trace_read(files[1]) : NULL;
        if (!ta || !tb) {
            fprintf(stderr, "keel diff: %s\n", keel_last_error());
            keel_tracer_free(ta);
            return 2;
        }
        int r = keel_trace_diff(ta, tb, tol, stdout);
        keel_tracer_free(ta), keel_tracer_free(tb);
        return r;
    }
    if (nf || (!model && !kase) || (kase && strcmp(kase, "acc")) || !ca || !cb) return usage();
    run_config A, B;
    keel_precision p0 = KEEL_PRECISION_F32;
    if ((prec && keel_precision_parse(prec, &p0)) || parse_config(ca, p0, &A) || parse_config(cb, p0, &B)) {
        fprintf(stderr, "keel diff: %s\n", keel_last_error());
        return 2;
    }
    job j = {.model_dir = model, .T = T, .max_bytes = (size_t)max_bytes};
    int32_t *ids = NULL, *tgt = NULL;
    if (model) { /* one window of the data: its tokens (or bytes) and the next ones */
        keel_qwen35_config cfg;
        bool mm;
        if (keel_hf_config_read(model, &cfg, &mm)) {
            fprintf(stderr, "keel diff: %s\n", keel_last_error());
            return 2;
        }
        ids = malloc((size_t)T * 4), tgt = malloc((size_t)T * 4);
        if (!ids || !tgt) {
            fprintf(stderr, "keel diff: out of memory for a window of %lld tokens\n", (long long)T);
            return 2;
        }
        unsigned char *text = NULL;
        size_t n = 0;
        if (data) {
            FILE *f = fopen(data, "rb");
            if (!f) {
                fprintf(stderr, "keel diff: cannot read %s\n", data);
                return 2;
            }
            text = malloc(1 << 20);
            n = text ? fread(text, 1, 1 << 20, f) : 0;
            fclose(f);
            if (!text) {
                fprintf(stderr, "keel diff: out of memory reading %s\n", data);
                return 2;
            }
        }
        int32_t *tk = NULL;
        size_t nt = 0;
        if (tok && data) {
            keel_tokenizer *t = keel_tokenizer_load(tok);
            if (!t || keel_tokenizer_encode(t, (char *)text, n, &tk, &nt)) {
                fprintf(stderr, "keel diff: %s\n", keel_last_error());
                return 2;
            }
            keel_tokenizer_free(t);
        }
        for (long long i = 0; i < T; i++) {
            int64_t at = i, next = i + 1;
            int32_t x = nt > (size_t)next ? tk[at] : n > (size_t)next ? text[at] : (int32_t)((at * 7919) % cfg.vocab);
            int32_t y = nt > (size_t)next  ? tk[next]
                        : n > (size_t)next ? text[next]
                                           : (int32_t)((next * 7919) % cfg.vocab);
            ids[i] = (int32_t)(x % cfg.vocab), tgt[i] = (int32_t)(y % cfg.vocab);
        }
        free(text), free(tk);
        j.ids = ids, j.tgt = tgt;
    }
    keel_tracer *ta = run_one(&j, &A), *tb = ta ? run_one(&j, &B) : NULL;
    if (!ta || !tb) {
        fprintf(stderr, "keel diff: %s\n", keel_last_error());
        keel_tracer_free(ta);
        free(ids), free(tgt);
        return 2;
    }
    printf("A: %s (%lld nodes traced)\nB: %s (%lld nodes traced)\n", ca, (long long)ta->n, cb, (long long)tb->n);
    int r = keel_trace_diff(ta, tb, tol, stdout);
    keel_tracer_free(ta), keel_tracer_free(tb);
    free(ids), free(tgt);
    return r;
}
