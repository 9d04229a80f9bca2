#include "autodiff/autodiff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/error.h"

/* Windows in place. A contribution through a VIEW of a contiguous tensor s that is itself the same
 * window of a tensor P laid out as s (a root of s's type, at least s's bytes, the window's strides and
 * offset in both: the delta rule's backward writes dq, dk, dv in the layout of the channels the model
 * views q, k and v from) is held back while s has no gradient yet. When s's gradient is read (its
 * node's rule, the end of the backward), windows of one P that are bands of s's rows (the same bytes
 * of every row) and tile the rows exactly make s's gradient P's first bytes as they lie: no zero
 * FILL, no ACC, the same values (0 + x is x; a -0 becomes +0 only the other way). Otherwise, or
 * when any other contribution to s arrives first, the held windows go in as every window does: a
 * FILL, then an ACC each in the order they came. Halves (half_of, below) are held the same way, the
 * first until the second comes. */
#define HELD_MAX 8
typedef struct {
    keel_tensor *s, *P; /* P: NULL for halves (below) */
    int n;
    struct {
        keel_tensor *dy;
        int64_t nb1, nb2, nb3, offset, lo, hi; /* the window; its bytes [lo, hi) of each of s's rows */
    } w[HELD_MAX];
} held_windows;

struct keel_grad_acc {
    keel_graph *g;
    keel_ctx *ctx;
    uint8_t *needs; /* by id: the tensor depends on a parameter through differentiable sources */
    uint8_t *owned; /* by id of a gradient: created by accumulation, so in-place ACC may write it */
    keel_tensor *node;
    int64_t cap;
    held_windows *held; /* the tensors whose windows are held back (few: each until its rule runs) */
    int n_held, cap_held;
    uint8_t *uses; /* by id of a forward tensor: the sources of forward nodes that read it (3: three or more) */
    int64_t n_uses;
};

static int grow(keel_grad_acc *a) {
    int64_t n = keel_ctx_count(a->ctx);
    if (n <= a->cap) return 0;
    int64_t c = n * 2 + 1024;
    keel_tensor **gr = realloc(a->g->grads, (size_t)c * sizeof *gr);
    uint8_t *nd = realloc(a->needs, (size_t)c), *ow = realloc(a->owned, (size_t)c);
    if (gr) a->g->grads = gr;
    if (nd) a->needs = nd;
    if (ow) a->owned = ow;
    if (!gr || !nd || !ow) return keel_fail("out of memory building the backward graph");
    memset(gr + a->cap, 0, (size_t)(c - a->cap) * sizeof *gr);
    memset(nd + a->cap, 0, (size_t)(c - a->cap));
    memset(ow + a->cap, 0, (size_t)(c - a->cap));
    a->cap = c;
    a->g->n_grads = c;
    return 0;
}

/* A tensor whose gradient only ever becomes a bf16 product operand: a float32 product of bf16
 * operands (MUL_MAT's rule rounds dy to bf16 and reads nothing else of it), or a RESHAPE of one that
 * it alone reads (the DeltaNet's z as heads: RESHAPE's rule hands dy on as it is), read by `readers`
 * nodes' sources and no more, no output, no gradient yet. Its gradient may come in bf16, rounded as
 * CAST rounds it: the bits the product's rule would make, without the float32 tensor. */
static bool bf16_product_read_by(const keel_grad_acc *acc, const keel_tensor *s, int readers) {
    bool alone = s->id < acc->n_uses && acc->uses[s->id] == readers &&
                 !(s->flags & (KEEL_FLAG_OUTPUT | KEEL_FLAG_LOSS | KEEL_FLAG_PARAM)) && !acc->g->grads[s->id];
    if (s->op == KEEL_OP_RESHAPE) return alone && bf16_product_read_by(acc, s->src[0], 1);
    return alone && s->op == KEEL_OP_MUL_MAT && s->type == KEEL_F32 && s->src[0]->type == KEEL_BF16 &&
           s->src[1]->type == KEEL_BF16;
}

/* ... with one reader: a contribution to it may come in bf16 */
bool keel_grad_bf16_ok(const keel_grad_acc *acc, int src) {
    return keel_grad_wanted(acc, src) && bf16_product_read_by(acc, acc->node->src[src], 1);
}

bool keel_grad_wanted(const keel_grad_acc *acc, int src) {
    const keel_tensor *t = acc->node;
    return (keel_op_get(t->op)->grad_srcs >> src & 1) && acc->needs[t->src[src]->id];
}

keel_type keel_grad_type(keel_type t) { return t == KEEL_BF16 ? KEEL_F32 : t; }

/* The bytes [lo, hi) of every row of the contiguous s that a window of shape ne (strides es, nb1..3,
 * byte offset) covers, when it covers the same bytes of every row and nothing else: its dimensions
 * (those of more than one element) are a contiguous run within a row, then s's rows in order. */
static bool band_of(const keel_tensor *s, const int64_t *ne, int64_t nb1, int64_t nb2, int64_t nb3, int64_t offset,
                    int64_t *lo, int64_t *hi) {
    int64_t es = (int64_t)keel_type_size(s->type), R = s->ne[0] * es, rows = keel_nrows(s);
    int64_t nb[4] = {es, nb1, nb2, nb3}, run = es, span = R, count = 1;
    int d = 0;
    while (d < 4 && (ne[d] == 1 || nb[d] == run)) run *= ne[d], d++;                   /* the run within a row */
    while (d < 4 && (ne[d] == 1 || nb[d] == span)) span *= ne[d], count *= ne[d], d++; /* whole rows */
    if (d < 4 || offset < 0) return false;
    if (count == 1 && run > R) { /* rows and all: the whole of s */
        if (offset || run != R * rows) return false;
        run = R, count = rows;
    }
    if (count != rows || offset + run > R) return false;
    *lo = offset, *hi = offset + run;
    return true;
}

static held_windows *held_of(keel_grad_acc *acc, const keel_tensor *s) {
    for (int i = 0; i < acc->n_held; i++)
        if (acc->held[i].s == s) return &acc->held[i];
    return NULL;
}

/* Do the held windows of h tile s's rows, P written by nothing in place since the first was made? */
static bool held_tiles(const keel_grad_acc *acc, const held_windows *h) {
    int64_t at = 0, R = h->s->ne[0] * (int64_t)keel_type_size(h->s->type);
    for (int k = 0; k < h->n; k++) { /* windows in order of their bytes: each starts where one ends */
        int next = -1;
        for (int i = 0; i < h->n; i++)
            if (h->w[i].lo == at) next = i;
        if (next < 0) return false;
        at = h->w[next].hi;
    }
    if (at != R) return false;
    int64_t first = h->w[0].dy->id;
    for (int i = 1; i < h->n; i++)
        if (h->w[i].dy->id < first) first = h->w[i].dy->id;
    for (int64_t id = first + 1; id < keel_ctx_count(acc->ctx); id++) {
        const keel_tensor *t = keel_ctx_tensor(acc->ctx, id);
        if (t->view_src == h->P && !(keel_op_get(t->op)->flags & OPF_VIEW)) return false;
    }
    return true;
}

static int add_window_now(keel_grad_acc *acc, keel_tensor *s, keel_tensor *dy, int64_t nb1, int64_t nb2, int64_t nb3,
                          int64_t offset);

/* A new, empty entry for s's windows (in place into P, or halves where P is NULL); NULL: out of memory */
static held_windows *held_new(keel_grad_acc *acc, keel_tensor *s, keel_tensor *P) {
    if (acc->n_held == acc->cap_held) {
        int c = acc->cap_held * 2 + 4;
        held_windows *nh = realloc(acc->held, (size_t)c * sizeof *nh);
        if (!nh) {
            keel_fail("out of memory building the backward graph");
            return NULL;
        }
        acc->held = nh, acc->cap_held = c;
    }
    held_windows *h = &acc->held[acc->n_held++];
    h->s = s, h->P = P, h->n = 0;
    return h;
}

/* Halves. A contiguous s read as [n0, 2, K], runs of n0 elements, and two windows of it that take
 * every other run (attention's q and gate in each head's row of the q projection; the DeltaNet's b
 * and a in each token's row of the gate projections): the gradient is the two contributions side by
 * side, one CONCAT, not a zero FILL and an ACC each (at the 0.8B shape, batch 8: 35 + 2 x 55 us for
 * q and gate). The values are the same (0 + x is x; a -0 stays -0 where the ACC made it +0). Which
 * half (0 or 1) the window of shape dy->ne (strides es, nb1..3, byte offset) is, or -1. */
static int half_of(const keel_tensor *s, const keel_tensor *dy, int64_t nb1, int64_t nb2, int64_t nb3, int64_t offset) {
    int64_t es = (int64_t)keel_type_size(s->type), run = dy->ne[0] * es, nb[4] = {es, nb1, nb2, nb3}, want = 2 * run;
    if (dy->type != s->type || !keel_is_contiguous(dy) || 2 * keel_nelements(dy) != keel_nelements(s)) return -1;
    for (int d = 1; d < 4; d++)
        if (dy->ne[d] > 1) { /* the runs in order, every other one of s's */
            if (nb[d] != want) return -1;
            want *= dy->ne[d];
        }
    return offset == 0 ? 0 : offset == run ? 1 : -1;
}

/* The second half of s's gradient, h holding the first: the two side by side as s's gradient. Each
 * half came through a VIEW of s (the only rule that adds a window), so where s has two readers these
 * are all of its gradient, and a bf16 product's (attention's q and gate projection) takes it in bf16
 * from the CONCAT: no float32 tensor, and no CAST of it in the product's rule. */
static int join_halves(keel_grad_acc *acc, held_windows *h, keel_tensor *dy, int half) {
    keel_tensor *s = h->s, *other = h->w[0].dy;
    *h = acc->held[--acc->n_held];
    int64_t n0 = dy->ne[0], K = keel_nelements(dy) / n0;
    int64_t type = dy->type == KEEL_F32 && bf16_product_read_by(acc, s, 2) ? KEEL_BF16 : 0;
    keel_tensor *a = keel_reshape_4d(acc->ctx, half ? other : dy, n0, 1, K, 1),
                *b = keel_reshape_4d(acc->ctx, half ? dy : other, n0, 1, K, 1);
    keel_tensor *cat = a && b ? keel_concat_to(acc->ctx, a, b, 1, type) : NULL;
    keel_tensor *g = cat ? keel_reshape_4d(acc->ctx, cat, s->ne[0], s->ne[1], s->ne[2], s->ne[3]) : NULL;
    if (!g || grow(acc)) return -1;
    acc->g->grads[s->id] = g;
    return 0;
}

/* s's held windows into its gradient: P's first bytes where they tile it, else a FILL and ACCs */
static int settle(keel_grad_acc *acc, held_windows *h) {
    held_windows w = *h;
    *h = acc->held[--acc->n_held]; /* out of the list first: the ACCs below must not hold them again */
    keel_tensor *s = w.s;
    if (w.P && held_tiles(acc, &w)) {
        keel_tensor *v =
            keel_view_4d(acc->ctx, w.P, s->ne[0], s->ne[1], s->ne[2], s->ne[3], s->nb[1], s->nb[2], s->nb[3], 0);
        if (!v || grow(acc)) return -1;
        acc->g->grads[s->id] = v;
        return 0;
    }
    for (int i = 0; i < w.n; i++)
        if (add_window_now(acc, s, w.w[i].dy, w.w[i].nb1, w.w[i].nb2, w.w[i].nb3, w.w[i].offset)) return -1;
    return 0;
}

static int settle_of(keel_grad_acc *acc, const keel_tensor *s) {
    held_windows *h = acc->n_held ? held_of(acc, s) : NULL;
    return h ? settle(acc, h) : 0;
}

int keel_grad_add(keel_grad_acc *acc, int src, keel_tensor *contrib) {
    if (!contrib) return -1;
    if (!keel_grad_wanted(acc, src)) return 0;
    keel_tensor *s = acc->node->src[src];
    if (settle_of(acc, s)) return -1;
    bool bf16 = contrib->type == KEEL_BF16 && keel_grad_bf16_ok(acc, src);
    if (!keel_same_shape(s, contrib) || (contrib->type != keel_grad_type(s->type) && !bf16)) {
        char a[64], b[64];
        return keel_fail("autodiff: %s rule gave a %s %s gradient for source '%s' (%s %s)",
                         keel_op_get(acc->node->op)->name, keel_type_name(contrib->type),
                         keel_shape_str(contrib->ne, a, sizeof a), s->name, keel_type_name(keel_grad_type(s->type)),
                         keel_shape_str(s->ne, b, sizeof b));
    }
    if (grow(acc)) return -1;
    keel_tensor *cur = acc->g->grads[s->id], *sum = contrib;
    if (cur) {
        /* a product's contribution is added where the product is made (MUL_MAT_ADD: the sum so far
         * as its addend), not by a pass of its own over a product result written just for it; the
         * order stays the sum so far, then the contribution */
        bool product = contrib->op == KEEL_OP_MUL_MAT && contrib->type == cur->type && contrib->type != KEEL_BF16;
        /* likewise the rows' sums of GET_ROWS_BACK (a tied embedding's input side), added where they
         * are made: no [D, rows] result of zeros and sums, no pass to add it */
        bool rows = contrib->op == KEEL_OP_GET_ROWS_BACK && contrib->type == cur->type;
        sum = product ? keel_mul_mat_add(acc->ctx, contrib->src[0], contrib->src[1], cur)
              : rows  ? keel_get_rows_back_add(acc->ctx, contrib->src[0], contrib->src[1], cur)
                      : keel_add(acc->ctx, cur, contrib);
        if (!sum || grow(acc)) return -1;
        acc->owned[sum->id] = 1;
    }
    acc->g->grads[s->id] = sum;
    return 0;
}

keel_tensor *keel_grad_so_far(keel_grad_acc *acc, int src) {
    if (!keel_grad_wanted(acc, src)) return NULL;
    keel_tensor *s = acc->node->src[src];
    if (settle_of(acc, s) || grow(acc)) return NULL; /* an error here comes back from keel_grad_add */
    keel_tensor *cur = acc->g->grads[s->id];
    keel_type want = keel_grad_type(s->type);
    if (!cur || cur->type != want || (want != KEEL_F32 && want != KEEL_F64) || !keel_same_shape(cur, s) ||
        !keel_is_contiguous(cur))
        return NULL;
    return cur;
}

int keel_grad_set(keel_grad_acc *acc, int src, keel_tensor *g) {
    if (!g) return -1;
    keel_tensor *s = acc->node->src[src];
    if (!keel_same_shape(s, g) || g->type != keel_grad_type(s->type))
        return keel_fail("autodiff: %s rule set a %s gradient for source '%s' (%s wanted)",
                         keel_op_get(acc->node->op)->name, keel_type_name(g->type), s->name,
                         keel_type_name(keel_grad_type(s->type)));
    if (grow(acc)) return -1;
    acc->g->grads[s->id] = g;
    return 0;
}

int keel_grad_add_window(keel_grad_acc *acc, int src, keel_tensor *dy, int64_t nb1, int64_t nb2, int64_t nb3,
                         int64_t offset) {
    if (!dy) return -1;
    if (!keel_grad_wanted(acc, src)) return 0;
    keel_tensor *s = acc->node->src[src];
    if (!keel_is_contiguous(s))
        return keel_fail("autodiff: '%s' is a view of the non-contiguous '%s'; make a contiguous copy (CONT) "
                         "before viewing it",
                         acc->node->name, s->name);
    if (grow(acc)) return -1;
    held_windows *h = acc->n_held ? held_of(acc, s) : NULL;
    /* the window in the bytes of s's gradient, where the ACCs below put it: a bf16 s has a float32
     * gradient, every stride and the offset twice s's own (in place and halves: s's own type only) */
    int64_t es = (int64_t)keel_type_size(s->type), eg = (int64_t)keel_type_size(keel_grad_type(s->type));
    if (es != eg && (nb1 % es || nb2 % es || nb3 % es || offset % es))
        return keel_fail("autodiff: '%s' views '%s' at strides %lld, %lld, %lld and offset %lld bytes, not whole "
                         "%lld-byte elements: its float32 gradient has no such window",
                         acc->node->name, s->name, (long long)nb1, (long long)nb2, (long long)nb3, (long long)offset,
                         (long long)es);
    nb1 = nb1 / es * eg, nb2 = nb2 / es * eg, nb3 = nb3 / es * eg, offset = offset / es * eg;
    keel_tensor *P = dy->view_src;
    int64_t lo, hi;
    bool in_place = P && dy->op == KEEL_OP_VIEW && !acc->owned[P->id] && P->type == s->type &&
                    keel_grad_type(s->type) == s->type && keel_is_contiguous(P) && keel_nbytes(P) >= keel_nbytes(s) &&
                    dy->nb[0] == (int64_t)keel_type_size(s->type) && dy->nb[1] == nb1 && dy->nb[2] == nb2 &&
                    dy->nb[3] == nb3 && dy->view_offs == offset && band_of(s, dy->ne, nb1, nb2, nb3, offset, &lo, &hi);
    if (in_place && !acc->g->grads[s->id] && (!h || (h->P == P && h->n < HELD_MAX))) {
        if (!h && !(h = held_new(acc, s, P))) return -1;
        h->w[h->n].dy = dy, h->w[h->n].nb1 = nb1, h->w[h->n].nb2 = nb2, h->w[h->n].nb3 = nb3;
        h->w[h->n].offset = offset, h->w[h->n].lo = lo, h->w[h->n].hi = hi, h->n++;
        return 0;
    }
    int half = in_place || keel_grad_type(s->type) != s->type ? -1 : half_of(s, dy, nb1, nb2, nb3, offset);
    if (half >= 0 && !acc->g->grads[s->id] && h && !h->P && h->w[0].offset != offset && h->w[0].nb1 == nb1 &&
        h->w[0].nb2 == nb2 && h->w[0].nb3 == nb3 && keel_same_shape(h->w[0].dy, dy))
        return join_halves(acc, h, dy, half);
    if (half >= 0 && !acc->g->grads[s->id] && !h) { /* the first half: held until the other comes */
        if (!(h = held_new(acc, s, NULL))) return -1;
        h->n = 1;
        h->w[0].dy = dy, h->w[0].nb1 = nb1, h->w[0].nb2 = nb2, h->w[0].nb3 = nb3, h->w[0].offset = offset;
        return 0;
    }
    if (h && settle(acc, h)) return -1;
    return add_window_now(acc, s, dy, nb1, nb2, nb3, offset);
}

/* dy into the window of s's gradient: into a zero FILL, or the gradient so far (in place where the
 * accumulator owns it) */
static int add_window_now(keel_grad_acc *acc, keel_tensor *s, keel_tensor *dy, int64_t nb1, int64_t nb2, int64_t nb3,
                          int64_t offset) {
    if (grow(acc)) return -1;
    keel_tensor *cur = acc->g->grads[s->id];
    bool inplace = true;
    if (!cur) {
        cur = keel_fill(acc->ctx, keel_grad_type(s->type), s->ne, 0.0); /* a real fill: x*0 turns inf into NaN */
    } else if (!acc->owned[cur->id] || !keel_is_contiguous(cur)) {
        inplace = false; /* someone else may read it: accumulate into a copy */
        if (!keel_is_contiguous(cur)) cur = keel_cont(acc->ctx, cur);
    }
    cur = keel_acc(acc->ctx, cur, dy, nb1, nb2, nb3, offset, inplace);
    if (!cur || grow(acc)) return -1;
    acc->owned[cur->id] = 1;
    acc->g->grads[s->id] = cur;
    return 0;
}

int keel_build_backward(keel_graph *g, keel_tensor *loss) {
    if (!loss) return keel_fail("autodiff: no loss");
    if (keel_nelements(loss) != 1)
        return keel_fail("autodiff: loss '%s' has %lld elements, expected 1", loss->name,
                         (long long)keel_nelements(loss));
    keel_grad_acc acc = {.g = g, .ctx = g->ctx};
    if (grow(&acc)) goto fail;
    for (int64_t i = 0; i < g->n_leafs; i++)
        if (g->leafs[i]->flags & KEEL_FLAG_PARAM) acc.needs[g->leafs[i]->id] = 1;
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        const keel_op_info *info = keel_op_get(t->op);
        for (int s = 0; s < info->arity; s++)
            if ((info->grad_srcs >> s & 1) && acc.needs[t->src[s]->id]) acc.needs[t->id] = 1;
    }
    acc.n_uses = keel_ctx_count(g->ctx);
    if (!(acc.uses = calloc((size_t)acc.n_uses, 1))) {
        free(acc.needs), free(acc.owned);
        return keel_fail("out of memory building the backward graph");
    }
    for (int64_t i = 0; i < g->n_nodes; i++) {
        const keel_tensor *t = g->nodes[i];
        for (int s = 0; s < keel_op_get(t->op)->arity; s++) {
            uint8_t *u = &acc.uses[t->src[s]->id];
            *u = *u < 3 ? *u + 1 : 3;
        }
    }
    if (!acc.needs[loss->id]) {
        free(acc.needs), free(acc.owned), free(acc.held), free(acc.uses);
        return keel_fail("autodiff: loss '%s' does not depend on any parameter", loss->name);
    }
    loss->flags |= KEEL_FLAG_LOSS;
    int64_t first_new = keel_ctx_count(g->ctx);
    g->grads[loss->id] = keel_fill(g->ctx, loss->type, loss->ne, 1.0);
    keel_set_name(g->grads[loss->id], "grad.%s", loss->name);

    int64_t n_forward = g->n_nodes;
    for (int64_t i = n_forward - 1; i >= 0; i--) {
        keel_tensor *t = g->nodes[i];
        if (settle_of(&acc, t)) goto fail;
        keel_tensor *dy = t->id < acc.cap ? g->grads[t->id] : NULL;
        if (!acc.needs[t->id] || !dy) continue;
        keel_grad_rule rule = keel_grad_rule_of(t->op);
        if (!rule) {
            keel_fail("autodiff: %s has no backward rule (%s), but node '%s' needs one", keel_op_get(t->op)->name,
                      keel_op_get(t->op)->nograd ? keel_op_get(t->op)->nograd : "missing", t->name);
            goto fail;
        }
        acc.node = t;
        if (rule(g->ctx, t, dy, &acc)) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", keel_last_error());
            keel_fail("autodiff: backward of '%s' (%s): %s", t->name, keel_op_get(t->op)->name, msg);
            goto fail;
        }
    }
    while (acc.n_held) /* windows of leaves (a parameter viewed) */
        if (settle(&acc, &acc.held[acc.n_held - 1])) goto fail;
    /* Name and keep parameter gradients; a parameter the loss does not reach gets none. A gradient
     * gets a copy of its own (CONT) unless it is already one: a contiguous tensor the backward made
     * (the accumulator's, or a rule's result that is no view and no other parameter's gradient).
     * A rule's result kept as it is costs no copy, and no life from its rule to the copy at the
     * end of the graph (with recompute, 3 GiB of weight gradients at the 0.8B shape's peak). */
    uint8_t *shared = calloc((size_t)acc.cap, 1);
    if (!shared) {
        keel_fail("out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < g->n_leafs; i++)
        if ((g->leafs[i]->flags & KEEL_FLAG_PARAM) && g->grads[g->leafs[i]->id]) {
            uint8_t *c = &shared[g->grads[g->leafs[i]->id]->id];
            *c = *c < 2 ? *c + 1 : 2;
        }
    for (int64_t i = 0; i < g->n_leafs; i++) {
        keel_tensor *p = g->leafs[i];
        if (!(p->flags & KEEL_FLAG_PARAM) || !g->grads[p->id]) continue;
        keel_tensor *gr = g->grads[p->id];
        bool own = acc.owned[gr->id] || (gr->id >= first_new && !gr->view_src && shared[gr->id] == 1);
        if (!own || !keel_is_contiguous(gr)) { /* its own tensor, so the name is its alone */
            gr = keel_cont(g->ctx, gr);
            if (!gr || grow(&acc)) {
                free(shared);
                goto fail;
            }
            g->grads[p->id] = gr;
        }
        keel_set_name(gr, "grad.%s", p->name);
        gr->flags |= KEEL_FLAG_OUTPUT;
    }
    free(shared);
    /* Append what the parameter gradients need, in creation order: a valid topological order
     * that runs the backward pass from the last layer to the first. */
    int64_t n_ids = keel_ctx_count(g->ctx);
    uint8_t *want = calloc((size_t)n_ids, 1);
    if (!want) {
        keel_fail("out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < g->n_leafs; i++) {
        keel_tensor *p = g->leafs[i];
        if ((p->flags & KEEL_FLAG_PARAM) && g->grads[p->id]) want[g->grads[p->id]->id] = 1;
    }
    for (int64_t id = n_ids - 1; id >= first_new; id--) {
        if (!want[id]) continue;
        keel_tensor *t = keel_ctx_tensor(g->ctx, id);
        int arity = keel_op_get(t->op)->arity;
        for (int s = 0; s < arity; s++)
            if (t->src[s]->id >= first_new) want[t->src[s]->id] = 1;
    }
    g->n_forward = n_forward;
    for (int64_t id = first_new; id < n_ids; id++) {
        if (!want[id]) continue;
        keel_tensor *t = keel_ctx_tensor(g->ctx, id);
        if (keel_graph_expand(g, t)) {
            free(want);
            goto fail;
        }
    }
    free(want);
    free(acc.needs);
    free(acc.owned);
    free(acc.held);
    free(acc.uses);
    return 0;
fail:
    free(acc.needs);
    free(acc.owned);
    free(acc.held);
    free(acc.uses);
    return -1;
}
