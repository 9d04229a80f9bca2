/* keel: whole files into memory. */
#ifndef KEEL_FILE_H
#define KEEL_FILE_H

#include <stddef.h>

/* The file's bytes plus a terminating NUL (malloc'd); NULL with a message naming the file. */
char *keel_read_file(const char *path, size_t *n);

/* A JSON file, parsed (cJSON); NULL with a message naming the file and the byte of the error. */
struct cJSON *keel_read_json(const char *path);

/* Copies a file's bytes to dst (created or truncated) and fsyncs it; -1 naming the file. */
int keel_copy_file(const char *src, const char *dst);

#endif
