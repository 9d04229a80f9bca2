#define _DEFAULT_SOURCE /* realpath */
/* keel: the trainer's state beside a checkpoint: what `keel train --resume` needs to continue a
 * run bitwise (AdamW's moments, the data position, the step) and what it continues with (the
 * options), plus the tokenizer's files, so that the checkpoint is complete for generate, eval and
 * export. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/trainer.h"
#include "util/error.h"
#include "util/file.h"

/* ---- the trainer's state beside the checkpoint ---- */

static int write_state(const char *tmp_dir, void *ud) {
    trainer *t = ud;
    char path[4400];
    keel_st_entry *e = calloc((size_t)(2 * t->n_train), sizeof *e);
    char **names = calloc((size_t)(2 * t->n_train), sizeof *names);
    void **bufs = calloc((size_t)(2 * t->n_train), sizeof *bufs);
    int rc = e && names && bufs ? 0 : keel_fail("out of memory saving the optimizer state");
    for (int i = 0; i < 2 * t->n_train && !rc; i++) {
        keel_tensor *mv = t->st->opt.mom[i];
        size_t bytes = (size_t)keel_nelements(mv) * 4;
        bufs[i] = malloc(bytes);
        names[i] = malloc(KEEL_NAME_MAX + 8);
        if (!bufs[i] || !names[i]) {
            rc = keel_fail("out of memory saving the optimizer state of '%s'", t->train_p[i / 2]->name);
            break;
        }
        if (keel_tensor_read(t->be, mv, bufs[i], KEEL_F32)) {
            rc = -1;
            break;
        }
        snprintf(names[i], KEEL_NAME_MAX + 8, "%s.%s", i % 2 ? "v" : "m", t->train_p[i / 2]->name);
        e[i] = (keel_st_entry){
            .name = names[i], .n_dims = 1, .shape = {keel_nelements(mv)}, .raw = bufs[i], .raw_dtype = "F32"};
    }
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp_dir);
    if (!rc) rc = keel_st_write(path, e, 2 * t->n_train);
    for (int i = 0; i < 2 * t->n_train && bufs && names; i++) free(bufs[i]), free(names[i]);
    free(e), free(names), free(bufs);
    if (rc) return rc;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", (double)t->step);
    cJSON_AddNumberToObject(j, "position", (double)t->position);
    cJSON_AddNumberToObject(j, "tokens", (double)t->tokens);
    cJSON_AddNumberToObject(j, "tokens_trained", (double)t->trained);
    cJSON_AddNumberToObject(j, "seed", (double)t->o->seed);
    cJSON_AddNumberToObject(j, "window", (double)t->o->window);
    cJSON_AddNumberToObject(j, "batch", (double)t->o->batch);
    cJSON_AddNumberToObject(j, "accum", (double)t->o->accum);
    cJSON_AddNumberToObject(j, "world", (double)t->world);
    cJSON_AddStringToObject(j, "vocabulary", t->tok_file[0] ? "tokenizer" : "bytes");
    if (t->st->m->lora) cJSON_AddStringToObject(j, "base_model", t->base_dir); /* the adapters' base, for --resume */
    cJSON_AddItemToObject(j, "options", keel_train_opts_json(t->o));           /* what --resume continues with */
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp_dir);
    FILE *f = fopen(path, "w");
    bool ok = f && txt && fputs(txt, f) >= 0;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok, ok = fclose(f) == 0 && ok;
    free(txt);
    if (!ok) return keel_fail("%s: cannot write the trainer state", path);
    /* the tokenizer travels with the weights, so the checkpoint is complete for generate, eval
     * and export: tokenizer.json, and its config and chat template when they are beside it */
    static const char *files[] = {"tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"};
    char src[4200];
    if (t->tok_file[0]) {
        snprintf(path, sizeof path, "%s/tokenizer.json", tmp_dir);
        if (keel_copy_file(t->tok_file, path)) return -1;
        for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
            struct stat st;
            snprintf(src, sizeof src, "%s/%s", t->tok_dir, files[i]);
            snprintf(path, sizeof path, "%s/%s", tmp_dir, files[i]);
            if (stat(src, &st) == 0 && keel_copy_file(src, path)) return -1;
        }
    }
    return 0;
}

/* A LoRA run's checkpoint: the adapter in PEFT's format (PeftModel.from_pretrained(base, dir)
 * loads it) and the trainer's state; the frozen base stays where it is. */
static int write_lora(const char *tmp_dir, void *ud) {
    trainer *t = ud;
    return keel_lora_write(tmp_dir, t->st->m, t->be, t->src && t->src->multimodal, t->base_dir) ||
                   write_state(tmp_dir, ud)
               ? -1
               : 0;
}

int keel_trainer_save(trainer *t) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoint", t->o->out_dir);
    if (t->st->m->lora) return keel_save_folder(dir, write_lora, t);
    return keel_checkpoint_save_ex(dir, t->st->m, t->be, KEEL_F32, NULL, false, write_state, t);
}

int keel_trainer_base_of(trainer *t, const char *model_dir, const char *resume_dir) {
    if (model_dir) {
        if (!realpath(model_dir, t->base_dir)) return keel_fail("--model %s: %s", model_dir, strerror(errno));
        return 0;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", resume_dir);
    cJSON *j = keel_read_json(path);
    if (!j) return -1;
    const char *b = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "base_model"));
    int rc = !b                                ? keel_fail("%s: no \"base_model\" (not a LoRA run's checkpoint?)", path)
             : strlen(b) >= sizeof t->base_dir ? keel_fail("%s: \"base_model\" is too long", path)
                                               : 0;
    if (!rc) snprintf(t->base_dir, sizeof t->base_dir, "%s", b);
    cJSON_Delete(j);
    return rc;
}

int keel_trainer_read_state(trainer *t, const char *dir) {
    char path[4200];
    struct stat sst;
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (stat(path, &sst) != 0)
        return keel_fail("--resume %s: no trainer_state.json (is it a checkpoint keel train wrote?)", dir);
    cJSON *j = keel_read_json(path);
    if (!j) return -1;
    struct {
        const char *k;
        int64_t *dst;
        int64_t want;
        const char *flag;
    } f2[] = {
        {"step", &t->step, -1, NULL},
        {"position", &t->position, -1, NULL},
        {"tokens", &t->tokens, -1, NULL},
        {"window", NULL, t->o->window, "--window"},
        {"batch", NULL, t->o->batch, "--batch"},
        {"accum", NULL, t->o->accum, "--accum"},
        {"seed", NULL, (int64_t)t->o->seed, "--seed"},
        {"world", NULL, t->world, "--nproc (ranks)"},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof f2 / sizeof f2[0] && !rc; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, f2[i].k);
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 9e15) ||
            v->valuedouble != floor(v->valuedouble)) {
            rc = keel_fail("%s: \"%s\" must be an integer >= 0", path, f2[i].k);
            break;
        }
        if (f2[i].dst)
            *f2[i].dst = (int64_t)v->valuedouble;
        else if ((int64_t)v->valuedouble != f2[i].want)
            rc = keel_fail("--resume %s: the run used %s %lld, this one %lld (a resumed run must match)", dir,
                           f2[i].flag, (long long)v->valuedouble, (long long)f2[i].want);
    }
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(j, "tokens_trained"); /* absent before it was kept */
    if (!rc && cJSON_IsNumber(tt) && tt->valuedouble >= 0 && tt->valuedouble < 9e15)
        t->trained = (int64_t)tt->valuedouble;
    cJSON_Delete(j);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    keel_st_file *st = keel_st_open(path);
    if (!st) return -1;
    for (int i = 0; i < 2 * t->n_train && !rc; i++) {
        char nm[KEEL_NAME_MAX + 8];
        snprintf(nm, sizeof nm, "%s.%s", i % 2 ? "v" : "m", t->train_p[i / 2]->name);
        const keel_st_tensor *x = keel_st_find(st, nm);
        if (!x || strcmp(x->dtype, "F32") || x->nbytes != (size_t)keel_nelements(t->st->opt.mom[i]) * 4)
            rc = keel_fail("%s: optimizer state '%s' missing or of the wrong size (--freeze must match the run)", path,
                           nm);
        else
            rc = t->be->write(t->be, t->st->opt.mom[i]->data, x->data, x->nbytes);
    }
    keel_st_close(st);
    if (rc || !t->st->m->lora) return rc;
    keel_adapter *ad = keel_adapter_open(dir); /* the adapters' factors */
    rc = !ad || keel_lora_load(t->st->m, t->be, ad) ? -1 : 0;
    keel_adapter_close(ad);
    return rc;
}
