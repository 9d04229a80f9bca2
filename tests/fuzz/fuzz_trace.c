/* libFuzzer target: trace files (keel diff). Every input is read or refused without a crash and
 * without an allocation larger than the file can justify; an accepted trace compares with itself
 * (no divergence) at both tolerances. */
#include "fuzz_util.h"

#include "trace/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    keel_tracer *t = keel_trace_read(fuzz_file("trace.bin", data, size));
    if (!t) return 0;
    FILE *devnull = fopen("/dev/null", "w");
    if (!devnull) abort();
    keel_trace_diff(t, t, 0, devnull);
    keel_trace_diff(t, t, 1e-3, devnull);
    fclose(devnull);
    keel_tracer_free(t);
    return 0;
}
