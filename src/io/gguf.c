#include "io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensor/tensor.h"
#include "util/error.h"

/* GGUF value types (the file format's numbering). */
enum { GT_U32 = 4, GT_I32 = 5, GT_F32 = 6, GT_BOOL = 7, GT_STRING = 8, GT_ARRAY = 9 };

typedef struct {
    char *name;
    keel_ggml_type type;
    int n_dims;
    int64_t ne[4];
    size_t nbytes;
} tensor_desc;

struct keel_gguf {
    unsigned char *kv; /* the metadata, already serialized */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    tensor_desc *t;
    int n_t, cap_t;
};

keel_gguf *keel_gguf_new(void) { return calloc(1, sizeof(keel_gguf)); }

void keel_gguf_free(keel_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_t; i++) free(g->t[i].name);
    free(g->t);
    free(g->kv);
    free(g);
}

static int put(keel_gguf *g, const void *p, size_t n) {
    if (g->kv_len + n > g->kv_cap) {
        size_t cap = g->kv_cap ? g->kv_cap : 4096;
        while (cap < g->kv_len + n) cap *= 2;
        unsigned char *kv = realloc(g->kv, cap);
        if (!kv) return keel_fail("gguf: out of memory for the metadata (%zu bytes)", cap);
        g->kv = kv, g->kv_cap = cap;
    }
    memcpy(g->kv + g->kv_len, p, n);
    g->kv_len += n;
    return 0;
}
static int put_u32(keel_gguf *g, uint32_t v) { return put(g, &v, 4); }
static int put_u64(keel_gguf *g, uint64_t v) { return put(g, &v, 8); }
static int put_string(keel_gguf *g, const char *s, size_t n) { return put_u64(g, n) || put(g, s, n); }
static int put_key(keel_gguf *g, const char *key, uint32_t type) {
    g->n_kv++;
    return put_string(g, key, strlen(key)) || put_u32(g, type);
}

int keel_gguf_u32(keel_gguf *g, const char *key, uint32_t v) {
    return put_key(g, key, GT_U32) || put_u32(g, v) ? -1 : 0;
}
int keel_gguf_f32(keel_gguf *g, const char *key, float v) { return put_key(g, key, GT_F32) || put(g, &v, 4) ? -1 : 0; }
int keel_gguf_bool(keel_gguf *g, const char *key, bool v) {
    uint8_t b = v;
    return put_key(g, key, GT_BOOL) || put(g, &b, 1) ? -1 : 0;
}
int keel_gguf_str(keel_gguf *g, const char *key, const char *v) {
    return put_key(g, key, GT_STRING) || put_string(g, v, strlen(v)) ? -1 : 0;
}
static int put_array_head(keel_gguf *g, const char *key, uint32_t elem, size_t n) {
    return put_key(g, key, GT_ARRAY) || put_u32(g, elem) || put_u64(g, n) ? -1 : 0;
}
int keel_gguf_arr_i32(keel_gguf *g, const char *key, const int32_t *v, size_t n) {
    return put_array_head(g, key, GT_I32, n) || put(g, v, n * 4) ? -1 : 0;
}
int keel_gguf_arr_bool(keel_gguf *g, const char *key, const bool *v, size_t n) {
    if (put_array_head(g, key, GT_BOOL, n)) return -1;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = v[i];
        if (put(g, &b, 1)) return -1;
    }
    return 0;
}
int keel_gguf_arr_str(keel_gguf *g, const char *key, const char *const *v, const size_t *len, size_t n) {
    if (put_array_head(g, key, GT_STRING, n)) return -1;
    for (size_t i = 0; i < n; i++)
        if (put_string(g, v[i], len[i])) return -1;
    return 0;
}

size_t keel_ggml_nbytes(keel_ggml_type type, int64_t ne0, int64_t n) {
    switch (type) {
    case KEEL_GGML_F32:
        return (size_t)n * 4;
    case KEEL_GGML_F16:
    case KEEL_GGML_BF16:
        return (size_t)n * 2;
    case KEEL_GGML_Q8_0:
        return ne0 % KEEL_Q8_0_BLOCK ? 0 : (size_t)(n / KEEL_Q8_0_BLOCK) * (2 + KEEL_Q8_0_BLOCK);
    }
    return 0;
}

const char *keel_ggml_type_name(keel_ggml_type type) {
    switch (type) {
    case KEEL_GGML_F32:
        return "f32";
    case KEEL_GGML_F16:
        return "f16";
    case KEEL_GGML_BF16:
        return "bf16";
    case KEEL_GGML_Q8_0:
        return "q8_0";
    }
    return "?";
}

int keel_gguf_tensor(keel_gguf *g, const char *name, keel_ggml_type type, int n_dims, const int64_t *ne) {
    if (n_dims < 1 || n_dims > 4) return keel_fail("gguf: tensor '%s' has %d dimensions (1 to 4)", name, n_dims);
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= ne[d];
    size_t nbytes = keel_ggml_nbytes(type, ne[0], n);
    if (!nbytes)
        return keel_fail("gguf: tensor '%s': rows of %lld cannot be stored as %s", name, (long long)ne[0],
                         keel_ggml_type_name(type));
    if (g->n_t == g->cap_t) {
        int cap = g->cap_t ? 2 * g->cap_t : 64;
        tensor_desc *t = realloc(g->t, (size_t)cap * sizeof *t);
        if (!t) return keel_fail("gguf: out of memory");
        g->t = t, g->cap_t = cap;
    }
    tensor_desc *d = &g->t[g->n_t];
    memset(d, 0, sizeof *d);
    d->name = strdup(name);
    if (!d->name) return keel_fail("gguf: out of memory");
    d->type = type, d->n_dims = n_dims, d->nbytes = nbytes;
    for (int i = 0; i < n_dims; i++) d->ne[i] = ne[i];
    g->n_t++;
    return 0;
}

int keel_gguf_n_tensors(const keel_gguf *g) { return g->n_t; }

void keel_ggml_encode(keel_ggml_type type, const float *x, int64_t n, void *out) {
    if (type == KEEL_GGML_F32) {
        memcpy(out, x, (size_t)n * 4);
    } else if (type == KEEL_GGML_F16 || type == KEEL_GGML_BF16) {
        uint16_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = type == KEEL_GGML_F16 ? keel_f32_to_f16(x[i]) : keel_f32_to_bf16(x[i]);
    } else { /* q8_0 */
        unsigned char *o = out;
        for (int64_t b = 0; b < n / KEEL_Q8_0_BLOCK; b++, x += KEEL_Q8_0_BLOCK, o += 2 + KEEL_Q8_0_BLOCK) {
            float amax = 0;
            for (int i = 0; i < KEEL_Q8_0_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
            float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
            uint16_t dh = keel_f32_to_f16(d);
            memcpy(o, &dh, 2);
            for (int i = 0; i < KEEL_Q8_0_BLOCK; i++) o[2 + i] = (unsigned char)(int8_t)roundf(x[i] * id);
        }
    }
}

static size_t pad_to(size_t n) { return (n + KEEL_GGUF_ALIGNMENT - 1) / KEEL_GGUF_ALIGNMENT * KEEL_GGUF_ALIGNMENT; }

int keel_gguf_write(const keel_gguf *g, const char *path, keel_gguf_fill fill, void *ud,
                    void (*progress)(void *ud, int done, int total)) {
    /* the head: magic, version, counts, metadata, tensor descriptions with their data offsets */
    keel_gguf head = {0};
    size_t offset = 0, max_bytes = 0;
    int rc = put(&head, "GGUF", 4) || put_u32(&head, 3) || put_u64(&head, (uint64_t)g->n_t) ||
             put_u64(&head, g->n_kv) || put(&head, g->kv, g->kv_len);
    for (int i = 0; i < g->n_t && !rc; i++) {
        const tensor_desc *t = &g->t[i];
        rc = put_string(&head, t->name, strlen(t->name)) || put_u32(&head, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims && !rc; d++) rc = put_u64(&head, (uint64_t)t->ne[d]);
        rc = rc || put_u32(&head, (uint32_t)t->type) || put_u64(&head, offset);
        offset += pad_to(t->nbytes);
        if (t->nbytes > max_bytes) max_bytes = t->nbytes;
    }
    static const unsigned char zeros[KEEL_GGUF_ALIGNMENT];
    rc = rc || put(&head, zeros, pad_to(head.kv_len) - head.kv_len);
    unsigned char *buf = rc ? NULL : malloc(max_bytes ? max_bytes : 1);
    if (rc || !buf) {
        free(head.kv);
        free(buf);
        return rc ? -1 : keel_fail("%s: out of memory for a tensor of %zu bytes", path, max_bytes);
    }
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp) {
        free(head.kv), free(buf);
        return keel_fail("%s: path too long", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(head.kv), free(buf);
        return keel_fail("%s: cannot create: %s", tmp, strerror(errno));
    }
    bool ok = fwrite(head.kv, 1, head.kv_len, f) == head.kv_len;
    for (int i = 0; i < g->n_t && ok; i++) {
        const tensor_desc *t = &g->t[i];
        if (fill(ud, i, buf, t->nbytes)) {
            fclose(f), unlink(tmp), free(head.kv), free(buf);
            return -1;
        }
        ok = fwrite(buf, 1, t->nbytes, f) == t->nbytes &&
             fwrite(zeros, 1, pad_to(t->nbytes) - t->nbytes, f) == pad_to(t->nbytes) - t->nbytes;
        if (progress) progress(ud, i + 1, g->n_t);
    }
    int err = errno;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    err = ok ? 0 : errno ? errno : err;
    ok = fclose(f) == 0 && ok;
    free(head.kv), free(buf);
    if (!ok || rename(tmp, path) != 0) {
        if (ok) err = errno;
        unlink(tmp);
        return keel_fail("%s: cannot write: %s", path, strerror(err ? err : EIO));
    }
    /* the rename itself survives a crash once the folder holding it is synced */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    int dfd = open(slash ? (dir[0] ? dir : "/") : ".", O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) fsync(dfd), close(dfd);
    return 0;
}
