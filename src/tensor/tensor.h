/* keel: tensors. A tensor is metadata (type, shape, byte strides, provenance); its bytes live in a
 * backend buffer placed by the memory plan. Dimension 0 is the fastest. */
#ifndef KEEL_TENSOR_H
#define KEEL_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { KEEL_F32, KEEL_F16, KEEL_BF16, KEEL_I32, KEEL_F64, KEEL_TYPE_COUNT } keel_type;

const char *keel_type_name(keel_type t);
size_t keel_type_size(keel_type t);
bool keel_type_is_float(keel_type t);
/* Returns the type for a name ("f32", "bf16", ...) or -1. */
int keel_type_from_name(const char *name);

enum {
    KEEL_FLAG_PARAM = 1u << 0,      /* trainable parameter: gets a gradient */
    KEEL_FLAG_INPUT = 1u << 1,      /* set from the host before a run */
    KEEL_FLAG_OUTPUT = 1u << 2,     /* read back after a run: the plan keeps it alive */
    KEEL_FLAG_LOSS = 1u << 3,       /* scalar the backward pass starts from */
    KEEL_FLAG_CHECKPOINT = 1u << 4, /* recompute keeps this activation */
    KEEL_FLAG_BOUND = 1u << 5,      /* a leaf whose bytes another session placed: plans leave it where it is */
};

#define KEEL_MAX_DIMS 4
#define KEEL_ALIGN    256 /* bytes: where the memory plan places every tensor that owns bytes */
#define KEEL_MAX_SRC  7
#define KEEL_MAX_IP   12
#define KEEL_MAX_FP   6
#define KEEL_NAME_MAX 112

typedef struct keel_ctx keel_ctx;

typedef struct keel_tensor {
    keel_type type;
    int64_t ne[KEEL_MAX_DIMS]; /* elements per dimension */
    int64_t nb[KEEL_MAX_DIMS]; /* byte stride per dimension (64-bit) */
    int op;                    /* keel_op; KEEL_OP_NONE for leaves */
    int64_t ip[KEEL_MAX_IP];   /* integer op parameters (layout: see the op table) */
    double fp[KEEL_MAX_FP];    /* real op parameters */
    struct keel_tensor *src[KEEL_MAX_SRC];
    /* Memory provenance: a view (or an in-place op's result) shares the bytes of view_src, which
     * is always a root (a tensor that owns its bytes), at byte offset view_offs. */
    struct keel_tensor *view_src;
    int64_t view_offs;
    uint32_t flags;
    char name[KEEL_NAME_MAX];
    void *data; /* address of element 0 in the backend's buffer, once allocated */
    /* A node's working memory in the same buffer, planned for it alone (keel_plan_opts.scratch_bytes):
     * valid while the node runs; NULL and 0 where the plan gave none. */
    void *scratch;
    size_t scratch_bytes;
    /* A carried block (keel_plan_opts.carry): what one node's kernel made and a later node's kernel
     * reads instead of making it again. carry_peer: the other node of the pair (set by
     * keel_plan_make, NULL where the plan carries nothing for this node); carry: the block, the same
     * for both (keel_plan_bind). */
    struct keel_tensor *carry_peer;
    void *carry;
    size_t carry_bytes;
    int64_t id; /* creation index in its context: stable across identical builds */
    keel_ctx *ctx;
} keel_tensor;

/* A context owns tensor metadata (never tensor bytes). */
keel_ctx *keel_ctx_new(void);
void keel_ctx_free(keel_ctx *ctx);
int64_t keel_ctx_count(const keel_ctx *ctx);
keel_tensor *keel_ctx_tensor(const keel_ctx *ctx, int64_t id);

/* Allocate a zeroed tensor record (internal to op construction; use the constructors). */
keel_tensor *keel_tensor_alloc(keel_ctx *ctx);

/* A new leaf of the given type and shape (unused trailing dims = 1), contiguous. */
keel_tensor *keel_new(keel_ctx *ctx, keel_type type, int n_dims, const int64_t *ne);
keel_tensor *keel_new_1d(keel_ctx *ctx, keel_type type, int64_t ne0);
keel_tensor *keel_new_2d(keel_ctx *ctx, keel_type type, int64_t ne0, int64_t ne1);
keel_tensor *keel_new_3d(keel_ctx *ctx, keel_type type, int64_t ne0, int64_t ne1, int64_t ne2);
keel_tensor *keel_new_4d(keel_ctx *ctx, keel_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);

keel_tensor *keel_set_name(keel_tensor *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
keel_tensor *keel_set_flags(keel_tensor *t, uint32_t flags); /* ORs the flags in */

int64_t keel_nelements(const keel_tensor *t);
int64_t keel_nrows(const keel_tensor *t); /* ne1*ne2*ne3 */
/* Bytes spanned from element 0 to one past the last element (for any strides). */
size_t keel_nbytes(const keel_tensor *t);
bool keel_is_contiguous(const keel_tensor *t);
bool keel_same_shape(const keel_tensor *a, const keel_tensor *b);
/* The tensor that owns t's bytes (t itself for a root). */
keel_tensor *keel_root(keel_tensor *t);
/* Set contiguous strides for t's type and shape. */
void keel_set_contiguous_strides(keel_tensor *t);
/* "[4096,17,1,1]" into buf. */
const char *keel_shape_str(const int64_t ne[4], char *buf, size_t n);

/* One element of type t at p, as float64; and the reverse (rounding to nearest even). */
double keel_load_value(keel_type t, const void *p);
void keel_store_value(keel_type t, void *p, double v);

/* Scalar conversions shared by every backend (round to nearest even). */
float keel_f16_to_f32(uint16_t h);
uint16_t keel_f32_to_f16(float f);
float keel_bf16_to_f32(uint16_t h);
uint16_t keel_f32_to_bf16(float f);

#endif
