/* keel: what the backends' kernels share (not part of the backend interface): the float32 type
 * rule, ACC / SET / CONCAT as calls of a backend's one copy path, checked id reads, and the row
 * grouping of GET_ROWS_BACK's fixed summation order. */
#ifndef KEEL_KERNEL_COMMON_H
#define KEEL_KERNEL_COMMON_H

#include "backend/backend.h"

/* The type rule of the float32 backends (cpu, cuda): the copy family converts between all types,
 * GET_ROWS takes int32 ids, the products also take bf16 operands (float32 sums, a float32 or bf16
 * result), every other op takes float32 values (int32 index sources) and gives float32. */
bool keel_backend_f32_supports(const keel_tensor *t);
/* ACC and SET (`dst = src0` unless in place, then the window), and CONCAT, as calls of the
 * backend's one copy path; the float32 backends run them so. */
int keel_backend_run_acc_set(keel_backend *be, const keel_tensor *t);
int keel_backend_run_concat(keel_backend *be, const keel_tensor *t);
/* FAM_COPY, through the backend's one copy path: CPY, CONT, DUP (src0 into the result), ACC, SET,
 * CONCAT. The float32 backends run the family so; the float64 oracle keeps its own, independent
 * version (it is what this is checked against). */
int keel_backend_run_copy_family(keel_backend *be, const keel_tensor *t);

/* CROSS_ENTROPY_LOSS and its backward: checks the targets (each below the vocabulary; a negative one
 * means no loss at that position) and gives the divisor D of the loss: fp0, or when fp0 is 0 the
 * count of targets >= 0 (1 when there is none: the loss is then 0). */
int keel_backend_ce_divisor(keel_backend *be, const keel_tensor *t, double *divisor);
/* The int32 ids node t reads and their range, for GET_ROWS, GET_ROWS_BACK and the cross-entropy ops
 * (false for the others): ids in [0, limit), negatives allowed for targets (no loss there); what
 * names them in messages ("id", "target"). */
bool keel_backend_id_rule(const keel_tensor *t, const keel_tensor **ids, int64_t *limit, bool *negatives,
                          const char **what);
/* The ids of node t (by that rule) read in flat order through the backend and checked: a bad one is
 * an error naming the node, the value and where it is. With out, the caller gets the values (free).
 * The CUDA backend checks ids on the device and calls this after a run in which a kernel met a bad
 * one, for the message. */
int keel_backend_read_ids(keel_backend *be, const keel_tensor *t, int32_t **out);
/* For GET_ROWS_BACK: the items i (0 <= i < n) grouped by ids[i] in [0, R), each group in
 * ascending i (the fixed summation order): group r is items[start[r] .. start[r+1]). start holds
 * R + 1 values, items n. */
void keel_rows_by_id(const int32_t *ids, int64_t n, int64_t R, int64_t *start, int64_t *items);

#endif
