#include "model/qwen35.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/lora.h"
#include "ops/ops.h"
#include "util/error.h"
#include "util/rng.h"

int keel_qwen35_preset(const char *name, keel_qwen35_config *c) {
    memset(c, 0, sizeof *c);
    if (strcmp(name, "0.8b") == 0) {
        *c = (keel_qwen35_config){.vocab = 248320,
                                  .hidden = 1024,
                                  .layers = 24,
                                  .ffn = 3584,
                                  .heads = 8,
                                  .kv_heads = 2,
                                  .head_dim = 256,
                                  .lk_heads = 16,
                                  .lv_heads = 16,
                                  .lk_dim = 128,
                                  .lv_dim = 128,
                                  .conv_kernel = 4,
                                  .rope_theta = 1e7,
                                  .partial_rotary = 0.25,
                                  .rms_eps = 1e-6,
                                  .tied = true};
    } else if (strcmp(name, "tiny") == 0) {
        *c = (keel_qwen35_config){.vocab = 512,
                                  .hidden = 64,
                                  .layers = 4,
                                  .ffn = 160,
                                  .heads = 4,
                                  .kv_heads = 2,
                                  .head_dim = 32,
                                  .lk_heads = 2,
                                  .lv_heads = 4,
                                  .lk_dim = 16,
                                  .lv_dim = 24,
                                  .conv_kernel = 4,
                                  .rope_theta = 1e7,
                                  .partial_rotary = 0.25,
                                  .rms_eps = 1e-6,
                                  .tied = true};
    } else if (strcmp(name, "small") == 0) {
        *c = (keel_qwen35_config){.vocab = 256,
                                  .hidden = 128,
                                  .layers = 4,
                                  .ffn = 320,
                                  .heads = 4,
                                  .kv_heads = 2,
                                  .head_dim = 32,
                                  .lk_heads = 2,
                                  .lv_heads = 4,
                                  .lk_dim = 32,
                                  .lv_dim = 32,
                                  .conv_kernel = 4,
                                  .rope_theta = 10000.0,
                                  .partial_rotary = 0.25,
                                  .rms_eps = 1e-6,
                                  .tied = true};
    } else {
        return keel_fail("unknown preset '%s' (tiny, small, 0.8b)", name);
    }
    for (int64_t i = 0; i < c->layers; i++) c->full_attention[i] = (i + 1) % 4 == 0;
    return 0;
}

int keel_qwen35_config_check(const keel_qwen35_config *c) {
#define POS(f)                                                                                                         \
    if (c->f <= 0) return keel_fail("config: %s must be positive (got %lld)", #f, (long long)c->f)
    POS(vocab);
    POS(hidden);
    POS(layers);
    POS(ffn);
    POS(heads);
    POS(kv_heads);
    POS(head_dim);
    POS(lk_heads);
    POS(lv_heads);
    POS(lk_dim);
    POS(lv_dim);
    POS(conv_kernel);
#undef POS
    /* Absurd sizes are refused here, before any shape arithmetic: each dimension fits the int32
     * ids and index math of the kernels, and each weight's element count (a product of two
     * dimensions) is checked for overflow and kept under 2^40 elements (4 TiB of float32). */
    const struct {
        const char *field;
        int64_t v;
    } dims[] = {{"vocab_size", c->vocab},
                {"hidden_size", c->hidden},
                {"intermediate_size", c->ffn},
                {"num_attention_heads", c->heads},
                {"num_key_value_heads", c->kv_heads},
                {"head_dim", c->head_dim},
                {"linear_num_key_heads", c->lk_heads},
                {"linear_num_value_heads", c->lv_heads},
                {"linear_key_head_dim", c->lk_dim},
                {"linear_value_head_dim", c->lv_dim},
                {"linear_conv_kernel_dim", c->conv_kernel}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v > INT32_MAX)
            return keel_fail("config: %s %lld is larger than keel supports (%d)", dims[i].field, (long long)dims[i].v,
                             INT32_MAX);
    const struct {
        const char *what;
        int64_t a, b, c;
    } prods[] = {{"vocab_size x hidden_size", c->vocab, c->hidden, 1},
                 {"intermediate_size x hidden_size", c->ffn, c->hidden, 1},
                 {"num_attention_heads x head_dim x 2 x hidden_size", c->heads, c->head_dim, 2 * c->hidden},
                 {"num_key_value_heads x head_dim x hidden_size", c->kv_heads, c->head_dim, c->hidden},
                 {"linear_num_key_heads x linear_key_head_dim x hidden_size", c->lk_heads, c->lk_dim, c->hidden},
                 {"linear_num_value_heads x linear_value_head_dim x hidden_size", c->lv_heads, c->lv_dim, c->hidden},
                 {"linear_num_value_heads x linear_value_head_dim x linear_conv_kernel_dim", c->lv_heads, c->lv_dim,
                  c->conv_kernel}};
    for (size_t i = 0; i < sizeof prods / sizeof prods[0]; i++) {
        int64_t ab, abc;
        if (__builtin_mul_overflow(prods[i].a, prods[i].b, &ab) || __builtin_mul_overflow(ab, prods[i].c, &abc) ||
            abc > ((int64_t)1 << 40))
            return keel_fail("config: %s = %lld x %lld x %lld elements is larger than keel supports (2^40)",
                             prods[i].what, (long long)prods[i].a, (long long)prods[i].b, (long long)prods[i].c);
    }
    if (c->layers > KEEL_QWEN35_MAX_LAYERS)
        return keel_fail("config: %lld layers (keel supports up to %d)", (long long)c->layers, KEEL_QWEN35_MAX_LAYERS);
    if (c->heads % c->kv_heads)
        return keel_fail("config: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                         (long long)c->heads, (long long)c->kv_heads);
    if (c->lv_heads % c->lk_heads)
        return keel_fail("config: linear_num_value_heads %lld is not a multiple of linear_num_key_heads %lld",
                         (long long)c->lv_heads, (long long)c->lk_heads);
    /* the factor is checked before it is turned into an integer count (a huge one does not fit) */
    if (!(c->partial_rotary > 0 && c->partial_rotary <= 1))
        return keel_fail("config: partial_rotary_factor %g must be in (0, 1]", c->partial_rotary);
    int64_t rot = (int64_t)(c->partial_rotary * (double)c->head_dim);
    if (rot % 2 || rot <= 0)
        return keel_fail(
            "config: partial_rotary_factor %g gives %lld rotary dims of head_dim %lld (need an even count > 0)",
            c->partial_rotary, (long long)rot, (long long)c->head_dim);
    if (!(c->rope_theta > 0)) return keel_fail("config: rope_theta must be positive");
    if (!(c->rms_eps > 0)) return keel_fail("config: rms_norm_eps must be positive");
    return 0;
}

static keel_tensor *param(keel_qwen35 *m, keel_ctx *ctx, keel_type type, int64_t n0, int64_t n1, const char *fmt,
                          int layer, const char *leaf) {
    if (n1 > 1 && !strstr(leaf, "conv1d")) type = m->matrix_type;
    keel_tensor *t = n1 > 1 ? keel_new_2d(ctx, type, n0, n1) : keel_new_1d(ctx, type, n0);
    if (!t) return NULL;
    char name[KEEL_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer, leaf);
    keel_set_name(t, "%s", name);
    t->flags |= KEEL_FLAG_PARAM;
    m->params[m->n_params++] = t;
    return t;
}

keel_qwen35 *keel_qwen35_new(keel_ctx *ctx, const keel_qwen35_config *c, keel_type type) {
    return keel_qwen35_new_ex(ctx, c, type, type);
}

keel_qwen35 *keel_qwen35_new_ex(keel_ctx *ctx, const keel_qwen35_config *c, keel_type type, keel_type matrix_type) {
    if (keel_qwen35_config_check(c)) return NULL;
    keel_qwen35 *m = calloc(1, sizeof *m);
    if (!m) {
        keel_fail("out of memory");
        return NULL;
    }
    m->cfg = *c;
    m->matrix_type = matrix_type;
    m->params = calloc((size_t)(c->layers * 16 + 4), sizeof *m->params);
    if (!m->params) {
        free(m);
        keel_fail("out of memory");
        return NULL;
    }
    int64_t D = c->hidden, kd = c->lk_heads * c->lk_dim, vd = c->lv_heads * c->lv_dim;
    /* The LM head's matrix (the tied embedding, or lm_head) stays in the activations' type: its
     * product would need a float32 copy of the whole matrix alive from the forward pass to the
     * backward pass, more memory than a bf16 copy saves. An untied input embedding is read by
     * rows only and takes matrix_type. */
    m->matrix_type = c->tied ? type : matrix_type;
    m->embed = param(m, ctx, type, D, c->vocab, "model.embed_tokens.weight%.0d%s", 0, "");
    m->matrix_type = matrix_type;
    for (int i = 0; i < c->layers; i++) {
        keel_qwen35_layer *L = &m->layer[i];
        const char *f = "model.layers.%d.%s";
        L->in_norm = param(m, ctx, type, D, 1, f, i, "input_layernorm.weight");
        if (c->full_attention[i]) {
            L->q = param(m, ctx, type, D, 2 * c->heads * c->head_dim, f, i, "self_attn.q_proj.weight");
            L->k = param(m, ctx, type, D, c->kv_heads * c->head_dim, f, i, "self_attn.k_proj.weight");
            L->v = param(m, ctx, type, D, c->kv_heads * c->head_dim, f, i, "self_attn.v_proj.weight");
            L->o = param(m, ctx, type, c->heads * c->head_dim, D, f, i, "self_attn.o_proj.weight");
            L->q_norm = param(m, ctx, type, c->head_dim, 1, f, i, "self_attn.q_norm.weight");
            L->k_norm = param(m, ctx, type, c->head_dim, 1, f, i, "self_attn.k_norm.weight");
        } else {
            L->qkv = param(m, ctx, type, D, 2 * kd + vd, f, i, "linear_attn.in_proj_qkv.weight");
            L->z = param(m, ctx, type, D, vd, f, i, "linear_attn.in_proj_z.weight");
            L->b = param(m, ctx, type, D, c->lv_heads, f, i, "linear_attn.in_proj_b.weight");
            L->a = param(m, ctx, type, D, c->lv_heads, f, i, "linear_attn.in_proj_a.weight");
            /* checkpoint shape [C, 1, K]: ne [K, 1, C], kept here as [K, C] */
            L->conv = param(m, ctx, type, c->conv_kernel, 2 * kd + vd, f, i, "linear_attn.conv1d.weight");
            L->A_log = param(m, ctx, type, c->lv_heads, 1, f, i, "linear_attn.A_log");
            L->dt_bias = param(m, ctx, type, c->lv_heads, 1, f, i, "linear_attn.dt_bias");
            L->norm = param(m, ctx, type, c->lv_dim, 1, f, i, "linear_attn.norm.weight");
            L->out = param(m, ctx, type, vd, D, f, i, "linear_attn.out_proj.weight");
        }
        L->post_norm = param(m, ctx, type, D, 1, f, i, "post_attention_layernorm.weight");
        L->gate = param(m, ctx, type, D, c->ffn, f, i, "mlp.gate_proj.weight");
        L->up = param(m, ctx, type, D, c->ffn, f, i, "mlp.up_proj.weight");
        L->down = param(m, ctx, type, c->ffn, D, f, i, "mlp.down_proj.weight");
    }
    m->final_norm = param(m, ctx, type, D, 1, "model.norm.weight%.0d%s", 0, "");
    m->matrix_type = type;
    m->lm_head = c->tied ? m->embed : param(m, ctx, type, D, c->vocab, "lm_head.weight%.0d%s", 0, "");
    m->matrix_type = matrix_type;
    m->operand_type = type;
    for (int i = 0; i < m->n_params; i++)
        if (!m->params[i]) {
            keel_qwen35_free(m);
            return NULL;
        }
    return m;
}

void keel_qwen35_free(keel_qwen35 *m) {
    if (!m) return;
    keel_lora_free(m->lora);
    free(m->params);
    free(m->copy);
    free(m);
}

/* x * rsqrt(mean(x^2) + eps) * (1 + w), one op, its result in `out` (a norm that only feeds
 * products: mixed precision's bf16 operand made by the norm, the bits of the norm then CAST) */
static keel_tensor *norm1p(keel_ctx *ctx, keel_tensor *x, keel_tensor *w, double eps, keel_type out) {
    return keel_rms_norm_w_to(ctx, x, w, eps, true, out);
}

/* the activations' type (norm weights are never a bf16 base's) */
static keel_type act_type(const keel_qwen35 *m) { return m->final_norm->type; }

/* the type of a result that only becomes a product operand: bf16 in mixed precision with float32
 * activations and no LoRA (whose adapter reads the float32 value), else the activations' (the
 * float64 oracle's mixed runs round at the CAST) */
static keel_type operand_result_type(const keel_qwen35 *m) {
    return m->operand_type == KEEL_BF16 && !m->lora && act_type(m) == KEEL_F32 ? KEEL_BF16 : act_type(m);
}

/* a weight in the activations' type: itself, or a copy made here (a bf16 base) */
static keel_tensor *as_type(keel_ctx *ctx, keel_tensor *w, keel_type type) {
    return w->type == type ? w : keel_cast(ctx, w, type);
}

/* A weight as a bf16 product operand: the optimizer's copy where it keeps one (SHADOW: no work in the
 * step), else its CAST, made here, inside the layer's nodes (recompute makes it again) */
static keel_tensor *weight_bf16(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *w) {
    for (int i = 0; m->copy && w->type == KEEL_F32 && i < m->n_params; i++)
        if (m->params[i] == w && m->copy[i]) return keel_shadow(ctx, m->copy[i], w);
    return as_type(ctx, w, KEEL_BF16);
}

/* An activation and its product operand: itself, or its bf16 copy (mixed precision), made once for
 * the projections that share it. */
typedef struct {
    keel_tensor *x, *op;
} operand;

static operand operand_of(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *x) {
    operand o = {x, x};
    if (x && m->operand_type == KEEL_BF16 && x->type != KEEL_BF16) o.op = keel_cast(ctx, x, KEEL_BF16);
    return o;
}

/* silu(gate) * up as the down projection's operand. Mixed precision without LoRA (whose adapter
 * reads the float32 value): one op makes the bf16 operand, the bits of SWIGLU then CAST without the
 * float32 tensor between them. */
static operand swiglu_operand(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *gate, keel_tensor *up) {
    if (m->operand_type == KEEL_BF16 && !m->lora && gate && up && gate->type == KEEL_F32) {
        keel_tensor *s = keel_swiglu_bf16(ctx, gate, up);
        return (operand){s, s};
    }
    return operand_of(ctx, m, gate && up ? keel_swiglu(ctx, gate, up) : NULL);
}

/* W x in the activations' type (mixed precision: bf16 operands, float32 sums), plus W's LoRA
 * adapter when it has one */
static keel_tensor *linear(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *w, operand in) {
    if (!in.x) return NULL;
    keel_tensor *y = m->operand_type == KEEL_BF16 ? keel_mul_mat_to(ctx, weight_bf16(ctx, m, w), in.op, act_type(m))
                                                  : keel_mul_mat(ctx, as_type(ctx, w, in.x->type), in.x);
    return m->lora ? keel_lora_linear(ctx, m, w, in.x, y) : y;
}

/* res + W x (plus W's LoRA term): a residual update, the addend added where the product is made
 * (MUL_MAT_ADD: no separate product result, no separate pass to add it) */
static keel_tensor *linear_add(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *w, operand in, keel_tensor *res) {
    if (!in.x || !res) return NULL;
    keel_tensor *y = m->operand_type == KEEL_BF16 ? keel_mul_mat_add(ctx, weight_bf16(ctx, m, w), in.op, res)
                                                  : keel_mul_mat_add(ctx, as_type(ctx, w, in.x->type), in.x, res);
    return m->lora ? keel_lora_linear(ctx, m, w, in.x, y) : y;
}

/* The layer's mixer (attention or DeltaNet) on h, its output projection added to the residual res */
static keel_tensor *gated_attention(keel_ctx *ctx, const keel_qwen35 *m, const keel_qwen35_layer *L, keel_tensor *res,
                                    keel_tensor *h, keel_tensor *pos, keel_tensor *kin, keel_tensor *vin,
                                    keel_tensor **kout, keel_tensor **vout) {
    const keel_qwen35_config *c = &m->cfg;
    int64_t hd = c->head_dim, H = c->heads, KV = c->kv_heads, T = h->ne[1], B = h->ne[2];
    int64_t es = (int64_t)keel_type_size(act_type(m));
    operand hin = operand_of(ctx, m, h);
    keel_tensor *qg = linear(ctx, m, L->q, hin); /* per head [q | gate] */
    keel_tensor *q = keel_view_4d(ctx, qg, hd, H, T, B, 2 * hd * es, 2 * hd * H * es, 2 * hd * H * T * es, 0);
    keel_tensor *gate = keel_view_4d(ctx, qg, hd, H, T, B, 2 * hd * es, 2 * hd * H * es, 2 * hd * H * T * es, hd * es);
    keel_tensor *k = keel_reshape_4d(ctx, linear(ctx, m, L->k, hin), hd, KV, T, B);
    keel_tensor *v = keel_reshape_4d(ctx, linear(ctx, m, L->v, hin), hd, KV, T, B);
    int64_t n_rot = (int64_t)(c->partial_rotary * (double)hd);
    /* (1 + w) RMS norms over each head, then RoPE: one op each (the RMS_NORM_W and ROPE it replaces);
     * in mixed precision with float32 activations and no cache to join, made in bf16 by the op, as
     * attention reads them (the bits of the op, then CAST) */
    keel_type qk = m->operand_type == KEEL_BF16 && act_type(m) == KEEL_F32 && !kin && !kout ? KEEL_BF16 : act_type(m);
    q = keel_qk_norm_rope_to(ctx, q, L->q_norm, pos, c->rms_eps, true, n_rot, c->rope_theta, qk);
    k = keel_qk_norm_rope_to(ctx, k, L->k_norm, pos, c->rms_eps, true, n_rot, c->rope_theta, qk);
    if (kin) k = keel_concat(ctx, kin, k, 2), v = keel_concat(ctx, vin, v, 2); /* the cache, then the new tokens */
    if (kout) *kout = k, *vout = v;
    /* flash attention, causal within each example (positions restart where a packed example
     * starts), query head h reading kv head h / (H/KV); mixed precision: q, k, v as bf16 operands,
     * the softmax and the output float32 */
    if (m->operand_type == KEEL_BF16)
        q = as_type(ctx, q, KEEL_BF16), k = as_type(ctx, k, KEEL_BF16), v = as_type(ctx, v, KEEL_BF16);
    keel_tensor *pk = keel_flash_attn(ctx, q, k, v, pos, 1.0 / sqrt((double)hd), act_type(m)); /* [o | lse] */
    if (!pk) return NULL;
    int64_t os = (int64_t)keel_type_size(pk->type);
    keel_tensor *o = keel_view_4d(ctx, pk, hd, H, T, B, hd * os, hd * H * os, hd * H * T * os, 0); /* [hd, H, T, B] */
    /* o * sigmoid(gate), one op (the SIGMOID and MUL it replaces); where it only becomes the output
     * projection's operand, made in bf16 by the op (the bits of the op, then CAST) */
    o = operand_result_type(m) == KEEL_BF16 ? keel_sigmoid_mul_bf16(ctx, o, gate) : keel_sigmoid_mul(ctx, o, gate);
    return linear_add(ctx, m, L->o, operand_of(ctx, m, keel_reshape_3d(ctx, o, hd * H, T, B)), res);
}

static keel_tensor *gated_deltanet(keel_ctx *ctx, const keel_qwen35 *m, const keel_qwen35_layer *L, keel_tensor *res,
                                   keel_tensor *h, keel_tensor *pos, keel_tensor *S_in, keel_tensor *conv_in,
                                   keel_tensor *conv_pos, keel_tensor **S_out, keel_tensor **conv_out) {
    const keel_qwen35_config *c = &m->cfg;
    int64_t Dk = c->lk_dim, Hk = c->lk_heads, Dv = c->lv_dim, Hv = c->lv_heads, T = h->ne[1], B = h->ne[2];
    int64_t kd = Dk * Hk, vd = Dv * Hv, C = 2 * kd + vd, es = (int64_t)keel_type_size(act_type(m)), K = c->conv_kernel;
    operand hin = operand_of(ctx, m, h);
    keel_tensor *pre = linear(ctx, m, L->qkv, hin), *mixed; /* [C, T, B]: q, k, v after conv, SiLU, norms */
    double qs = 1.0 / sqrt((double)Dk), eps = 1e-6;
    if (conv_in) { /* decoding: the last K-1 inputs come first; keep the outputs of the new tokens */
        keel_tensor *cat = keel_concat(ctx, conv_in, pre, 1);
        keel_tensor *conv = keel_view_3d(ctx, keel_conv1d(ctx, cat, L->conv, conv_pos), C, T, B, C * es,
                                         C * (T + K - 1) * es, (K - 1) * C * es);
        *conv_out = keel_cont(ctx, keel_view_3d(ctx, cat, C, K - 1, B, C * es, C * (T + K - 1) * es, T * C * es));
        mixed = keel_silu(ctx, conv);
    } else { /* one op for the conv, SiLU, q/k norms and q scale, the same formulas as the ops below */
        mixed = keel_gdn_conv(ctx, pre, L->conv, pos, kd, Dk, eps, qs);
    }
    keel_tensor *q = keel_view_4d(ctx, mixed, Dk, Hk, T, B, Dk * es, C * es, C * T * es, 0);
    keel_tensor *k = keel_view_4d(ctx, mixed, Dk, Hk, T, B, Dk * es, C * es, C * T * es, kd * es);
    keel_tensor *v = keel_view_4d(ctx, mixed, Dv, Hv, T, B, Dv * es, C * es, C * T * es, 2 * kd * es);
    if (conv_in) {
        q = keel_scale(ctx, keel_l2_norm(ctx, q, eps), qs, 0.0);
        k = keel_l2_norm(ctx, k, eps);
    }
    keel_tensor *bp, *ap; /* the b and a projections, [Hv, T, B] */
    if (m->operand_type == KEEL_BF16 && !m->lora) {
        /* Mixed precision: b and a (Hv rows each, 16 at the 0.8B shape) as one product of their bf16
         * copies laid end to end, viewed apart. A product of depth 16 is memory-bound on the GPU: two
         * of them read and write the input's gradient twice where one of depth 2 Hv does it once
         * (the gradient of the pair is assembled from its two parts, Hv rows a token). Float32
         * weights are rounded by the CONCAT itself (the bits of CONCAT then CAST). */
        keel_tensor *wab = m->copy ? keel_concat(ctx, weight_bf16(ctx, m, L->b), weight_bf16(ctx, m, L->a), 1)
                           : L->b->type == KEEL_F32 && L->a->type == KEEL_F32
                               ? keel_concat_to(ctx, L->b, L->a, 1, KEEL_BF16)
                               : as_type(ctx, keel_concat(ctx, L->b, L->a, 1), KEEL_BF16);
        keel_tensor *ab = keel_mul_mat_to(ctx, wab, hin.op, act_type(m)); /* [2 Hv, T, B]: b's rows, then a's */
        bp = keel_view_3d(ctx, ab, Hv, T, B, 2 * Hv * es, 2 * Hv * T * es, 0);
        ap = keel_view_3d(ctx, ab, Hv, T, B, 2 * Hv * es, 2 * Hv * T * es, Hv * es);
    } else {
        bp = linear(ctx, m, L->b, hin), ap = linear(ctx, m, L->a, hin);
    }
    keel_tensor *beta = keel_sigmoid(ctx, bp); /* [Hv, T, B] */
    /* g = softplus(a + dt_bias) * -exp(A_log), one op (the ADD, SOFTPLUS, EXP, NEG, MUL it replaces) */
    keel_tensor *g = keel_gdn_gate(ctx, ap, L->A_log, L->dt_bias);
    keel_tensor *o;
    if (S_in) { /* decoding: start from S_in, keep the final state */
        keel_tensor *pk = keel_gated_delta_net_state(ctx, q, k, v, g, beta, pos, S_in);
        o = keel_view_4d(ctx, pk, Dv, Hv, T, B, Dv * es, Dv * Hv * es, Dv * Hv * T * es, 0);
        *S_out = keel_cont(
            ctx, keel_view_4d(ctx, pk, Dv, Dk, Hv, B, Dv * es, Dv * Dk * es, Dv * Dk * Hv * es, Dv * Hv * T * B * es));
    } else {
        /* [Dv, Hv, T, B]; in the bf16 mode its products on the tensor cores, the forward's on operands in
         * two bf16 parts, the backward's on one (the forward's rounding is what moves the gradients:
         * docs/h200-log.md, "The delta rule's backward in one bf16 part") */
        o = keel_gated_delta_net(ctx, q, k, v, g, beta, pos,
                                 m->operand_type == KEEL_BF16 && !m->gdn_float32 ? KEEL_GDN_BF16_GRAD
                                                                                 : KEEL_GDN_FLOAT32);
    }
    keel_tensor *z = keel_reshape_4d(ctx, linear(ctx, m, L->z, hin), Dv, Hv, T, B);
    /* rms_norm(o) * norm * silu(z), one op (in mixed precision the out projection's bf16 operand) */
    o = keel_gated_rms_norm_to(ctx, o, L->norm, z, c->rms_eps, operand_result_type(m));
    return linear_add(ctx, m, L->out, operand_of(ctx, m, keel_reshape_3d(ctx, o, vd, T, B)), res);
}

static int forward(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *ids, keel_tensor *pos, keel_tensor *targets,
                   keel_qwen35_out *out, const keel_qwen35_cache *cin, keel_qwen35_cache *cout) {
    const keel_qwen35_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    keel_type act = act_type(m);
    keel_tensor *x = as_type(ctx, keel_get_rows(ctx, m->embed, ids), act); /* [D, T, B] */
    out->hidden[0] = x;
    out->layers.n_layers = (int)c->layers;
    out->layers.boundary[0] = x;
    for (int i = 0; i < c->layers; i++) {
        const keel_qwen35_layer *L = &m->layer[i];
        out->layers.first_id[i] = keel_ctx_count(ctx);
        keel_tensor *h = norm1p(ctx, x, L->in_norm, c->rms_eps, operand_result_type(m));
        x = c->full_attention[i]
                ? gated_attention(ctx, m, L, x, h, pos, cin ? cin->k[i] : NULL, cin ? cin->v[i] : NULL,
                                  cout ? &cout->k[i] : NULL, cout ? &cout->v[i] : NULL)
                : gated_deltanet(ctx, m, L, x, h, pos, cin ? cin->S[i] : NULL, cin ? cin->conv[i] : NULL,
                                 cin ? cin->conv_pos : NULL, cout ? &cout->S[i] : NULL, cout ? &cout->conv[i] : NULL);
        keel_tensor *h2 = norm1p(ctx, x, L->post_norm, c->rms_eps, operand_result_type(m));
        operand h2in = operand_of(ctx, m, h2);
        keel_tensor *gate = linear(ctx, m, L->gate, h2in); /* before up: the graph's node order */
        keel_tensor *up = linear(ctx, m, L->up, h2in);
        x = linear_add(ctx, m, L->down, swiglu_operand(ctx, m, gate, up), x);
        keel_set_name(x, "hidden.%d", i + 1);
        out->hidden[i + 1] = x;
        out->layers.end_id[i] = keel_ctx_count(ctx);
        out->layers.boundary[i + 1] = x;
    }
    keel_tensor *xn = norm1p(ctx, x, m->final_norm, c->rms_eps, act_type(m));
    out->normed = xn;
    operand xin = operand_of(ctx, m, xn);
    bool mixed = m->operand_type == KEEL_BF16;
    keel_tensor *head = mixed ? weight_bf16(ctx, m, m->lm_head) : as_type(ctx, m->lm_head, act);
    out->logits =
        keel_set_name(mixed ? keel_mul_mat_to(ctx, head, xin.op, act) : keel_mul_mat(ctx, head, xn), "logits");
    /* mixed precision: the head and the loss fused, a chunk of tokens at a time, so that the
     * training graph holds no [vocab, tokens] logits (the logits above are computed only where a
     * caller asks for them); for a backward, with the gradients made from the same logits */
    if (targets && mixed && m->head_grads_in_forward) {
        out->loss = keel_linear_cross_entropy_with_grads(ctx, xin.op, head, targets, KEEL_LM_HEAD_CHUNK);
        if (out->loss) keel_set_name(out->loss->view_src, "loss.packed");
        out->loss = keel_set_name(out->loss, "loss");
    } else if (targets) {
        out->loss = keel_set_name(mixed ? keel_linear_cross_entropy(ctx, xin.op, head, targets, KEEL_LM_HEAD_CHUNK)
                                        : keel_cross_entropy_loss(ctx, out->logits, targets),
                                  "loss");
    }
    if (!out->logits || (targets && !out->loss)) return -1;
    return 0;
}

int keel_qwen35_inputs(keel_ctx *ctx, int64_t T, int64_t B, keel_tensor **ids, keel_tensor **tgt, keel_tensor **pos) {
    *ids = keel_set_name(keel_set_flags(keel_new_2d(ctx, KEEL_I32, T, B), KEEL_FLAG_INPUT), "input_ids");
    if (tgt) *tgt = keel_set_name(keel_set_flags(keel_new_2d(ctx, KEEL_I32, T, B), KEEL_FLAG_INPUT), "targets");
    *pos = keel_set_name(keel_set_flags(keel_new_2d(ctx, KEEL_I32, T, B), KEEL_FLAG_INPUT), "positions");
    return *ids && *pos && (!tgt || *tgt) ? 0 : -1;
}

int keel_qwen35_forward(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *ids, keel_tensor *pos, keel_tensor *targets,
                        keel_qwen35_out *out) {
    return forward(ctx, m, ids, pos, targets, out, NULL, NULL);
}

keel_tensor *keel_qwen35_forward_cached(keel_ctx *ctx, const keel_qwen35 *m, keel_tensor *ids, keel_tensor *pos,
                                        const keel_qwen35_cache *in, keel_qwen35_cache *out) {
    keel_qwen35_out o;
    memset(out, 0, sizeof *out);
    if (forward(ctx, m, ids, pos, NULL, &o, in, out)) return NULL;
    return o.logits;
}

double **keel_qwen35_init_values(const keel_qwen35 *m, uint64_t seed) {
    double **v = calloc((size_t)m->n_params, sizeof *v);
    if (!v) return NULL;
    for (int i = 0; i < m->n_params; i++) {
        const keel_tensor *p = m->params[i];
        int64_t n = keel_nelements(p);
        v[i] = malloc((size_t)n * sizeof(double));
        if (!v[i]) {
            for (int j = 0; j < i; j++) free(v[j]);
            free(v);
            return NULL;
        }
        uint64_t s = seed * 0x100000001b3ull + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        const char *nm = p->name;
        enum { ZERO, ONE, ALOG, CONV, NORMAL } kind = NORMAL;
        if (strstr(nm, "layernorm") || strstr(nm, "q_norm") || strstr(nm, "k_norm") || !strcmp(nm, "model.norm.weight"))
            kind = ZERO;
        else if (strstr(nm, "linear_attn.norm.weight") || strstr(nm, "dt_bias"))
            kind = ONE;
        else if (strstr(nm, "A_log"))
            kind = ALOG;
        else if (strstr(nm, "conv1d"))
            kind = CONV;
        for (int64_t j = 0; j < n; j++) {
            double x;
            if (kind == ZERO)
                x = 0.0;
            else if (kind == ONE)
                x = 1.0;
            else if (kind == ALOG)
                x = log(16.0 * (1.0 - keel_uniform01(&s))); /* log U(0,16], as transformers */
            else if (kind == CONV)
                x = (2.0 * keel_uniform01(&s) - 1.0) / sqrt((double)p->ne[0]);
            else { /* normal(0, 0.02) by Box-Muller */
                double a = keel_uniform01(&s), b = keel_uniform01(&s);
                x = 0.02 * sqrt(-2.0 * log(a > 1e-300 ? a : 1e-300)) * cos(6.283185307179586 * b);
            }
            v[i][j] = x;
        }
    }
    return v;
}

int keel_qwen35_init_weights(const keel_qwen35 *m, keel_backend *be, uint64_t seed) {
    for (int i = 0; i < m->n_params; i++) {
        keel_qwen35 one = *m;
        one.params = &m->params[i];
        one.n_params = 1;
        double **v = keel_qwen35_init_values(&one, seed * 1000003u + (uint64_t)i);
        if (!v) return keel_fail("out of memory for the initial values of '%s'", m->params[i]->name);
        keel_tensor *p = m->params[i];
        int64_t n = keel_nelements(p);
        float *f = p->type == KEEL_F32 ? malloc((size_t)(n ? n : 1) * sizeof *f) : NULL;
        for (int64_t j = 0; f && j < n; j++) f[j] = (float)v[0][j];
        int rc = p->type == KEEL_F32 ? (!f ? keel_fail("out of memory for the initial values of '%s'", p->name)
                                           : keel_tensor_write(be, p, f, KEEL_F32))
                                     : keel_tensor_write(be, p, v[0], KEEL_F64);
        free(f), free(v[0]), free(v);
        if (rc) return -1;
    }
    return 0;
}
