/* keel: the fault hooks, read in one place. Each re-creates a failure on purpose, so that a test
 * can show the failure is caught:
 *   KEEL_FAULT=copy-row-limit:N          a backend's one copy path copies only the first N elements
 *                                        of each row (the GPU bug the op tests exist to catch)
 *   KEEL_DIST_FAULT=exit:R:S | hang:R:S  rank R exits (or hangs) before the first collective of
 *                                        step S (the other ranks must notice and stop)
 * A malformed value is an error naming the variable, never ignored. */
#ifndef KEEL_FAULTS_H
#define KEEL_FAULTS_H

#include <stdint.h>

/* *n: KEEL_FAULT's row limit, 0 when unset; -1 with a message on a malformed value. */
int keel_fault_copy_row_limit(int64_t *n);
/* KEEL_DIST_FAULT, for `rank` about to run `step`: when it names them, the process exits with
 * status 9 or hangs for good (a simulated dead or stuck rank; the one place outside the CLI
 * that ends the process, on purpose). Returns 0 otherwise; -1 with a message on a malformed value. */
int keel_fault_dist_step(int rank, int64_t step);

#endif
