/* keel: the fault hooks, read in one place. Each re-creates a failure on purpose, so that a test
 * can show the failure is caught:
 *   KEEL_FAULT=copy-row-limit:N          a backend's one copy path copies only the first N elements
 *                                        of each row (the GPU bug the op tests exist to catch)
 *   KEEL_FAULT=save-kill:P               the process kills itself (SIGKILL) at point P of its
 *                                        first checkpoint save (1..KEEL_SAVE_POINTS: each step of
 *                                        the save), as a power cut or `kill -9` would
 *   KEEL_FAULT=save-no-exchange          saves swap folders with two renames, as on a file system
 *                                        without an exchanging rename (the recovery path)
 *   KEEL_FAULT=gdn-update-bf16           the cpu delta rule rounds each step's update to bf16: a
 *                                        loss of precision that one fixture's check-reference passes
 *                                        (seed 7) and the pooled check over seeds 1-7 catches
 *   KEEL_DIST_FAULT=exit:R:S | hang:R:S  rank R exits (or hangs) before the first collective of
 *                                        step S (the other ranks must notice and stop)
 * KEEL_FAULT may list several, comma-separated. A malformed value is an error naming the variable,
 * never ignored. */
#ifndef KEEL_FAULTS_H
#define KEEL_FAULTS_H

#include <stdint.h>

/* *n: KEEL_FAULT's row limit, 0 when unset; -1 with a message on a malformed value. */
int keel_fault_copy_row_limit(int64_t *n);
/* The steps of a checkpoint save a fault can stop at: 1 temporary folder made, 2 weights
 * written, 3 config written, 4 trainer state written, 5 folder synced, 6 swapped (or the old one
 * moved aside), 7 the new one in place, 8 the old one removed, 9 the parent folder synced. */
#define KEEL_SAVE_POINTS 9
/* Called at each point of a save: under save-kill:P at point P of the process's first save, the
 * process ends with SIGKILL (the other place outside the CLI that ends it, on purpose). -1 with a
 * message on a malformed KEEL_FAULT. */
int keel_fault_save_point(int point);
/* 1 under KEEL_FAULT=save-no-exchange. */
int keel_fault_save_no_exchange(void);
/* 1 under KEEL_FAULT=gdn-update-bf16; 0 otherwise; -1 with a message on a malformed KEEL_FAULT. */
int keel_fault_gdn_update_bf16(void);
/* KEEL_DIST_FAULT, for `rank` about to run `step`: when it names them, the process exits with
 * status 9 or hangs for good (a simulated dead or stuck rank; the one place outside the CLI
 * that ends the process, on purpose). Returns 0 otherwise; -1 with a message on a malformed value. */
int keel_fault_dist_step(int rank, int64_t step);

#endif
