#include "train/optim.h"

#include <stdlib.h>

#include "ops/ops.h"
#include "util/error.h"

/* The decayed parameters (matrices) first, then the rest, each in the given order */
static bool decayed(const keel_tensor *p) { return p->ne[1] > 1; }

int64_t keel_adamw_decayed_layout(keel_tensor *const *params, int n, int64_t *off) {
    /* the group's members as keel_adamw_attach orders them: the decayed ones, then (for where the
     * decayed elements end) the first of the rest; keel_group_layout places them as the group does */
    keel_tensor **m = calloc((size_t)(n + 1), sizeof *m);
    int64_t *at = malloc((size_t)(n + 1) * sizeof *at);
    if (!m || !at) {
        free(m), free(at);
        return keel_fail("out of memory");
    }
    int k = 0, rest = -1;
    for (int i = 0; i < n; i++)
        if (decayed(params[i]))
            m[k++] = params[i];
        else if (rest < 0)
            rest = i;
    if (rest >= 0) m[k] = params[rest];
    int64_t end = keel_group_layout(m, rest >= 0 ? k + 1 : k, at);
    if (rest >= 0) end = at[k]; /* where the first parameter without decay starts (keel_adamw_attach's decay_end) */
    for (int i = 0, j = 0; i < n; i++) off[i] = decayed(params[i]) ? at[j++] / (int64_t)sizeof(float) : -1;
    free(m), free(at);
    return (end + (int64_t)sizeof(float) - 1) / (int64_t)sizeof(float);
}

int keel_adamw_attach(keel_ctx *ctx, keel_graph *g, keel_tensor *const *params, keel_tensor *const *grads, int n,
                      keel_tensor *copies, int64_t copies_start, double lr, double weight_decay, double clip,
                      int64_t divisor, keel_optim *out) {
    out->mom = calloc((size_t)(2 * n), sizeof *out->mom);
    keel_tensor **by = malloc((size_t)(4 * n) * sizeof *by); /* the groups' members: p, g, m, v */
    int *order = malloc((size_t)n * sizeof *order);
    int rc = -1;
    if (!out->mom || !by || !order) {
        keel_fail("out of memory");
        goto done;
    }
    /* the decayed parameters (matrices) first, then the rest, each in the given order */
    int k = 0, n_decay = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++)
            if (decayed(params[i]) == (pass == 0)) order[k++] = i, n_decay += pass == 0;
    for (int j = 0; j < n; j++) {
        int i = order[j];
        keel_tensor *p = params[i];
        for (int s = 0; s < 2; s++)
            out->mom[2 * i + s] = keel_set_name(keel_set_flags(keel_new(ctx, KEEL_F32, 4, p->ne), KEEL_FLAG_INPUT),
                                                "%s.%s", s ? "v" : "m", p->name);
        by[j] = p, by[n + j] = grads[i], by[2 * n + j] = out->mom[2 * i], by[3 * n + j] = out->mom[2 * i + 1];
    }
    keel_tensor *flat[4];
    static const char *const names[4] = {"adamw.params", "adamw.grads", "adamw.m", "adamw.v"};
    int64_t decay_end = 0; /* where the first parameter without decay starts (the four groups are laid out alike) */
    for (int s = 0; s < 4; s++) {
        if (!(flat[s] = keel_graph_group(g, by + (size_t)s * n, n, names[s]))) goto done;
        if (s == 0)
            decay_end = n_decay < n ? g->groups[g->n_groups - 1].offset[n_decay] / (int64_t)sizeof(float)
                                    : keel_nelements(flat[0]);
    }
    if (copies) { /* laid out as keel_adamw_decayed_layout says, the group's elements [copies_start, decay_end) */
        const keel_group *gr = &g->groups[g->n_groups - 4];
        int64_t *off = malloc((size_t)n * sizeof *off);
        int64_t end = off ? keel_adamw_decayed_layout(params, n, off) : keel_fail("out of memory");
        if (end < 0) {
            free(off);
            goto done;
        }
        bool same = end == decay_end && copies_start >= 0 && keel_nelements(copies) == decay_end - copies_start &&
                    copies->type == KEEL_BF16;
        for (int j = 0; same && j < n_decay; j++) same = gr->offset[j] / (int64_t)sizeof(float) == off[order[j]];
        free(off);
        if (!same) {
            keel_fail("adamw: the weights' bf16 copies '%s' (%lld elements from %lld) are not laid out as the %lld "
                      "decayed elements of the parameters' group",
                      copies->name, (long long)keel_nelements(copies), (long long)copies_start, (long long)decay_end);
            goto done;
        }
    }
    out->sumsq = keel_sum_sq(ctx, flat[1]);
    out->adamw = out->sumsq ? keel_adamw(ctx, flat[0], flat[1], flat[2], flat[3], out->sumsq, copies, copies_start, lr,
                                         0.9, 0.95, 1e-8, weight_decay, clip, 1, divisor, decay_end)
                            : NULL;
    if (!out->adamw || keel_graph_expand(g, out->adamw)) goto done;
    keel_set_flags(keel_set_name(out->sumsq, "adamw.grad_sumsq"), KEEL_FLAG_OUTPUT);
    keel_set_flags(keel_set_name(out->adamw, "adamw"), KEEL_FLAG_OUTPUT);
    rc = 0;
done:
    free(by), free(order);
    return rc;
}

/* The ADAMW row of the op table: fp0 lr, ip0 step. */
void keel_adamw_set(keel_tensor *adamw, int64_t step, double lr) { adamw->fp[0] = lr, adamw->ip[0] = step; }
