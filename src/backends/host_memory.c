#include "backends/host_memory.h"

#include <stdlib.h>
#include <string.h>

void *keel_host_alloc(keel_backend *be, size_t bytes) {
    (void)be;
    size_t n = (bytes + KEEL_ALIGN - 1) / KEEL_ALIGN * KEEL_ALIGN;
    return aligned_alloc(KEEL_ALIGN, n ? n : KEEL_ALIGN);
}
void keel_host_free(keel_backend *be, void *p) {
    (void)be;
    free(p);
}
int keel_host_write(keel_backend *be, void *dst, const void *host, size_t n) {
    (void)be;
    memcpy(dst, host, n);
    return 0;
}
int keel_host_read(keel_backend *be, void *host, const void *src, size_t n) {
    (void)be;
    memcpy(host, src, n);
    return 0;
}
int keel_host_fill_bytes(keel_backend *be, void *dst, int byte, size_t n) {
    (void)be;
    memset(dst, byte, n);
    return 0;
}
