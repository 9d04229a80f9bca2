#include "util/error.h"

#include <stdio.h>

static _Thread_local char g_err[2048];

int keel_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

const char *keel_last_error(void) { return g_err; }
