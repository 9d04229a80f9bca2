/* keel: buffer functions shared by the backends whose buffers are host memory (ref, cpu). */
#ifndef KEEL_HOST_MEMORY_H
#define KEEL_HOST_MEMORY_H

#include "backend/backend.h"

void *keel_host_alloc(keel_backend *be, size_t bytes);
void keel_host_free(keel_backend *be, void *p);
int keel_host_write(keel_backend *be, void *dst, const void *host, size_t n);
int keel_host_read(keel_backend *be, void *host, const void *src, size_t n);
int keel_host_fill_bytes(keel_backend *be, void *dst, int byte, size_t n);

#endif
