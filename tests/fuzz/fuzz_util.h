/* keel: what the libFuzzer targets share: the input as a file, for the readers that take a path
 * (config.json, tokenizer.json, traces, trainer_state.json). Each process writes into a folder of
 * its own, removed when it exits. */
#ifndef KEEL_FUZZ_UTIL_H
#define KEEL_FUZZ_UTIL_H

#define _DEFAULT_SOURCE /* mkdtemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/file.h"

static char fuzz_dir[64];

static inline void fuzz_cleanup(void) {
    if (fuzz_dir[0]) keel_remove_tree(fuzz_dir);
}

/* The process's folder, made on first use. */
static inline const char *fuzz_folder(void) {
    if (!fuzz_dir[0]) {
        snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/keel-fuzz-XXXXXX");
        if (!mkdtemp(fuzz_dir)) abort();
        atexit(fuzz_cleanup);
    }
    return fuzz_dir;
}

/* data written to <folder>/name; the path in a static buffer. */
static inline const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", fuzz_folder(), name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    return path;
}

#endif
