#include "train/optim.h"

#include "ops/ops.h"

int keel_adamw_attach(keel_ctx *ctx, keel_graph *g, keel_tensor *const *params, keel_tensor *const *grads, int n,
                      double lr, double weight_decay, keel_tensor **mom, keel_tensor **opt) {
    for (int i = 0; i < n; i++) {
        keel_tensor *p = params[i];
        mom[2 * i] = keel_set_name(keel_set_flags(keel_new(ctx, KEEL_F32, 4, p->ne), KEEL_FLAG_INPUT), "m.%s", p->name);
        mom[2 * i + 1] =
            keel_set_name(keel_set_flags(keel_new(ctx, KEEL_F32, 4, p->ne), KEEL_FLAG_INPUT), "v.%s", p->name);
        double wd = p->ne[1] > 1 ? weight_decay : 0.0; /* no decay on norms, gates and biases */
        opt[i] = keel_adamw(ctx, p, grads[i], mom[2 * i], mom[2 * i + 1], lr, 0.9, 0.95, 1e-8, wd, 1);
        if (!opt[i] || keel_graph_expand(g, opt[i])) return -1;
        opt[i]->flags |= KEEL_FLAG_OUTPUT;
    }
    return 0;
}

/* The ADAMW row of the op table: fp0 lr, fp5 gradient scale, ip0 step. */
void keel_adamw_set(keel_tensor *const *opt, int n, int64_t step, double lr, double grad_scale) {
    for (int i = 0; i < n; i++) opt[i]->fp[0] = lr, opt[i]->fp[5] = grad_scale, opt[i]->ip[0] = step;
}
