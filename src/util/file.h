/* keel: whole files into memory, and the folder operations that must never follow a link. */
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

/* Removes path and, when it is a real folder, everything below it, never following a symbolic
 * link (a link is removed itself, never what it points to). 0 when path is gone (or was never
 * there); -1 with a message naming what could not be removed. */
int keel_remove_tree(const char *path);

/* fsync of a folder, so that a rename or file creation inside it is on disk; -1 naming it. */
int keel_fsync_dir(const char *dir);

#endif
