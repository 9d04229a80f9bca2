/* keel eval: loss and perplexity of a checkpoint on text, over every whole window of it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "io/adapter.h"
#include "io/checkpoint.h"
#include "ops/ops.h"
#include "tokenizer/chat_template.h"
#include "train/data.h"
#include "train/step.h"
#include "util/error.h"

int cmd_eval(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *data[64], *backend = "cpu", *adapter_dir = NULL, *chat_template = NULL,
               *data_format = "auto", *doc_boundaries = "auto", *overlong_s = "truncate", *prec_s = "f32";
    bool no_pack = false;
    int n_data = 0;
    long long T = 128, B = 8, threads = 2;
    const cli_flag flags[] = {
        {"--model", CLI_STR, &model, .meta = "DIR", .help = "the checkpoint folder", .required = true},
        {"--data", CLI_LIST, data, 0, 64, &n_data, "PATH...",
         "text files, folders of them, .jsonl with a \"text\" field", true},
        {"--tokenizer", CLI_STR, &tokp, .meta = "FILE",
         .help = "tokenizer.json (default: the model folder's, else bytes)"},
        {"--data-format", CLI_STR, &data_format, .meta = "F",
         .help = "of .jsonl files: auto, text, prompt-completion, messages (default auto)"},
        {"--chat-template", CLI_STR, &chat_template, .meta = "FILE",
         .help = "for \"messages\": a Jinja chat template (default: the tokenizer's tokenizer_config.json)"},
        {"--doc-boundaries", CLI_STR, &doc_boundaries, .meta = "on|off",
         .help = "each example alone in its window (as keel train; default auto: on for .jsonl data)"},
        {"--no-pack", CLI_BOOL, &no_pack, .help = "with document boundaries, one example a window"},
        {"--overlong", CLI_STR, &overlong_s, .meta = "HOW",
         .help = "with document boundaries, an example longer than the window: truncate (default), split, drop"},
        {"--adapter", CLI_STR, &adapter_dir, .meta = "DIR",
         .help = "a PEFT LoRA adapter (keel train --lora-rank writes one) applied beside the weights"},
        {"--precision", CLI_STR, &prec_s, .meta = "f32|bf16",
         .help = "bf16: mixed-precision products, as keel train --precision bf16 (default f32)"},
        {"--window", CLI_INT, &T, 1, 1 << 24, .meta = "T", .help = "tokens per window (default 128)"},
        {"--batch", CLI_INT, &B, 1, 1 << 20, .meta = "B", .help = "windows per batch (default 8)"},
        {"--backend", CLI_STR, &backend, .meta = "B", .help = "ref, cpu or cuda (default cpu)"},
        {"--threads", CLI_INT, &threads, 1, 1024, .meta = "N", .help = "cpu threads (default 2)"},
    };
    const cli_spec spec = {"keel eval", "loss and perplexity of a checkpoint on text, over every whole window of it",
                           flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    keel_checkpoint *ck = keel_checkpoint_open(model);
    keel_adapter *ad = ck && adapter_dir ? keel_adapter_open(adapter_dir) : NULL;
    if (!ck || (adapter_dir && !ad)) {
        keel_checkpoint_close(ck);
        fprintf(stderr, "keel eval: %s\n", keel_last_error());
        return 1;
    }
    bool tok_failed;
    keel_tokenizer *tok = keel_tokenizer_for(tokp, model, &tok_failed);
    keel_dataset d = {0};
    int rc = 1;
    keel_backend *be = keel_backend_new(backend, (int)threads);
    keel_step *st = NULL;
    keel_chat_template *chat = NULL;
    char tok_json[4200]; /* the tokenizer's file: its tokenizer_config.json has the chat template */
    snprintf(tok_json, sizeof tok_json, tokp ? "%s" : "%s/tokenizer.json", tokp ? tokp : model);
    keel_data_opts dopt = {.format = data_format};
    if (!be || tok_failed || (tok && keel_chat_setup(chat_template, tok_json, &chat, &dopt)) ||
        keel_dataset_load(&d, data, n_data, tok, 0.0, 0, NULL, &dopt))
        goto done;
    if (tok && keel_tokenizer_vocab_size(tok) > ck->cfg.vocab) {
        keel_fail("the tokenizer has more tokens than the model's vocabulary");
        goto done;
    }
    int bounds = keel_doc_boundaries(doc_boundaries, d.jsonl);
    keel_overlong overlong;
    if (bounds < 0 || keel_overlong_parse(overlong_s, &overlong) ||
        (bounds && keel_dataset_pack(&d, T, 0, !no_pack, overlong)))
        goto done;
    keel_data_report_packing(&d, T, !no_pack);
    int64_t W = keel_dataset_windows(&d, T);
    if (W < 1) {
        keel_fail("--window %lld is longer than the data (%lld tokens)", T, (long long)d.n_train);
        goto done;
    }
    if (B > W) B = W;
    keel_precision prec;
    if (keel_precision_parse(prec_s, &prec)) goto done;
    keel_step_opts so = {.cfg = &ck->cfg, .type = KEEL_F32, .batch = B, .window = T, .adapter = ad, .precision = prec};
    if (!(st = keel_step_build(&so)) || keel_step_place(st, be) || keel_step_load(st, ck)) goto done;
    int32_t *iv = malloc((size_t)(T * B) * 4), *tv = malloc((size_t)(T * B) * 4), *pv = malloc((size_t)(T * B) * 4);
    if (!iv || !tv || !pv) {
        free(iv), free(tv), free(pv);
        keel_fail("out of memory for a batch of %lld x %lld tokens", (long long)B, (long long)T);
        goto done;
    }
    double sum = 0;
    int64_t nb = 0, counted = 0;
    for (int64_t w = 0; w + B <= W; w += B, nb++) { /* every whole batch of consecutive windows */
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++)
            n += keel_dataset_window(&d, false, w + b, T, iv + b * T, tv + b * T, pv + b * T);
        float l;
        if (keel_step_write_positions(st, pv) || keel_step_run(st, iv, tv, NULL, NULL) ||
            keel_tensor_read(be, st->out.loss, &l, KEEL_F32))
            break;
        sum += (double)l * (double)n, counted += n; /* the mean over every counted target */
    }
    free(iv), free(tv), free(pv);
    if (nb && d.train_mask)
        printf("the loss counts the completions and the assistant's turns: %lld of the %lld positions evaluated\n",
               (long long)counted, (long long)(nb * B * T));
    if (nb && !counted) {
        keel_fail("no target in the evaluated windows is counted by the loss (every one is a prompt token)");
        nb = 0;
    }
    if (nb) {
        double mean = sum / (double)counted;
        printf("%s%s%s on %lld windows of %lld tokens (%lld tokens): loss %.4f, perplexity %.2f\n", model,
               ad ? " + adapter " : "", ad ? adapter_dir : "", (long long)(nb * B), T, (long long)(nb * B * T), mean,
               exp(mean));
        rc = 0;
        if (!isfinite(mean)) /* NaN or infinite weights (or logits): not a result to report as one */
            rc = 1,
            keel_fail("%s: the loss is %g: the checkpoint holds non-finite weights, or they overflow", model, mean);
    }
done:
    if (rc) fprintf(stderr, "keel eval: %s\n", keel_last_error());
    keel_step_free(st);
    keel_backend_free(be);
    keel_dataset_free(&d);
    keel_tokenizer_free(tok);
    keel_adapter_close(ad);
    keel_chat_template_free(chat);
    keel_checkpoint_close(ck);
    return rc;
}
