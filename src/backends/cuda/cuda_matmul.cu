/* keel: MUL_MAT and OUT_PROD through cuBLASLt (cuda_lt.cu: single or strided-batched, float32 or
 * bf16 operands, CUBLAS_COMPUTE_32F: float32 sums, no TF32; the result float32, or bf16 when asked).
 * cuBLAS is column-major; keel's dim 0 is the fastest, so a keel matrix X(r, c) at r*nb0 + c*nb1
 * is a column-major r x c matrix when nb0 is the element size and the transpose of one when nb1
 * is. Operands with neither layout are first made contiguous by the copy path. With one stream and
 * a fixed call sequence cuBLAS gives bitwise repeatable results. */
#include "backends/cuda/cuda_internal.h"

typedef struct {
    const char *p;
    int64_t ld;               /* leading dimension, elements */
    bool transposed;          /* stored as the transpose of (rows x cols) */
    int64_t stride2, stride3; /* elements between matrices along dims 2 and 3 */
    int64_t es;               /* element size, bytes */
    cudaDataType_t dt;        /* CUDA_R_32F or CUDA_R_16BF */
} mat;

/* Describe t's dims (0,1) as a rows x cols matrix; false when cuBLAS cannot take it as is. */
static bool describe(const keel_tensor *t, mat *m) {
    int64_t r = t->ne[0], c = t->ne[1], es = (int64_t)keel_type_size(t->type);
    m->p = (const char *)t->data;
    m->es = es, m->dt = t->type == KEEL_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    if (t->nb[2] % es || t->nb[3] % es || t->nb[0] % es || t->nb[1] % es) return false;
    m->stride2 = t->nb[2] / es, m->stride3 = t->nb[3] / es;
    if (t->nb[0] == es && (c == 1 || t->nb[1] / es >= r)) {
        m->transposed = false, m->ld = c == 1 ? (r > 0 ? r : 1) : t->nb[1] / es;
        return true;
    }
    if (t->nb[1] == es && (r == 1 || t->nb[0] / es >= c)) {
        m->transposed = true, m->ld = r == 1 ? (c > 0 ? c : 1) : t->nb[0] / es;
        return true;
    }
    return false;
}

/* Whether t's matrices along dims 2 and 3 continue its columns evenly (column c of matrix (i2,
 * i3) is column c + ne1 (i2 + ne2 i3) of one wide matrix), so that a weight broadcast over them
 * meets one wide product instead of ne2 ne3 narrow ones: cuBLAS runs a 4096-column product
 * faster than four of 1024. */
static bool merges(const keel_tensor *t, const mat *m) {
    return !m->transposed && (int64_t)t->nb[1] == m->ld * m->es && (t->ne[2] == 1 || t->nb[2] == t->ne[1] * t->nb[1]) &&
           (t->ne[3] == 1 || t->nb[3] == t->ne[2] * t->nb[2]);
}

/* A contiguous copy of t in scratch (offset `at` bytes), through the copy path. */
static const keel_tensor *contiguous(keel_backend *be, const keel_tensor *t, keel_tensor *tmp, char *base, size_t at) {
    *tmp = *t;
    keel_set_contiguous_strides(tmp);
    tmp->data = base + at;
    return cuda_copy(be, tmp, t, false) ? NULL : tmp;
}

static size_t round_up(size_t n) { return (n + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN; }
static size_t bytes_contig(const keel_tensor *t) { return (size_t)keel_nelements(t) * keel_type_size(t->type); }

/* OUT_PROD's bf16 result summed over a group: float32 sums, rounded once */
static bool f32_sum_of(const keel_tensor *t) {
    const keel_tensor *a = t->src[0];
    return t->op == KEEL_OP_OUT_PROD && t->type == KEEL_BF16 && (a->ne[2] != t->ne[2] || a->ne[3] != t->ne[3]);
}

/* Which of a, b and the result cuBLAS can take as they are, and the scratch: cuBLASLt's workspace,
 * then copies of the others. */
static size_t layout(const keel_tensor *t, mat *ma, mat *mb, mat *mc, bool *oka, bool *okb, bool *okc) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    bool f32_sum = f32_sum_of(t);
    *oka = describe(a, ma), *okb = describe(b, mb);
    *okc = describe(t, mc) && !mc->transposed && !f32_sum;
    return KEEL_CUDA_LT_WORKSPACE + (*oka ? 0 : round_up(bytes_contig(a))) + (*okb ? 0 : round_up(bytes_contig(b))) +
           (*okc ? 0 : round_up((size_t)keel_nelements(t) * (f32_sum ? 4 : keel_type_size(t->type))));
}

size_t cuda_matmul_scratch(const keel_tensor *t) {
    mat ma, mb, mc;
    bool oka, okb, okc;
    return layout(t, &ma, &mb, &mc, &oka, &okb, &okc);
}

/* Operands (and the result when it is not plain, or when f32_sum asks for float32 sums of a bf16
 * result: then a float32 scratch result, converted once at the end) as cuBLAS can take them. */
static int prepare(keel_backend *be, const keel_tensor *t, const keel_tensor **a, const keel_tensor **b,
                   keel_tensor *ta, keel_tensor *tb, keel_tensor *tc, bool *c_tmp, mat *ma, mat *mb, mat *mc,
                   bool f32_sum, void **ws) {
    bool oka, okb, okc;
    size_t need = layout(t, ma, mb, mc, &oka, &okb, &okc);
    *c_tmp = !okc;
    char *base = (char *)cuda_scratch(be, need, t);
    if (!base) return -1;
    *ws = base;
    size_t at = KEEL_CUDA_LT_WORKSPACE;
    if (!oka) {
        if (!(*a = contiguous(be, *a, ta, base, at))) return -1;
        at += round_up(bytes_contig(ta));
        describe(*a, ma);
    }
    if (!okb) {
        if (!(*b = contiguous(be, *b, tb, base, at))) return -1;
        at += round_up(bytes_contig(tb));
        describe(*b, mb);
    }
    if (!okc) {
        *tc = *t;
        if (f32_sum) tc->type = KEEL_F32;
        keel_set_contiguous_strides(tc);
        tc->data = base + at;
        describe(tc, mc);
    }
    return 0;
}

/* Element offset e of matrix data p with elements of es bytes. */
static const char *at_el(const char *p, int64_t e, int64_t es) { return p + e * es; }

/* D at pc (C at pcc, laid out as D, when not NULL: D = op(A) op(B) + C) */
static int gemm(keel_backend *be, const keel_tensor *t, void *ws, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                const mat *A, const char *pa, const mat *B, const char *pb, char *pc, const char *pcc,
                cudaDataType_t dc, int64_t ldc, float beta, int64_t batch, int64_t sa, int64_t sb, int64_t sc) {
    cuda_gemm g = cuda_gemm_plain(ta, tb, m, n, k, pa, A->dt, A->ld, pb, B->dt, B->ld, pc, dc, ldc, beta);
    g.c = pcc, g.dtc = dc, g.ldc = ldc, g.sc = sc; /* the addend laid out as the result */
    g.batch = batch, g.sa = sa, g.sb = sb, g.sd = sc;
    return cuda_gemm_run(be, &g, ws, t);
}

/* MUL_MAT: t(m, n) = sum_k a(k, m) b(k, n) for every matrix of b; a broadcast over b's dims 2, 3.
 * MUL_MAT_ADD: plus c(m, n), cuBLASLt's C input when c is laid out as the result, else copied into
 * the result first and added there (beta 1). */
int cuda_matmul(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    keel_tensor ta, tb, tc;
    mat ma, mb, mc;
    bool c_tmp;
    void *ws;
    if (prepare(be, t, &a, &b, &ta, &tb, &tc, &c_tmp, &ma, &mb, &mc, false, &ws)) return -1;
    int64_t M = t->ne[0], N = t->ne[1], K = a->ne[0], r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    if (M == 0 || N == 0) return 0;
    if (K == 0) return keel_fail("cuda: %s '%s' with K = 0", keel_op_get(t->op)->name, t->name);
    /* a(k, m) column-major K x M needs a transpose to be op(A) = M x K */
    bool opa = !ma.transposed, opb = mb.transposed;
    char *c0 = (char *)(c_tmp ? tc.data : t->data);
    const char *add = NULL; /* the addend's matrices at the result's offsets from add */
    float beta = 0.0f;
    if (t->op == KEEL_OP_MUL_MAT_ADD) {
        mat md;
        const keel_tensor *d = t->src[2];
        beta = 1.0f;
        if (!c_tmp && describe(d, &md) && !md.transposed && md.ld == mc.ld && md.stride2 == mc.stride2 &&
            md.stride3 == mc.stride3 && md.dt == mc.dt)
            add = md.p;
        else if (cuda_copy(be, c_tmp ? &tc : t, d, false))
            return -1;
    }
#define ADDEND(pc) (add ? add + ((pc)-c0) : NULL)
    if (a->ne[2] == 1 && a->ne[3] == 1 && merges(b, &mb) &&
        merges(c_tmp ? &tc : t, &mc)) /* one weight, every matrix of b */
        return gemm(be, t, ws, opa, opb, M, N * t->ne[2] * t->ne[3], K, &ma, ma.p, &mb, mb.p, c0, ADDEND(c0), mc.dt,
                    mc.ld, beta, 1, 0, 0, 0) ||
                       (c_tmp && cuda_copy(be, t, &tc, false))
                   ? -1
                   : 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        const char *pa3 = at_el(ma.p, (i3 / r3) * ma.stride3, ma.es), *pb3 = at_el(mb.p, i3 * mb.stride3, mb.es);
        char *pc3 = c0 + i3 * mc.stride3 * mc.es;
        if (r2 == 1) {
            if (gemm(be, t, ws, opa, opb, M, N, K, &ma, pa3, &mb, pb3, pc3, ADDEND(pc3), mc.dt, mc.ld, beta, t->ne[2],
                     ma.stride2, mb.stride2, mc.stride2))
                return -1;
            continue;
        }
        /* broadcast a (grouped-query attention): for each member g of a group, one batched call over
         * the groups, matrices i2 = h r2 + g of b and t against matrix h of a */
        for (int64_t g = 0; g < r2; g++)
            if (gemm(be, t, ws, opa, opb, M, N, K, &ma, pa3, &mb, at_el(pb3, g * mb.stride2, mb.es),
                     pc3 + g * mc.stride2 * mc.es, ADDEND(pc3 + g * mc.stride2 * mc.es), mc.dt, mc.ld, beta,
                     t->ne[2] / r2, ma.stride2, r2 * mb.stride2, r2 * mc.stride2))
                return -1;
    }
#undef ADDEND
    return c_tmp ? cuda_copy(be, t, &tc, false) : 0;
}

/* OUT_PROD: t(i, j) = sum_k a(i, k) b(j, k), each result matrix summing its group of source
 * matrices: as one product over the whole group when its matrices lie end to end, else in a
 * fixed order (g3 outer, g2 inner), the first product assigning and the rest adding. */
int cuda_out_prod(keel_backend *be, const keel_tensor *t) {
    const keel_tensor *a = t->src[0], *b = t->src[1];
    keel_tensor ta, tb, tc;
    mat ma, mb, mc;
    bool c_tmp;
    bool f32_sum = f32_sum_of(t);
    void *ws;
    if (prepare(be, t, &a, &b, &ta, &tb, &tc, &c_tmp, &ma, &mb, &mc, f32_sum, &ws)) return -1;
    int64_t I = t->ne[0], J = t->ne[1], K = a->ne[1], r2 = a->ne[2] / t->ne[2], r3 = a->ne[3] / t->ne[3];
    char *c0 = (char *)(c_tmp ? tc.data : t->data);
    if (I == 0 || J == 0) return 0;
    if (K == 0)
        return cuda_check(cudaMemsetAsync(c0, 0, bytes_contig(t), cuda_im(be)->stream), "memset", t) ||
                       (c_tmp && cuda_copy(be, t, &tc, false))
                   ? -1
                   : 0;
    /* a(i, k) is column-major I x K (op N) unless stored transposed; b(j, k) must become K x J */
    bool opa = ma.transposed, opb = !mb.transposed;
    if (t->ne[2] == 1 && t->ne[3] == 1 && merges(a, &ma) &&
        merges(b, &mb)) /* one result: all of a and b's matrices are one long k */
        return gemm(be, t, ws, opa, opb, I, J, K * a->ne[2] * a->ne[3], &ma, ma.p, &mb, mb.p, c0, NULL, mc.dt, mc.ld,
                    0.0f, 1, 0, 0, 0) ||
                       (c_tmp && cuda_copy(be, t, &tc, false))
                   ? -1
                   : 0;
    /* group members in a fixed order (g3 outer, g2 inner), each one call batched over the result
     * matrices along dim 2: the first assigns, the others add */
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        char *pc = c0 + i3 * mc.stride3 * mc.es;
        bool first = true;
        for (int64_t g3 = 0; g3 < r3; g3++)
            for (int64_t g2 = 0; g2 < r2; g2++) {
                int64_t s3 = i3 * r3 + g3;
                if (gemm(be, t, ws, opa, opb, I, J, K, &ma, at_el(ma.p, g2 * ma.stride2 + s3 * ma.stride3, ma.es), &mb,
                         at_el(mb.p, g2 * mb.stride2 + s3 * mb.stride3, mb.es), pc, NULL, mc.dt, mc.ld,
                         first ? 0.0f : 1.0f, t->ne[2], r2 * ma.stride2, r2 * mb.stride2, mc.stride2))
                    return -1;
                first = false;
            }
    }
    return c_tmp ? cuda_copy(be, t, &tc, false) : 0;
}
