#include <stdio.h>
#include <unistd.h>

#include "unit.h"
#include "tokenizer/tokenizer.h"

/* A small byte-level BPE tokenizer.json: the 256 byte tokens (id = byte), "ab", "bc", "abc",
 * an added token, and the given merges and extra model fields. */
static void write_tok(const char *path, const char *merges, const char *model_extra, const char *pretok) {
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"added_tokens\": [{\"id\": 259, \"content\": \"<|x|>\", \"special\": true}],");
    fprintf(f, "\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": %s,", pretok);
    fprintf(f, "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\"%s", model_extra);
    if (merges) fprintf(f, ", \"merges\": %s", merges);
    if (!strstr(model_extra, "novocab")) {
        fprintf(f, ", \"vocab\": {");
        int n = 0;
        for (int b = 0; b < 256; b++) { /* GPT-2's byte map, written out independently of keel's */
            int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            unsigned cp = printable ? (unsigned)b : (unsigned)(256 + n++);
            if (cp == '"' || cp == '\\')
                fprintf(f, "\"\\%c\": %d,", cp, b);
            else if (cp < 0x80)
                fprintf(f, "\"%c\": %d,", cp, b);
            else
                fprintf(f, "\"%c%c\": %d,", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f), b);
        }
        fprintf(f, "\"ab\": 256, \"bc\": 257, \"abc\": 258}");
    }
    fprintf(f, "}}");
    fclose(f);
}

#define ISO                                                                                                            \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+| \"}, "   \
    "\"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}"

static void encodes_by_rank(void **st) {
    (void)st;
    char path[] = "/tmp/keel_tok_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    /* b c has the lowest rank: "abc" -> a, bc (a bc is no merge) */
    write_tok(path, "[\"b c\", \"a b\", \"ab c\"]", "", ISO);
    keel_tokenizer *t = keel_tokenizer_load(path);
    assert_non_null(t);
    int32_t *ids;
    size_t n;
    assert_int_equal(keel_tokenizer_encode(t, "abc", 3, &ids, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], 257);
    free(ids);
    keel_tokenizer_free(t);
    /* pairs form merges ["a","b"]; leftmost first among equal ranks: "abab" -> ab ab; the added
     * token is never split, and the text around it is encoded on its own */
    write_tok(path, "[[\"a\", \"b\"], [\"ab\", \"c\"]]", "", ISO);
    t = keel_tokenizer_load(path);
    assert_non_null(t);
    assert_int_equal(keel_tokenizer_encode(t, "abc<|x|>ab c", 12, &ids, &n), 0);
    int32_t want[] = {258, 259, 256, ' ', 'c'};
    assert_int_equal(n, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(ids[i], want[i]);
    char *text;
    size_t len;
    assert_int_equal(keel_tokenizer_decode(t, ids, n, &text, &len), 0);
    assert_string_equal(text, "abc<|x|>ab c");
    free(text), free(ids);
    /* invalid UTF-8 is refused with its offset */
    assert_int_equal(keel_tokenizer_encode(t, "ab\xff", 3, &ids, &n), -1);
    assert_non_null(strstr(keel_last_error(), "invalid UTF-8 at byte 2"));
    keel_tokenizer_free(t);
    unlink(path);
}

static void refuses_malformed(void **st) {
    (void)st;
    char path[] = "/tmp/keel_tok_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    struct {
        const char *merges, *extra, *pretok, *needle;
    } cases[] = {
        {"[\"a b\"]", ", \"novocab\": 1", ISO, "model.vocab is missing"},
        {"[\"a q9\"]", "", ISO, "names the unknown token 'q9'"},
        {"[\"a b\"]", "", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"}, \"behavior\": \"Isolated\"}",
         "PCRE2 rejects"},
        {"[\"a b\"]", ", \"byte_fallback\": true", ISO, "byte-fallback"},
        {"[\"a b c\"]", "", ISO, "not two tokens"},
        {"[\"c a\"]", "", ISO, "not in the vocabulary"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_tok(path, cases[i].merges, cases[i].extra, cases[i].pretok);
        assert_null(keel_tokenizer_load(path));
        if (!strstr(keel_last_error(), cases[i].needle) || !strstr(keel_last_error(), path))
            fail_msg("case %zu: error '%s' lacks '%s'", i, keel_last_error(), cases[i].needle);
    }
    FILE *f = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", f);
    fclose(f);
    assert_null(keel_tokenizer_load(path));
    assert_non_null(strstr(keel_last_error(), "model type 'WordPiece' is not supported"));
    f = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [", f);
    fclose(f);
    assert_null(keel_tokenizer_load(path));
    assert_non_null(strstr(keel_last_error(), "invalid JSON"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(encodes_by_rank), cmocka_unit_test(refuses_malformed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
