#define _DEFAULT_SOURCE /* mkdtemp */
/* keel bench train: tokens/s and peak memory of float32 training steps (forward, backward and an
 * AdamW update of every parameter) of a Qwen3.5-0.8B-shaped model, next to PyTorch running
 * transformers' own Qwen3.5 on the same configuration, in the same run and on the same device
 * (bench/torch_qwen35.py: float32, TF32 off). keel runs first and frees its memory before the
 * PyTorch process starts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_util.h"
#include "spawn.h"
#include "cli.h"
#include "cli_flags.h"
#include "io/checkpoint.h"
#include "model/lora.h"
#include "model/qwen35.h"
#include "ops/ops.h"
#include "recompute/recompute.h"
#include "train/optim.h"
#include "train/step.h"
#include "util/error.h"
#include "util/rng.h"

typedef struct {
    const char *backend, *preset, *recompute, *torch, *python, *base_dtype, *precision;
    keel_precision prec;
    long long batch, window, steps, warmup, threads, lora_rank;
} bench_opts;

typedef struct {
    double step_s, tokens_per_s, peak_bytes, first_loss, last_loss;
    double planned_bytes; /* keel: the plan's arena, the nodes' scratch in it */
    bool device_peak;     /* peak_bytes is the backend's own count (device memory), which the plan predicts */
    const char *peak_what;
} bench_result;

/* lora_rank 0: full fine-tuning (AdamW on every parameter); else LoRA adapters of that rank on
 * every projection, the base frozen (in bf16 with base_bf16), AdamW on the adapters only. */
static int run_keel(const bench_opts *o, const keel_qwen35_config *cfg, long long lora_rank, bool base_bf16,
                    bench_result *r) {
    keel_recompute_mode rm;
    if (keel_recompute_parse(o->recompute, &rm)) return -1;
    int64_t T = o->window, B = o->batch;
    keel_backend *be = keel_backend_new(o->backend, (int)o->threads);
    keel_lora_opts lo = {.rank = lora_rank, .alpha = (double)lora_rank, .seed = 5};
    keel_step_opts so = {.cfg = cfg,
                         .type = KEEL_F32,
                         .batch = B,
                         .window = T,
                         .backward = true,
                         .recompute = &rm,
                         .lora = lora_rank ? &lo : NULL,
                         .base_bf16 = base_bf16,
                         .precision = o->prec};
    so.weight_copies = keel_step_copies_wanted(&so); /* as keel train does */
    keel_step *sp = be ? keel_step_build(&so) : NULL;
    int32_t *iv = NULL, *tv = NULL;
    double *times = NULL;
    keel_tensor **tp = NULL;
    int n_tp = sp ? keel_step_trainable(sp, &tp) : -1;
    int rc = -1;
    if (n_tp < 0 || keel_step_adamw(sp, tp, NULL, n_tp, 1e-4, 0.1, 0, 1) || keel_step_place(sp, be)) goto done;
    int64_t n_trained = 0;
    for (int i = 0; i < n_tp; i++) n_trained += keel_nelements(tp[i]);
    r->planned_bytes = (double)sp->s->plan->total_bytes;
    printf("keel%s: %d parameter tensors trained (%lld parameters), plan %.2f GiB (activations and node scratch %.2f "
           "GiB; largest scratch %.2f GiB), initialising...\n",
           lora_rank ? " LoRA" : "", n_tp, (long long)n_trained, (double)sp->s->plan->total_bytes / (1 << 30),
           (double)sp->s->plan->peak_activation_bytes / (1 << 30), (double)sp->s->plan->scratch_max / (1 << 30));
    fflush(stdout);
    if (keel_qwen35_init_weights(sp->m, be, 5) || keel_lora_init_weights(sp->m, be, 5) || keel_step_sync_copies(sp))
        goto done;
    iv = malloc((size_t)(T * B) * 4), tv = malloc((size_t)(T * B) * 4);
    times = malloc((size_t)(o->warmup + o->steps) * sizeof *times);
    if (!iv || !tv || !times) {
        keel_fail("out of memory");
        goto done;
    }
    uint64_t st = 12345;
    for (long long step = 0; step < o->warmup + o->steps; step++) {
        for (int64_t i = 0; i < T * B; i++) iv[i] = (int32_t)(keel_splitmix64(&st) % (uint64_t)cfg->vocab);
        for (int64_t i = 0; i < T * B; i++) tv[i] = (int32_t)(keel_splitmix64(&st) % (uint64_t)cfg->vocab);
        keel_adamw_set(sp->opt.adamw, step + 1, 1e-4);
        double t0 = keel_now_s();
        float loss;
        if (keel_step_run(sp, iv, tv, NULL, NULL) || keel_tensor_read(be, sp->out.loss, &loss, KEEL_F32)) goto done;
        times[step] = keel_now_s() - t0;
        if (step == 0) r->first_loss = loss;
        r->last_loss = loss;
        printf("keel step %lld%s: %.3f s, loss %.4f\n", step + 1, step < o->warmup ? " (warm-up)" : "", times[step],
               loss);
        fflush(stdout);
        if (step + 1 == o->warmup && be->profile_reset) be->profile_reset(be); /* the table: timed steps only */
        if (!isfinite(loss)) {
            keel_fail("keel: loss is not finite at step %lld", step + 1);
            goto done;
        }
    }
    qsort(times + o->warmup, (size_t)o->steps, sizeof *times, bench_cmp_d);
    r->step_s = times[o->warmup + o->steps / 2];
    r->tokens_per_s = (double)(T * B) / r->step_s;
    if (be->peak_bytes)
        r->peak_bytes = (double)be->peak_bytes(be), r->peak_what = "device memory keel allocated",
        r->device_peak = true;
    if (!r->peak_what) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        r->peak_bytes = (double)ru.ru_maxrss * 1024.0, r->peak_what = "process peak RSS";
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "keel bench train: %s\n", keel_last_error());
    free(iv), free(tv), free(times), free(tp);
    keel_step_free(sp);
    keel_backend_free(be);
    return rc;
}

/* The PyTorch peer: the script prints one line "RESULT {json}" with step_s, tokens_per_s, peak_bytes
 * (and first_loss); any other line is passed through. */
static int run_torch(const bench_opts *o, const keel_qwen35_config *cfg, bench_result *r) {
    char dir[] = "/tmp/keel-bench-XXXXXX";
    if (!mkdtemp(dir)) return keel_fail("cannot create a temporary folder for the PyTorch config");
    char path[64], line[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *js = keel_hf_config_json(cfg, KEEL_F32);
    FILE *f = fopen(path, "w");
    int ok = js && f && fputs(js, f) >= 0;
    if (f) ok = fclose(f) == 0 && ok;
    free(js);
    if (!ok) return keel_fail("%s: cannot write", path);
    char b_s[24], w_s[24], s_s[24], u_s[24];
    snprintf(b_s, sizeof b_s, "%lld", o->batch), snprintf(w_s, sizeof w_s, "%lld", o->window);
    snprintf(s_s, sizeof s_s, "%lld", o->steps), snprintf(u_s, sizeof u_s, "%lld", o->warmup);
    /* no shell: --python and --torch are one argument each, whatever they hold */
    char *argv_py[] = {(char *)o->python,
                       (char *)o->torch,
                       "--config",
                       dir,
                       "--batch",
                       b_s,
                       "--window",
                       w_s,
                       "--steps",
                       s_s,
                       "--warmup",
                       u_s,
                       "--precision",
                       (char *)keel_precision_name(o->prec),
                       NULL};
    printf("\n$");
    for (int i = 0; argv_py[i]; i++) printf(" %s", argv_py[i]);
    printf("\n");
    keel_child ch;
    if (keel_spawn_read(argv_py, NULL, NULL, true, &ch)) {
        remove(path), rmdir(dir);
        return -1;
    }
    FILE *p = ch.out;
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        if (!strncmp(line, "RESULT ", 7)) {
            cJSON *j = cJSON_Parse(line + 7);
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "step_s"),
                        *b = cJSON_GetObjectItemCaseSensitive(j, "tokens_per_s"),
                        *c = cJSON_GetObjectItemCaseSensitive(j, "peak_bytes"),
                        *d = cJSON_GetObjectItemCaseSensitive(j, "first_loss");
            if (cJSON_IsNumber(a) && cJSON_IsNumber(b) && cJSON_IsNumber(c)) {
                r->step_s = a->valuedouble, r->tokens_per_s = b->valuedouble, r->peak_bytes = c->valuedouble, got = 1;
                r->first_loss = cJSON_IsNumber(d) ? d->valuedouble : NAN;
                r->peak_what = "torch.cuda.max_memory_allocated";
            }
            cJSON_Delete(j);
        } else {
            fputs(line, stdout);
        }
    }
    int st = keel_spawn_wait(&ch);
    remove(path);
    rmdir(dir);
    if (!got) return keel_fail("%s printed no RESULT line (exit status %d)", o->torch, st);
    return 0;
}

int cmd_bench_train(int argc, char **argv) {
#ifdef KEEL_HAVE_CUDA
    const char *default_backend = "cuda";
#else
    const char *default_backend = "cpu";
#endif
    bench_opts o = {.backend = default_backend,
                    .preset = "0.8b",
                    .recompute = "off",
                    .torch = "bench/torch_qwen35.py",
                    .python = "python3",
                    .batch = 4,
                    .window = 1024,
                    .steps = 5,
                    .warmup = 2,
                    .threads = 2,
                    .base_dtype = "f32",
                    .precision = "f32"};
    bool no_torch = false;
    const cli_flag flags[] = {
        {"--backend", CLI_STR, &o.backend, .meta = "B", .help = "cuda or cpu (default: cuda when built with it)"},
        {"--preset", CLI_STR, &o.preset, .meta = "NAME", .help = "the model's shape (default 0.8b)"},
        {"--batch", CLI_INT, &o.batch, 1, 1 << 20, .meta = "B", .help = "sequences per step (default 4)"},
        {"--window", CLI_INT, &o.window, 2, 1 << 24, .meta = "T", .help = "tokens per sequence (default 1024)"},
        {"--steps", CLI_INT, &o.steps, 1, 1 << 20, .meta = "N",
         .help = "timed steps; the median is reported (default 5)"},
        {"--warmup", CLI_INT, &o.warmup, 0, 1 << 20, .meta = "N", .help = "untimed steps first (default 2)"},
        {"--recompute", CLI_STR, &o.recompute, .meta = "MODE", .help = "off, full, every:N, layers:i,j (default off)"},
        {"--threads", CLI_INT, &o.threads, 1, 1024, .meta = "N", .help = "cpu threads (default 2)"},
        {"--precision", CLI_STR, &o.precision, .meta = "f32|bf16",
         .help = "f32 (default), or bf16 mixed precision (bf16 product operands, float32 sums, master weights and "
                 "moments; PyTorch under torch.autocast(bfloat16))"},
        {"--torch", CLI_STR, &o.torch, .meta = "FILE",
         .help = "the PyTorch peer's script (default bench/torch_qwen35.py)"},
        {"--python", CLI_STR, &o.python, .meta = "PYTHON", .help = "the interpreter that runs it (default python3)"},
        {"--no-torch", CLI_BOOL, &no_torch, .help = "keel alone"},
        {"--lora-rank", CLI_INT, &o.lora_rank, 1, 1 << 16, .meta = "R",
         .help = "also train LoRA adapters of rank R on every projection (base frozen) and compare with full "
                 "fine-tuning"},
        {"--base-dtype", CLI_STR, &o.base_dtype, .meta = "f32|bf16",
         .help = "with --lora-rank: the frozen base's matrices"},
    };
    const cli_spec spec = {
        "keel bench train",
        "float32 training steps (forward, backward, AdamW) of a Qwen3.5-shaped model, then the same config in "
        "PyTorch + transformers in the same run: tokens/s and peak memory of both",
        flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc - 1, argv + 1);
    if (pr) return pr == 1 ? 0 : 2;
    keel_qwen35_config cfg;
    if (keel_qwen35_preset(o.preset, &cfg) || keel_precision_parse(o.precision, &o.prec)) {
        fprintf(stderr, "keel bench train: %s\n", keel_last_error());
        return 2;
    }
    printf("keel bench train: %s training steps (forward, backward, AdamW) of a Qwen3.5 '%s' model\n",
           o.prec == KEEL_PRECISION_BF16 ? "bf16 mixed-precision" : "float32", o.preset);
    printf("(%lld layers, hidden %lld, vocab %lld), batch %lld, window %lld, recompute %s; median of %lld steps after "
           "%lld warm-up\n\n",
           (long long)cfg.layers, (long long)cfg.hidden, (long long)cfg.vocab, o.batch, o.window, o.recompute, o.steps,
           o.warmup);
    bool bf16 = strcmp(o.base_dtype, "bf16") == 0;
    if (!bf16 && strcmp(o.base_dtype, "f32")) {
        fprintf(stderr, "keel bench train: --base-dtype '%s': expected f32 or bf16\n", o.base_dtype);
        return 2;
    }
    if (bf16 && !o.lora_rank) {
        fprintf(stderr, "keel bench train: --base-dtype bf16 is for a frozen base: it needs --lora-rank\n");
        return 2;
    }
    bench_result k = {0}, t = {0}, kl = {0};
    /* LoRA first: on the cpu the peak is the process's RSS, which only grows */
    if (o.lora_rank && run_keel(&o, &cfg, o.lora_rank, bf16, &kl)) return 1;
    if (run_keel(&o, &cfg, 0, false, &k)) return 1;
    bool have_torch = !no_torch && run_torch(&o, &cfg, &t) == 0;
    if (!no_torch && !have_torch) fprintf(stderr, "keel bench train: PyTorch peer: %s\n", keel_last_error());
    printf("\n%-34s %10s %12s %12s  %s\n", "", "step (s)", "tokens/s", "peak GiB", "peak is");
    char lbl[96];
    snprintf(lbl, sizeof lbl, "%s%s", o.backend, o.lora_rank ? " full fine-tuning" : "");
    printf("%-34s %10.3f %12.0f %12.2f  %s\n", lbl, k.step_s, k.tokens_per_s, k.peak_bytes / (1 << 30), k.peak_what);
    if (k.device_peak)
        printf("%-34s %36.2f  planned before the run (the arena, scratch in it); measured / planned %.3f\n", "",
               k.planned_bytes / (1 << 30), k.peak_bytes / k.planned_bytes);
    if (o.lora_rank) {
        snprintf(lbl, sizeof lbl, "%s LoRA rank %lld (base %s)", o.backend, o.lora_rank, o.base_dtype);
        printf("%-34s %10.3f %12.0f %12.2f  %s\n", lbl, kl.step_s, kl.tokens_per_s, kl.peak_bytes / (1 << 30),
               kl.peak_what);
    }
    if (have_torch) {
        printf("%-34s %10.3f %12.0f %12.2f  %s\n",
               o.prec == KEEL_PRECISION_BF16 ? "PyTorch + transformers (autocast bf16)"
                                             : "PyTorch + transformers (float32)",
               t.step_s, t.tokens_per_s, t.peak_bytes / (1 << 30), t.peak_what);
        printf("\nkeel / PyTorch tokens/s: %.2fx; peak memory keel / PyTorch: %.2fx; first-step loss keel %.4f, "
               "PyTorch %.4f (ln V = %.4f)\n",
               k.tokens_per_s / t.tokens_per_s, k.peak_bytes / t.peak_bytes, k.first_loss, t.first_loss,
               log((double)cfg.vocab));
    }
    if (o.lora_rank)
        printf("\nLoRA rank %lld / full fine-tuning: tokens/s %.2fx, peak memory %.2fx lower (%.2f vs %.2f GiB); "
               "first-step loss %.4f vs %.4f (B = 0 at the start: the same model)\n",
               o.lora_rank, kl.tokens_per_s / k.tokens_per_s, k.peak_bytes / kl.peak_bytes, kl.peak_bytes / (1 << 30),
               k.peak_bytes / (1 << 30), kl.first_loss, k.first_loss);
    return have_torch || no_torch ? 0 : 1;
}
