#include "trace/trace.h"

#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ops/ops.h"
#include "util/error.h"
#include "util/file.h"

keel_tracer *keel_tracer_new(bool keep_data, size_t max_data_bytes) {
    keel_tracer *t = calloc(1, sizeof *t);
    if (t) t->keep_data = keep_data, t->max_data_bytes = max_data_bytes;
    return t;
}

void keel_tracer_free(keel_tracer *t) {
    if (!t) return;
    for (int64_t i = 0; i < t->n; i++) free(t->r[i].data);
    free(t->r);
    free(t->hash_by_id);
    free(t);
}

static int ensure_ids(keel_tracer *t, int64_t id) {
    if (id < t->n_ids) return 0;
    int64_t n = id * 2 + 1024;
    uint64_t *h = realloc(t->hash_by_id, (size_t)n * sizeof *h);
    if (!h) return keel_fail("out of memory tracing");
    memset(h + t->n_ids, 0, (size_t)(n - t->n_ids) * sizeof *h);
    t->hash_by_id = h, t->n_ids = n;
    return 0;
}

static int record(keel_tracer *tr, keel_backend *be, const keel_tensor *x, bool is_leaf) {
    if (tr->n == tr->cap) {
        int64_t c = tr->cap ? 2 * tr->cap : 1024;
        keel_trace_rec *r = realloc(tr->r, (size_t)c * sizeof *r);
        if (!r) return keel_fail("out of memory tracing");
        tr->r = r, tr->cap = c;
    }
    size_t nb;
    unsigned char *bytes = keel_tensor_read_raw_flat(be, x, &nb); /* never the copy path it judges */
    if (!bytes) return keel_fail("trace: cannot read '%s'", x->name);
    if (!is_leaf && tr->flip && !tr->flipped && strcmp(x->name, tr->flip) == 0) {
        /* the fault switch: flip the lowest bit of element 0, in the buffer itself */
        unsigned char b0 = bytes[0] ^ 1;
        bytes[0] = b0;
        be->write(be, x->data, &b0, 1);
        tr->flipped = true;
    }
    keel_trace_rec *r = &tr->r[tr->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", x->name);
    r->op = x->op, r->type = (int32_t)x->type;
    memcpy(r->ne, x->ne, sizeof r->ne);
    memcpy(r->nb, x->nb, sizeof r->nb);
    r->n_src = is_leaf ? 0 : keel_op_get(x->op)->arity;
    for (int k = 0; k < r->n_src; k++) {
        if (ensure_ids(tr, x->src[k]->id)) return -1;
        r->src_hash[k] = tr->hash_by_id[x->src[k]->id];
        snprintf(r->src_name[k], sizeof r->src_name[k], "%s", x->src[k]->name);
    }
    r->hash = XXH64(bytes, nb, 0);
    if (!is_leaf && be->last_kernel) snprintf(r->kernel, sizeof r->kernel, "%s", be->last_kernel(be));
    int64_t n = keel_nelements(x);
    size_t es = keel_type_size(x->type);
    int64_t stride = tr->sample > 0 && n > tr->sample ? (n + tr->sample - 1) / tr->sample : 1,
            nd = (n + stride - 1) / stride;
    bool keep = tr->keep_data && tr->data_bytes + (size_t)nd * 8 <= tr->max_data_bytes;
    if (keep)
        r->data = malloc((size_t)nd * sizeof(double)), r->n_data = nd, r->data_stride = stride,
        tr->data_bytes += (size_t)nd * 8;
    for (int64_t i = 0, k = 0, next = 0; i < n; i++) {
        double v = x->type == KEEL_F32 ? (double)((const float *)(const void *)bytes)[i]
                                       : keel_load_value(x->type, bytes + (size_t)i * es);
        r->nnz += v != 0;
        r->sumsq += v * v;
        if (r->data && i == next) r->data[k++] = v, next += stride;
    }
    r->first = keel_load_value(x->type, bytes), r->last = keel_load_value(x->type, bytes + (size_t)(n - 1) * es);
    free(bytes);
    if (ensure_ids(tr, x->id)) return -1;
    tr->hash_by_id[x->id] = r->hash;
    return 0;
}

int keel_tracer_begin(keel_tracer *t, keel_backend *be, const keel_graph *g) {
    for (int64_t i = 0; i < g->n_leafs; i++)
        if (record(t, be, g->leafs[i], true)) return -1;
    return 0;
}

int keel_tracer_node(keel_backend *be, const keel_tensor *node, int64_t index, void *ud) {
    (void)index;
    return record(ud, be, node, false);
}

/* ---- the file: little-endian, whatever the machine ---- */

static void put_u64(FILE *f, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    fwrite(b, 1, 8, f);
}
static void put_f64(FILE *f, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    put_u64(f, v);
}
static int get_u64(FILE *f, uint64_t *v) {
    unsigned char b[8];
    if (fread(b, 1, 8, f) != 8) return -1;
    *v = 0;
    for (int i = 7; i >= 0; i--) *v = *v << 8 | b[i];
    return 0;
}
static int get_f64(FILE *f, double *d) {
    uint64_t v;
    if (get_u64(f, &v)) return -1;
    memcpy(d, &v, 8);
    return 0;
}

int keel_trace_write(const keel_tracer *t, const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return keel_fail("%s: cannot create", tmp);
    fwrite("KEELTRC3", 1, 8, f);
    put_u64(f, (uint64_t)t->n);
    for (int64_t i = 0; i < t->n; i++) {
        const keel_trace_rec *r = &t->r[i];
        fwrite(r->name, 1, KEEL_NAME_MAX, f);
        put_u64(f, (uint64_t)(uint32_t)r->op), put_u64(f, (uint64_t)(uint32_t)r->type),
            put_u64(f, (uint64_t)(uint32_t)r->n_src);
        for (int k = 0; k < 4; k++) put_u64(f, (uint64_t)r->ne[k]), put_u64(f, (uint64_t)r->nb[k]);
        for (int k = 0; k < r->n_src; k++) put_u64(f, r->src_hash[k]), fwrite(r->src_name[k], 1, KEEL_NAME_MAX, f);
        put_u64(f, r->hash), put_u64(f, (uint64_t)r->nnz), put_f64(f, r->sumsq), put_f64(f, r->first),
            put_f64(f, r->last);
        fwrite(r->kernel, 1, KEEL_KERNEL_MAX, f);
        put_u64(f, (uint64_t)(r->data ? r->n_data : 0)), put_u64(f, (uint64_t)(r->data ? r->data_stride : 1));
        for (int64_t j = 0; r->data && j < r->n_data; j++) put_f64(f, r->data[j]);
    }
    bool ok = !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path)) {
        remove(tmp);
        return keel_fail("%s: write failed", path);
    }
    return 0;
}

keel_tracer *keel_trace_read(const char *path) {
    int fd = keel_open_regular(path);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd), keel_fail("%s: cannot open", path);
        return NULL;
    }
    struct stat sb;
    uint64_t size = fstat(fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    char magic[8];
    uint64_t n;
    /* version 1 files have no data stride (every value kept), versions 1 and 2 no kernel
     * description. Every count read from the file is bounded by what the file's own size can hold
     * before anything is allocated for it. */
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "KEELTRC", 7) || magic[7] < '1' || magic[7] > '3' ||
        get_u64(f, &n)) {
        fclose(f);
        keel_fail("%s: not a keel trace (bad magic)", path);
        return NULL;
    }
    bool v2 = magic[7] >= '2', v3 = magic[7] >= '3';
    const uint64_t min_rec =
        KEEL_NAME_MAX + 3 * 8 + 8 * 8 + 2 * 8 + 3 * 8 + 8 + (v2 ? 8 : 0) + (v3 ? KEEL_KERNEL_MAX : 0);
    const uint64_t most = size > 16 ? (size - 16) / min_rec : 0;
    if (n > most) {
        fclose(f);
        keel_fail("%s: the header announces %llu records; a file of %llu bytes holds at most %llu", path,
                  (unsigned long long)n, (unsigned long long)size, (unsigned long long)most);
        return NULL;
    }
    keel_tracer *t = keel_tracer_new(false, 0);
    if (t) t->r = calloc((size_t)n + 1, sizeof *t->r);
    if (!t || !t->r) {
        fclose(f);
        keel_tracer_free(t);
        keel_fail("%s: out of memory for %llu records", path, (unsigned long long)n);
        return NULL;
    }
    t->cap = (int64_t)n + 1;
    const char *why = NULL;
    for (uint64_t i = 0; i < n && !why; i++) {
        keel_trace_rec *r = &t->r[t->n];
        uint64_t op = 0, ty = 0, ns = 0, v = 0, nd = 0, stride = 1;
        bool ok = fread(r->name, 1, KEEL_NAME_MAX, f) == KEEL_NAME_MAX && !get_u64(f, &op) && !get_u64(f, &ty) &&
                  !get_u64(f, &ns);
        if (ok && (op >= KEEL_OP_COUNT || ty >= KEEL_TYPE_COUNT || ns > KEEL_MAX_SRC)) {
            why = "an op, type or source count outside keel's tables";
            break;
        }
        r->name[KEEL_NAME_MAX - 1] = 0;
        for (int k = 0; k < 4 && ok; k++) {
            ok = !get_u64(f, &v);
            r->ne[k] = (int64_t)v;
            ok = ok && !get_u64(f, &v);
            r->nb[k] = (int64_t)v;
        }
        for (uint64_t k = 0; k < ns && ok; k++) {
            ok = !get_u64(f, &r->src_hash[k]) && fread(r->src_name[k], 1, KEEL_NAME_MAX, f) == KEEL_NAME_MAX;
            r->src_name[k][KEEL_NAME_MAX - 1] = 0;
        }
        ok = ok && !get_u64(f, &r->hash) && !get_u64(f, &v) && !get_f64(f, &r->sumsq) && !get_f64(f, &r->first) &&
             !get_f64(f, &r->last) && (!v3 || fread(r->kernel, 1, KEEL_KERNEL_MAX, f) == KEEL_KERNEL_MAX) &&
             !get_u64(f, &nd) && (!v2 || (!get_u64(f, &stride) && stride >= 1));
        r->kernel[KEEL_KERNEL_MAX - 1] = 0;
        long at = ok ? ftell(f) : -1;
        if (ok && (at < 0 || nd > (size - (uint64_t)at) / sizeof(double))) {
            why = "more values than the file holds";
            break;
        }
        r->nnz = (int64_t)v;
        r->data_stride = (int64_t)stride;
        if (ok && nd) {
            r->data = malloc((size_t)nd * sizeof(double));
            r->n_data = (int64_t)nd;
            if (!r->data) {
                why = "out of memory for its values";
                break;
            }
            for (uint64_t j = 0; j < nd && ok; j++) ok = !get_f64(f, &r->data[j]);
        }
        r->op = (int32_t)op, r->type = (int32_t)ty, r->n_src = (int32_t)ns;
        t->n++;
        if (!ok) why = "truncated";
    }
    fclose(f);
    if (why) {
        keel_fail("%s: %s at record %lld", path, why, (long long)t->n);
        keel_tracer_free(t);
        return NULL;
    }
    return t;
}

/* ---- comparison ---- */

static void canonical(const char *name, char *out, size_t n) {
    snprintf(out, n, "%s", name);
    char *at = strstr(out, "@recompute");
    if (at) *at = 0;
}

static const keel_trace_rec *find(const keel_tracer *t, const char *cname) {
    char buf[KEEL_NAME_MAX];
    for (int64_t i = 0; i < t->n; i++) {
        canonical(t->r[i].name, buf, sizeof buf);
        if (!strcmp(buf, cname)) return &t->r[i];
    }
    return NULL;
}

static double nmse(const keel_trace_rec *a, const keel_trace_rec *b) {
    if (!a->data || !b->data || a->n_data != b->n_data || a->data_stride != b->data_stride) return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < a->n_data; i++) {
        double d = a->data[i] - b->data[i];
        if (isnan(d)) return INFINITY;
        num += d * d, den += a->data[i] * a->data[i];
    }
    return den > 0 ? num / den : num;
}

static bool same_output(const keel_trace_rec *a, const keel_trace_rec *b, double tol) {
    if (a->hash == b->hash && a->type == b->type) return true;
    return tol > 0 && nmse(a, b) <= tol;
}

int keel_trace_diff(const keel_tracer *a, const keel_tracer *b, double tol, FILE *out) {
    /* an index of A by canonical name, for speed on large traces */
    int64_t compared = 0, unaligned = 0;
    const keel_trace_rec *chain[8];
    int n_chain = 0;
    int64_t n_chain_total = 0;
    double worst = 0;
    const keel_trace_rec *worst_rec = NULL;
    char cn[KEEL_NAME_MAX];
    for (int64_t i = 0; i < b->n; i++) {
        const keel_trace_rec *rb = &b->r[i];
        canonical(rb->name, cn, sizeof cn);
        const keel_trace_rec *ra = find(a, cn);
        if (!ra || ra->op != rb->op) {
            unaligned++;
            continue;
        }
        compared++;
        if (same_output(ra, rb, tol)) {
            if (ra->hash != rb->hash) { /* within the tolerance: remember the closest call */
                double e = nmse(ra, rb);
                if (e > worst) worst = e, worst_rec = rb;
            }
            continue;
        }
        bool inputs_same = ra->n_src == rb->n_src && rb->op != KEEL_OP_NONE; /* a leaf that differs is an input */
        for (int k = 0; k < rb->n_src && inputs_same; k++) {
            if (ra->src_hash[k] == rb->src_hash[k]) continue;
            char sa[KEEL_NAME_MAX], sb[KEEL_NAME_MAX];
            canonical(rb->src_name[k], sb, sizeof sb);
            canonical(ra->src_name[k], sa, sizeof sa);
            const keel_trace_rec *xa = find(a, sa), *xb = NULL;
            for (int64_t j = i - 1; j >= 0 && !xb; j--) /* the input as B had it: its last record before this node */
                if (!strcmp(b->r[j].name, rb->src_name[k])) xb = &b->r[j];
            inputs_same = tol > 0 && xa && xb && nmse(xa, xb) <= tol;
        }
        if (!inputs_same) {
            if (n_chain < 8) chain[n_chain++] = rb;
            n_chain_total++;
            continue;
        }
        char sh[64], st[96];
        keel_shape_str(rb->ne, sh, sizeof sh);
        snprintf(st, sizeof st, "[%lld,%lld,%lld,%lld]", (long long)rb->nb[0], (long long)rb->nb[1],
                 (long long)rb->nb[2], (long long)rb->nb[3]);
        fprintf(out, "first divergence: node '%s' (%s, %s, shape %s, strides %s)\n", rb->name,
                keel_op_get(rb->op)->name, keel_type_name((keel_type)rb->type), sh, st);
        fprintf(out, "  its %d input(s) are %s in both runs:", rb->n_src,
                tol > 0 ? "equal within the tolerance" : "byte-identical");
        for (int k = 0; k < rb->n_src; k++) fprintf(out, " '%s'", rb->src_name[k]);
        fprintf(out, "\n  output hash A %016llx, B %016llx\n", (unsigned long long)ra->hash,
                (unsigned long long)rb->hash);
        if (ra->kernel[0] || rb->kernel[0])
            fprintf(out, "  kernels %s: A '%s', B '%s'\n",
                    strcmp(ra->kernel, rb->kernel) ? "chosen differently" : "chosen alike", ra->kernel, rb->kernel);
        if (ra->data && rb->data && ra->n_data == rb->n_data && ra->data_stride == rb->data_stride) {
            int64_t first = -1;
            for (int64_t j = 0; j < ra->n_data && first < 0; j++)
                if (memcmp(&ra->data[j], &rb->data[j], 8) &&
                    !(tol > 0 && fabs(ra->data[j] - rb->data[j]) <= sqrt(tol) * fabs(ra->data[j])))
                    first = j;
            fprintf(out, "  first differing flat index%s: %lld (A %.9g, B %.9g); nmse %.3g\n",
                    ra->data_stride > 1 ? " among the sampled values" : "",
                    first >= 0 ? (long long)(first * ra->data_stride) : -1LL, first >= 0 ? ra->data[first] : NAN,
                    first >= 0 ? rb->data[first] : NAN, nmse(ra, rb));
        } else {
            fprintf(out, "  first differing flat index: unknown (no data in the traces: record with --trace-data)\n");
        }
        fprintf(out,
                "  non-zeros: A %lld, B %lld; sum of squares: A %.9g, B %.9g; first/last: A %.6g/%.6g, B %.6g/%.6g\n",
                (long long)ra->nnz, (long long)rb->nnz, ra->sumsq, rb->sumsq, ra->first, ra->last, rb->first, rb->last);
        fprintf(out, "  earlier nodes that already differed only because their inputs did: %lld",
                (long long)n_chain_total);
        for (int c = 0; c < n_chain; c++) fprintf(out, "%s'%s'", c ? ", " : " (", chain[c]->name);
        fprintf(out, "%s\n", n_chain ? (n_chain_total > n_chain ? ", ...)" : ")") : "");
        fprintf(out, "  (compared %lld nodes up to it; %lld of B's records had no counterpart in A)\n",
                (long long)compared, (long long)unaligned);
        return 1;
    }
    if (n_chain_total)
        fprintf(out,
                "no node diverged on its own, but %lld differ because their inputs (leaves) differ, the first '%s'\n",
                (long long)n_chain_total, chain[0]->name);
    else
        fprintf(out, "no divergence in %lld nodes (%lld of B's records had no counterpart in A)\n", (long long)compared,
                (long long)unaligned);
    if (worst_rec)
        fprintf(out,
                "largest normalised squared error among nodes that differ within the tolerance: %.3g at '%s' (%s)\n",
                worst, worst_rec->name, keel_op_get(worst_rec->op)->name);
    return n_chain_total ? 1 : 0;
}
