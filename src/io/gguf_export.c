#include "io/gguf_export.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

/* llama.cpp's token types (llama_token_type). */
enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5 };
/* llama.cpp's file types (llama_ftype) for general.file_type. */
static uint32_t file_type(keel_ggml_type t) {
    return t == KEEL_GGML_F16 ? 1 : t == KEEL_GGML_Q8_0 ? 7 : t == KEEL_GGML_BF16 ? 32 : 0;
}
#define LLAMA_MAX_LAYERS 512
/* Qwen3.5's released context length, for a config.json that does not say. */
#define DEFAULT_CONTEXT 262144

int keel_gguf_check_config(const keel_qwen35_config *c) {
    if (c->lk_dim != c->lv_dim)
        return keel_fail("llama.cpp's qwen35 needs linear_key_head_dim == linear_value_head_dim (its DeltaNet state is "
                         "square); this model has %lld and %lld",
                         (long long)c->lk_dim, (long long)c->lv_dim);
    if (c->layers > LLAMA_MAX_LAYERS)
        return keel_fail("llama.cpp supports up to %d layers; this model has %lld", LLAMA_MAX_LAYERS,
                         (long long)c->layers);
    int64_t dims[] = {c->vocab,    c->hidden,   c->ffn,      c->heads,  c->kv_heads,
                      c->head_dim, c->lk_heads, c->lv_heads, c->lk_dim, c->conv_kernel};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        if (dims[i] > INT32_MAX)
            return keel_fail("a dimension of %lld does not fit llama.cpp's 32-bit hyperparameters", (long long)dims[i]);
    return 0;
}

/* ---- the tokenizer ---- */

typedef struct {
    char **tok;
    size_t *len;
    int32_t *type;
    int64_t n;
    char **merges;
    size_t *merge_len;
    int64_t n_merges;
} vocab;

static void vocab_free(vocab *v) {
    for (int64_t i = 0; i < v->n; i++) free(v->tok[i]);
    for (int64_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok), free(v->len), free(v->type), free(v->merges), free(v->merge_len);
    memset(v, 0, sizeof *v);
}

static int vocab_alloc(vocab *v, int64_t n) {
    v->n = n;
    v->tok = calloc((size_t)n, sizeof *v->tok);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->type = calloc((size_t)n, sizeof *v->type);
    return v->tok && v->len && v->type ? 0 : keel_fail("out of memory for a vocabulary of %lld", (long long)n);
}

static int set_token(vocab *v, int64_t id, const char *s, size_t len, int32_t type) {
    v->tok[id] = malloc(len + 1);
    if (!v->tok[id]) return keel_fail("out of memory");
    memcpy(v->tok[id], s, len);
    v->tok[id][len] = 0;
    v->len[id] = len, v->type[id] = type;
    return 0;
}

/* Ids no tokenizer entry names (gaps, and rows of an embedding larger than the tokenizer) get
 * unused placeholder tokens, as llama.cpp's own converter writes them. */
static int pad_unused(vocab *v) {
    for (int64_t i = 0; i < v->n; i++)
        if (!v->tok[i]) {
            char s[32];
            int n = snprintf(s, sizeof s, "[PAD%lld]", (long long)i);
            if (set_token(v, i, s, (size_t)n, TOK_UNUSED)) return -1;
        }
    return 0;
}

/* keel's byte vocabulary: id b < 256 is byte b (0 is the end of text), in GPT-2's byte alphabet,
 * with no merges: llama.cpp's byte-level BPE then gives one token per byte, as keel does. */
static int byte_vocab(vocab *v, int64_t n_vocab) {
    if (n_vocab < 256)
        return keel_fail("a byte-vocabulary model needs a vocabulary of at least 256 (this one has %lld)",
                         (long long)n_vocab);
    if (vocab_alloc(v, n_vocab)) return -1;
    for (int b = 0; b < 256; b++) {
        char s[4];
        if (set_token(v, b, s, (size_t)keel_tokenizer_byte_char((uint8_t)b, s), b == 0 ? TOK_CONTROL : TOK_NORMAL))
            return -1;
    }
    return pad_unused(v);
}

/* keel train records "vocabulary": "bytes" in trainer_state.json when it trained on bytes. */
static bool trained_on_bytes(const char *dir) {
    char p[4096 + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (stat(p, &st) != 0) return false;
    cJSON *j = keel_read_json(p);
    const char *v = j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "vocabulary")) : NULL;
    bool bytes = v && strcmp(v, "bytes") == 0;
    cJSON_Delete(j);
    return bytes;
}

/* The pre-tokenizer regexes llama.cpp knows, as tokenizer.json spells them. */
static const struct {
    const char *pre, *regex;
} KNOWN_PRE[] = {
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"qwen35", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
               "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

/* The pre-tokenizer's name for llama.cpp: a Split by a known regex followed by ByteLevel, or
 * ByteLevel alone with GPT-2's regex. NULL with a message otherwise. */
static const char *pre_name(const cJSON *pt, const char *path) {
    const cJSON *split = NULL, *bl = NULL, *it;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pt, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers")) {
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "type"));
            if (t && strcmp(t, "Split") == 0 && !split)
                split = it;
            else if (t && strcmp(t, "ByteLevel") == 0 && !bl)
                bl = it;
            else {
                keel_fail("%s: pre-tokenizer step '%s' is not one llama.cpp runs (expected Split by a known regex, "
                          "then ByteLevel)",
                          path, t ? t : "?");
                return NULL;
            }
        }
    } else if (type && strcmp(type, "ByteLevel") == 0) {
        bl = pt;
    }
    if (!bl) {
        keel_fail("%s: not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer)", path);
        return NULL;
    }
    bool use_regex = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "use_regex"));
    if (!split) {
        if (use_regex) return "gpt-2";
        keel_fail("%s: ByteLevel without a regex and no Split: llama.cpp has no such pre-tokenizer", path);
        return NULL;
    }
    if (use_regex) {
        keel_fail("%s: a Split and a ByteLevel regex together: llama.cpp has no such pre-tokenizer", path);
        return NULL;
    }
    const char *rx = cJSON_GetStringValue(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex"));
    for (size_t i = 0; rx && i < sizeof KNOWN_PRE / sizeof *KNOWN_PRE; i++)
        if (strcmp(rx, KNOWN_PRE[i].regex) == 0) return KNOWN_PRE[i].pre;
    keel_fail("%s: pre-tokenizer regex %s is not one llama.cpp knows (Qwen2/3, Qwen3.5, GPT-2)", path,
              rx ? rx : "(none)");
    return NULL;
}

/* Special tokens given in tokenizer_config.json as "text" or {"content": "text"}. */
static const char *special_text(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_GetStringValue(v);
}

static int64_t find_token(const vocab *v, const char *s) {
    for (int64_t i = 0; s && i < v->n; i++)
        if (v->len[i] == strlen(s) && memcmp(v->tok[i], s, v->len[i]) == 0) return i;
    return -1;
}

typedef struct {
    vocab v;
    const char *pre;
    int64_t bos, eos, pad;
    bool add_bos;
    char *chat_template;
} tokenizer_meta;

/* A token id from tokenizer.json: an integer in [0, n_vocab) (the model's embedding rows). */
static int64_t token_id(const cJSON *v, int64_t n_vocab, const char *path, const char *token) {
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v)) return keel_fail("%s: token '%s' has no numeric id", path, token);
    if (!(d >= 0 && d < (double)n_vocab && d == floor(d)))
        return keel_fail("%s: token '%s' has id %.17g; expected an integer in [0, %lld) (the model's vocabulary)", path,
                         token, d, (long long)n_vocab);
    return (int64_t)d;
}

static int read_tokenizer_json(tokenizer_meta *tm, const char *path, int64_t n_vocab) {
    keel_tokenizer *check = keel_tokenizer_load(path); /* keel's own loader validates it first */
    if (!check) return -1;
    keel_tokenizer_free(check);
    cJSON *j = keel_read_json(path);
    if (!j) return -1;
    int rc = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model"), *it;
    const char *mtype = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(model, "type"));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
    const char *ntype = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(norm, "type"));
    if (!mtype || strcmp(mtype, "BPE")) {
        keel_fail("%s: model.type '%s': only BPE tokenizers can be exported", path, mtype ? mtype : "?");
        goto done;
    }
    if (ntype && strcmp(ntype, "NFC")) {
        keel_fail("%s: normalizer '%s' is not one llama.cpp applies", path, ntype);
        goto done;
    }
    if (!(tm->pre = pre_name(cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"), path))) goto done;
    const cJSON *vmap = cJSON_GetObjectItemCaseSensitive(model, "vocab"),
                *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    int64_t n = 0, id;
    cJSON_ArrayForEach(it, vmap) {
        if ((id = token_id(it, n_vocab, path, it->string)) < 0) goto done;
        n = id + 1 > n ? id + 1 : n;
    }
    cJSON_ArrayForEach(it, added) {
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "content"));
        if ((id = token_id(cJSON_GetObjectItemCaseSensitive(it, "id"), n_vocab, path, s ? s : "(an added token)")) < 0)
            goto done;
        n = id + 1 > n ? id + 1 : n;
    }
    if (vocab_alloc(&tm->v, n_vocab)) goto done;
    cJSON_ArrayForEach(it, vmap) {
        id = (int64_t)it->valuedouble;
        if (tm->v.tok[id]) {
            keel_fail("%s: id %lld is given twice in model.vocab", path, (long long)id);
            goto done;
        }
        if (set_token(&tm->v, id, it->string, strlen(it->string), TOK_NORMAL)) goto done;
    }
    cJSON_ArrayForEach(it, added) {
        id = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(it, "id"));
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "content"));
        if (!s) {
            keel_fail("%s: added token %lld has no content", path, (long long)id);
            goto done;
        }
        int32_t type = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special")) ? TOK_CONTROL : TOK_USER_DEFINED;
        if (tm->v.tok[id]) { /* an added token that is also in the vocabulary keeps its id; it takes the added type */
            if (strcmp(tm->v.tok[id], s)) {
                keel_fail("%s: id %lld is '%s' in model.vocab and '%s' in added_tokens", path, (long long)id,
                          tm->v.tok[id], s);
                goto done;
            }
            tm->v.type[id] = type;
        } else if (set_token(&tm->v, id, s, strlen(s), type)) {
            goto done;
        }
    }
    if (pad_unused(&tm->v)) goto done;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    tm->v.n_merges = cJSON_GetArraySize(merges);
    tm->v.merges = calloc((size_t)tm->v.n_merges + 1, sizeof *tm->v.merges);
    tm->v.merge_len = calloc((size_t)tm->v.n_merges + 1, sizeof *tm->v.merge_len);
    if (!tm->v.merges || !tm->v.merge_len) {
        keel_fail("out of memory for %lld merges", (long long)tm->v.n_merges);
        goto done;
    }
    int64_t k = 0;
    cJSON_ArrayForEach(it, merges) { /* "a b", or ["a", "b"] in newer files */
        const char *a = cJSON_IsString(it) ? it->valuestring : cJSON_GetStringValue(cJSON_GetArrayItem(it, 0));
        const char *b = cJSON_IsString(it) ? NULL : cJSON_GetStringValue(cJSON_GetArrayItem(it, 1));
        if (!a || (!cJSON_IsString(it) && !b)) {
            keel_fail("%s: merge %lld is neither \"a b\" nor [a, b]", path, (long long)k);
            goto done;
        }
        size_t la = strlen(a), lb = b ? strlen(b) : 0;
        char *m = malloc(la + lb + 2);
        if (!m) {
            keel_fail("out of memory");
            goto done;
        }
        memcpy(m, a, la);
        if (b) m[la] = ' ', memcpy(m + la + 1, b, lb), la += lb + 1;
        m[la] = 0;
        tm->v.merges[k] = m, tm->v.merge_len[k++] = la;
    }
    rc = 0;
done:
    cJSON_Delete(j);
    return rc;
}

/* What tokenizer_config.json (beside the tokenizer) and config.json say of special tokens and the
 * chat template. */
static int read_specials(tokenizer_meta *tm, const char *tok_dir, const char *model_dir) {
    char p[4096 + 64]; /* a folder path (< 4096) and a file name */
    struct stat st;
    tm->bos = tm->eos = tm->pad = -1;
    snprintf(p, sizeof p, "%s/tokenizer_config.json", tok_dir);
    if (stat(p, &st) == 0) {
        cJSON *c = keel_read_json(p);
        if (!c) return -1;
        const char *names[3] = {special_text(c, "bos_token"), special_text(c, "eos_token"),
                                special_text(c, "pad_token")};
        int64_t *ids[3] = {&tm->bos, &tm->eos, &tm->pad};
        for (int i = 0; i < 3; i++)
            if (names[i] && (*ids[i] = find_token(&tm->v, names[i])) < 0) {
                cJSON_Delete(c);
                return keel_fail("%s: special token '%s' is not in the vocabulary", p, names[i]);
            }
        tm->add_bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_bos_token"));
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(c, "chat_template"), *it;
        if (cJSON_IsString(ct))
            tm->chat_template = strdup(ct->valuestring);
        else
            cJSON_ArrayForEach(it, ct) /* [{"name": "default", "template": ...}, ...] */
            {
                const char *nm = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "name"));
                const char *tx = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "template"));
                if (!tm->chat_template && nm && tx && strcmp(nm, "default") == 0) tm->chat_template = strdup(tx);
            }
        cJSON_Delete(c);
    }
    snprintf(p, sizeof p, "%s/chat_template.jinja", tok_dir);
    if (!tm->chat_template && stat(p, &st) == 0 && !(tm->chat_template = keel_read_file(p, NULL))) return -1;
    if (tm->eos < 0) { /* config.json's eos_token_id (a number, or the first of a list) */
        snprintf(p, sizeof p, "%s/config.json", model_dir);
        cJSON *c = keel_read_json(p);
        if (!c) return -1;
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(c, "text_config"),
                    *e = cJSON_GetObjectItemCaseSensitive(tc ? tc : c, "eos_token_id");
        if (cJSON_IsArray(e)) e = cJSON_GetArrayItem(e, 0);
        if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < (double)tm->v.n)
            tm->eos = (int64_t)e->valuedouble;
        cJSON_Delete(c);
    }
    return 0;
}

static int put_tokenizer(keel_gguf *g, const tokenizer_meta *tm) {
    const vocab *v = &tm->v;
    int rc = keel_gguf_str(g, "tokenizer.ggml.model", "gpt2") || keel_gguf_str(g, "tokenizer.ggml.pre", tm->pre) ||
             keel_gguf_arr_str(g, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->len, (size_t)v->n) ||
             keel_gguf_arr_i32(g, "tokenizer.ggml.token_type", v->type, (size_t)v->n) ||
             keel_gguf_arr_str(g, "tokenizer.ggml.merges", (const char *const *)v->merges, v->merge_len,
                               (size_t)v->n_merges) ||
             keel_gguf_bool(g, "tokenizer.ggml.add_bos_token", tm->add_bos);
    if (!rc && tm->bos >= 0) rc = keel_gguf_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)tm->bos);
    if (!rc && tm->eos >= 0) rc = keel_gguf_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)tm->eos);
    if (!rc && tm->pad >= 0) rc = keel_gguf_u32(g, "tokenizer.ggml.padding_token_id", (uint32_t)tm->pad);
    if (!rc && tm->chat_template) rc = keel_gguf_str(g, "tokenizer.chat_template", tm->chat_template);
    return rc ? -1 : 0;
}

/* ---- the tensors ---- */

typedef enum { AXIS_NONE, AXIS_ROWS, AXIS_COLS } head_axis;

typedef struct {
    const keel_tensor *p;
    char name[64];
    keel_ggml_type type;
    int n_dims;
    int64_t ne[2];
    bool plus_one, neg_exp;
    head_axis axis;  /* the axis holding DeltaNet value heads to reorder */
    int64_t v_start; /* where the value heads start on that axis */
    int64_t v_hd;    /* elements per value head on that axis */
} export_tensor;

typedef struct {
    const keel_qwen35 *m;
    keel_backend *be;
    export_tensor *t;
    float *src, *dst;
    const keel_gguf_export_opts *o;
} export_ctx;

/* Grouped -> tiled: the value head at tiled position h is grouped head (h % Hk) * (Hv/Hk) + h / Hk. */
static int64_t v_source(const keel_qwen35_config *c, int64_t i, int64_t start, int64_t hd) {
    if (i < start || c->lv_heads == c->lk_heads) return i;
    int64_t h = (i - start) / hd, d = (i - start) % hd, r = c->lv_heads / c->lk_heads;
    return start + ((h % c->lk_heads) * r + h / c->lk_heads) * hd + d;
}

static void progress(void *ud, int done, int total) {
    const export_ctx *x = ud;
    if (x->o->progress) x->o->progress(x->o->ud, done, total);
}

static int fill_tensor(void *ud, int i, void *buf, size_t nbytes) {
    export_ctx *x = ud;
    const export_tensor *t = &x->t[i];
    const keel_qwen35_config *c = &x->m->cfg;
    int64_t cols = t->ne[0], rows = t->n_dims > 1 ? t->ne[1] : 1, n = rows * cols;
    if (keel_tensor_read(x->be, t->p, x->src, KEEL_F32)) return -1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t sr = t->axis == AXIS_ROWS ? v_source(c, r, t->v_start, t->v_hd) : r;
        for (int64_t k = 0; k < cols; k++) {
            int64_t sk = t->axis == AXIS_COLS ? v_source(c, k, t->v_start, t->v_hd) : k;
            double v = x->src[sr * cols + sk];
            if (t->plus_one) v += 1.0;
            if (t->neg_exp) v = -exp(v);
            x->dst[r * cols + k] = (float)v;
        }
    }
    (void)nbytes; /* keel_gguf_write sized buf for this tensor */
    keel_ggml_encode(t->type, x->dst, n, buf);
    return 0;
}

/* The matrices take the requested type; vectors and the conv stay float32 (llama.cpp computes
 * them in float32); q8_0 rows must hold whole blocks, else float16 as llama.cpp's converter does. */
static keel_ggml_type matrix_type(keel_ggml_type want, int64_t ne0) {
    return want == KEEL_GGML_Q8_0 && ne0 % KEEL_Q8_0_BLOCK ? KEEL_GGML_F16 : want;
}

static int add(keel_gguf *g, export_tensor *list, int *n, const keel_tensor *p, const char *name, keel_ggml_type want) {
    export_tensor *t = &list[(*n)++];
    memset(t, 0, sizeof *t);
    t->p = p;
    snprintf(t->name, sizeof t->name, "%s", name);
    /* keel's shape is the checkpoint's reversed; the conv's [C,1,K] is stored as [C,K] */
    int64_t ne0 = p->ne[0], rest = keel_nelements(p) / ne0;
    t->n_dims = rest > 1 ? 2 : 1;
    t->ne[0] = ne0, t->ne[1] = rest;
    t->type = t->n_dims == 1 ? KEEL_GGML_F32 : matrix_type(want, ne0);
    return keel_gguf_tensor(g, t->name, t->type, t->n_dims, t->ne);
}

static int add_tensors(keel_gguf *g, const keel_qwen35 *m, keel_ggml_type want, export_tensor *list, int *n) {
    const keel_qwen35_config *c = &m->cfg;
    char nm[64];
    int64_t vs = 2 * c->lk_heads * c->lk_dim; /* the value channels of the qkv projection and the conv */
#define ADD(p, ...) (snprintf(nm, sizeof nm, __VA_ARGS__), add(g, list, n, (p), nm, want))
#define LAST        (&list[*n - 1])
    if (ADD(m->embed, "token_embd.weight") || ADD(m->final_norm, "output_norm.weight")) return -1;
    LAST->plus_one = true;
    if (!c->tied && ADD(m->lm_head, "output.weight")) return -1;
    for (int64_t i = 0; i < c->layers; i++) {
        const keel_qwen35_layer *L = &m->layer[i];
        int b = (int)i;
        if (ADD(L->in_norm, "blk.%d.attn_norm.weight", b)) return -1;
        LAST->plus_one = true;
        if (ADD(L->post_norm, "blk.%d.post_attention_norm.weight", b)) return -1;
        LAST->plus_one = true;
        if (c->full_attention[i]) {
            if (ADD(L->q, "blk.%d.attn_q.weight", b) || ADD(L->k, "blk.%d.attn_k.weight", b) ||
                ADD(L->v, "blk.%d.attn_v.weight", b) || ADD(L->o, "blk.%d.attn_output.weight", b) ||
                ADD(L->q_norm, "blk.%d.attn_q_norm.weight", b))
                return -1;
            LAST->plus_one = true;
            if (ADD(L->k_norm, "blk.%d.attn_k_norm.weight", b)) return -1;
            LAST->plus_one = true;
        } else {
            /* value heads lie along the rows of the input projections (after q and k in the qkv
             * projection and the conv), and along the columns of the output projection */
            struct {
                const keel_tensor *p;
                const char *name;
                head_axis axis;
                int64_t start, hd;
                bool neg_exp;
                keel_ggml_type type;
            } dn[] = {
                {L->qkv, "attn_qkv.weight", AXIS_ROWS, vs, c->lv_dim, false, want},
                {L->z, "attn_gate.weight", AXIS_ROWS, 0, c->lv_dim, false, want},
                {L->b, "ssm_beta.weight", AXIS_ROWS, 0, 1, false, want},
                {L->a, "ssm_alpha.weight", AXIS_ROWS, 0, 1, false, want},
                {L->conv, "ssm_conv1d.weight", AXIS_ROWS, vs, c->lv_dim, false,
                 KEEL_GGML_F32}, /* ggml_ssm_conv is float32 */
                {L->A_log, "ssm_a", AXIS_COLS, 0, 1, true, want},
                {L->dt_bias, "ssm_dt.bias", AXIS_COLS, 0, 1, false, want},
                {L->norm, "ssm_norm.weight", AXIS_NONE, 0, 0, false, want},
                {L->out, "ssm_out.weight", AXIS_COLS, 0, c->lv_dim, false, want},
            };
            for (size_t k = 0; k < sizeof dn / sizeof *dn; k++) {
                snprintf(nm, sizeof nm, "blk.%d.%s", b, dn[k].name);
                if (add(g, list, n, dn[k].p, nm, dn[k].type)) return -1;
                LAST->axis = dn[k].axis, LAST->v_start = dn[k].start, LAST->v_hd = dn[k].hd,
                LAST->neg_exp = dn[k].neg_exp;
            }
        }
        if (ADD(L->gate, "blk.%d.ffn_gate.weight", b) || ADD(L->up, "blk.%d.ffn_up.weight", b) ||
            ADD(L->down, "blk.%d.ffn_down.weight", b))
            return -1;
    }
#undef ADD
#undef LAST
    return 0;
}

/* ---- the hyperparameters ---- */

static int put_model(keel_gguf *g, const keel_qwen35_config *c, const char *dir, const keel_gguf_export_opts *o) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cJSON *cfg = keel_read_json(p);
    if (!cfg) return -1;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(tc ? tc : cfg, "max_position_embeddings");
    uint32_t ctx = cJSON_IsNumber(mp) && mp->valuedouble >= 1 && mp->valuedouble <= UINT32_MAX
                       ? (uint32_t)mp->valuedouble
                       : DEFAULT_CONTEXT;
    cJSON_Delete(cfg);
    const char *name = o->name;
    if (!name) name = strrchr(dir, '/') && strrchr(dir, '/')[1] ? strrchr(dir, '/') + 1 : dir;
    int64_t n_rot = (int64_t)(c->partial_rotary * (double)c->head_dim), pairs = n_rot / 2;
    /* Text positions are the same in all three MRoPE sections, so any split that covers every
     * rotary pair computes ordinary RoPE; this balanced one is Qwen3.5's ([11, 11, 10] for 32
     * pairs) and covers every pair in llama.cpp's interleaved assignment. */
    int32_t sections[4] = {(int32_t)(pairs / 3 + (pairs % 3 > 0)), (int32_t)(pairs / 3 + (pairs % 3 > 1)),
                           (int32_t)(pairs / 3), 0};
    bool recurrent[LLAMA_MAX_LAYERS];
    int64_t interval = 0;
    for (int64_t i = 0; i < c->layers; i++) {
        recurrent[i] = !c->full_attention[i];
        if (!interval && c->full_attention[i]) interval = i + 1;
    }
    for (int64_t i = 0; i < c->layers && interval; i++)
        if (c->full_attention[i] != ((i + 1) % interval == 0)) interval = 0; /* not a regular pattern */
    const char *A = "qwen35.";
#define K(s) (snprintf(p, sizeof p, "%s%s", A, s), p)
    int rc = keel_gguf_str(g, "general.architecture", "qwen35") || keel_gguf_str(g, "general.name", name) ||
             keel_gguf_u32(g, "general.file_type", file_type(o->type)) ||
             keel_gguf_u32(g, "general.quantization_version", 2) || keel_gguf_u32(g, K("context_length"), ctx) ||
             keel_gguf_u32(g, K("embedding_length"), (uint32_t)c->hidden) ||
             keel_gguf_u32(g, K("block_count"), (uint32_t)c->layers) ||
             keel_gguf_u32(g, K("feed_forward_length"), (uint32_t)c->ffn) ||
             keel_gguf_u32(g, K("attention.head_count"), (uint32_t)c->heads) ||
             keel_gguf_u32(g, K("attention.head_count_kv"), (uint32_t)c->kv_heads) ||
             keel_gguf_u32(g, K("attention.key_length"), (uint32_t)c->head_dim) ||
             keel_gguf_u32(g, K("attention.value_length"), (uint32_t)c->head_dim) ||
             keel_gguf_f32(g, K("attention.layer_norm_rms_epsilon"), (float)c->rms_eps) ||
             keel_gguf_f32(g, K("rope.freq_base"), (float)c->rope_theta) ||
             keel_gguf_u32(g, K("rope.dimension_count"), (uint32_t)n_rot) ||
             keel_gguf_arr_i32(g, K("rope.dimension_sections"), sections, 4) ||
             keel_gguf_u32(g, K("ssm.conv_kernel"), (uint32_t)c->conv_kernel) ||
             keel_gguf_u32(g, K("ssm.state_size"), (uint32_t)c->lk_dim) ||
             keel_gguf_u32(g, K("ssm.group_count"), (uint32_t)c->lk_heads) ||
             keel_gguf_u32(g, K("ssm.time_step_rank"), (uint32_t)c->lv_heads) ||
             keel_gguf_u32(g, K("ssm.inner_size"), (uint32_t)(c->lv_dim * c->lv_heads)) ||
             keel_gguf_arr_bool(g, K("attention.recurrent_layers"), recurrent, (size_t)c->layers);
    if (!rc && interval) rc = keel_gguf_u32(g, K("full_attention_interval"), (uint32_t)interval);
#undef K
    return rc ? -1 : 0;
}

int keel_gguf_export(const keel_checkpoint *ck, const keel_qwen35 *m, keel_backend *be, const char *out_path,
                     const keel_gguf_export_opts *o) {
    const keel_qwen35_config *c = &m->cfg;
    if (keel_gguf_check_config(c)) return -1;
    tokenizer_meta tm = {.pre = "gpt-2", .bos = -1, .eos = -1, .pad = -1};
    char tok_path[4096], tok_dir[4096];
    struct stat st;
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", ck->dir);
    const char *tp = o->tokenizer ? o->tokenizer : stat(tok_path, &st) == 0 ? tok_path : NULL;
    keel_gguf *g = keel_gguf_new();
    export_tensor *list = calloc((size_t)(3 + 16 * c->layers), sizeof *list);
    int n = 0, rc = -1;
    export_ctx x = {.m = m, .be = be, .t = list, .o = o};
    if (!g || !list) {
        keel_fail("out of memory");
        goto done;
    }
    if (tp) {
        snprintf(tok_dir, sizeof tok_dir, "%s", tp);
        char *slash = strrchr(tok_dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(tok_dir, sizeof tok_dir, ".");
        if (read_tokenizer_json(&tm, tp, c->vocab) || read_specials(&tm, tok_dir, ck->dir)) goto done;
    } else {
        if (!o->byte_vocab && c->vocab != 256 && !trained_on_bytes(ck->dir)) {
            keel_fail("%s has no tokenizer.json and a vocabulary of %lld: give --tokenizer FILE (or --byte-vocab if "
                      "the model was "
                      "trained on bytes)",
                      ck->dir, (long long)c->vocab);
            goto done;
        }
        if (byte_vocab(&tm.v, c->vocab)) goto done;
        tm.eos = 0, tm.bos = 0;
    }
    if (put_model(g, c, ck->dir, o) || put_tokenizer(g, &tm) || add_tensors(g, m, o->type, list, &n)) goto done;
    int64_t most = 0;
    for (int i = 0; i < n; i++) most = most > keel_nelements(list[i].p) ? most : keel_nelements(list[i].p);
    x.src = malloc((size_t)most * sizeof(float));
    x.dst = malloc((size_t)most * sizeof(float));
    if (!x.src || !x.dst) {
        keel_fail("out of memory for a tensor of %lld values", (long long)most);
        goto done;
    }
    rc = keel_gguf_write(g, out_path, fill_tensor, &x, progress);
done:
    free(x.src), free(x.dst), free(list);
    free(tm.chat_template);
    vocab_free(&tm.v);
    keel_gguf_free(g);
    return rc;
}
