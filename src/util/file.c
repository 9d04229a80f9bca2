#define _DEFAULT_SOURCE /* fdopen */
#include "util/file.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

int keel_open_regular(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* O_NONBLOCK: opening a FIFO must not wait for a writer */
    if (fd < 0) return keel_fail("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return keel_fail("%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return keel_fail("%s: %s", path,
                         S_ISFIFO(st.st_mode)  ? "a FIFO, not a regular file"
                         : S_ISDIR(st.st_mode) ? "a folder, not a file"
                                               : "not a regular file");
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

char *keel_read_file(const char *path, size_t *n) {
    int fd = keel_open_regular(path);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd), keel_fail("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *s = len >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)len + 1) : NULL;
    if (!s || fread(s, 1, (size_t)len, f) != (size_t)len) {
        free(s);
        fclose(f);
        keel_fail("%s: cannot read", path);
        return NULL;
    }
    s[len] = 0;
    fclose(f);
    if (n) *n = (size_t)len;
    return s;
}

cJSON *keel_read_json(const char *path) {
    char *s = keel_read_file(path, NULL);
    if (!s) return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(s, &end, 0);
    if (!j) keel_fail("%s: invalid JSON near byte %ld", path, end ? (long)(end - s) : -1L);
    free(s);
    return j;
}

int keel_copy_file(const char *src, const char *dst) {
    size_t n;
    char *buf = keel_read_file(src, &n);
    if (!buf) return -1;
    FILE *f = fopen(dst, "wb");
    bool ok = f && fwrite(buf, 1, n, f) == n;
    int err = errno;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok, ok = fclose(f) == 0 && ok;
    free(buf);
    return ok ? 0 : keel_fail("%s: cannot write a copy of %s: %s", dst, src, strerror(err ? err : EIO));
}
