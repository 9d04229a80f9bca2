/* Packing with document boundaries (train/data.c): on a token stream of examples of known lengths,
 * every window holds at most T inputs, each piece's positions count from 0, padding has no
 * targets; every example's inputs appear exactly once (split) or cut to T (truncate) or not at all
 * (drop); first fit: no piece would have fit in the room an earlier window was left with; the
 * layout is a function of the seed; the held-out stream keeps its order. */
#include "unit.h"

#include "train/data.h"

enum { EOT = 1 };

/* A stream of n examples: example e has lens[e] + 1 tokens (lens[e] inputs), the last one EOT;
 * token values 2 + (example index * 1000 + i), so that each token says where it came from. */
static int32_t *stream(const int *lens, int n, int64_t *len) {
    int64_t total = 0;
    for (int e = 0; e < n; e++) total += lens[e] + 1;
    int32_t *v = malloc((size_t)total * sizeof *v);
    int64_t o = 0;
    for (int e = 0; e < n; e++) {
        for (int i = 0; i < lens[e]; i++) v[o++] = 2 + e * 1000 + i;
        v[o++] = EOT;
    }
    *len = total;
    return v;
}

static keel_dataset dataset(const int *lens, int n) {
    keel_dataset d;
    memset(&d, 0, sizeof d);
    d.train = stream(lens, n, &d.n_train);
    d.eval = stream(lens, n, &d.n_eval);
    d.eot = EOT;
    return d;
}

/* Checks the windows of the training stream; counts[e] gets how many of example e's inputs were seen. */
static void check_windows(const keel_dataset *d, int64_t T, int n, int *counts) {
    int64_t W = keel_dataset_windows(d, T);
    int32_t *ids = malloc((size_t)T * 4), *tgt = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4);
    const keel_packing *k = d->train_pack;
    for (int64_t w = 0; w < W; w++) {
        int64_t counted = keel_dataset_window(d, false, w, T, ids, tgt, pos);
        int64_t used = 0, c = 0;
        for (int64_t i = k->first[w]; i < k->first[w + 1]; i++) used += k->len[i];
        assert_true(used <= T);
        for (int64_t t = 0; t < T; t++) {
            if (t >= used) { /* padding: end-of-text ids, no targets, positions from 0 */
                assert_int_equal(ids[t], EOT);
                assert_int_equal(tgt[t], KEEL_NO_TARGET);
                assert_int_equal(pos[t], t - used);
                continue;
            }
            c++;
            int32_t v = ids[t];
            assert_true(v >= 2);
            int e = (v - 2) / 1000, i = (v - 2) % 1000;
            assert_true(e < n);
            /* positions count from each piece's start: from 0 in the example (a split piece: from k T) */
            assert_true(pos[t] >= 0 && (i - pos[t]) % T == 0);
            if (pos[t] > 0) assert_true(t > 0 && ids[t - 1] == v - 1 && pos[t - 1] == pos[t] - 1);
            /* the target is the next token of the same example (its end-of-text after the last input) */
            assert_true(tgt[t] == v + 1 || tgt[t] == EOT);
            counts[e]++;
        }
        assert_int_equal(counted, c);
    }
    free(ids), free(tgt), free(pos);
}

static const int LENS[] = {5, 3, 12, 1, 7, 8, 2, 9, 4, 6, 11, 0, 3, 10, 2};
#define N_LENS (int)(sizeof LENS / sizeof LENS[0])

static void test_pack_first_fit(void **state) {
    (void)state;
    keel_dataset d = dataset(LENS, N_LENS);
    const int64_t T = 12;
    assert_int_equal(keel_dataset_pack(&d, T, 3, true, KEEL_OVERLONG_SPLIT), 0);
    const keel_packing *k = d.train_pack;
    assert_int_equal(k->n_examples, N_LENS - 1); /* the empty one has nothing to learn */
    assert_int_equal(k->n_overlong, 0);
    int counts[N_LENS] = {0};
    check_windows(&d, T, N_LENS, counts);
    for (int e = 0; e < N_LENS; e++) assert_int_equal(counts[e], LENS[e]);
    /* first fit: room only shrinks, so a piece in window w fitted in no earlier window's final room */
    for (int64_t w = 0; w < k->n_windows; w++)
        for (int64_t i = k->first[w]; i < k->first[w + 1]; i++)
            for (int64_t v = 0; v < w; v++) {
                int64_t used = 0;
                for (int64_t j = k->first[v]; j < k->first[v + 1]; j++) used += k->len[j];
                assert_true(T - used < k->len[i]);
            }
    int64_t total = 0;
    for (int e = 0; e < N_LENS; e++) total += LENS[e];
    assert_int_equal(k->n_slots, total);
    assert_int_equal(d.n_targets, total); /* what the loss sees: the windows' targets */
    assert_int_equal(d.n_trained, total); /* no mask: every one counted */
    assert_true(k->n_windows < N_LENS - 1); /* packing saved windows */
    keel_dataset_free(&d);
}

static void test_pack_overlong(void **state) {
    (void)state;
    const int64_t T = 4;
    keel_overlong modes[3] = {KEEL_OVERLONG_SPLIT, KEEL_OVERLONG_TRUNCATE, KEEL_OVERLONG_DROP};
    for (int m = 0; m < 3; m++) {
        keel_dataset d = dataset(LENS, N_LENS);
        assert_int_equal(keel_dataset_pack(&d, T, 1, true, modes[m]), 0);
        int counts[N_LENS] = {0}, overlong = 0;
        check_windows(&d, T, N_LENS, counts);
        for (int e = 0; e < N_LENS; e++) {
            overlong += LENS[e] > T;
            int want = LENS[e] <= T                         ? LENS[e]
                       : modes[m] == KEEL_OVERLONG_SPLIT    ? LENS[e]
                       : modes[m] == KEEL_OVERLONG_TRUNCATE ? (int)T
                                                            : 0;
            assert_int_equal(counts[e], want);
        }
        assert_int_equal(d.train_pack->n_overlong, overlong);
        assert_int_equal(d.train_pack->n_dropped, modes[m] == KEEL_OVERLONG_DROP ? overlong : 0);
        keel_dataset_free(&d);
    }
}

static void test_pack_seed_and_order(void **state) {
    (void)state;
    const int64_t T = 16;
    keel_dataset a = dataset(LENS, N_LENS), b = dataset(LENS, N_LENS), c = dataset(LENS, N_LENS);
    assert_int_equal(keel_dataset_pack(&a, T, 7, true, KEEL_OVERLONG_TRUNCATE), 0);
    assert_int_equal(keel_dataset_pack(&b, T, 7, true, KEEL_OVERLONG_TRUNCATE), 0);
    assert_int_equal(keel_dataset_pack(&c, T, 8, true, KEEL_OVERLONG_TRUNCATE), 0);
    assert_int_equal(a.train_pack->n_pieces, b.train_pack->n_pieces);
    assert_memory_equal(a.train_pack->start, b.train_pack->start, (size_t)a.train_pack->n_pieces * 8);
    assert_memory_not_equal(a.train_pack->start, c.train_pack->start, (size_t)a.train_pack->n_pieces * 8);
    /* held out: in stream order */
    for (int64_t i = 1; i < a.eval_pack->n_pieces; i++) {
        int64_t w0 = 0, w1 = 0;
        while (a.eval_pack->first[w0 + 1] <= i - 1) w0++;
        while (a.eval_pack->first[w1 + 1] <= i) w1++;
        if (w0 == w1) assert_true(a.eval_pack->start[i] > a.eval_pack->start[i - 1]);
    }
    keel_dataset_free(&a), keel_dataset_free(&b), keel_dataset_free(&c);
}

static void test_no_pack_and_stream(void **state) {
    (void)state;
    const int64_t T = 12;
    keel_dataset d = dataset(LENS, N_LENS);
    assert_int_equal(keel_dataset_pack(&d, T, 3, false, KEEL_OVERLONG_TRUNCATE), 0);
    assert_int_equal(keel_dataset_windows(&d, T), N_LENS - 1); /* one example a window */
    int counts[N_LENS] = {0};
    check_windows(&d, T, N_LENS, counts);
    keel_dataset_free(&d);
    /* no packing: the token stream in windows of T, positions 0..T-1 */
    d = dataset(LENS, N_LENS);
    int32_t ids[12], tgt[12], pos[12];
    assert_int_equal(keel_dataset_windows(&d, T), (d.n_train - 1) / T);
    keel_dataset_window(&d, false, 1, T, ids, tgt, pos);
    for (int t = 0; t < T; t++) {
        assert_int_equal(ids[t], d.train[T + t]);
        assert_int_equal(tgt[t], d.train[T + t + 1]);
        assert_int_equal(pos[t], t);
    }
    keel_dataset_free(&d);
}

static void test_flags(void **state) {
    (void)state;
    keel_overlong o;
    assert_int_equal(keel_doc_boundaries(NULL, true), 1);
    assert_int_equal(keel_doc_boundaries("auto", false), 0);
    assert_int_equal(keel_doc_boundaries("on", false), 1);
    assert_int_equal(keel_doc_boundaries("off", true), 0);
    assert_int_equal(keel_doc_boundaries("yes", true), -1);
    assert_non_null(strstr(keel_last_error(), "--doc-boundaries 'yes'"));
    assert_int_equal(keel_overlong_parse("split", &o), 0);
    assert_int_equal(o, KEEL_OVERLONG_SPLIT);
    assert_int_equal(keel_overlong_parse("cut", &o), -1);
    assert_non_null(strstr(keel_last_error(), "--overlong 'cut'"));
    /* nothing fits: dropped, named */
    static const int big[] = {9, 10};
    keel_dataset d = dataset(big, 2);
    assert_int_equal(keel_dataset_pack(&d, 4, 1, true, KEEL_OVERLONG_DROP), -1);
    assert_non_null(strstr(keel_last_error(), "no training example fits a window of 4 tokens"));
    keel_dataset_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_first_fit),
        cmocka_unit_test(test_pack_overlong),
        cmocka_unit_test(test_pack_seed_and_order),
        cmocka_unit_test(test_no_pack_and_stream),
        cmocka_unit_test(test_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
