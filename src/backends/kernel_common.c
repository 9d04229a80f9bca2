#include "backends/kernel_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/error.h"

/* ids read to the host and checked: each below limit, and >= 0 unless negatives are allowed (*n_valid,
 * when given, counts the others); what names them in the message */
static int read_checked(keel_backend *be, const keel_tensor *t, const keel_tensor *ids, int64_t limit, bool negatives,
                        const char *what, int32_t **out, int64_t *n_valid) {
    int64_t n = keel_nelements(ids), valid = 0;
    int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) return keel_fail("out of memory reading the %ss of '%s'", what, t->name);
    if (keel_tensor_read(be, ids, v, KEEL_I32)) {
        free(v);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        if ((v[i] < 0 && !negatives) || v[i] >= limit) {
            int rc =
                keel_fail("%s '%s': %s %d at flat index %lld outside [0,%lld)%s", keel_op_get(t->op)->name, t->name,
                          what, v[i], (long long)i, (long long)limit, negatives ? " (negative: no loss)" : "");
            free(v);
            return rc;
        }
        valid += v[i] >= 0;
    }
    if (n_valid) *n_valid = valid;
    if (out)
        *out = v;
    else
        free(v);
    return 0;
}

bool keel_backend_id_rule(const keel_tensor *t, const keel_tensor **ids, int64_t *limit, bool *negatives,
                          const char **what) {
    *negatives = false, *what = "id";
    switch (t->op) {
    case KEEL_OP_GET_ROWS:
        *ids = t->src[1], *limit = t->src[0]->ne[1];
        return true;
    case KEEL_OP_GET_ROWS_BACK:
    case KEEL_OP_GET_ROWS_BACK_ADD:
        *ids = t->src[1], *limit = t->ne[1];
        return true;
    case KEEL_OP_CROSS_ENTROPY_LOSS:
    case KEEL_OP_CROSS_ENTROPY_LOSS_BACK:
        *ids = t->src[1], *limit = t->src[0]->ne[0], *negatives = true, *what = "target";
        return true;
    case KEEL_OP_LINEAR_CROSS_ENTROPY:
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK:
        *ids = t->src[2], *limit = t->src[1]->ne[1], *negatives = true, *what = "target";
        return true;
    default:
        return false;
    }
}

int keel_backend_read_ids(keel_backend *be, const keel_tensor *t, int32_t **out) {
    const keel_tensor *ids;
    int64_t limit;
    bool neg;
    const char *what;
    if (!keel_backend_id_rule(t, &ids, &limit, &neg, &what)) return keel_fail("'%s' reads no ids", t->name);
    return read_checked(be, t, ids, limit, neg, what, out, NULL);
}

int keel_backend_ce_divisor(keel_backend *be, const keel_tensor *t, double *divisor) {
    int64_t valid, limit;
    const keel_tensor *tg;
    bool neg;
    const char *what;
    if (!keel_backend_id_rule(t, &tg, &limit, &neg, &what))
        return keel_fail("'%s' is not a cross-entropy node", t->name);
    if (read_checked(be, t, tg, limit, neg, what, NULL, &valid)) return -1;
    *divisor = t->fp[0] > 0 ? t->fp[0] : valid ? (double)valid : 1.0;
    return 0;
}

void keel_rows_by_id(const int32_t *ids, int64_t n, int64_t R, int64_t *start, int64_t *items) {
    for (int64_t r = 0; r <= R; r++) start[r] = 0;
    for (int64_t i = 0; i < n; i++) start[ids[i] + 1]++;
    for (int64_t r = 0; r < R; r++) start[r + 1] += start[r];   /* start[r]: where group r begins */
    for (int64_t i = 0; i < n; i++) items[start[ids[i]]++] = i; /* ascending i; start[r] ends at group r's end */
    for (int64_t r = R; r > 0; r--) start[r] = start[r - 1];    /* ... which is where group r + 1 begins */
    start[0] = 0;
}

/* every source float32, but the index sources int32 */
static bool f32_sources(const keel_tensor *t) {
    const keel_op_info *info = keel_op_get(t->op);
    for (int i = 0; i < info->arity; i++)
        if (t->src[i]->type != (info->index_srcs >> i & 1 ? KEEL_I32 : KEEL_F32)) return false;
    return true;
}

bool keel_backend_f32_supports(const keel_tensor *t) {
    const keel_op_info *info = keel_op_get(t->op);
    if (info->flags & OPF_VIEW) return true;
    switch (t->op) {
    case KEEL_OP_CPY:
    case KEEL_OP_CONT:
    case KEEL_OP_DUP:
    case KEEL_OP_CAST:
    case KEEL_OP_CONCAT:
    case KEEL_OP_ACC:
    case KEEL_OP_SET:
        return true;
    case KEEL_OP_GET_ROWS:
        return t->src[1]->type == KEEL_I32;
    case KEEL_OP_LINEAR_CROSS_ENTROPY:
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK: /* float32, or bf16 x and W with float32 results */
        if (t->src[0]->type == KEEL_BF16 && t->src[1]->type == KEEL_BF16 && t->src[2]->type == KEEL_I32)
            return t->type == KEEL_F32 && (t->op == KEEL_OP_LINEAR_CROSS_ENTROPY || t->src[3]->type == KEEL_F32);
        break;
    case KEEL_OP_FLASH_ATTN:
    case KEEL_OP_FLASH_ATTN_BACK: /* float32, or bf16 q, k, v with float32 results */
        if (t->src[0]->type == KEEL_BF16) {
            if (t->src[1]->type != KEEL_BF16 || t->src[2]->type != KEEL_BF16 || t->src[3]->type != KEEL_I32)
                return false;
            for (int i = 4; i < info->arity; i++)
                if (t->src[i]->type != KEEL_F32) return false;
            return t->type == KEEL_F32;
        }
        break;
    case KEEL_OP_MUL_MAT:
    case KEEL_OP_OUT_PROD: /* mixed precision: bf16 operands, float32 sums, a float32 or bf16 result */
        if (t->src[0]->type == KEEL_BF16)
            return t->src[1]->type == KEEL_BF16 && (t->type == KEEL_F32 || t->type == KEEL_BF16);
        break;
    case KEEL_OP_SWIGLU: /* float32 gate and up (x and gate), a float32 or (rounded) bf16 result */
    case KEEL_OP_SIGMOID_MUL:
        if (t->type == KEEL_BF16) return t->src[0]->type == KEEL_F32 && t->src[1]->type == KEEL_F32;
        break;
    case KEEL_OP_SWIGLU_BACK:
    case KEEL_OP_CONV1D_BACK_INPUT:
    case KEEL_OP_RMS_NORM_W:
    case KEEL_OP_QK_NORM_ROPE:
    case KEEL_OP_GATED_RMS_NORM: /* float32 sources, a float32 or (rounded) bf16 result */
        return (t->type == KEEL_F32 || t->type == KEEL_BF16) && f32_sources(t);
    case KEEL_OP_ADAMW_SHADOW: /* float32 p, g, m, v, s; the weights' copies bf16 */
        for (int i = 0; i < 5; i++)
            if (t->src[i]->type != KEEL_F32) return false;
        return t->type == KEEL_F32 && t->src[5]->type == KEEL_BF16;
    case KEEL_OP_MUL_MAT_ADD: /* the same, the addend and the result float32 */
        if (t->src[0]->type == KEEL_BF16)
            return t->src[1]->type == KEEL_BF16 && t->src[2]->type == KEEL_F32 && t->type == KEEL_F32;
        break;
    default:
        break;
    }
    return t->type == KEEL_F32 && f32_sources(t);
}

int keel_backend_run_acc_set(keel_backend *be, const keel_tensor *t) {
    if (!t->ip[4] && be->copy(be, t, t->src[0], false)) return -1;
    keel_tensor w = keel_acc_window(t);
    return be->copy(be, &w, t->src[1], t->op == KEEL_OP_ACC);
}

int keel_backend_run_copy_family(keel_backend *be, const keel_tensor *t) {
    switch (t->op) {
    case KEEL_OP_ACC:
    case KEEL_OP_SET:
        return keel_backend_run_acc_set(be, t);
    case KEEL_OP_CONCAT:
        return keel_backend_run_concat(be, t);
    default: /* CPY, CONT, DUP */
        return be->copy(be, t, t->src[0], false);
    }
}

int keel_backend_run_concat(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    int d = (int)t->ip[0];
    keel_tensor w = *t;
    memcpy(w.ne, a->ne, sizeof w.ne);
    if (be->copy(be, &w, a, false)) return -1;
    memcpy(w.ne, b->ne, sizeof w.ne);
    w.data = (char *)t->data + a->ne[d] * t->nb[d];
    return be->copy(be, &w, b, false);
}
