#include "util/faults.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

/* KEEL_FAULT: a comma-separated list of faults. *v gets the number of the item of kind `want`
 * (1 when it takes none); 0 when absent; -1 with a message naming the variable when any item is
 * malformed. */
static int fault(const char *want, long long *v) {
    *v = 0;
    const char *f = getenv("KEEL_FAULT");
    if (!f || !*f) return 0;
    for (const char *it = f; *it;) {
        size_t len = strcspn(it, ",");
        char item[64], tail;
        long long n = 0;
        const char *kind = NULL;
        snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), it);
        if (len < sizeof item && sscanf(item, "copy-row-limit:%lld%c", &n, &tail) == 1 && n > 0)
            kind = "copy-row-limit";
        else if (len < sizeof item && sscanf(item, "save-kill:%lld%c", &n, &tail) == 1 && n >= 1 &&
                 n <= KEEL_SAVE_POINTS)
            kind = "save-kill";
        else if (!strcmp(item, "save-no-exchange"))
            kind = "save-no-exchange", n = 1;
        else if (!strcmp(item, "gdn-update-bf16"))
            kind = "gdn-update-bf16", n = 1;
        if (!kind)
            return keel_fail("KEEL_FAULT='%s': '%s' is not copy-row-limit:N (N > 0), save-kill:P (P in 1..%d), "
                             "save-no-exchange or gdn-update-bf16 (several: comma-separated)",
                             f, item, KEEL_SAVE_POINTS);
        if (!strcmp(kind, want)) *v = n;
        it += len + (it[len] == ',');
    }
    return 0;
}

int keel_fault_copy_row_limit(int64_t *n) {
    long long v;
    *n = 0;
    if (fault("copy-row-limit", &v)) return -1;
    *n = v;
    return 0;
}

int keel_fault_save_point(int point) {
    static int saves_done; /* the fault strikes in the process's first save only */
    long long v;
    if (fault("save-kill", &v)) return -1;
    if (point == KEEL_SAVE_POINTS) saves_done++;
    if (v != point || saves_done > (point == KEEL_SAVE_POINTS)) return 0;
    fprintf(stderr, "keel: KEEL_FAULT: killed at point %d of a checkpoint save\n", point);
    raise(SIGKILL);
    return 0;
}

int keel_fault_save_no_exchange(void) {
    long long v;
    return fault("save-no-exchange", &v) == 0 && v == 1;
}

int keel_fault_gdn_update_bf16(void) {
    long long v;
    return fault("gdn-update-bf16", &v) ? -1 : v == 1;
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
