#include "plan/plan.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/error.h"

typedef struct {
    size_t off, size;
} block;

typedef struct {
    block *free;
    int n, cap;
    size_t top;
} arena;

static size_t align_up(size_t x) { return (x + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN; }

/* Best fit among free blocks, else grow the top. Deterministic: ties go to the lowest offset. */
static size_t arena_alloc(arena *a, size_t size) {
    int best = -1;
    for (int i = 0; i < a->n; i++)
        if (a->free[i].size >= size && (best < 0 || a->free[i].size < a->free[best].size)) best = i;
    if (best < 0) {
        /* a free block touching the top can be extended */
        if (a->n > 0 && a->free[a->n - 1].off + a->free[a->n - 1].size == a->top) {
            size_t off = a->free[a->n - 1].off;
            a->n--;
            a->top = off + size;
            return off;
        }
        size_t off = a->top;
        a->top += size;
        return off;
    }
    size_t off = a->free[best].off;
    a->free[best].off += size;
    a->free[best].size -= size;
    if (a->free[best].size == 0) {
        memmove(&a->free[best], &a->free[best + 1], (size_t)(a->n - best - 1) * sizeof(block));
        a->n--;
    }
    return off;
}

static int arena_free(arena *a, size_t off, size_t size) {
    int i = 0;
    while (i < a->n && a->free[i].off < off) i++;
    if (a->n == a->cap) {
        int c = a->cap ? a->cap * 2 : 64;
        block *nb = realloc(a->free, (size_t)c * sizeof *nb);
        if (!nb) return keel_fail("out of memory in the memory plan");
        a->free = nb;
        a->cap = c;
    }
    memmove(&a->free[i + 1], &a->free[i], (size_t)(a->n - i) * sizeof(block));
    a->free[i] = (block){off, size};
    a->n++;
    /* merge with the next, then the previous */
    if (i + 1 < a->n && a->free[i].off + a->free[i].size == a->free[i + 1].off) {
        a->free[i].size += a->free[i + 1].size;
        memmove(&a->free[i + 1], &a->free[i + 2], (size_t)(a->n - i - 2) * sizeof(block));
        a->n--;
    }
    if (i > 0 && a->free[i - 1].off + a->free[i - 1].size == a->free[i].off) {
        a->free[i - 1].size += a->free[i].size;
        memmove(&a->free[i], &a->free[i + 1], (size_t)(a->n - i - 1) * sizeof(block));
        a->n--;
    }
    return 0;
}

static bool is_root(const keel_tensor *t) { return t->view_src == NULL; }

/* A group's flat tensor stands for its members' bytes: every node that writes a member (in place
 * too) must come before the first node that reads or writes the flat tensor. mark: n_ids zeroed
 * bytes, left zeroed. */
static int group_order(const keel_graph *g, const keel_group *gr, uint8_t *mark) {
    int64_t first = -1, last_write = -1;
    for (int i = 0; i < gr->n; i++) mark[gr->members[i]->id] = 1;
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        int arity = keel_op_get(t->op)->arity;
        bool reads = keel_root(t) == gr->flat;
        for (int s = 0; s < arity; s++) reads = reads || keel_root(t->src[s]) == gr->flat;
        if (reads && first < 0) first = i;
        if (mark[keel_root(t)->id]) last_write = i;
    }
    for (int i = 0; i < gr->n; i++) mark[gr->members[i]->id] = 0;
    if (first >= 0 && last_write > first)
        return keel_fail("group '%s': node '%s' writes a member after node '%s' reads the group", gr->flat->name,
                         g->nodes[last_write]->name, g->nodes[first]->name);
    return 0;
}

/* Persistent roots (leaves, group members, the roots of anything flagged to survive the run) and
 * each root's last use: the last node that reads it or writes into it (last_use: -1 first). */
static void lifetimes(const keel_graph *g, uint8_t *persist, int64_t *last_use) {
    for (int64_t i = 0; i < g->n_leafs; i++) persist[g->leafs[i]->id] = 1;
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        if (t->flags & (KEEL_FLAG_OUTPUT | KEEL_FLAG_PARAM | KEEL_FLAG_LOSS | KEEL_FLAG_INPUT))
            persist[keel_root(t)->id] = 1;
    }
    for (int k = 0; k < g->n_groups; k++)
        for (int i = 0; i < g->groups[k].n; i++) persist[g->groups[k].members[i]->id] = 1;
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        int arity = keel_op_get(t->op)->arity;
        for (int s = 0; s < arity; s++) last_use[keel_root(t->src[s])->id] = i;
        last_use[keel_root(t)->id] = i;
    }
}

keel_plan *keel_plan_make(const keel_graph *g, const keel_plan_opts *opts) {
    keel_plan_opts o = opts ? *opts : (keel_plan_opts){0};
    int64_t n_ids = keel_ctx_count(g->ctx);
    keel_plan *p = calloc(1, sizeof *p);
    int64_t *last_use = malloc((size_t)n_ids * sizeof *last_use);
    uint8_t *persist = calloc((size_t)n_ids, 1), *mark = calloc((size_t)n_ids, 1);
    int64_t *reader_of = NULL; /* by node index: the node that reads the block this one writes, -1: none */
    arena ar = {0};
    if (!p || !last_use || !persist || !mark) goto oom;
    p->offset = malloc((size_t)n_ids * sizeof *p->offset);
    p->scratch_offset = malloc((size_t)n_ids * sizeof *p->scratch_offset);
    p->scratch_size = calloc((size_t)n_ids, sizeof *p->scratch_size);
    p->carry_offset = malloc((size_t)n_ids * sizeof *p->carry_offset);
    p->carry_size = calloc((size_t)n_ids, sizeof *p->carry_size);
    p->carry_from = malloc((size_t)n_ids * sizeof *p->carry_from);
    reader_of = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *reader_of);
    if (!p->offset || !p->scratch_offset || !p->scratch_size || !p->carry_offset || !p->carry_size ||
        !p->carry_from || !reader_of)
        goto oom;
    p->n_offset = n_ids;
    p->guard_bytes = align_up(o.guard_bytes);
    p->scratch_max_node = -1;
    for (int64_t i = 0; i < n_ids; i++)
        p->offset[i] = p->scratch_offset[i] = p->carry_offset[i] = SIZE_MAX, last_use[i] = -1, p->carry_from[i] = -1;
    /* Carried blocks first: the pairs they make are what the scratch rule sizes each node's scratch by */
    for (int64_t i = 0; i < g->n_nodes; i++) g->nodes[i]->carry_peer = NULL, reader_of[i] = -1;
    for (int64_t i = 0; o.carry && i < g->n_nodes; i++) {
        int64_t w = -1;
        size_t bytes = o.carry(o.scratch_ud, g, i, &w);
        if (!bytes || w < 0 || w >= i || reader_of[w] >= 0) continue;
        reader_of[w] = i;
        p->carry_size[g->nodes[i]->id] = bytes, p->carry_from[g->nodes[i]->id] = w;
        g->nodes[w]->carry_peer = g->nodes[i], g->nodes[i]->carry_peer = g->nodes[w];
        p->n_carried++;
    }

    lifetimes(g, persist, last_use);
    size_t gb = p->guard_bytes;
#define SIZE_OF(t) (align_up(keel_nbytes(t)) + 2 * gb)
    /* Groups first: one block each, the members at their offsets inside it (persistent). */
    for (int k = 0; k < g->n_groups; k++) {
        const keel_group *gr = &g->groups[k];
        if (group_order(g, gr, mark)) goto fail;
        size_t at = arena_alloc(&ar, SIZE_OF(gr->flat)) + gb;
        p->offset[gr->flat->id] = at;
        for (int i = 0; i < gr->n; i++) p->offset[gr->members[i]->id] = at + (size_t)gr->offset[i];
        p->persistent_bytes += SIZE_OF(gr->flat);
        p->n_roots++;
    }
    for (int64_t i = 0; i < g->n_leafs; i++) {
        keel_tensor *t = g->leafs[i];
        if (p->offset[t->id] != SIZE_MAX) continue;            /* in a group */
        if ((t->flags & KEEL_FLAG_BOUND) && t->data) continue; /* already placed by another session */
        p->offset[t->id] = arena_alloc(&ar, SIZE_OF(t)) + gb;
        p->persistent_bytes += SIZE_OF(t);
        p->n_roots++;
    }
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        if (is_root(t) && persist[t->id] && p->offset[t->id] == SIZE_MAX) {
            p->offset[t->id] = arena_alloc(&ar, SIZE_OF(t)) + gb;
            p->persistent_bytes += SIZE_OF(t);
            p->n_roots++;
        }
    }
    size_t base_top = ar.top;
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        if (is_root(t) && !persist[t->id]) {
            p->offset[t->id] = arena_alloc(&ar, SIZE_OF(t)) + gb;
            p->n_roots++;
        }
        /* the node's scratch: placed after its result, while its sources are live, freed with them */
        size_t scr = o.scratch_bytes ? o.scratch_bytes(o.scratch_ud, t) : 0;
        if (scr) {
            p->scratch_size[t->id] = scr;
            p->scratch_offset[t->id] = arena_alloc(&ar, align_up(scr) + 2 * gb) + gb;
            if (scr > p->scratch_max) p->scratch_max = scr, p->scratch_max_node = i;
        }
        if (reader_of[i] >= 0) { /* a block this node writes for a later one: live until that one has run */
            int64_t rid = g->nodes[reader_of[i]]->id;
            p->carry_offset[rid] = arena_alloc(&ar, align_up(p->carry_size[rid]) + 2 * gb) + gb;
        }
        if (ar.top - base_top > p->peak_activation_bytes)
            p->peak_activation_bytes = ar.top - base_top, p->peak_node = i;
        if (o.no_reuse) continue;
        if (scr && arena_free(&ar, p->scratch_offset[t->id] - gb, align_up(scr) + 2 * gb)) goto fail;
        if (p->carry_size[t->id] &&
            arena_free(&ar, p->carry_offset[t->id] - gb, align_up(p->carry_size[t->id]) + 2 * gb))
            goto fail;
        /* free what node i was the last to touch (its sources, and itself if nothing reads it) */
        int arity = keel_op_get(t->op)->arity;
        for (int s = -1; s < arity; s++) {
            keel_tensor *r = keel_root(s < 0 ? t : t->src[s]);
            if (persist[r->id] || last_use[r->id] != i || p->offset[r->id] == SIZE_MAX) continue;
            last_use[r->id] = -2; /* freed once, even if it appears twice among the sources */
            if (arena_free(&ar, p->offset[r->id] - gb, SIZE_OF(r))) goto fail;
        }
    }
#undef SIZE_OF
    p->total_bytes = ar.top;
    free(ar.free);
    free(reader_of);
    free(last_use);
    free(persist);
    free(mark);
    return p;
oom:
    keel_fail("out of memory making the memory plan");
fail:
    free(ar.free);
    free(reader_of);
    free(last_use);
    free(persist);
    free(mark);
    keel_plan_free(p);
    return NULL;
}

void keel_plan_free(keel_plan *p) {
    if (!p) return;
    free(p->offset);
    free(p->scratch_offset);
    free(p->scratch_size);
    free(p->carry_offset);
    free(p->carry_size);
    free(p->carry_from);
    free(p);
}

void keel_plan_bind(const keel_plan *p, const keel_graph *g, void *base) {
    char *b = base;
    for (int64_t i = 0; i < g->n_leafs; i++)
        if (p->offset[g->leafs[i]->id] != SIZE_MAX) g->leafs[i]->data = b + p->offset[g->leafs[i]->id];
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        if (is_root(t)) t->data = b + p->offset[t->id];
        t->scratch_bytes = p->scratch_size[t->id];
        t->scratch = t->scratch_bytes ? b + p->scratch_offset[t->id] : NULL;
        t->carry = NULL, t->carry_bytes = 0;
    }
    for (int64_t i = 0; i < g->n_nodes; i++) { /* the reader's block, and its writer's (the same) */
        keel_tensor *t = g->nodes[i];
        if (!p->carry_size[t->id] || !t->carry_peer) continue;
        t->carry = t->carry_peer->carry = b + p->carry_offset[t->id];
        t->carry_bytes = t->carry_peer->carry_bytes = p->carry_size[t->id];
    }
    for (int k = 0; k < g->n_groups; k++) { /* members no node reads but through the group (the moments) */
        g->groups[k].flat->data = b + p->offset[g->groups[k].flat->id];
        for (int i = 0; i < g->groups[k].n; i++)
            g->groups[k].members[i]->data = b + p->offset[g->groups[k].members[i]->id];
    }
    for (int64_t i = 0; i < g->n_nodes; i++) {
        keel_tensor *t = g->nodes[i];
        if (!is_root(t)) t->data = (char *)t->view_src->data + t->view_offs;
    }
}

static int by_size_desc(const void *a, const void *b) {
    size_t x = keel_nbytes(*(const keel_tensor *const *)a), y = keel_nbytes(*(const keel_tensor *const *)b);
    return x < y ? 1 : x > y ? -1 : 0;
}

size_t keel_plan_carried_at(const keel_graph *g, const keel_plan *p, int64_t at, int64_t *n) {
    size_t bytes = 0;
    *n = 0;
    for (int64_t r = at; r < g->n_nodes; r++) {
        int64_t id = g->nodes[r]->id;
        if (p->carry_size[id] && p->carry_from[id] <= at) bytes += p->carry_size[id], (*n)++;
    }
    return bytes;
}

int64_t keel_plan_live_at(const keel_graph *g, int64_t at, const keel_tensor **out, int64_t max) {
    int64_t n_ids = keel_ctx_count(g->ctx), n = 0;
    uint8_t *persist = calloc((size_t)n_ids, 1);
    int64_t *last_use = malloc((size_t)n_ids * sizeof *last_use);
    const keel_tensor **live = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *live);
    if (!persist || !last_use || !live) {
        free(persist), free(last_use), free(live);
        return keel_fail("out of memory");
    }
    for (int64_t i = 0; i < n_ids; i++) last_use[i] = -1;
    lifetimes(g, persist, last_use);
    for (int64_t i = 0; i <= at && i < g->n_nodes; i++) { /* made at or before `at`, used at or after it */
        const keel_tensor *t = g->nodes[i];
        if (is_root(t) && !persist[t->id] && last_use[t->id] >= at) live[n++] = t;
    }
    qsort(live, (size_t)n, sizeof *live, by_size_desc);
    for (int64_t i = 0; i < n && i < max; i++) out[i] = live[i];
    free(persist), free(last_use), free(live);
    return n;
}
