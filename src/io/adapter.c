#include "io/adapter.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"

void keel_adapter_close(keel_adapter *a) {
    if (!a) return;
    keel_st_close(a->file);
    free(a->dir);
    free(a);
}

/* A field that must be absent, false, empty or "none" for a plain merge. */
static int refuse_if_set(const cJSON *cfg, const char *key, const char *path, const char *why) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    bool set = v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) &&
               !(cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0) &&
               !((cJSON_IsObject(v) || cJSON_IsArray(v)) && cJSON_GetArraySize(v) == 0);
    return set ? keel_fail("%s: \"%s\" is set: %s", path, key, why) : 0;
}

keel_adapter *keel_adapter_open(const char *dir) {
    char p[4096 + 64];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    cJSON *cfg = keel_read_json(p);
    if (!cfg) return NULL;
    keel_adapter *a = calloc(1, sizeof *a);
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cfg, "peft_type"));
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(cfg, "r"),
                *alpha = cJSON_GetObjectItemCaseSensitive(cfg, "lora_alpha");
    int rc = !a ? keel_fail("out of memory") : 0;
    if (!rc && type && strcmp(type, "LORA")) rc = keel_fail("%s: peft_type \"%s\" (only LORA adapters merge)", p, type);
    if (!rc &&
        !(cJSON_IsNumber(r) && r->valuedouble >= 1 && r->valuedouble == floor(r->valuedouble) && r->valuedouble < 1e9))
        rc = keel_fail("%s: \"r\" must be a positive integer", p);
    if (!rc && !(cJSON_IsNumber(alpha) && isfinite(alpha->valuedouble)))
        rc = keel_fail("%s: \"lora_alpha\" must be a finite number", p);
    rc = rc || refuse_if_set(cfg, "use_dora", p, "DoRA's magnitude vectors are not a plain merge");
    rc = rc || refuse_if_set(cfg, "bias", p, "trained biases (Qwen3.5 has none to add them to)");
    rc = rc || refuse_if_set(cfg, "modules_to_save", p, "modules saved in full are not supported");
    rc = rc || refuse_if_set(cfg, "rank_pattern", p, "per-module ranks are not supported");
    rc = rc || refuse_if_set(cfg, "alpha_pattern", p, "per-module alphas are not supported");
    rc = rc || refuse_if_set(cfg, "fan_in_fan_out", p, "transposed (Conv1D) weights are not Qwen3.5's");
    if (!rc) {
        a->r = (int64_t)r->valuedouble, a->alpha = alpha->valuedouble;
        a->rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "use_rslora"));
        a->scale = a->rslora ? a->alpha / sqrt((double)a->r) : a->alpha / (double)a->r;
        a->dir = strdup(dir);
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
        a->file = a->dir ? keel_st_open(p) : NULL;
        if (!a->file) rc = -1;
    }
    cJSON_Delete(cfg);
    if (rc) keel_adapter_close(a);
    return rc ? NULL : a;
}

/* The parameter a stored adapter tensor targets, in keel's (text-layout) names:
 * "base_model.model.model.language_model.layers.3.mlp.up_proj.lora_A.weight" ->
 * "model.layers.3.mlp.up_proj.weight"; which = 'A' or 'B'. 0 when the name is not a LoRA factor. */
static int target_of(const char *stored, char *out, size_t n, char *which) {
    const char *s = stored;
    if (strncmp(s, "base_model.model.", 17) == 0) s += 17;
    char tmp[512];
    if (strncmp(s, "model.language_model.", 21) == 0)
        snprintf(tmp, sizeof tmp, "model.%s", s + 21);
    else
        snprintf(tmp, sizeof tmp, "%s", s);
    size_t len = strlen(tmp);
    const char *suffix[2] = {".lora_A.weight", ".lora_B.weight"};
    for (int k = 0; k < 2; k++) {
        size_t sl = strlen(suffix[k]);
        if (len > sl && strcmp(tmp + len - sl, suffix[k]) == 0) {
            snprintf(out, n, "%.*s.weight", (int)(len - sl), tmp);
            *which = (char)('A' + k);
            return 1;
        }
    }
    return 0;
}

const keel_st_tensor *keel_adapter_find(const keel_adapter *a, const char *param_name, char which) {
    for (int i = 0; i < a->file->n; i++) {
        char target[512], w;
        if (target_of(a->file->t[i].name, target, sizeof target, &w) && w == which && strcmp(target, param_name) == 0)
            return &a->file->t[i];
    }
    return NULL;
}

int keel_adapter_targets(const keel_adapter *a, char ***names, int *n) {
    *names = calloc((size_t)a->file->n + 1, sizeof **names);
    *n = 0;
    if (!*names) return keel_fail("out of memory");
    for (int i = 0; i < a->file->n; i++) {
        char target[512], w;
        if (!target_of(a->file->t[i].name, target, sizeof target, &w))
            return keel_fail("%s: tensor '%s' is not a LoRA factor (lora_A / lora_B)", a->file->path,
                             a->file->t[i].name);
        if (w != 'A') continue;
        if (!keel_adapter_find(a, target, 'B'))
            return keel_fail("%s: '%s' has no lora_B partner", a->file->path, a->file->t[i].name);
        if (!((*names)[(*n)++] = strdup(target))) return keel_fail("out of memory");
    }
    for (int i = 0; i < a->file->n; i++) { /* and every lora_B its lora_A */
        char target[512], w;
        if (target_of(a->file->t[i].name, target, sizeof target, &w) && w == 'B' && !keel_adapter_find(a, target, 'A'))
            return keel_fail("%s: '%s' has no lora_A partner", a->file->path, a->file->t[i].name);
    }
    return *n ? 0 : keel_fail("%s: no LoRA factors", a->file->path);
}

static keel_tensor *param_named(const keel_qwen35 *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i]->name, name) == 0) return m->params[i];
    return NULL;
}

int keel_adapter_merge(const keel_adapter *a, const keel_qwen35 *m, keel_backend *be, int *n_merged) {
    const keel_st_file *f = a->file;
    int merged = 0;
    for (int i = 0; i < f->n; i++) { /* every tensor must be a LoRA factor whose partner is there */
        char target[512], which, t2[512], w2;
        if (!target_of(f->t[i].name, target, sizeof target, &which))
            return keel_fail(
                "%s: tensor '%s' is not a LoRA factor (lora_A / lora_B); embedding adapters and DoRA are not supported",
                f->path, f->t[i].name);
        bool partner = false;
        for (int j = 0; j < f->n && !partner; j++)
            partner = j != i && target_of(f->t[j].name, t2, sizeof t2, &w2) && w2 != which && strcmp(t2, target) == 0;
        if (!partner)
            return keel_fail("%s: '%s' has no lora_%c partner", f->path, f->t[i].name, which == 'A' ? 'B' : 'A');
    }
    for (int i = 0; i < f->n; i++) {
        char target[512], which;
        target_of(f->t[i].name, target, sizeof target, &which);
        if (which != 'A') continue;
        const keel_st_tensor *A = &f->t[i], *B = NULL;
        for (int j = 0; j < f->n && !B; j++) {
            char t2[512], w2;
            if (target_of(f->t[j].name, t2, sizeof t2, &w2) && w2 == 'B' && strcmp(t2, target) == 0) B = &f->t[j];
        }
        keel_tensor *W = param_named(m, target);
        if (!W) return keel_fail("%s: '%s' targets '%s', which this model does not have", f->path, A->name, target);
        int64_t in = W->ne[0], out = keel_nelements(W) / in, r = a->r;
        if (A->n_dims != 2 || B->n_dims != 2 || A->shape[0] != r || A->shape[1] != in || B->shape[0] != out ||
            B->shape[1] != r)
            return keel_fail(
                "%s: '%s' [%lld, %lld] and its lora_B [%lld, %lld] do not fit '%s' [%lld, %lld] at rank %lld", f->path,
                A->name, (long long)A->shape[0], (long long)(A->n_dims > 1 ? A->shape[1] : 0), (long long)B->shape[0],
                (long long)(B->n_dims > 1 ? B->shape[1] : 0), target, (long long)out, (long long)in, (long long)r);
        double *w = keel_tensor_read_f64(be, W);
        double *ad = malloc((size_t)(r * in) * sizeof *ad), *row = malloc((size_t)r * sizeof *row);
        if (!w || !ad || !row) {
            free(w), free(ad), free(row);
            return keel_fail("out of memory merging '%s'", target);
        }
        for (int64_t k = 0; k < r * in; k++) ad[k] = keel_st_get(A, k);
        for (int64_t o = 0; o < out; o++) {
            for (int64_t k = 0; k < r; k++) row[k] = a->scale * keel_st_get(B, o * r + k);
            for (int64_t c = 0; c < in; c++) {
                double s = 0;
                for (int64_t k = 0; k < r; k++) s += row[k] * ad[k * in + c];
                w[o * in + c] += s;
            }
        }
        int rc = keel_tensor_write(be, W, w, KEEL_F64); /* one rounding, to the parameter's type */
        free(w), free(ad), free(row);
        if (rc) return -1;
        merged++;
    }
    if (n_merged) *n_merged = merged;
    return 0;
}
