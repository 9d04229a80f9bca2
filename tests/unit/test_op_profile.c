#include <stdlib.h>

#include "backends/op_profile.h"
#include "unit.h"

/* The profile's bytes: an ADD of two float32 [2^20] reads 8 MiB and writes 4 MiB, 12,582,912 bytes
 * (counted here by hand); at 0.5 ms a node that is 25.2 GB/s, for the op and for its group, and
 * a second node of the group doubles the bytes and the time (the same rate). */
static void bytes_over_time(void **state) {
    (void)state;
    setenv("KEEL_TEST_PROFILE", "1", 1);
    keel_op_profile *p = keel_op_profile_from_env("KEEL_TEST_PROFILE");
    assert_non_null(p);
    keel_ctx *ctx = keel_ctx_new();
    keel_tensor *x = keel_new_1d(ctx, KEEL_F32, 1 << 20), *y = keel_new_1d(ctx, KEEL_F32, 1 << 20);
    keel_tensor *z = keel_add(ctx, x, y);
    assert_non_null(z);
    keel_op_profile_add(p, z, 0.5);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    keel_op_profile_print(p, out, "test profile", "time");
    fclose(out);
    assert_non_null(strstr(text, "1 nodes      0.013 GB     25.2 GB/s"));
    assert_non_null(strstr(text, "0.500 ms     25.2 GB/s  ADD"));
    free(text);
    keel_op_profile_add(p, z, 0.5);
    out = open_memstream(&text, &len);
    keel_op_profile_print(p, out, "test profile", "time");
    fclose(out);
    assert_non_null(strstr(text, "2 nodes      0.025 GB     25.2 GB/s"));
    free(text);
    keel_op_profile_free(p);
    keel_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(bytes_over_time)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
