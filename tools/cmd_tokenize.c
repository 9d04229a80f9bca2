/* keel tokenize: encode text with a Hugging Face tokenizer.json (or GPT-2's encoder.json +
 * vocab.bpe folder), print ids or tokens, or check a JSON file of cases against expected ids. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "tokenizer/tokenizer.h"
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

int cmd_tokenize(int argc, char **argv) {
    const char *tok = NULL, *file = NULL, *cases = NULL, *expect = NULL, *text = NULL;
    bool tokens = false;
    bool ids = false;
    const cli_flag flags[] = {
        {"--tokenizer", CLI_STR, &tok, .meta = "FILE",
         .help = "tokenizer.json, or a folder with GPT-2's encoder.json + vocab.bpe", .required = true},
        {NULL, CLI_STR, &text, .meta = "TEXT", .help = "the text to encode"},
        {"--file", CLI_STR, &file, .meta = "PATH", .help = "or a file's text"},
        {"--cases", CLI_STR, &cases, .meta = "JSON", .help = "or check every case of a cases file against its ids"},
        {"--expect", CLI_STR, &expect, .meta = "NAME",
         .help = "with --cases: the key of the expected ids (qwen3, gpt2)"},
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
    if (!tok || (!!text + !!file + !!cases) != 1 || (cases && !expect)) {
        fprintf(stderr, "usage: keel tokenize --tokenizer FILE [--ids | --tokens] [TEXT | --file PATH | --cases JSON "
                        "--expect NAME]\n");
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
