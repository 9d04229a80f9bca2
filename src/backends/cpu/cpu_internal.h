/* keel: internals shared by the cpu backend's files. */
#ifndef KEEL_CPU_INTERNAL_H
#define KEEL_CPU_INTERNAL_H

#include <string.h>

#include "backend/backend.h"
#include "backends/kernel_common.h"
#include "backends/cpu/threadpool.h"
#include "backends/op_profile.h"

typedef struct {
    keel_pool *pool;
    keel_op_profile *profile; /* KEEL_CPU_PROFILE=1: wall time per op, printed when freed (NULL: off) */
    void *scratch;            /* cpu_scratch's buffer and its size */
    size_t scratch_bytes;
} cpu_impl;

static inline keel_pool *cpu_pool(keel_backend *be) { return ((cpu_impl *)be->impl)->pool; }
/* A buffer of at least `bytes` kept by the backend from one node to the next (freed with it), for a
 * kernel's large temporary: a fresh allocation of the LM head's 1 GiB logits chunk per node cost a
 * page fault per 4 KiB, 3.3 s a node on this project's VM. One user at a time; contents do not
 * carry over. NULL (with an error) when memory cannot be had. */
void *cpu_scratch(keel_backend *be, size_t bytes);

static inline char *cpu_row(const keel_tensor *t, int64_t i1, int64_t i2, int64_t i3) {
    return (char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
/* Row r (flat over dims 1..3) of t. */
static inline char *cpu_row_flat(const keel_tensor *t, int64_t r) {
    int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
    return cpu_row(t, i1, i2, i3);
}
static inline float cpu_ldf(const char *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}
static inline void cpu_stf(char *p, float v) { memcpy(p, &v, 4); }
/* Position (t, b) of an i32 positions tensor [T] or [T,B]; below 0 counts as 0 (ops/ops.h). */
static inline int64_t cpu_pos(const keel_tensor *p, int64_t t, int64_t b) {
    int32_t v;
    memcpy(&v, (const char *)p->data + t * p->nb[0] + (p->ne[1] == 1 ? 0 : b * p->nb[1]), 4);
    return v < 0 ? 0 : v;
}

/* The copy path (cpu_copy.c). */
int cpu_copy(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate);
/* Elements of a row of width ne0 that the copy path writes: its launch geometry, in one place. */
int64_t cpu_copy_row_len(const keel_backend *be, int64_t ne0);
/* A float32 tensor shaped like src, contiguous, in fresh memory (tmp->data: the caller frees it),
 * holding src's values through the copy path when fill (exact for bf16 and f16 sources). -1 with a
 * message when out of memory. */
int cpu_f32_temp(keel_backend *be, const keel_tensor *src, keel_tensor *tmp, bool fill);
/* Copy (or add) one row of n elements between any types and element strides. */
void cpu_copy_row(const keel_tensor *dst, char *d, const keel_tensor *src, const char *s, int64_t n, bool accumulate);

int cpu_gdn_forward(keel_backend *be, const keel_tensor *t);
int cpu_gdn_backward(keel_backend *be, const keel_tensor *t);
/* FLASH_ATTN and its backward (cpu_attention.c). */
int cpu_flash_attn(keel_backend *be, const keel_tensor *t);
/* LINEAR_CROSS_ENTROPY and its backward (cpu_linear_ce.c). */
int cpu_linear_ce(keel_backend *be, const keel_tensor *t);
int cpu_node(keel_backend *be, const keel_tensor *t);

#endif
