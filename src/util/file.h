/* keel: whole files into memory. */
#ifndef KEEL_FILE_H
#define KEEL_FILE_H

#include <stddef.h>

/* The file's bytes plus a terminating NUL (malloc'd); NULL with a message naming the file. */
char *keel_read_file(const char *path, size_t *n);

#endif
