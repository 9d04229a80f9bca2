#define _GNU_SOURCE /* qsort_r */
#include "backends/op_profile.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { N_KINDS = 1024 };

struct keel_op_profile {
    double ms[KEEL_OP_COUNT], bytes[KEEL_OP_COUNT];
    int64_t n[KEEL_OP_COUNT];
    struct {
        double ms, bytes;
        int64_t n;
        int op;
        char name[KEEL_NAME_MAX], shapes[208];
    } kind[N_KINDS]; /* the first node's name of each group kept, as an example */
    int n_kind;
};

keel_op_profile *keel_op_profile_from_env(const char *env) {
    const char *v = getenv(env);
    if (!v || !*v || !strcmp(v, "0")) return NULL;
    return calloc(1, sizeof(keel_op_profile));
}

/* The least memory traffic a node can have: each operand read once and its result written once (a
 * kernel's scratch and second reads not counted), so bytes over time is a floor on the bandwidth the
 * kernel reached: near the memory's peak, the node is memory-bound and at speed; far below, either
 * compute-bound or slower than its bytes need. */
static double node_bytes(const keel_tensor *t) {
    double b = (double)keel_nbytes(t);
    for (int i = 0; i < KEEL_MAX_SRC; i++)
        if (t->src[i]) b += (double)keel_nbytes(t->src[i]);
    return b;
}

void keel_op_profile_add(keel_op_profile *p, const keel_tensor *t, double ms) {
    double by = node_bytes(t);
    p->ms[t->op] += ms, p->bytes[t->op] += by, p->n[t->op]++;
    /* the group: operand shapes, '*' marking a non-contiguous one */
    char key[208] = "", sh[64];
    int len = 0, arity = keel_op_get(t->op)->arity;
    const keel_tensor *ops[3] = {arity > 0 ? t->src[0] : NULL, arity > 1 ? t->src[1] : NULL, t};
    for (int k = 0; k < 3; k++) {
        if (!ops[k]) continue;
        keel_shape_str(ops[k]->ne, sh, sizeof sh);
        len += snprintf(key + len, sizeof key - (size_t)len, "%s%s%s", k == 2 ? "-> " : "", sh,
                        keel_is_contiguous(ops[k]) ? " " : "* ");
        if (len >= (int)sizeof key) break;
    }
    int i = 0;
    while (i < p->n_kind && !(p->kind[i].op == t->op && !strcmp(p->kind[i].shapes, key))) i++;
    if (i == p->n_kind) {
        if (i == N_KINDS) return; /* the per-op totals still count it */
        p->n_kind++;
        p->kind[i].op = t->op;
        snprintf(p->kind[i].shapes, sizeof p->kind[i].shapes, "%s", key);
        snprintf(p->kind[i].name, sizeof p->kind[i].name, "%s", t->name);
    }
    p->kind[i].ms += ms, p->kind[i].bytes += by, p->kind[i].n++;
}

void keel_op_profile_reset(keel_op_profile *p) { memset(p, 0, sizeof *p); }

static int by_ms(const void *a, const void *b, void *ctx) {
    const double *ms = ctx;
    double x = ms[*(const int *)a], y = ms[*(const int *)b];
    return (x < y) - (x > y);
}

static double gb_per_s(double bytes, double ms) { return ms > 0 ? bytes / 1e9 / (ms / 1e3) : 0.0; }

void keel_op_profile_print(const keel_op_profile *p, FILE *f, const char *title, const char *what) {
    int order[KEEL_OP_COUNT], n = 0;
    double total = 0;
    for (int op = 0; op < KEEL_OP_COUNT; op++)
        if (p->n[op]) order[n++] = op, total += p->ms[op];
    qsort_r(order, (size_t)n, sizeof order[0], by_ms, (void *)p->ms);
    fprintf(f, "%s: %s per op over all runs, %.1f ms in all (GB/s: operand and result bytes over the time)\n", title,
            what, total);
    for (int i = 0; i < n; i++)
        fprintf(f, "  %-26s %10.2f ms %6.1f%% %8lld nodes %10.3f GB %8.1f GB/s\n", keel_op_get(order[i])->name,
                p->ms[order[i]], 100.0 * p->ms[order[i]] / (total > 0 ? total : 1), (long long)p->n[order[i]],
                p->bytes[order[i]] / 1e9, gb_per_s(p->bytes[order[i]], p->ms[order[i]]));
    /* the groups with the most time, by selection (the list is short): 30, or KEEL_PROFILE_GROUPS */
    const char *env = getenv("KEEL_PROFILE_GROUPS");
    long n_show = env && *env ? strtol(env, NULL, 10) : 30;
    fprintf(f, "the (op, operand shapes) groups with the most %s ('*': a strided operand):\n", what);
    bool shown[N_KINDS] = {false};
    for (long r = 0; r < n_show; r++) {
        int best = -1;
        for (int i = 0; i < p->n_kind; i++)
            if (!shown[i] && (best < 0 || p->kind[i].ms > p->kind[best].ms)) best = i;
        if (best < 0) break;
        shown[best] = true;
        fprintf(f, "  %9.2f ms %6lld x %8.3f ms %8.1f GB/s  %-20s %-60s e.g. %s\n", p->kind[best].ms,
                (long long)p->kind[best].n, p->kind[best].ms / (double)p->kind[best].n,
                gb_per_s(p->kind[best].bytes, p->kind[best].ms), keel_op_get(p->kind[best].op)->name,
                p->kind[best].shapes, p->kind[best].name);
    }
}

void keel_op_profile_free(keel_op_profile *p) { free(p); }
