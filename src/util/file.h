/* keel: whole files into memory. */
#ifndef KEEL_FILE_H
#define KEEL_FILE_H

#include <stddef.h>

/* Opens path for reading if it is a regular file: a FIFO, a device or a folder is refused (naming
 * it) rather than read, so a hostile or mistaken path can never hang keel. A file descriptor, or -1
 * with a message. */
int keel_open_regular(const char *path);

/* The file's bytes plus a terminating NUL (malloc'd); NULL with a message naming the file. */
char *keel_read_file(const char *path, size_t *n);

/* A JSON file, parsed (cJSON); NULL with a message naming the file and the byte of the error. */
struct cJSON *keel_read_json(const char *path);

/* Copies a file's bytes to dst (created or truncated) and fsyncs it; -1 naming the file. */
int keel_copy_file(const char *src, const char *dst);

#endif
