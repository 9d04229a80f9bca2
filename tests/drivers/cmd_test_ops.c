/* keel test-ops: the op test suite from the command line. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "testops/testops.h"

int cmd_test_ops(int argc, char **argv) {
    keel_testops_opts o = {.check_threads = true};
    const char *backends = NULL;
    long long fault = 0;
    bool no_threads = false;
    const char *shard = NULL;
    const cli_flag flags[] = {
        {"--backend", CLI_STR, &backends, .meta = "ref,cpu|all",
         .help = "backends to check against the float64 reference (default: all built in)"},
        {"--op", CLI_STR, &o.ops, .meta = "NAME,...", .help = "only these ops (names from keel ops)"},
        {"--grad", CLI_BOOL, &o.grad,
         .help = "the gradient tiers: finite differences on ref, then each backend's backward graph against ref's"},
        {"--expect-fault", CLI_INT, &fault, 1, 9e15, .meta = "N",
         .help = "run under KEEL_FAULT=copy-row-limit:N: cases whose rows are wider than N must FAIL on the faulted "
                 "backends"},
        {"--no-thread-check", CLI_BOOL, &no_threads,
         .help = "skip the 1-vs-2-thread (or second run) bitwise comparison"},
        {"--bits", CLI_BOOL, &o.bits,
         .help = "append a hash of each passing case's result bits (diff two builds' lines: a change meant to keep "
                 "the bits)"},
        {"--shard", CLI_STR, &shard, .meta = "K/N",
         .help = "only shard K (0 .. N-1) of the cases, split into N of about the same work (make check runs them "
                 "side by side)"},
    };
    const cli_spec spec = {"keel test-ops",
                           "check every op (and with --grad, every gradient) against the float64 reference", flags,
                           (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    o.backends = backends && strcmp(backends, "all") == 0 ? NULL : backends;
    o.expect_fault = fault, o.check_threads = !no_threads;
    if (shard) {
        int k = -1, n = 0, used = 0;
        if (sscanf(shard, "%d/%d%n", &k, &n, &used) != 2 || shard[used] || n < 1 || n > 64 || k < 0 || k >= n) {
            fprintf(stderr, "keel test-ops: --shard '%s': expected K/N with 0 <= K < N <= 64\n", shard);
            return 2;
        }
        o.shard = k, o.shards = n;
    }
    int fails = keel_test_ops(&o);
    if (fails < 0) return 2;
    return fails ? 1 : 0;
}
