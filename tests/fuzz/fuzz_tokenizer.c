/* libFuzzer target: tokenizer.json. Every input loads or is refused without a crash; a loaded
 * tokenizer encodes texts (plain, unicode, special tokens, long runs) to ids inside its
 * vocabulary, decodes them, and decodes every id it has. */
#include "fuzz_util.h"

#include "tokenizer/tokenizer.h"

static const char *TEXTS[] = {
    "Call me Ishmael. Some years ago--never mind how long precisely--",
    "<|endoftext|>hello<|im_start|>user\nwhat's 2+2?<|im_end|>\n",
    "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80  \t\n\n   x",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    keel_tokenizer *t = keel_tokenizer_load(fuzz_file("tokenizer.json", data, size));
    if (!t) return 0;
    int32_t V = keel_tokenizer_vocab_size(t);
    for (size_t k = 0; k < sizeof TEXTS / sizeof *TEXTS; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (keel_tokenizer_encode(t, TEXTS[k], strlen(TEXTS[k]), &ids, &n) == 0) {
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= V) abort(); /* an id outside the vocabulary */
            char *text = NULL;
            size_t len = 0;
            if (keel_tokenizer_decode(t, ids, n, &text, &len) == 0) free(text);
        }
        free(ids);
    }
    int32_t all[512];
    int32_t n = V < 512 ? V : 512;
    for (int32_t i = 0; i < n; i++) all[i] = i, (void)keel_tokenizer_token(t, i);
    char *text = NULL;
    size_t len = 0;
    if (keel_tokenizer_decode(t, all, (size_t)n, &text, &len) == 0) free(text);
    keel_tokenizer_free(t);
    return 0;
}
