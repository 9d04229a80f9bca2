#include "ops/ops.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ops/dropout_mask.h"
#include "util/error.h"

/* Why an op has no gradient (ops with grad_srcs == 0). Checked by the op tests: every op either
 * has a backward rule or a reason here. */
static const char *nograd_reason(int op) {
    switch (op) {
    case KEEL_OP_NONE:
        return "leaf: a parameter's gradient is the result, not a rule";
    case KEEL_OP_FILL:
        return "constant: no inputs";
    case KEEL_OP_ADAMW:
    case KEEL_OP_ADAMW_SHADOW:
        return "optimizer step: updates state in place, never differentiated";
    case KEEL_OP_SUM_SQ:
        return "the optimizer's gradient norm: never differentiated";
    case KEEL_OP_GATED_DELTA_NET_STATE:
        return "decoding with a carried state: training uses GATED_DELTA_NET";
    default:
        return NULL;
    }
}

static keel_op_info g_info[KEEL_OP_COUNT] = {
#define KEEL_OP_INFO(id, family, arity, flags, grad, index, doc)                                                       \
    {#id, arity, FAM_##family, flags, grad, index, doc, NULL},
    KEEL_OP_TABLE(KEEL_OP_INFO)
#undef KEEL_OP_INFO
};
static int g_info_ready;

const keel_op_info *keel_op_get(int op) {
    if (op < 0 || op >= KEEL_OP_COUNT) return NULL;
    if (!g_info_ready) { /* fill the derived column once; idempotent, so a race is harmless */
        for (int i = 0; i < KEEL_OP_COUNT; i++) {
            if (g_info[i].grad_srcs) continue;
            g_info[i].nograd = nograd_reason(i);
            if (!g_info[i].nograd && (g_info[i].flags & OPF_BACKWARD))
                g_info[i].nograd = "backward-only op: keel computes first-order gradients";
        }
        g_info_ready = 1;
    }
    return &g_info[op];
}

int keel_op_from_name(const char *name) {
    for (int i = 0; i < KEEL_OP_COUNT; i++)
        if (strcasecmp(name, g_info[i].name) == 0) return i;
    return -1;
}

int keel_op_alias_src(const keel_tensor *t) {
    int f = keel_op_get(t->op)->flags;
    if (f & (OPF_VIEW | OPF_INPLACE0)) return 0;
    if ((f & OPF_INPLACE0_OPT) && t->ip[4]) return 0;
    if (f & OPF_INPLACE1) return 1;
    return -1;
}

/* ---- shape rules ---- */

static int shape_fail(const keel_tensor *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int shape_fail(const keel_tensor *t, const char *fmt, ...) {
    char msg[512], shapes[512] = "", buf[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const keel_op_info *info = keel_op_get(t->op);
    for (int i = 0; i < info->arity; i++) {
        const keel_tensor *s = t->src[i];
        size_t len = strlen(shapes);
        snprintf(shapes + len, sizeof shapes - len, "%s src%d '%s' %s %s", i ? "," : "", i, s->name,
                 keel_type_name(s->type), keel_shape_str(s->ne, buf, sizeof buf));
    }
    return keel_fail("%s: %s (%s)", info->name, msg, shapes);
}

#define REQ(cond, ...)                                                                                                 \
    do {                                                                                                               \
        if (!(cond)) return shape_fail(t, __VA_ARGS__);                                                                \
    } while (0)

/* i32 positions [n0, n1]: the model's per-token positions, which also mark where examples start */
static bool is_positions(const keel_tensor *p, int64_t n0, int64_t n1) {
    return p->type == KEEL_I32 && p->ne[0] == n0 && p->ne[1] == n1 && p->ne[2] == 1 && p->ne[3] == 1;
}

static bool can_repeat(const keel_tensor *small, const int64_t *ne) {
    for (int i = 0; i < 4; i++)
        if (small->ne[i] <= 0 || ne[i] % small->ne[i] != 0) return false;
    return true;
}

static void alias(keel_tensor *t, keel_tensor *s) {
    t->view_src = keel_root(s);
    t->view_offs = s->view_offs;
    memcpy(t->nb, s->nb, sizeof t->nb);
}

static void set_shape(keel_tensor *t, keel_type type, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    t->type = type;
    t->ne[0] = n0, t->ne[1] = n1, t->ne[2] = n2, t->ne[3] = n3;
}

static int check_window(keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    REQ(keel_is_contiguous(a), "src0 must be contiguous (the window strides are in its layout)");
    REQ(a->type == b->type, "types differ");
    REQ(t->ip[3] >= 0, "negative offset %lld", (long long)t->ip[3]);
    int64_t last = t->ip[3] + (b->ne[0] - 1) * (int64_t)keel_type_size(a->type);
    for (int i = 1; i < 4; i++) {
        REQ(t->ip[i - 1] >= 0, "negative window stride nb%d", i);
        last += (b->ne[i] - 1) * t->ip[i - 1];
    }
    REQ(last + (int64_t)keel_type_size(a->type) <= (int64_t)keel_nbytes(a),
        "window (offset %lld, nb %lld,%lld,%lld) ends at byte %lld, past src0's %zu bytes", (long long)t->ip[3],
        (long long)t->ip[0], (long long)t->ip[1], (long long)t->ip[2],
        (long long)(last + (int64_t)keel_type_size(a->type)), keel_nbytes(a));
    return 0;
}

static int shape_rule(keel_tensor *t) {
    keel_tensor *a = t->src[0], *b = t->src[1];
    const int op = t->op;
    switch (keel_op_get(op)->family) { /* families first: their ops need no case of their own */
    case FAM_UNARY:
        REQ(keel_type_is_float(a->type), "src0 must be real");
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case FAM_BINARY:
        REQ(a->type == b->type && keel_type_is_float(a->type), "types differ or are not real");
        REQ(can_repeat(b, a->ne), "src1 does not broadcast over src0");
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    default:
        break;
    }
    switch (op) {
    case KEEL_OP_VIEW: {
        int64_t ne[4], nb[4];
        for (int i = 0; i < 4; i++) ne[i] = t->ip[i], nb[i] = t->ip[4 + i];
        for (int i = 0; i < 4; i++)
            REQ(ne[i] > 0 && nb[i] >= 0, "ne[%d]=%lld nb[%d]=%lld invalid", i, (long long)ne[i], i, (long long)nb[i]);
        /* ip9: the view's own element type, over a backward op's packed result only (a part of another
         * type than the whole's, as RMS_NORM_W_BACK's bf16 part; no gradient flows through it) */
        keel_type vt = t->ip[9] ? (keel_type)t->ip[9] : a->type;
        keel_tensor *root = keel_root(a);
        REQ(vt == a->type ||
                (t->ip[9] > 0 && t->ip[9] < KEEL_TYPE_COUNT && (keel_op_get(root->op)->flags & OPF_BACKWARD)),
            "view type (ip9) %lld: src0's, or another over a backward op's packed result", (long long)t->ip[9]);
        REQ(nb[0] == (int64_t)keel_type_size(vt), "nb[0] must be the element size");
        t->type = vt;
        memcpy(t->ne, ne, sizeof ne);
        memcpy(t->nb, nb, sizeof nb);
        REQ(t->ip[8] >= 0, "negative offset");
        t->view_src = root;
        t->view_offs = a->view_offs + t->ip[8];
        REQ(t->view_offs + (int64_t)keel_nbytes(t) <= (int64_t)keel_nbytes(root),
            "view [offset %lld, %zu bytes] is outside its root's %zu bytes", (long long)t->view_offs, keel_nbytes(t),
            keel_nbytes(root));
        return 0;
    }
    case KEEL_OP_RESHAPE: {
        REQ(keel_is_contiguous(a), "src0 must be contiguous");
        REQ(t->ip[0] * t->ip[1] * t->ip[2] * t->ip[3] == keel_nelements(a) && t->ip[0] > 0 && t->ip[1] > 0 &&
                t->ip[2] > 0 && t->ip[3] > 0,
            "element count %lld != [%lld,%lld,%lld,%lld]", (long long)keel_nelements(a), (long long)t->ip[0],
            (long long)t->ip[1], (long long)t->ip[2], (long long)t->ip[3]);
        set_shape(t, a->type, t->ip[0], t->ip[1], t->ip[2], t->ip[3]);
        keel_set_contiguous_strides(t);
        t->view_src = keel_root(a);
        t->view_offs = a->view_offs;
        return 0;
    }
    case KEEL_OP_PERMUTE: {
        int seen = 0;
        for (int i = 0; i < 4; i++) {
            REQ(t->ip[i] >= 0 && t->ip[i] < 4 && !(seen & (1 << t->ip[i])), "axes are not a permutation of 0..3");
            seen |= 1 << t->ip[i];
        }
        t->type = a->type;
        for (int i = 0; i < 4; i++) t->ne[t->ip[i]] = a->ne[i], t->nb[t->ip[i]] = a->nb[i];
        t->view_src = keel_root(a);
        t->view_offs = a->view_offs;
        return 0;
    }
    case KEEL_OP_TRANSPOSE:
        alias(t, a);
        set_shape(t, a->type, a->ne[1], a->ne[0], a->ne[2], a->ne[3]);
        t->nb[0] = a->nb[1], t->nb[1] = a->nb[0];
        return 0;
    case KEEL_OP_SHADOW:
        REQ(a->type == KEEL_BF16 && (b->type == KEEL_F32 || b->type == KEEL_F64) && keel_same_shape(a, b),
            "src0 must be bf16 and src1 float32 (float64 on the reference backend) of its shape");
        alias(t, a);
        set_shape(t, KEEL_BF16, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_CPY:
        REQ(keel_same_shape(a, b), "shapes differ");
        alias(t, b);
        set_shape(t, b->type, b->ne[0], b->ne[1], b->ne[2], b->ne[3]);
        return 0;
    case KEEL_OP_CONT:
    case KEEL_OP_DUP:
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_CAST:
        REQ(keel_type_is_float(a->type), "src0 must be real");
        REQ(t->ip[0] >= 0 && t->ip[0] < KEEL_TYPE_COUNT && keel_type_is_float((keel_type)t->ip[0]),
            "ip0 %lld is not a real type", (long long)t->ip[0]);
        set_shape(t, (keel_type)t->ip[0], a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_GET_ROWS:
        REQ(b->type == KEEL_I32, "ids must be i32");
        REQ(a->ne[2] == 1 && a->ne[3] == 1 && b->ne[2] == 1 && b->ne[3] == 1, "src0 must be 2-D, ids at most 2-D");
        set_shape(t, a->type, a->ne[0], b->ne[0], b->ne[1], 1);
        return 0;
    case KEEL_OP_GET_ROWS_BACK:
        REQ(b->type == KEEL_I32, "ids must be i32");
        REQ(a->ne[1] == b->ne[0] && a->ne[2] == b->ne[1] && a->ne[3] == 1, "dy rows do not match the ids");
        REQ(t->ip[0] > 0, "row count must be positive");
        set_shape(t, a->type, a->ne[0], t->ip[0], 1, 1);
        return 0;
    case KEEL_OP_GET_ROWS_BACK_ADD: {
        const keel_tensor *c = t->src[2];
        REQ(b->type == KEEL_I32, "ids must be i32");
        REQ(a->ne[1] == b->ne[0] && a->ne[2] == b->ne[1] && a->ne[3] == 1, "dy rows do not match the ids");
        REQ(c->type == a->type && c->ne[0] == a->ne[0] && c->ne[1] > 0 && c->ne[2] == 1 && c->ne[3] == 1,
            "the addend must be %s [%lld, rows]", keel_type_name(a->type), (long long)a->ne[0]);
        set_shape(t, a->type, c->ne[0], c->ne[1], 1, 1);
        return 0;
    }
    case KEEL_OP_ACC:
    case KEEL_OP_SET: {
        int r = check_window(t);
        if (r) return r;
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        if (t->ip[4]) alias(t, a);
        return 0;
    }
    case KEEL_OP_FILL:
        for (int i = 0; i < 4; i++) REQ(t->ip[i] > 0, "ne[%d] must be positive", i);
        t->ne[0] = t->ip[0], t->ne[1] = t->ip[1], t->ne[2] = t->ip[2], t->ne[3] = t->ip[3];
        return 0; /* type set by keel_fill */
    case KEEL_OP_REPEAT:
        REQ(can_repeat(a, t->ip), "src0 does not tile [%lld,%lld,%lld,%lld]", (long long)t->ip[0], (long long)t->ip[1],
            (long long)t->ip[2], (long long)t->ip[3]);
        set_shape(t, a->type, t->ip[0], t->ip[1], t->ip[2], t->ip[3]);
        return 0;
    case KEEL_OP_REPEAT_BACK: {
        keel_tensor tmp = {0};
        for (int i = 0; i < 4; i++) tmp.ne[i] = t->ip[i];
        REQ(can_repeat(&tmp, a->ne), "[%lld,%lld,%lld,%lld] does not tile src0", (long long)t->ip[0],
            (long long)t->ip[1], (long long)t->ip[2], (long long)t->ip[3]);
        set_shape(t, a->type, t->ip[0], t->ip[1], t->ip[2], t->ip[3]);
        return 0;
    }
    case KEEL_OP_CONCAT: {
        int d = (int)t->ip[0];
        REQ(d >= 0 && d < 4, "dim %d out of range", d);
        REQ(a->type == b->type, "types differ");
        REQ(t->ip[1] == 0 || (t->ip[1] == KEEL_BF16 && a->type == KEEL_F32),
            "result type %lld: 0 (the sources') or bf16 for float32 sources", (long long)t->ip[1]);
        for (int i = 0; i < 4; i++) REQ(i == d || a->ne[i] == b->ne[i], "dim %d differs", i);
        set_shape(t, t->ip[1] ? KEEL_BF16 : a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        t->ne[d] += b->ne[d];
        return 0;
    }
    case KEEL_OP_RMS_NORM:
    case KEEL_OP_L2_NORM:
    case KEEL_OP_SOFT_MAX:
        REQ(keel_type_is_float(a->type), "src0 must be real");
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_SOFT_MAX_CAUSAL:
        REQ(keel_type_is_float(a->type), "src0 must be real");
        REQ(a->ne[0] >= a->ne[1], "fewer keys (%lld) than queries (%lld)", (long long)a->ne[0], (long long)a->ne[1]);
        REQ(is_positions(b, a->ne[1], a->ne[3]), "positions must be i32 [%lld,%lld] (queries, batch)",
            (long long)a->ne[1], (long long)a->ne[3]);
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_DROPOUT:
        REQ(keel_type_is_float(a->type), "src0 must be real");
        REQ(t->fp[0] >= 0 && t->fp[0] < 1 && t->ip[3] == keel_dropout_threshold(t->fp[0]),
            "p %g must be in [0, 1) with threshold round(2^32 p)", t->fp[0]);
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_SWIGLU_BACK:
        REQ(a->type == b->type && a->type == t->src[2]->type && keel_type_is_float(a->type),
            "gate, up and dy must have one real type");
        REQ(keel_same_shape(a, b) && keel_same_shape(a, t->src[2]), "gate, up and dy must have one shape");
        REQ(t->ip[0] == 0 || (t->ip[0] == KEEL_BF16 && a->type == KEEL_F32),
            "result type %lld: 0 (the sources') or bf16 for float32 sources", (long long)t->ip[0]);
        set_shape(t, t->ip[0] ? KEEL_BF16 : a->type, 2 * keel_nelements(a), 1, 1, 1);
        return 0;
    case KEEL_OP_SWIGLU:
        REQ(a->type == b->type && keel_same_shape(a, b), "src0 and src1 must have one type and shape");
        REQ(t->ip[0] == 0 || (t->ip[0] == KEEL_BF16 && a->type == KEEL_F32),
            "result type %lld: 0 (the sources') or bf16 for float32 sources", (long long)t->ip[0]);
        set_shape(t, t->ip[0] ? KEEL_BF16 : a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_GDN_GATE:
    case KEEL_OP_GDN_GATE_BACK: {
        REQ(keel_type_is_float(a->type) && a->type == b->type && a->type == t->src[2]->type,
            "a, A_log and dt_bias must have one real type");
        REQ(keel_nelements(b) == a->ne[0] && b->ne[0] == a->ne[0] && keel_nelements(t->src[2]) == a->ne[0] &&
                t->src[2]->ne[0] == a->ne[0],
            "A_log and dt_bias must hold one value a head: [%lld], a's rows", (long long)a->ne[0]);
        if (op == KEEL_OP_GDN_GATE) {
            set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
            return 0;
        }
        REQ(t->src[3]->type == a->type && keel_same_shape(t->src[3], a), "dy must be shaped like a");
        set_shape(t, a->type, keel_nelements(a) + 2 * a->ne[0], 1, 1, 1);
        return 0;
    }
    case KEEL_OP_SIGMOID_MUL_BACK:
        REQ(keel_same_shape(a, t->src[2]) && t->src[2]->type == a->type, "dy must be shaped like x");
        /* fall through */
    case KEEL_OP_SIGMOID_MUL:
        REQ(a->type == b->type && keel_same_shape(a, b) && keel_type_is_float(a->type),
            "x and gate must have one real type and shape");
        if (op == KEEL_OP_SIGMOID_MUL) {
            REQ(t->ip[0] == 0 || (t->ip[0] == KEEL_BF16 && a->type == KEEL_F32),
                "result type %lld: 0 (the sources') or bf16 for float32 sources", (long long)t->ip[0]);
            set_shape(t, t->ip[0] ? KEEL_BF16 : a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        } else
            set_shape(t, a->type, 2 * keel_nelements(a), 1, 1, 1);
        return 0;
    case KEEL_OP_SILU_BACK:
    case KEEL_OP_SIGMOID_BACK:
    case KEEL_OP_RMS_NORM_BACK:
    case KEEL_OP_L2_NORM_BACK:
    case KEEL_OP_SOFT_MAX_BACK:
        REQ(a->type == b->type && keel_same_shape(a, b), "src0 and src1 must have one type and shape");
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_SUM:
        set_shape(t, a->type, 1, 1, 1, 1);
        return 0;
    case KEEL_OP_SUM_ROWS:
    case KEEL_OP_MEAN:
        set_shape(t, a->type, 1, a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_MUL_MAT:
    case KEEL_OP_MUL_MAT_ADD:
    case KEEL_OP_OUT_PROD: {
        REQ(a->type == b->type && keel_type_is_float(a->type), "the sources must have one real type");
        /* bf16 operands, float32 sums: the result in float32 or rounded to bf16 (the type parameter) */
        int64_t rt = t->ip[op == KEEL_OP_OUT_PROD ? 2 : 0];
        keel_type out = a->type;
        if (a->type == KEEL_BF16) {
            REQ(rt == KEEL_F32 || rt == KEEL_BF16 || rt == KEEL_F64,
                "result type %lld: f32 or bf16 (f64 on ref) for bf16 sources", (long long)rt);
            out = (keel_type)rt;
        } else {
            REQ(rt == 0, "a result type is given only for bf16 sources");
        }
        if (op != KEEL_OP_OUT_PROD) {
            REQ(a->ne[0] == b->ne[0], "inner dimensions differ (%lld vs %lld)", (long long)a->ne[0],
                (long long)b->ne[0]);
            REQ(b->ne[2] % a->ne[2] == 0 && b->ne[3] % a->ne[3] == 0, "src0 dims 2,3 do not broadcast over src1's");
            set_shape(t, out, a->ne[1], b->ne[1], b->ne[2], b->ne[3]);
            if (op == KEEL_OP_MUL_MAT_ADD) {
                const keel_tensor *c = t->src[2];
                REQ(out != KEEL_BF16, "the result of a product plus an addend is not bf16 (the residual stays wide)");
                REQ(c->type == out && keel_same_shape(c, t),
                    "the addend must be %s [%lld,%lld,%lld,%lld], the product's", keel_type_name(out),
                    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
            }
        } else {
            REQ(a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] && a->ne[3] == b->ne[3], "dims 1..3 differ");
            REQ(t->ip[0] > 0 && t->ip[1] > 0 && a->ne[2] % t->ip[0] == 0 && a->ne[3] % t->ip[1] == 0,
                "result dims 2,3 (%lld,%lld) must divide the sources'", (long long)t->ip[0], (long long)t->ip[1]);
            set_shape(t, out, a->ne[0], b->ne[0], t->ip[0], t->ip[1]);
        }
        return 0;
    }
    case KEEL_OP_ROPE:
    case KEEL_OP_ROPE_BACK:
        REQ(is_positions(b, a->ne[2], 1) || is_positions(b, a->ne[2], a->ne[3]),
            "positions must be i32 [%lld] or [%lld,%lld] (ne2, ne3 of src0)", (long long)a->ne[2], (long long)a->ne[2],
            (long long)a->ne[3]);
        REQ(t->ip[0] > 0 && t->ip[0] % 2 == 0 && t->ip[0] <= a->ne[0], "n_rot %lld must be even and <= %lld",
            (long long)t->ip[0], (long long)a->ne[0]);
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        return 0;
    case KEEL_OP_CONV1D:
        REQ(a->type == b->type, "types differ");
        REQ(a->ne[3] == 1 && b->ne[1] == a->ne[0] && b->ne[2] == 1 && b->ne[3] == 1, "want x [C,T,B] and w [K,C]");
        REQ(is_positions(t->src[2], a->ne[1], a->ne[2]), "positions must be i32 [T,B]");
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], 1);
        return 0;
    case KEEL_OP_CONV1D_BACK_INPUT:
        REQ(a->type == b->type && a->ne[3] == 1 && b->ne[1] == a->ne[0], "want dy [C,T,B] and w [K,C]");
        REQ(is_positions(t->src[2], a->ne[1], a->ne[2]), "positions must be i32 [T,B]");
        REQ(t->ip[0] == 0 || (t->ip[0] == KEEL_BF16 && a->type == KEEL_F32),
            "result type %lld: 0 (the sources') or bf16 for float32 sources", (long long)t->ip[0]);
        set_shape(t, t->ip[0] ? KEEL_BF16 : a->type, a->ne[0], a->ne[1], a->ne[2], 1);
        return 0;
    case KEEL_OP_CONV1D_BACK_WEIGHT:
        REQ(a->type == b->type && keel_same_shape(a, b) && a->ne[3] == 1, "want x and dy of one shape [C,T,B]");
        REQ(is_positions(t->src[2], a->ne[1], a->ne[2]), "positions must be i32 [T,B]");
        REQ(t->ip[0] > 0, "kernel size must be positive");
        set_shape(t, a->type, t->ip[0], a->ne[0], 1, 1);
        return 0;
    case KEEL_OP_RMS_NORM_W:
    case KEEL_OP_RMS_NORM_W_BACK:
    case KEEL_OP_RMS_NORM_W_BACK_ADD:
    case KEEL_OP_GATED_RMS_NORM:
    case KEEL_OP_GATED_RMS_NORM_BACK: {
        bool gated = op == KEEL_OP_GATED_RMS_NORM || op == KEEL_OP_GATED_RMS_NORM_BACK;
        bool back =
            op == KEEL_OP_RMS_NORM_W_BACK || op == KEEL_OP_RMS_NORM_W_BACK_ADD || op == KEEL_OP_GATED_RMS_NORM_BACK;
        REQ(keel_type_is_float(a->type) && b->type == a->type, "x and w must have one real type");
        REQ(b->ne[0] == a->ne[0] && keel_nelements(b) == a->ne[0], "w must hold one weight per element of a row (%lld)",
            (long long)a->ne[0]);
        if (gated) REQ(keel_same_shape(t->src[2], a) && t->src[2]->type == a->type, "z must be shaped like x");
        REQ(t->fp[0] >= 0 && isfinite(t->fp[0]), "eps %g must be finite and >= 0", t->fp[0]);
        REQ(gated ? t->ip[0] == 0 : (t->ip[0] == 0 || t->ip[0] == 1), "ip0 %lld: 1 for the 1 + w form, else 0",
            (long long)t->ip[0]);
        REQ(t->ip[1] == 0 || (t->ip[1] == KEEL_BF16 && a->type == KEEL_F32),
            "%s (ip1) %lld: 0, or bf16 for a float32 x", back ? "the bf16 part" : "result type", (long long)t->ip[1]);
        if (!back) {
            set_shape(t, t->ip[1] ? KEEL_BF16 : a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        } else {
            const keel_tensor *dy = t->src[gated ? 3 : 2];
            REQ(keel_same_shape(dy, a) && dy->type == a->type, "dy must be shaped like x");
            if (op == KEEL_OP_RMS_NORM_W_BACK_ADD)
                REQ(keel_same_shape(t->src[3], a) && t->src[3]->type == a->type, "g must be shaped like x");
            int64_t N = keel_nelements(a), mid = t->ip[1] ? keel_bf16_part_floats(N) : gated ? N : 0;
            set_shape(t, a->type, N + mid + a->ne[0], 1, 1, 1); /* [dx | dz, or the bf16 part | dw] */
        }
        return 0;
    }
    case KEEL_OP_QK_NORM_ROPE:
    case KEEL_OP_QK_NORM_ROPE_BACK: {
        const keel_tensor *p = t->src[2];
        REQ(keel_type_is_float(a->type) && b->type == a->type, "x and w must have one real type");
        REQ(b->ne[0] == a->ne[0] && keel_nelements(b) == a->ne[0], "w must hold one weight per element of a row (%lld)",
            (long long)a->ne[0]);
        REQ(is_positions(p, a->ne[2], 1) || is_positions(p, a->ne[2], a->ne[3]),
            "positions must be i32 [%lld] or [%lld,%lld] (ne2, ne3 of x)", (long long)a->ne[2], (long long)a->ne[2],
            (long long)a->ne[3]);
        REQ(t->fp[0] >= 0 && isfinite(t->fp[0]), "eps %g must be finite and >= 0", t->fp[0]);
        REQ(t->fp[1] > 0 && isfinite(t->fp[1]), "theta %g must be finite and > 0", t->fp[1]);
        REQ(t->ip[0] == 0 || t->ip[0] == 1, "ip0 %lld: 1 for the 1 + w form, else 0", (long long)t->ip[0]);
        REQ(t->ip[1] > 0 && t->ip[1] % 2 == 0 && t->ip[1] <= a->ne[0], "n_rot %lld must be even and <= %lld",
            (long long)t->ip[1], (long long)a->ne[0]);
        if (op == KEEL_OP_QK_NORM_ROPE) {
            REQ(t->ip[2] == 0 || (t->ip[2] == KEEL_BF16 && a->type == KEEL_F32),
                "result type (ip2) %lld: 0 (x's), or bf16 for a float32 x", (long long)t->ip[2]);
            set_shape(t, t->ip[2] ? KEEL_BF16 : a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        } else {
            REQ(keel_same_shape(t->src[3], a) && t->src[3]->type == a->type, "dy must be shaped like x");
            set_shape(t, a->type, 2 * keel_nelements(a), 1, 1, 1);
        }
        return 0;
    }
    case KEEL_OP_GDN_CONV:
    case KEEL_OP_GDN_CONV_BACK: {
        int64_t C = a->ne[0], n = t->ip[0], d = t->ip[1];
        REQ(keel_type_is_float(a->type) && b->type == a->type, "x and w must have one real type");
        REQ(a->ne[3] == 1 && b->ne[1] == C && b->ne[2] == 1 && b->ne[3] == 1, "want x [C,T,B] and w [K,C]");
        REQ(is_positions(t->src[2], a->ne[1], a->ne[2]), "positions must be i32 [T,B]");
        REQ(d > 0 && n >= 0 && n % d == 0 && 2 * n <= C,
            "%lld channels of q and of k in heads of %lld: want a multiple of the head, and 2n <= %lld channels",
            (long long)n, (long long)d, (long long)C);
        REQ(t->fp[0] >= 0 && isfinite(t->fp[0]) && isfinite(t->fp[1]), "eps %g must be >= 0, the scale %g finite",
            t->fp[0], t->fp[1]);
        if (op == KEEL_OP_GDN_CONV_BACK)
            REQ(keel_same_shape(t->src[3], a) && t->src[3]->type == a->type, "dy must be shaped like x");
        set_shape(t, a->type, C, a->ne[1], a->ne[2], 1);
        return 0;
    }
    case KEEL_OP_GATED_DELTA_NET:
    case KEEL_OP_GATED_DELTA_NET_STATE:
    case KEEL_OP_GATED_DELTA_NET_BACK: {
        keel_tensor *k = t->src[1], *v = t->src[2], *g = t->src[3], *be = t->src[4];
        int64_t Dk = a->ne[0], Hk = a->ne[1], T = a->ne[2], B = a->ne[3], Dv = v->ne[0], Hv = v->ne[1];
        REQ(keel_same_shape(a, k), "q and k shapes differ");
        REQ(v->ne[2] == T && v->ne[3] == B, "v must be [Dv,Hv,%lld,%lld]", (long long)T, (long long)B);
        REQ(Hv % Hk == 0, "value heads (%lld) must be a multiple of key heads (%lld)", (long long)Hv, (long long)Hk);
        REQ(g->ne[0] == Hv && g->ne[1] == T && g->ne[2] == B && keel_same_shape(g, be), "g and beta must be [Hv,T,B]");
        for (int i = 1; i < 5; i++) REQ(t->src[i]->type == a->type, "types differ");
        REQ(is_positions(t->src[5], T, B), "positions must be i32 [T,B]");
        REQ(t->ip[0] >= KEEL_GDN_FLOAT32 && t->ip[0] <= KEEL_GDN_BF16_GRAD,
            "ip0 (the products: 0 float32, 1 split TF32, 2 split bf16, 3 split bf16 with a one-part bf16 backward) "
            "must be 0 to 3, not %lld",
            (long long)t->ip[0]);
        if (op == KEEL_OP_GATED_DELTA_NET) {
            set_shape(t, a->type, Dv, Hv, T, B);
        } else if (op == KEEL_OP_GATED_DELTA_NET_STATE) {
            const keel_tensor *s0 = t->src[6];
            REQ(s0->type == a->type && s0->ne[0] == Dv && s0->ne[1] == Dk && s0->ne[2] == Hv && s0->ne[3] == B,
                "S0 must be [Dv,Dk,Hv,B]");
            set_shape(t, a->type, Dv * Hv * T * B + Dv * Dk * Hv * B, 1, 1, 1);
        } else {
            REQ(keel_same_shape(t->src[6], v) && t->src[6]->type == a->type, "do must be shaped like v");
            set_shape(t, a->type, (2 * Dk * Hv + Dv * Hv + 2 * Hv) * T * B, 1, 1, 1);
        }
        return 0;
    }
    case KEEL_OP_FLASH_ATTN:
    case KEEL_OP_FLASH_ATTN_BACK: {
        const keel_tensor *k = b, *v = t->src[2], *p = t->src[3];
        int64_t D = a->ne[0], H = a->ne[1], Tq = a->ne[2], B = a->ne[3], KV = k->ne[1], Tk = k->ne[2], Dv = v->ne[0];
        REQ(keel_type_is_float(a->type) && k->type == a->type && v->type == a->type,
            "q, k and v must have one real type");
        REQ(k->ne[0] == D && k->ne[3] == B, "k must be [%lld,KV,Tk,%lld] (q's head size and batch)", (long long)D,
            (long long)B);
        REQ(v->ne[1] == KV && v->ne[2] == Tk && v->ne[3] == B, "v must be [Dv,%lld,%lld,%lld] (k's heads, keys, batch)",
            (long long)KV, (long long)Tk, (long long)B);
        REQ(KV > 0 && H % KV == 0, "query heads (%lld) must be a multiple of kv heads (%lld)", (long long)H,
            (long long)KV);
        REQ(Tk >= Tq, "fewer keys (%lld) than queries (%lld)", (long long)Tk, (long long)Tq);
        REQ(is_positions(p, Tq, B), "positions must be i32 [%lld,%lld] (queries, batch)", (long long)Tq, (long long)B);
        REQ(t->fp[0] > 0 && isfinite(t->fp[0]), "the scale fp0 %g must be finite and > 0", t->fp[0]);
        /* the softmax, sums and gradients in float32 at least: bf16 sources give ip0's type */
        keel_type out = a->type == KEEL_BF16 ? (keel_type)t->ip[0] : a->type;
        REQ(a->type != KEEL_BF16 || out == KEEL_F32 || out == KEEL_F64, "the result's type ip0 must be f32 or f64");
        int64_t n_out = (Dv + 1) * H * Tq * B;
        if (op == KEEL_OP_FLASH_ATTN) {
            set_shape(t, out, n_out, 1, 1, 1);
        } else {
            const keel_tensor *dy = t->src[5];
            REQ(keel_nelements(t->src[4]) == n_out && t->src[4]->type == out && keel_is_contiguous(t->src[4]),
                "src4 must be the forward's packed output: %s [%lld], contiguous", keel_type_name(out),
                (long long)n_out);
            /* the gradient of [o | lse], or of o alone (lse's then 0: what the backward gives when only
             * o is read, without a zero FILL and an ACC of do into it) */
            REQ((keel_nelements(dy) == n_out || keel_nelements(dy) == n_out - H * Tq * B) && dy->type == out &&
                    keel_is_contiguous(dy),
                "src5 must be the gradient of the forward's packed output, or of its o: %s [%lld] or [%lld], "
                "contiguous",
                keel_type_name(out), (long long)n_out, (long long)(n_out - H * Tq * B));
            set_shape(t, out, keel_nelements(a) + keel_nelements(k) + keel_nelements(v), 1, 1, 1);
        }
        return 0;
    }
    case KEEL_OP_CROSS_ENTROPY_LOSS:
    case KEEL_OP_CROSS_ENTROPY_LOSS_BACK:
        REQ(b->type == KEEL_I32, "targets must be i32");
        REQ(keel_nelements(b) == keel_nrows(a), "%lld targets for %lld rows of logits", (long long)keel_nelements(b),
            (long long)keel_nrows(a));
        REQ(t->fp[0] >= 0 && isfinite(t->fp[0]), "the divisor fp0 %g must be finite and >= 0", t->fp[0]);
        if (op == KEEL_OP_CROSS_ENTROPY_LOSS) {
            set_shape(t, a->type, 1, 1, 1, 1);
        } else {
            REQ(keel_nelements(t->src[2]) == 1 && t->src[2]->type == a->type, "dloss must be one element");
            set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        }
        return 0;
    case KEEL_OP_LINEAR_CROSS_ENTROPY:
    case KEEL_OP_LINEAR_CROSS_ENTROPY_BACK: {
        const keel_tensor *tg = t->src[2];
        REQ(a->type == b->type && keel_type_is_float(a->type), "x and W must have one real type");
        REQ(a->ne[0] == b->ne[0] && b->ne[2] == 1 && b->ne[3] == 1 && a->ne[3] == 1, "want x [D,N1,N2] and W [D,V]");
        REQ(tg->type == KEEL_I32 && keel_nelements(tg) == a->ne[1] * a->ne[2], "targets must be i32, one per token");
        REQ(t->ip[0] > 0, "the chunk (tokens at a time) must be positive");
        REQ(t->fp[0] >= 0 && isfinite(t->fp[0]), "the divisor fp0 %g must be finite and >= 0", t->fp[0]);
        keel_type out = a->type == KEEL_BF16 ? KEEL_F32 : a->type; /* sums and gradients in float32 */
        REQ(t->ip[1] == 0 || t->ip[1] == 1, "ip1 (the gradients in the result) must be 0 or 1, not %lld",
            (long long)t->ip[1]);
        REQ(t->ip[2] == 0 || (t->ip[2] == 1 && t->ip[1] == 1),
            "ip2 (gradients skipped) must be 0, or 1 with ip1 1, not %lld", (long long)t->ip[2]);
        if (op == KEEL_OP_LINEAR_CROSS_ENTROPY) { /* the loss, or [dx | dW | loss] */
            set_shape(t, out, t->ip[1] ? a->ne[0] * a->ne[1] * a->ne[2] + b->ne[0] * b->ne[1] + 1 : 1, 1, 1, 1);
        } else {
            REQ(keel_nelements(t->src[3]) == 1 && t->src[3]->type == out, "dloss must be one %s element",
                keel_type_name(out));
            set_shape(t, out, a->ne[0] * a->ne[1] * a->ne[2] + b->ne[0] * b->ne[1], 1, 1, 1);
        }
        return 0;
    }
    case KEEL_OP_SUM_SQ: /* float32 (float64 on the reference backend) */
        REQ((a->type == KEEL_F32 || a->type == KEEL_F64) && keel_is_contiguous(a), "x must be contiguous float32");
        set_shape(t, a->type, 1, 1, 1, 1);
        return 0;
    case KEEL_OP_ADAMW:
    case KEEL_OP_ADAMW_SHADOW:
        for (int i = 1; i < 4; i++)
            REQ(keel_same_shape(a, t->src[i]) && t->src[i]->type == a->type && keel_is_contiguous(t->src[i]),
                "p, g, m, v must be contiguous float32 of one shape");
        REQ((a->type == KEEL_F32 || a->type == KEEL_F64) && keel_is_contiguous(a),
            "p, g, m, v must be contiguous float32 of one shape");
        REQ(keel_nelements(t->src[4]) == 1 && t->src[4]->type == a->type, "s (the SUM_SQ) must be one %s",
            keel_type_name(a->type));
        if (op == KEEL_OP_ADAMW_SHADOW)
            REQ(t->ip[3] >= 0 && t->ip[3] < t->ip[2] && t->src[5]->type == KEEL_BF16 && keel_is_contiguous(t->src[5]) &&
                    keel_nelements(t->src[5]) == t->ip[2] - t->ip[3],
                "c (the weights' bf16 copies) must be contiguous bf16 of ip2 - ip3 = %lld - %lld elements",
                (long long)t->ip[2], (long long)t->ip[3]);
        REQ(t->ip[0] >= 1, "step must be >= 1");
        REQ(t->ip[1] >= 1, "the divisor %lld must be >= 1", (long long)t->ip[1]);
        REQ(t->ip[2] >= 0 && t->ip[2] <= keel_nelements(a), "the decay end %lld is outside [0, %lld]",
            (long long)t->ip[2], (long long)keel_nelements(a));
        REQ(t->fp[5] >= 0, "clip %g must be >= 0", t->fp[5]);
        set_shape(t, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
        alias(t, a);
        return 0;
    default:
        return shape_fail(t, "no shape rule");
    }
}

keel_tensor keel_acc_window(const keel_tensor *t) {
    keel_tensor w = *t->src[1];
    w.type = t->type;
    w.nb[0] = (int64_t)keel_type_size(t->type);
    w.nb[1] = t->ip[0], w.nb[2] = t->ip[1], w.nb[3] = t->ip[2];
    w.data = (char *)t->data + t->ip[3];
    w.view_src = NULL;
    return w;
}

static void default_name(keel_tensor *t) {
    const char *n = keel_op_get(t->op)->name;
    size_t i = 0;
    for (; n[i] && i < 40; i++) t->name[i] = (char)tolower((unsigned char)n[i]);
    snprintf(t->name + i, sizeof t->name - i, "#%lld", (long long)t->id);
}

keel_tensor *keel_op_new(keel_ctx *ctx, int op, keel_tensor *const *src, int n_src, const int64_t *ip, int n_ip,
                         const double *fp, int n_fp) {
    const keel_op_info *info = keel_op_get(op);
    if (!info || op == KEEL_OP_NONE) {
        keel_fail("keel_op_new: bad op %d", op);
        return NULL;
    }
    if (n_src != info->arity) {
        keel_fail("%s: %d sources given, %d expected", info->name, n_src, info->arity);
        return NULL;
    }
    if (n_ip > KEEL_MAX_IP || n_fp > KEEL_MAX_FP) {
        keel_fail("%s: too many parameters", info->name);
        return NULL;
    }
    for (int i = 0; i < n_src; i++)
        if (!src[i]) return NULL; /* an earlier constructor failed: its message stands */
    keel_tensor *t = keel_tensor_alloc(ctx);
    if (!t) return NULL;
    t->op = op;
    for (int i = 0; i < n_src; i++) t->src[i] = src[i];
    for (int i = 0; i < n_ip; i++) t->ip[i] = ip[i];
    for (int i = 0; i < n_fp; i++) t->fp[i] = fp[i];
    t->type = n_src ? src[0]->type : KEEL_F32;
    if (shape_rule(t) != 0) return NULL;
    if (keel_op_alias_src(t) < 0) keel_set_contiguous_strides(t);
    default_name(t);
    return t;
}

#define SRCS(...)         ((keel_tensor *const[]){__VA_ARGS__})
#define IPS(...)          ((const int64_t[]){__VA_ARGS__})
#define FPS(...)          ((const double[]){__VA_ARGS__})
#define NARG(T, ...)      (int)(sizeof((T[]){__VA_ARGS__}) / sizeof(T))
#define OP(op, srcs, ...) keel_op_new(ctx, op, SRCS srcs, NARG(keel_tensor *, ECHO srcs), __VA_ARGS__)
#define ECHO(...)         __VA_ARGS__

keel_tensor *keel_fill(keel_ctx *ctx, keel_type type, const int64_t ne[4], double value) {
    keel_tensor *t = keel_op_new(ctx, KEEL_OP_FILL, NULL, 0, ne, 4, FPS(value), 1);
    if (t) {
        t->type = type;
        keel_set_contiguous_strides(t);
    }
    return t;
}

keel_tensor *keel_zeros_like(keel_ctx *ctx, const keel_tensor *t) {
    if (!t) return NULL;
    return keel_fill(ctx, t->type, t->ne, 0.0);
}

keel_tensor *keel_view(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4], const int64_t nb[4], int64_t offset) {
    int64_t ip[9] = {ne[0], ne[1], ne[2], ne[3], nb[0], nb[1], nb[2], nb[3], offset};
    return OP(KEEL_OP_VIEW, (a), ip, 9, NULL, 0);
}
keel_tensor *keel_view_4d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                          int64_t nb1, int64_t nb2, int64_t nb3, int64_t offset) {
    if (!a) return NULL;
    return keel_view(ctx, a, IPS(ne0, ne1, ne2, ne3), IPS((int64_t)keel_type_size(a->type), nb1, nb2, nb3), offset);
}
keel_tensor *keel_view_4d_as(keel_ctx *ctx, keel_tensor *a, keel_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3, int64_t nb1, int64_t nb2, int64_t nb3, int64_t offset) {
    if (a && type == a->type) return keel_view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset);
    if (a && type == KEEL_F32) { /* ip9 0 says "src0's type": float32 over another type is not expressible */
        keel_fail("'%s': a float32 view of a %s tensor (VIEW's ip9 names only types other than float32)", a->name,
                  keel_type_name(a->type));
        return NULL;
    }
    int64_t ip[10] = {ne0, ne1, ne2, ne3, (int64_t)keel_type_size(type), nb1, nb2, nb3, offset, type};
    return OP(KEEL_OP_VIEW, (a), ip, 10, NULL, 0);
}
int64_t keel_bf16_part_floats(int64_t n) { return (n + 7) / 8 * 4; }
keel_tensor *keel_view_3d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t nb1,
                          int64_t nb2, int64_t offset) {
    return keel_view_4d(ctx, a, ne0, ne1, ne2, 1, nb1, nb2, nb2 * ne2, offset);
}
keel_tensor *keel_view_2d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t nb1, int64_t offset) {
    return keel_view_4d(ctx, a, ne0, ne1, 1, 1, nb1, nb1 * ne1, nb1 * ne1, offset);
}
keel_tensor *keel_view_1d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t offset) {
    if (!a) return NULL;
    int64_t es = (int64_t)keel_type_size(a->type);
    return keel_view_4d(ctx, a, ne0, 1, 1, 1, es * ne0, es * ne0, es * ne0, offset);
}
keel_tensor *keel_reshape(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4]) {
    return OP(KEEL_OP_RESHAPE, (a), ne, 4, NULL, 0);
}
keel_tensor *keel_reshape_2d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1) {
    return keel_reshape(ctx, a, IPS(ne0, ne1, 1, 1));
}
keel_tensor *keel_reshape_3d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2) {
    return keel_reshape(ctx, a, IPS(ne0, ne1, ne2, 1));
}
keel_tensor *keel_reshape_4d(keel_ctx *ctx, keel_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    return keel_reshape(ctx, a, IPS(ne0, ne1, ne2, ne3));
}
keel_tensor *keel_permute(keel_ctx *ctx, keel_tensor *a, int ax0, int ax1, int ax2, int ax3) {
    return OP(KEEL_OP_PERMUTE, (a), IPS(ax0, ax1, ax2, ax3), 4, NULL, 0);
}
keel_tensor *keel_transpose(keel_ctx *ctx, keel_tensor *a) { return OP(KEEL_OP_TRANSPOSE, (a), NULL, 0, NULL, 0); }
keel_tensor *keel_cpy(keel_ctx *ctx, keel_tensor *a, keel_tensor *b) {
    return OP(KEEL_OP_CPY, (a, b), NULL, 0, NULL, 0);
}
keel_tensor *keel_cont(keel_ctx *ctx, keel_tensor *a) { return OP(KEEL_OP_CONT, (a), NULL, 0, NULL, 0); }
keel_tensor *keel_dup(keel_ctx *ctx, keel_tensor *a) { return OP(KEEL_OP_DUP, (a), NULL, 0, NULL, 0); }
keel_tensor *keel_cast(keel_ctx *ctx, keel_tensor *a, keel_type type) {
    return OP(KEEL_OP_CAST, (a), IPS((int64_t)type), 1, NULL, 0);
}
keel_tensor *keel_get_rows(keel_ctx *ctx, keel_tensor *a, keel_tensor *ids) {
    return OP(KEEL_OP_GET_ROWS, (a, ids), NULL, 0, NULL, 0);
}
keel_tensor *keel_get_rows_back(keel_ctx *ctx, keel_tensor *dy, keel_tensor *ids, int64_t n_rows) {
    return OP(KEEL_OP_GET_ROWS_BACK, (dy, ids), IPS(n_rows), 1, NULL, 0);
}
keel_tensor *keel_get_rows_back_add(keel_ctx *ctx, keel_tensor *dy, keel_tensor *ids, keel_tensor *c) {
    return OP(KEEL_OP_GET_ROWS_BACK_ADD, (dy, ids, c), NULL, 0, NULL, 0);
}
keel_tensor *keel_acc(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t nb1, int64_t nb2, int64_t nb3,
                      int64_t offset, bool inplace) {
    return OP(KEEL_OP_ACC, (a, b), IPS(nb1, nb2, nb3, offset, inplace), 5, NULL, 0);
}
keel_tensor *keel_set(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t nb1, int64_t nb2, int64_t nb3,
                      int64_t offset, bool inplace) {
    return OP(KEEL_OP_SET, (a, b), IPS(nb1, nb2, nb3, offset, inplace), 5, NULL, 0);
}
keel_tensor *keel_repeat(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4]) {
    return OP(KEEL_OP_REPEAT, (a), ne, 4, NULL, 0);
}
keel_tensor *keel_repeat_back(keel_ctx *ctx, keel_tensor *a, const int64_t ne[4]) {
    return OP(KEEL_OP_REPEAT_BACK, (a), ne, 4, NULL, 0);
}
keel_tensor *keel_concat(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int dim) {
    return keel_concat_to(ctx, a, b, dim, 0);
}
keel_tensor *keel_concat_to(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int dim, int64_t type) {
    return OP(KEEL_OP_CONCAT, (a, b), IPS(dim, type), 2, NULL, 0);
}
keel_tensor *keel_add(keel_ctx *ctx, keel_tensor *a, keel_tensor *b) {
    return OP(KEEL_OP_ADD, (a, b), NULL, 0, NULL, 0);
}
keel_tensor *keel_sub(keel_ctx *ctx, keel_tensor *a, keel_tensor *b) {
    return OP(KEEL_OP_SUB, (a, b), NULL, 0, NULL, 0);
}
keel_tensor *keel_mul(keel_ctx *ctx, keel_tensor *a, keel_tensor *b) {
    return OP(KEEL_OP_MUL, (a, b), NULL, 0, NULL, 0);
}
keel_tensor *keel_div(keel_ctx *ctx, keel_tensor *a, keel_tensor *b) {
    return OP(KEEL_OP_DIV, (a, b), NULL, 0, NULL, 0);
}
keel_tensor *keel_scale(keel_ctx *ctx, keel_tensor *a, double s, double b) {
    return OP(KEEL_OP_SCALE, (a), NULL, 0, FPS(s, b), 2);
}
keel_tensor *keel_unary(keel_ctx *ctx, int op, keel_tensor *a) { return OP(op, (a), NULL, 0, NULL, 0); }
keel_tensor *keel_sqr(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_SQR, a); }
keel_tensor *keel_sqrt(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_SQRT, a); }
keel_tensor *keel_exp(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_EXP, a); }
keel_tensor *keel_log(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_LOG, a); }
keel_tensor *keel_neg(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_NEG, a); }
keel_tensor *keel_silu(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_SILU, a); }
keel_tensor *keel_swiglu(keel_ctx *ctx, keel_tensor *gate, keel_tensor *up) {
    return keel_op_new(ctx, KEEL_OP_SWIGLU, (keel_tensor *const[]){gate, up}, 2, NULL, 0, NULL, 0);
}
keel_tensor *keel_swiglu_bf16(keel_ctx *ctx, keel_tensor *gate, keel_tensor *up) {
    return keel_op_new(ctx, KEEL_OP_SWIGLU, (keel_tensor *const[]){gate, up}, 2, (int64_t[]){KEEL_BF16}, 1, NULL, 0);
}
keel_tensor *keel_sigmoid(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_SIGMOID, a); }
keel_tensor *keel_softplus(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_SOFTPLUS, a); }
keel_tensor *keel_sigmoid_mul(keel_ctx *ctx, keel_tensor *x, keel_tensor *gate) {
    return OP(KEEL_OP_SIGMOID_MUL, (x, gate), NULL, 0, NULL, 0);
}
keel_tensor *keel_sigmoid_mul_bf16(keel_ctx *ctx, keel_tensor *x, keel_tensor *gate) {
    return OP(KEEL_OP_SIGMOID_MUL, (x, gate), IPS(KEEL_BF16), 1, NULL, 0);
}
keel_tensor *keel_sigmoid_back(keel_ctx *ctx, keel_tensor *y, keel_tensor *dy) {
    return OP(KEEL_OP_SIGMOID_BACK, (y, dy), NULL, 0, NULL, 0);
}
keel_tensor *keel_gdn_gate(keel_ctx *ctx, keel_tensor *a, keel_tensor *A_log, keel_tensor *dt_bias) {
    return OP(KEEL_OP_GDN_GATE, (a, A_log, dt_bias), NULL, 0, NULL, 0);
}
keel_tensor *keel_sum(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_SUM, a); }
keel_tensor *keel_sum_rows(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_SUM_ROWS, a); }
keel_tensor *keel_mean(keel_ctx *ctx, keel_tensor *a) { return keel_unary(ctx, KEEL_OP_MEAN, a); }
keel_tensor *keel_dropout(keel_ctx *ctx, keel_tensor *a, double p, uint64_t seed, uint64_t stream) {
    if (!(p >= 0 && p < 1)) {
        keel_fail("dropout probability %g must be in [0, 1)", p);
        return NULL;
    }
    int64_t thr = keel_dropout_threshold(p);
    return OP(KEEL_OP_DROPOUT, (a), IPS((int64_t)seed, (int64_t)stream, 0, thr), 4, FPS(p), 1);
}
void keel_cross_entropy_set_divisor(keel_graph *g, double divisor) {
    for (int64_t i = 0; i < g->n_nodes; i++) {
        int op = g->nodes[i]->op;
        if (op == KEEL_OP_CROSS_ENTROPY_LOSS || op == KEEL_OP_CROSS_ENTROPY_LOSS_BACK ||
            op == KEEL_OP_LINEAR_CROSS_ENTROPY || op == KEEL_OP_LINEAR_CROSS_ENTROPY_BACK)
            g->nodes[i]->fp[0] = divisor;
    }
}
keel_tensor *keel_linear_cross_entropy(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *targets,
                                       int64_t chunk) {
    return OP(KEEL_OP_LINEAR_CROSS_ENTROPY, (x, w, targets), IPS(chunk), 1, NULL, 0);
}
keel_tensor *keel_linear_cross_entropy_with_grads(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *targets,
                                                  int64_t chunk) {
    keel_tensor *pk = OP(KEEL_OP_LINEAR_CROSS_ENTROPY, (x, w, targets), IPS(chunk, 1, 0), 3, NULL, 0);
    if (!pk) return NULL;
    return keel_view_1d(ctx, pk, 1, (keel_nelements(pk) - 1) * (int64_t)keel_type_size(pk->type));
}
void keel_linear_cross_entropy_set_grads(keel_graph *g, bool on) {
    for (int64_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == KEEL_OP_LINEAR_CROSS_ENTROPY && g->nodes[i]->ip[1]) g->nodes[i]->ip[2] = !on;
}
void keel_dropout_set_p(keel_graph *g, double p) {
    for (int64_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == KEEL_OP_DROPOUT) g->nodes[i]->fp[0] = p, g->nodes[i]->ip[3] = keel_dropout_threshold(p);
}
void keel_dropout_set_counter(keel_graph *g, int64_t counter) {
    for (int64_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == KEEL_OP_DROPOUT) g->nodes[i]->ip[2] = counter;
}
keel_tensor *keel_mul_mat(keel_ctx *ctx, keel_tensor *a, keel_tensor *b) {
    return OP(KEEL_OP_MUL_MAT, (a, b), NULL, 0, NULL, 0);
}
keel_tensor *keel_mul_mat_to(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, keel_type out) {
    return OP(KEEL_OP_MUL_MAT, (a, b), IPS((int64_t)out), 1, NULL, 0);
}
keel_tensor *keel_mul_mat_add(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, keel_tensor *c) {
    bool typed = a && c && a->type == KEEL_BF16; /* bf16 operands: the result in the addend's type */
    return OP(KEEL_OP_MUL_MAT_ADD, (a, b, c), typed ? IPS((int64_t)c->type) : NULL, typed ? 1 : 0, NULL, 0);
}
keel_tensor *keel_out_prod(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t ne2, int64_t ne3) {
    return OP(KEEL_OP_OUT_PROD, (a, b), IPS(ne2, ne3), 2, NULL, 0);
}
keel_tensor *keel_out_prod_to(keel_ctx *ctx, keel_tensor *a, keel_tensor *b, int64_t ne2, int64_t ne3, keel_type out) {
    return OP(KEEL_OP_OUT_PROD, (a, b), IPS(ne2, ne3, (int64_t)out), 3, NULL, 0);
}
keel_tensor *keel_rms_norm(keel_ctx *ctx, keel_tensor *a, double eps) {
    return OP(KEEL_OP_RMS_NORM, (a), NULL, 0, FPS(eps), 1);
}
keel_tensor *keel_l2_norm(keel_ctx *ctx, keel_tensor *a, double eps) {
    return OP(KEEL_OP_L2_NORM, (a), NULL, 0, FPS(eps), 1);
}
keel_tensor *keel_soft_max(keel_ctx *ctx, keel_tensor *a, double scale) {
    return OP(KEEL_OP_SOFT_MAX, (a), NULL, 0, FPS(scale), 1);
}
keel_tensor *keel_soft_max_causal(keel_ctx *ctx, keel_tensor *a, keel_tensor *pos, double scale) {
    return OP(KEEL_OP_SOFT_MAX_CAUSAL, (a, pos), NULL, 0, FPS(scale), 1);
}
keel_tensor *keel_rope(keel_ctx *ctx, keel_tensor *a, keel_tensor *pos, int64_t n_rot, double theta) {
    return OP(KEEL_OP_ROPE, (a, pos), IPS(n_rot), 1, FPS(theta), 1);
}
double keel_rope_freq(double theta, int64_t n_rot, int64_t f) {
    float e = (float)(2 * f) / (float)n_rot;
    return (double)(1.0f / powf((float)theta, e));
}

keel_tensor *keel_conv1d(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos) {
    return OP(KEEL_OP_CONV1D, (x, w, pos), NULL, 0, NULL, 0);
}
keel_tensor *keel_qk_norm_rope(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos, double eps,
                               bool one_plus, int64_t n_rot, double theta) {
    return OP(KEEL_OP_QK_NORM_ROPE, (x, w, pos), IPS(one_plus ? 1 : 0, n_rot), 2, FPS(eps, theta), 2);
}
keel_tensor *keel_qk_norm_rope_to(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos, double eps,
                                  bool one_plus, int64_t n_rot, double theta, keel_type out) {
    if (!x || out == x->type) return keel_qk_norm_rope(ctx, x, w, pos, eps, one_plus, n_rot, theta);
    return OP(KEEL_OP_QK_NORM_ROPE, (x, w, pos), IPS(one_plus ? 1 : 0, n_rot, out), 3, FPS(eps, theta), 2);
}
keel_tensor *keel_rms_norm_w(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, double eps, bool one_plus) {
    return OP(KEEL_OP_RMS_NORM_W, (x, w), IPS(one_plus ? 1 : 0), 1, FPS(eps), 1);
}
keel_tensor *keel_rms_norm_w_to(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, double eps, bool one_plus,
                                keel_type out) {
    if (!x || out == x->type) return keel_rms_norm_w(ctx, x, w, eps, one_plus);
    return OP(KEEL_OP_RMS_NORM_W, (x, w), IPS(one_plus ? 1 : 0, out), 2, FPS(eps), 1);
}
keel_tensor *keel_flash_attn(keel_ctx *ctx, keel_tensor *q, keel_tensor *k, keel_tensor *v, keel_tensor *pos,
                             double scale, keel_type out) {
    return OP(KEEL_OP_FLASH_ATTN, (q, k, v, pos), IPS(out), 1, FPS(scale), 1);
}
keel_tensor *keel_gated_rms_norm(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *z, double eps) {
    return OP(KEEL_OP_GATED_RMS_NORM, (x, w, z), NULL, 0, FPS(eps), 1);
}
keel_tensor *keel_gated_rms_norm_to(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *z, double eps,
                                    keel_type out) {
    if (!x || out == x->type) return keel_gated_rms_norm(ctx, x, w, z, eps);
    return OP(KEEL_OP_GATED_RMS_NORM, (x, w, z), IPS(0, out), 2, FPS(eps), 1);
}
keel_tensor *keel_gdn_conv(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, keel_tensor *pos, int64_t n_qk, int64_t head,
                           double eps, double q_scale) {
    return OP(KEEL_OP_GDN_CONV, (x, w, pos), IPS(n_qk, head), 2, FPS(eps, q_scale), 2);
}
keel_tensor *keel_gated_delta_net(keel_ctx *ctx, keel_tensor *q, keel_tensor *k, keel_tensor *v, keel_tensor *g,
                                  keel_tensor *beta, keel_tensor *pos, int products) {
    return OP(KEEL_OP_GATED_DELTA_NET, (q, k, v, g, beta, pos), IPS(products), 1, NULL, 0);
}
keel_tensor *keel_gated_delta_net_state(keel_ctx *ctx, keel_tensor *q, keel_tensor *k, keel_tensor *v, keel_tensor *g,
                                        keel_tensor *beta, keel_tensor *pos, keel_tensor *s0) {
    return OP(KEEL_OP_GATED_DELTA_NET_STATE, (q, k, v, g, beta, pos, s0), NULL, 0, NULL, 0);
}
keel_tensor *keel_cross_entropy_loss(keel_ctx *ctx, keel_tensor *logits, keel_tensor *targets) {
    return OP(KEEL_OP_CROSS_ENTROPY_LOSS, (logits, targets), NULL, 0, NULL, 0);
}
keel_tensor *keel_sum_sq(keel_ctx *ctx, keel_tensor *x) { return OP(KEEL_OP_SUM_SQ, (x), NULL, 0, NULL, 0); }
keel_tensor *keel_adamw(keel_ctx *ctx, keel_tensor *p, keel_tensor *g, keel_tensor *m, keel_tensor *v, keel_tensor *s,
                        keel_tensor *c, int64_t c_start, double lr, double beta1, double beta2, double eps, double wd,
                        double clip, int64_t step, int64_t divisor, int64_t decay_end) {
    const int64_t ip[4] = {step, divisor, decay_end, c_start};
    const double fp[6] = {lr, beta1, beta2, eps, wd, clip};
    return c ? OP(KEEL_OP_ADAMW_SHADOW, (p, g, m, v, s, c), ip, 4, fp, 6)
             : OP(KEEL_OP_ADAMW, (p, g, m, v, s), ip, 3, fp, 6);
}
keel_tensor *keel_shadow(keel_ctx *ctx, keel_tensor *copy, keel_tensor *w) {
    return OP(KEEL_OP_SHADOW, (copy, w), NULL, 0, NULL, 0);
}
