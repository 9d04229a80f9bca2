#define _DEFAULT_SOURCE /* syscall */
#include "io/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/faults.h"
#include "util/file.h"

#ifndef RENAME_EXCHANGE /* linux/fs.h: exchange the two names atomically */
#define RENAME_EXCHANGE (1 << 1)
#endif

/* The integer fields of config.json, read and written from this one list. */
static const struct {
    const char *key;
    size_t off;
} INT_FIELDS[] = {
    {"vocab_size", offsetof(keel_qwen35_config, vocab)},
    {"hidden_size", offsetof(keel_qwen35_config, hidden)},
    {"num_hidden_layers", offsetof(keel_qwen35_config, layers)},
    {"intermediate_size", offsetof(keel_qwen35_config, ffn)},
    {"num_attention_heads", offsetof(keel_qwen35_config, heads)},
    {"num_key_value_heads", offsetof(keel_qwen35_config, kv_heads)},
    {"head_dim", offsetof(keel_qwen35_config, head_dim)},
    {"linear_num_key_heads", offsetof(keel_qwen35_config, lk_heads)},
    {"linear_num_value_heads", offsetof(keel_qwen35_config, lv_heads)},
    {"linear_key_head_dim", offsetof(keel_qwen35_config, lk_dim)},
    {"linear_value_head_dim", offsetof(keel_qwen35_config, lv_dim)},
    {"linear_conv_kernel_dim", offsetof(keel_qwen35_config, conv_kernel)},
};
#define N_INT_FIELDS (sizeof INT_FIELDS / sizeof INT_FIELDS[0])

static int get_int(const char *path, const cJSON *o, const char *key, int64_t *out, bool required) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return required ? keel_fail("%s: field \"%s\" is missing", path, key) : 1;
    if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= 9e15) || v->valuedouble != (double)(int64_t)v->valuedouble)
        return keel_fail("%s: field \"%s\" must be an integer", path, key);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int get_num(const char *path, const cJSON *o, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v)) return keel_fail("%s: field \"%s\" must be a number", path, key);
    *out = v->valuedouble;
    return 0;
}

int keel_hf_config_read(const char *dir, keel_qwen35_config *cfg, bool *multimodal) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return keel_hf_config_read_file(path, cfg, multimodal);
}

int keel_hf_config_read_file(const char *path, keel_qwen35_config *cfg, bool *multimodal) {
    cJSON *root = keel_read_json(path);
    if (!root) return -1;
    memset(cfg, 0, sizeof *cfg);
    int rc = 0;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    *multimodal = cJSON_IsObject(tc);
    const cJSON *c = *multimodal ? tc : root;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c, "model_type");
    if (cJSON_IsString(mt) && strstr(mt->valuestring, "moe"))
        rc = keel_fail("%s: model_type \"%s\": mixture-of-experts models are not supported", path, mt->valuestring);
    int64_t experts = 0;
    if (!rc && get_int(path, c, "num_experts", &experts, false) == 0 && experts > 0)
        rc = keel_fail("%s: field \"num_experts\" = %lld: mixture-of-experts models are not supported", path,
                       (long long)experts);
    for (size_t i = 0; i < N_INT_FIELDS && !rc; i++)
        if (get_int(path, c, INT_FIELDS[i].key, (int64_t *)((char *)cfg + INT_FIELDS[i].off), true)) rc = -1;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "rope_parameters");
    cfg->rope_theta = 10000.0, cfg->partial_rotary = 1.0, cfg->rms_eps = 1e-6;
    if (!rc && (get_num(path, c, "rope_theta", &cfg->rope_theta) < 0 ||
                get_num(path, c, "partial_rotary_factor", &cfg->partial_rotary) < 0 ||
                get_num(path, c, "rms_norm_eps", &cfg->rms_eps) < 0))
        rc = -1;
    if (!rc && cJSON_IsObject(rp)) {
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (cJSON_IsString(rt) && strcmp(rt->valuestring, "default") != 0)
            rc = keel_fail("%s: rope_parameters.rope_type \"%s\" is not supported (only \"default\")", path,
                           rt->valuestring);
        if (!rc && (get_num(path, rp, "rope_theta", &cfg->rope_theta) < 0 ||
                    get_num(path, rp, "partial_rotary_factor", &cfg->partial_rotary) < 0))
            rc = -1;
    }
    /* tie_word_embeddings: the text config's, else the top level's (the multimodal release keeps it there) */
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings");
    if (!tie) tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    cfg->tied = tie ? cJSON_IsTrue(tie) : false;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c, "layer_types");
    if (!rc && cfg->layers > KEEL_QWEN35_MAX_LAYERS)
        rc = keel_fail("%s: num_hidden_layers %lld exceeds %d", path, (long long)cfg->layers, KEEL_QWEN35_MAX_LAYERS);
    if (!rc && cJSON_IsArray(lt)) {
        if (cJSON_GetArraySize(lt) != cfg->layers)
            rc = keel_fail("%s: layer_types has %d entries, num_hidden_layers is %lld", path, cJSON_GetArraySize(lt),
                           (long long)cfg->layers);
        int i = 0;
        for (const cJSON *e = lt->child; e && !rc; e = e->next, i++) {
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention"))
                cfg->full_attention[i] = 1;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "linear_attention"))
                cfg->full_attention[i] = 0;
            else
                rc = keel_fail("%s: layer_types[%d] is \"%s\" (expected \"linear_attention\" or \"full_attention\")",
                               path, i, cJSON_IsString(e) ? e->valuestring : "?");
        }
    } else if (!rc) { /* the family's default: every 4th layer is full attention */
        int64_t every = 4;
        get_int(path, c, "full_attention_interval", &every, false);
        for (int64_t i = 0; i < cfg->layers; i++) cfg->full_attention[i] = every > 0 && (i + 1) % every == 0;
    }
    cJSON_Delete(root);
    if (!rc && keel_qwen35_config_check(cfg)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", keel_last_error());
        rc = keel_fail("%s: %s", path, msg);
    }
    return rc;
}

keel_checkpoint *keel_checkpoint_open(const char *dir) {
    keel_checkpoint *c = calloc(1, sizeof *c);
    if (!c) {
        keel_fail("out of memory");
        return NULL;
    }
    c->dir = strdup(dir);
    if (!c->dir) keel_fail("%s: out of memory", dir);
    if (!c->dir || keel_hf_config_read(dir, &c->cfg, &c->multimodal)) {
        keel_checkpoint_close(c);
        return NULL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        cJSON *idx = keel_read_json(path);
        const cJSON *wm = idx ? cJSON_GetObjectItemCaseSensitive(idx, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) {
            if (idx) keel_fail("%s: no \"weight_map\" object", path);
            cJSON_Delete(idx);
            keel_checkpoint_close(c);
            return NULL;
        }
        int n = cJSON_GetArraySize(wm), nf = 0;
        char **names = calloc((size_t)n, sizeof *names);
        if (!names) {
            keel_fail("%s: out of memory for %d weight_map entries", path, n);
            cJSON_Delete(idx);
            keel_checkpoint_close(c);
            return NULL;
        }
        for (const cJSON *e = wm->child; e; e = e->next) { /* the distinct shard files, in first-seen order */
            if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
                !strcmp(e->valuestring, "..")) {
                /* a shard is a file of this folder: no paths, no other folders */
                keel_fail("%s: weight_map[\"%s\"] is %s%s%s; expected the name of a file in %s", path, e->string,
                          cJSON_IsString(e) ? "\"" : "not a file name", cJSON_IsString(e) ? e->valuestring : "",
                          cJSON_IsString(e) ? "\", a path outside the checkpoint folder" : "", dir);
                free(names);
                cJSON_Delete(idx);
                keel_checkpoint_close(c);
                return NULL;
            }
            int k = 0;
            while (k < nf && strcmp(names[k], e->valuestring)) k++;
            if (k == nf) names[nf++] = e->valuestring;
        }
        c->files = calloc((size_t)(nf ? nf : 1), sizeof *c->files);
        for (int i = 0; i < nf; i++) {
            char sp[4096];
            snprintf(sp, sizeof sp, "%s/%s", dir, names[i]);
            c->files[c->n_files] = keel_st_open(sp);
            if (!c->files[c->n_files]) {
                free(names);
                cJSON_Delete(idx);
                keel_checkpoint_close(c);
                return NULL;
            }
            c->n_files++;
        }
        /* every entry of the map must be in the shard it names */
        for (const cJSON *e = wm->child; e; e = e->next) {
            int k = 0;
            while (k < nf && strcmp(names[k], e->valuestring)) k++;
            if (k < nf && !keel_st_find(c->files[k], e->string)) {
                keel_fail("%s: tensor '%s' is listed in %s but missing from it", path, e->string, names[k]);
                free(names);
                cJSON_Delete(idx);
                keel_checkpoint_close(c);
                return NULL;
            }
        }
        free(names);
        cJSON_Delete(idx);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        c->files = calloc(1, sizeof *c->files);
        c->files[0] = keel_st_open(path);
        if (!c->files[0]) {
            keel_checkpoint_close(c);
            return NULL;
        }
        c->n_files = 1;
    }
    const keel_st_tensor *e = keel_checkpoint_find(c, "model.embed_tokens.weight");
    if (e) snprintf(c->dtype, sizeof c->dtype, "%s", e->dtype);
    return c;
}

void keel_checkpoint_close(keel_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->n_files; i++) keel_st_close(c->files[i]);
    free(c->files);
    free(c->dir);
    free(c);
}

/* "model.language_model.X" <-> "model.X" */
static const char *text_name(const char *stored, char *buf, size_t n) {
    if (strncmp(stored, "model.language_model.", 21) == 0) {
        snprintf(buf, n, "model.%s", stored + 21);
        return buf;
    }
    return stored;
}

static bool ignored(const char *stored) {
    return strncmp(stored, "model.visual.", 13) == 0 || strncmp(stored, "mtp.", 4) == 0 ||
           strncmp(stored, "visual.", 7) == 0;
}

const keel_st_tensor *keel_checkpoint_find(const keel_checkpoint *c, const char *name) {
    char buf[512];
    for (int f = 0; f < c->n_files; f++)
        for (int i = 0; i < c->files[f]->n; i++) {
            const char *stored = c->files[f]->t[i].name;
            if (!ignored(stored) && strcmp(text_name(stored, buf, sizeof buf), name) == 0) return &c->files[f]->t[i];
        }
    return NULL;
}

int keel_checkpoint_validate(const keel_checkpoint *c, const keel_qwen35 *m) {
    char buf[512];
    /* unexpected text tensors */
    for (int f = 0; f < c->n_files; f++)
        for (int i = 0; i < c->files[f]->n; i++) {
            const char *stored = c->files[f]->t[i].name;
            if (ignored(stored)) continue;
            const char *nm = text_name(stored, buf, sizeof buf);
            bool known = false;
            for (int p = 0; p < m->n_params && !known; p++) known = strcmp(m->params[p]->name, nm) == 0;
            if (!known && m->cfg.tied && strcmp(nm, "lm_head.weight") == 0)
                known = true; /* a tied head may be stored */
            if (!known)
                return keel_fail("%s: unexpected tensor '%s' (not part of this config's model)", c->files[f]->path,
                                 stored);
        }
    for (int p = 0; p < m->n_params; p++) {
        keel_tensor *t = m->params[p];
        const keel_st_tensor *s = keel_checkpoint_find(c, t->name);
        if (!s) return keel_fail("%s: tensor '%s' is missing", c->dir, t->name);
        /* the stored shape reversed must be t's shape, ignoring unit dims (conv1d: [C,1,K] vs [K,C]) */
        int64_t want[4], got[KEEL_ST_MAX_DIMS];
        int nw = 0, ng = 0;
        for (int d = 0; d < 4; d++)
            if (t->ne[d] != 1) want[nw++] = t->ne[d];
        for (int d = s->n_dims - 1; d >= 0; d--)
            if (s->shape[d] != 1) got[ng++] = s->shape[d];
        bool same = nw == ng;
        for (int d = 0; d < nw && same; d++) same = want[d] == got[d];
        if (!same) {
            char sh[128] = "", ex[64];
            for (int d = 0; d < s->n_dims; d++)
                snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", d ? "," : "", (long long)s->shape[d]);
            snprintf(ex, sizeof ex, "%lld,%lld", (long long)t->ne[1], (long long)t->ne[0]);
            return keel_fail("%s: tensor '%s' has shape [%s], the config needs [%s]", c->dir, s->name, sh,
                             t->ne[1] > 1 ? ex : ex + strcspn(ex, ",") + 1);
        }
        if (s->type < 0)
            return keel_fail("%s: tensor '%s' has dtype %s; keel reads F32, F16, BF16, F64", c->dir, s->name, s->dtype);
    }
    return 0;
}

int keel_checkpoint_check_finite(const keel_checkpoint *c, const keel_qwen35 *m) {
    for (int p = 0; p < m->n_params; p++) {
        const keel_st_tensor *s = keel_checkpoint_find(c, m->params[p]->name);
        int64_t n = s ? keel_st_numel(s) : 0, bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(keel_st_get(s, i)) && bad++ == 0) first = i;
        if (bad)
            return keel_fail("%s: tensor '%s' holds %lld non-finite values of %lld (the first at element %lld: %g)",
                             c->dir, s->name, (long long)bad, (long long)n, (long long)first, keel_st_get(s, first));
    }
    return 0;
}

int keel_checkpoint_load(const keel_checkpoint *c, const keel_qwen35 *m, keel_backend *be) {
    if (keel_checkpoint_validate(c, m)) return -1;
    for (int p = 0; p < m->n_params; p++) {
        keel_tensor *t = m->params[p];
        const keel_st_tensor *s = keel_checkpoint_find(c, t->name);
        int64_t n = keel_nelements(t);
        if (s->type == (int)t->type && keel_is_contiguous(t)) {
            if (be->write(be, t->data, s->data, s->nbytes)) return -1;
            continue;
        }
        /* convert on the host into the parameter's own type, then one raw transfer */
        size_t es = keel_type_size(t->type);
        unsigned char *v = keel_is_contiguous(t) ? malloc((size_t)n * es) : NULL;
        if (!v) return keel_fail("out of memory loading '%s'", t->name);
        if (!keel_type_is_float(t->type)) {
            free(v);
            return keel_fail("'%s': cannot load into %s", t->name, keel_type_name(t->type));
        }
        for (int64_t i = 0; i < n; i++) keel_store_value(t->type, v + (size_t)i * es, keel_st_get(s, i));
        int rc = be->write(be, t->data, v, (size_t)n * es);
        free(v);
        if (rc) return rc;
    }
    return 0;
}

char *keel_hf_config_json(const keel_qwen35_config *c, keel_type dtype) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen3_5ForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", "qwen3_5_text");
    cJSON_AddStringToObject(o, "dtype", dtype == KEEL_BF16 ? "bfloat16" : dtype == KEEL_F16 ? "float16" : "float32");
    for (size_t i = 0; i < N_INT_FIELDS; i++)
        cJSON_AddNumberToObject(o, INT_FIELDS[i].key, (double)*(const int64_t *)((const char *)c + INT_FIELDS[i].off));
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(o, "partial_rotary_factor", c->partial_rotary);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
    for (int64_t i = 0; i < c->layers; i++)
        cJSON_AddItemToArray(lt, cJSON_CreateString(c->full_attention[i] ? "full_attention" : "linear_attention"));
    cJSON *rp = cJSON_AddObjectToObject(o, "rope_parameters");
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNumberToObject(rp, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(rp, "partial_rotary_factor", c->partial_rotary);
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    return txt;
}

static int write_file_synced(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return keel_fail("%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text), done = 0;
    while (done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w <= 0) {
            int e = errno;
            close(fd);
            return keel_fail("%s: write failed: %s", path, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return keel_fail("%s: fsync failed: %s", path, strerror(e));
    }
    close(fd);
    return 0;
}

/* The parent folder of path (".": none given), for fsync after a rename in it. */
static void parent_of(const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, n, ".");
    else if (slash == out)
        out[1] = 0;
    else
        *slash = 0;
}

/* Puts the complete folder tmp at out_dir. With a previous checkpoint there, the two are exchanged
 * in one atomic rename (renameat2 RENAME_EXCHANGE), so at every instant out_dir is a complete
 * checkpoint, the old or the new; the old one, now at tmp, is removed after. On a file system
 * without the exchange, two renames: the old checkpoint moves to out_dir.old.XXXXXX first, and a
 * kill between the renames leaves it there, complete, for `--resume` to find. The parent folder is
 * synced so the swap itself survives a power cut. */
static int swap_into_place(const char *tmp, const char *out_dir) {
    struct stat sb;
    char parent[4096], old[4200];
    parent_of(out_dir, parent, sizeof parent);
    bool had = lstat(out_dir, &sb) == 0;
    if (had && !S_ISDIR(sb.st_mode))
        return keel_fail("%s: exists and is not a folder (a file or a link); not replacing it", out_dir);
    int rc = 0;
    if (!had) {
        if (rename(tmp, out_dir) != 0)
            return keel_fail("%s: cannot rename %s into place: %s", out_dir, tmp, strerror(errno));
        if (keel_fault_save_point(6) || keel_fault_save_point(7) || keel_fault_save_point(8)) return -1;
    } else if (!keel_fault_save_no_exchange() &&
               syscall(SYS_renameat2, AT_FDCWD, tmp, AT_FDCWD, out_dir, RENAME_EXCHANGE) == 0) {
        if (keel_fault_save_point(6) || keel_fault_save_point(7)) return -1;
        rc = keel_remove_tree(tmp); /* the previous checkpoint, now under the temporary name */
        if (!rc) rc = keel_fault_save_point(8);
    } else if (!keel_fault_save_no_exchange() && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
        return keel_fail("%s: cannot swap in %s: %s", out_dir, tmp, strerror(errno));
    } else {
        snprintf(old, sizeof old, "%s.old.XXXXXX", out_dir);
        if (!mkdtemp(old)) return keel_fail("%s: cannot create a folder name: %s", old, strerror(errno));
        if (rename(out_dir, old) != 0) /* onto the empty folder mkdtemp made: replaces it */
            return rmdir(old), keel_fail("%s: cannot move the previous checkpoint aside: %s", out_dir, strerror(errno));
        if (keel_fault_save_point(6)) return -1;
        if (rename(tmp, out_dir) != 0) {
            rc = keel_fail("%s: cannot rename %s into place: %s", out_dir, tmp, strerror(errno));
            rename(old, out_dir);
            return rc;
        }
        if (keel_fault_save_point(7)) return -1;
        rc = keel_remove_tree(old);
        if (!rc) rc = keel_fault_save_point(8);
    }
    if (!rc) rc = keel_fsync_dir(parent);
    if (!rc) rc = keel_fault_save_point(9);
    return rc;
}

int keel_checkpoint_save(const char *out_dir, const keel_qwen35 *m, keel_backend *be, keel_type dtype,
                         const keel_checkpoint *src, bool multimodal) {
    return keel_checkpoint_save_ex(out_dir, m, be, dtype, src, multimodal, NULL, NULL);
}

int keel_write_text_synced(const char *path, const char *text) { return write_file_synced(path, text); }

int keel_save_folder(const char *out_dir_given, int (*fill)(const char *tmp_dir, void *ud), void *ud) {
    char out_dir[4000]; /* without trailing slashes: "out/" must not put the temporary folder inside out */
    if (snprintf(out_dir, sizeof out_dir, "%s", out_dir_given) >= (int)sizeof out_dir)
        return keel_fail("%s: path too long", out_dir_given);
    for (size_t n = strlen(out_dir); n > 1 && out_dir[n - 1] == '/'; n--) out_dir[n - 1] = 0;
    char tmp[4096];
    /* a fresh folder of our own beside the destination: mkdtemp creates it exclusively (never an
     * existing folder, never through a link planted at the name) */
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", out_dir) >= (int)sizeof tmp)
        return keel_fail("%s: path too long", out_dir);
    if (!mkdtemp(tmp)) return keel_fail("%s: cannot create a temporary folder: %s", tmp, strerror(errno));
    chmod(tmp, 0755); /* mkdtemp makes it 0700; a checkpoint is as readable as any folder */
    int rc = keel_fault_save_point(1);
    if (!rc) rc = fill(tmp, ud);
    if (!rc) rc = keel_fsync_dir(tmp);
    if (!rc) rc = keel_fault_save_point(5);
    if (!rc) rc = swap_into_place(tmp, out_dir);
    if (rc) keel_remove_tree(tmp);
    return rc;
}

typedef struct {
    const keel_qwen35 *m;
    keel_backend *be;
    keel_type dtype;
    const keel_checkpoint *src;
    bool multimodal;
    int (*extra)(const char *tmp_dir, void *ud);
    void *ud;
} save_job;

static int fill_checkpoint(const char *tmp, void *ud) {
    const save_job *j = ud;
    const keel_qwen35 *m = j->m;
    const keel_checkpoint *src = j->src;
    keel_backend *be = j->be;
    keel_type dtype = j->dtype;
    bool multimodal = j->multimodal;
    char path[4352];
    int n_max = m->n_params + 16, n = 0, rc = 0;
    for (int f = 0; src && f < src->n_files; f++) n_max += src->files[f]->n;
    keel_st_entry *e = calloc((size_t)n_max, sizeof *e);
    char **names = calloc((size_t)n_max, sizeof *names);
    void **bufs = calloc((size_t)n_max, sizeof *bufs);
    if (!e || !names || !bufs) rc = keel_fail("out of memory");
    static const char *dt_names[KEEL_TYPE_COUNT] = {
        [KEEL_F32] = "F32", [KEEL_F16] = "F16", [KEEL_BF16] = "BF16", [KEEL_F64] = "F64"};
    for (int p = 0; p < m->n_params && !rc; p++) {
        keel_tensor *t = m->params[p];
        size_t bytes = (size_t)keel_nelements(t) * keel_type_size(dtype);
        bufs[n] = malloc(bytes ? bytes : 1);
        if (!bufs[n]) {
            rc = keel_fail("out of memory saving '%s'", t->name);
            break;
        }
        if (keel_tensor_read(be, t, bufs[n], dtype)) {
            rc = -1;
            break;
        }
        const char *nm = t->name;
        char *full = malloc(strlen(nm) + 32);
        if (!full) {
            rc = keel_fail("out of memory saving '%s'", nm);
            break;
        }
        if (multimodal && strncmp(nm, "model.", 6) == 0)
            sprintf(full, "model.language_model.%s", nm + 6);
        else
            strcpy(full, nm);
        names[n] = full;
        e[n].name = full;
        e[n].raw = bufs[n];
        e[n].raw_dtype = dt_names[dtype];
        /* the checkpoint's shape: keel's reversed; conv1d is [C, 1, K] */
        if (strstr(nm, "conv1d.weight")) {
            e[n].n_dims = 3, e[n].shape[0] = t->ne[1], e[n].shape[1] = 1, e[n].shape[2] = t->ne[0];
        } else if (t->ne[1] > 1) {
            e[n].n_dims = 2, e[n].shape[0] = t->ne[1], e[n].shape[1] = t->ne[0];
        } else {
            e[n].n_dims = 1, e[n].shape[0] = t->ne[0];
        }
        n++;
    }
    if (!rc && multimodal) /* vision and mtp tensors travel unchanged */
        for (int f = 0; f < src->n_files; f++)
            for (int i = 0; i < src->files[f]->n; i++) {
                const keel_st_tensor *st = &src->files[f]->t[i];
                if (!ignored(st->name)) continue;
                e[n] = (keel_st_entry){.name = st->name, .n_dims = st->n_dims, .raw = st->data, .raw_dtype = st->dtype};
                memcpy(e[n].shape, st->shape, sizeof st->shape);
                n++;
            }
    if (!rc) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        rc = keel_st_write(path, e, n);
    }
    if (!rc) rc = keel_fault_save_point(2);
    if (!rc) {
        char *cfg = NULL;
        if (src && src->multimodal == multimodal) {
            snprintf(path, sizeof path, "%s/config.json", src->dir);
            cfg = keel_read_file(path, NULL);
        } else {
            cfg = keel_hf_config_json(&m->cfg, dtype);
        }
        snprintf(path, sizeof path, "%s/config.json", tmp);
        rc = cfg ? write_file_synced(path, cfg) : -1;
        free(cfg);
    }
    if (!rc) rc = keel_fault_save_point(3);
    if (!rc && j->extra) rc = j->extra(tmp, j->ud);
    if (!rc) rc = keel_fault_save_point(4);
    for (int i = 0; i < n_max; i++) free(names ? names[i] : NULL), free(bufs ? bufs[i] : NULL);
    free(e), free(names), free(bufs);
    return rc;
}

int keel_checkpoint_save_ex(const char *out_dir, const keel_qwen35 *m, keel_backend *be, keel_type dtype,
                            const keel_checkpoint *src, bool multimodal, int (*extra)(const char *tmp_dir, void *ud),
                            void *ud) {
    if (dtype != KEEL_F32 && dtype != KEEL_BF16 && dtype != KEEL_F16 && dtype != KEEL_F64)
        return keel_fail("save: cannot store weights as %s", keel_type_name(dtype));
    if (multimodal && !(src && src->multimodal))
        return keel_fail(
            "save: the multimodal layout needs a multimodal source checkpoint (its config and vision weights)");
    save_job j = {m, be, dtype, src, multimodal, extra, ud};
    return keel_save_folder(out_dir, fill_checkpoint, &j);
}
