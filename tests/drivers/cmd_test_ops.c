/* keel test-ops: the op test suite from the command line. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "testops/testops.h"

int cmd_test_ops(int argc, char **argv) {
    keel_testops_opts o = {.check_threads = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--backend") == 0 && v) {
            o.backends = strcmp(v, "all") == 0 ? NULL : v;
            i++;
        } else if (strcmp(a, "--op") == 0 && v) {
            o.ops = v;
            i++;
        } else if (strcmp(a, "--grad") == 0) {
            o.grad = true;
        } else if (strcmp(a, "--expect-fault") == 0) {
            long long n = cli_int(a, v, 1);
            if (n < 0) return 2;
            o.expect_fault = n;
            i++;
        } else if (strcmp(a, "--no-thread-check") == 0) {
            o.check_threads = false;
        } else if (strcmp(a, "--help") == 0) {
            printf("usage: keel test-ops [--backend ref,cpu|all] [--op NAME,...] [--grad] [--expect-fault N]\n"
                   "                     [--no-thread-check]\n"
                   "  --backend        backends to check against the float64 reference (default: all built in)\n"
                   "  --op             only these ops (names from `keel ops`)\n"
                   "  --grad           the gradient tiers: finite differences on ref, then each backend's\n"
                   "                   backward graph against ref's\n"
                   "  --expect-fault N run under KEEL_FAULT=copy-row-limit:N: cases whose rows are wider than N\n"
                   "                   must FAIL on the faulted backends and the others pass\n"
                   "  --no-thread-check skip the cpu 1-vs-2-thread bitwise comparison\n");
            return 0;
        } else {
            fprintf(stderr, "keel test-ops: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    int fails = keel_test_ops(&o);
    if (fails < 0) return 2;
    return fails ? 1 : 0;
}
