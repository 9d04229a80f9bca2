/* keel: runs of nodes replayed as CUDA graphs. A step launches thousands of kernels, each a few
 * microseconds of host work; replaying a captured graph launches them all at once. What a node's
 * kernels do depends only on what its launch sees on the host: its op, types, shapes, strides,
 * addresses, scratch and parameters, and those of its sources (ids are checked on the device, the
 * RoPE tables and cuBLASLt's choices are made once), which is the node's key here. A node whose key
 * is the same as the last time this graph ran is stable; a run of stable nodes is captured (the
 * second time it is seen) and replayed while every key in it still matches, byte for byte. AdamW's
 * step and learning rate, which change every step, are not in its key: its kernel reads them from
 * the node's slot of device memory, uploaded when a run starts (cuda_adamw_upload), and the slot is
 * in the key instead, so a whole training step is one stable run. A replay launches the same
 * kernels with the same arguments in the same order: the same bits.
 * Capture needs a run without host waits; should one fail, the nodes run one by one from then on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"

typedef struct {
    int op, type;
    int64_t ne[4], nb[4];
    void *data;
} src_key;

typedef struct {
    int op, type;
    int64_t ne[4], nb[4], ip[KEEL_MAX_IP];
    double fp[KEEL_MAX_FP];
    void *data, *scratch;
    size_t scratch_bytes;
    src_key src[KEEL_MAX_SRC];
} node_key;

typedef struct {
    const keel_graph *g;
    int64_t from, to;
    node_key *keys;
    cudaGraphExec_t exec;
    uint64_t used;
} graph_entry;

/* GRAPH_ENTRIES captured runs are kept (the least recently used one goes); after GRAPH_CAPTURES
 * captures graphs go off (runs that keep changing, such as a step split by per-step dropout
 * counters into more runs than are kept, would cost a capture each time); a run needs GRAPH_MIN
 * kernels to be worth a graph. */
#define GRAPH_ENTRIES  16
#define GRAPH_CAPTURES 64
#define GRAPH_MIN      8

struct cuda_graphs {
    const keel_graph *last_g; /* the keys of the last graph run, node by node */
    int64_t last_n;
    node_key *last;
    bool *seen;
    graph_entry e[GRAPH_ENTRIES];
    int n;
    uint64_t clock;
    int captures;
    bool broken; /* a capture failed, or too many were needed: nodes one by one from then on */
};

static void key_of(const cuda_impl *im, const keel_tensor *t, node_key *k) {
    memset(k, 0, sizeof *k); /* padding too: keys are compared with memcmp */
    k->op = t->op, k->type = (int)t->type;
    memcpy(k->ne, t->ne, sizeof k->ne), memcpy(k->nb, t->nb, sizeof k->nb);
    memcpy(k->ip, t->ip, sizeof k->ip), memcpy(k->fp, t->fp, sizeof k->fp);
    if (t->op == KEEL_OP_ADAMW || t->op == KEEL_OP_ADAMW_SHADOW)
        k->fp[0] = 0, k->ip[0] = cuda_adamw_slot(im, t); /* lr and step: in the slot */
    k->data = t->data, k->scratch = t->scratch, k->scratch_bytes = t->scratch_bytes;
    for (int i = 0; i < KEEL_MAX_SRC; i++) {
        const keel_tensor *s = t->src[i];
        if (!s) continue;
        k->src[i].op = s->op, k->src[i].type = (int)s->type;
        memcpy(k->src[i].ne, s->ne, sizeof s->ne), memcpy(k->src[i].nb, s->nb, sizeof s->nb);
        k->src[i].data = s->data;
    }
}

int cuda_graphs_init(cuda_impl *im) {
    const char *e = getenv("KEEL_CUDA_GRAPH");
    if (e && *e && strcmp(e, "1") != 0) {
        if (strcmp(e, "0") != 0) return keel_fail("KEEL_CUDA_GRAPH='%s': expected 0 (off) or 1 (on, the default)", e);
        return 0;
    }
    im->graphs = (cuda_graphs *)calloc(1, sizeof *im->graphs);
    return im->graphs ? 0 : keel_fail("out of memory");
}

static void drop(graph_entry *e) {
    cudaGraphExecDestroy(e->exec);
    free(e->keys);
    memset(e, 0, sizeof *e);
}

void cuda_graphs_free(cuda_impl *im) {
    cuda_graphs *G = im->graphs;
    if (!G) return;
    for (int i = 0; i < G->n; i++) drop(&G->e[i]);
    free(G->last), free(G->seen), free(G);
    im->graphs = NULL;
}

static int one_by_one(keel_backend *be, const keel_graph *g, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; i++)
        if (cuda_launch_node(be, g->nodes[i], i)) return -1;
    return 0;
}

static int kernels_in(const keel_graph *g, int64_t from, int64_t to) {
    int n = 0;
    for (int64_t i = from; i < to && n < GRAPH_MIN; i++) n += !(keel_op_get(g->nodes[i]->op)->flags & OPF_VIEW);
    return n;
}

/* Nodes [from, to) captured into a new entry (the least recently used one replaced when all are
 * taken); NULL when capture fails (the work was not run: the caller runs it one by one). */
static graph_entry *capture(keel_backend *be, const keel_graph *g, int64_t from, int64_t to, const node_key *keys) {
    cuda_impl *im = cuda_im(be);
    cuda_graphs *G = im->graphs;
    node_key *kc = (node_key *)malloc((size_t)(to - from) * sizeof *kc);
    if (!kc) return NULL;
    memcpy(kc, keys, (size_t)(to - from) * sizeof *kc);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    bool ok = cudaStreamBeginCapture(im->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
        bool launched = one_by_one(be, g, from, to) == 0;
        ok = cudaStreamEndCapture(im->stream, &graph) == cudaSuccess && launched && graph;
    }
    if (ok) ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    if (!ok) {
        const char *why = cudaGetErrorString(cudaGetLastError()); /* and the error cleared */
        fprintf(stderr,
                "cuda: nodes %lld..%lld could not be captured as a CUDA graph (%s: %s); nodes run one by "
                "one from now on\n",
                (long long)from, (long long)to - 1, why, keel_last_error());
        free(kc);
        G->broken = true;
        return NULL;
    }
    if (++G->captures == GRAPH_CAPTURES) {
        fprintf(stderr,
                "cuda: %d runs of nodes captured as CUDA graphs and they keep changing; nodes run one by "
                "one from now on\n",
                GRAPH_CAPTURES);
        G->broken = true;
    }
    int slot = G->n < GRAPH_ENTRIES ? G->n++ : 0;
    for (int i = 0; i < G->n && G->n == GRAPH_ENTRIES; i++)
        if (G->e[i].used < G->e[slot].used) slot = i;
    if (G->e[slot].exec) drop(&G->e[slot]);
    graph_entry *e = &G->e[slot];
    e->g = g, e->from = from, e->to = to, e->keys = kc, e->exec = exec;
    return e;
}

static int run_stable(keel_backend *be, const keel_graph *g, int64_t from, int64_t to, const node_key *keys) {
    cuda_impl *im = cuda_im(be);
    cuda_graphs *G = im->graphs;
    if (G->broken || kernels_in(g, from, to) < GRAPH_MIN) return one_by_one(be, g, from, to);
    graph_entry *e = NULL;
    for (int i = 0; i < G->n && !e; i++) {
        graph_entry *c = &G->e[i];
        if (c->g == g && c->from == from && c->to == to && !memcmp(c->keys, keys, (size_t)(to - from) * sizeof *keys))
            e = c;
    }
    if (!e && !(e = capture(be, g, from, to, keys))) return one_by_one(be, g, from, to);
    e->used = ++G->clock;
    if (im->graph_time && !im->gt_pending) {
        if (cuda_check(cudaEventRecord(im->gt0, im->stream), "event", g->nodes[from])) return -1;
        im->gt_pending = 1, im->gt_from = from;
    }
    if (cuda_check(cudaGraphLaunch(e->exec, im->stream), "CUDA graph launch", g->nodes[from])) return -1;
    im->gt_to = to;
    return im->graph_time ? cuda_check(cudaEventRecord(im->gt1, im->stream), "event", g->nodes[from]) : 0;
}

int cuda_graphs_run(keel_backend *be, const keel_graph *g, int64_t from, int64_t to) {
    cuda_graphs *G = cuda_im(be)->graphs;
    if (G->last_g != g || G->last_n != g->n_nodes) {
        node_key *l = (node_key *)realloc(G->last, (size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *l);
        if (l) G->last = l;
        bool *s = (bool *)realloc(G->seen, (size_t)(g->n_nodes ? g->n_nodes : 1));
        if (s) G->seen = s;
        if (!l || !s) return keel_fail("out of memory");
        memset(G->seen, 0, (size_t)g->n_nodes);
        G->last_g = g, G->last_n = g->n_nodes;
    }
    node_key *cur = (node_key *)malloc((size_t)(to > from ? to - from : 1) * sizeof *cur);
    if (!cur) return keel_fail("out of memory");
    int rc = 0;
    for (int64_t i = from; i < to && !rc;) {
        int64_t j = i;
        /* the run of stable nodes from i */
        for (; j < to; j++) {
            key_of(cuda_im(be), g->nodes[j], &cur[j - from]);
            if (!G->seen[j] || memcmp(&G->last[j], &cur[j - from], sizeof *cur)) break;
        }
        if (j > i) {
            rc = run_stable(be, g, i, j, cur + (i - from));
            i = j;
            continue;
        }
        G->last[i] = cur[i - from], G->seen[i] = true; /* changed or new: one launch, stable next time if unchanged */
        rc = cuda_launch_node(be, g->nodes[i], i);
        i++;
    }
    free(cur);
    return rc;
}
