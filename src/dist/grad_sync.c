#include "dist/grad_sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef struct {
    int first, count; /* gradients order[first .. first+count) */
    int64_t ready;    /* index of the node after which every gradient of the bucket is final */
    size_t bytes;
} bucket;

struct keel_grad_sync {
    keel_coll *c;
    keel_backend *be;
    keel_tensor **bufs; /* in completion order */
    bucket *b;
    int n_b, next; /* buckets [0, next) are started */
    int64_t n_nodes;
    bool verbose;
};

typedef struct {
    int64_t ready;
    int i;
} item;

static int by_ready(const void *x, const void *y) {
    const item *a = x, *b = y;
    if (a->ready != b->ready) return a->ready < b->ready ? -1 : 1;
    return a->i - b->i;
}

keel_grad_sync *keel_grad_sync_new(keel_coll *c, keel_backend *be, const keel_graph *g, keel_tensor *const *bufs,
                                   keel_tensor *const *writers, int n, size_t bucket_bytes) {
    keel_grad_sync *s = calloc(1, sizeof *s);
    item *it = calloc((size_t)(n ? n : 1), sizeof *it);
    if (s) s->bufs = calloc((size_t)(n ? n : 1), sizeof *s->bufs), s->b = calloc((size_t)(n ? n : 1), sizeof *s->b);
    if (!s || !it || !s->bufs || !s->b) {
        free(it), keel_grad_sync_free(s);
        keel_fail("out of memory");
        return NULL;
    }
    s->c = c, s->be = be, s->n_nodes = g->n_nodes;
    const char *v = getenv("KEEL_DIST_VERBOSE");
    s->verbose = v && *v && strcmp(v, "0") != 0;
    for (int i = 0; i < n; i++) {
        it[i].i = i, it[i].ready = -1;
        for (int64_t k = 0; k < g->n_nodes; k++)
            if (g->nodes[k] == writers[i]) it[i].ready = k;
        if (it[i].ready < 0 && writers[i]->op != 0) { /* a leaf gradient (never written) is final from the start */
            free(it), keel_grad_sync_free(s);
            keel_fail("gradient '%s' is not written by a node of the graph", bufs[i]->name);
            return NULL;
        }
        if (!keel_is_contiguous(bufs[i]) || bufs[i]->type != KEEL_F32) {
            free(it), keel_grad_sync_free(s);
            keel_fail("gradient '%s' must be contiguous float32 to be all-reduced", bufs[i]->name);
            return NULL;
        }
    }
    qsort(it, (size_t)n, sizeof *it, by_ready);
    for (int k = 0; k < n; k++) {
        keel_tensor *t = bufs[it[k].i];
        size_t bytes = keel_nbytes(t);
        bucket *cur = s->n_b ? &s->b[s->n_b - 1] : NULL;
        if (!cur || (cur->bytes && cur->bytes + bytes > bucket_bytes)) cur = &s->b[s->n_b++], cur->first = k;
        cur->count++, cur->bytes += bytes;
        if (it[k].ready > cur->ready) cur->ready = it[k].ready;
        s->bufs[k] = t;
    }
    free(it);
    return s;
}

void keel_grad_sync_free(keel_grad_sync *s) {
    if (!s) return;
    free(s->bufs), free(s->b), free(s);
}

int keel_grad_sync_n_buckets(const keel_grad_sync *s) { return s->n_b; }
int keel_grad_sync_started(const keel_grad_sync *s) { return s->next; }

void keel_grad_sync_begin(keel_grad_sync *s) { s->next = 0; }

static int start(keel_grad_sync *s, int64_t after) {
    bucket *b = &s->b[s->next];
    if (s->verbose && after >= 0)
        fprintf(
            stderr,
            "dist: rank %d: bucket %d of %d (%d gradients, %.2f MiB) started after node %lld of %lld, during the run\n",
            keel_coll_rank(s->c), s->next + 1, s->n_b, b->count, (double)b->bytes / 1048576.0, (long long)after,
            (long long)s->n_nodes);
    else if (s->verbose)
        fprintf(stderr, "dist: rank %d: bucket %d of %d (%d gradients, %.2f MiB) started after the run\n",
                keel_coll_rank(s->c), s->next + 1, s->n_b, b->count, (double)b->bytes / 1048576.0);
    s->next++;
    return keel_coll_allreduce_tensors(s->c, s->be, s->bufs + b->first, b->count);
}

int keel_grad_sync_node(keel_grad_sync *s, int64_t index) {
    while (s->next < s->n_b && s->b[s->next].ready <= index)
        if (start(s, index)) return -1;
    return 0;
}

int keel_grad_sync_finish(keel_grad_sync *s) {
    while (s->next < s->n_b)
        if (start(s, -1)) return -1;
    return keel_coll_wait(s->c, s->be);
}
