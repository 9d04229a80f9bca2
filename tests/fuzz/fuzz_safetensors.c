/* libFuzzer target: the safetensors parser. Every input is accepted or refused without a crash
 * (ASan, UBSan); an accepted tensor lies inside the buffer and every value of it can be read; a
 * refusal names the file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "util/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    keel_st_file f;
    if (keel_st_parse(data, size, "fuzz.safetensors", &f) != 0) {
        if (!strstr(keel_last_error(), "fuzz.safetensors")) abort(); /* a message that does not name the file */
        return 0;
    }
    for (int i = 0; i < f.n; i++) {
        const keel_st_tensor *t = &f.t[i];
        const uint8_t *d = t->data;
        if (d < data || d + t->nbytes > data + size) abort();
        int64_t n = keel_st_numel(t);
        if (t->type >= 0 && n > 0) {
            volatile double s = keel_st_get(t, 0) + keel_st_get(t, n - 1);
            (void)s;
        }
    }
    keel_st_release(&f);
    return 0;
}
