/* keel: time per op, for the backends' profiles (KEEL_CPU_PROFILE, KEEL_CUDA_PROFILE): totals per
 * op and per (op, operand shapes) group, so a table says which ops and which product shapes or
 * strided operands the time goes to. Printed when the backend is freed. */
#ifndef KEEL_OP_PROFILE_H
#define KEEL_OP_PROFILE_H

#include <stdio.h>

#include "ops/ops.h"

typedef struct keel_op_profile keel_op_profile;

/* NULL when the environment variable `env` is unset, empty or "0" (no profile), or out of memory. */
keel_op_profile *keel_op_profile_from_env(const char *env);
/* Adds node t's time (milliseconds) to its op and to its (op, operand shapes) group. */
void keel_op_profile_add(keel_op_profile *p, const keel_tensor *t, double ms);
/* The per-op table, largest first, then the 30 groups with the most time, each with its bytes over
 * its time (node_bytes in op_profile.c: a floor on the bandwidth reached); `what` names the clock
 * ("GPU time", "wall time on 2 threads"). */
void keel_op_profile_print(const keel_op_profile *p, FILE *f, const char *title, const char *what);
/* Back to empty, as from keel_op_profile_from_env. */
void keel_op_profile_reset(keel_op_profile *p);
void keel_op_profile_free(keel_op_profile *p);

#endif
