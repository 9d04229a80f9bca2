/* keel: the trainer's state, shared by its parts: setup, step and logging (train.c) and the
 * checkpoint's trainer state (train_state.c). Internal to src/train. */
#ifndef KEEL_TRAINER_H
#define KEEL_TRAINER_H

#include <stdio.h>

#include "dist/collective.h"
#include "dist/grad_sync.h"
#include "io/checkpoint.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/step.h"
#include "train/train.h"

typedef struct {
    const keel_train_opts *o;
    keel_step *st; /* the model, its step graph and session, AdamW (keel_step) */
    keel_backend *be;
    keel_tensor **train_p, **grad, **acc, **acc_w; /* per trainable parameter (acc_w: the ACC into acc) */
    int n_train;
    int64_t end_fb; /* node ranges: [0,end_fb) forward+backward(+accumulate), then the norm and AdamW */
    int64_t step, position, tokens;
    int64_t trained; /* of the tokens seen, the targets the loss counted */
    keel_checkpoint *src;
    keel_coll *coll;      /* NULL: one process */
    keel_grad_sync *sync; /* the gradient buckets, with more than one rank */
    int rank, world;
    char tok_dir[4096], tok_file[4096]; /* the tokenizer trained with (tok_file empty: bytes) */
    char base_dir[4096]; /* LoRA: the frozen base's checkpoint folder (absolute), recorded for --resume */
    /* the run */
    keel_tokenizer *tok;
    keel_chat_template *chat; /* renders "messages" data (NULL: none) */
    keel_dataset data;
    FILE *metrics;
    int lock_fd;              /* the --out folder's lock (keel_run_lock), held for the run's life; -1: none */
    char from_buf[4200];      /* the checkpoint resumed from, when it was moved into place */
    int32_t *ids, *tgt, *pos; /* one micro-batch */
    bool lead, tty;           /* rank 0 prints, evaluates, writes; a terminal gets one live line */
    double t0;                /* when the first step of this invocation began */
    int64_t start_step;       /* the step it began after */
} trainer;

/* OUT/checkpoint: the weights (keel_checkpoint_save_ex) with the trainer's state beside them:
 * optimizer.safetensors, trainer_state.json (position, the options of the run) and the tokenizer's
 * files, swapped into place together. */
int keel_trainer_save(trainer *t);
/* --resume: the position, step and AdamW's moments from a checkpoint keel train wrote, each checked
 * (the run's window, batch, accumulation, seed and ranks must match). */
int keel_trainer_read_state(trainer *t, const char *dir);
/* LoRA: t->base_dir from --model (made absolute) or, resuming, from the checkpoint's trainer_state.json. */
int keel_trainer_base_of(trainer *t, const char *model_dir, const char *resume_dir);

#endif
