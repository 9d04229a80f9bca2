#include "unit.h"

/* The test's own liveness (an oracle for the plan's): first[id] the node that makes a root (0 for
 * leaves), last[id] the last node that reads or writes it (N for leaves and the graph's output).
 * Caller frees both. */
static void lifetimes_of(const keel_graph *g, const keel_tensor *out, int64_t **first, int64_t **last) {
    int64_t N = g->n_nodes, ids = keel_ctx_count(g->ctx);
    int64_t *f = malloc((size_t)ids * sizeof *f), *l = malloc((size_t)ids * sizeof *l);
    assert_true(f && l);
    for (int64_t i = 0; i < ids; i++) f[i] = l[i] = -1;
    for (int64_t i = 0; i < g->n_leafs; i++) f[g->leafs[i]->id] = 0, l[g->leafs[i]->id] = N;
    for (int64_t i = 0; i < N; i++) {
        keel_tensor *t = g->nodes[i];
        if (f[t->id] < 0) f[t->id] = i;
        if (l[t->id] < i) l[t->id] = i;
        for (int k = 0; k < keel_op_get(t->op)->arity; k++)
            if (l[t->src[k]->id] < i) l[t->src[k]->id] = i;
    }
    l[out->id] = N;
    *first = f, *last = l;
}

/* Roots whose lifetimes overlap must not share bytes; every placement is 256-byte aligned. */
static void no_live_overlap(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    uint64_t s = 7;
    keel_tensor *pool[64];
    int n = 0;
    for (int i = 0; i < 4; i++) pool[n++] = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 16 + i, 3), KEEL_FLAG_INPUT);
    for (int i = 0; i < 40; i++) { /* a random DAG of same-shaped elementwise ops */
        s = s * 6364136223846793005ull + 1;
        keel_tensor *a = pool[(s >> 33) % (uint64_t)n], *b = pool[(s >> 45) % (uint64_t)n];
        keel_tensor *t = keel_same_shape(a, b) ? keel_add(ctx, a, b) : keel_sqr(ctx, a);
        assert_non_null(t);
        pool[n++] = t;
        if (n == 64) break;
    }
    keel_graph *g = keel_graph_build(ctx, &pool[n - 1], 1);
    keel_plan *p = keel_plan_make(g, NULL);
    assert_non_null(p);
    int64_t *first, *last;
    lifetimes_of(g, pool[n - 1], &first, &last);
    for (int64_t i = 0; i < keel_ctx_count(ctx); i++) {
        if (p->offset[i] == SIZE_MAX) continue;
        assert_int_equal(p->offset[i] % KEEL_ALIGN, 0);
        keel_tensor *a = keel_ctx_tensor(ctx, i);
        for (int64_t j = i + 1; j < keel_ctx_count(ctx); j++) {
            if (p->offset[j] == SIZE_MAX) continue;
            keel_tensor *b = keel_ctx_tensor(ctx, j);
            bool live_together = first[i] <= last[j] && first[j] <= last[i];
            bool bytes_overlap =
                p->offset[i] < p->offset[j] + keel_nbytes(b) && p->offset[j] < p->offset[i] + keel_nbytes(a);
            assert_false(live_together && bytes_overlap);
        }
    }
    free(first), free(last);
    keel_plan_free(p);
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* A scratch rule for the tests: nodes with an odd id take 300 + 8 id bytes. */
static size_t odd_scratch(void *ud, const keel_tensor *t) {
    (void)ud;
    return t->id % 2 ? 300 + 8 * (size_t)t->id : 0;
}

/* pool[0..2]: three inputs [40, 3]; pool[3..n-1]: a random chain of ADD and SQR over them, each node
 * reading the one or two before it, so all reach the last (seeded by seed); returns the graph of the last */
static keel_graph *random_chain(keel_ctx *ctx, keel_tensor **pool, int n, uint64_t seed) {
    int k = 0;
    for (int i = 0; i < 3; i++) pool[k++] = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 40, 3), KEEL_FLAG_INPUT);
    for (uint64_t s = seed; k < n;) {
        s = s * 6364136223846793005ull + 1;
        keel_tensor *a = pool[k - 1 - (int)((s >> 33) % 2)], *b = pool[(s >> 45) % (uint64_t)k];
        pool[k++] = (s >> 20) % 3 ? keel_add(ctx, a, b) : keel_sqr(ctx, a);
    }
    return keel_graph_build(ctx, &pool[n - 1], 1);
}

/* A node's scratch is a block of the arena live while that node runs: it overlaps nothing live
 * then (its sources, its result, what later nodes read), bind hands it to the node, and it is
 * free again after, so a chain of nodes with scratch holds one scratch at a time. */
static void scratch_per_node(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *pool[48];
    int n = 48;
    keel_graph *g = random_chain(ctx, pool, n, 11);
    keel_plan_opts o = {.scratch_bytes = odd_scratch};
    keel_plan *p = keel_plan_make(g, &o), *plain = keel_plan_make(g, NULL);
    assert_non_null(p);
    int64_t N = g->n_nodes, ids = keel_ctx_count(ctx), *first, *last;
    lifetimes_of(g, pool[n - 1], &first, &last);
    int with = 0;
    for (int64_t i = 0; i < N; i++) {
        keel_tensor *t = g->nodes[i];
        size_t sz = p->scratch_size[t->id], at = p->scratch_offset[t->id];
        assert_int_equal(sz, odd_scratch(NULL, t));
        if (!sz) continue;
        with++;
        assert_int_equal(at % KEEL_ALIGN, 0);
        assert_true(at + sz <= p->total_bytes);
        for (int64_t j = 0; j < ids; j++) /* every root live at node i keeps its bytes */
            if (p->offset[j] != SIZE_MAX && first[j] <= i && i <= last[j])
                assert_false(at < p->offset[j] + keel_nbytes(keel_ctx_tensor(ctx, j)) && p->offset[j] < at + sz);
    }
    assert_true(with > 10);
    assert_true(p->scratch_max == 300 + 8 * (size_t)g->nodes[p->scratch_max_node]->id);
    assert_true(p->total_bytes >= plain->total_bytes &&
                p->total_bytes <= plain->total_bytes + 2 * p->scratch_max + 512);
    char *base = malloc(p->total_bytes);
    keel_plan_bind(p, g, base);
    for (int64_t i = 0; i < N; i++) {
        keel_tensor *t = g->nodes[i];
        assert_int_equal(t->scratch_bytes, p->scratch_size[t->id]);
        assert_ptr_equal(t->scratch, t->scratch_bytes ? base + p->scratch_offset[t->id] : NULL);
    }
    free(base), free(first), free(last);
    keel_plan_free(p), keel_plan_free(plain);
    keel_graph_free(g);
    keel_ctx_free(ctx);

    ctx = keel_ctx_new(); /* a chain: one node's scratch at a time, not fifty */
    keel_tensor *y = keel_set_flags(keel_new_1d(ctx, KEEL_F32, 1000), KEEL_FLAG_INPUT);
    for (int i = 0; i < 50; i++) y = keel_sqr(ctx, y);
    g = keel_graph_build(ctx, &y, 1);
    p = keel_plan_make(g, &o);
    assert_true(p->total_bytes <= 4 * 4096 + 2 * 1024);
    assert_true(p->peak_activation_bytes >= p->scratch_max);
    keel_plan_free(p);
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* A carry rule for the tests: node i (i % 7 == 6) reads a block of 500 + 16 i bytes from node i - 5,
 * and node i (i % 7 == 0, i >= 14) claims node i - 6, the writer node i - 1 claimed already: the
 * first claim keeps it, this one gets none. The scratch rule sees the pairs: a node of a pair takes
 * 64 bytes more scratch. */
static size_t test_carry(void *ud, const keel_graph *g, int64_t reader, int64_t *writer) {
    (void)ud, (void)g;
    if (reader % 7 == 6) return *writer = reader - 5, 500 + 16 * (size_t)reader;
    if (reader % 7 == 0 && reader >= 14) return *writer = reader - 6, 100;
    return 0;
}
static size_t paired_scratch(void *ud, const keel_tensor *t) { return odd_scratch(ud, t) + (t->carry_peer ? 64 : 0); }

/* A carried block is live from its writer to its reader: it overlaps no root live in between, no
 * node's scratch in between and no other carried block live then; bind hands it to both nodes; a
 * second claim on a writer gets nothing; the scratch rule is asked with the pairs set. */
static void carried_blocks(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *pool[64];
    int n = 64;
    keel_graph *g = random_chain(ctx, pool, n, 5);
    keel_plan_opts o = {.scratch_bytes = paired_scratch, .carry = test_carry};
    keel_plan *p = keel_plan_make(g, &o);
    assert_non_null(p);
    int64_t N = g->n_nodes, ids = keel_ctx_count(ctx), *first, *last, pairs = 0;
    lifetimes_of(g, pool[n - 1], &first, &last);
    for (int64_t r = 0; r < N; r++) {
        keel_tensor *t = g->nodes[r];
        assert_int_equal(p->scratch_size[t->id], paired_scratch(NULL, t)); /* asked with the pairs set */
        if (r % 7 == 0 && r >= 14) {                                       /* the second claim: none */
            assert_int_equal(p->carry_size[t->id], 0);
            assert_null(t->carry_peer);
        }
        if (r % 7 != 6) continue;
        int64_t w = r - 5;
        size_t at = p->carry_offset[t->id], sz = p->carry_size[t->id];
        assert_int_equal(sz, 500 + 16 * (size_t)r);
        assert_ptr_equal(t->carry_peer, g->nodes[w]);
        assert_ptr_equal(g->nodes[w]->carry_peer, t);
        assert_int_equal(at % KEEL_ALIGN, 0);
        assert_true(at + sz <= p->total_bytes);
        pairs++;
        for (int64_t j = 0; j < ids; j++) /* roots live at some node from w to r */
            if (p->offset[j] != SIZE_MAX && first[j] <= r && w <= last[j])
                assert_false(at < p->offset[j] + keel_nbytes(keel_ctx_tensor(ctx, j)) && p->offset[j] < at + sz);
        for (int64_t i = w; i <= r; i++) { /* scratch of the nodes from w to r */
            size_t so = p->scratch_offset[g->nodes[i]->id], ss = p->scratch_size[g->nodes[i]->id];
            assert_false(ss && at < so + ss && so < at + sz);
        }
        for (int64_t r2 = r + 1; r2 < N; r2++) { /* other carried blocks live at the same time */
            const keel_tensor *t2 = g->nodes[r2];
            size_t at2 = p->carry_offset[t2->id], sz2 = p->carry_size[t2->id];
            if (sz2 && r2 - 5 <= r) assert_false(at < at2 + sz2 && at2 < at + sz);
        }
    }
    assert_int_equal(pairs, p->n_carried);
    assert_int_equal(pairs, (N + 1) / 7);
    for (int64_t at = 0; at < N; at++) { /* the blocks live at each node: written at or before, read at or after */
        size_t want = 0;
        int64_t want_n = 0, got_n = -1;
        for (int64_t r = 6; r < N; r += 7)
            if (r - 5 <= at && at <= r) want += 500 + 16 * (size_t)r, want_n++;
        assert_int_equal(keel_plan_carried_at(g, p, at, &got_n), want);
        assert_int_equal(got_n, want_n);
    }
    assert_true(pairs >= 6);
    char *base = malloc(p->total_bytes);
    keel_plan_bind(p, g, base);
    for (int64_t r = 0; r < N; r++) {
        keel_tensor *t = g->nodes[r];
        if (r % 7 == 6) {
            assert_ptr_equal(t->carry, base + p->carry_offset[t->id]);
            assert_ptr_equal(g->nodes[r - 5]->carry, t->carry);
            assert_int_equal(g->nodes[r - 5]->carry_bytes, p->carry_size[t->id]);
        } else if (!t->carry_peer) {
            assert_null(t->carry);
        }
    }
    keel_plan_free(p);
    p = keel_plan_make(g, NULL); /* a plan without the rule leaves no pairs behind */
    for (int64_t r = 0; r < N; r++) assert_null(g->nodes[r]->carry_peer);
    free(base), free(first), free(last);
    keel_plan_free(p);
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

#ifdef KEEL_HAVE_CUDA
#include "backends/cuda/cuda_api.h"

/* The delta rule's inputs: q, k [dk, 2, 65, 2], v [dv, 4, 65, 2], g, beta [4, 65, 2] (parameters),
 * positions [65, 2] */
static void gdn_inputs_of(keel_ctx *ctx, keel_tensor **x, int64_t dk, int64_t dv) {
    x[0] = keel_new_4d(ctx, KEEL_F32, dk, 2, 65, 2), x[1] = keel_new_4d(ctx, KEEL_F32, dk, 2, 65, 2);
    x[2] = keel_new_4d(ctx, KEEL_F32, dv, 4, 65, 2), x[3] = keel_new_3d(ctx, KEEL_F32, 4, 65, 2);
    x[4] = keel_new_3d(ctx, KEEL_F32, 4, 65, 2), x[5] = keel_set_flags(keel_new_2d(ctx, KEEL_I32, 65, 2), KEEL_FLAG_INPUT);
    for (int i = 0; i < 5; i++) keel_set_flags(x[i], KEEL_FLAG_PARAM);
}
static void gdn_inputs(keel_ctx *ctx, keel_tensor **x) { gdn_inputs_of(ctx, x, 16, 24); }
static int64_t node_index(const keel_graph *g, const keel_tensor *t) {
    for (int64_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i] == t) return i;
    return -1;
}
/* The backward (built by hand) of the delta rule over x, variant tc */
static keel_tensor *gdn_back(keel_ctx *ctx, keel_tensor **x, keel_tensor *dy, int64_t tc) {
    keel_tensor *src[7] = {x[0], x[1], x[2], x[3], x[4], x[5], dy};
    return keel_op_new(ctx, KEEL_OP_GATED_DELTA_NET_BACK, src, 7, (int64_t[]){tc}, 1, NULL, 0);
}

/* The cuda backend's carry rule: the delta rule's backward reads the chunk states of the forward of
 * the same variant over the same six inputs, and the plan pairs the two; another variant, or an
 * in-place write into an input between them, and the backward makes its states itself. The sizes:
 * the paired forward's scratch, the block and the paired backward's scratch are together the
 * unpaired backward's. */
static void cuda_gdn_carry(void **st) {
    (void)st;
    for (int tc = 0; tc < 2; tc++) { /* autodiff's backward: paired */
        keel_ctx *ctx = keel_ctx_new();
        keel_tensor *x[6];
        gdn_inputs(ctx, x);
        keel_tensor *y = keel_gated_delta_net(ctx, x[0], x[1], x[2], x[3], x[4], x[5], tc), *loss = keel_sum(ctx, y);
        keel_graph *g = keel_graph_build(ctx, &loss, 1);
        assert_int_equal(keel_build_backward(g, loss), 0);
        int64_t f = node_index(g, y), b = -1, w = -1;
        for (int64_t i = 0; i < g->n_nodes; i++)
            if (g->nodes[i]->op == KEEL_OP_GATED_DELTA_NET_BACK) b = i;
        assert_true(f >= 0 && b > f);
        for (int64_t i = 0; i < g->n_nodes; i++) {
            size_t bytes = keel_cuda_carry_bytes(g, i, &w);
            assert_true(i == b ? bytes > 0 && w == f : bytes == 0);
        }
        size_t unpaired_back = keel_cuda_scratch_bytes(g->nodes[b]);
        keel_plan_opts o = {0};
        assert_int_equal(keel_backend_plan_rules("cuda", &o), 0);
        keel_plan *p = keel_plan_make(g, &o);
        assert_non_null(p);
        assert_int_equal(p->n_carried, 1);
        assert_ptr_equal(g->nodes[f]->carry_peer, g->nodes[b]);
        assert_ptr_equal(g->nodes[b]->carry_peer, g->nodes[f]);
        size_t carried = p->carry_size[g->nodes[b]->id];
        assert_int_equal(p->scratch_size[g->nodes[f]->id] + carried + p->scratch_size[g->nodes[b]->id], unpaired_back);
        keel_plan_free(p);
        setenv("KEEL_CUDA_CARRY", "0", 1); /* off: nothing carried, the backward's scratch whole again */
        p = keel_plan_make(g, &o);
        assert_non_null(p);
        assert_int_equal(p->n_carried, 0);
        assert_null(g->nodes[b]->carry_peer);
        assert_int_equal(p->scratch_size[g->nodes[b]->id], unpaired_back);
        unsetenv("KEEL_CUDA_CARRY");
        keel_plan_free(p);
        keel_graph_free(g);
        keel_ctx_free(ctx);
    }
    for (int k = 0; k < 3; k++) { /* by hand: the same variant (k 0), another (1), an in-place write between (2) */
        keel_ctx *ctx = keel_ctx_new();
        keel_tensor *x[6], *outs[3];
        gdn_inputs(ctx, x);
        keel_tensor *dy = keel_set_flags(keel_new_4d(ctx, KEEL_F32, 24, 4, 65, 2), KEEL_FLAG_INPUT);
        int n = 0;
        outs[n++] = keel_gated_delta_net(ctx, x[0], x[1], x[2], x[3], x[4], x[5], true);
        if (k == 2) outs[n++] = keel_acc(ctx, x[0], keel_fill(ctx, KEEL_F32, (int64_t[]){16, 1, 1, 1}, 1.0), 64,
                                         64 * 2, 64 * 2 * 65, 0, true); /* into q's bytes */
        outs[n++] = gdn_back(ctx, x, dy, k == 1 ? 0 : 1);
        keel_graph *g = keel_graph_build(ctx, outs, n);
        int64_t f = node_index(g, outs[0]), b = node_index(g, outs[n - 1]), w = -1;
        assert_true(f >= 0 && b > f);
        if (k == 2) assert_true(node_index(g, outs[1]) > f && node_index(g, outs[1]) < b);
        size_t bytes = keel_cuda_carry_bytes(g, b, &w);
        assert_true(k == 0 ? bytes > 0 && w == f : bytes == 0);
        keel_graph_free(g);
        keel_ctx_free(ctx);
    }
}

/* The bf16 mode's variant (ip0 3) keeps the four arrays only its backward's one-part products read
 * (Kb, Ac [chunk][64][Dk], Am [chunk][64][64] and Uc [chunk][64][Dv] a lane) as bf16 where Dk and Dv
 * are multiples of 32: the carried block is those arrays' half smaller than split bf16's (ip0 2), and
 * the unpaired backward's scratch too, less r3's parts (a row sum a chunk row for each 32 of Dv where
 * ip0 2 keeps one) and the gradient pass's two bf16 [chunk][64][64] arrays; at Dk 16 the two are the
 * same size. */
static void cuda_gdn_half_arrays(void **st) {
    (void)st;
    const int64_t dv = 64;
    for (int64_t dk = 16; dk <= 32; dk += 16) {
        size_t carry[2], back[2];
        for (int v = 0; v < 2; v++) {
            keel_ctx *ctx = keel_ctx_new();
            keel_tensor *x[6];
            gdn_inputs_of(ctx, x, dk, dv);
            keel_tensor *dy = keel_set_flags(keel_new_4d(ctx, KEEL_F32, dv, 4, 65, 2), KEEL_FLAG_INPUT);
            int64_t tc = v ? KEEL_GDN_BF16_GRAD : KEEL_GDN_SPLIT_BF16, w = -1;
            keel_tensor *outs[2] = {keel_gated_delta_net(ctx, x[0], x[1], x[2], x[3], x[4], x[5], tc),
                                    gdn_back(ctx, x, dy, tc)};
            keel_graph *g = keel_graph_build(ctx, outs, 2);
            carry[v] = keel_cuda_carry_bytes(g, node_index(g, outs[1]), &w);
            assert_int_equal(w, node_index(g, outs[0]));
            back[v] = keel_cuda_scratch_bytes(outs[1]);
            keel_graph_free(g);
            keel_ctx_free(ctx);
        }
        size_t lane_chunks = 2 * 4 * 2 /* batch x value heads x chunks of 64 in 65 steps */,
               halved = dk % 32 == 0 ? lane_chunks * 64 * (size_t)(2 * dk + 64 + dv) * sizeof(float) / 2 : 0;
        size_t more = dk % 32 == 0 ? lane_chunks * 64 * (size_t)(dv / 32 - 1 + 64) * sizeof(float) : 0;
        assert_int_equal(carry[0] - carry[1], halved);
        assert_int_equal(back[0] - back[1], halved - more);
    }
}
#endif

/* A chain reuses memory: the peak holds a few activations, not the whole chain. */
static void chain_reuses(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_flags(keel_new_1d(ctx, KEEL_F32, 1000), KEEL_FLAG_INPUT);
    keel_tensor *y = x;
    for (int i = 0; i < 50; i++) y = keel_sqr(ctx, y);
    keel_graph *g = keel_graph_build(ctx, &y, 1);
    keel_plan *p = keel_plan_make(g, NULL);
    size_t one = 4096; /* 4000 bytes aligned up */
    assert_true(p->peak_activation_bytes <= 2 * one);
    assert_int_equal(p->persistent_bytes, 2 * one); /* input and output */
    assert_true(p->total_bytes <= 4 * one);
    /* no_reuse keeps everything */
    keel_plan_opts o = {.no_reuse = 1};
    keel_plan *q = keel_plan_make(g, &o);
    assert_true(q->total_bytes >= 51 * one);
    keel_plan_free(p);
    keel_plan_free(q);
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* An in-place ACC writes its source's bytes; the gradient chain FILL -> ACC -> ACC shares one buffer. */
static void inplace_aliases(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *b = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 8, 2), KEEL_FLAG_INPUT);
    int64_t ne[4] = {8, 4, 1, 1};
    keel_tensor *z = keel_fill(ctx, KEEL_F32, ne, 0.0);
    keel_tensor *a1 = keel_acc(ctx, z, b, 32, 64, 64, 0, true);
    keel_tensor *a2 = keel_acc(ctx, a1, b, 32, 64, 64, 64, true);
    assert_ptr_equal(a2->view_src, z);
    keel_graph *g = keel_graph_build(ctx, &a2, 1);
    double bv[16];
    for (int i = 0; i < 16; i++) bv[i] = i + 1;
    double *vals[1] = {bv};
    keel_tensor *leaves[1] = {b};
    double *r = run_graph("cpu", g, leaves, vals, 1, a2);
    for (int i = 0; i < 32; i++) assert_true(r[i] == bv[i % 16]);
    free(r);
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* A group: its members back to back at 256-byte boundaries inside the flat tensor's block, which
 * a node reads as one array (the gaps zero: the session fills them), and a member written after
 * the group is read is refused. */
static void groups_back_to_back(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *p1 = keel_set_flags(keel_new_1d(ctx, KEEL_F32, 5), KEEL_FLAG_INPUT);
    keel_tensor *x1 = keel_set_flags(keel_new_1d(ctx, KEEL_F32, 70), KEEL_FLAG_INPUT);
    keel_tensor *x2 = keel_set_flags(keel_new_2d(ctx, KEEL_F32, 3, 2), KEEL_FLAG_INPUT);
    keel_tensor *g1 = keel_sqr(ctx, x1), *g2 = keel_scale(ctx, x2, 2.0, 0.0);
    keel_graph *g = keel_graph_build(ctx, (keel_tensor *[]){g1, g2}, 2);
    keel_tensor *flat = keel_graph_group(g, (keel_tensor *[]){p1, g1, g2}, 3, "grp");
    assert_non_null(flat);
    assert_int_equal(keel_nelements(flat), (768 + 24) / 4); /* 0: 20 bytes, 256: 280 bytes, 768: 24 bytes */
    assert_null(keel_graph_group(g, (keel_tensor *[]){g2}, 1, "again")); /* g2 is in grp already */
    assert_null(keel_graph_group(g, (keel_tensor *[]){x1, x2, x1}, 3, "twice"));
    assert_non_null(strstr(keel_last_error(), "'twice'"));
    keel_tensor *s = keel_sum_sq(ctx, flat);
    assert_int_equal(keel_graph_expand(g, s), 0);
    s->flags |= KEEL_FLAG_OUTPUT;
    keel_plan *p = keel_plan_make(g, NULL);
    assert_non_null(p);
    size_t f = p->offset[flat->id];
    assert_int_equal(p->offset[p1->id], f);
    assert_int_equal(p->offset[g1->id], f + 256);
    assert_int_equal(p->offset[g2->id], f + 768);
    keel_plan_free(p);
    double v1[5], vx1[70], vx2[6], want = 0;
    for (int i = 0; i < 5; i++) v1[i] = 0.5 * i - 1, want += v1[i] * v1[i];
    for (int i = 0; i < 70; i++) vx1[i] = 0.03 * i, want += pow(vx1[i] * vx1[i], 2);
    for (int i = 0; i < 6; i++) vx2[i] = 1 - 0.25 * i, want += 4 * vx2[i] * vx2[i];
    double *r = run_graph("cpu", g, (keel_tensor *[]){p1, x1, x2}, (double *[]){v1, vx1, vx2}, 3, s);
    assert_true(fabs(r[0] - want) <= 1e-6 * want);
    free(r);
    keel_graph_free(g);
    keel_ctx_free(ctx);

    ctx = keel_ctx_new(); /* a member written after a node read the group */
    keel_tensor *x = keel_set_flags(keel_new_1d(ctx, KEEL_F32, 4), KEEL_FLAG_INPUT), *y = keel_sqr(ctx, x);
    g = keel_graph_build(ctx, &y, 1);
    flat = keel_graph_group(g, &y, 1, "late");
    s = keel_sum_sq(ctx, flat);
    keel_tensor *late = keel_acc(ctx, y, s, y->nb[1], y->nb[2], y->nb[3], 0, true);
    assert_int_equal(keel_graph_expand(g, late), 0);
    assert_null(keel_plan_make(g, NULL));
    assert_non_null(strstr(keel_last_error(), "writes a member after"));
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

/* keel_plan_live_at: the activations made at or before a node and used at or after it, largest
 * first; persistent tensors (inputs, outputs) are not activations. */
static void live_at_node(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_set_flags(keel_new_1d(ctx, KEEL_F32, 1000), KEEL_FLAG_INPUT);
    keel_tensor *a = keel_sqr(ctx, x), *b = keel_scale(ctx, keel_view_1d(ctx, a, 10, 0), 2.0, 0.0);
    keel_tensor *c = keel_add(ctx, keel_view_1d(ctx, a, 10, 40), b), *out = keel_sum(ctx, c);
    keel_graph *g = keel_graph_build(ctx, &out, 1);
    out->flags |= KEEL_FLAG_OUTPUT;
    int64_t at = -1; /* the ADD's node */
    for (int64_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i] == c) at = i;
    assert_true(at >= 0);
    const keel_tensor *live[8];
    int64_t n = keel_plan_live_at(g, at, live, 8);
    assert_int_equal(n, 3); /* a (read by the ADD's view), b and c; not x, not out */
    assert_ptr_equal(live[0], a);
    assert_true((live[1] == b && live[2] == c) || (live[1] == c && live[2] == b));
    assert_int_equal(keel_plan_live_at(g, g->n_nodes - 1, live, 8), 1); /* the SUM: c only */
    keel_graph_free(g);
    keel_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_live_overlap),     cmocka_unit_test(chain_reuses), cmocka_unit_test(inplace_aliases),
        cmocka_unit_test(groups_back_to_back), cmocka_unit_test(live_at_node), cmocka_unit_test(scratch_per_node),
        cmocka_unit_test(carried_blocks),
#ifdef KEEL_HAVE_CUDA
        cmocka_unit_test(cuda_gdn_carry),
        cmocka_unit_test(cuda_gdn_half_arrays),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
