#include "model/lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "util/error.h"
#include "util/rng.h"

/* The targetable weights of a model, in parameter order. */
static int targetable(const keel_qwen35 *m, keel_tensor **out) {
    int n = 0;
    for (int64_t i = 0; i < m->cfg.layers; i++) {
        const keel_qwen35_layer *L = &m->layer[i];
        keel_tensor *w[] = {L->q, L->k, L->v, L->o, L->qkv, L->z, L->b, L->a, L->out, L->gate, L->up, L->down};
        for (size_t k = 0; k < sizeof w / sizeof *w; k++)
            if (w[k]) out[n++] = w[k];
    }
    /* parameter order: the order of m->params */
    int k = 0;
    for (int p = 0; p < m->n_params; p++)
        for (int j = k; j < n; j++)
            if (out[j] == m->params[p]) {
                keel_tensor *t = out[k];
                out[k++] = out[j], out[j] = t;
                break;
            }
    return n;
}

void keel_lora_free(struct keel_lora *l) {
    if (!l) return;
    free(l->mod), free(l->params), free(l);
}

int keel_lora_attach(keel_ctx *ctx, keel_qwen35 *m, const keel_lora_opts *o) {
    if (m->lora) return keel_fail("the model has LoRA adapters already");
    if (o->rank < 1) return keel_fail("--lora-rank %lld: must be at least 1", (long long)o->rank);
    if (!(o->dropout >= 0 && o->dropout < 1)) return keel_fail("--lora-dropout %g: must be in [0, 1)", o->dropout);
    if (!isfinite(o->alpha) || o->alpha == 0)
        return keel_fail("--lora-alpha %g: must be finite and non-zero", o->alpha);
    keel_tensor **cand = calloc((size_t)(m->cfg.layers * 12 + 1), sizeof *cand);
    struct keel_lora *l = calloc(1, sizeof *l);
    if (!cand || !l) {
        free(cand), free(l);
        return keel_fail("out of memory");
    }
    int n_cand = targetable(m, cand), rc = 0;
    bool *sel = calloc((size_t)n_cand + 1, sizeof *sel);
    if (!sel) rc = keel_fail("out of memory");
    if (!rc && o->modules) { /* exactly these weights */
        for (int i = 0; i < o->n_modules && !rc; i++) {
            int j = 0;
            while (j < n_cand && strcmp(cand[j]->name, o->modules[i]) != 0) j++;
            if (j == n_cand)
                rc = keel_fail("LoRA target '%s' is not a linear weight of this model's decoder layers", o->modules[i]);
            else
                sel[j] = true;
        }
    } else if (!rc) {
        regex_t re;
        int e = o->targets ? regcomp(&re, o->targets, REG_EXTENDED | REG_NOSUB) : 0;
        if (e) {
            char msg[256];
            regerror(e, &re, msg, sizeof msg);
            rc = keel_fail("--lora-targets '%s': %s", o->targets, msg);
        }
        for (int j = 0; j < n_cand && !rc; j++) {
            char mod[KEEL_NAME_MAX];
            snprintf(mod, sizeof mod, "%.*s", (int)(strlen(cand[j]->name) - 7), cand[j]->name); /* no ".weight" */
            sel[j] = !o->targets || regexec(&re, mod, 0, NULL, 0) == 0;
        }
        if (o->targets && !e) regfree(&re);
    }
    for (int j = 0; j < n_cand && !rc; j++) l->n += sel[j];
    if (!rc && l->n == 0)
        rc = keel_fail("--lora-targets '%s' matches none of the model's %d linear weights (module names look like "
                       "'model.layers.0.mlp.up_proj')",
                       o->targets ? o->targets : "", n_cand);
    if (!rc) {
        l->mod = calloc((size_t)l->n, sizeof *l->mod);
        l->params = calloc((size_t)(2 * l->n), sizeof *l->params);
        if (!l->mod || !l->params) rc = keel_fail("out of memory");
    }
    keel_type type = m->final_norm->type; /* the activations' (norm weights keep it) */
    for (int j = 0, k = 0; j < n_cand && !rc; j++) {
        if (!sel[j]) continue;
        keel_lora_module *md = &l->mod[k];
        keel_tensor *W = cand[j];
        int64_t in = W->ne[0], out = W->ne[1];
        md->W = W;
        snprintf(md->module, sizeof md->module, "%.*s", (int)(strlen(W->name) - 7), W->name);
        md->A = keel_new_2d(ctx, type, in, o->rank);
        md->B = keel_new_2d(ctx, type, o->rank, out);
        if (!md->A || !md->B) {
            rc = -1;
            break;
        }
        keel_set_name(md->A, "%s.lora_A.weight", md->module)->flags |= KEEL_FLAG_PARAM;
        keel_set_name(md->B, "%s.lora_B.weight", md->module)->flags |= KEEL_FLAG_PARAM;
        l->params[l->n_params++] = md->A, l->params[l->n_params++] = md->B;
        k++;
    }
    free(cand), free(sel);
    if (rc) {
        keel_lora_free(l);
        return rc;
    }
    l->o = *o;
    l->o.targets = NULL, l->o.modules = NULL, l->o.n_modules = 0;
    l->scale = o->rslora ? o->alpha / sqrt((double)o->rank) : o->alpha / (double)o->rank;
    for (int p = 0; p < m->n_params; p++) m->params[p]->flags &= ~(uint32_t)KEEL_FLAG_PARAM; /* the base is frozen */
    m->lora = l;
    return 0;
}

keel_tensor *keel_lora_linear(keel_ctx *ctx, const keel_qwen35 *m, const keel_tensor *W, keel_tensor *x,
                              keel_tensor *y) {
    const struct keel_lora *l = m->lora;
    for (int i = 0; l && i < l->n; i++) {
        if (l->mod[i].W != W) continue;
        /* PEFT: y + B(A(drop(x))) * s; the scale is applied to the rank-r product, the cheaper side */
        keel_tensor *in = l->o.dropout > 0 ? keel_dropout(ctx, x, l->o.dropout, l->o.seed, (uint64_t)i) : x;
        keel_tensor *h = keel_scale(ctx, keel_mul_mat(ctx, l->mod[i].A, in), l->scale, 0.0);
        return keel_add(ctx, y, keel_mul_mat(ctx, l->mod[i].B, h));
    }
    return y;
}

int keel_lora_init_weights(const keel_qwen35 *m, keel_backend *be, uint64_t seed) {
    const struct keel_lora *l = m->lora;
    for (int i = 0; l && i < l->n; i++) {
        const keel_lora_module *md = &l->mod[i];
        int64_t nA = keel_nelements(md->A), nB = keel_nelements(md->B), n = nA > nB ? nA : nB;
        double *v = malloc((size_t)n * sizeof *v), bound = 1.0 / sqrt((double)md->A->ne[0]);
        if (!v) return keel_fail("out of memory for the initial values of '%s'", md->A->name);
        uint64_t s = seed * 0x100000001b3ull + (uint64_t)(i + 1) * 0xd1b54a32d192ed03ull;
        for (int64_t j = 0; j < nA; j++) v[j] = bound * (2.0 * keel_uniform01(&s) - 1.0);
        int rc = keel_tensor_write(be, md->A, v, KEEL_F64);
        for (int64_t j = 0; j < nB; j++) v[j] = 0.0;
        rc = rc || keel_tensor_write(be, md->B, v, KEEL_F64);
        free(v);
        if (rc) return -1;
    }
    return 0;
}

/* "model.layers.3.mlp.up_proj" -> "up_proj" */
static const char *leaf_of(const char *module) {
    const char *d = strrchr(module, '.');
    return d ? d + 1 : module;
}

/* PEFT's target_modules: a leaf name ("up_proj") when every weight of that name is adapted, else
 * each module as "layers.N.mlp.up_proj" (PEFT matches a module whose name ends with ".<entry>",
 * so the list is right for either checkpoint layout). */
static cJSON *target_modules(const keel_qwen35 *m) {
    const struct keel_lora *l = m->lora;
    keel_tensor **cand = calloc((size_t)(m->cfg.layers * 12 + 1), sizeof *cand);
    cJSON *arr = cJSON_CreateArray();
    if (!cand || !arr) {
        free(cand), cJSON_Delete(arr);
        return NULL;
    }
    int n_cand = targetable(m, cand);
    for (int i = 0; i < l->n; i++) {
        const char *leaf = leaf_of(l->mod[i].module);
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = strcmp(leaf_of(l->mod[j].module), leaf) == 0;
        if (seen) continue;
        int have = 0, want = 0;
        for (int j = 0; j < n_cand; j++) {
            char mod[KEEL_NAME_MAX];
            snprintf(mod, sizeof mod, "%.*s", (int)(strlen(cand[j]->name) - 7), cand[j]->name);
            want += strcmp(leaf_of(mod), leaf) == 0;
        }
        for (int j = 0; j < l->n; j++) have += strcmp(leaf_of(l->mod[j].module), leaf) == 0;
        if (have == want) {
            cJSON_AddItemToArray(arr, cJSON_CreateString(leaf));
            continue;
        }
        for (int j = 0; j < l->n; j++)
            if (strcmp(leaf_of(l->mod[j].module), leaf) == 0)
                cJSON_AddItemToArray(arr, cJSON_CreateString(l->mod[j].module + 6)); /* without "model." */
    }
    free(cand);
    return arr;
}

int keel_lora_write(const char *dir, const keel_qwen35 *m, keel_backend *be, bool multimodal, const char *base) {
    const struct keel_lora *l = m->lora;
    if (!l) return keel_fail("the model has no LoRA adapters to save");
    keel_st_entry *e = calloc((size_t)l->n_params, sizeof *e);
    char **names = calloc((size_t)l->n_params, sizeof *names);
    void **bufs = calloc((size_t)l->n_params, sizeof *bufs);
    int rc = !e || !names || !bufs ? keel_fail("out of memory") : 0;
    for (int i = 0; i < l->n_params && !rc; i++) {
        keel_tensor *t = l->params[i];
        bufs[i] = malloc((size_t)keel_nelements(t) * 4);
        names[i] = malloc(KEEL_NAME_MAX + 64);
        if (!bufs[i] || !names[i]) {
            rc = keel_fail("out of memory saving '%s'", t->name);
            break;
        }
        if (keel_tensor_read(be, t, bufs[i], KEEL_F32)) {
            rc = -1;
            break;
        }
        const char *nm = t->name; /* "model.layers..." */
        snprintf(names[i], KEEL_NAME_MAX + 64, "base_model.model.%s%s", multimodal ? "model.language_model." : "",
                 multimodal ? nm + 6 : nm);
        e[i] = (keel_st_entry){
            .name = names[i], .n_dims = 2, .shape = {t->ne[1], t->ne[0]}, .raw = bufs[i], .raw_dtype = "F32"};
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (!rc) rc = keel_st_write(path, e, l->n_params);
    for (int i = 0; i < l->n_params; i++) free(bufs ? bufs[i] : NULL), free(names ? names[i] : NULL);
    free(e), free(names), free(bufs);
    if (rc) return rc;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    if (base)
        cJSON_AddStringToObject(j, "base_model_name_or_path", base);
    else
        cJSON_AddNullToObject(j, "base_model_name_or_path");
    cJSON_AddNumberToObject(j, "r", (double)l->o.rank);
    cJSON_AddNumberToObject(j, "lora_alpha", l->o.alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", l->o.dropout);
    cJSON_AddBoolToObject(j, "use_rslora", l->o.rslora);
    cJSON *tm = target_modules(m);
    if (tm) cJSON_AddItemToObject(j, "target_modules", tm);
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", false);
    cJSON_AddBoolToObject(j, "inference_mode", true);
    cJSON_AddBoolToObject(j, "init_lora_weights", true);
    cJSON_AddBoolToObject(j, "use_dora", false);
    cJSON_AddNullToObject(j, "modules_to_save");
    cJSON_AddNullToObject(j, "layers_to_transform");
    cJSON_AddNullToObject(j, "layers_pattern");
    cJSON_AddItemToObject(j, "rank_pattern", cJSON_CreateObject());
    cJSON_AddItemToObject(j, "alpha_pattern", cJSON_CreateObject());
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    rc = !tm || !txt ? keel_fail("out of memory") : keel_write_text_synced(path, txt);
    free(txt);
    return rc;
}

void keel_lora_names_free(char **names, int n) {
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
}

int keel_lora_opts_from_adapter(const keel_adapter *a, keel_lora_opts *o, char ***names) {
    int n = 0;
    if (keel_adapter_targets(a, names, &n)) {
        keel_lora_names_free(*names, n), *names = NULL;
        return -1;
    }
    *o = (keel_lora_opts){.rank = a->r, .alpha = a->alpha, .rslora = a->rslora, .modules = *names, .n_modules = n};
    return 0;
}

int keel_lora_load(const keel_qwen35 *m, keel_backend *be, const keel_adapter *a) {
    const struct keel_lora *l = m->lora;
    if (!l) return keel_fail("%s: the model has no LoRA adapters to load into", a->dir);
    char **names = NULL;
    int n = 0;
    int rc = keel_adapter_targets(a, &names, &n);
    keel_lora_names_free(names, n);
    if (rc) return rc;
    if (n != l->n)
        return keel_fail("%s: %d adapted weights, the run's model %d (--lora-targets must match)", a->dir, n, l->n);
    if (a->r != l->o.rank)
        return keel_fail("%s: rank %lld, the run's %lld", a->dir, (long long)a->r, (long long)l->o.rank);
    for (int i = 0; i < l->n; i++) {
        const keel_lora_module *md = &l->mod[i];
        for (int k = 0; k < 2; k++) {
            keel_tensor *t = k ? md->B : md->A;
            const keel_st_tensor *s = keel_adapter_find(a, md->W->name, (char)('A' + k));
            if (!s) return keel_fail("%s: no lora_%c for '%s'", a->dir, 'A' + k, md->module);
            if (s->n_dims != 2 || s->shape[0] != t->ne[1] || s->shape[1] != t->ne[0] || s->type < 0)
                return keel_fail("%s: '%s' is %s [%lld, %lld]; expected a real tensor [%lld, %lld]", a->file->path,
                                 s->name, s->dtype, (long long)s->shape[0],
                                 (long long)(s->n_dims > 1 ? s->shape[1] : 0), (long long)t->ne[1],
                                 (long long)t->ne[0]);
            int64_t ne = keel_nelements(t);
            double *v = malloc((size_t)ne * sizeof *v);
            if (!v) return keel_fail("out of memory loading '%s'", s->name);
            int64_t bad = -1;
            for (int64_t j = 0; j < ne; j++)
                if (!isfinite(v[j] = keel_st_get(s, j)) && bad < 0) bad = j;
            if (bad >= 0) {
                free(v);
                return keel_fail("%s: '%s' holds %g at element %lld", a->file->path, s->name, keel_st_get(s, bad),
                                 (long long)bad);
            }
            int wr = keel_tensor_write(be, t, v, KEEL_F64);
            free(v);
            if (wr) return -1;
        }
    }
    return 0;
}
