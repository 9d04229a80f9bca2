#define _DEFAULT_SOURCE /* d_type */
#include "train/data.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "tokenizer/chat_template.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/file.h"

typedef struct {
    char **path;
    int n, cap;
} file_list;

static int add_path(file_list *l, const char *p) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        char **np = realloc(l->path, (size_t)l->cap * sizeof *np);
        if (!np) return keel_fail("out of memory");
        l->path = np;
    }
    if (!(l->path[l->n] = strdup(p))) return keel_fail("out of memory listing '%s'", p);
    l->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int collect(file_list *l, const char *p) {
    struct stat st;
    if (stat(p, &st) != 0) return keel_fail("--data %s: %s", p, strerror(errno));
    if (S_ISREG(st.st_mode)) return add_path(l, p);
    if (!S_ISDIR(st.st_mode)) return keel_fail("--data %s: not a file or folder", p);
    DIR *d = opendir(p);
    if (!d) return keel_fail("--data %s: cannot open: %s", p, strerror(errno));
    file_list sub = {0};
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) && !rc) {
        if (e->d_name[0] == '.') continue;
        char q[4096];
        snprintf(q, sizeof q, "%s/%s", p, e->d_name);
        rc = add_path(&sub, q);
    }
    closedir(d);
    qsort(sub.path, (size_t)sub.n, sizeof *sub.path, cmp_str); /* a fixed order, whatever readdir says */
    for (int i = 0; i < sub.n && !rc; i++) rc = collect(l, sub.path[i]);
    for (int i = 0; i < sub.n; i++) free(sub.path[i]);
    free(sub.path);
    return rc;
}

typedef struct {
    int32_t *v;
    uint8_t *m; /* per token: 1 when it is a target the loss counts */
    int64_t n, cap;
} tokvec;

static int push(tokvec *t, const int32_t *ids, int64_t n, uint8_t mask) {
    if (t->n + n > t->cap) {
        int64_t c = t->cap ? t->cap : 1 << 16;
        while (c < t->n + n) c *= 2;
        int32_t *nv = realloc(t->v, (size_t)c * sizeof *nv);
        if (nv) t->v = nv;
        uint8_t *nm = nv ? realloc(t->m, (size_t)c) : NULL;
        if (!nv || !nm) return keel_fail("out of memory for token ids");
        t->m = nm, t->cap = c;
    }
    memcpy(t->v + t->n, ids, (size_t)n * sizeof *ids);
    memset(t->m + t->n, mask, (size_t)n);
    t->n += n;
    return 0;
}

/* text's ids (the tokenizer's, or its bytes), each with the given mask */
static int encode_text(keel_tokenizer *tok, const char *text, size_t n, const char *where, tokvec *out, uint8_t mask) {
    if (tok) {
        int32_t *ids;
        size_t ni;
        if (keel_tokenizer_encode(tok, text, n, &ids, &ni)) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", keel_last_error());
            return keel_fail("%s: %s", where, msg);
        }
        int rc = push(out, ids, (int64_t)ni, mask);
        free(ids);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t b = (unsigned char)text[i];
        if (b == 0) continue; /* byte 0 is the end-of-text token */
        if (push(out, &b, 1, mask)) return -1;
    }
    return 0;
}

static int encode_doc(keel_tokenizer *tok, const char *text, size_t n, const char *where, tokvec *out, int32_t eot) {
    return encode_text(tok, text, n, where, out, 1) || push(out, &eot, 1, 1) ? -1 : 0;
}

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static bool eval_doc(uint64_t seed, int64_t i, double fraction) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 31, z *= 0x94d049bb133111ebull, z ^= z >> 29;
    return (double)(z % 1000000) / 1e6 < fraction;
}

/* tokens.cache: "KEELTOK3", the key of what it was made from (tokenizer, files, split, format),
 * the four counts, an XXH64 of the ids (and masks), whether masks follow, then the training and
 * the held-out ids, then (when there are masks) their masks, one byte a token. */
#define CACHE_MAGIC 0x334b4f544c45454bull

static uint64_t cache_sum(const keel_dataset *d) {
    XXH64_state_t *st = XXH64_createState();
    if (!st) return 0;
    XXH64_reset(st, 0);
    XXH64_update(st, d->train, (size_t)d->n_train * 4);
    XXH64_update(st, d->eval, (size_t)d->n_eval * 4);
    if (d->train_mask) XXH64_update(st, d->train_mask, (size_t)d->n_train);
    if (d->eval_mask) XXH64_update(st, d->eval_mask, (size_t)d->n_eval);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

static int64_t count_trained(const uint8_t *m, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 1; i < n; i++) k += m ? m[i] : 1; /* targets: every token but the first */
    return k;
}

/* The cached ids when the cache is for these files and intact: sizes bounded by the file's own,
 * the checksum, every id inside the vocabulary. A damaged cache is reported and made again (it is
 * only an optimisation); true when d was filled from it. */
static bool read_cache(keel_dataset *d, const char *path, uint64_t key, int32_t vocab) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return false;
    FILE *f = S_ISREG(sb.st_mode) ? fopen(path, "rb") : NULL;
    uint64_t hdr[8];
    const char *why = NULL;
    if (!f || fread(hdr, 8, 8, f) != 8 || hdr[0] != CACHE_MAGIC || hdr[1] != key) { /* another version or data */
        if (f) fclose(f);
        return false;
    }
    uint64_t per = hdr[7] ? 5 : 4, bytes = (uint64_t)sb.st_size - 64, room = bytes / per;
    if (hdr[7] > 1 || bytes % per || hdr[2] > room || hdr[3] > room - hdr[2] || hdr[2] + hdr[3] != room ||
        hdr[4] > room || hdr[5] > hdr[4]) {
        why = "its counts do not match its size";
    } else {
        d->n_train = (int64_t)hdr[2], d->n_eval = (int64_t)hdr[3], d->n_docs = (int64_t)hdr[4],
        d->n_eval_docs = (int64_t)hdr[5];
        d->train = malloc((size_t)(d->n_train + 1) * 4), d->eval = malloc((size_t)(d->n_eval + 1) * 4);
        if (hdr[7]) d->train_mask = malloc((size_t)d->n_train + 1), d->eval_mask = malloc((size_t)d->n_eval + 1);
        if (!d->train || !d->eval || (hdr[7] && (!d->train_mask || !d->eval_mask)) ||
            fread(d->train, 4, (size_t)d->n_train, f) != (size_t)d->n_train ||
            fread(d->eval, 4, (size_t)d->n_eval, f) != (size_t)d->n_eval ||
            (hdr[7] && (fread(d->train_mask, 1, (size_t)d->n_train, f) != (size_t)d->n_train ||
                        fread(d->eval_mask, 1, (size_t)d->n_eval, f) != (size_t)d->n_eval)))
            why = "it cannot be read whole";
        else if (cache_sum(d) != hdr[6])
            why = "its checksum does not match its ids";
        for (int64_t i = 0; !why && i < d->n_train + d->n_eval; i++) {
            int32_t v = i < d->n_train ? d->train[i] : d->eval[i - d->n_train];
            if (v < 0 || v >= vocab) why = "it holds an id outside the vocabulary";
        }
    }
    fclose(f);
    if (!why) {
        d->cached = true;
        d->n_trained = count_trained(d->train_mask, d->n_train);
        d->n_targets = d->n_train > 0 ? d->n_train - 1 : 0;
        return true;
    }
    fprintf(stderr, "keel: %s is damaged (%s); tokenizing the data again\n", path, why);
    free(d->train), free(d->eval), free(d->train_mask), free(d->eval_mask);
    d->train = d->eval = NULL, d->train_mask = d->eval_mask = NULL;
    d->n_train = d->n_eval = d->n_docs = d->n_eval_docs = 0;
    return false;
}

typedef enum { FMT_AUTO, FMT_TEXT, FMT_PROMPT_COMPLETION, FMT_MESSAGES } data_format;

/* The format a JSON Lines object is in: "text", "prompt" with "completion", or "messages" (a
 * conversation). FMT_AUTO when it is none of them. */
static data_format detect(const cJSON *o) {
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "text"))) return FMT_TEXT;
    if (cJSON_GetObjectItemCaseSensitive(o, "prompt") && cJSON_GetObjectItemCaseSensitive(o, "completion"))
        return FMT_PROMPT_COMPLETION;
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "messages"))) return FMT_MESSAGES;
    return FMT_AUTO;
}

/* A conversation keel trains on: a list of {role, content} with roles system, user, assistant (or
 * tool), contents strings, at least one assistant turn. */
static bool conversation_ok(const cJSON *msgs) {
    if (!cJSON_IsArray(msgs)) return false;
    int assistant = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        if (!role || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "content"))) return false;
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))
            return false;
        assistant += !strcmp(role, "assistant");
    }
    return assistant > 0;
}

/* A conversation rendered with the chat template, tokenized, then the loss's mask: each assistant
 * turn's tokens after its header ("<|im_start|>assistant\n"), up to and including its
 * end-of-turn token <|im_end|> (ChatML, the format of Qwen's templates; train_on_all: every
 * token). The end-of-text token that follows is not trained on (with train_on_all it is). */
static int encode_chat(keel_tokenizer *tok, const cJSON *msgs, const char *where, const keel_data_opts *o, tokvec *out,
                       int32_t eot) {
    keel_chat_vars v = {.messages = msgs, .bos_token = o->bos_token, .eos_token = o->eos_token};
    size_t len;
    char *text = keel_chat_template_render(o->chat, &v, &len);
    if (!text) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", keel_last_error());
        return keel_fail("%s: %s", where, msg);
    }
    int32_t *ids = NULL, *hdr = NULL;
    size_t ni = 0, nh = 0;
    int rc = keel_tokenizer_encode(tok, text, len, &ids, &ni);
    free(text);
    int32_t start = keel_tokenizer_added_id(tok, "<|im_start|>"), end = keel_tokenizer_added_id(tok, "<|im_end|>");
    if (!rc && !o->train_on_all && (start < 0 || end < 0))
        rc = keel_fail("%s: the loss on the assistant's turns needs a ChatML template and tokenizer (<|im_start|>, "
                       "<|im_end|>); --train-on all trains on every token",
                       where);
    if (!rc && !o->train_on_all) rc = keel_tokenizer_encode(tok, "assistant\n", 10, &hdr, &nh);
    size_t base = (size_t)out->n;
    if (!rc) rc = push(out, ids, (int64_t)ni, o->train_on_all ? 1 : 0);
    int turns = 0;
    for (size_t i = 0; !rc && !o->train_on_all && i + nh < ni; i++) {
        if (ids[i] != start || memcmp(ids + i + 1, hdr, nh * sizeof *hdr)) continue;
        size_t j = i + 1 + nh;
        while (j < ni && ids[j] != end) out->m[base + j++] = 1;
        if (j < ni) out->m[base + j] = 1; /* the end-of-turn token */
        turns++;
        i = j;
    }
    if (!rc && !o->train_on_all && !turns)
        rc = keel_fail("%s: the rendered conversation has no assistant turn (<|im_start|>assistant)", where);
    free(ids), free(hdr);
    return rc ? rc : push(out, &eot, 1, o->train_on_all ? 1 : 0);
}

/* One JSON Lines file: every line an example in the file's format (detected from its first object,
 * or forced); a line that is not one is an error naming file and line, or with skip_bad counted
 * and skipped. */
static int load_jsonl(keel_dataset *d, const char *path, char *text, keel_tokenizer *tok, double eval_fraction,
                      uint64_t seed, const keel_data_opts *o, tokvec *tr, tokvec *ev) {
    data_format want = FMT_AUTO;
    if (o && o->format && strcmp(o->format, "auto"))
        want = !strcmp(o->format, "text")                ? FMT_TEXT
               : !strcmp(o->format, "prompt-completion") ? FMT_PROMPT_COMPLETION
                                                         : FMT_MESSAGES;
    data_format fmt = want;
    int64_t line_no = 0;
    int rc = 0;
    for (char *line = text, *next; line && *line && !rc; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        line_no++;
        if (!*line || (line[0] == '\r' && !line[1])) continue;
        cJSON *obj = cJSON_Parse(line);
        if (cJSON_IsObject(obj) && fmt == FMT_AUTO) fmt = detect(obj);
        if (fmt == FMT_MESSAGES && (!tok || !o || !o->chat)) {
            cJSON_Delete(obj);
            return keel_fail("%s:%lld: conversations (\"messages\") need the model's tokenizer and its chat template "
                             "(tokenizer_config.json beside tokenizer.json, or --chat-template FILE)",
                             path, (long long)line_no);
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "text"),
                    *p = cJSON_GetObjectItemCaseSensitive(obj, "prompt"),
                    *c = cJSON_GetObjectItemCaseSensitive(obj, "completion");
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages");
        bool ok = cJSON_IsObject(obj) && (fmt == FMT_TEXT                ? cJSON_IsString(t)
                                          : fmt == FMT_PROMPT_COMPLETION ? cJSON_IsString(p) && cJSON_IsString(c)
                                          : fmt == FMT_MESSAGES          ? conversation_ok(msgs)
                                                                         : false);
        if (!ok) {
            cJSON_Delete(obj);
            if (o && o->skip_bad_lines) {
                d->n_bad_lines++;
                continue;
            }
            return keel_fail(
                "%s:%lld: %s (--skip-bad-lines skips such lines)", path, (long long)line_no,
                !obj                  ? "not valid JSON"
                : fmt == FMT_TEXT     ? "expected a JSON object with a \"text\" string"
                : fmt == FMT_MESSAGES ? "expected a JSON object with \"messages\": a list of {\"role\": system, user, "
                                        "assistant or tool, \"content\": a string}, one at least from the assistant"
                : fmt == FMT_AUTO     ? "expected a JSON object with \"text\", or \"prompt\" and \"completion\""
                                      : "expected a JSON object with \"prompt\" and \"completion\" strings");
        }
        char where[4200];
        snprintf(where, sizeof where, "%s:%lld", path, (long long)line_no);
        bool to_eval = eval_doc(seed, d->n_docs, eval_fraction);
        tokvec *out = to_eval ? ev : tr;
        if (fmt == FMT_TEXT) {
            rc = encode_doc(tok, t->valuestring, strlen(t->valuestring), where, out, d->eot);
        } else if (fmt == FMT_MESSAGES) {
            rc = encode_chat(tok, msgs, where, o, out, d->eot);
            d->n_chat++;
        } else { /* the prompt's ids, then the completion's, then end-of-text; the loss on the completion
                  * and the end-of-text after it (the prompt too with train_on_all) */
            rc = encode_text(tok, p->valuestring, strlen(p->valuestring), where, out, o && o->train_on_all) ||
                 encode_text(tok, c->valuestring, strlen(c->valuestring), where, out, 1) || push(out, &d->eot, 1, 1);
            d->n_pc++;
        }
        d->n_eval_docs += to_eval;
        d->n_docs++;
        cJSON_Delete(obj);
    }
    return rc;
}

int keel_dataset_load(keel_dataset *d, const char *const *paths, int n_paths, keel_tokenizer *tok, double eval_fraction,
                      uint64_t seed, const char *cache_path, const keel_data_opts *o) {
    memset(d, 0, sizeof *d);
    if (o && o->format && strcmp(o->format, "auto") && strcmp(o->format, "text") &&
        strcmp(o->format, "prompt-completion") && strcmp(o->format, "messages"))
        return keel_fail("--data-format '%s': expected auto, text, prompt-completion or messages", o->format);
    d->eot = tok ? keel_tokenizer_added_id(tok, "<|endoftext|>") : 0;
    if (tok && d->eot < 0) return keel_fail("the tokenizer has no <|endoftext|> token to join documents with");
    file_list files = {0};
    int rc = 0;
    for (int i = 0; i < n_paths && !rc; i++) rc = collect(&files, paths[i]);
    if (!rc && files.n == 0) rc = keel_fail("--data: no files found");
    /* the cache key: tokenizer, files (name, size, time), split, format */
    uint64_t key = mix(0xcbf29ce484222325ull, "keel-data-2", 11);
    uint64_t th = tok ? keel_tokenizer_hash(tok) : 0;
    key = mix(key, &th, 8);
    key = mix(key, &eval_fraction, 8);
    key = mix(key, &seed, 8);
    const char *fmt_s = o && o->format ? o->format : "auto";
    uint8_t flags[2] = {(uint8_t)(o && o->skip_bad_lines), (uint8_t)(o && o->train_on_all)};
    key = mix(key, fmt_s, strlen(fmt_s));
    if (o && o->chat_id) key = mix(key, o->chat_id, strlen(o->chat_id));
    key = mix(key, flags, 2);
    for (int i = 0; i < files.n && !rc; i++) {
        struct stat st;
        stat(files.path[i], &st);
        key = mix(key, files.path[i], strlen(files.path[i]));
        key = mix(key, &st.st_size, sizeof st.st_size);
        key = mix(key, &st.st_mtime, sizeof st.st_mtime);
        size_t len = strlen(files.path[i]);
        d->jsonl |= len > 6 && !strcmp(files.path[i] + len - 6, ".jsonl");
    }
    if (!rc && cache_path && read_cache(d, cache_path, key, tok ? keel_tokenizer_vocab_size(tok) : 256)) {
        for (int i = 0; i < files.n; i++) free(files.path[i]);
        free(files.path);
        return 0;
    }
    tokvec tr = {0}, ev = {0};
    for (int i = 0; i < files.n && !rc; i++) {
        size_t n;
        char *text = keel_read_file(files.path[i], &n);
        if (!text) {
            rc = -1;
            break;
        }
        size_t len = strlen(files.path[i]);
        bool jsonl = len > 6 && !strcmp(files.path[i] + len - 6, ".jsonl");
        if (jsonl) {
            rc = load_jsonl(d, files.path[i], text, tok, eval_fraction, seed, o, &tr, &ev);
        } else if (o && o->format && (!strcmp(o->format, "prompt-completion") || !strcmp(o->format, "messages"))) {
            rc = keel_fail("%s: --data-format %s needs .jsonl files", files.path[i], o->format);
        } else if (n > 0) {
            bool to_eval = eval_doc(seed, d->n_docs, eval_fraction);
            rc = encode_doc(tok, text, n, files.path[i], to_eval ? &ev : &tr, d->eot);
            d->n_eval_docs += to_eval;
            d->n_docs++;
        }
        free(text);
    }
    if (!rc && d->n_docs == 0)
        rc = d->n_bad_lines ? keel_fail("--data: every line was skipped (%lld bad lines)", (long long)d->n_bad_lines)
                            : keel_fail("--data: no text (the files are empty)");
    if (!rc && (tr.n == 0 || (ev.n == 0 && eval_fraction > 0))) {
        /* one document (or an unlucky draw): hold out the last fraction of the token stream */
        tokvec all = {0};
        rc = tr.n ? push(&all, tr.v, tr.n, 1) : 0;
        if (!rc && tr.n) memcpy(all.m, tr.m, (size_t)tr.n);
        if (!rc && ev.n) rc = push(&all, ev.v, ev.n, 1), memcpy(all.m + all.n - ev.n, ev.m, (size_t)ev.n);
        free(tr.v), free(ev.v), free(tr.m), free(ev.m);
        int64_t n_ev = (int64_t)((double)all.n * eval_fraction);
        tr = (tokvec){0}, ev = (tokvec){0};
        if (!rc) rc = push(&tr, all.v, all.n - n_ev, 1);
        if (!rc) memcpy(tr.m, all.m, (size_t)(all.n - n_ev));
        if (!rc && n_ev) rc = push(&ev, all.v + all.n - n_ev, n_ev, 1);
        if (!rc && n_ev) memcpy(ev.m, all.m + all.n - n_ev, (size_t)n_ev);
        free(all.v), free(all.m);
        d->n_eval_docs = 0;
    }
    for (int i = 0; i < files.n; i++) free(files.path[i]);
    free(files.path);
    if (rc) {
        free(tr.v), free(ev.v), free(tr.m), free(ev.m);
        return rc;
    }
    bool masked = false; /* masks only when some target is left out of the loss */
    for (int64_t i = 0; i < tr.n && !masked; i++) masked = !tr.m[i];
    for (int64_t i = 0; i < ev.n && !masked; i++) masked = !ev.m[i];
    d->train = tr.v, d->n_train = tr.n, d->eval = ev.v ? ev.v : malloc(4), d->n_eval = ev.n;
    if (masked) {
        d->train_mask = tr.m, d->eval_mask = ev.m ? ev.m : malloc(1);
    } else {
        free(tr.m), free(ev.m);
    }
    d->n_trained = count_trained(d->train_mask, d->n_train);
    d->n_targets = d->n_train > 0 ? d->n_train - 1 : 0;
    if (cache_path) { /* written whole, then renamed */
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", cache_path, (long)getpid()); /* ranks may write at once */
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);  /* never through a planted link */
        FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (fd >= 0 && !f) close(fd);
        uint64_t hdr[8] = {CACHE_MAGIC,          key,
                           (uint64_t)d->n_train, (uint64_t)d->n_eval,
                           (uint64_t)d->n_docs,  (uint64_t)d->n_eval_docs,
                           cache_sum(d),         masked ? 1u : 0u};
        bool ok = f && fwrite(hdr, 8, 8, f) == 8 && fwrite(d->train, 4, (size_t)d->n_train, f) == (size_t)d->n_train &&
                  fwrite(d->eval, 4, (size_t)d->n_eval, f) == (size_t)d->n_eval;
        if (masked)
            ok = ok && fwrite(d->train_mask, 1, (size_t)d->n_train, f) == (size_t)d->n_train &&
                 fwrite(d->eval_mask, 1, (size_t)d->n_eval, f) == (size_t)d->n_eval;
        if (f) ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, cache_path))
            remove(tmp); /* a cache is an optimisation: failing to write one is not an error */
    }
    return 0;
}

static void packing_free(keel_packing *k) {
    if (!k) return;
    free(k->first), free(k->start), free(k->len);
    free(k);
}

void keel_dataset_free(keel_dataset *d) {
    free(d->train), free(d->eval), free(d->train_mask), free(d->eval_mask);
    packing_free(d->train_pack), packing_free(d->eval_pack);
    memset(d, 0, sizeof *d);
}

/* ---- packing ---- */

/* First fit in O(log n): a tree over the windows holding the most room left below each node; the
 * leftmost window with room for `need` is found by going down where there is room. */
typedef struct {
    int32_t *room;
    int64_t leaves;
} fit_tree;

static int64_t fit_take(fit_tree *f, int32_t need) {
    int64_t i = 1;
    while (i < f->leaves) i = f->room[2 * i] >= need ? 2 * i : 2 * i + 1;
    int64_t w = i - f->leaves;
    f->room[i] -= need;
    for (i /= 2; i >= 1; i /= 2) f->room[i] = f->room[2 * i] > f->room[2 * i + 1] ? f->room[2 * i] : f->room[2 * i + 1];
    return w;
}

/* The examples of a stream: the tokens up to and including each end-of-text (the last one may end
 * without), cut to pieces of at most T inputs by the overlong rule; shuffled by seed when
 * shuffle, then placed first fit (or one a window). */
static keel_packing *pack_stream(const int32_t *v, int64_t n, int32_t eot, int64_t T, bool shuffle, uint64_t seed,
                                 bool pack, keel_overlong overlong) {
    keel_packing *k = calloc(1, sizeof *k);
    if (k) k->overlong = overlong;
    int64_t n_ex = 0;
    for (int64_t i = 0; i < n; i++) n_ex += v[i] == eot || i == n - 1;
    int64_t cap = 0; /* pieces: an example of L inputs gives ceil(L / T) when split, else at most 1 */
    for (int64_t s = 0, i = 0; i < n; i++)
        if (v[i] == eot || i == n - 1) {
            int64_t L = i - s;
            cap += overlong == KEEL_OVERLONG_SPLIT ? (L + T - 1) / T : 1;
            s = i + 1;
        }
    int64_t *ex = malloc((size_t)(n_ex ? n_ex : 1) * sizeof *ex); /* example starts, in stream order */
    int64_t *pstart = malloc((size_t)(cap ? cap : 1) * sizeof *pstart), *pwin = NULL;
    int32_t *plen = malloc((size_t)(cap ? cap : 1) * sizeof *plen);
    if (!k || !ex || !pstart || !plen) goto oom;
    for (int64_t s = 0, j = 0, i = 0; i < n; i++)
        if (v[i] == eot || i == n - 1) ex[j++] = s, s = i + 1;
    if (shuffle) { /* Fisher-Yates: the examples' order is fixed by the seed */
        uint64_t r = seed * 0x9e3779b97f4a7c15ull + 0x7061636bull;
        for (int64_t i = n_ex - 1; i > 0; i--) {
            int64_t j = (int64_t)(keel_splitmix64(&r) % (uint64_t)(i + 1)), t = ex[i];
            ex[i] = ex[j], ex[j] = t;
        }
    }
    int64_t np = 0;
    for (int64_t e = 0; e < n_ex; e++) {
        int64_t s = ex[e], end = s; /* end: the example's last token */
        while (end < n - 1 && v[end] != eot) end++;
        int64_t L = end - s; /* inputs: every token but the last, whose targets are the next ones */
        if (L < 1) continue; /* a lone end-of-text: nothing to learn */
        k->n_examples++;
        if (L > T) {
            k->n_overlong++;
            if (overlong == KEEL_OVERLONG_DROP) {
                k->n_dropped++;
                continue;
            }
            if (overlong == KEEL_OVERLONG_TRUNCATE) L = T;
        }
        for (int64_t o = 0; o < L; o += T) pstart[np] = s + o, plen[np++] = (int32_t)(L - o < T ? L - o : T);
    }
    k->n_pieces = np;
    pwin = malloc((size_t)(np ? np : 1) * sizeof *pwin);
    if (!pwin) goto oom;
    if (pack) {
        fit_tree f = {NULL, 1};
        while (f.leaves < (np ? np : 1)) f.leaves *= 2;
        f.room = malloc((size_t)(2 * f.leaves) * sizeof *f.room);
        if (!f.room) goto oom;
        for (int64_t i = 0; i < 2 * f.leaves; i++) f.room[i] = (int32_t)T;
        for (int64_t i = 0; i < np; i++) {
            pwin[i] = fit_take(&f, plen[i]);
            if (pwin[i] + 1 > k->n_windows) k->n_windows = pwin[i] + 1;
        }
        free(f.room);
    } else {
        for (int64_t i = 0; i < np; i++) pwin[i] = i;
        k->n_windows = np;
    }
    /* the pieces grouped by window, each window's in the order they were placed (a stable count sort) */
    k->first = calloc((size_t)(k->n_windows + 1), sizeof *k->first);
    k->start = malloc((size_t)(np ? np : 1) * sizeof *k->start);
    k->len = malloc((size_t)(np ? np : 1) * sizeof *k->len);
    if (!k->first || !k->start || !k->len) goto oom;
    for (int64_t i = 0; i < np; i++) k->first[pwin[i] + 1]++, k->n_slots += plen[i];
    for (int64_t w = 0; w < k->n_windows; w++) k->first[w + 1] += k->first[w];
    int64_t *next = malloc((size_t)(k->n_windows ? k->n_windows : 1) * sizeof *next);
    if (!next) goto oom;
    memcpy(next, k->first, (size_t)k->n_windows * sizeof *next);
    for (int64_t i = 0; i < np; i++) {
        int64_t at = next[pwin[i]]++;
        k->start[at] = pstart[i], k->len[at] = plen[i];
    }
    free(next), free(ex), free(pstart), free(plen), free(pwin);
    return k;
oom:
    free(ex), free(pstart), free(plen), free(pwin);
    packing_free(k);
    keel_fail("out of memory packing the examples into windows");
    return NULL;
}

int keel_dataset_pack(keel_dataset *d, int64_t T, uint64_t seed, bool pack, keel_overlong overlong) {
    packing_free(d->train_pack), packing_free(d->eval_pack);
    d->train_pack = pack_stream(d->train, d->n_train, d->eot, T, true, seed, pack, overlong);
    d->eval_pack = d->train_pack ? pack_stream(d->eval, d->n_eval, d->eot, T, false, 0, pack, overlong) : NULL;
    if (!d->train_pack || !d->eval_pack) return -1;
    /* what the loss sees now: the targets inside the windows (no target crosses from one example
     * into the next, and cut or dropped tokens are gone) */
    const keel_packing *k = d->train_pack;
    d->n_trained = 0, d->n_targets = k->n_slots;
    for (int64_t i = 0; i < k->n_pieces; i++)
        for (int64_t j = 1; j <= k->len[i]; j++) d->n_trained += d->train_mask ? d->train_mask[k->start[i] + j] : 1;
    if (d->train_pack->n_windows == 0)
        return keel_fail("no training example fits a window of %lld tokens (%lld examples, %lld longer than the "
                         "window and dropped by --overlong drop)",
                         (long long)T, (long long)d->train_pack->n_examples, (long long)d->train_pack->n_dropped);
    return 0;
}

int keel_doc_boundaries(const char *flag, bool jsonl) {
    if (!flag || !strcmp(flag, "auto")) return jsonl ? 1 : 0;
    if (!strcmp(flag, "on")) return 1;
    if (!strcmp(flag, "off")) return 0;
    return keel_fail("--doc-boundaries '%s': expected on, off or auto", flag);
}

int keel_overlong_parse(const char *flag, keel_overlong *out) {
    if (!strcmp(flag, "truncate"))
        *out = KEEL_OVERLONG_TRUNCATE;
    else if (!strcmp(flag, "split"))
        *out = KEEL_OVERLONG_SPLIT;
    else if (!strcmp(flag, "drop"))
        *out = KEEL_OVERLONG_DROP;
    else
        return keel_fail("--overlong '%s': expected truncate, split or drop", flag);
    return 0;
}

void keel_data_report_packing(const keel_dataset *d, int64_t T, bool pack) {
    const keel_packing *k = d->train_pack;
    if (!k) return;
    printf("data: document boundaries on: %lld examples %s %lld windows of %lld (%.1f%% of the positions "
           "hold tokens)",
           (long long)k->n_examples, pack ? "packed into" : "in", (long long)k->n_windows, (long long)T,
           k->n_windows ? 100.0 * (double)k->n_slots / ((double)k->n_windows * (double)T) : 0.0);
    if (k->n_overlong)
        printf("; %lld longer than the window %s", (long long)k->n_overlong,
               k->overlong == KEEL_OVERLONG_DROP    ? "dropped"
               : k->overlong == KEEL_OVERLONG_SPLIT ? "split"
                                                    : "truncated");
    if (d->n_eval) printf("; %lld held-out windows", (long long)keel_dataset_eval_windows(d, T));
    printf("\n");
}

int64_t keel_dataset_windows(const keel_dataset *d, int64_t T) {
    if (d->train_pack) return d->train_pack->n_windows;
    return d->n_train > T ? (d->n_train - 1) / T : 0;
}

int64_t keel_dataset_eval_windows(const keel_dataset *d, int64_t T) {
    if (d->eval_pack) return d->eval_pack->n_windows;
    return d->n_eval > T ? (d->n_eval - 1) / T : 0;
}

/* The window of sample p: a fresh Fisher-Yates permutation of the windows for each epoch. */
static int64_t window_of(int64_t W, uint64_t seed, int64_t p) {
    static _Thread_local int64_t *perm, cached_epoch = -1, cached_W;
    static _Thread_local uint64_t cached_seed;
    int64_t epoch = p / W;
    if (epoch != cached_epoch || W != cached_W || seed != cached_seed) {
        int64_t *np = realloc(perm, (size_t)W * sizeof *np);
        if (!np) return p % W;
        perm = np;
        for (int64_t i = 0; i < W; i++) perm[i] = i;
        uint64_t s = seed * 1000003u + (uint64_t)epoch;
        for (int64_t i = W - 1; i > 0; i--) {
            int64_t j = (int64_t)(keel_splitmix64(&s) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        cached_epoch = epoch, cached_W = W, cached_seed = seed;
    }
    return perm[p % W];
}

/* len ids from start, the next len as targets (KEEL_NO_TARGET where the mask leaves them out),
 * positions from 0 */
static void fill_span(const int32_t *v, const uint8_t *m, int64_t start, int64_t len, int32_t *ids, int32_t *tgt,
                      int32_t *pos) {
    memcpy(ids, v + start, (size_t)len * 4);
    memcpy(tgt, v + start + 1, (size_t)len * 4);
    for (int64_t i = 0; i < len; i++) {
        if (m && !m[start + 1 + i]) tgt[i] = KEEL_NO_TARGET;
        if (pos) pos[i] = (int32_t)i;
    }
}

/* Window w of a stream, and its count of targets the loss counts. */
static int64_t fill_window(const keel_dataset *d, bool eval, int64_t w, int64_t T, int32_t *ids, int32_t *tgt,
                           int32_t *pos) {
    const int32_t *v = eval ? d->eval : d->train;
    const uint8_t *m = eval ? d->eval_mask : d->train_mask;
    const keel_packing *k = eval ? d->eval_pack : d->train_pack;
    int64_t o = 0;
    if (!k) {
        fill_span(v, m, w * T, T, ids, tgt, pos);
        o = T;
    } else {
        for (int64_t i = k->first[w]; i < k->first[w + 1]; i++) {
            fill_span(v, m, k->start[i], k->len[i], ids + o, tgt + o, pos ? pos + o : NULL);
            o += k->len[i];
        }
        for (int64_t i = o; i < T; i++) { /* padding: an example of its own that nothing reads */
            ids[i] = d->eot, tgt[i] = KEEL_NO_TARGET;
            if (pos) pos[i] = (int32_t)(i - o);
        }
    }
    int64_t n = 0;
    for (int64_t i = 0; i < T; i++) n += tgt[i] >= 0;
    return n;
}

int64_t keel_dataset_batch(const keel_dataset *d, int64_t T, int64_t B, uint64_t seed, int64_t p, int32_t *ids,
                           int32_t *tgt, int32_t *pos) {
    int64_t W = keel_dataset_windows(d, T), n = 0;
    for (int64_t b = 0; b < B; b++)
        n += fill_window(d, false, window_of(W, seed, p + b), T, ids + b * T, tgt + b * T, pos ? pos + b * T : NULL);
    return n;
}

int64_t keel_dataset_window(const keel_dataset *d, bool eval, int64_t w, int64_t T, int32_t *ids, int32_t *tgt,
                            int32_t *pos) {
    return fill_window(d, eval, w, T, ids, tgt, pos);
}

int keel_chat_setup(const char *template_path, const char *tokenizer_json, keel_chat_template **out,
                    keel_data_opts *o) {
    *out = NULL;
    char cfg_path[4200];
    const char *slash = tokenizer_json ? strrchr(tokenizer_json, '/') : NULL;
    snprintf(cfg_path, sizeof cfg_path, "%.*s/tokenizer_config.json", slash ? (int)(slash - tokenizer_json) : 1,
             slash ? tokenizer_json : ".");
    struct stat st;
    bool have = tokenizer_json && stat(cfg_path, &st) == 0; /* no tokenizer: no config to read */
    cJSON *cfg = have ? keel_read_json(cfg_path) : NULL;
    if (have && !cfg) return -1;
    if (template_path) {
        char *src = keel_read_file(template_path, NULL);
        *out = src ? keel_chat_template_compile(src, template_path) : NULL;
        free(src);
        if (!*out) {
            cJSON_Delete(cfg);
            return -1;
        }
    } else if (cJSON_GetObjectItemCaseSensitive(cfg, "chat_template")) {
        if (!(*out = keel_chat_template_from_config(cfg_path))) {
            cJSON_Delete(cfg);
            return -1;
        }
    }
    /* the special tokens the template may print: strings, or {"content": ...}; kept in the template */
    const char *names[2] = {"bos_token", "eos_token"};
    const char **dst[2] = {&o->bos_token, &o->eos_token};
    for (int i = 0; i < 2 && *out; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, names[i]);
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        *dst[i] = cJSON_IsString(v) ? keel_chat_template_keep(*out, v->valuestring) : NULL;
    }
    cJSON_Delete(cfg);
    o->chat = *out;
    o->chat_id = *out ? keel_chat_template_source(*out) : NULL;
    return 0;
}
