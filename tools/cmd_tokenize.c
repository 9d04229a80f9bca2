/* keel tokenize: encode text with a Hugging Face tokenizer.json (or GPT-2's encoder.json +
 * vocab.bpe folder), print ids or tokens, or check a JSON file of cases against expected ids. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "util/error.h"
#include "util/file.h"

static int run_cases(keel_tokenizer *t, const char *path, const char *expect) {
    size_t n;
    char *s = keel_read_file(path, &n);
    if (!s) {
        fprintf(stderr, "keel tokenize: cannot read %s\n", path);
        return 2;
    }
    cJSON *arr = cJSON_Parse(s);
    free(s);
    if (!cJSON_IsArray(arr)) {
        fprintf(stderr, "keel tokenize: %s: not a JSON array of cases\n", path);
        cJSON_Delete(arr);
        return 2;
    }
    int pass = 0, fail = 0, k = 0;
    for (const cJSON *c = arr->child; c; c = c->next, k++) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text"),
                    *want = cJSON_GetObjectItemCaseSensitive(c, expect);
        if (!cJSON_IsString(text) || !cJSON_IsArray(want)) {
            printf("case %d: FAIL (no \"text\" or no \"%s\" array)\n", k, expect);
            fail++;
            continue;
        }
        int32_t *ids;
        size_t ni;
        char preview[48];
        snprintf(preview, sizeof preview, "%s", text->valuestring);
        for (char *p = preview; *p; p++)
            if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
        if (keel_tokenizer_encode(t, text->valuestring, strlen(text->valuestring), &ids, &ni)) {
            printf("case %d \"%s\": FAIL (%s)\n", k, preview, keel_last_error());
            fail++;
            continue;
        }
        size_t nw = (size_t)cJSON_GetArraySize(want), first = 0;
        const cJSON *w = want->child;
        while (first < ni && first < nw && w && (int32_t)w->valuedouble == ids[first]) first++, w = w->next;
        bool same = first == ni && first == nw;
        /* decode(encode(text)) must give the normalised text back */
        char *dec = NULL, *norm;
        size_t dl = 0, nl = 0;
        norm = keel_tokenizer_normalize(t, text->valuestring, strlen(text->valuestring), &nl);
        bool round = keel_tokenizer_decode(t, ids, ni, &dec, &dl) == 0 && norm && dl == nl && !memcmp(dec, norm, nl);
        if (same && round) {
            printf("case %d \"%s\": OK (%zu ids, round trip OK)\n", k, preview, ni);
            pass++;
        } else if (!same) {
            printf("case %d \"%s\": FAIL (first difference at position %zu: got %d, expected %d; %zu ids vs %zu)\n", k,
                   preview, first, first < ni ? ids[first] : -1, w ? (int)w->valuedouble : -1, ni, nw);
            fail++;
        } else {
            printf("case %d \"%s\": FAIL (decode(encode(text)) is not NFC(text))\n", k, preview);
            fail++;
        }
        free(ids), free(dec), free(norm);
    }
    cJSON_Delete(arr);
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}

/* keel tokenize --chat: each line of a JSON Lines file a conversation ({"messages": [...]}, with
 * optional "add_generation_prompt" and other template variables such as "enable_thinking"),
 * rendered with the chat template, then tokenized; one JSON line out per conversation:
 * {"line": N, "text": "...", "ids": [...]}. */
static int run_chat(keel_tokenizer *t, const char *tok_path, const char *path, const char *template_path,
                    bool gen_prompt) {
    keel_data_opts co = {0}; /* the template, and the special tokens it may print */
    keel_chat_template *ct = NULL;
    if (keel_chat_setup(template_path, tok_path, &ct, &co) == 0 && !ct)
        keel_fail("no chat template in the tokenizer_config.json beside %s (give one with --chat-template FILE)",
                  tok_path);
    size_t n;
    char *text = ct ? keel_read_file(path, &n) : NULL;
    if (!ct || !text) {
        fprintf(stderr, "keel tokenize: %s\n", keel_last_error());
        keel_chat_template_free(ct), free(text);
        return 1;
    }
    int rc = 0;
    long long line_no = 0;
    for (char *line = text, *next; line && *line && !rc; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        line_no++;
        if (!*line) continue;
        cJSON *o = cJSON_Parse(line);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages"),
                    *agp = cJSON_GetObjectItemCaseSensitive(o, "add_generation_prompt");
        if (!cJSON_IsArray(msgs)) {
            fprintf(stderr, "keel tokenize: %s:%lld: expected a JSON object with a \"messages\" list\n", path, line_no);
            cJSON_Delete(o);
            rc = 1;
            break;
        }
        cJSON *extra = cJSON_CreateObject(); /* the line's other fields are template variables */
        for (const cJSON *it = o->child; it; it = it->next)
            if (strcmp(it->string, "messages") && strcmp(it->string, "add_generation_prompt"))
                cJSON_AddItemToObject(extra, it->string, cJSON_Duplicate(it, true));
        keel_chat_vars v = {.messages = msgs,
                            .add_generation_prompt = agp ? cJSON_IsTrue(agp) : gen_prompt,
                            .bos_token = co.bos_token,
                            .eos_token = co.eos_token,
                            .extra = extra};
        size_t len;
        char *out = keel_chat_template_render(ct, &v, &len);
        int32_t *ids = NULL;
        size_t ni = 0;
        if (!out || keel_tokenizer_encode(t, out, len, &ids, &ni)) {
            fprintf(stderr, "keel tokenize: %s:%lld: %s\n", path, line_no, keel_last_error());
            rc = 1;
        } else {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddNumberToObject(r, "line", (double)line_no);
            cJSON_AddStringToObject(r, "text", out);
            cJSON *arr = cJSON_AddArrayToObject(r, "ids");
            for (size_t i = 0; i < ni; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            char *js = cJSON_PrintUnformatted(r);
            if (js) printf("%s\n", js);
            free(js);
            cJSON_Delete(r);
        }
        free(out), free(ids);
        cJSON_Delete(extra);
        cJSON_Delete(o);
    }
    free(text);
    keel_chat_template_free(ct);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *tok = NULL, *file = NULL, *cases = NULL, *expect = NULL, *text = NULL, *chat = NULL,
               *chat_template = NULL;
    bool tokens = false, gen_prompt = false;
    bool ids = false;
    const cli_flag flags[] = {
        {"--tokenizer", CLI_STR, &tok, .meta = "FILE",
         .help = "tokenizer.json, or a folder with GPT-2's encoder.json + vocab.bpe", .required = true},
        {NULL, CLI_STR, &text, .meta = "TEXT", .help = "the text to encode"},
        {"--file", CLI_STR, &file, .meta = "PATH", .help = "or a file's text"},
        {"--cases", CLI_STR, &cases, .meta = "JSON", .help = "or check every case of a cases file against its ids"},
        {"--expect", CLI_STR, &expect, .meta = "NAME",
         .help = "with --cases: the key of the expected ids (qwen3, gpt2)"},
        {"--chat", CLI_STR, &chat, .meta = "FILE.jsonl",
         .help = "or conversations ({\"messages\": [...]} a line) rendered with the chat template, then encoded"},
        {"--chat-template", CLI_STR, &chat_template, .meta = "FILE",
         .help = "with --chat: a Jinja template (default: tokenizer_config.json's beside the tokenizer)"},
        {"--add-generation-prompt", CLI_BOOL, &gen_prompt,
         .help = "with --chat: end with the assistant's header (a line's own add_generation_prompt wins)"},
        {"--ids", CLI_BOOL, &ids, .help = "print token ids (the default)"},
        {"--tokens", CLI_BOOL, &tokens, .help = "print the tokens' strings"},
    };
    const cli_spec spec = {"keel tokenize", "byte-level BPE, identical to Hugging Face tokenizers", flags,
                           (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    if (ids && tokens) {
        fprintf(stderr, "keel tokenize: --ids and --tokens exclude each other\n");
        return 2;
    }
    if (!tok || (!!text + !!file + !!cases + !!chat) != 1 || (cases && !expect)) {
        fprintf(stderr, "usage: keel tokenize --tokenizer FILE [--ids | --tokens] [TEXT | --file PATH | --cases JSON "
                        "--expect NAME | --chat FILE.jsonl [--chat-template FILE] [--add-generation-prompt]]\n");
        return 2;
    }
    keel_tokenizer *t = keel_tokenizer_load(tok);
    if (!t) {
        fprintf(stderr, "keel tokenize: %s\n", keel_last_error());
        return 2;
    }
    int rc = 0;
    if (cases) {
        rc = run_cases(t, cases, expect);
    } else if (chat) {
        rc = run_chat(t, tok, chat, chat_template, gen_prompt);
    } else {
        size_t n = text ? strlen(text) : 0;
        char *buf = file ? keel_read_file(file, &n) : NULL;
        if (file && !buf) {
            fprintf(stderr, "keel tokenize: cannot read %s\n", file);
            keel_tokenizer_free(t);
            return 2;
        }
        int32_t *ids;
        size_t ni;
        if (keel_tokenizer_encode(t, file ? buf : text, n, &ids, &ni)) {
            fprintf(stderr, "keel tokenize: %s%s\n", file ? file : "text", file ? "" : "");
            fprintf(stderr, "keel tokenize: %s\n", keel_last_error());
            rc = 1;
        } else {
            for (size_t i = 0; i < ni; i++) {
                if (tokens)
                    printf("%s%s", i ? " " : "", keel_tokenizer_token(t, ids[i]));
                else
                    printf("%s%d", i ? " " : "", ids[i]);
            }
            printf("\n");
            free(ids);
        }
        free(buf);
    }
    keel_tokenizer_free(t);
    return rc;
}
