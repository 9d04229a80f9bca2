#include "unit.h"

static void strides_and_views(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *a = keel_new_3d(ctx, KEEL_F32, 5, 4, 3);
    assert_int_equal(a->nb[0], 4);
    assert_int_equal(a->nb[1], 20);
    assert_int_equal(a->nb[2], 80);
    assert_int_equal(a->nb[3], 240);
    assert_true(keel_is_contiguous(a));
    assert_int_equal(keel_nbytes(a), 240);
    /* a view of a view points at the root, offsets add up in 64 bits */
    keel_tensor *v1 = keel_view_2d(ctx, a, 5, 4, 20, 80);
    keel_tensor *v2 = keel_view_1d(ctx, v1, 3, 24);
    assert_ptr_equal(v1->view_src, a);
    assert_ptr_equal(v2->view_src, a);
    assert_int_equal(v2->view_offs, 104);
    /* transpose and permute move strides, not bytes */
    keel_tensor *t = keel_transpose(ctx, a);
    assert_int_equal(t->ne[0], 4);
    assert_int_equal(t->nb[0], 20);
    assert_false(keel_is_contiguous(t));
    keel_tensor *p = keel_permute(ctx, a, 2, 0, 1, 3);
    assert_int_equal(p->ne[2], 5);
    assert_int_equal(p->ne[0], 4);
    assert_int_equal(p->nb[0], 20);
    assert_ptr_equal(p->view_src, a);
    /* a view past the end of its root is refused, naming the op */
    assert_null(keel_view_1d(ctx, a, 10, 220));
    assert_non_null(strstr(keel_last_error(), "VIEW"));
    /* reshape of a non-contiguous tensor is refused */
    assert_null(keel_reshape_2d(ctx, t, 20, 3));
    assert_non_null(strstr(keel_last_error(), "contiguous"));
    /* 64-bit offsets */
    keel_tensor *big = keel_new_2d(ctx, KEEL_F32, 1 << 20, 1 << 12); /* 16 GiB of metadata only */
    keel_tensor *tail = keel_view_1d(ctx, big, 16, ((int64_t)1 << 34) - 64);
    assert_non_null(tail);
    assert_true(tail->view_offs > INT32_MAX);
    keel_ctx_free(ctx);
}

static void shape_errors_name_everything(void **st) {
    (void)st;
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *a = keel_set_name(keel_new_2d(ctx, KEEL_F32, 4, 3), "lhs");
    keel_tensor *b = keel_set_name(keel_new_2d(ctx, KEEL_F32, 5, 3), "rhs");
    assert_null(keel_add(ctx, a, b));
    const char *e = keel_last_error();
    assert_non_null(strstr(e, "ADD"));
    assert_non_null(strstr(e, "lhs"));
    assert_non_null(strstr(e, "[5,3,1,1]"));
    /* a failed constructor makes its users fail too, keeping the first message */
    assert_null(keel_mul(ctx, keel_add(ctx, a, b), a));
    assert_non_null(strstr(keel_last_error(), "ADD"));
    assert_null(keel_mul_mat(ctx, a, b));
    assert_non_null(strstr(keel_last_error(), "inner dimensions"));
    assert_int_equal(keel_type_from_name("bf16"), KEEL_BF16);
    assert_int_equal(keel_type_from_name("f8"), -1);
    /* the delta rule's products: the four variants, nothing else */
    keel_tensor *q = keel_new_4d(ctx, KEEL_F32, 4, 1, 5, 1), *k = keel_new_4d(ctx, KEEL_F32, 4, 1, 5, 1),
                *v = keel_new_4d(ctx, KEEL_F32, 3, 1, 5, 1), *g = keel_new_3d(ctx, KEEL_F32, 1, 5, 1),
                *be = keel_new_3d(ctx, KEEL_F32, 1, 5, 1), *pos = keel_new_2d(ctx, KEEL_I32, 5, 1);
    for (int p = KEEL_GDN_FLOAT32; p <= KEEL_GDN_BF16_GRAD; p++)
        assert_non_null(keel_gated_delta_net(ctx, q, k, v, g, be, pos, p));
    assert_null(keel_gated_delta_net(ctx, q, k, v, g, be, pos, KEEL_GDN_BF16_GRAD + 1));
    assert_non_null(strstr(keel_last_error(), "ip0"));
    assert_non_null(strstr(keel_last_error(), "not 4"));
    keel_ctx_free(ctx);
}

static void half_conversions(void **st) {
    (void)st;
    assert_int_equal(keel_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(keel_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(keel_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
    assert_int_equal(keel_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(keel_f32_to_f16(5.9604644775390625e-8f), 0x0001); /* smallest subnormal */
    assert_int_equal(keel_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);     /* tie to even */
    assert_int_equal(keel_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);     /* tie to even, up */
    assert_true(isnan(keel_f16_to_f32(keel_f32_to_f16(NAN))));
    for (uint32_t h = 0; h < 0x7c00; h++) /* every finite positive half round-trips */
        assert_int_equal(keel_f32_to_f16(keel_f16_to_f32((uint16_t)h)), h);
    assert_int_equal(keel_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(keel_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie to even */
    assert_int_equal(keel_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    assert_true(isnan(keel_bf16_to_f32(keel_f32_to_bf16(NAN))));
    assert_true(keel_bf16_to_f32(0x3f81) == 1.0078125f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strides_and_views),
        cmocka_unit_test(shape_errors_name_everything),
        cmocka_unit_test(half_conversions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
