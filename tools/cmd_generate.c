/* keel generate: sample text from a checkpoint with incremental decoding: the prompt runs once,
 * then each new token runs alone against the attention layers' key/value cache and the DeltaNet
 * layers' recurrent and convolution states. --verify also runs the whole sequence through the
 * ordinary forward pass and checks that both give the same choices and logits. */
#include <errno.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "cli_flags.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/decode.h"
#include "util/error.h"

typedef struct {
    double p;
    int32_t id;
} cand;
static int by_p(const void *a, const void *b) {
    double x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return (x < y) - (x > y);
}

static int32_t pick(const float *lg, int64_t V, double temp, double top_p, uint64_t *r, cand *c) {
    int32_t next = 0;
    if (temp == 0) {
        for (int64_t k = 1; k < V; k++)
            if (lg[k] > lg[next]) next = (int32_t)k;
        return next;
    }
    /* the logits are finite (the caller checks); (l - max) / temp is <= 0 for any temperature, so
     * every weight is in [0, 1], the largest is exactly 1 and z >= 1: nothing overflows or is NaN */
    double mx = -INFINITY, z = 0, cum = 0;
    for (int64_t k = 0; k < V; k++) mx = fmax(mx, lg[k]);
    for (int64_t k = 0; k < V; k++) c[k] = (cand){exp((lg[k] - mx) / temp), (int32_t)k}, z += c[k].p;
    qsort(c, (size_t)V, sizeof *c, by_p);
    int64_t keep = 0;
    while (keep < V && cum < top_p * z) cum += c[keep++].p;
    *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
    double u = (double)(*r >> 11) / 9007199254740992.0 * cum;
    next = c[keep - 1].id;
    for (int64_t k = 0; k < keep; k++)
        if ((u -= c[k].p) <= 0) {
            next = c[k].id;
            break;
        }
    return next;
}

/* "1,2,3" -> ids; -1 with a message naming the bad entry. */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    while (*ids && *s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(*ids), *ids = NULL;
            return keel_fail("--prompt-ids: '%s' is not a list of token ids (N,N,...)", s);
        }
        if (*n == cap) {
            int32_t *g = realloc(*ids, (cap *= 2) * sizeof **ids);
            if (!g) break;
            *ids = g;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return *ids ? 0 : keel_fail("out of memory");
}

/* The prompt's logits at every position, with its ids, as safetensors (input_ids [T], logits [T,V]). */
static int dump_logits(keel_decoder *d, const keel_qwen35_config *cfg, const int32_t *ids, int64_t T,
                       const char *path) {
    float *lg = keel_decoder_full_logits(d, ids, T);
    if (!lg) return -1;
    keel_st_entry e[2] = {
        {.name = "input_ids", .type = KEEL_I32, .n_dims = 1, .shape = {T}, .raw = ids, .raw_dtype = "I32"},
        {.name = "logits", .type = KEEL_F32, .n_dims = 2, .shape = {T, cfg->vocab}, .raw = lg, .raw_dtype = "F32"}};
    int rc = keel_st_write(path, e, 2);
    free(lg);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokp = NULL, *prompt = NULL, *backend = "cpu", *prompt_ids = NULL, *dump = NULL,
               *adapter_dir = NULL, *chat_template = NULL, *system = NULL;
    bool chat = false, no_thinking = false;
    bool print_ids = false;
    long long max_tokens = 64, seed = 1, threads = 2;
    double temp = 0.8, top_p = 0.95;
    bool verify = false;
    const cli_flag flags[] = {
        {"--model", CLI_STR, &model, .meta = "DIR", .help = "the checkpoint folder", .required = true},
        {"--prompt", CLI_STR, &prompt, .meta = "TEXT",
         .help = "the text to continue (\"\" starts from the end-of-text token)"},
        {"--prompt-ids", CLI_STR, &prompt_ids, .meta = "N,N,...", .help = "the prompt as token ids instead"},
        {"--max-tokens", CLI_INT, &max_tokens, 1, 1 << 20, .meta = "N", .help = "tokens to generate (default 64)"},
        {"--temperature", CLI_DBL, &temp, 0, 1e6, .meta = "X", .help = "sampling temperature; 0: greedy (default 0.8)"},
        {"--top-p", CLI_DBL, &top_p, 1e-9, 1, .meta = "P", .help = "nucleus sampling mass (default 0.95)"},
        {"--seed", CLI_INT, &seed, 0, 9e15, .meta = "N", .help = "sampling seed (default 1)"},
        {"--tokenizer", CLI_STR, &tokp, .meta = "FILE",
         .help = "tokenizer.json (default: the model folder's, else bytes)"},
        {"--backend", CLI_STR, &backend, .meta = "B", .help = "ref, cpu or cuda (default cpu)"},
        {"--threads", CLI_INT, &threads, 1, 1024, .meta = "N", .help = "cpu threads (default 2)"},
        {"--verify", CLI_BOOL, &verify,
         .help = "also run the whole sequence through the ordinary forward pass and compare"},
        {"--print-ids", CLI_BOOL, &print_ids, .help = "print the token ids (prompt and generated) instead of text"},
        {"--dump-logits", CLI_STR, &dump, .meta = "FILE",
         .help = "the prompt's logits at every position (safetensors)"},
        {"--adapter", CLI_STR, &adapter_dir, .meta = "DIR",
         .help = "a PEFT LoRA adapter (keel train --lora-rank writes one) applied beside the weights"},
        {"--chat", CLI_BOOL, &chat,
         .help = "the prompt is a user's message: rendered with the chat template, the answer printed until the "
                 "end of the turn"},
        {"--system", CLI_STR, &system, .meta = "TEXT", .help = "with --chat: a system message first"},
        {"--no-thinking", CLI_BOOL, &no_thinking, .help = "with --chat: enable_thinking=false for the template"},
        {"--chat-template", CLI_STR, &chat_template, .meta = "FILE",
         .help = "with --chat: a Jinja template (default: the tokenizer's tokenizer_config.json)"},
    };
    const cli_spec spec = {"keel generate", "sample from a checkpoint, incrementally (KV cache, DeltaNet states)",
                           flags, (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    if (!prompt == !prompt_ids) {
        fprintf(stderr, "keel generate: give the prompt: --prompt TEXT (\"\" to start from the end-of-text token) or "
                        "--prompt-ids N,N,... (one of them)\n");
        return 2;
    }
    keel_checkpoint *ck = keel_checkpoint_open(model);
    keel_adapter *ad = ck && adapter_dir ? keel_adapter_open(adapter_dir) : NULL;
    if (!ck || (adapter_dir && !ad)) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        keel_checkpoint_close(ck);
        return 1;
    }
    bool tok_failed;
    keel_tokenizer *tok = keel_tokenizer_for(tokp, model, &tok_failed);
    if (tok_failed) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        keel_adapter_close(ad);
        keel_checkpoint_close(ck);
        return 1;
    }
    int32_t *pids = NULL;
    size_t np = 0;
    int32_t stop[2] = {-1, -1}; /* --chat: the end of the turn, and of the text */
    char *rendered = NULL;
    if (chat) { /* the conversation so far, rendered as the model was trained to see it */
        if (!tok || prompt_ids) {
            fprintf(stderr, "keel generate: --chat needs the model's tokenizer and a --prompt TEXT\n");
            keel_tokenizer_free(tok), keel_adapter_close(ad), keel_checkpoint_close(ck);
            return 2;
        }
        char tok_json[4200]; /* the tokenizer's file: its tokenizer_config.json has the chat template */
        snprintf(tok_json, sizeof tok_json, tokp ? "%s" : "%s/tokenizer.json", tokp ? tokp : model);
        keel_data_opts co = {0};
        keel_chat_template *ct = NULL;
        cJSON *msgs = cJSON_CreateArray(), *extra = cJSON_CreateObject();
        if (system) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system"), cJSON_AddStringToObject(m, "content", system);
            cJSON_AddItemToArray(msgs, m);
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user"), cJSON_AddStringToObject(m, "content", prompt);
        cJSON_AddItemToArray(msgs, m);
        if (no_thinking) cJSON_AddFalseToObject(extra, "enable_thinking");
        size_t rl = 0;
        if (keel_chat_setup(chat_template, tok_json, &ct, &co) == 0 && !ct)
            keel_fail("no chat template in the tokenizer_config.json beside %s (give one with --chat-template FILE)",
                      tok_json);
        if (ct) {
            keel_chat_vars v = {.messages = msgs,
                                .add_generation_prompt = true,
                                .bos_token = co.bos_token,
                                .eos_token = co.eos_token,
                                .extra = extra};
            rendered = keel_chat_template_render(ct, &v, &rl);
        }
        cJSON_Delete(msgs), cJSON_Delete(extra), keel_chat_template_free(ct);
        if (!rendered) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            keel_tokenizer_free(tok), keel_adapter_close(ad), keel_checkpoint_close(ck);
            return 1;
        }
        prompt = rendered;
        stop[0] = keel_tokenizer_added_id(tok, "<|im_end|>"), stop[1] = keel_tokenizer_added_id(tok, "<|endoftext|>");
    }
    if (prompt_ids) {
        if (parse_ids(prompt_ids, &pids, &np)) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            keel_tokenizer_free(tok);
            keel_adapter_close(ad);
            keel_checkpoint_close(ck);
            return 2;
        }
    } else if (tok) {
        if (keel_tokenizer_encode(tok, prompt, strlen(prompt), &pids, &np)) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            return 1;
        }
    } else {
        np = strlen(prompt);
        pids = malloc((np + 1) * sizeof *pids);
        for (size_t i = 0; pids && i < np; i++) pids[i] = (unsigned char)prompt[i];
    }
    if (np == 0) {
        int32_t *one = realloc(pids, sizeof *pids);
        if (one)
            pids = one, pids[0] = tok ? keel_tokenizer_added_id(tok, "<|endoftext|>") : 0, np = 1;
        else
            free(pids), pids = NULL;
    }
    if (!pids) {
        fprintf(stderr, "keel generate: out of memory for the prompt's %zu tokens\n", np);
        keel_tokenizer_free(tok);
        keel_adapter_close(ad);
        keel_checkpoint_close(ck);
        return 1;
    }
    int64_t V = ck->cfg.vocab, T = (int64_t)np + max_tokens;
    for (size_t i = 0; i < np; i++)
        if (pids[i] < 0 || pids[i] >= V) {
            fprintf(stderr, "keel generate: prompt token %d is outside the model's vocabulary %lld\n", pids[i],
                    (long long)V);
            return 1;
        }
    keel_backend *be = keel_backend_new(backend, (int)threads);
    keel_decoder *d = be ? keel_decoder_new(ck, ad, be) : NULL;
    int rc = 1;
    int32_t *seq = calloc((size_t)T, sizeof *seq);
    /* every step's logits are kept only for --verify, which compares them with one full pass */
    float *lg = malloc((size_t)V * sizeof *lg),
          *lg_all = verify ? malloc((size_t)V * (size_t)T * sizeof *lg_all) : NULL;
    cand *c = malloc((size_t)V * sizeof *c);
    if (!d) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        goto done;
    }
    if (!seq || !lg || !c || (verify && !lg_all)) {
        fprintf(stderr, "keel generate: out of memory for %lld tokens over a vocabulary of %lld%s\n", (long long)T,
                (long long)V, verify ? " (--verify keeps every step's logits)" : "");
        goto done;
    }
    memcpy(seq, pids, np * sizeof *seq);
    uint64_t r = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    int64_t len = (int64_t)np;
    if (keel_decoder_run(d, seq, len, lg)) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        goto done;
    }
    while (len < T) {
        for (int64_t k = 0; k < V; k++)
            if (!isfinite(lg[k])) { /* nothing to sample from: say where, never pick from garbage */
                fprintf(stderr,
                        "keel generate: the logits at position %lld are not finite (token %lld: %g); the "
                        "checkpoint's weights may hold NaN or Inf\n",
                        (long long)len, (long long)k, (double)lg[k]);
                goto done;
            }
        if (verify) memcpy(lg_all + len * V, lg, (size_t)V * sizeof *lg); /* the logits that chose token len */
        seq[len] = pick(lg, V, temp, top_p, &r, c);
        len++;
        if (seq[len - 1] >= 0 && (seq[len - 1] == stop[0] || seq[len - 1] == stop[1])) { /* the end of the turn */
            T = len;
            break;
        }
        if (len < T && keel_decoder_run(d, &seq[len - 1], 1, lg)) {
            fprintf(stderr, "keel generate: %s\n", keel_last_error());
            goto done;
        }
    }
    if (dump && dump_logits(d, &ck->cfg, pids, (int64_t)np, dump)) {
        fprintf(stderr, "keel generate: %s\n", keel_last_error());
        goto done;
    }
    char *text = NULL;
    size_t tl = 0;
    if (print_ids)
        for (int64_t i = 0; i < len; i++) printf("%d%c", seq[i], i + 1 < len ? ',' : '\n');
    else if (chat &&
             keel_tokenizer_decode(tok, seq + np,
                                   (size_t)(len - (int64_t)np - (seq[len - 1] == stop[0] || seq[len - 1] == stop[1])),
                                   &text, &tl) == 0)
        fwrite(text, 1, tl, stdout); /* the answer alone */
    else if (tok && keel_tokenizer_decode(tok, seq, (size_t)len, &text, &tl) == 0)
        fwrite(text, 1, tl, stdout);
    else
        for (int64_t i = 0; i < len; i++) putchar(seq[i] >= 32 && seq[i] < 127 ? seq[i] : seq[i] == '\n' ? '\n' : '?');
    if (!print_ids) putchar('\n');
    free(text);
    rc = 0;
    if (verify) { /* the same sequence through the ordinary forward pass */
        float *full = keel_decoder_full_logits(d, seq, T);
        double worst = 0;
        int64_t differ = 0;
        for (int64_t p = (int64_t)np; p < T && full; p++) {
            const float *a = full + (p - 1) * V, *b = lg_all + p * V;
            double num = 0, den = 0;
            int32_t ia = 0, ib = 0;
            for (int64_t k = 0; k < V; k++) {
                num += ((double)a[k] - b[k]) * ((double)a[k] - b[k]), den += (double)a[k] * a[k];
                if (a[k] > a[ia]) ia = (int32_t)k;
                if (b[k] > b[ib]) ib = (int32_t)k;
            }
            worst = fmax(worst, sqrt(num / den));
            differ += ia != ib;
        }
        printf("verify: incremental vs full forward over %lld generated positions: worst relative logits error %.2e, "
               "%lld positions whose top token differs\n",
               (long long)(T - (int64_t)np), worst, (long long)differ);
        if (!full || worst > 1e-5 || differ) rc = 1;
        free(full);
    }
done:
    free(seq), free(lg), free(lg_all), free(c), free(pids), free(rendered);
    keel_decoder_free(d);
    keel_backend_free(be);
    keel_tokenizer_free(tok);
    keel_adapter_close(ad);
    keel_checkpoint_close(ck);
    return rc;
}
