#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "util/error.h"
#include "util/file.h"

/* GPT-2's pre-tokenizer, used by the encoder.json + vocab.bpe pair and ByteLevel(use_regex). */
static const char *GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- hash maps ---- */

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

typedef struct {
    char *s;
    uint32_t len;
    int32_t id;
} vocab_slot;
typedef struct {
    uint64_t key;
    int32_t rank, merged;
} merge_slot; /* key 0: empty */
typedef struct {
    char *key;
    uint32_t len;
    int32_t *ids;
    uint32_t n;
} cache_slot;

struct keel_tokenizer {
    vocab_slot *vmap;
    size_t vcap; /* token string -> id */
    char **tok;
    uint32_t *tok_len;
    int32_t n_tok, cap_tok; /* id -> string */
    merge_slot *mmap;
    size_t mcap; /* (left, right) -> rank, merged id */
    int32_t n_merges;
    int32_t byte_id[256];       /* single-byte tokens */
    unsigned char cp_byte[512]; /* byte map inverse: code point -> byte (code points < 512) */
    struct {
        char *s;
        uint32_t len;
        int32_t id;
    } * added;
    int n_added;
    bool nfc;
    pcre2_code *re;
    pcre2_match_data *md;
    cache_slot *cache;
    size_t ccap, cused;
    uint64_t hash;
};

static int vmap_put(keel_tokenizer *t, const char *s, size_t len, int32_t id) {
    size_t i = fnv(s, len) & (t->vcap - 1);
    while (t->vmap[i].s) {
        if (t->vmap[i].len == len && !memcmp(t->vmap[i].s, s, len)) return 1;
        i = (i + 1) & (t->vcap - 1);
    }
    t->vmap[i].s = malloc(len + 1);
    if (!t->vmap[i].s) return -1;
    memcpy(t->vmap[i].s, s, len);
    t->vmap[i].s[len] = 0;
    t->vmap[i].len = (uint32_t)len, t->vmap[i].id = id;
    return 0;
}

static int32_t vmap_get(const keel_tokenizer *t, const char *s, size_t len) {
    size_t i = fnv(s, len) & (t->vcap - 1);
    while (t->vmap[i].s) {
        if (t->vmap[i].len == len && !memcmp(t->vmap[i].s, s, len)) return t->vmap[i].id;
        i = (i + 1) & (t->vcap - 1);
    }
    return -1;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static const merge_slot *mmap_get(const keel_tokenizer *t, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    size_t i = (k * 0x9e3779b97f4a7c15ull >> 20) & (t->mcap - 1);
    while (t->mmap[i].key) {
        if (t->mmap[i].key == k) return &t->mmap[i];
        i = (i + 1) & (t->mcap - 1);
    }
    return NULL;
}

static void mmap_put(keel_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t k = pair_key(a, b);
    size_t i = (k * 0x9e3779b97f4a7c15ull >> 20) & (t->mcap - 1);
    while (t->mmap[i].key) {
        if (t->mmap[i].key == k) return; /* a repeated merge keeps its first (lowest) rank */
        i = (i + 1) & (t->mcap - 1);
    }
    t->mmap[i] = (merge_slot){k, rank, merged};
}

static size_t pow2_above(size_t n) {
    size_t c = 1024;
    while (c < 2 * n) c <<= 1;
    return c;
}

/* ---- the byte map ---- */

static void byte_map(uint32_t cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static int utf8_put(uint32_t c, char *out) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xc0 | c >> 6);
        out[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    out[0] = (char)(0xe0 | c >> 12), out[1] = (char)(0x80 | ((c >> 6) & 0x3f)), out[2] = (char)(0x80 | (c & 0x3f));
    return 3;
}

int keel_tokenizer_byte_char(uint8_t b, char out[4]) {
    uint32_t cp[256];
    byte_map(cp);
    return utf8_put(cp[b], out);
}

/* ---- loading ---- */

static keel_tokenizer *alloc_tok(size_t n_vocab, size_t n_merges) {
    keel_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->vcap = pow2_above(n_vocab + 64);
    t->mcap = pow2_above(n_merges + 64);
    t->vmap = calloc(t->vcap, sizeof *t->vmap);
    t->mmap = calloc(t->mcap, sizeof *t->mmap);
    t->ccap = 1 << 16;
    t->cache = calloc(t->ccap, sizeof *t->cache);
    t->hash = 0xcbf29ce484222325ull;
    if (!t->vmap || !t->mmap || !t->cache) {
        keel_tokenizer_free(t);
        return NULL;
    }
    return t;
}

static void mix_hash(keel_tokenizer *t, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) t->hash = (t->hash ^ b[i]) * 0x100000001b3ull;
}

/* A vocabulary entry. Ids must be integers in [0, limit) (limit: the entries the file lists), and
 * each id names one string: a float id, a huge one, or a second string for an id is refused. */
static int add_token(keel_tokenizer *t, const char *path, const char *s, size_t len, double v, int64_t limit) {
    if (!(v >= 0 && v < (double)limit && v == floor(v)))
        return keel_fail("%s: token '%s' has id %.17g; ids must be integers in [0, %lld) (the number of entries)", path,
                         s, v, (long long)limit);
    int64_t id = (int64_t)v;
    if (id < t->n_tok && t->tok[id] && (t->tok_len[id] != len || memcmp(t->tok[id], s, len)))
        return keel_fail("%s: id %lld is given to both '%s' and '%s'", path, (long long)id, t->tok[id], s);
    if (id >= t->n_tok) {
        if (id >= t->cap_tok) { /* grow geometrically: ids mostly arrive in order */
            int32_t cap = t->cap_tok ? t->cap_tok : 1024;
            while (cap <= id) cap *= 2;
            char **nt = realloc(t->tok, (size_t)cap * sizeof *nt);
            uint32_t *nl = realloc(t->tok_len, (size_t)cap * sizeof *nl);
            if (nt) t->tok = nt;
            if (nl) t->tok_len = nl;
            if (!nt || !nl) return keel_fail("out of memory");
            t->cap_tok = cap;
        }
        for (int32_t i = t->n_tok; i <= id; i++) t->tok[i] = NULL, t->tok_len[i] = 0;
        t->n_tok = (int32_t)id + 1;
    }
    int r = vmap_put(t, s, len, (int32_t)id);
    if (r < 0) return keel_fail("out of memory");
    if (!t->tok[id]) {
        t->tok[id] = malloc(len + 1);
        if (!t->tok[id]) return keel_fail("out of memory");
        memcpy(t->tok[id], s, len);
        t->tok[id][len] = 0;
        t->tok_len[id] = (uint32_t)len;
    }
    mix_hash(t, s, len);
    mix_hash(t, &id, sizeof id);
    return 0;
}

static int finish_bytes(keel_tokenizer *t, const char *path) {
    uint32_t cp[256];
    byte_map(cp);
    memset(t->cp_byte, 0, sizeof t->cp_byte);
    for (int b = 0; b < 256; b++) {
        char s[4];
        int n = utf8_put(cp[b], s);
        t->byte_id[b] = vmap_get(t, s, (size_t)n);
        if (t->byte_id[b] < 0)
            return keel_fail("%s: the vocabulary lacks the byte-level token for byte 0x%02x", path, b);
        t->cp_byte[cp[b]] = (unsigned char)b;
    }
    return 0;
}

static int add_merge(keel_tokenizer *t, const char *path, const char *a, size_t la, const char *b, size_t lb,
                     int32_t rank) {
    int32_t ia = vmap_get(t, a, la), ib = vmap_get(t, b, lb);
    if (ia < 0 || ib < 0)
        return keel_fail("%s: merge %d '%.*s %.*s' names the unknown token '%.*s'", path, rank, (int)la, a, (int)lb, b,
                         ia < 0 ? (int)la : (int)lb, ia < 0 ? a : b);
    char buf[1024];
    if (la + lb >= sizeof buf) return keel_fail("%s: merge %d is too long", path, rank);
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    int32_t m = vmap_get(t, buf, la + lb);
    if (m < 0)
        return keel_fail("%s: merge %d '%.*s %.*s' makes '%.*s', which is not in the vocabulary", path, rank, (int)la,
                         a, (int)lb, b, (int)(la + lb), buf);
    mmap_put(t, ia, ib, rank, m);
    mix_hash(t, &rank, sizeof rank);
    mix_hash(t, buf, la + lb);
    t->n_merges++;
    return 0;
}

static int compile_regex(keel_tokenizer *t, const char *path, const char *pattern) {
    int err;
    PCRE2_SIZE off;
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return keel_fail("%s: PCRE2 rejects the pre-tokenizer regex at offset %zu: %s", path, (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter when JIT is unavailable */
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    mix_hash(t, pattern, strlen(pattern));
    return t->md ? 0 : keel_fail("out of memory");
}

/* The pre-tokenizer: Split(regex) and/or ByteLevel, possibly in a Sequence. */
static int read_pretokenizer(keel_tokenizer *t, const char *path, const cJSON *pt) {
    if (!pt || cJSON_IsNull(pt)) return keel_fail("%s: no pre_tokenizer (byte-level BPE needs ByteLevel)", path);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        bool byte_level = false;
        for (const cJSON *e = list ? list->child : NULL; e; e = e->next) {
            const cJSON *et = cJSON_GetObjectItemCaseSensitive(e, "type");
            if (cJSON_IsString(et) && !strcmp(et->valuestring, "ByteLevel")) {
                byte_level = true;
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "use_regex")) && !t->re &&
                    compile_regex(t, path, GPT2_REGEX))
                    return -1;
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "add_prefix_space")))
                    return keel_fail("%s: ByteLevel add_prefix_space is not supported", path);
            } else if (read_pretokenizer(t, path, e)) {
                return -1;
            }
        }
        return byte_level || t->re ? 0 : keel_fail("%s: pre_tokenizer Sequence has no Split or ByteLevel", path);
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern"),
                    *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        const cJSON *rx = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
        if (!cJSON_IsString(rx)) return keel_fail("%s: Split pre-tokenizer without a \"Regex\" pattern", path);
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
            return keel_fail("%s: Split behavior '%s' is not supported (Isolated)", path,
                             cJSON_IsString(beh) ? beh->valuestring : "?");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "invert")))
            return keel_fail("%s: Split invert is not supported", path);
        if (t->re) return keel_fail("%s: more than one regex pre-tokenizer", path);
        return compile_regex(t, path, rx->valuestring);
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "add_prefix_space")))
            return keel_fail("%s: ByteLevel add_prefix_space is not supported", path);
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(pt, "use_regex");
        return (!ur || cJSON_IsTrue(ur)) ? compile_regex(t, path, GPT2_REGEX) : 0;
    }
    return keel_fail("%s: pre_tokenizer type '%s' is not supported (Split, ByteLevel, Sequence)", path, ty);
}

static int read_normalizer(keel_tokenizer *t, const char *path, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(ty, "NFC")) {
        t->nfc = true;
        mix_hash(t, "NFC", 3);
        return 0;
    }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        for (const cJSON *e = list ? list->child : NULL; e; e = e->next)
            if (read_normalizer(t, path, e)) return -1;
        return 0;
    }
    return keel_fail("%s: normalizer '%s' is not supported (NFC, none, or a Sequence of them)", path, ty);
}

keel_tokenizer *keel_tokenizer_load(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        char e[4096], v[4096];
        snprintf(e, sizeof e, "%s/encoder.json", path);
        snprintf(v, sizeof v, "%s/vocab.bpe", path);
        return keel_tokenizer_load_gpt2(e, v);
    }
    cJSON *root = keel_read_json(path);
    if (!root) return NULL;
    keel_tokenizer *t = NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *mtype = model ? cJSON_GetObjectItemCaseSensitive(model, "type") : NULL;
    const cJSON *vocab = model ? cJSON_GetObjectItemCaseSensitive(model, "vocab") : NULL;
    const cJSON *merges = model ? cJSON_GetObjectItemCaseSensitive(model, "merges") : NULL;
    if (!cJSON_IsObject(model)) {
        keel_fail("%s: no \"model\" object", path);
        goto fail;
    }
    if (cJSON_IsString(mtype) && strcmp(mtype->valuestring, "BPE")) {
        keel_fail("%s: model type '%s' is not supported: keel reads byte-level BPE tokenizers", path,
                  mtype->valuestring);
        goto fail;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) {
        keel_fail(
            "%s: a byte-fallback (SentencePiece-style) BPE is not supported: keel reads byte-level BPE tokenizers",
            path);
        goto fail;
    }
    if (!cJSON_IsObject(vocab)) {
        keel_fail("%s: model.vocab is missing (or not an object)", path);
        goto fail;
    }
    if (!cJSON_IsArray(merges)) {
        keel_fail("%s: model.merges is missing (or not an array)", path);
        goto fail;
    }
    t = alloc_tok((size_t)cJSON_GetArraySize(vocab) + 1024, (size_t)cJSON_GetArraySize(merges));
    if (!t) {
        keel_fail("out of memory");
        goto fail;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    int64_t limit = (int64_t)cJSON_GetArraySize(vocab) + (int64_t)cJSON_GetArraySize(added);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e)) {
            keel_fail("%s: vocab entry '%s' is not a number", path, e->string);
            goto fail;
        }
        if (add_token(t, path, e->string, strlen(e->string), e->valuedouble, limit)) goto fail;
    }
    t->added = calloc((size_t)(cJSON_GetArraySize(added) + 1), sizeof *t->added);
    if (!t->added) {
        keel_fail("%s: out of memory for the added tokens", path);
        goto fail;
    }
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content"),
                    *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsString(c) || !cJSON_IsNumber(id) || !*c->valuestring) {
            keel_fail("%s: an added token needs \"content\" and \"id\"", path);
            goto fail;
        }
        if (add_token(t, path, c->valuestring, strlen(c->valuestring), id->valuedouble, limit)) goto fail;
        if (!(t->added[t->n_added].s = strdup(c->valuestring))) {
            keel_fail("%s: out of memory for the added tokens", path);
            goto fail;
        }
        t->added[t->n_added].len = (uint32_t)strlen(c->valuestring);
        t->added[t->n_added].id = (int32_t)id->valuedouble;
        t->n_added++;
    }
    if (finish_bytes(t, path)) goto fail;
    int32_t rank = 0;
    for (const cJSON *e = merges->child; e; e = e->next, rank++) {
        if (cJSON_IsString(e)) { /* "a b" */
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                keel_fail("%s: merge %d '%s' is not two tokens separated by one space", path, rank, s);
                goto fail;
            }
            if (add_merge(t, path, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), rank)) goto fail;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            const char *a = e->child->valuestring, *b = e->child->next->valuestring;
            if (add_merge(t, path, a, strlen(a), b, strlen(b), rank)) goto fail;
        } else {
            keel_fail("%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
            goto fail;
        }
    }
    if (read_normalizer(t, path, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) goto fail;
    if (read_pretokenizer(t, path, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) goto fail;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder"),
                *dt = dec ? cJSON_GetObjectItemCaseSensitive(dec, "type") : NULL;
    if (dec && !cJSON_IsNull(dec) && (!cJSON_IsString(dt) || strcmp(dt->valuestring, "ByteLevel"))) {
        keel_fail("%s: decoder '%s' is not supported (ByteLevel)", path, cJSON_IsString(dt) ? dt->valuestring : "?");
        goto fail;
    }
    cJSON_Delete(root);
    return t;
fail:
    cJSON_Delete(root);
    keel_tokenizer_free(t);
    return NULL;
}

keel_tokenizer *keel_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe) {
    cJSON *enc = keel_read_json(encoder_json);
    if (!enc) return NULL;
    size_t n;
    char *bpe = keel_read_file(vocab_bpe, &n);
    keel_tokenizer *t = NULL;
    if (!bpe) goto fail;
    if (!cJSON_IsObject(enc)) {
        keel_fail("%s: not a JSON object of token ids", encoder_json);
        goto fail;
    }
    t = alloc_tok((size_t)cJSON_GetArraySize(enc), 60000);
    if (!t) {
        keel_fail("out of memory");
        goto fail;
    }
    for (const cJSON *e = enc->child; e; e = e->next) {
        if (!cJSON_IsNumber(e)) {
            keel_fail("%s: entry '%s' is not a number", encoder_json, e->string);
            goto fail;
        }
        if (add_token(t, encoder_json, e->string, strlen(e->string), e->valuedouble, cJSON_GetArraySize(enc)))
            goto fail;
    }
    t->added = calloc(1, sizeof *t->added);
    if (!t->added) {
        keel_fail("out of memory");
        goto fail;
    }
    if (finish_bytes(t, encoder_json)) goto fail;
    int32_t rank = 0;
    for (char *line = bpe, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        if (!len || !strncmp(line, "#version", 8)) continue;
        char *sp = strchr(line, ' ');
        if (!sp) {
            keel_fail("%s: merge line %d '%s' has no space", vocab_bpe, rank, line);
            goto fail;
        }
        if (add_merge(t, vocab_bpe, line, (size_t)(sp - line), sp + 1, strlen(sp + 1), rank)) goto fail;
        rank++;
    }
    if (compile_regex(t, encoder_json, GPT2_REGEX)) goto fail;
    cJSON_Delete(enc);
    free(bpe);
    return t;
fail:
    cJSON_Delete(enc);
    free(bpe);
    keel_tokenizer_free(t);
    return NULL;
}

keel_tokenizer *keel_tokenizer_for(const char *given, const char *model_dir, bool *failed) {
    char path[4200];
    struct stat st;
    *failed = false;
    if (!given && model_dir) {
        snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
        if (stat(path, &st) != 0) return NULL;
        given = path;
    }
    if (!given) return NULL;
    keel_tokenizer *t = keel_tokenizer_load(given);
    *failed = t == NULL;
    return t;
}

void keel_tokenizer_free(keel_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; t->vmap && i < t->vcap; i++) free(t->vmap[i].s);
    for (int32_t i = 0; i < t->n_tok; i++) free(t->tok[i]);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].s);
    for (size_t i = 0; t->cache && i < t->ccap; i++) free(t->cache[i].key), free(t->cache[i].ids);
    free(t->vmap), free(t->mmap), free(t->tok), free(t->tok_len), free(t->added), free(t->cache);
    if (t->md) pcre2_match_data_free(t->md);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

/* ---- encoding ---- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} idvec;

static int push_id(idvec *o, int32_t id) {
    if (o->n == o->cap) {
        size_t c = o->cap ? 2 * o->cap : 256;
        int32_t *v = realloc(o->v, c * sizeof *v);
        if (!v) return keel_fail("out of memory");
        o->v = v, o->cap = c;
    }
    o->v[o->n++] = id;
    return 0;
}

typedef struct {
    int32_t rank;
    int32_t pos;
} heap_item;

static void heap_push(heap_item *h, int *n, heap_item x) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p].rank < x.rank || (h[p].rank == x.rank && h[p].pos < x.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, int *n) {
    heap_item top = h[0], x = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos))) c++;
        if (x.rank < h[c].rank || (x.rank == h[c].rank && x.pos < h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

/* Merge one pre-token's bytes by rank: a heap of candidate pairs over a linked list of symbols,
 * lowest rank first and leftmost among equals, as Hugging Face's BPE does. O(n log n). */
static int bpe_piece(keel_tokenizer *t, const unsigned char *s, size_t n, idvec *out) {
    if (n == 0) return 0;
    size_t ci = fnv(s, n) & (t->ccap - 1);
    cache_slot *cs = &t->cache[ci];
    if (cs->key && cs->len == n && !memcmp(cs->key, s, n)) {
        for (uint32_t i = 0; i < cs->n; i++)
            if (push_id(out, cs->ids[i])) return -1;
        return 0;
    }
    int32_t stack_sym[64], stack_prev[64], stack_next[64];
    heap_item stack_heap[128];
    int32_t *sym = n <= 64 ? stack_sym : malloc(n * sizeof *sym),
            *prev = n <= 64 ? stack_prev : malloc(n * sizeof *prev),
            *next = n <= 64 ? stack_next : malloc(n * sizeof *next);
    heap_item *heap = n <= 64 ? stack_heap : malloc(2 * n * sizeof *heap);
    if (!sym || !prev || !next || !heap) return keel_fail("out of memory");
    int nh = 0;
    for (size_t i = 0; i < n; i++)
        sym[i] = t->byte_id[s[i]], prev[i] = (int32_t)i - 1, next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    for (size_t i = 0; i + 1 < n; i++) {
        const merge_slot *m = mmap_get(t, sym[i], sym[i + 1]);
        if (m) heap_push(heap, &nh, (heap_item){m->rank, (int32_t)i});
    }
    while (nh > 0) {
        heap_item h = heap_pop(heap, &nh);
        int32_t i = h.pos, j = next[i];
        if (sym[i] < 0 || j < 0) continue; /* stale */
        const merge_slot *m = mmap_get(t, sym[i], sym[j]);
        if (!m || m->rank != h.rank) continue; /* this pair changed since it was queued */
        sym[i] = m->merged;
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0) {
            const merge_slot *l = mmap_get(t, sym[prev[i]], sym[i]);
            if (l) heap_push(heap, &nh, (heap_item){l->rank, prev[i]});
        }
        if (next[i] >= 0) {
            const merge_slot *r = mmap_get(t, sym[i], sym[next[i]]);
            if (r) heap_push(heap, &nh, (heap_item){r->rank, i});
        }
    }
    size_t start = out->n;
    int rc = 0;
    for (int32_t i = 0; i >= 0 && !rc; i = next[i]) rc = push_id(out, sym[i]);
    if (!rc && n <= 256) { /* cache the word (replacing whatever hashed to its slot) */
        free(cs->key), free(cs->ids);
        cs->key = malloc(n), cs->ids = malloc((out->n - start) * sizeof *cs->ids);
        if (cs->key && cs->ids) {
            memcpy(cs->key, s, n);
            memcpy(cs->ids, out->v + start, (out->n - start) * sizeof *cs->ids);
            cs->len = (uint32_t)n, cs->n = (uint32_t)(out->n - start);
        } else {
            free(cs->key), free(cs->ids);
            cs->key = NULL, cs->ids = NULL;
        }
    }
    if (n > 64) free(sym), free(prev), free(next), free(heap);
    return rc;
}

static int encode_plain(keel_tokenizer *t, const char *s, size_t n, idvec *out) {
    char *norm = NULL;
    if (t->nfc && n) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r =
            utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) return keel_fail("NFC failed: %s", utf8proc_errmsg(r));
        norm = (char *)dst;
        s = norm, n = (size_t)r;
    }
    int rc = 0;
    if (!t->re) {
        rc = bpe_piece(t, (const unsigned char *)s, n, out);
    } else {
        PCRE2_SIZE at = 0;
        while (at < n && !rc) {
            int m = pcre2_jit_match(t->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, t->md, NULL);
            if (m == PCRE2_ERROR_JIT_BADOPTION)
                m = pcre2_match(t->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, t->md, NULL);
            if (m == PCRE2_ERROR_NOMATCH) {
                rc = bpe_piece(t, (const unsigned char *)s + at, n - at, out);
                break;
            }
            if (m < 0) { /* e.g. a match or JIT stack limit on a pathological text: say which, and where */
                PCRE2_UCHAR msg[160];
                uint32_t limit = 0, depth = 0;
                pcre2_get_error_message(m, msg, sizeof msg);
                pcre2_config(PCRE2_CONFIG_MATCHLIMIT, &limit);
                pcre2_config(PCRE2_CONFIG_DEPTHLIMIT, &depth);
                size_t show = n - at < 40 ? n - at : 40;
                rc = keel_fail("the pre-tokenizer's pattern failed at byte %zu of a %zu-byte text piece (\"%.*s%s\"): "
                               "PCRE2 error %d: %s (match limit %u, depth limit %u, JIT stack 32 KiB)",
                               (size_t)at, n, (int)show, s + at, n - at > show ? "..." : "", m, (const char *)msg,
                               limit, depth);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
            if (ov[0] > at)
                rc = bpe_piece(t, (const unsigned char *)s + at, ov[0] - at, out); /* an unmatched gap is a piece */
            if (!rc) rc = bpe_piece(t, (const unsigned char *)s + ov[0], ov[1] - ov[0], out);
            if (ov[1] == ov[0]) { /* an empty match: step over one character */
                PCRE2_SIZE nx = ov[1] + 1;
                while (nx < n && ((unsigned char)s[nx] & 0xc0) == 0x80) nx++;
                if (!rc && nx > ov[1]) rc = bpe_piece(t, (const unsigned char *)s + ov[1], nx - ov[1], out);
                at = nx;
            } else {
                at = ov[1];
            }
        }
    }
    free(norm);
    return rc;
}

static int check_utf8(const char *text, size_t len) {
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k < 0) return keel_fail("invalid UTF-8 at byte %zu (0x%02x)", i, (unsigned char)text[i]);
        i += (size_t)k;
    }
    return 0;
}

int keel_tokenizer_encode(keel_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    *ids = NULL, *n_ids = 0;
    if (check_utf8(text, len)) return -1;
    idvec out = {0};
    size_t seg = 0, i = 0;
    int rc = 0;
    while (i < len && !rc) { /* added tokens first, longest match */
        int best = -1;
        for (int a = 0; a < t->n_added; a++)
            if (t->added[a].len <= len - i && text[i] == t->added[a].s[0] &&
                !memcmp(text + i, t->added[a].s, t->added[a].len) && (best < 0 || t->added[a].len > t->added[best].len))
                best = a;
        if (best < 0) {
            i++;
            continue;
        }
        if (i > seg) rc = encode_plain(t, text + seg, i - seg, &out);
        if (!rc) rc = push_id(&out, t->added[best].id);
        i += t->added[best].len;
        seg = i;
    }
    if (!rc && len > seg) rc = encode_plain(t, text + seg, len - seg, &out);
    if (rc) {
        free(out.v);
        return -1;
    }
    *ids = out.v ? out.v : malloc(sizeof(int32_t));
    *n_ids = out.n;
    return 0;
}

int keel_tokenizer_decode(const keel_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    size_t cap = 64 + n * 8, k = 0;
    char *s = malloc(cap);
    if (!s) return keel_fail("out of memory");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_tok || !t->tok[ids[i]]) {
            free(s);
            return keel_fail("decode: id %d at position %zu is not in the vocabulary", ids[i], i);
        }
        const char *p = t->tok[ids[i]];
        uint32_t pl = t->tok_len[ids[i]];
        if (k + pl + 1 > cap) {
            cap = 2 * (k + pl + 1);
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return keel_fail("out of memory");
            }
            s = ns;
        }
        bool is_added = false;
        for (int a = 0; a < t->n_added && !is_added; a++) is_added = t->added[a].id == ids[i];
        if (is_added) {
            memcpy(s + k, p, pl);
            k += pl;
            continue;
        }
        for (uint32_t j = 0; j < pl;) { /* byte-level: each code point stands for one byte */
            utf8proc_int32_t cp;
            utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)p + j, pl - j, &cp);
            if (r <= 0 || cp >= 512) {
                free(s);
                return keel_fail("decode: token %d is not byte-level", ids[i]);
            }
            s[k++] = (char)t->cp_byte[cp];
            j += (uint32_t)r;
        }
    }
    s[k] = 0;
    *text = s;
    *len = k;
    return 0;
}

const char *keel_tokenizer_token(const keel_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_tok ? t->tok[id] : NULL;
}
int32_t keel_tokenizer_vocab_size(const keel_tokenizer *t) { return t->n_tok; }
uint64_t keel_tokenizer_hash(const keel_tokenizer *t) { return t->hash; }

int32_t keel_tokenizer_added_id(const keel_tokenizer *t, const char *content) {
    for (int a = 0; a < t->n_added; a++)
        if (!strcmp(t->added[a].s, content)) return t->added[a].id;
    return -1;
}

char *keel_tokenizer_normalize(const keel_tokenizer *t, const char *text, size_t len, size_t *out_len) {
    if (!t->nfc) {
        char *c = malloc(len + 1);
        if (c) memcpy(c, text, len), c[len] = 0, *out_len = len;
        return c;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r =
        utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return NULL;
    *out_len = (size_t)r;
    return (char *)dst;
}
