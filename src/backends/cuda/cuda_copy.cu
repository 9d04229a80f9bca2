/* keel: the CUDA backend's ONE copy path: a strided 4-D copy kernel with type conversion, and its
 * 16-byte form for whole tensors (k_copy_whole), which the launcher picks where a tensor allows it.
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

/* Whole contiguous tensors, and strided rows of 4-aligned contiguous runs, on 16-byte boundaries move
 * 4 elements a group: a float32 (or any 4-byte) move, float32 to bf16, a float32 accumulation; each
 * element converted by the scalar path's own function, so the bits are the same (bf16 to float32
 * stays scalar: through float64 there a signalling NaN comes out quiet). */
enum { VEC_NONE, VEC_MOVE4, VEC_F32_BF16, VEC_ACC_F32 };

__device__ static inline ushort4 bf16x4(float4 v) {
    return make_ushort4(keel_cvt_f32_to_bf16(v.x), keel_cvt_f32_to_bf16(v.y), keel_cvt_f32_to_bf16(v.z),
                        keel_cvt_f32_to_bf16(v.w));
}
__device__ static inline float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* One group of 4 elements: dp[0..3] (op)= sp[0..3]. */
__device__ static inline void copy_group(char *dp, const char *sp, int vec) {
    if (vec == VEC_MOVE4)
        *(uint4 *)dp = *(const uint4 *)sp;
    else if (vec == VEC_F32_BF16)
        *(ushort4 *)dp = bf16x4(*(const float4 *)sp);
    else
        *(float4 *)dp = add4(*(const float4 *)dp, *(const float4 *)sp);
}

/* Whole tensors: WG groups a thread at a time (groups q0 + u NT_COPY for u < WG, so each access is
 * a block's consecutive 16-byte groups), all of a thread's loads issued before its first store. One
 * group a thread moved the 0.8B step's float32 to bf16 casts at about 2.2 TB/s (KEEL_CUDA_PROFILE), a
 * good way under the H200's bandwidth: 16 bytes of loads in flight a thread were too few. The same
 * function on each element: the same bits. */
#define NT_COPY 256
#define WG      4
template <int VEC> __global__ void __launch_bounds__(NT_COPY) k_copy_whole(char *dp, const char *sp, int64_t n) {
    int64_t ng = n / 4, step = (int64_t)gridDim.x * NT_COPY * WG;
    for (int64_t q0 = (int64_t)blockIdx.x * NT_COPY * WG + threadIdx.x; q0 < ng; q0 += step) {
        float4 v[WG], a[WG];
#pragma unroll
        for (int u = 0; u < WG; u++) {
            int64_t q = q0 + u * NT_COPY;
            if (q < ng) {
                v[u] = ((const float4 *)sp)[q];
                if (VEC == VEC_ACC_F32) a[u] = ((const float4 *)dp)[q];
            }
        }
#pragma unroll
        for (int u = 0; u < WG; u++) {
            int64_t q = q0 + u * NT_COPY;
            if (q >= ng) continue;
            if (VEC == VEC_MOVE4)
                ((float4 *)dp)[q] = v[u];
            else if (VEC == VEC_F32_BF16)
                ((ushort4 *)dp)[q] = bf16x4(v[u]);
            else
                ((float4 *)dp)[q] = add4(a[u], v[u]);
        }
    }
    /* the last n % 4 elements, a thread each */
    for (int64_t e = ng * 4 + (int64_t)blockIdx.x * NT_COPY + threadIdx.x; e < n; e += (int64_t)gridDim.x * NT_COPY) {
        if (VEC == VEC_MOVE4)
            ((uint32_t *)dp)[e] = ((const uint32_t *)sp)[e];
        else if (VEC == VEC_F32_BF16)
            ((uint16_t *)dp)[e] = keel_cvt_f32_to_bf16(((const float *)sp)[e]);
        else
            ((float *)dp)[e] = ((float *)dp)[e] + ((const float *)sp)[e];
    }
}

/* Strided rows whose elements are contiguous, 4 of them a thread: every row (and the data) on a
 * 16-byte boundary and rows a multiple of 4 long (a gradient window of ACC: the q, k and v parts of
 * the DeltaNet's [6144, T, B] convolution output, rows of 2048 floats 6144 apart). */
__device__ static void copy_vec_rows(kt d, kt s, int64_t len, int vec) {
    kt g = d; /* the groups: element q of [len / 4, ne1, ne2, ne3] is the group at (4 i0, i1, i2, i3) */
    g.ne[0] = len / 4;
    GRID_STRIDE(q, g.ne[0] * g.ne[1] * g.ne[2] * g.ne[3]) {
        int64_t i[4];
        kt_unflat(g, q, i);
        copy_group(kt_at(d, 4 * i[0], i[1], i[2], i[3]), kt_at(s, 4 * i[0], i[1], i[2], i[3]), vec);
    }
}

/* ids (optional): int32 table [ne1, ne2] of source rows; then src is read at (i0, ids[i1,i2], 0, 0),
 * and an id outside [0, src rows) leaves its row unwritten and marks node `node` in *bad.
 * vec: 0, or VEC_ROWS + a VEC_ mode on 4-aligned strided rows (whole tensors: k_copy_whole). */
enum { VEC_ROWS = 8 };
__global__ void k_copy(kt d, kt s, int64_t len, int acc, kt ids, int has_ids, int vec, unsigned *bad, unsigned node) {
    if (vec & VEC_ROWS) {
        copy_vec_rows(d, s, len, vec & ~VEC_ROWS);
        return;
    }
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
                if (id < 0 || id >= s.ne[1]) {
                    atomicMin(bad, node);
                    continue;
                }
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
    int vec = VEC_NONE;
    bool whole = !ids && len == dst->ne[0] && keel_is_contiguous(dst) && keel_is_contiguous(src) && vec_ok(dst->data) &&
                 vec_ok(src->data);
    size_t de = keel_type_size(dst->type), se = keel_type_size(src->type);
    bool rows4 = !whole && !ids && len == dst->ne[0] && len % 4 == 0 && (size_t)dst->nb[0] == de &&
                 (size_t)src->nb[0] == se && vec_ok(dst->data) && vec_ok(src->data);
    for (int d = 1; d < 4 && rows4; d++) rows4 = dst->nb[d] % 16 == 0 && src->nb[d] % 16 == 0;
    if ((whole || rows4) && !accumulate && dst->type == src->type && de == 4)
        vec = VEC_MOVE4;
    else if ((whole || rows4) && !accumulate && dst->type == KEEL_BF16 && src->type == KEEL_F32)
        vec = VEC_F32_BF16;
    else if ((whole || rows4) && accumulate && dst->type == KEEL_F32 && src->type == KEEL_F32)
        vec = VEC_ACC_F32;
    if (vec && rows4) vec |= VEC_ROWS;
    cuda_impl *im = cuda_im(be);
    if (vec && whole) { /* k_copy_whole: WG groups of 4 a thread */
        unsigned wb = cuda_blocks((n / 4 + WG - 1) / WG, NT_COPY);
        if (vec == VEC_MOVE4)
            k_copy_whole<VEC_MOVE4><<<wb, NT_COPY, 0, im->stream>>>((char *)dst->data, (const char *)src->data, n);
        else if (vec == VEC_F32_BF16)
            k_copy_whole<VEC_F32_BF16><<<wb, NT_COPY, 0, im->stream>>>((char *)dst->data, (const char *)src->data, n);
        else
            k_copy_whole<VEC_ACC_F32><<<wb, NT_COPY, 0, im->stream>>>((char *)dst->data, (const char *)src->data, n);
        return cuda_check(cudaGetLastError(), "copy kernel launch", dst);
    }
    unsigned blocks = vec ? vec_blocks(n) : cuda_blocks(n, 256);
    k_copy<<<blocks, 256, 0, im->stream>>>(kt_of(dst), kt_of(src), len, accumulate ? 1 : 0, ids ? kt_of(ids) : none,
                                           ids ? 1 : 0, vec, im->bad_node, im->node);
    return cuda_check(cudaGetLastError(), "copy kernel launch", dst);
}

int cuda_copy(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate) {
    return launch(be, dst, src, accumulate, NULL);
}

int cuda_copy_rows(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, const keel_tensor *ids) {
    return launch(be, dst, src, false, ids);
}
