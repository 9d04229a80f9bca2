#include "unit.h"
#include "backends/cpu/threadpool.h"

typedef struct {
    int *hits;
} arg_t;
static void mark(void *a, int64_t b, int64_t e, int th) {
    (void)th;
    arg_t *x = a;
    for (int64_t i = b; i < e; i++) __atomic_fetch_add(&x->hits[i], 1, __ATOMIC_RELAXED);
}

static void every_item_once(void **st) {
    (void)st;
    static const int64_t sizes[] = {0, 1, 7, 1000, 65537};
    for (int nt = 1; nt <= 3; nt++) {
        keel_pool *p = keel_pool_new(nt);
        assert_int_equal(keel_pool_size(p), nt);
        for (int s = 0; s < 5; s++) {
            int *hits = calloc((size_t)sizes[s] + 1, sizeof(int));
            arg_t a = {hits};
            for (int rep = 0; rep < 3; rep++) keel_pool_for(p, sizes[s], mark, &a);
            for (int64_t i = 0; i < sizes[s]; i++) assert_int_equal(hits[i], 3);
            free(hits);
        }
        keel_pool_free(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(every_item_once)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
