/* keel: the trainer behind `keel train`. */
#ifndef KEEL_TRAIN_H
#define KEEL_TRAIN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *model_dir, *preset, *init_config, *resume_dir; /* where the model comes from (one of them) */
    const char *tokenizer, *out_dir, *backend, *recompute, *freeze, *trace;
    const char *data[64];
    int n_data;
    int64_t steps, stop_at, window, batch, accum, warmup, eval_every, save_every, threads, trace_step, eval_batches;
    double lr, lr_min, weight_decay, clip, eval_fraction;
    bool trace_data;
    int64_t nproc;          /* --nproc: processes on this host (the CLI starts them) */
    double dist_timeout;    /* seconds any rank waits for another */
    int64_t trace_max_bytes;
    int64_t trace_sample;   /* --trace-sample: values kept per node (0: all) */
    uint64_t seed;
} keel_train_opts;

void keel_train_defaults(keel_train_opts *o);
/* 0: done; 1: failed (message printed); 130: interrupted by Ctrl-C, checkpoint saved. */
int keel_train_run(const keel_train_opts *o);
/* Set by the CLI's SIGINT handler: the loop saves a checkpoint after the current step and stops. */
extern volatile sig_atomic_t keel_train_stop;

#endif
