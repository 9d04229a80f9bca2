#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

#define MAX_HEADER (100u << 20) /* the format's own limit is 100 MB */

static const struct {
    const char *name;
    int type;
    size_t size;
} DTYPES[] = {
    {"F32", KEEL_F32, 4}, {"F16", KEEL_F16, 2}, {"BF16", KEEL_BF16, 2}, {"F64", KEEL_F64, 8}, {"I32", KEEL_I32, 4},
    {"I64", -1, 8},       {"I16", -1, 2},       {"I8", -1, 1},          {"U8", -1, 1},        {"BOOL", -1, 1},
};

static int dtype_index(const char *s) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (strcmp(s, DTYPES[i].name) == 0) return (int)i;
    return -1;
}

static int cmp_offset(const void *a, const void *b) {
    const keel_st_tensor *x = *(keel_st_tensor *const *)a, *y = *(keel_st_tensor *const *)b;
    const char *px = x->data, *py = y->data;
    return (px > py) - (px < py);
}

void keel_st_release(keel_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->t[i].name);
    free(f->t);
    f->t = NULL;
    f->n = 0;
}

int keel_st_parse(const void *buf, size_t size, const char *label, keel_st_file *out) {
    memset(out, 0, sizeof *out);
    const unsigned char *b = buf;
    if (size < 8)
        return keel_fail("%s: %zu bytes is too short for a safetensors file (8-byte header length missing)", label,
                         size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    if (hl > size - 8)
        return keel_fail("%s: header length %llu runs past the end of the file (%zu bytes)", label,
                         (unsigned long long)hl, size);
    if (hl > MAX_HEADER)
        return keel_fail("%s: header length %llu exceeds the 100 MB limit", label, (unsigned long long)hl);
    if (hl < 2)
        return keel_fail("%s: header length %llu is too short for a JSON object", label, (unsigned long long)hl);
    char *json = malloc(hl + 1);
    if (!json) return keel_fail("%s: out of memory for a %llu-byte header", label, (unsigned long long)hl);
    memcpy(json, b + 8, hl);
    json[hl] = 0;
    if (strlen(json) != hl) {
        free(json);
        return keel_fail("%s: header contains a NUL byte", label);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 0);
    if (!root || !cJSON_IsObject(root)) {
        long at = end ? (long)(end - json) : -1;
        cJSON_Delete(root);
        free(json);
        return keel_fail("%s: header is not a JSON object (error near byte %ld of the header)", label, at);
    }
    const unsigned char *data = b + 8 + hl;
    size_t data_size = size - 8 - hl;
    int n = 0;
    for (cJSON *it = root->child; it; it = it->next) n += strcmp(it->string, "__metadata__") != 0;
    out->t = calloc((size_t)(n ? n : 1), sizeof *out->t);
    int rc = 0;
    if (!out->t) rc = keel_fail("%s: out of memory", label);
    for (cJSON *it = root->child; it && !rc; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        keel_st_tensor *t = &out->t[out->n];
        const char *nm = it->string;
        t->name = strdup(nm);
        out->n++;
        if (!t->name) {
            rc = keel_fail("%s: out of memory for tensor names", label);
            break;
        }
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(it, "shape"),
              *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of)) {
            rc = keel_fail("%s: tensor '%s': entry needs \"dtype\" (string), \"shape\" and \"data_offsets\" (arrays)",
                           label, nm);
            break;
        }
        int di = dtype_index(dt->valuestring);
        if (di < 0) {
            rc = keel_fail("%s: tensor '%s': unknown dtype '%s'", label, nm, dt->valuestring);
            break;
        }
        snprintf(t->dtype, sizeof t->dtype, "%s", DTYPES[di].name);
        t->type = DTYPES[di].type;
        t->n_dims = cJSON_GetArraySize(sh);
        if (t->n_dims > KEEL_ST_MAX_DIMS) {
            rc = keel_fail("%s: tensor '%s': %d dimensions (at most %d)", label, nm, t->n_dims, KEEL_ST_MAX_DIMS);
            break;
        }
        double numel = 1;
        int d = 0;
        for (cJSON *s = sh->child; s; s = s->next, d++) {
            if (!cJSON_IsNumber(s) || !(s->valuedouble >= 0 && s->valuedouble <= 9e15) ||
                s->valuedouble != (double)(int64_t)s->valuedouble) {
                rc = keel_fail("%s: tensor '%s': shape entry %d is not a non-negative integer", label, nm, d);
                break;
            }
            t->shape[d] = (int64_t)s->valuedouble;
            numel *= s->valuedouble;
        }
        if (rc) break;
        if (cJSON_GetArraySize(of) != 2 || !cJSON_IsNumber(of->child) || !cJSON_IsNumber(of->child->next) ||
            !(of->child->valuedouble >= 0 && of->child->next->valuedouble >= 0)) {
            rc = keel_fail("%s: tensor '%s': data_offsets must be two non-negative integers", label, nm);
            break;
        }
        double b0 = of->child->valuedouble, b1 = of->child->next->valuedouble;
        if (b1 < b0) {
            rc = keel_fail("%s: tensor '%s': data_offsets [%.0f, %.0f] end before they begin", label, nm, b0, b1);
            break;
        }
        if (b1 > (double)data_size) {
            rc = keel_fail("%s: tensor '%s': data_offsets [%.0f, %.0f] out of range: the data section has %zu bytes",
                           label, nm, b0, b1, data_size);
            break;
        }
        double want = numel * (double)DTYPES[di].size;
        if (want != b1 - b0) {
            rc = keel_fail("%s: tensor '%s': shape and dtype %s need %.0f bytes, data_offsets give %.0f", label, nm,
                           t->dtype, want, b1 - b0);
            break;
        }
        t->data = data + (size_t)b0;
        t->nbytes = (size_t)(b1 - b0);
    }
    if (!rc && out->n > 1) { /* no two tensors may share bytes */
        keel_st_tensor **by = malloc((size_t)out->n * sizeof *by);
        if (!by) rc = keel_fail("%s: out of memory checking %d tensors' offsets", label, out->n);
        for (int i = 0; by && i < out->n; i++) by[i] = &out->t[i];
        if (by) qsort(by, (size_t)out->n, sizeof *by, cmp_offset);
        for (int i = 1; i < out->n && !rc; i++) {
            const char *prev_end = (const char *)by[i - 1]->data + by[i - 1]->nbytes;
            if (by[i - 1]->nbytes && by[i]->nbytes && (const char *)by[i]->data < prev_end)
                rc = keel_fail("%s: tensors '%s' and '%s' overlap in the data section", label, by[i - 1]->name,
                               by[i]->name);
        }
        free(by);
    }
    cJSON_Delete(root);
    free(json);
    if (rc) keel_st_release(out);
    return rc;
}

keel_st_file *keel_st_open(const char *path) {
    int fd = keel_open_regular(path);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        keel_fail("%s: cannot stat: %s", path, strerror(errno));
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (size && map == MAP_FAILED) {
        keel_fail("%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    keel_st_file *f = calloc(1, sizeof *f);
    if (!f || keel_st_parse(map, size, path, f)) {
        if (map) munmap(map, size);
        free(f);
        return NULL;
    }
    f->map = map;
    f->size = size;
    if (!(f->path = strdup(path))) {
        keel_st_close(f);
        keel_fail("%s: out of memory", path);
        return NULL;
    }
    return f;
}

void keel_st_close(keel_st_file *f) {
    if (!f) return;
    keel_st_release(f);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    free(f);
}

const keel_st_tensor *keel_st_find(const keel_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

int64_t keel_st_numel(const keel_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

double keel_st_get(const keel_st_tensor *t, int64_t i) {
    const unsigned char *p = t->data;
    if (!strcmp(t->dtype, "I64")) {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (double)v;
    }
    if (t->type < 0) return 0;
    return keel_load_value((keel_type)t->type, p + (size_t)i * keel_type_size((keel_type)t->type));
}

static const char *st_dtype(keel_type t) {
    switch (t) {
    case KEEL_F32:
        return "F32";
    case KEEL_F16:
        return "F16";
    case KEEL_BF16:
        return "BF16";
    case KEEL_F64:
        return "F64";
    case KEEL_I32:
        return "I32";
    default:
        return NULL;
    }
}

int keel_st_write(const char *path, const keel_st_entry *e, int n) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *dt = e[i].raw ? e[i].raw_dtype : st_dtype(e[i].type);
        int di = dt ? dtype_index(dt) : -1;
        if (di < 0) {
            cJSON_Delete(root);
            return keel_fail("%s: tensor '%s': cannot store type %s", path, e[i].name, dt ? dt : "?");
        }
        int64_t numel = 1;
        cJSON *o = cJSON_AddObjectToObject(root, e[i].name), *sh = cJSON_AddArrayToObject(o, "shape"), *of;
        cJSON_AddStringToObject(o, "dtype", dt);
        for (int d = 0; d < e[i].n_dims; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[i].shape[d])), numel *= e[i].shape[d];
        size_t bytes = (size_t)numel * DTYPES[di].size;
        of = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!hdr) return keel_fail("%s: out of memory for the header", path);
    size_t hl = strlen(hdr), pad = (8 - (8 + hl) % 8) % 8; /* data starts 8-aligned */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(hdr);
        return keel_fail("%s: cannot create: %s", tmp, strerror(errno));
    }
    uint64_t len = hl + pad;
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(len >> (8 * i));
    bool ok = fwrite(lb, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = 0; i < pad && ok; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    unsigned char buf[1 << 16];
    for (int i = 0; i < n && ok; i++) {
        int64_t numel = 1;
        for (int d = 0; d < e[i].n_dims; d++) numel *= e[i].shape[d];
        if (e[i].raw) {
            size_t bytes = (size_t)numel * DTYPES[dtype_index(e[i].raw_dtype)].size;
            ok = bytes == 0 || fwrite(e[i].raw, 1, bytes, f) == bytes;
            continue;
        }
        size_t es = keel_type_size(e[i].type), k = 0;
        for (int64_t j = 0; j < numel && ok; j++) {
            keel_store_value(e[i].type, buf + k, e[i].values[j]);
            k += es;
            if (k + 8 > sizeof buf || j + 1 == numel) {
                ok = fwrite(buf, 1, k, f) == k;
                k = 0;
            }
        }
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        if (ok) err = errno;
        unlink(tmp);
        return keel_fail("%s: write failed: %s (nothing was replaced)", path, strerror(err));
    }
    return 0;
}
