/* keel: Hopper's warpgroup matrix products (wgmma, sm_90a only) for the tensor-core kernels.
 *
 * A warpgroup (4 consecutive warps, the first a multiple of 4) multiplies a 64-row A by a B of N
 * columns, 16 of depth an instruction, float32 sums in the accumulator registers: each warp holds
 * 16 of the rows in mma.sync's accumulator layout (the value at row g / g + 8, columns 2c and
 * 2c + 1 of each 8-column tile, g = lane / 4, c = lane % 4; d[j][e] below, e as mma.sync's four),
 * so code written around mma.sync's fragments keeps its indexing. B, and A unless it comes from
 * registers (mma.sync's A fragment layout, a warp its 16 rows), are read by the tensor cores from
 * shared memory through a descriptor, with no ldmatrix and no registers: that is what lifts a
 * kernel off the shared-memory-bound mma.sync path.
 *
 * Tiles live in shared memory as bf16 panels of 64 columns (128 bytes a row), each panel 1024-byte
 * aligned, rows in order, with the 128-byte swizzle: the 16-byte chunk k of row r at chunk k ^ (r % 8)
 * (the hardware applies the same XOR to the address bits, so a warp's accesses spread over the
 * banks). Such a panel of a [rows][depth] tile is "K-major" for wgmma (depth along a row: the Q and
 * K of S = Q K^T); a panel of a [depth][columns] tile is "N-major" (V of O += P V, read with B
 * transposed). Descriptors: the start address, the leading byte offset (K-major: unused, 1;
 * N-major: from one 64-column panel to the next), the stride byte offset (from one group of 8 rows
 * to the next: 1024), the swizzle mode (128 bytes). A step of 16 in depth moves a K-major
 * descriptor 32 bytes along its row (the XOR still applies to the sum), an N-major one 16 rows.
 *
 * Order: shared memory written by threads (cp.async, stores) is made visible to the tensor cores
 * by fence.proxy.async in each writing thread, then the block's barrier; accumulator and A
 * registers are fenced by wgmma.fence before the products that read them; a batch of products is
 * committed and waited for before its accumulators are read or its shared memory is overwritten.
 * The sums of one instruction run in the tensor cores' fixed order and the instructions in program
 * order: the bits depend on the shapes only, as everywhere in keel. */
#ifndef KEEL_CUDA_WGMMA_CUH
#define KEEL_CUDA_WGMMA_CUH

#include <cuda_bf16.h>
#include <cuda_pipeline_primitives.h>

#include "backends/cuda/cuda_internal.h"

/* The kernels that use wgmma compile their bodies only for sm_90a (the architecture-specific target
 * that has the instruction); the portable PTX pass compiles them to a trap, and the host launches
 * them only on a device of compute capability 9.0 running this binary's sm_90a code
 * (cuda_impl.wgmma, set by a probe kernel when the backend starts). */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KEEL_WGMMA_BODY 1
#endif

#define WG_ALIGN 1024 /* a panel's alignment, the 128-byte swizzle's repeat */

/* The first WG_ALIGN-aligned byte at or after p in shared memory (a kernel's dynamic shared memory
 * asks WG_ALIGN bytes more than its tiles: static shared memory may come first) */
__device__ static inline unsigned char *wg_aligned(unsigned char *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return p + ((WG_ALIGN - (a & (WG_ALIGN - 1))) & (WG_ALIGN - 1));
}

/* element (r, c) of a tile of `rows` rows in swizzled panels: its byte offset */
__host__ __device__ static inline int wg_at(int rows, int r, int c) {
    return ((c >> 6) * rows + r) * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4) + (c & 7) * 2;
}

/* rows [t0, t0 + n) of a bf16 input (row stride nb[2], 16-byte aligned, D a multiple of 64) into
 * D / 64 swizzled panels of `rows` rows, rows n .. rows - 1 zero */
template <int D>
__device__ static void wg_fetch(__nv_bfloat16 *dst, const kt &x, int64_t h, int64_t t0, int64_t b, int n, int rows) {
    unsigned char *base = (unsigned char *)dst;
    for (int e = threadIdx.x; e < rows * (D / 8); e += blockDim.x) {
        int r = e / (D / 8), ch = e - r * (D / 8);
        unsigned char *d = base + wg_at(rows, r, ch * 8);
        if (r < n)
            __pipeline_memcpy_async(d, kt_at(x, ch * 8, h, t0 + r, b), 16);
        else
            *(uint4 *)d = make_uint4(0, 0, 0, 0);
    }
}

#ifdef KEEL_WGMMA_BODY
__device__ static inline uint64_t wg_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}
/* depth kk .. kk + 15 of the rows from r0 (a multiple of 8) of a K-major tile of `rows` rows */
__device__ static inline uint64_t wg_desc_k(const __nv_bfloat16 *tile, int rows, int kk, int r0 = 0) {
    return wg_desc((const unsigned char *)tile + ((kk >> 6) * rows + r0) * 128 + (kk & 63) * 2, 16, 1024);
}
/* depth rows kk .. kk + 15 of an N-major tile of `rows` rows, its columns from c0 (a multiple of 64) */
__device__ static inline uint64_t wg_desc_n(const __nv_bfloat16 *tile, int rows, int kk, int c0 = 0) {
    return wg_desc((const unsigned char *)tile + ((c0 >> 6) * rows + kk) * 128, rows * 128, 1024);
}
__device__ static inline void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ static inline void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ static inline void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* this thread's writes to shared memory, visible to the tensor cores after the next barrier */
__device__ static inline void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* The instructions. A batch's accumulator operands: d's 8-column tiles, 4 floats each (as many as
 * N / 8), and their register names in the instruction */
#define WG_T(j)   "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_T4(j)  WG_T(j), WG_T(j + 1), WG_T(j + 2), WG_T(j + 3)
#define WG_T16(j) WG_T4(j), WG_T4(j + 4), WG_T4(j + 8), WG_T4(j + 12)
#define WG_R16    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define WG_R32                                                                                                         \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
    "30,%31}"
#define WG_R64                                                                                                         \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
    "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%" \
    "58,%59,%60,%61,%62,%63}"
#define WG_R128                                                                                                        \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
    "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%" \
    "58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%" \
    "86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%"  \
    "111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
/* NAME(d, da, db): d (64 x N) += A B over 16 of depth, A (K-major) and B in shared memory, B K-major
 * (TB 0) or N-major (TB 1, read transposed); IA, IB, IP: the operand numbers of da, db and the
 * scale-d flag (always 1: the products add to d) */
#define WG_SS(NAME, N, TB, R, IA, IB, IP, ...)                                                                         \
    __device__ static inline void NAME(float(*d)[4], uint64_t da, uint64_t db) {                                       \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP ", 0;\n"                                                  \
                     "wgmma.mma_async.sync.aligned.m64n" N "k16.f32.bf16.bf16 " R ", %" IA ", %" IB                    \
                     ", p, 1, 1, 0, " TB ";\n}\n"                                                                      \
                     : __VA_ARGS__                                                                                     \
                     : "l"(da), "l"(db), "n"(1));                                                                      \
    }
/* NAME(d, a, db): d (64 x N) += A B over 16 of depth, A from registers (a[4]: a warp's 16 rows as
 * mma.sync's A fragment), B N-major in shared memory, read transposed; IA0 .. IA3: a's operand
 * numbers, IB db's, IP the scale-d flag's */
#define WG_RS(NAME, N, R, IA0, IA1, IA2, IA3, IB, IP, ...)                                                             \
    __device__ static inline void NAME(float(*d)[4], const uint32_t *a, uint64_t db) {                                 \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP ", 0;\n"                                                  \
                     "wgmma.mma_async.sync.aligned.m64n" N "k16.f32.bf16.bf16 " R ", {%" IA0 ",%" IA1 ",%" IA2         \
                     ",%" IA3 "}, %" IB ", p, 1, 1, 1;\n}\n"                                                           \
                     : __VA_ARGS__                                                                                     \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));                                   \
    }
WG_SS(wg_ss_n32, "32", "0", WG_R16, "16", "17", "18", WG_T4(0))
WG_SS(wg_ss_n64, "64", "0", WG_R32, "32", "33", "34", WG_T4(0), WG_T4(4))
WG_SS(wg_ss_n64_t, "64", "1", WG_R32, "32", "33", "34", WG_T4(0), WG_T4(4))
WG_SS(wg_ss_n128_t, "128", "1", WG_R64, "64", "65", "66", WG_T16(0))
WG_RS(wg_rs_n64_t, "64", WG_R32, "32", "33", "34", "35", "36", "37", WG_T4(0), WG_T4(4))
WG_RS(wg_rs_n128_t, "128", WG_R64, "64", "65", "66", "67", "68", "69", WG_T16(0))
WG_RS(wg_rs_n256_t, "256", WG_R128, "128", "129", "130", "131", "132", "133", WG_T16(0), WG_T16(16))
#endif

#endif
