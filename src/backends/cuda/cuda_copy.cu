/* keel: the CUDA backend's ONE copy path: a single strided 4-D copy kernel with type conversion.
 * CPY, CONT, DUP, GET_ROWS (through a row-index table), CONCAT, the `dst = src0` and window
 * steps of ACC and SET, and strided or converting host transfers all launch it. The elements it
 * writes per row are chosen in one place, copy_row_len, where KEEL_FAULT=copy-row-limit:N bites. */
#include "backends/cuda/cuda_internal.h"

extern "C" {
#include "tensor/convert.h"
}

static int64_t copy_row_len(const keel_backend *be, int64_t ne0) {
    if (be->fault_row_limit > 0 && ne0 > be->fault_row_limit) return be->fault_row_limit;
    return ne0;
}

/* ids (optional): int32 table [ne1, ne2] of source rows; then src is read at (i0, ids[i1,i2], 0, 0). */
__global__ void k_copy(kt d, kt s, int64_t len, int acc, kt ids, int has_ids) {
    int64_t rows = d.ne[1] * d.ne[2] * d.ne[3];
    int64_t es = d.type == 1 || d.type == 2 ? 2
                 : d.type == 4              ? 8
                                            : 4,
            ses = s.type == 1 || s.type == 2 ? 2
                  : s.type == 4              ? 8
                                             : 4;
    bool plain = !has_ids && d.contig && s.contig && len == d.ne[0];
    GRID_STRIDE(e, len * rows) {
        const char *sp;
        char *dp;
        if (plain) { /* both contiguous, whole rows: flat index = element */
            sp = s.p + e * ses, dp = d.p + e * es;
        } else {
            kt w = d; /* the written region: rows of len elements */
            w.ne[0] = len;
            int64_t i[4];
            kt_unflat(w, e, i);
            int64_t i0 = i[0], i1 = i[1], i2 = i[2], i3 = i[3];
            if (has_ids) {
                int32_t id = *(const int32_t *)(ids.p + i1 * ids.nb[0] + i2 * ids.nb[1]);
                sp = s.p + i0 * s.nb[0] + (int64_t)id * s.nb[1];
            } else {
                sp = kt_at(s, i0, i1, i2, i3);
            }
            dp = kt_at(d, i0, i1, i2, i3);
        }
        if (d.type == s.type && !acc) { /* bit-exact move */
            if (es == 4)
                *(uint32_t *)dp = *(const uint32_t *)sp;
            else if (es == 2)
                *(uint16_t *)dp = *(const uint16_t *)sp;
            else
                *(uint64_t *)dp = *(const uint64_t *)sp;
        } else if (acc && d.type == 0 && s.type == 0) { /* float32 sums round in float32, as on the cpu */
            *(float *)dp = *(float *)dp + *(const float *)sp;
        } else {
            double v = keel_cvt_load(s.type, sp);
            if (acc) v += keel_cvt_load(d.type, dp);
            keel_cvt_store(d.type, dp, v);
        }
    }
}

static int launch(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate,
                  const keel_tensor *ids) {
    if (!ids && !keel_same_shape(dst, src)) {
        char a[64], b[64];
        return keel_fail("cuda copy: shape %s of '%s' differs from %s of '%s'", keel_shape_str(dst->ne, a, sizeof a),
                         dst->name, keel_shape_str(src->ne, b, sizeof b), src->name);
    }
    int64_t len = copy_row_len(be, dst->ne[0]), n = len * keel_nrows(dst);
    if (n == 0) return 0;
    kt none;
    memset(&none, 0, sizeof none);
    k_copy<<<cuda_blocks(n, 256), 256, 0, cuda_im(be)->stream>>>(kt_of(dst), kt_of(src), len, accumulate ? 1 : 0,
                                                                 ids ? kt_of(ids) : none, ids ? 1 : 0);
    return cuda_check(cudaGetLastError(), "copy kernel launch", dst);
}

int cuda_copy(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate) {
    return launch(be, dst, src, accumulate, NULL);
}

int cuda_copy_rows(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, const keel_tensor *ids) {
    return launch(be, dst, src, false, ids);
}
