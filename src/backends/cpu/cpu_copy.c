/* keel: the cpu backend's ONE copy path. CPY, CONT, DUP, GET_ROWS, CONCAT, the `dst = src0` and
 * window steps of ACC and SET, and strided host transfers all end up in cpu_copy_row, with the
 * row length chosen by cpu_copy_row_len (where KEEL_FAULT=copy-row-limit:N bites). */
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"
#include "tensor/convert.h"
#include "util/error.h"

int64_t cpu_copy_row_len(const keel_backend *be, int64_t ne0) {
    if (be->fault_row_limit > 0 && ne0 > be->fault_row_limit) return be->fault_row_limit;
    return ne0;
}

void cpu_copy_row(const keel_tensor *dst, char *d, const keel_tensor *src, const char *s, int64_t n, bool accumulate) {
    int64_t dn = dst->nb[0], sn = src->nb[0];
    size_t es = keel_type_size(dst->type);
    if (dst->type == src->type && !accumulate) {
        if (dn == (int64_t)es && sn == (int64_t)es) {
            memcpy(d, s, (size_t)n * es);
        } else {
            for (int64_t i = 0; i < n; i++) memcpy(d + i * dn, s + i * sn, es);
        }
        return;
    }
    if (dst->type == KEEL_F32 && src->type == KEEL_F32) { /* accumulate, f32 */
        if (dn == 4 && sn == 4) {
            float *df = (float *)(void *)d;
            const float *sf = (const float *)(const void *)s;
            for (int64_t i = 0; i < n; i++) df[i] += sf[i];
        } else {
            for (int64_t i = 0; i < n; i++) cpu_stf(d + i * dn, cpu_ldf(d + i * dn) + cpu_ldf(s + i * sn));
        }
        return;
    }
    /* float32 <-> bf16 (the mixed-precision step's casts): the same conversions as the float64 path
     * below, element by element, without its switch per element */
    if (!accumulate && dst->type == KEEL_BF16 && src->type == KEEL_F32) {
        for (int64_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, s + i * sn, 4);
            uint16_t h = keel_cvt_f32_to_bf16(f);
            memcpy(d + i * dn, &h, 2);
        }
        return;
    }
    if (!accumulate && dst->type == KEEL_F32 && src->type == KEEL_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * sn, 2);
            float f = keel_cvt_bf16_to_f32(h);
            memcpy(d + i * dn, &f, 4);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = keel_load_value(src->type, s + i * sn);
        if (accumulate) v += keel_load_value(dst->type, d + i * dn);
        keel_store_value(dst->type, d + i * dn, v);
    }
}

typedef struct {
    const keel_tensor *dst, *src;
    bool acc;
    int64_t len;
} copy_ctx;

static void copy_task(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    copy_ctx *c = arg;
    const keel_tensor *d = c->dst, *s = c->src;
    for (int64_t r = begin; r < end; r++) cpu_copy_row(d, cpu_row_flat(d, r), s, cpu_row_flat(s, r), c->len, c->acc);
}

/* A source read across its rows (a transpose: CONT of a TRANSPOSE view): BLOCK_ROWS rows copied
 * BLOCK_COLS elements at a time, so the source elements one chunk reads share cache lines instead
 * of each element of a row being a miss (a 248,320 x 1024 transpose took 8.8 s). The same
 * cpu_copy_row, on pieces of each row: the same bytes land in the same places. */
enum { BLOCK_ROWS = 16, BLOCK_COLS = 64 };

static void copy_task_blocked(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    copy_ctx *c = arg;
    const keel_tensor *d = c->dst, *s = c->src;
    int64_t nr = keel_nrows(d);
    for (int64_t b = begin; b < end; b++) {
        int64_t r0 = b * BLOCK_ROWS, r1 = r0 + BLOCK_ROWS < nr ? r0 + BLOCK_ROWS : nr;
        for (int64_t i0 = 0; i0 < c->len; i0 += BLOCK_COLS) {
            int64_t n = c->len - i0 < BLOCK_COLS ? c->len - i0 : BLOCK_COLS;
            for (int64_t r = r0; r < r1; r++)
                cpu_copy_row(d, cpu_row_flat(d, r) + i0 * d->nb[0], s, cpu_row_flat(s, r) + i0 * s->nb[0], n, c->acc);
        }
    }
}

int cpu_copy(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate) {
    if (!keel_same_shape(dst, src)) {
        char a[64], b[64];
        return keel_fail("cpu copy: shape %s of '%s' differs from %s of '%s'", keel_shape_str(dst->ne, a, sizeof a),
                         dst->name, keel_shape_str(src->ne, b, sizeof b), src->name);
    }
    copy_ctx c = {dst, src, accumulate, cpu_copy_row_len(be, dst->ne[0])};
    int64_t es = (int64_t)keel_type_size(src->type);
    if (src->nb[0] != es && c.len > BLOCK_COLS && keel_nrows(dst) >= BLOCK_ROWS)
        keel_pool_for(cpu_pool(be), (keel_nrows(dst) + BLOCK_ROWS - 1) / BLOCK_ROWS, copy_task_blocked, &c);
    else
        keel_pool_for(cpu_pool(be), keel_nrows(dst), copy_task, &c);
    return 0;
}

int cpu_f32_temp(keel_backend *be, const keel_tensor *src, keel_tensor *tmp, bool fill) {
    *tmp = *src;
    tmp->type = KEEL_F32;
    tmp->view_src = NULL;
    keel_set_contiguous_strides(tmp);
    tmp->data = malloc(keel_nbytes(tmp) ? keel_nbytes(tmp) : 1);
    if (!tmp->data) return keel_fail("cpu: out of memory for a float32 copy of '%s'", src->name);
    return fill ? cpu_copy(be, tmp, src, false) : 0;
}
