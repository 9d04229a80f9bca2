#include "util/faults.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

int keel_fault_copy_row_limit(int64_t *n) {
    *n = 0;
    const char *f = getenv("KEEL_FAULT");
    if (!f || !*f) return 0;
    long long v = 0;
    char tail;
    if (sscanf(f, "copy-row-limit:%lld%c", &v, &tail) != 1 || v <= 0)
        return keel_fail("KEEL_FAULT='%s': expected copy-row-limit:N with N > 0", f);
    *n = v;
    return 0;
}

int keel_fault_dist_step(int rank, int64_t step) {
    const char *f = getenv("KEEL_DIST_FAULT");
    if (!f || !*f) return 0;
    int fr = -1;
    long long fs = -1;
    char kind[8] = "", tail;
    if (sscanf(f, "%4[a-z]:%d:%lld%c", kind, &fr, &fs, &tail) != 3 || (strcmp(kind, "exit") && strcmp(kind, "hang")) ||
        fr < 0 || fs < 1)
        return keel_fail("KEEL_DIST_FAULT='%s': expected exit:RANK:STEP or hang:RANK:STEP", f);
    if (fr != rank || fs != step) return 0;
    fprintf(stderr, "keel train: rank %d: KEEL_DIST_FAULT: %s at step %lld\n", rank, kind, fs);
    if (!strcmp(kind, "hang"))
        for (;;) pause();
    _exit(9);
}
