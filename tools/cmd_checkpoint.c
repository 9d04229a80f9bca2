/* keel save / init / info / export: checkpoint folders in and out, what training one costs, and
 * the GGUF file llama.cpp runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "autodiff/autodiff.h"
#include "cli.h"
#include "cli_flags.h"
#include "io/checkpoint.h"
#include "io/adapter.h"
#include "io/gguf_export.h"
#include "ops/ops.h"
#include "recompute/recompute.h"
#include "util/clock.h"
#include "train/step.h"
#include "util/error.h"
#include "util/file.h"

static int parse_dtype(const char *v, keel_type *out) {
    int t = v ? keel_type_from_name(v) : -1;
    if (t != KEEL_F32 && t != KEEL_BF16 && t != KEEL_F16) {
        fprintf(stderr, "keel: --dtype expects f32, bf16 or f16, got '%s'\n", v ? v : "");
        return -1;
    }
    *out = (keel_type)t;
    return 0;
}

/* A model's parameters on a backend of their own (no graph beyond the leaves), of a type. */
static keel_step *load_params_typed(keel_backend *be, const keel_qwen35_config *cfg, keel_type type) {
    keel_step_opts so = {.cfg = cfg, .type = type, .weights_only = true};
    keel_step *st = be ? keel_step_build(&so) : NULL;
    if (st && keel_step_place(st, be)) keel_step_free(st), st = NULL;
    return st;
}
static keel_step *load_params(keel_backend *be, const keel_qwen35_config *cfg) {
    return load_params_typed(be, cfg, KEEL_F32);
}

/* Re-open what was written and compare every parameter bitwise with the values in memory. */
static int verify_saved(const char *dir, const keel_qwen35 *m, keel_backend *be, keel_type dtype) {
    keel_checkpoint *ck = keel_checkpoint_open(dir);
    if (!ck) return -1;
    int bad = 0;
    for (int p = 0; p < m->n_params; p++) {
        const keel_st_tensor *s = keel_checkpoint_find(ck, m->params[p]->name);
        size_t bytes = (size_t)keel_nelements(m->params[p]) * keel_type_size(dtype);
        void *buf = malloc(bytes ? bytes : 1);
        if (!s || !buf || keel_tensor_read(be, m->params[p], buf, dtype) || s->nbytes != bytes ||
            memcmp(buf, s->data, bytes)) {
            fprintf(stderr, "keel save: '%s' does not read back identical\n", m->params[p]->name);
            bad++;
        }
        free(buf);
    }
    keel_checkpoint_close(ck);
    return bad ? keel_fail("%d tensors differ after reloading %s", bad, dir) : 0;
}

int cmd_save(int argc, char **argv) {
    const char *src = NULL, *out = NULL, *layout = NULL, *dts = NULL;
    bool allow_nonfinite = false;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &src, .meta = "SRC_DIR", .help = "a checkpoint folder (either layout, any dtype)",
         .required = true},
        {NULL, CLI_STR, &out, .meta = "OUT_DIR", .help = "the folder to write", .required = true},
        {"--dtype", CLI_STR, &dts, .meta = "f32|bf16|f16", .help = "the weights' type (default: the source's)"},
        {"--layout", CLI_STR, &layout, .meta = "text|multimodal", .help = "the layout (default: the source's)"},
        {"--allow-nonfinite", CLI_BOOL, &allow_nonfinite,
         .help = "write weights that hold NaN or Inf (refused otherwise)"},
    };
    const cli_spec spec = {"keel save", "write a checkpoint folder (as transformers does) and check it reloads bitwise",
                           flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    if (layout && strcmp(layout, "text") && strcmp(layout, "multimodal")) {
        fprintf(stderr, "keel save: --layout expects text or multimodal\n");
        return 2;
    }
    keel_checkpoint *ck = keel_checkpoint_open(src);
    if (!ck) {
        fprintf(stderr, "keel save: %s\n", keel_last_error());
        return 1;
    }
    keel_type dtype = KEEL_F32;
    int st = keel_type_from_name(ck->dtype[0] ? (strcmp(ck->dtype, "BF16") == 0  ? "bf16"
                                                 : strcmp(ck->dtype, "F16") == 0 ? "f16"
                                                                                 : "f32")
                                              : "f32");
    dtype = (keel_type)st;
    if (dts && parse_dtype(dts, &dtype)) {
        keel_checkpoint_close(ck);
        return 2;
    }
    bool mm = layout ? strcmp(layout, "multimodal") == 0 : ck->multimodal;
    keel_backend *be = keel_backend_new("cpu", 2);
    keel_step *L = load_params(be, &ck->cfg);
    int rc = !L || keel_checkpoint_load(ck, L->m, be) || (!allow_nonfinite && keel_checkpoint_check_finite(ck, L->m)) ||
             keel_checkpoint_save(out, L->m, be, dtype, ck, mm) || verify_saved(out, L->m, be, dtype);
    if (rc)
        fprintf(stderr, "keel save: %s\n", keel_last_error());
    else
        printf("saved %s -> %s (%s layout, %s, %d tensors; reloaded bitwise identical)\n", src, out,
               mm ? "multimodal" : "text", keel_type_name(dtype), L->m->n_params);
    keel_step_free(L);
    keel_backend_free(be);
    keel_checkpoint_close(ck);
    return rc ? 1 : 0;
}

int cmd_init(int argc, char **argv) {
    const char *pre = NULL, *cfg_path = NULL, *out = NULL, *dts = "f32";
    long long seed = 0;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &out, .meta = "OUT_DIR", .help = "the folder to write", .required = true},
        {"--preset", CLI_STR, &pre, .meta = "tiny|small|0.8b", .help = "a named shape"},
        {"--config", CLI_STR, &cfg_path, .meta = "CONFIG.json", .help = "a Hugging Face config.json (either layout)"},
        {"--seed", CLI_INT, &seed, 0, 9e15, .meta = "N", .help = "the weights' seed (default 0)"},
        {"--dtype", CLI_STR, &dts, .meta = "f32|bf16", .help = "the weights' type (default f32)"},
    };
    const cli_spec spec = {"keel init",
                           "a Qwen3.5-family checkpoint with random weights (transformers' initialisation), from a "
                           "preset or a config.json",
                           flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    keel_type dtype;
    keel_qwen35_config c;
    bool mm;
    if (!pre == !cfg_path) {
        fprintf(stderr, "keel init: give one of --preset and --config\n");
        cli_usage(&spec, stderr);
        return 2;
    }
    if (parse_dtype(dts, &dtype)) return 2;
    if (pre ? keel_qwen35_preset(pre, &c) : keel_hf_config_read_file(cfg_path, &c, &mm)) {
        fprintf(stderr, "keel init: %s\n", keel_last_error());
        return 2;
    }
    keel_backend *be = keel_backend_new("cpu", 2);
    keel_step *L = load_params(be, &c);
    int rc = !L || keel_qwen35_init_weights(L->m, be, (uint64_t)seed) ||
             keel_checkpoint_save(out, L->m, be, dtype, NULL, false);
    if (rc)
        fprintf(stderr, "keel init: %s\n", keel_last_error());
    else
        printf("wrote %s: %s %s, %lld layers, %s, seed %lld\n", out, pre ? "preset" : "config", pre ? pre : cfg_path,
               (long long)c.layers, keel_type_name(dtype), seed);
    keel_step_free(L);
    keel_backend_free(be);
    return rc ? 1 : 0;
}

static long peak_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* keel info --peak: what the activations at the plan's peak are */
static void peak_table(const keel_graph *g, const keel_plan *pl, const char *mode, const char *which) {
    enum { TOP = 12 };
    const keel_tensor *top[TOP];
    int64_t n = keel_plan_live_at(g, pl->peak_node, top, TOP), all = n < 0 ? 0 : n;
    if (n < 0) return;
    const keel_tensor *at = g->nodes[pl->peak_node];
    printf("  recompute %s: %s peaks at node %lld of %lld ('%s', %s): %lld activations live, the largest:\n", mode,
           which, (long long)pl->peak_node, (long long)g->n_nodes, at->name, keel_op_get(at->op)->name, (long long)all);
    for (int64_t i = 0; i < n && i < TOP; i++) {
        char shape[64];
        printf("    %9.1f MiB  %-40s %-26s %s\n", (double)keel_nbytes(top[i]) / (1 << 20), top[i]->name,
               keel_op_get(top[i]->op)->name, keel_shape_str(top[i]->ne, shape, sizeof shape));
    }
    int64_t nc = 0;
    size_t carried = keel_plan_carried_at(g, pl, pl->peak_node, &nc);
    if (nc) /* the backend's blocks kept from one node to a later one (the delta rule's chunk states) */
        printf("  and %lld carried blocks, %.1f MiB (what a node's kernel keeps for a later node's)\n", (long long)nc,
               (double)carried / (1 << 20));
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL, *dump = NULL, *rmode = "off", *adapter_dir = NULL, *prec_s = "f32";
    long long B = 1, T = 1024, threads = 2;
    bool run = false, peak = false;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &dir, .meta = "CHECKPOINT", .help = "a checkpoint folder", .required = true},
        {"--batch", CLI_INT, &B, 1, 1 << 20, .meta = "B", .help = "batch of the planned training step (default 1)"},
        {"--window", CLI_INT, &T, 1, 1 << 24, .meta = "T",
         .help = "window of the planned training step (default 1024)"},
        {"--recompute", CLI_STR, &rmode, .meta = "MODE", .help = "the mode --run and --peak use (default off)"},
        {"--precision", CLI_STR, &prec_s, .meta = "f32|bf16", .help = "of the planned training step (default f32)"},
        {"--run", CLI_BOOL, &run, .help = "time one forward + backward on the cpu and report the peak RSS"},
        {"--peak", CLI_BOOL, &peak,
         .help = "the activations live at the planned peak of the --recompute mode's step, largest first"},
        {"--dump-logits", CLI_STR, &dump, .meta = "FILE", .help = "with --run: input ids and logits (safetensors)"},
        {"--adapter", CLI_STR, &adapter_dir, .meta = "DIR",
         .help = "a PEFT LoRA adapter beside the weights: the plans train only its factors"},
        {"--threads", CLI_INT, &threads, 1, 1024, .meta = "N", .help = "cpu threads (default 2)"},
    };
    const cli_spec spec = {"keel info", "layers, parameters, and the memory of a training step per recompute mode",
                           flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    if (dump) run = true;
    keel_checkpoint *ck = keel_checkpoint_open(dir);
    keel_adapter *ad = ck && adapter_dir ? keel_adapter_open(adapter_dir) : NULL;
    if (!ck || (adapter_dir && !ad)) {
        fprintf(stderr, "keel info: %s\n", keel_last_error());
        keel_checkpoint_close(ck);
        return 1;
    }
    const keel_qwen35_config *c = &ck->cfg;
    int n_full = 0;
    for (int64_t i = 0; i < c->layers; i++) n_full += c->full_attention[i];
    keel_ctx *ctx = keel_ctx_new();
    keel_qwen35 *m = keel_qwen35_new(ctx, c, KEEL_F32);
    if (!m || keel_checkpoint_validate(ck, m) || keel_checkpoint_check_finite(ck, m)) { /* as every command does */
        fprintf(stderr, "keel info: %s\n", keel_last_error());
        keel_qwen35_free(m);
        keel_ctx_free(ctx);
        keel_adapter_close(ad);
        keel_checkpoint_close(ck);
        return 1;
    }
    int64_t n_par = 0, n_trained = 0;
    for (int p = 0; p < m->n_params; p++) n_par += keel_nelements(m->params[p]);
    printf("%s: %s layout, weights %s\n", dir, ck->multimodal ? "multimodal" : "text", ck->dtype);
    printf("layers %lld (%lld Gated DeltaNet, %d gated attention), hidden %lld, ffn %lld, vocab %lld, %s head\n",
           (long long)c->layers, (long long)c->layers - n_full, n_full, (long long)c->hidden, (long long)c->ffn,
           (long long)c->vocab, c->tied ? "tied" : "untied");
    printf("parameters: %lld (%.3f B)\n", (long long)n_par, (double)n_par / 1e9);
    keel_recompute_mode run_mode;
    keel_precision prec;
    if (keel_recompute_parse(rmode, &run_mode) || keel_precision_parse(prec_s, &prec)) {
        fprintf(stderr, "keel info: %s\n", keel_last_error());
        keel_qwen35_free(m);
        keel_ctx_free(ctx);
        keel_adapter_close(ad);
        keel_checkpoint_close(ck);
        return 2;
    }
    n_trained = n_par;
    if (ad) { /* only the adapter's factors train: r (in + out) per adapted weight */
        char **names = NULL;
        int nn = 0;
        n_trained = 0;
        if (keel_adapter_targets(ad, &names, &nn) == 0)
            for (int i = 0; i < nn; i++)
                for (int p = 0; p < m->n_params; p++)
                    if (strcmp(m->params[p]->name, names[i]) == 0)
                        n_trained += ad->r * (m->params[p]->ne[0] + m->params[p]->ne[1]);
        keel_lora_names_free(names, nn);
        printf("adapter %s: rank %lld, %d weights adapted, %lld parameters trained\n", adapter_dir, (long long)ad->r,
               nn, (long long)n_trained);
    }
    keel_qwen35_free(m);
    keel_ctx_free(ctx);
    ctx = NULL, m = NULL;
    double gib = 1024.0 * 1024 * 1024, moments = (double)n_trained * 4 * 2 / gib;
    printf("\ntraining step, %s, batch %lld x window %lld, planned by keel's memory plan (AdamW moments: %.2f GiB "
           "more):\n",
           prec == KEEL_PRECISION_BF16 ? "bf16 mixed precision" : "float32", B, T, moments);
    keel_plan_opts cuda_rules = {0}; /* built in: a second plan with its kernels' scratch in the arena */
    bool cuda = keel_backend_plan_rules("cuda", &cuda_rules) == 0;
    printf("%-12s %14s %22s %14s %16s%s\n", "recompute", "planned peak", "params+grads+moments", "activations", "total",
           cuda ? "  cuda largest scratch     cuda total" : "");
    const char *modes[] = {"off", "full", "every:2", "every:4", rmode};
    int n_modes =
        4 + (strcmp(rmode, "off") && strcmp(rmode, "full") && strcmp(rmode, "every:2") && strcmp(rmode, "every:4"));
    keel_step *kept = NULL; /* the --recompute mode's step, for --run */
    int rc = 1, run_failed = 0;
    for (int mi = 0; mi < n_modes; mi++) { /* build each mode's graph; keep the one --run uses */
        bool keep = strcmp(modes[mi], rmode) == 0 && !kept;
        keel_recompute_mode rm;
        keel_recompute_parse(modes[mi], &rm);
        keel_step_opts so = {.cfg = c,
                             .type = KEEL_F32,
                             .batch = B,
                             .window = T,
                             .backward = true,
                             .recompute = &rm,
                             .keep_logits = keep && dump,
                             .adapter = ad,
                             .precision = prec};
        so.weight_copies = keel_step_copies_wanted(&so); /* as keel train plans it */
        keel_step *st = keel_step_build(&so);
        if (!st) {
            fprintf(stderr, "keel info: %s\n", keel_last_error());
            goto done;
        }
        keel_plan *pl = keel_plan_make(st->g, NULL), *pc = cuda ? keel_plan_make(st->g, &cuda_rules) : NULL;
        if (!pl || (cuda && !pc)) {
            fprintf(stderr, "keel info: %s\n", keel_last_error());
            keel_plan_free(pl), keel_step_free(st);
            goto done;
        }
        double planned = (double)pl->total_bytes / gib, act = (double)pl->peak_activation_bytes / gib;
        printf("%-12s %10.2f GiB %18.2f GiB %10.2f GiB %12.2f GiB", modes[mi], planned,
               (double)pl->persistent_bytes / gib + moments, act, planned + moments);
        if (pc)
            printf(" %17.2f GiB %10.2f GiB", (double)pc->scratch_max / gib, (double)pc->total_bytes / gib + moments);
        printf("\n");
        if (peak && strcmp(modes[mi], rmode) == 0 && !kept) {
            peak_table(st->g, pc ? pc : pl, modes[mi], pc ? "the cuda plan" : "the plan");
            if (pc) { /* a node's scratch lives while it runs: at the peak, and the largest anywhere */
                const keel_tensor *at = st->g->nodes[pc->peak_node], *big = NULL;
                if (pc->scratch_max_node >= 0) big = st->g->nodes[pc->scratch_max_node];
                printf("  cuda scratch at that node: %.1f MiB; the largest: %.1f MiB, for '%s' (%s)\n",
                       (double)pc->scratch_size[at->id] / (1 << 20), (double)pc->scratch_max / (1 << 20),
                       big ? big->name : "-", big ? keel_op_get(big->op)->name : "-");
            }
        }
        keel_plan_free(pl), keel_plan_free(pc);
        if (keep)
            kept = st;
        else
            keel_step_free(st);
    }
    if (run) {
        keel_backend *be = keel_backend_new("cpu", (int)threads);
        if (!be || keel_step_place(kept, be) ||
            keel_step_load(kept, ck)) { /* the checkpoint's (and adapter's) weights */
            fprintf(stderr, "keel info: %s\n", keel_last_error());
            keel_backend_free(be);
            goto done;
        }
        double planned = (double)kept->s->plan->total_bytes / gib;
        int32_t *iv = malloc((size_t)(B * T) * 4);
        for (long long i = 0; iv && i < B * T; i++) iv[i] = (int32_t)((i * 2654435761u) % (uint64_t)c->vocab);
        int r = iv ? keel_step_write_batch(kept, iv, iv) : keel_fail("out of memory for a batch of %lld x %lld", B, T);
        double t0 = keel_now_s();
        r = r || keel_session_run(kept->s, NULL, NULL);
        double secs = keel_now_s() - t0;
        float loss = NAN;
        keel_tensor_read(be, kept->out.loss, &loss, KEEL_F32);
        printf(
            "\nran one forward + backward on cpu (recompute %s, %lld threads): %s, loss %.4f, %.1f s, %.0f tokens/s\n",
            rmode, threads, r ? keel_last_error() : "ok", loss, secs, (double)(B * T) / secs);
        printf("process peak RSS %.2f GiB (the plan for this graph: %.2f GiB; weights as loaded: %.2f GiB)\n",
               (double)peak_rss_kib() / (1024.0 * 1024), planned, (double)n_par * 4 / gib);
        if (dump && !r) { /* input ids [B,T] and logits [B,T,V], as a transformers run would name them */
            double *lg = keel_tensor_read_f64(be, kept->out.logits), *idd = malloc((size_t)(B * T) * sizeof(double));
            for (long long i = 0; idd && i < B * T; i++) idd[i] = iv[i];
            keel_st_entry e[2] = {
                {.name = "input_ids", .type = KEEL_I32, .n_dims = 2, .shape = {B, T}, .values = idd},
                {.name = "logits", .type = KEEL_F32, .n_dims = 3, .shape = {B, T, c->vocab}, .values = lg}};
            if (!idd) keel_fail("out of memory for %lld input ids", B * T);
            if (!lg || !idd || keel_st_write(dump, e, 2))
                fprintf(stderr, "keel info: %s\n", keel_last_error()), r = -1;
            else
                printf("wrote input ids and logits to %s\n", dump);
            free(lg), free(idd);
        }
        run_failed = r != 0;
        free(iv);
        keel_step_free(kept), kept = NULL; /* its session before its backend */
        keel_backend_free(be);
    }
    rc = run_failed ? 1 : 0;
done:
    keel_step_free(kept);
    keel_adapter_close(ad);
    keel_checkpoint_close(ck);
    return rc;
}

/* Progress on a terminal: a 0.8B export writes 1.5 GB. */
static void export_progress(void *ud, int done, int total) {
    if (!isatty(fileno(stderr))) return;
    fprintf(stderr, "\rkeel export: %s: %d/%d tensors", (const char *)ud, done, total);
    if (done == total) fputc('\n', stderr);
}

int cmd_export(int argc, char **argv) {
    const char *fmt = NULL, *src = NULL, *out = NULL, *type = "f16", *adapter_dir = NULL;
    keel_gguf_export_opts o = {0};
    bool byte_vocab = false;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &fmt, .meta = "gguf", .help = "the format", .required = true},
        {NULL, CLI_STR, &src, .meta = "CHECKPOINT", .help = "a checkpoint folder", .required = true},
        {NULL, CLI_STR, &out, .meta = "OUT.gguf", .help = "the file to write", .required = true},
        {"--type", CLI_STR, &type, .meta = "f32|f16|bf16|q8_0",
         .help = "the matrices' type (default f16; q8_0: llama.cpp's 8-bit blocks); norms, biases, the conv stay f32"},
        {"--adapter", CLI_STR, &adapter_dir, .meta = "DIR",
         .help = "a PEFT LoRA adapter, merged first (W + alpha/r B A, float64)"},
        {"--tokenizer", CLI_STR, &o.tokenizer, .meta = "FILE",
         .help = "the tokenizer.json to embed (default CHECKPOINT's; its tokenizer_config.json beside it)"},
        {"--byte-vocab", CLI_BOOL, &byte_vocab,
         .help = "trained on bytes (automatic for vocab 256 or a keel byte run)"},
        {"--name", CLI_STR, &o.name, .meta = "NAME", .help = "general.name (default: the checkpoint folder's name)"},
    };
    const cli_spec spec = {"keel export",
                           "a GGUF file for llama.cpp's qwen35 architecture (llama.cpp, Ollama, LM Studio)", flags,
                           (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    o.byte_vocab = byte_vocab;
    if (strcmp(fmt, "gguf")) { /* the table made fmt, src and out required */
        fprintf(stderr, "keel export: the format is 'gguf' (got '%s')\n", fmt);
        cli_usage(&spec, stderr);
        return 2;
    }
    static const struct {
        const char *name;
        keel_ggml_type t;
    } types[] = {{"f32", KEEL_GGML_F32}, {"f16", KEEL_GGML_F16}, {"bf16", KEEL_GGML_BF16}, {"q8_0", KEEL_GGML_Q8_0}};
    int ti = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(type, types[i].name) == 0) ti = i;
    if (ti < 0) {
        fprintf(stderr, "keel export: --type expects f32, f16, bf16 or q8_0, got '%s'\n", type);
        return 2;
    }
    if (o.tokenizer && o.byte_vocab) {
        fprintf(stderr, "keel export: --tokenizer and --byte-vocab exclude each other\n");
        return 2;
    }
    o.type = types[ti].t, o.progress = export_progress, o.ud = (void *)out;
    keel_checkpoint *ck = keel_checkpoint_open(src);
    if (!ck) {
        fprintf(stderr, "keel export: %s\n", keel_last_error());
        return 1;
    }
    if (keel_gguf_check_config(&ck->cfg)) {
        fprintf(stderr, "keel export: %s: %s\n", src, keel_last_error());
        keel_checkpoint_close(ck);
        return 1;
    }
    keel_adapter *ad = NULL;
    if (adapter_dir && !(ad = keel_adapter_open(adapter_dir))) {
        fprintf(stderr, "keel export: %s\n", keel_last_error());
        keel_checkpoint_close(ck);
        return 1;
    }
    keel_backend *be = keel_backend_new("cpu", 2);
    /* with an adapter, float64 weights: W + s B A is rounded once, to the file's type */
    keel_step *L = load_params_typed(be, &ck->cfg, ad ? KEEL_F64 : KEEL_F32);
    int n_merged = 0;
    int rc = !L || keel_checkpoint_load(ck, L->m, be) || (ad && keel_adapter_merge(ad, L->m, be, &n_merged)) ||
             keel_gguf_export(ck, L->m, be, out, &o);
    if (rc)
        fprintf(stderr, "keel export: %s\n", keel_last_error());
    else {
        if (ad)
            printf("merged %s into %d weights (rank %lld, alpha %g, scale %g)\n", adapter_dir, n_merged,
                   (long long)ad->r, ad->alpha, ad->scale);
        printf("exported %s -> %s (qwen35, %s matrices, %d tensors)\n", src, out, type, L->m->n_params);
    }
    keel_adapter_close(ad);
    keel_step_free(L);
    keel_backend_free(be);
    keel_checkpoint_close(ck);
    return rc ? 1 : 0;
}

/* The tokenizer and generation files beside a checkpoint travel with a merged copy of it. */
static int copy_side_files(const char *tmp_dir, void *ud) {
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                  "special_tokens_map.json", "generation_config.json"};
    const char *src = ud;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", tmp_dir, files[i]);
        if (access(a, R_OK) == 0 && keel_copy_file(a, b)) return -1;
    }
    return 0;
}

int cmd_merge(int argc, char **argv) {
    const char *base = NULL, *adapter_dir = NULL, *out = NULL, *dts = NULL;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &base, .meta = "BASE", .help = "the checkpoint the adapter was trained on", .required = true},
        {NULL, CLI_STR, &adapter_dir, .meta = "ADAPTER",
         .help = "a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors)", .required = true},
        {NULL, CLI_STR, &out, .meta = "OUT", .help = "the merged checkpoint folder to write", .required = true},
        {"--dtype", CLI_STR, &dts, .meta = "f32|bf16|f16", .help = "the weights' type (default: the base's)"},
    };
    const cli_spec spec = {"keel merge",
                           "a full checkpoint with a LoRA adapter merged in: W + (alpha/r) B A in float64, rounded "
                           "once to the output type",
                           flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    keel_checkpoint *ck = keel_checkpoint_open(base);
    keel_adapter *ad = ck ? keel_adapter_open(adapter_dir) : NULL;
    if (!ck || !ad) {
        fprintf(stderr, "keel merge: %s\n", keel_last_error());
        keel_checkpoint_close(ck);
        return 1;
    }
    keel_type dtype = strcmp(ck->dtype, "BF16") == 0 ? KEEL_BF16 : strcmp(ck->dtype, "F16") == 0 ? KEEL_F16 : KEEL_F32;
    if (dts && parse_dtype(dts, &dtype)) {
        keel_adapter_close(ad);
        keel_checkpoint_close(ck);
        return 2;
    }
    keel_backend *be = keel_backend_new("cpu", 2);
    keel_step *L = load_params_typed(be, &ck->cfg, KEEL_F64);
    int n_merged = 0;
    int rc = !L || keel_checkpoint_load(ck, L->m, be) || keel_adapter_merge(ad, L->m, be, &n_merged) ||
             keel_checkpoint_check_finite(ck, L->m) ||
             keel_checkpoint_save_ex(out, L->m, be, dtype, ck, ck->multimodal, copy_side_files, (void *)base) ||
             verify_saved(out, L->m, be, dtype);
    if (rc)
        fprintf(stderr, "keel merge: %s\n", keel_last_error());
    else
        printf("merged %s into %d weights of %s (rank %lld, alpha %g, scale %g) -> %s (%s, %s layout; reloaded "
               "bitwise identical)\n",
               adapter_dir, n_merged, base, (long long)ad->r, ad->alpha, ad->scale, out, keel_type_name(dtype),
               ck->multimodal ? "multimodal" : "text");
    keel_step_free(L);
    keel_backend_free(be);
    keel_adapter_close(ad);
    keel_checkpoint_close(ck);
    return rc ? 1 : 0;
}
