/* keel: the trainer behind `keel train`. */
#ifndef KEEL_TRAIN_H
#define KEEL_TRAIN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "train/options.h"

/* 0: done; 1: failed (message printed); 130: interrupted by Ctrl-C, checkpoint saved. */
int keel_train_run(const keel_train_opts *o);
/* Set by the CLI's SIGINT handler: the loop saves a checkpoint after the current step and stops. */
extern volatile sig_atomic_t keel_train_stop;

#endif
