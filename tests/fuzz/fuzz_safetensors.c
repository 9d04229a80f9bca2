/* A mutation fuzzer for the safetensors header parser: starts from valid images and flips,
 * inserts, deletes and truncates bytes (header length included) for SECONDS. The parser must
 * accept or reject every input without a crash (run it under ASan/UBSan), and every accepted
 * tensor must lie inside the buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/safetensors.h"
#include "util/error.h"

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}

static const char *SEEDS[] = {
    "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}",
    "{\"w\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,2]},\"v\":{\"dtype\":\"I64\",\"shape\":[1],\"data_"
    "offsets\":[8,16]}}",
};

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    unsigned char buf[4096];
    long iters = 0, accepted = 0;
    clock_t start = clock();
    while ((double)(clock() - start) / CLOCKS_PER_SEC < seconds) {
        for (int k = 0; k < 256; k++, iters++) {
            const char *h = SEEDS[rnd() % 2];
            size_t hl = strlen(h), size = 8 + hl + 32;
            memset(buf, 0, sizeof buf);
            memcpy(buf + 8, h, hl);
            for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
            int muts = 1 + (int)(rnd() % 6);
            for (int m = 0; m < muts; m++) {
                if (size == 0) break;
                size_t at = rnd() % size;
                switch (rnd() % 6) {
                case 0:
                    buf[at] ^= (unsigned char)(1u << (rnd() % 8));
                    break;
                case 1:
                    buf[at] = "0123456789-.e,[]{}\":"[rnd() % 20];
                    break;
                case 2:
                    if (size < sizeof buf - 1) {
                        memmove(buf + at + 1, buf + at, size - at);
                        buf[at] = (unsigned char)rnd();
                        size++;
                    }
                    break;
                case 3:
                    if (size > 1) {
                        memmove(buf + at, buf + at + 1, size - at - 1);
                        size--;
                    }
                    break;
                case 4:
                    size = at;
                    break;
                default:
                    buf[rnd() % 8] = (unsigned char)rnd();
                    break;
                }
            }
            keel_st_file f;
            if (keel_st_parse(buf, size, "fuzz", &f) == 0) {
                accepted++;
                for (int i = 0; i < f.n; i++) {
                    const unsigned char *d = f.t[i].data;
                    if (d < buf || d + f.t[i].nbytes > buf + size) {
                        fprintf(stderr, "fuzz: accepted tensor '%s' outside the buffer\n", f.t[i].name);
                        return 1;
                    }
                }
                keel_st_release(&f);
            } else if (!strstr(keel_last_error(), "fuzz")) {
                fprintf(stderr, "fuzz: error without the file's name: %s\n", keel_last_error());
                return 1;
            }
        }
    }
    printf("fuzz_safetensors: %ld inputs in %.0f s, %ld accepted, no crash\n", iters, seconds, accepted);
    return 0;
}
