#include "tensor/tensor.h"
#include "tensor/convert.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* Tensors are allocated in fixed blocks so that pointers stay valid while the context grows. */
#define BLOCK 1024

struct keel_ctx {
    keel_tensor **blocks;
    int64_t n_blocks, cap_blocks;
    int64_t count;
};

static const struct {
    const char *name;
    size_t size;
} TYPES[KEEL_TYPE_COUNT] = {
    [KEEL_F32] = {"f32", 4}, [KEEL_F16] = {"f16", 2}, [KEEL_BF16] = {"bf16", 2},
    [KEEL_I32] = {"i32", 4}, [KEEL_F64] = {"f64", 8},
};

const char *keel_type_name(keel_type t) { return (unsigned)t < KEEL_TYPE_COUNT ? TYPES[t].name : "?"; }
size_t keel_type_size(keel_type t) { return (unsigned)t < KEEL_TYPE_COUNT ? TYPES[t].size : 0; }
bool keel_type_is_float(keel_type t) { return t != KEEL_I32; }
int keel_type_from_name(const char *name) {
    for (int i = 0; i < KEEL_TYPE_COUNT; i++)
        if (strcmp(name, TYPES[i].name) == 0) return i;
    return -1;
}

keel_ctx *keel_ctx_new(void) { return calloc(1, sizeof(keel_ctx)); }

void keel_ctx_free(keel_ctx *ctx) {
    if (!ctx) return;
    for (int64_t i = 0; i < ctx->n_blocks; i++) free(ctx->blocks[i]);
    free(ctx->blocks);
    free(ctx);
}

int64_t keel_ctx_count(const keel_ctx *ctx) { return ctx->count; }
keel_tensor *keel_ctx_tensor(const keel_ctx *ctx, int64_t id) {
    if (id < 0 || id >= ctx->count) return NULL;
    return &ctx->blocks[id / BLOCK][id % BLOCK];
}

keel_tensor *keel_tensor_alloc(keel_ctx *ctx) {
    if (!ctx) return NULL;
    if (ctx->count == ctx->n_blocks * BLOCK) {
        if (ctx->n_blocks == ctx->cap_blocks) {
            int64_t cap = ctx->cap_blocks ? ctx->cap_blocks * 2 : 16;
            keel_tensor **nb = realloc(ctx->blocks, (size_t)cap * sizeof *nb);
            if (!nb) {
                keel_fail("out of memory growing the tensor context");
                return NULL;
            }
            ctx->blocks = nb;
            ctx->cap_blocks = cap;
        }
        ctx->blocks[ctx->n_blocks] = calloc(BLOCK, sizeof(keel_tensor));
        if (!ctx->blocks[ctx->n_blocks]) {
            keel_fail("out of memory for tensor records");
            return NULL;
        }
        ctx->n_blocks++;
    }
    keel_tensor *t = &ctx->blocks[ctx->count / BLOCK][ctx->count % BLOCK];
    memset(t, 0, sizeof *t);
    t->id = ctx->count++;
    t->ctx = ctx;
    return t;
}

void keel_set_contiguous_strides(keel_tensor *t) {
    t->nb[0] = (int64_t)keel_type_size(t->type);
    for (int i = 1; i < KEEL_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * t->ne[i - 1];
}

keel_tensor *keel_new(keel_ctx *ctx, keel_type type, int n_dims, const int64_t *ne) {
    if ((unsigned)type >= KEEL_TYPE_COUNT) {
        keel_fail("keel_new: unknown type %d", (int)type);
        return NULL;
    }
    if (n_dims < 1 || n_dims > KEEL_MAX_DIMS) {
        keel_fail("keel_new: %d dims (1..4)", n_dims);
        return NULL;
    }
    for (int i = 0; i < n_dims; i++)
        if (ne[i] <= 0) {
            keel_fail("keel_new: ne[%d] = %lld must be positive", i, (long long)ne[i]);
            return NULL;
        }
    keel_tensor *t = keel_tensor_alloc(ctx);
    if (!t) return NULL;
    t->type = type;
    for (int i = 0; i < KEEL_MAX_DIMS; i++) t->ne[i] = i < n_dims ? ne[i] : 1;
    keel_set_contiguous_strides(t);
    snprintf(t->name, sizeof t->name, "leaf#%lld", (long long)t->id);
    return t;
}

keel_tensor *keel_new_1d(keel_ctx *ctx, keel_type type, int64_t ne0) { return keel_new(ctx, type, 1, &ne0); }
keel_tensor *keel_new_2d(keel_ctx *ctx, keel_type type, int64_t ne0, int64_t ne1) {
    int64_t ne[2] = {ne0, ne1};
    return keel_new(ctx, type, 2, ne);
}
keel_tensor *keel_new_3d(keel_ctx *ctx, keel_type type, int64_t ne0, int64_t ne1, int64_t ne2) {
    int64_t ne[3] = {ne0, ne1, ne2};
    return keel_new(ctx, type, 3, ne);
}
keel_tensor *keel_new_4d(keel_ctx *ctx, keel_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return keel_new(ctx, type, 4, ne);
}

keel_tensor *keel_set_name(keel_tensor *t, const char *fmt, ...) {
    if (!t) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    return t;
}

keel_tensor *keel_set_flags(keel_tensor *t, uint32_t flags) {
    if (t) t->flags |= flags;
    return t;
}

int64_t keel_nelements(const keel_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
int64_t keel_nrows(const keel_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t keel_nbytes(const keel_tensor *t) {
    int64_t last = 0;
    for (int i = 0; i < KEEL_MAX_DIMS; i++) last += (t->ne[i] - 1) * t->nb[i];
    return (size_t)last + keel_type_size(t->type);
}

bool keel_is_contiguous(const keel_tensor *t) {
    int64_t expect = (int64_t)keel_type_size(t->type);
    for (int i = 0; i < KEEL_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expect) return false;
        expect *= t->ne[i];
    }
    return true;
}

bool keel_same_shape(const keel_tensor *a, const keel_tensor *b) {
    for (int i = 0; i < KEEL_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

keel_tensor *keel_root(keel_tensor *t) { return t->view_src ? t->view_src : t; }

const char *keel_shape_str(const int64_t ne[4], char *buf, size_t n) {
    snprintf(buf, n, "[%lld,%lld,%lld,%lld]", (long long)ne[0], (long long)ne[1], (long long)ne[2], (long long)ne[3]);
    return buf;
}

/* ---- conversions: one definition in tensor/convert.h, shared with device code ---- */
_Static_assert(KEEL_F32 == 0 && KEEL_F16 == 1 && KEEL_BF16 == 2 && KEEL_I32 == 3 && KEEL_F64 == 4,
               "tensor/convert.h numbers the types this way");

float keel_f16_to_f32(uint16_t h) { return keel_cvt_f16_to_f32(h); }
uint16_t keel_f32_to_f16(float f) { return keel_cvt_f32_to_f16(f); }
float keel_bf16_to_f32(uint16_t h) { return keel_cvt_bf16_to_f32(h); }
uint16_t keel_f32_to_bf16(float f) { return keel_cvt_f32_to_bf16(f); }
double keel_load_value(keel_type t, const void *p) { return keel_cvt_load((int)t, p); }
void keel_store_value(keel_type t, void *p, double v) { keel_cvt_store((int)t, p, v); }
